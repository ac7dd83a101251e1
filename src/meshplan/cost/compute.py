"""Compute time of one micro-batch through a layer, the embedding and the LM head, per GPU.

Each layer is a list of operations. GEMMs take

    t = max(2·m·n·k / (F·η(m, n, k)),  (m·k + k·n + m·n)·e / (W·η_hbm)) + t_kernel

with F the dense peak for the compute dtype, W the HBM bandwidth and the shape-dependent
efficiency η = η_max · q(m, n) · k/(k + k½):

* η_max — what a large GEMM reaches (calibration, per GPU generation);
* q(m, n) — tile and wave quantization (NVIDIA, "Matrix Multiplication Background User's Guide",
  Sec. 2.2–2.3): the output is cut into tiles of T_m × T_n run in waves over the SMs, so
  q = m·n / (⌈tiles / SMs⌉ · SMs · T_m · T_n); the library picks the best of the tile shapes below,
  smaller tiles paying a reuse penalty;
* k/(k + k½) — short reductions do not fill the pipeline of a tile (k½ from the calibration).

Attention (QKᵀ, softmax, A·V) runs as FlashAttention at the calibrated forward/backward
efficiency; its backward does 2.5× the forward's matmul FLOPs (it recomputes QKᵀ; Dao 2023).
With materialized attention, the two batched GEMMs follow the GEMM model and the softmax is
memory-bound. Norms, RoPE, the MLP activation, residual adds and dropout are memory-bound: bytes
read and written over ``W·η_hbm``. The backward of a GEMM is two GEMMs (input and weight
gradients); of a memory-bound op, twice its forward traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.calibration import Calibration
from meshplan.cost.params import kv_heads_per_rank, matmuls_per_rank, op_sac_recomputed, padded_vocab
from meshplan.specs.hardware import GPUSpec
from meshplan.specs.model import ModelSpec

#: (T_m, T_n, relative efficiency): CUTLASS/cuBLAS tile shapes; smaller tiles reuse less data.
GEMM_TILES: tuple[tuple[int, int, float], ...] = (
    (128, 256, 1.00),
    (256, 128, 1.00),
    (128, 128, 0.95),
    (64, 128, 0.85),
)


def gemm_efficiency(m, n, k, gpu: GPUSpec, cal: Calibration):
    """η(m, n, k) of the module docstring; works on scalars and numpy arrays alike."""
    sms = gpu.sm_count
    best = 0.0
    for tm, tn, rel in GEMM_TILES:
        tiles = np.ceil(np.divide(m, tm)) * np.ceil(np.divide(n, tn))
        waves = np.ceil(tiles / sms)
        q = np.multiply(m, n) / (waves * sms * tm * tn)
        best = np.maximum(best, rel * q)
    return cal.gemm_efficiency * best * (np.divide(k, np.add(k, cal.gemm_k_half)))


def gemm_time(m, n, k, gpu: GPUSpec, cal: Calibration, peak: float, elem_bytes: int = 2):
    """Seconds for an (m × k)·(k × n) GEMM (module docstring)."""
    flops = 2.0 * np.multiply(np.multiply(m, n), k)
    t_flop = flops / (peak * gemm_efficiency(m, n, k, gpu, cal))
    t_mem = (np.multiply(m, k) + np.multiply(k, n) + np.multiply(m, n)) * elem_bytes / (
        gpu.hbm_bandwidth * cal.hbm_efficiency
    )
    return np.maximum(t_flop, t_mem) + cal.kernel_overhead


def memory_time(nbytes: float, gpu: GPUSpec, cal: Calibration) -> float:
    """Seconds for a memory-bound kernel moving ``nbytes``."""
    return nbytes / (gpu.hbm_bandwidth * cal.hbm_efficiency) + cal.kernel_overhead


@dataclass(frozen=True)
class OpTimes:
    """Forward and backward seconds of one micro-batch, by kind of work."""

    fwd_gemm: float
    fwd_attention: float
    fwd_memory: float
    bwd_gemm: float
    bwd_attention: float
    bwd_memory: float
    bwd_weight: float = 0.0  # the weight-gradient GEMMs inside bwd_gemm (a split backward's W)
    fwd_op_recompute: float = 0.0  # what torchtitan's op-level checkpointing repeats in backward

    @property
    def fwd(self) -> float:
        return self.fwd_gemm + self.fwd_attention + self.fwd_memory

    @property
    def bwd(self) -> float:
        return self.bwd_gemm + self.bwd_attention + self.bwd_memory


def _gemm_fwd_bwd(m: float, n: float, k: float, gpu: GPUSpec, cal: Calibration, peak: float, e: int) -> tuple[float, float, float]:
    """Forward (m,n,k); input gradient (m,k,n); weight gradient (k,n,m)."""
    fwd = float(gemm_time(m, n, k, gpu, cal, peak, e))
    return fwd, float(gemm_time(m, k, n, gpu, cal, peak, e)), float(gemm_time(k, n, m, gpu, cal, peak, e))


def layer_op_times(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    cp: int,
    sequence_parallel: bool,
    attention: str,
    attention_flops_convention: str,
    gpu: GPUSpec,
    cal: Calibration,
    compute_dtype: str,
    act_bytes: int,
) -> OpTimes:
    """One transformer layer, one micro-batch, one GPU (module docstring).

    ``attention_flops_convention`` is the FLOP-counting convention and does not change the time:
    FlashAttention skips fully masked blocks (the causal half), materialized attention computes
    the full s×s scores either way. ``fwd_attention`` is the whole attention core (for
    materialized attention its scale/mask/softmax passes too), which is what selective
    recompute repeats."""
    peak = gpu.peak(compute_dtype)
    peak16 = gpu.peak("bf16") if compute_dtype == "fp8" else peak  # attention stays 16-bit
    e = act_bytes
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    tokens = micro_batch * seq_len / cp
    a_r = model.n_heads // tp
    g_r = kv_heads_per_rank(model, tp)
    gemms = [
        (tokens, (a_r + 2 * g_r) * d, h),  # fused QKV projection
        (tokens, h, a_r * d),  # attention output projection
        (tokens, (2 if model.gated_mlp else 1) * f // tp, h),  # MLP in (fused gate|up)
        (tokens, h, f // tp),  # MLP out
    ]
    fg = bi = bw = 0.0
    for m_, n_, k_ in gemms:
        a, b, w = _gemm_fwd_bwd(m_, n_, k_, gpu, cal, peak, e)
        fg += a
        bi += b
        bw += w
    # attention core: per GPU, b·(s/c) queries against s keys over a/t heads
    q_len, kv_len = seq_len / cp, seq_len
    if attention == "flash":
        core = 4.0 * micro_batch * a_r * d * q_len * kv_len * 0.5  # causal: masked blocks skipped
        fa = core / (peak16 * cal.attention_fwd_efficiency) + cal.kernel_overhead
        ba = 2.5 * core / (peak16 * cal.attention_bwd_efficiency) + cal.kernel_overhead
    else:
        # two batched GEMMs (QKᵀ and A·V over b·a/t heads): one launch each
        batch = micro_batch * a_r
        o = cal.kernel_overhead
        per = (float(gemm_time(q_len, kv_len, d, gpu, cal, peak16, e)) - o) * batch + o
        per_av = (float(gemm_time(q_len, d, kv_len, gpu, cal, peak16, e)) - o) * batch + o
        scores = micro_batch * a_r * q_len * kv_len
        drop = scores * (1 + 2 * e) if model.dropout else 0.0
        softmax = memory_time(scores * 3 * e + drop, gpu, cal)  # scale + mask + softmax
        fa = per + per_av + softmax
        ba = 2 * (per + per_av) + 2 * softmax
    # memory-bound elementwise work, bytes read + written per forward
    rep = tp if sequence_parallel else 1
    nh = tokens * h * e / rep
    mem = 2 * (2 * nh)  # two norms: read + write
    mem += 2 * tokens * (a_r + g_r) * d * e  # RoPE on q and k (read + write)
    mem += (3 if model.gated_mlp else 2) * tokens * (f / tp) * e  # activation (and gating product)
    mem += 2 * (3 * nh)  # two residual adds: read 2, write 1
    if model.dropout:
        mem += 2 * (2 * nh + tokens * h / rep)
    n_mem_kernels = 7
    fm = memory_time(mem, gpu, cal) + (n_mem_kernels - 1) * cal.kernel_overhead
    bm = 2 * fm
    # op-level selective checkpointing repeats every second matmul (separate q, k, v as torchtitan
    # writes them) and the element-wise work, not the attention kernel
    shapes = matmuls_per_rank(model, tp)
    op_rec = fm + sum(
        float(gemm_time(tokens, shapes[nm][1], shapes[nm][0], gpu, cal, peak, e)) for nm, _, _ in op_sac_recomputed(model)
    )
    if compute_dtype == "fp8":
        cast_f, cast_b = fp8_cast_bytes(gemms, e)
        fm += memory_time(cast_f, gpu, cal) + (len(gemms) - 1) * cal.kernel_overhead
        bm += memory_time(cast_b, gpu, cal) + (len(gemms) - 1) * cal.kernel_overhead
    return OpTimes(fg, fa, fm, bi + bw, ba, bm, bw, op_rec)


def fp8_cast_bytes(gemms: list[tuple[float, float, float]], e: int) -> tuple[float, float]:
    """HBM traffic of FP8 training's casts with dynamic (current) scaling, forward and backward,
    for GEMMs (m, n, k) whose operands live in ``e``-byte precision: each operand cast to FP8 is
    read once for its absolute maximum and once more to write one byte per element, e + e + 1
    bytes per element — the input (m·k) and weight (k·n) forward; the output gradient (m·n) and
    the transposed FP8 copies of input and weight that the two backward GEMMs read, backward
    (Transformer Engine / torchao float8 recipes; Micikevicius et al. 2022, "FP8 Formats for Deep
    Learning", Sec. 4)."""
    per = 2 * e + 1
    fwd = sum(per * (m * k + k * n) for m, n, k in gemms)
    bwd = sum(per * m * n + 2 * (m * k + k * n) for m, n, k in gemms)  # grad cast; FP8 transposes
    return fwd, bwd


def embedding_op_times(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, gpu: GPUSpec, cal: Calibration, act_bytes: int) -> OpTimes:
    """Embedding lookup (gather, then an all-reduce across TP counted as communication) and its
    backward (scatter-add into the V/t × h gradient)."""
    nh = micro_batch * seq_len / cp * model.hidden * act_bytes
    bwd = memory_time(3 * nh, gpu, cal)  # all of it is the weight (table) gradient
    return OpTimes(0.0, 0.0, memory_time(2 * nh, gpu, cal), 0.0, 0.0, bwd, bwd)


def head_op_times(
    model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, gpu: GPUSpec, cal: Calibration,
    compute_dtype: str, act_bytes: int,
) -> OpTimes:
    """Final norm, LM head GEMM (n × V/t × h) and cross-entropy over fp32 logits (read bf16,
    write fp32, softmax read/write, loss: ~4 passes of 4 bytes forward, 3 backward)."""
    peak = gpu.peak(compute_dtype)
    tokens = micro_batch * seq_len / cp
    v_r = padded_vocab(model, tp) // tp
    fg, bi, bw = _gemm_fwd_bwd(tokens, v_r, model.hidden, gpu, cal, peak, act_bytes)
    logits = tokens * v_r
    nh = tokens * model.hidden * act_bytes
    fm = memory_time(2 * nh + logits * (act_bytes + 4 * 4), gpu, cal)
    bm = memory_time(4 * nh + logits * (3 * 4 + act_bytes), gpu, cal)
    return OpTimes(fg, 0.0, fm, bi + bw, 0.0, bm, bw)


def optimizer_step_time(local_params: float, recipe, gpu: GPUSpec, cal: Calibration) -> float:
    """A fused optimizer step over the parameters this GPU owns: memory-bound,
    ``params × recipe.optimizer_step_bytes / (W·η_hbm)`` (bytes read and written per parameter,
    from the precision recipe: 30 for Megatron's bf16 + fp32-gradient Adam)."""
    return local_params * recipe.optimizer_step_bytes / (gpu.hbm_bandwidth * cal.hbm_efficiency)


def recompute_time(ops: OpTimes, mode: str) -> float:
    """What the backward repeats of one layer's forward: all of it (full), the attention core
    (selective), every second matmul and the element-wise work (op), or nothing."""
    return {"full": ops.fwd, "selective": ops.fwd_attention, "op": ops.fwd_op_recompute, "none": 0.0}[mode]
