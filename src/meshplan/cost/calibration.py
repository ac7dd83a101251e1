"""Efficiency constants, per GPU generation and software stack, each with its rationale.

These are the only tunable numbers in meshplan. They are set once per hardware generation from
public measurements (named below), never per run, and ``estimate`` and ``validate`` read the same
table. Every other figure is derived from specs and formulas.

=======================  ==========================================================================
constant                 meaning
=======================  ==========================================================================
gemm_efficiency          fraction of dense peak a large, well-shaped GEMM sustains (cuBLAS/hipBLASLt)
gemm_fp8_efficiency      the same for an FP8 GEMM, of the FP8 peak (:func:`gemm_calibration`)
gemm_k_half              reduction depth at which a GEMM reaches half its large-k efficiency
attention_fwd_efficiency fraction of peak FlashAttention's forward reaches on long sequences
attention_bwd_efficiency the same for its backward (which does 2.5x the forward's matmul work)
attention_fwd_l0         keys per kernel call at which the forward reaches half its long-sequence
                         efficiency: η(L) = η∞·L/(L + L₀) (attention.flash_attention_efficiency)
attention_bwd_l0         the same for the backward
attention_cudnn          the four attention constants for cuDNN's fused attention, the kernel
                         Transformer Engine runs on Hopper (``attention_kernel``): (η_fwd∞, L₀_fwd,
                         η_bwd∞, L₀_bwd); None where it is not measured
hbm_efficiency           fraction of HBM bandwidth memory-bound kernels reach
kernel_overhead          fixed launch + tail cost per kernel, seconds
scale_up_efficiency      achieved bus bandwidth / line rate inside a scale-up domain (NCCL ring)
scale_out_efficiency     achieved bus bandwidth / line rate across the fabric, per NIC
scale_up_latency         per-step latency of a collective inside a node (s)
scale_out_latency        per-step latency across the fabric (s)
collective_base_latency  fixed cost of one collective call, whatever its size and group (s)
runtime_reserve          HBM taken by the CUDA/ROCm context, library workspaces and NCCL buffers
=======================  ==========================================================================

Beside the table, :func:`power_capped` derives a power-limited GPU's sustained peaks from its
catalog entry (sustained clock ∝ (P − P_static)^(1/3): :data:`POWER_CAP_EXPONENT`,
:data:`STATIC_POWER_FRACTION`), and
:mod:`meshplan.cost.contention` holds the SMs an overlapped collective takes from compute (NCCL's
and Transformer Engine's defaults over the catalog's SM count: library settings, not per
generation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional

from meshplan.cost.variability import straggler_factor
from meshplan.units import GiB, US


@dataclass(frozen=True)
class Calibration:
    generation: str
    gemm_efficiency: float
    gemm_fp8_efficiency: float
    gemm_k_half: float
    attention_fwd_efficiency: float
    attention_bwd_efficiency: float
    attention_fwd_l0: float
    attention_bwd_l0: float
    hbm_efficiency: float
    kernel_overhead: float
    scale_up_efficiency: float
    scale_out_efficiency: float
    scale_up_latency: float
    scale_out_latency: float
    collective_base_latency: float
    runtime_reserve: float
    rationale: str
    attention_cudnn: Optional[tuple[float, float, float, float]] = None



HOPPER = Calibration(
    generation="hopper",
    # cuBLAS BF16 on H100 SXM at 700 W sustains ~650-750 TFLOP/s on large training GEMMs
    # (Transformer Engine and cuBLAS benchmarks; clocks drop under sustained tensor-core load):
    # 0.70 of 989. Tile/wave quantization and short-k losses are modelled on top (compute.py).
    # Checked against the Megatron-LM H100 table and Llama 3 (docs/accuracy.md), not fitted per run.
    # Measured (docs/gpu_measurements.md, one H200 at its 700 W cap, 2026-11-28): the 8B gate GEMM
    # 16384 x 14336 x 4096 back to back settles at 663-671 TFLOP/s (1425-1500 MHz), implied 0.695-0.704.
    gemm_efficiency=0.70,
    # FP8 (torch._scaled_mm, E4M3, the same GEMM back to back): 1180 TFLOP/s of 1979 at 1350 MHz,
    # implied 0.62: twice the math per clock draws more power, so the cap holds the clock lower,
    # and a burst reaches less of its peak too (0.71 against bf16's 0.77).
    gemm_fp8_efficiency=0.62,
    gemm_k_half=96.0,
    # FlashAttention-2, the kernel of the 2023-24 stacks behind the published H100 runs (torch
    # SDPA, Megatron/TE): ~335-370 TFLOP/s forward at head dim 128 on long causal sequences,
    # ~0.36 of peak, backward ~0.30 (Shah et al. 2024, FlashAttention-3, Fig. 5-7, FA2 curves).
    # FlashAttention-3 reaches ~0.6 forward / ~0.45 backward: a newer stack, not the default.
    attention_fwd_efficiency=0.36,
    attention_bwd_efficiency=0.30,
    # Half-efficiency lengths, from the same FA2 curves at head dim 128 (Shah et al. 2024, H100
    # benchmark figures: forward, causal: 191, 260, 298, 319, 333, 335 TFLOP/s at sequence length
    # 512, 1k, 2k, 4k, 8k, 16k; backward: 214, 260, 291, 310, 318, 322). A least-squares fit of 1/T = (1 + L₀/L)/T∞ gives
    # forward T∞ = 353 TFLOP/s (0.357 of peak: the 0.36 above is this asymptote) and L₀ = 420
    # keys, backward T∞ = 329 and L₀ = 275 keys; the curves are reproduced within 4 % and 1 %.
    attention_fwd_l0=420.0,
    attention_bwd_l0=275.0,
    # cuDNN's fused attention, the kernel Transformer Engine picks on Hopper ("Disabling
    # FlashAttention to give FusedAttention preference on Hopper+ for performance reasons",
    # get_attention_backend; cuDNN attention since TE 1.2, 2024-01). Measured on one H200
    # (docs/gpu_measurements.md, 2026-11-28: cuDNN 9.19 through torch's SDPA, causal, head dim
    # 128, 1K-128K keys, full clock as the FA2 curve above): forward 465-653 TFLOP/s, backward
    # 322-542; the same least-squares fit of 1/T = (1 + L₀/L)/T∞ gives forward T∞ = 619 TFLOP/s
    # (0.626 of peak), L₀ = 332 keys, backward T∞ = 544 (0.550), L₀ = 662, within 12 % and 6 % of
    # every point: 1.6-1.9x FlashAttention-2 on the same shapes.
    attention_cudnn=(0.626, 332.0, 0.550, 662.0),
    # STREAM-like copies reach ~90% of the 3.35 TB/s on H100; fused norms/elementwise ~0.8.
    hbm_efficiency=0.80,
    kernel_overhead=4 * US,
    # nccl-tests: 8xH100 NVSwitch ring busbw ~370 GB/s of 450 line rate (0.82); per 400G NIC
    # 46-48 GB/s of 50 (0.93-0.96) -- NCCL maintainers in nccl-tests #212, #290.
    scale_up_efficiency=0.82,
    scale_out_efficiency=0.92,
    # NCCL's own cost model (src/graph/tuning.cc, 2.19-2.27, the Simple protocol that moves the
    # large buffers of training): a ring step costs 3.4 us over NVLink (hwLat) and 14 us across
    # the network, and every call a base of 8.4 us (baseLat). Small buffers take NCCL's LL/LL128
    # protocols (0.6-4 us a step), not modelled: meshplan prices every collective as Simple.
    scale_up_latency=3.4 * US,
    scale_out_latency=14 * US,
    collective_base_latency=8.4 * US,
    runtime_reserve=2 * GiB,
    rationale="H100/H800/H200 with CUDA 12, cuBLAS, FlashAttention 2/3, NCCL 2.18+",
)

# The other generations are Hopper's table with their own figures replaced (``replace``): what
# they do not set is Hopper's, for the reason given at each.

# A100 runs the same CUDA/NCCL stack over the same kind of fabric: Hopper's HBM efficiency,
# scale-out efficiency, NCCL per-step and per-call latencies and runtime reserve, and Hopper's FlashAttention
# half-efficiency lengths (the same FA2 kernel structure: 128-query blocks, the same per-block
# prologue and epilogue; not separately fitted).
AMPERE = replace(
    HOPPER,
    generation="ampere",
    attention_cudnn=None,  # not measured: attention_kernel cudnn is refused, auto takes the flash rates
    # cuBLAS FP16/BF16 on A100 sustains ~250-270 TFLOP/s of 312 on large training GEMMs (~0.82;
    # peak-shape microbenchmarks reach ~0.88, real layers with bias epilogues and clocks under
    # load less). Checked against Narayanan 2021 and Korthikanti 2022 (docs/accuracy.md).
    gemm_efficiency=0.82,
    gemm_fp8_efficiency=0.82,  # no FP8 tensor cores: never used (the catalog gives A100 no FP8 peak)
    gemm_k_half=64.0,
    # FlashAttention-2 (Dao 2023, Fig. 4): forward up to ~73% of peak on A100, backward ~60%.
    attention_fwd_efficiency=0.65,
    attention_bwd_efficiency=0.50,
    kernel_overhead=5 * US,
    # nccl-tests 8xA100: all-reduce busbw 200-232 GB/s of 300 line rate (~0.75). HDR 200G NIC
    # ~24 GB/s of 25 per NIC (DGX A100 multi-node 192 GB/s per node of 8 NICs, 0.96): Hopper's
    # 0.92 scale-out efficiency is kept.
    scale_up_efficiency=0.75,
    rationale="A100 with CUDA 11/12, cuBLAS, FlashAttention 2, NCCL 2.x",
)

# B200: early cuBLAS measurements only; everything but the GEMM and attention efficiencies is
# assumed like Hopper (attention half-efficiency lengths from FlashAttention's block structure:
# no public B200 curve).
BLACKWELL = replace(
    HOPPER,
    generation="blackwell",
    attention_cudnn=None,  # not measured: attention_kernel cudnn is refused, auto takes the flash rates
    # Early B200 cuBLAS measurements reach ~0.7 of dense BF16 peak; assumed like Hopper.
    gemm_efficiency=0.72,
    gemm_fp8_efficiency=0.72,  # no sustained FP8 measurement: taken as the 16-bit figure
    gemm_k_half=128.0,
    attention_fwd_efficiency=0.60,
    attention_bwd_efficiency=0.45,
    rationale="B200 with CUDA 12.8+, cuBLAS, FlashAttention/cuDNN, NCCL 2.25+ (few public runs yet)",
)

# MI300X: its own figures but for the runtime reserve and the attention half-efficiency lengths
# (Hopper's: CK FlashAttention has the same block structure).
CDNA3 = replace(
    HOPPER,
    generation="cdna3",
    attention_cudnn=None,  # not measured: attention_kernel cudnn is refused, auto takes the flash rates
    # hipBLASLt on MI300X: ~0.55-0.65 of the 1307 TFLOP/s dense BF16 peak on large GEMMs
    # (public MI300X GEMM benchmarks, e.g. SemiAnalysis 2024).
    gemm_efficiency=0.60,
    gemm_fp8_efficiency=0.60,  # no sustained FP8 measurement: taken as the 16-bit figure
    gemm_k_half=128.0,
    attention_fwd_efficiency=0.40,
    attention_bwd_efficiency=0.30,
    hbm_efficiency=0.75,
    kernel_overhead=6 * US,
    scale_up_efficiency=0.70,
    scale_out_efficiency=0.90,
    # RCCL's tuning model (tuning_model_0): a ring step over xGMI 3.6 us, a base of 17 us a
    # call (Simple); across the network NCCL's 14 us is kept (no RCCL figure taken).
    scale_up_latency=3.6 * US,
    collective_base_latency=17 * US,
    rationale="MI300X with ROCm 6, hipBLASLt, CK FlashAttention, RCCL",
)


@lru_cache(maxsize=None)
def gemm_calibration(cal: Calibration, compute_dtype: str) -> Calibration:
    """The calibration a GEMM in ``compute_dtype`` runs under: ``cal`` with η_max =
    ``gemm_fp8_efficiency`` for FP8, ``cal`` itself otherwise. Every GEMM of a layer in FP8 (not the
    16-bit LM head, not attention) is timed with it at the FP8 peak."""
    if compute_dtype != "fp8" or cal.gemm_fp8_efficiency == cal.gemm_efficiency:
        return cal
    return replace(cal, gemm_efficiency=cal.gemm_fp8_efficiency)


CALIBRATIONS: dict[str, Calibration] = {
    c.generation: c for c in (AMPERE, HOPPER, BLACKWELL, CDNA3)
}


#: Exponent of the sustained tensor-core clock in the board's dynamic power: f ∝ P_dyn^(1/3).
#: Dynamic power is C·V²·f and, in the DVFS range where power-limited GEMMs run, the voltage rises
#: about linearly with the clock, so P_dyn ∝ f³ (Mudge 2001, "Power: a first-class architectural
#: design constraint", IEEE Computer 34(4), Eq. 1-2).
POWER_CAP_EXPONENT = 1.0 / 3.0

#: The share of the board power that does not scale with the SM clock (leakage, HBM, I/O), as a
#: fraction of the TDP: an idle H200 SXM in P0 with a CUDA context draws 126.3 W of its 700 W
#: (NVML and nvidia-smi, 46.6 W of it the HBM's; docs/gpu_measurements.md, 2026-11-28). The cube
#: law applies to the rest only. Idle power is a lower bound of the static power under load
#: (leakage rises with temperature), so the term errs on the small side.
STATIC_POWER_FRACTION = 126.3 / 700.0


def power_cap_clock_ratio(watts: float, tdp_watts: float) -> float:
    """Sustained clock at a board power cap ``watts`` over the clock at the TDP:
    ((P − P_s)/(TDP − P_s))^(1/3), P_s = :data:`STATIC_POWER_FRACTION`·TDP, the static power
    that the clock does not move (:data:`POWER_CAP_EXPONENT`). Grand Teton's 500 W H100:
    (373.7/573.7)^(1/3) = 0.867. NVIDIA rates its own 400 W H100 NVL at 835 TFLOP/s dense BF16,
    0.844 of the SXM's 989.4; this law gives 0.781 (773 TFLOP/s, −7.4 %) and the law without the
    static term 0.830 (−1.7 %). A rating is a clock chosen for the data sheet, not one sustained
    under load: the 700 W part is rated at 1830 MHz and sustains 1455 MHz on a large GEMM
    (docs/gpu_measurements.md)."""
    static = STATIC_POWER_FRACTION * tdp_watts
    return ((watts - static) / (tdp_watts - static)) ** POWER_CAP_EXPONENT


def power_capped(gpu, watts: float, *, name: str | None = None, hbm_bandwidth: float | None = None, hbm_bytes: float | None = None):
    """``gpu`` run under a board power cap of ``watts`` (below its TDP): every dense peak scaled by
    the sustained-clock ratio of :func:`power_cap_clock_ratio`; HBM bandwidth is on its own clock
    and unchanged unless given (a different memory part). Used for Meta's Grand Teton H100
    (500 W, 96 GB HBM2e) behind the torchtitan benchmarks."""
    from meshplan.errors import InputError

    if not STATIC_POWER_FRACTION * gpu.tdp_watts < watts <= gpu.tdp_watts:
        raise InputError("gpu.power_cap", f"must be in ({STATIC_POWER_FRACTION * gpu.tdp_watts:.0f}, {gpu.tdp_watts:g}] W: "
                                          f"above the static power of {gpu.name} and up to its TDP (got {watts!r})")
    ratio = power_cap_clock_ratio(watts, gpu.tdp_watts)
    peaks = {k: (v * ratio if v is not None else None) for k, v in gpu.peak_flops.model_dump().items()}
    update = {
        "name": name or f"{gpu.name}@{watts:g}W",
        "peak_flops": type(gpu.peak_flops)(**peaks),
        "tdp_watts": float(watts),
    }
    if hbm_bandwidth is not None:
        update["hbm_bandwidth"] = hbm_bandwidth
    if hbm_bytes is not None:
        update["hbm_bytes"] = hbm_bytes
    return gpu.model_copy(update=update)


def synchronized(cal: Calibration, n_gpus: int) -> Calibration:
    """``cal`` for a step synchronized over ``n_gpus`` GPUs: the compute efficiencies (GEMM,
    FP8 GEMM, attention) divided by the straggler factor f(N) = 1 + (σ/μ)·z(N)
    (:func:`meshplan.cost.variability.straggler_factor`), so that compute takes the slowest GPU's
    time; memory-bound kernels, launches and links keep their rates."""
    f = straggler_factor(n_gpus)
    if f == 1.0:
        return cal
    cudnn = cal.attention_cudnn
    return replace(
        cal, gemm_efficiency=cal.gemm_efficiency / f, gemm_fp8_efficiency=cal.gemm_fp8_efficiency / f,
        attention_fwd_efficiency=cal.attention_fwd_efficiency / f, attention_bwd_efficiency=cal.attention_bwd_efficiency / f,
        attention_cudnn=None if cudnn is None else (cudnn[0] / f, cudnn[1], cudnn[2] / f, cudnn[3]),
    )


def calibration_for(gpu) -> Calibration:
    """The calibration of ``gpu``'s generation (the same table ``estimate`` and ``validate`` use)."""
    try:
        return CALIBRATIONS[gpu.generation]
    except KeyError:
        from meshplan.errors import InputError

        raise InputError(
            "gpu.generation",
            f"no calibration for '{gpu.generation}' (known: {', '.join(sorted(CALIBRATIONS))})",
        ) from None
