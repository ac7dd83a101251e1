"""Kernel times on a GPU against meshplan's compute model (``meshplan verify kernels``).

meshplan's step time rests on four per-kernel models (:mod:`meshplan.cost.compute`) and the
constants of :mod:`meshplan.cost.calibration`. This module times the kernels those models describe,
at the shapes a plan gives one GPU, and sets each measurement beside its prediction:

==========  ================================================  =================================
kind        what runs (torch, random normal data)             predicted by
==========  ================================================  =================================
gemm        ``X·W`` of each layer GEMM (m, n, k), its input   ``gemm_time`` (η_max·q(m, n)·
            gradient ``dY·Wᵀ`` (m, k, n) and weight           k/(k + k½), HBM floor, t_kernel)
            gradient ``Xᵀ·dY`` (k, n, m); bf16 or fp16
            ``torch.mm``, or FP8 ``torch._scaled_mm``; the
            GEMMs of the plan's ``kernels`` stack (fused
            QKV and gate|up, or torch's separate q, k, v,
            gate, up: ``projection_gemms``)
attention   SDPA forward, causal, b·a/t heads of d over s     ``flash_attention_times``
            queries and keys; backward = (forward + backward)  (η(L) = η∞·L/(L + L₀))
            − forward
memory      a copy of one MLP-wide activation, read + write   ``memory_time`` (η_hbm)
layer       torchtitan's Llama block (:mod:`.llama_block`),   ``layer_op_times`` for the
            eager or ``torch.compile``'d, forward and          ``eager`` or ``compiled`` stack
            backward (no recompute)                            (its fwd and bwd)
==========  ================================================  =================================

Each time is the median of ``reps`` timed runs after ``warmup`` untimed ones, and before those
``settle`` seconds of the kernel back to back (:data:`GPU_SETTLE_S` on a GPU by default, so that
the clock has come down to what the power cap sustains): CUDA events on a GPU,
``time.perf_counter`` on the CPU (where the rows only exercise the code: the predictions are for
the catalog GPU, not for the CPU).

Beside the ratio measured / predicted, each gemm, attention and memory row gives the value of its
calibration constant that would make the prediction equal the measurement (the *implied*
constant), t_kernel and the other factors held:

    gemm       η_max' = 2·m·n·k / (P · q(m, n) · k/(k + k½) · (t − t_kernel))   (compute-bound rows;
               under FP8 P is the FP8 peak and the constant ``gemm_fp8_efficiency``, while
               attention and copies stay at 16 bits)
    attention  η∞'   = F_a / (P · (t − t_kernel)) · (L + L₀)/L,  F_a = F or 2.5·F (backward)
    memory     η_hbm' = bytes / (W · (t − t_kernel))

(P the dense 16-bit peak, W the HBM bandwidth, F the causal attention FLOPs of
:func:`~meshplan.cost.attention.causal_attention_flops`). The summary pools each kind as
Σ work / Σ (t − t_kernel), the constant that reproduces the kind's total time. These are the
figures a calibration of :mod:`meshplan.cost.calibration` would be set from; they are printed, never
written back. Timed as bursts (``settle`` 0), GEMM rows read faster than the same GEMM sustains
once the power cap brings the clock down (13-17 % on an H200: docs/gpu_measurements.md); the
calibration's GEMM constants are the sustained figures.
"""

from __future__ import annotations

import datetime
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from meshplan.cost.attention import causal_attention_flops, flash_attention_efficiency, flash_attention_times
from meshplan.cost.calibration import Calibration, calibration_for, gemm_calibration
from meshplan.cost.compute import layer_op_times, projection_gemms
from meshplan.cost.kernel_time import gemm_bounds, gemm_efficiency, gemm_operand_bytes, gemm_time, memory_time
from meshplan.cost.params import kv_heads_per_rank
from meshplan.errors import InputError
from meshplan.specs.hardware import GPUSpec
from meshplan.specs.model import ModelSpec

#: The three GEMMs of one linear layer: forward (m, n, k), input gradient (m, k, n), weight
#: gradient (k, n, m), as (name, permutation of (m, n, k)).
GEMM_DIRECTIONS = (("fwd", (0, 1, 2)), ("dgrad", (0, 2, 1)), ("wgrad", (2, 1, 0)))
#: Per precision timed here: the activations' element bytes and torch dtype (attention, copies,
#: layers and 16-bit GEMMs run in it; under FP8 attention stays in bf16, meshplan's model).
DTYPES = {"bf16": (2, "bfloat16"), "fp16": (2, "float16"), "fp8": (2, "bfloat16")}
#: FP8 GEMM operands (A, B) per direction: ``torch._scaled_mm`` of E4M3 operands with the output
#: gradient in E5M2 (torchao's tensorwise recipe), bf16 out.
FP8_OPERANDS = {"fwd": ("float8_e4m3fn", "float8_e4m3fn"), "dgrad": ("float8_e5m2", "float8_e4m3fn"),
                "wgrad": ("float8_e4m3fn", "float8_e5m2")}
#: Software stacks the layer rows time (meshplan's ``kernels``).
LAYER_STACKS = ("eager", "compiled")


@dataclass(frozen=True)
class KernelCase:
    """One kernel to time. ``shape``: gemm (m, n, k); attention (heads, d, q, L); memory (bytes,);
    layer (micro-batch, sequence). ``work`` is the FLOPs of a gemm or attention call, the bytes
    of a copy, 0 for a layer; ``predicted`` the seconds meshplan's model gives it."""

    name: str
    kind: str
    shape: tuple[float, ...]
    work: float
    predicted: float
    stack: str = ""


@dataclass(frozen=True)
class KernelRow:
    """A case with its measured seconds and, for gemm, attention and memory rows, the implied
    value of its calibration constant (None for a memory-bound GEMM or a time at or under
    t_kernel)."""

    case: KernelCase
    measured: float
    constant: str = ""
    implied: float | None = None
    meshplan_constant: float | None = None

    @property
    def ratio(self) -> float:
        """Measured / predicted (above 1: the kernel ran slower than meshplan predicts)."""
        return self.measured / self.case.predicted


@dataclass
class KernelReport:
    """The rows of one run, the pooled implied constants and where they were measured."""

    rows: list[KernelRow]
    pooled: dict[str, tuple[float | None, float]]  # constant -> (implied, meshplan's)
    setup: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "setup": self.setup,
            "rows": [{**asdict(r.case), "measured": r.measured, "ratio": r.ratio, "constant": r.constant,
                      "implied": r.implied, "meshplan_constant": r.meshplan_constant} for r in self.rows],
            "pooled": {k: {"implied": v[0], "meshplan": v[1]} for k, v in self.pooled.items()},
        }


def check_model(model: ModelSpec, tp: int, precision: str, cp: int, attention: str) -> None:
    """Refuse, with one line naming the field, what these cases do not time: MoE or MLA layers,
    precisions other than bf16, fp16 and fp8, context parallelism's ring, materialized attention, and a TP
    degree that does not divide the heads and the MLP."""
    if model.is_moe or model.is_mla:
        raise InputError("model", f"verify kernels times dense attention + MLP layers; {model.name} is "
                                  f"{'a mixture of experts' if model.is_moe else 'multi-head latent attention'}")
    if precision not in DTYPES:
        raise InputError("precision", f"verify kernels times bf16, fp16 and fp8 (torch._scaled_mm) GEMMs: one of "
                                      f"{', '.join(DTYPES)} (got {precision!r})")
    if cp != 1:
        raise InputError("cp", f"verify kernels times one GPU's kernels without the ring of context parallelism: --cp 1 (got {cp})")
    if attention != "flash":
        raise InputError("attention", f"verify kernels times FlashAttention (SDPA): --attention flash (got {attention!r})")
    for what, n in (("heads", model.n_heads), ("ffn_hidden", model.ffn_hidden)):
        if n % tp:
            raise InputError("tp", f"must divide the model's {what} ({n}) for one rank's shapes (got {tp})")


def check_layer_stacks(model: ModelSpec, stacks: tuple[str, ...], precision: str = "bf16") -> None:
    """Refuse layer rows of an unknown stack, under FP8 (the block's linears would need torchao's
    Float8Linear), or of a model whose layer is not torchtitan's Llama block
    (:func:`llama_shaped`), with one line naming ``layer-stacks``."""
    bad = [x for x in stacks if x not in LAYER_STACKS]
    if bad:
        raise InputError("layer-stacks", f"must be 'none' or a comma-separated list of {', '.join(LAYER_STACKS)} (got {', '.join(bad)})")
    if stacks and precision == "fp8":
        raise InputError("layer-stacks", "FP8 layer rows would need torchao's Float8Linear, which meshplan does not bring: "
                                         "give --layer-stacks none (the FP8 GEMMs are timed)")
    differs = llama_shaped(model)
    if stacks and differs:
        raise InputError("layer-stacks", f"the layer rows time torchtitan's Llama block; {model.name} differs ({differs}): "
                                         f"give --layer-stacks none")


def peaks(gpu: GPUSpec, precision: str) -> tuple[float, float]:
    """(GEMM peak, attention peak): the dense peak of ``precision``, and for attention the 16-bit
    one under FP8 (attention stays in bf16, as in :func:`~meshplan.cost.compute.layer_op_times`)."""
    return gpu.peak(precision), gpu.peak("bf16" if precision == "fp8" else precision)


def llama_shaped(model: ModelSpec) -> str:
    """Why ``model``'s layer is not the block the layer rows time (torchtitan's Llama block:
    RMSNorm before attention and MLP, RoPE, SwiGLU, no biases, no dropout, no QK-norm, sequential
    residual), or "" when it is."""
    differences = [what for what, differs in (
        (f"{model.mlp} MLP", model.mlp != "swiglu"), (model.norm, model.norm != "rmsnorm"),
        (f"{model.position} positions", model.position != "rope"), ("biases", model.qkv_bias or model.linear_bias),
        ("dropout", model.dropout), ("four norms a layer", model.norms_per_layer != 2), ("QK-norm", model.qk_norm),
        ("parallel residual", model.parallel_residual)) if differs]
    return ", ".join(differences)


def kernel_cases(model: ModelSpec, gpu: GPUSpec, micro_batch: int, seq_len: int, tp: int = 1,
                 precision: str = "bf16", stacks: tuple[str, ...] = ("eager",),
                 cal: Calibration | None = None, kernels: str = "fused") -> list[KernelCase]:
    """The cases of one layer on one GPU of ``gpu`` for n = ``micro_batch``·``seq_len`` tokens on
    one TP rank of ``tp`` (module docstring), each with meshplan's predicted seconds: the GEMMs as
    the ``kernels`` stack launches them (:func:`~meshplan.cost.compute.projection_gemms`: fused QKV
    and gate|up, or torch's separate projections), and a layer row (forward, backward) per stack in
    ``stacks``."""
    cal = cal or calibration_for(gpu)
    cal_g = gemm_calibration(cal, precision)
    e = DTYPES[precision][0]
    peak, peak16 = peaks(gpu, precision)
    n = micro_batch * seq_len
    cases: list[KernelCase] = []
    for name, mnk in projection_gemms(model, n, tp, kernels):
        for direction, order in GEMM_DIRECTIONS:
            m, nn, k = (mnk[i] for i in order)
            cases.append(KernelCase(f"gemm {name} {direction}", "gemm", (m, nn, k), 2.0 * m * nn * k,
                                    float(gemm_time(m, nn, k, gpu, cal_g, peak, gemm_operand_bytes(precision, e), e))))
    heads, d = micro_batch * (model.n_heads // tp), model.head_dim
    fwd, bwd = flash_attention_times(heads, d, seq_len, seq_len, seq_len, peak16, cal)
    flops = causal_attention_flops(heads, d, seq_len, seq_len)
    cases.append(KernelCase("attention fwd", "attention", (heads, d, seq_len, seq_len), flops, fwd))
    cases.append(KernelCase("attention bwd", "attention", (heads, d, seq_len, seq_len), 2.5 * flops, bwd))
    nbytes = 2.0 * n * (model.ffn_hidden // tp) * e  # read + write
    cases.append(KernelCase("memory copy", "memory", (nbytes,), nbytes, memory_time(nbytes, gpu, cal)))
    for stack in stacks:
        ops = layer_op_times(model, micro_batch, seq_len, tp, 1, False, "flash", "causal", gpu, cal, precision, e, kernels=stack)
        cases.append(KernelCase("layer fwd", "layer", (micro_batch, seq_len), 0.0, ops.fwd, stack))
        cases.append(KernelCase("layer bwd", "layer", (micro_batch, seq_len), 0.0, ops.bwd, stack))
    return cases


def implied_constant(case: KernelCase, measured: float, gpu: GPUSpec, cal: Calibration,
                     precision: str) -> tuple[str, float | None, float | None]:
    """(constant's name, its implied value, meshplan's value) for a gemm, attention or memory case
    (module docstring); ("", None, None) for a layer."""
    busy = measured - cal.kernel_overhead
    peak, peak16 = peaks(gpu, precision)
    if case.kind == "gemm":
        m, n, k = case.shape
        e = DTYPES[precision][0]
        cal_g = gemm_calibration(cal, precision)
        t_flop, t_mem = gemm_bounds(m, n, k, gpu, cal_g, peak, gemm_operand_bytes(precision, e), e)
        shape_factor = gemm_efficiency(m, n, k, gpu, cal_g) / cal_g.gemm_efficiency
        value = case.work / (peak * shape_factor * busy) if busy > 0 and t_flop >= t_mem else None
        name = "gemm_fp8_efficiency" if precision == "fp8" else "gemm_efficiency"
        return name, value, cal_g.gemm_efficiency
    if case.kind == "attention":
        bwd = case.name.endswith("bwd")
        eta_inf = cal.attention_bwd_efficiency if bwd else cal.attention_fwd_efficiency
        l0 = cal.attention_bwd_l0 if bwd else cal.attention_fwd_l0
        length_factor = flash_attention_efficiency(case.shape[3], 1.0, l0)
        value = case.work / (peak16 * length_factor * busy) if busy > 0 else None
        return f"attention_{'bwd' if bwd else 'fwd'}_efficiency", value, eta_inf
    if case.kind == "memory":
        value = case.work / (gpu.hbm_bandwidth * busy) if busy > 0 else None
        return "hbm_efficiency", value, cal.hbm_efficiency
    return "", None, None


def pooled_constants(rows: list[KernelRow], cal: Calibration) -> dict[str, tuple[float | None, float]]:
    """Per constant, the value that reproduces its rows' total time, beside meshplan's:
    Σ_i w_i / Σ_i (t_i − t_kernel), with w_i a row's work over its fixed factors (for a GEMM
    2·m·n·k / (P·q·k/(k + k½)), so that w_i / (t_i − t_kernel) is the row's implied value)."""
    sums: dict[str, list[float]] = {}
    for r in rows:
        if r.implied is None:
            continue
        busy = r.measured - cal.kernel_overhead
        acc = sums.setdefault(r.constant, [0.0, 0.0, r.meshplan_constant])
        acc[0] += r.implied * busy  # the row's work in the constant's units (work / busy = implied)
        acc[1] += busy
    return {k: (v[0] / v[1] if v[1] > 0 else None, v[2]) for k, v in sums.items()}


#: Seconds each kernel runs back to back before it is timed on a GPU, unless ``--settle`` says
#: otherwise: a large GEMM alone reaches the clock the power cap sustains within about half a
#: second (an H200 at 700 W: 1980 → ~1450 MHz), and a burst timed before that reads 13-17 %
#: faster than the kernel sustains (docs/gpu_measurements.md).
GPU_SETTLE_S = 1.0


def median_seconds(fn: Callable[[], Any], device: str, warmup: int = 2, reps: int = 5, settle: float = 0.0) -> float:
    """Median seconds of ``reps`` calls of ``fn`` after ``warmup`` untimed ones, and before those
    after calling ``fn`` back to back for ``settle`` seconds of wall time (so that a GPU's clock
    has come down to what its power cap sustains): CUDA events on a GPU (the device synchronized
    around each call), ``time.perf_counter`` on the CPU."""
    import torch

    if warmup < 0 or reps < 1:
        raise InputError("reps", f"needs warmup >= 0 and reps >= 1 (got {warmup}, {reps})")
    if settle < 0:
        raise InputError("settle", f"must be at least 0 seconds (got {settle})")
    if settle > 0:
        start = time.perf_counter()
        while time.perf_counter() - start < settle:
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_operands(case: KernelCase, dev, dtype, fp8: bool = False):
    """The operands A (m × k) and B (k × n) of a gemm case, random normal values.

    16-bit: in the layouts a linear layer y = x·Wᵀ (W stored out × in, as ``nn.Linear`` keeps it)
    hands cuBLAS: forward x · Wᵀ (B a transposed view of W); input gradient dY · W (both
    row-major); weight gradient Xᵀ · dY = dWᵀ (A a transposed view of X).
    FP8 (``fp8``): ``torch._scaled_mm`` takes A row-major and B column-major only, so every
    direction has those layouts (torchao makes the column-major copies it needs beforehand), in the
    dtypes of :data:`FP8_OPERANDS`."""
    import torch

    m, n, k = (int(x) for x in case.shape)
    direction = case.name.rsplit(" ", 1)[1]
    if fp8:
        ta, tb = (getattr(torch, t) for t in FP8_OPERANDS[direction])
        return (torch.randn(m, k, device=dev, dtype=dtype).to(ta),
                torch.randn(n, k, device=dev, dtype=dtype).to(tb).t())
    if direction == "fwd":
        return torch.randn(m, k, device=dev, dtype=dtype), torch.randn(n, k, device=dev, dtype=dtype).t()
    if direction == "dgrad":
        return torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)
    return torch.randn(k, m, device=dev, dtype=dtype).t(), torch.randn(k, n, device=dev, dtype=dtype)


def _measure_gemm(case: KernelCase, dev, dtype, timer, fp8: bool = False) -> float:
    """``torch.mm`` of the case's operands, or ``torch._scaled_mm`` with unit tensorwise scales and
    a bf16 output for FP8."""
    import torch

    a, b = gemm_operands(case, dev, dtype, fp8)
    if not fp8:
        return timer(lambda: torch.mm(a, b))
    one = torch.ones((), device=dev, dtype=torch.float32)
    return timer(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


def _measure_attention(fwd: KernelCase, dev, dtype, timer) -> tuple[float, float]:
    """SDPA forward and backward (the latter as forward + backward less forward), causal, with as
    many K/V heads as query heads (torchtitan's ``repeat_kv`` runs before SDPA)."""
    import torch
    import torch.nn.functional as F

    heads, d, q_len, _ = (int(x) for x in fwd.shape)
    q, k, v = (torch.randn(1, heads, q_len, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, heads, q_len, d, device=dev, dtype=dtype)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), grad)

    with _flash_backend(dev):
        t_f = timer(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        t_fb = timer(step)
    return t_f, max(t_fb - t_f, 0.0)


def _flash_backend(dev):
    """SDPA restricted to FlashAttention on a GPU (what meshplan's attention model describes);
    torch's default choice on the CPU."""
    import contextlib

    if dev.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def _measure_copy(case: KernelCase, dev, dtype, timer) -> float:
    import torch

    elems = int(case.work / 2 / torch.empty((), dtype=dtype).element_size())
    src = torch.randn(elems, device=dev, dtype=dtype)
    dst = torch.empty_like(src)
    return timer(lambda: dst.copy_(src))


def _measure_layer(model: ModelSpec, tp: int, fwd: KernelCase, dev, dtype, timer) -> tuple[float, float]:
    """torchtitan's Llama block on one TP rank's widths (no collectives), eager or compiled:
    forward, and backward as forward + backward less forward."""
    import torch

    from meshplan.verify.llama_block import Block, precompute_freqs_cis

    b, s = (int(x) for x in fwd.shape)
    torch.manual_seed(0)
    block = Block(model.hidden, model.n_heads // tp, kv_heads_per_rank(model, tp), model.ffn_hidden // tp,
                  model.head_dim).to(device=dev, dtype=dtype)
    freqs = precompute_freqs_cis(model.head_dim, s).to(dev)
    fn = torch.compile(block, fullgraph=True) if fwd.stack == "compiled" else block
    x = torch.randn(b, s, model.hidden, device=dev, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    params = tuple(block.parameters())

    def step():
        torch.autograd.grad(fn(x, freqs), (x, *params), grad)

    with _flash_backend(dev):
        t_f = timer(lambda: fn(x, freqs))
        t_fb = timer(step)
    return t_f, max(t_fb - t_f, 0.0)


def measure(model: ModelSpec, gpu: GPUSpec, cases: list[KernelCase], tp: int = 1, precision: str = "bf16",
            device: str = "cpu", warmup: int = 2, reps: int = 5, progress: Callable[[str], None] | None = None,
            settle: float | None = None) -> KernelReport:
    """Time every case on ``device`` (module docstring) and set it beside its prediction, each
    after ``settle`` seconds back to back (default :data:`GPU_SETTLE_S` on a GPU, 0 on the CPU)."""
    import torch

    from meshplan.verify.device import here

    if warmup < 1 and any(c.stack == "compiled" for c in cases):
        raise InputError("warmup", "must be at least 1 with a compiled layer: its first call compiles (got 0)")
    cal = calibration_for(gpu)
    dev = here(device)
    dtype = getattr(torch, DTYPES[precision][1])

    settle = (GPU_SETTLE_S if device == "cuda" else 0.0) if settle is None else settle

    def timer(fn):
        return median_seconds(fn, device, warmup, reps, settle)

    measured: dict[int, float] = {}
    for i, case in enumerate(cases):
        if i in measured:
            continue
        if progress:
            progress(case.name + (f" ({case.stack})" if case.stack else ""))
        if case.kind == "gemm":
            measured[i] = _measure_gemm(case, dev, dtype, timer, precision == "fp8")
        elif case.kind == "memory":
            measured[i] = _measure_copy(case, dev, dtype, timer)
        else:  # attention or layer: the forward case, then its backward right after it
            pair = _measure_attention(case, dev, dtype, timer) if case.kind == "attention" else _measure_layer(model, tp, case, dev, dtype, timer)
            measured[i], measured[i + 1] = pair
    rows = []
    for i, case in enumerate(cases):
        constant, value, mine = implied_constant(case, measured[i], gpu, cal, precision)
        rows.append(KernelRow(case, measured[i], constant, value, mine))
    setup = {
        "gpu": gpu.name,
        "calibration": cal.generation,
        "precision": precision,
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "timing": f"median of {reps} after {warmup} warm-up calls and {settle:g} s back to back "
                  f"({'CUDA events' if device == 'cuda' else 'perf_counter'})",
        "settle_s": settle,
    }
    return KernelReport(rows, pooled_constants(rows, cal), setup)
