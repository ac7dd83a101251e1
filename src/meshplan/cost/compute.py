"""Compute time of one micro-batch through a layer, the embedding and the LM head, per GPU.

Each layer is a list of operations. GEMMs take the larger of their compute and memory bounds at a
shape-dependent efficiency, plus the launch (:mod:`meshplan.cost.kernel_time`). Attention (QKᵀ,
softmax, A·V) runs as FlashAttention at an efficiency that grows with the keys each kernel call
sees (:mod:`meshplan.cost.attention`); its backward does 2.5× the forward's matmul FLOPs (it
recomputes QKᵀ; Dao 2023); context parallelism adds the ring's merges
(:mod:`meshplan.cost.ring_attention`).
With materialized attention, the two batched GEMMs follow the GEMM model and the softmax is
memory-bound. Norms, RoPE, the MLP activation, residual adds and dropout are memory-bound: bytes
read and written over ``W·η_hbm``. The backward of a GEMM is two GEMMs (input and weight
gradients); of a memory-bound op, twice its forward traffic. The optimizer step:
:mod:`meshplan.cost.optimizer_step`.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.activations import compiled_loss
from meshplan.cost.attention import attention_kernel_of, flash_attention_times
from meshplan.cost.calibration import Calibration, gemm_calibration
from meshplan.cost.cp_exchange import sdpa_kv_heads
from meshplan.cost.float8 import torchao_float8_passes, weight_grad_16bit
from meshplan.cost.kernel_time import gemm_operand_bytes, gemm_time, memory_time
from meshplan.cost.params import (
    MLA_NAMES,
    kv_heads_per_rank,
    layer_matmuls,
    matmuls_per_rank,
    op_sac_recomputed,
    padded_vocab,
)
from meshplan.cost.ring_attention import eager_ring_attention_times, ring_attention_merge_times, torch_ring_keys
from meshplan.specs.hardware import GPUSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import fp8_library_of

# estimate and search.engine import these from here
from meshplan.cost.attention import ATTENTION_KERNEL_NAMES, attention_rates  # noqa: F401
from meshplan.cost.optimizer_step import optimizer_step_time  # noqa: F401


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
    # seconds per step, not per micro-batch: the layer's FP8 weight casts that Megatron-Core has
    # Transformer Engine run on a step's first micro-batch only (fp8_weight_cast_per_step)
    weight_cast: float = 0.0

    @property
    def fwd(self) -> float:
        return self.fwd_gemm + self.fwd_attention + self.fwd_memory

    @property
    def bwd(self) -> float:
        return self.bwd_gemm + self.bwd_attention + self.bwd_memory


def _gemm_fwd_bwd(M: float, N: float, K: float, gpu: GPUSpec, cal: Calibration, peak: float, e: int,
                  out_bytes: int | None = None) -> tuple[float, float, float]:
    """Seconds of an (M × K)·(K × N) GEMM forward, its input gradient (M, K, N) and its weight
    gradient (K, N, M)."""
    def t(a, b, c):
        return float(gemm_time(a, b, c, gpu, cal, peak, e, out_bytes))

    return t(M, N, K), t(M, K, N), t(K, N, M)


#: Element-wise kernels a layer's forward launches in PyTorch eager (torchtitan's Llama block:
#: 2 x RMSNorm of 6 kernels, RoPE of 4 on q and on k, SiLU and the gating product, 2 residual adds).
EAGER_LAYER_KERNELS = 24


def dense_gemm_shapes(model: ModelSpec, tokens: float, tp: int) -> list[tuple[float, float, float]]:
    """The (M, N, K) forward GEMMs of a dense layer on one TP rank, n tokens: the fused QKV
    projection (n, (a/t + 2·g_r)·d, h), the attention output projection (n, h, a/t·d), the MLP
    input (n, 2f/t or f/t, h: gate and up fused when gated) and the MLP output (n, h, f/t)."""
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    a_r, g_r = model.n_heads // tp, kv_heads_per_rank(model, tp)
    return [
        (tokens, (a_r + 2 * g_r) * d, h),  # fused QKV projection
        (tokens, h, a_r * d),  # attention output projection
        (tokens, (2 if model.gated_mlp else 1) * f // tp, h),  # MLP in (fused gate|up)
        (tokens, h, f // tp),  # MLP out
    ]


#: The names :func:`projection_gemms` gives the MLP's GEMMs (fused and separate).
MLP_GEMM_NAMES = frozenset({"mlp_in", "mlp_out", "gate", "up", "down", "fc1", "fc2"})
#: The GEMMs of :func:`projection_gemms` that read the layer's normed input (n × h), not the
#: output of another projection or of attention.
INPUT_PROJECTIONS = frozenset({"qkv", "q", "k", "v", "q_a", "kv_a", "mlp_in", "gate", "up", "fc1"})


def projection_gemms(model: ModelSpec, tokens: float, tp: int, kernels: str = "fused") -> list[tuple[str, tuple[float, float, float]]]:
    """The forward GEMMs (M, N, K) of a layer's weights on one TP rank, n = ``tokens``, named and
    in forward order, as the software stack launches them:

    * ``fused`` (Megatron-Core, Transformer Engine): one QKV GEMM and one gate|up GEMM, the
      four GEMMs of :func:`dense_gemm_shapes` (``qkv``, ``attn_out``, ``mlp_in``, ``mlp_out``);
    * ``compiled`` and ``eager`` (torch; torchtitan's Llama writes wq, wk, wv, w1, w3 as separate
      ``nn.Linear``): one GEMM per projection, ``q``, ``k``, ``v``, ``o``, ``gate``, ``up``,
      ``down`` (or ``fc1``, ``fc2``). Inductor keeps them apart: each linear is its own extern
      ``mm``, and the pre-grad pass that would concatenate linears sharing an input
      (``batch_linear_lhs`` in ``torch/_inductor/fx_passes/group_batch_fusion.py``) takes only
      2-D inputs (``is_linear_node_can_be_fused``; a block's are (b, s, h)) and groups of at least
      ``MIN_FUSE_SET_SIZE = 5``, in the builds that enabled it by default as in the later ones
      that do not (``pre_grad_fusion_options = {}``).
      ``tests/test_torch_projections.py`` counts the ``mm`` calls of a torchtitan block on CPU, eager
      and compiled.

    MLA's attention projections (q or q_a, q_b; kv_a, kv_b; o) are separate GEMMs on every stack."""
    shapes = matmuls_per_rank(model, tp)
    separate = [(nm, (tokens, shapes[nm][1], shapes[nm][0])) for nm, _, _ in layer_matmuls(model)]
    if kernels == "fused":
        qkv, out, mlp_in, mlp_out = dense_gemm_shapes(model, tokens, tp)
        attn = [("qkv", qkv), ("attn_out", out)]
        mlp = [("mlp_in", mlp_in), ("mlp_out", mlp_out)]
    else:
        attn = [g for g in separate if g[0] not in MLP_GEMM_NAMES]
        mlp = [g for g in separate if g[0] in MLP_GEMM_NAMES]
    if model.is_mla:
        attn = [g for g in separate if g[0] in MLA_NAMES]
    return attn + mlp


def _shared_input_groups(gemms: list[tuple[str, tuple[float, float, float]]]) -> list[tuple[int, float]]:
    """(j, n) of the attention's and the MLP's GEMMs that read the layer's normed input: how many
    (:data:`INPUT_PROJECTIONS`) and their token count m."""
    out = []
    for in_mlp in (False, True):
        group = [m for name, (m, _, _) in gemms if name in INPUT_PROJECTIONS and (name in MLP_GEMM_NAMES) == in_mlp]
        if group:
            out.append((len(group), group[0]))
    return out


def input_gradient_sum_bytes(gemms: list[tuple[str, tuple[float, float, float]]], hidden: int, e: int,
                             kernels: str = "fused", tp: int = 1) -> float:
    """HBM bytes of summing the input gradients of projections that read the same input, one
    micro-batch, for ``gemms`` of :func:`projection_gemms` on one rank of ``tp``.

    The j GEMMs of the attention (or of the MLP) that read the layer's n × h normed input each
    write an n × h input gradient, which autograd sums (j = 1 for a fused QKV or gate|up GEMM,
    whose one input gradient :func:`gemm_time` already writes):

    * ``eager`` and ``fused`` (autograd's accumulation of the gradients of one tensor): j − 1
      adds of read 2, write 1: 3·(j − 1)·n·h·e;
    * ``compiled``, t = 1: Inductor does not write the sum; it fuses it into both reductions of
      RMSNorm's backward (the input gradient over h, the weight gradient over the tokens), each of
      which reads the j gradients where it would read one: 2·(j − 1)·n·h·e (in the generated
      backward of a compiled torchtitan block the input gradients of wq, wk, wv enter exactly two
      fused kernels, both reductions, and no add of their own: ``tests/test_torch_projections.py``);
    * ``compiled``, t > 1: the sum is a partial sum the TP collective (reduce-scatter with
      sequence parallelism, all-reduce without) takes as its input, a buffer Inductor must write:
      one fused add, read j, write 1: (j + 1)·n·h·e."""
    total = 0.0
    for j, n in _shared_input_groups(gemms):
        if j > 1:
            per = (j + 1 if tp > 1 else 2 * (j - 1)) if kernels == "compiled" else 3 * (j - 1)
            total += per * n * hidden * e
    return total


def input_gradient_sum_kernels(gemms: list[tuple[str, tuple[float, float, float]]], kernels: str = "fused", tp: int = 1) -> int:
    """Kernels :func:`input_gradient_sum_bytes` launches: j − 1 adds per group eager (and on the
    fused stack), one fused add per group compiled with TP, none compiled without."""
    groups = [j for j, _ in _shared_input_groups(gemms) if j > 1]
    if kernels == "compiled":
        return len(groups) if tp > 1 else 0
    return sum(j - 1 for j in groups)


#: Kernels RoPE adds to a compiled layer's forward beyond the one counted: Inductor generates no
#: code for complex tensors and falls back to aten's complex multiply, so q and k each take a
#: cast kernel and a complex multiply (the casts back fuse with their consumers).
COMPILED_ROPE_EXTRA_KERNELS = 3


def rope_bytes(e: int, kernels: str = "fused") -> tuple[float, float]:
    """HBM bytes per rotated element of q and k of RoPE, forward and backward, ``e``-byte
    activations:

    * ``fused`` (Transformer Engine's and Apex's fused RoPE kernels): read e, write e, each way:
      2e and 2e;
    * ``compiled`` and ``eager`` (torchtitan's ``apply_rotary_emb``: ``x.float()`` viewed as
      complex, times ``freqs_cis``, ``view_as_real``, ``type_as(x)``): a cast to fp32 (e + 4),
      the complex multiply (an fp32 pair read and written per two elements: 4 + 4), the cast back
      (4 + e): 2e + 16; the backward runs the same chain with the conjugate, 2e + 16. Compiled
      alike: Inductor does not generate code for complex operators ("Torchinductor does not
      support code generation for complex operators") and falls back to aten's complex multiply
      between two cast kernels, forward and backward (``tests/test_torch_projections.py`` reads
      the generated code of a bf16 block).

    The backward of RoPE is the same rotation and moves what the forward does, where meshplan
    takes twice the forward's bytes for the other element-wise ops."""
    if kernels == "fused":
        return 2 * e, 2 * e
    return 2 * e + 16, 2 * e + 16


def softmax_bytes(e: int, kernels: str = "fused") -> tuple[float, float]:
    """HBM bytes per attention score of materialized attention's scale, causal mask and softmax,
    forward and backward, for ``e``-byte scores:

    * ``fused`` (Megatron's ``FusedScaleMaskSoftmax``, ``scaled_upper_triang_masked_softmax``,
      used up to its kernels' key length with fp16/bf16 scores, as in every published run that
      materializes attention) and ``compiled`` (Inductor fuses the chain into one reduction): one
      kernel reads the scores and writes the probabilities, 2e; its backward reads the output
      gradient and the probabilities and writes the input gradient, 3e;
    * ``eager``: three kernels, scale (2e), ``masked_fill`` (2e) and softmax (2e), 6e; backward,
      softmax's (3e), then the mask's and the scale's (2e each), 7e.

    Dropout of the probabilities is counted apart (read e, write e and a 1-byte mask)."""
    if kernels == "eager":
        return 6 * e, 7 * e
    return 2 * e, 3 * e


def elementwise_bytes(e: int, kernels: str = "fused") -> dict[str, float]:
    """HBM bytes per element that a layer's element-wise ops read and write in the forward, for
    ``e``-byte activations, by software stack (``kernels``):

    * fused (Megatron-Core/TE/Apex fused kernels) and compiled (torch.compile/Inductor fuses the
      same chains): norm ``2e`` (read, write), SwiGLU ``3e`` (read gate and up, write the
      product);
    * eager (one kernel per op, as written in torchtitan's model): RMSNorm upcasts to fp32 —
      cast (e + 4), square (4 + 4), mean (4), scale by 1/rms (4 + 4), cast back (4 + e), times
      the weight (e + e) = ``4e + 28``; SwiGLU as SiLU (2e) then the product (3e) = ``5e``.

    RoPE, which Inductor does not fuse, is :func:`rope_bytes`. Each op's bytes are its tensors'
    sizes (PyTorch's kernels read each input and write each output once); the eager/fused ratio
    is the source of torch.compile's speed-up on element-wise chains (Ansel et al. 2024,
    "PyTorch 2", ASPLOS, Sec. 6)."""
    if kernels == "eager":
        return {"norm": 4 * e + 28, "swiglu": 5 * e}
    return {"norm": 2 * e, "swiglu": 3 * e}


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
    kernels: str = "fused",
    moe: bool = False,
    ep: int = 1,
    weights_in_fp8: bool = False,
    fp8_linears: str = "auto",
    attention_kernel: str = "auto",
    fp8_scaling: str = "tensorwise",
) -> OpTimes:
    """One transformer layer, one micro-batch, one GPU (module docstring); ``moe`` for a
    mixture-of-experts layer of an MoE model with experts spread over ``ep`` GPUs
    (:func:`moe_mlp_gemms`); ``weights_in_fp8``: torchao's Float8Linear weights arrive cast by
    FSDP2's FP8 all-gather (:func:`meshplan.cost.float8.torchao_float8_passes`); ``fp8_linears``:
    the plan's choice of FP8 library (:func:`meshplan.specs.plan.fp8_library_of`);
    ``attention_kernel``: the plan's attention kernel (:func:`meshplan.cost.attention.attention_kernel_of`);
    ``fp8_scaling``: torchao's recipe (:mod:`meshplan.cost.float8`; ``rowwise_with_gw_hp`` runs
    the weight-gradient GEMMs in 16 bits).

    ``attention_flops_convention`` is the FLOP-counting convention and does not change the time:
    FlashAttention skips fully masked blocks (the causal half), materialized attention computes
    the full s×s scores either way. ``fwd_attention`` is the whole attention core (for
    materialized attention its scale/mask/softmax passes too), which is what selective
    recompute repeats."""
    peak = gpu.peak(compute_dtype)
    cal_g = gemm_calibration(cal, compute_dtype)  # the layer GEMMs' (FP8's own η_max)
    e = act_bytes
    tokens = micro_batch * seq_len / cp
    named = [g for g in projection_gemms(model, tokens, tp, kernels) if not (moe and g[0] in MLP_GEMM_NAMES)]
    gemms = [shape for _, shape in named]
    grouped = moe_mlp_gemms(model, tokens, tp, ep) if moe else []
    ge = gemm_operand_bytes(compute_dtype, e)
    fg, bi, bw = _gemm_times(gemms, grouped, gpu, cal, cal_g, peak, ge, e)
    peak16 = gpu.peak("bf16") if compute_dtype == "fp8" else peak  # attention stays 16-bit
    if weight_grad_16bit(compute_dtype, fp8_scaling):
        bw = _gemm_times(gemms, grouped, gpu, cal, cal, peak16, gemm_operand_bytes("bf16", e), e)[2]
    fa, ba = _attention_core_times(model, micro_batch, seq_len, tp, cp, attention, kernels, attention_kernel, gpu, cal, peak16, e)
    fm, bm = _elementwise_times(model, tokens, tp, sequence_parallel, kernels, moe, named, gpu, cal, e)
    # op-level selective checkpointing repeats every second matmul (separate q, k, v as torchtitan
    # writes them) and the element-wise work, not the attention kernel
    shapes = matmuls_per_rank(model, tp)
    op_rec = fm + sum(
        float(gemm_time(tokens, shapes[nm][1], shapes[nm][0], gpu, cal_g, peak, ge, e)) for nm, _, _ in op_sac_recomputed(model)
    )
    weight_cast = 0.0
    if compute_dtype == "fp8":
        casts = _fp8_cast_times(model, tokens, tp, kernels, fp8_linears, moe, gemms, grouped, weights_in_fp8, gpu, cal, e,
                                fp8_scaling)
        fm, bm, op_rec, weight_cast = fm + casts[0], bm + casts[1], op_rec + casts[2], casts[3]
    return OpTimes(fg, fa, fm, bi + bw, ba, bm, bw, op_rec, weight_cast)


def input_projection_backward(model: ModelSpec, tokens: float, tp: int, kernels: str, gpu: GPUSpec, cal: Calibration,
                              compute_dtype: str, act_bytes: int,
                              fp8_scaling: str = "tensorwise") -> tuple[tuple[float, float], tuple[float, float]]:
    """(input-gradient, weight-gradient) seconds of the GEMMs that read the attention block's and
    the MLP block's input (:data:`INPUT_PROJECTIONS`: QKV, gate|up or fc1; MLA's q_a and kv_a), one
    micro-batch of ``tokens`` on one TP rank, the pair the block's backward TP collectives run behind
    (:mod:`meshplan.cost.tp_backward`); the MLP's pair is a dense MLP's. ``rowwise_with_gw_hp``
    (``fp8_scaling``) runs the weight-gradient GEMMs in 16 bits, as :func:`layer_op_times` does."""
    peak, cal_g = gpu.peak(compute_dtype), gemm_calibration(cal, compute_dtype)
    ge = gemm_operand_bytes(compute_dtype, act_bytes)
    w16 = weight_grad_16bit(compute_dtype, fp8_scaling)
    blocks = {False: [0.0, 0.0], True: [0.0, 0.0]}
    for name, (M, N, K) in projection_gemms(model, tokens, tp, kernels):
        if name in INPUT_PROJECTIONS:
            _, dgrad, wgrad = _gemm_fwd_bwd(M, N, K, gpu, cal_g, peak, ge, act_bytes)
            if w16:
                wgrad = _gemm_fwd_bwd(M, N, K, gpu, cal, gpu.peak("bf16"), gemm_operand_bytes("bf16", act_bytes), act_bytes)[2]
            pair = blocks[name in MLP_GEMM_NAMES]
            pair[0] += dgrad
            pair[1] += wgrad
    return (blocks[False][0], blocks[False][1]), (blocks[True][0], blocks[True][1])


def _gemm_times(gemms: list, grouped: list, gpu: GPUSpec, cal: Calibration, cal_g: Calibration, peak: float, ge: float,
                e: int) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of a layer's GEMMs ``gemms`` (M, N, K)
    and of its grouped expert GEMMs ``grouped`` (M, N, K, count: one launch for the local experts,
    one kernel overhead)."""
    fg = bi = bw = 0.0
    for M, N, K in gemms:
        a, b, w = _gemm_fwd_bwd(M, N, K, gpu, cal_g, peak, ge, e)
        fg += a
        bi += b
        bw += w
    for M, N, K, count in grouped:  # one grouped-GEMM launch for the local experts
        a, b, w = _gemm_fwd_bwd(M, N, K, gpu, cal_g, peak, ge, e)
        o = cal.kernel_overhead
        fg += (a - o) * count + o
        bi += (b - o) * count + o
        bw += (w - o) * count + o
    return fg, bi, bw


def _attention_core_times(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, attention: str, kernels: str,
                          attention_kernel: str, gpu: GPUSpec, cal: Calibration, peak16: float, e: int) -> tuple[float, float]:
    """(forward, backward) of the attention core: per GPU, b·(s/c) queries against s keys over
    a/t heads; MLA's scores use d = d_nope + d_r and its values d_v: the mean of the two for the two
    matmuls. FlashAttention (with CP, the ring's merges), or materialized scores: two batched
    GEMMs (QKᵀ and A·V over b·a/t heads, one launch each) and the softmax passes."""
    d = model.head_dim
    a_r = model.n_heads // tp
    q_len, kv_len = seq_len / cp, seq_len
    d_core = (d + model.value_head_dim) / 2 if model.is_mla else d
    if attention == "flash":
        # keys per kernel call: the whole sequence, or one ring step's block (torch's round-robin
        # ring: torch_ring_keys)
        keys = kv_len / cp if kernels == "fused" else torch_ring_keys(kv_len, cp)
        fa, ba = flash_attention_times(micro_batch * a_r, d_core, q_len, kv_len, keys, peak16, cal,
                                       attention_kernel_of(kernels, attention_kernel, cal))
        if cp > 1:
            d_v = model.value_head_dim if model.is_mla else d
            # torch's SDPA gets the repeated K/V heads (repeat_kv_bytes), so its ring rotates and
            # accumulates dK, dV over a/t heads
            g_sdpa = sdpa_kv_heads(model, tp, kernels)
            merge = eager_ring_attention_times if kernels == "eager" else ring_attention_merge_times
            ring_f, ring_b = merge(micro_batch * seq_len / cp, a_r, g_sdpa, d, d_v, cp, e, gpu, cal)
            fa += ring_f
            ba += ring_b
        return fa, ba
    batch = micro_batch * a_r
    o = cal.kernel_overhead
    per = (float(gemm_time(q_len, kv_len, d, gpu, cal, peak16, e)) - o) * batch + o
    per_av = (float(gemm_time(q_len, d, kv_len, gpu, cal, peak16, e)) - o) * batch + o
    scores = micro_batch * a_r * q_len * kv_len
    drop = scores * (1 + 2 * e) if model.dropout else 0.0
    sm_f, sm_b = softmax_bytes(e, kernels)
    softmax = memory_time(scores * sm_f + drop, gpu, cal)
    return per + per_av + softmax, 2 * (per + per_av) + memory_time(scores * sm_b + drop, gpu, cal)


def _elementwise_times(model: ModelSpec, tokens: float, tp: int, sequence_parallel: bool, kernels: str, moe: bool, named: list,
                       gpu: GPUSpec, cal: Calibration, e: int) -> tuple[float, float]:
    """(forward, backward) of a layer's memory-bound element-wise work: bytes read + written per
    forward (norms, RoPE on q and k, the MLP's activation, residual adds, dropout; an MoE layer's
    routed copies and their permutation), one launch overhead per kernel; the backward of each op
    moves twice its forward's bytes (RoPE its own), plus the sum of separate projections' input
    gradients and torch's repeated K/V heads."""
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    a_r, g_r = model.n_heads // tp, kv_heads_per_rank(model, tp)
    rep = tp if sequence_parallel else 1
    nh = tokens * h / rep  # elements of one hidden-state tensor
    eb = elementwise_bytes(e, kernels)
    mem = model.norms_per_layer * nh * eb["norm"]  # two norms (Gemma 2/3: four)
    rope_elems = tokens * (a_r + g_r) * d if model.position == "rope" else 0.0  # q and k
    rope_f, rope_b = rope_bytes(e, kernels)
    mem += rope_elems * rope_f
    if moe:  # the experts' activations over the n·k routed copies and the shared expert's, plus
        # the permutation before and after the experts (read + write of each copy)
        width = tokens * model.experts_per_token * model.expert_ffn_hidden + tokens * model.shared_expert_ffn_hidden
        mem += width / tp * (eb["swiglu"] if model.gated_mlp else 2 * e)
        mem += 2 * (2 * tokens * model.experts_per_token * h * e)
    else:
        mem += tokens * (f / tp) * (eb["swiglu"] if model.gated_mlp else 2 * e)  # activation (and gating product)
    mem += 2 * (3 * nh * e)  # two residual adds: read 2, write 1
    if model.dropout:
        mem += 2 * (2 * nh * e + nh)
    n_mem_kernels = {"fused": 7, "compiled": 7 + (COMPILED_ROPE_EXTRA_KERNELS if rope_elems else 0)}.get(kernels, EAGER_LAYER_KERNELS)
    fm = memory_time(mem, gpu, cal) + (n_mem_kernels - 1) * cal.kernel_overhead
    # the backward of each element-wise op moves twice its forward's bytes, but RoPE's, the same
    # rotation with the conjugate, moves its own (rope_bytes)
    bm = 2 * fm + rope_elems * (rope_b - 2 * rope_f) / (gpu.hbm_bandwidth * cal.hbm_efficiency)
    grad_sum = input_gradient_sum_bytes(named, h, e, kernels, tp)
    if grad_sum:  # separate projections' input gradients summed (compiled, t = 1: inside the norm's backward)
        bm += memory_time(grad_sum, gpu, cal) + (input_gradient_sum_kernels(named, kernels, tp) - 1) * cal.kernel_overhead
    if kernels != "fused" and g_r < a_r and not model.is_mla:  # torch's SDPA gets repeated K/V
        rep_kv = memory_time(repeat_kv_bytes(tokens, a_r, g_r, d, e), gpu, cal) + cal.kernel_overhead
        fm += rep_kv
        bm += rep_kv
    return fm, bm


def _fp8_cast_times(model: ModelSpec, tokens: float, tp: int, kernels: str, fp8_linears: str, moe: bool, gemms: list,
                    grouped: list, weights_in_fp8: bool, gpu: GPUSpec, cal: Calibration, e: int,
                    scaling: str = "tensorwise") -> tuple[float, float, float, float]:
    """What FP8 GEMMs add to a layer: (forward, backward, op-level recompute) seconds of their
    casts and the weights' casts once per step (Megatron-Core, :func:`fp8_weight_cast_per_step`;
    0 elsewhere). Transformer Engine casts every FP8 GEMM's operands (the projections and MLP, or
    the MoE layer's shared expert and experts: the router runs in 16 bits); torchao's Float8Linear
    its own passes under the recipe ``scaling`` (:mod:`meshplan.cost.float8`)."""
    if fp8_library_of(kernels, fp8_linears) == "transformer-engine":
        te_gemms = [(*g, 1) for g in gemms] + list(grouped[1:])
        cast_f, cast_b, weight_f, weight_b = fp8_cast_bytes(te_gemms, e)
        weight_cast = 0.0
        if fp8_weight_cast_per_step(kernels):
            weight_cast = memory_time(weight_f + weight_b, gpu, cal) + (len(te_gemms) - 1) * cal.kernel_overhead
        else:
            cast_f, cast_b = cast_f + weight_f, cast_b + weight_b
        overhead = (len(te_gemms) - 1) * cal.kernel_overhead
        return memory_time(cast_f, gpu, cal) + overhead, memory_time(cast_b, gpu, cal) + overhead, 0.0, weight_cast
    # torchao's Float8Linear; compiled, AOTAutograd's CSE casts a shared input once: the fused
    # stack's shapes count it once
    cast_gemms = gemms if kernels == "eager" else [
        shape for nm, shape in projection_gemms(model, tokens, tp, "fused") if not (moe and nm in MLP_GEMM_NAMES)]
    f8 = torchao_float8_passes(cast_gemms, e, weights_in_fp8, scaling, compiled=kernels != "eager")
    return (memory_time(f8.fwd_bytes, gpu, cal) + (f8.fwd_kernels - 1) * cal.kernel_overhead,
            memory_time(f8.bwd_bytes, gpu, cal) + (f8.bwd_kernels - 1) * cal.kernel_overhead,
            memory_time(f8.recompute_bytes, gpu, cal) + (f8.recompute_kernels - 1) * cal.kernel_overhead, 0.0)


def repeat_kv_bytes(tokens: float, heads: int, kv_heads: int, d: float, e: int) -> float:
    """HBM bytes of torchtitan's ``repeat_kv`` for grouped-query attention, forward (the backward,
    a sum over the repeats, moves the same): torch's SDPA flash kernel of 2024 takes as many K/V
    heads as query heads, so the model expands each of K and V from g to a heads and materializes
    the copy (``torchtitan/models/llama/model.py``, ``repeat_kv``: ``unsqueeze(x, 3).expand(bs,
    slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, n_kv_heads * n_rep, head_dim)``, a
    reshape of an expanded tensor, hence a copy), reading g·d and writing a·d elements per token:

        bytes = 2 · n · d · (g + a) · e

    (n tokens, a and g query and K/V heads on the TP rank, d head dim; two tensors, K and V).
    Megatron-Core and Transformer Engine pass the g K/V heads to their attention kernels: no copy
    on the ``fused`` stack. Op-level checkpointing recomputes it (SDPA's inputs are not saved)."""
    return 2.0 * tokens * d * (kv_heads + heads) * e


def moe_mlp_gemms(model: ModelSpec, tokens: float, tp: int, ep: int) -> list[tuple[float, float, float, float]]:
    """A mixture-of-experts MLP on one GPU as (M, N, K, count) GEMMs: the router (n × E × h), the
    shared expert (n tokens through f_s/t), and the E/ep local experts, each receiving
    ``M_e = n·k·ep/E`` tokens on average — each GPU of the EP group sends n·k token copies and,
    with balanced routing (dropless, as Megatron-Core and DeepSeek-V3 train), receives as many
    (Lepikhin et al. 2021, GShard, Sec. 2.2; Megatron-Core MoE docs). The experts run as one
    grouped GEMM, so a small ``M_e`` costs efficiency: fine-grained experts (DeepSeek's E = 256)
    run slower per FLOP than Mixtral's eight."""
    h, n_in = model.hidden, (2 if model.gated_mlp else 1)
    out: list[tuple[float, float, float, float]] = [(tokens, model.n_experts, h, 1)]
    if model.shared_expert_ffn_hidden:
        f_s = model.shared_expert_ffn_hidden // tp
        out += [(tokens, n_in * f_s, h, 1), (tokens, h, f_s, 1)]
    local = model.n_experts // ep
    M_e = tokens * model.experts_per_token / local
    f_e = model.expert_ffn_hidden // tp
    return out + [(M_e, n_in * f_e, h, local), (M_e, h, f_e, local)]


def fp8_cast_bytes(gemms: list[tuple[float, float, float, float]], e: int) -> tuple[float, float, float, float]:
    """HBM traffic of Transformer Engine's FP8 casts for ``count`` GEMMs (M, N, K) each whose
    operands live in ``e``-byte precision, as (activations forward, activations backward, weights
    forward, weights backward). Each operand cast to FP8 is read once for its absolute maximum and
    once more to write one byte per element, e + e + 1 bytes per element — the input (M·K) and the
    weight (K·N) forward, the output gradient (M·N) backward — and the two backward GEMMs read FP8
    transposes of input and weight, 2 bytes per element each (Micikevicius et al. 2022, "FP8
    Formats for Deep Learning", Sec. 4):

        activations: fwd (2e + 1)·M·K,  bwd (2e + 1)·M·N + 2·M·K
        weights:     fwd (2e + 1)·K·N,  bwd 2·K·N

    per GEMM. Whether the weights' part is paid every micro-batch or once per step is the stack's
    (:func:`fp8_weight_cast_per_step`). torchao's Float8Linear (``compiled``/``eager``) makes one
    more pass, the output gradient's column-major copy: :mod:`meshplan.cost.float8`."""
    per = 2 * e + 1
    act_f = sum(c * per * M * K for M, N, K, c in gemms)
    act_b = sum(c * (per * M * N + 2 * M * K) for M, N, K, c in gemms)  # grad cast; input transpose
    weight_f = sum(c * per * K * N for M, N, K, c in gemms)
    weight_b = sum(c * 2 * K * N for M, N, K, c in gemms)  # the weight's FP8 transpose
    return act_f, act_b, weight_f, weight_b


def fp8_weight_cast_per_step(kernels: str) -> bool:
    """Whether Transformer Engine casts the FP8 weights (and their transposes) once per step rather
    than every micro-batch: on the ``fused`` stack, Megatron-Core. Its schedules call
    ``set_is_first_microbatch`` at a step's first micro-batch ("When this flag is set, TE modules
    will update their fp8 parameter cache", ``megatron/core/transformer/module.py``) and its TE
    layers pass ``is_first_microbatch`` to TE, whose linears then cache "the FP8 versions of the
    weights" between the micro-batches of a step, when the weights do not change
    (``transformer_engine/pytorch/module/linear.py``, ``forward``). Other users of TE's linears
    (Composer's amp_fp8, Accelerate: the ``eager`` stack) call them without the flag, which casts
    every call.

    The casts then sit on the step's critical path once per layer: the first micro-batch's forward
    runs through every pipeline stage (every virtual stage, interleaved) before the schedule's
    steady state, each stage's first forward longer by its layers' casts, so the step grows by
    the casts of all L layers, ``L · t_cast`` (:func:`meshplan.estimate.estimate`), at any pp."""
    return kernels == "fused"


def embedding_op_times(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, gpu: GPUSpec, cal: Calibration, act_bytes: int) -> OpTimes:
    """Embedding lookup (gather, then an all-reduce across TP counted as communication) and its
    backward into the V/t × h table gradient, all of it weight gradient. The backward as aten's
    CUDA ``embedding_backward_cuda_kernel`` runs it (n = b·s/c tokens, e-byte activations): the
    whole gradient zero-filled in the weights' dtype (V/t·h·e, which dominates: the table is far
    larger than the micro-batch), the output gradient read (n·h·e), its rows summed per token into
    fp32 partial sums written and read back (2·4·n·h, at most one partial row per token) and
    scattered into the table (n·h·e). On an H200 the 8B's backward took 1.50 ms where these
    bytes give 0.49 (docs/gpu_measurements.md): the index sort and its dozen small kernels are
    not counted."""
    n = micro_batch * seq_len / cp
    nh = n * model.hidden * act_bytes
    table = padded_vocab(model, tp) // tp * model.hidden * act_bytes
    bwd = memory_time(table + 2 * nh + 8 * n * model.hidden, gpu, cal)
    return OpTimes(0.0, 0.0, memory_time(2 * nh, gpu, cal), 0.0, 0.0, bwd, bwd)


def head_op_times(
    model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, gpu: GPUSpec, cal: Calibration,
    compute_dtype: str, act_bytes: int, loss_kernels: str = "fused",
) -> OpTimes:
    """Final norm, LM head GEMM (n × V/t × h) and the cross-entropy over the n·V/t logits, bytes
    per logit:

    * ``eager`` (torch's ``F.cross_entropy(logits.float(), labels)``, torchtitan's loss): forward,
      the cast (read e, write 4), then ``log_softmax`` over a row too long for shared memory
      (``cunn_SoftMaxForward``: a max pass, a sum-of-exponentials pass, then read and write: 16),
      e + 20; backward, ``nll_loss_backward``'s zero-filled fp32 gradient (4), the softmax
      backward (``cunn_SoftMaxBackward``: a sum pass over the gradient, then read it and the
      output and write: 16) and the cast back (read 4, write e), 24 + e. Measured on an H200
      (docs/gpu_measurements.md): 48.6 bytes a logit both ways against 48 counted;
    * ``fused`` (Megatron's vocab-parallel cross-entropy over fp32 logits: ~4 passes of 4 bytes
      forward, 3 backward): (e + 16) forward, (12 + e) backward;
    * compiled (:func:`meshplan.cost.activations.compiled_loss`): the forward's two reductions
      (max, then the sum of exponentials) each read the e-byte logits; the backward reads them
      once and writes the e-byte gradient: 2e bytes per logit each way."""
    peak = gpu.peak("bf16" if compute_dtype == "fp8" else compute_dtype)  # the LM head stays 16-bit
    tokens = micro_batch * seq_len / cp
    v_r = padded_vocab(model, tp) // tp
    fg, bi, bw = _gemm_fwd_bwd(tokens, v_r, model.hidden, gpu, cal, peak, act_bytes)
    logits = tokens * v_r
    nh = tokens * model.hidden * act_bytes
    if compiled_loss(loss_kernels, tp):
        fwd_per, bwd_per = 2 * act_bytes, 2 * act_bytes
    elif loss_kernels == "fused":
        fwd_per, bwd_per = act_bytes + 4 * 4, 3 * 4 + act_bytes
    else:  # torch's cross_entropy over the upcast logits, eager (or under loss_parallel with TP)
        fwd_per, bwd_per = act_bytes + 5 * 4, 6 * 4 + act_bytes
    fm = memory_time(2 * nh + logits * fwd_per, gpu, cal)
    bm = memory_time(4 * nh + logits * bwd_per, gpu, cal)
    return OpTimes(fg, 0.0, fm, bi + bw, 0.0, bm, bw)


def recompute_time(ops: OpTimes, mode: str) -> float:
    """What the backward repeats of one layer's forward: all of it (full), the attention core
    (selective), every second matmul and the element-wise work (op), or nothing."""
    return {"full": ops.fwd, "selective": ops.fwd_attention, "op": ops.fwd_op_recompute, "none": 0.0}[mode]
