"""Efficiency constants, per GPU generation and software stack, each with its rationale.

These are the only tunable numbers in meshplan. They are set once per hardware generation from
public measurements (named below), never per run, and ``estimate`` and ``validate`` read the same
table. Every other figure is derived from specs and formulas.

=======================  ==========================================================================
constant                 meaning
=======================  ==========================================================================
gemm_efficiency          fraction of dense peak a large, well-shaped GEMM reaches (cuBLAS/hipBLASLt)
gemm_k_half              reduction depth at which a GEMM reaches half its large-k efficiency
attention_fwd_efficiency fraction of peak FlashAttention's forward reaches on long sequences
attention_bwd_efficiency the same for its backward (which does 2.5x the forward's matmul work)
hbm_efficiency           fraction of HBM bandwidth memory-bound kernels reach
kernel_overhead          fixed launch + tail cost per kernel, seconds
scale_up_efficiency      achieved bus bandwidth / line rate inside a scale-up domain (NCCL ring)
scale_out_efficiency     achieved bus bandwidth / line rate across the fabric, per NIC
scale_up_latency         per-step latency of a collective inside a node (s)
scale_out_latency        per-step latency across the fabric (s)
runtime_reserve          HBM taken by the CUDA/ROCm context, library workspaces and NCCL buffers
=======================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.units import GiB, US


@dataclass(frozen=True)
class Calibration:
    generation: str
    gemm_efficiency: float
    gemm_k_half: float
    attention_fwd_efficiency: float
    attention_bwd_efficiency: float
    hbm_efficiency: float
    kernel_overhead: float
    scale_up_efficiency: float
    scale_out_efficiency: float
    scale_up_latency: float
    scale_out_latency: float
    runtime_reserve: float
    rationale: str



HOPPER = Calibration(
    generation="hopper",
    # cuBLAS BF16 on H100 SXM reaches 700-760 TFLOP/s on large square GEMMs (NVIDIA's
    # "Matrix Multiplication Background" guide, Transformer Engine benchmarks): ~0.75 of 989.
    gemm_efficiency=0.75,
    gemm_k_half=96.0,
    # FlashAttention-3 (Shah et al. 2024, Fig. 5-7): BF16 forward 600-740 TFLOP/s at head dim
    # 128 on long sequences (~0.65 of peak); FlashAttention-2 on H100 ~350-400 (~0.38).
    # Backward FA2/FA3 ~0.45 of peak.
    attention_fwd_efficiency=0.60,
    attention_bwd_efficiency=0.45,
    # STREAM-like copies reach ~90% of the 3.35 TB/s on H100; fused norms/elementwise ~0.8.
    hbm_efficiency=0.80,
    kernel_overhead=4 * US,
    # nccl-tests: 8xH100 NVSwitch ring busbw ~370 GB/s of 450 line rate (0.82); per 400G NIC
    # 46-48 GB/s of 50 (0.93-0.96) -- NCCL maintainers in nccl-tests #212, #290.
    scale_up_efficiency=0.82,
    scale_out_efficiency=0.92,
    # NCCL LL/Simple per-step latencies: ~1 us over NVLink, ~5 us over IB (seed 000 ex. 2 uses
    # the same figures).
    scale_up_latency=1 * US,
    scale_out_latency=5 * US,
    runtime_reserve=2 * GiB,
    rationale="H100/H800/H200 with CUDA 12, cuBLAS, FlashAttention 2/3, NCCL 2.18+",
)

AMPERE = Calibration(
    generation="ampere",
    # cuBLAS on A100 reaches 270-290 TFLOP/s of 312 on large FP16/BF16 GEMMs (~0.88).
    gemm_efficiency=0.88,
    gemm_k_half=64.0,
    # FlashAttention-2 (Dao 2023, Fig. 4): forward up to ~73% of peak on A100, backward ~60%.
    attention_fwd_efficiency=0.65,
    attention_bwd_efficiency=0.50,
    hbm_efficiency=0.80,
    kernel_overhead=5 * US,
    # nccl-tests 8xA100: all-reduce busbw 200-232 GB/s of 300 line rate (~0.75); HDR 200G NIC
    # ~24 GB/s of 25 per NIC (DGX A100 multi-node 192 GB/s per node of 8 NICs, 0.96).
    scale_up_efficiency=0.75,
    scale_out_efficiency=0.92,
    scale_up_latency=1 * US,
    scale_out_latency=5 * US,
    runtime_reserve=2 * GiB,
    rationale="A100 with CUDA 11/12, cuBLAS, FlashAttention 2, NCCL 2.x",
)

BLACKWELL = Calibration(
    generation="blackwell",
    # Early B200 cuBLAS measurements reach ~0.7 of dense BF16 peak; assumed like Hopper.
    gemm_efficiency=0.72,
    gemm_k_half=128.0,
    attention_fwd_efficiency=0.60,
    attention_bwd_efficiency=0.45,
    hbm_efficiency=0.80,
    kernel_overhead=4 * US,
    scale_up_efficiency=0.82,
    scale_out_efficiency=0.92,
    scale_up_latency=1 * US,
    scale_out_latency=5 * US,
    runtime_reserve=2 * GiB,
    rationale="B200 with CUDA 12.8+, cuBLAS, FlashAttention/cuDNN, NCCL 2.25+ (few public runs yet)",
)

CDNA3 = Calibration(
    generation="cdna3",
    # hipBLASLt on MI300X: ~0.55-0.65 of the 1307 TFLOP/s dense BF16 peak on large GEMMs
    # (public MI300X GEMM benchmarks, e.g. SemiAnalysis 2024).
    gemm_efficiency=0.60,
    gemm_k_half=128.0,
    attention_fwd_efficiency=0.40,
    attention_bwd_efficiency=0.30,
    hbm_efficiency=0.75,
    kernel_overhead=6 * US,
    scale_up_efficiency=0.70,
    scale_out_efficiency=0.90,
    scale_up_latency=2 * US,
    scale_out_latency=6 * US,
    runtime_reserve=2 * GiB,
    rationale="MI300X with ROCm 6, hipBLASLt, CK FlashAttention, RCCL",
)

CALIBRATIONS: dict[str, Calibration] = {
    c.generation: c for c in (AMPERE, HOPPER, BLACKWELL, CDNA3)
}


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
