"""Seconds of one GPU kernel: a GEMM, or a memory-bound kernel.

GEMMs take

    t = max(2·M·N·K / (F·η(M, N, K)),  (M·K + K·N + M·N)·e / (W·η_hbm)) + t_kernel

for an (M × K)·(K × N) GEMM (capitals: m is the micro-batch count, n a micro-batch's tokens, k a
stage elsewhere), with F the dense peak for the compute dtype, W the HBM bandwidth and the shape-dependent
efficiency η = η_max · q(M, N) · K/(K + K½):

* η_max — what a large GEMM reaches (calibration, per GPU generation);
* q(M, N) — tile and wave quantization (NVIDIA, "Matrix Multiplication Background User's Guide",
  Sec. 2.2–2.3): the output is cut into tiles of T_m × T_n run in waves over the SMs, so
  q = M·N / (⌈tiles / SMs⌉ · SMs · T_m · T_n); the library picks the best of the tile shapes below,
  smaller tiles paying a reuse penalty;
* K/(K + K½) — short reductions do not fill the pipeline of a tile (K½ from the calibration).

A memory-bound kernel moving B bytes takes B / (W·η_hbm) + t_kernel.
"""

from __future__ import annotations

import math

import numpy as np

from meshplan.cost.calibration import Calibration
from meshplan.specs.hardware import GPUSpec

#: (T_m, T_n, relative efficiency): CUTLASS/cuBLAS tile shapes; smaller tiles reuse less data.
GEMM_TILES: tuple[tuple[int, int, float], ...] = (
    (128, 256, 1.00),
    (256, 128, 1.00),
    (128, 128, 0.95),
    (64, 128, 0.85),
)


def _ceil_max(*xs):
    """``ceil`` and ``maximum`` for the inputs: math's on Python numbers (no numpy call per scalar,
    the same IEEE results), numpy's otherwise."""
    if all(type(x) in (int, float) for x in xs):
        return (lambda x: float(math.ceil(x))), max
    return np.ceil, np.maximum


def gemm_efficiency(M, N, K, gpu: GPUSpec, cal: Calibration):
    """η(M, N, K) of the module docstring; works on scalars and numpy arrays alike."""
    ceil, maximum = _ceil_max(M, N, K)
    sms = gpu.sm_count
    best = 0.0
    for tm, tn, rel in GEMM_TILES:
        tiles = ceil(M / tm) * ceil(N / tn)
        waves = ceil(tiles / sms)
        q = M * N / (waves * sms * tm * tn)
        best = maximum(best, rel * q)
    return cal.gemm_efficiency * best * (K / (K + cal.gemm_k_half))


def gemm_bounds(M, N, K, gpu: GPUSpec, cal: Calibration, peak: float, elem_bytes: int = 2, out_bytes: int | None = None):
    """The two bounds of an (M × K)·(K × N) GEMM, seconds: compute 2·M·N·K / (F·η(M, N, K)) and
    memory ((M·K + K·N)·e + M·N·e_out) / (W·η_hbm) (module docstring), e the operands' bytes per
    element and e_out the output's (e unless given: an FP8 GEMM reads 1-byte operands and writes
    a 16-bit output); scalars or numpy arrays."""
    e_out = elem_bytes if out_bytes is None else out_bytes
    t_flop = 2.0 * (M * N * K) / (peak * gemm_efficiency(M, N, K, gpu, cal))
    t_mem = ((M * K + K * N) * elem_bytes + M * N * e_out) / (gpu.hbm_bandwidth * cal.hbm_efficiency)
    return t_flop, t_mem


def gemm_time(M, N, K, gpu: GPUSpec, cal: Calibration, peak: float, elem_bytes: int = 2, out_bytes: int | None = None):
    """Seconds for an (M × K)·(K × N) GEMM: the larger of :func:`gemm_bounds` plus t_kernel;
    scalars or numpy arrays."""
    _, maximum = _ceil_max(M, N, K)
    return maximum(*gemm_bounds(M, N, K, gpu, cal, peak, elem_bytes, out_bytes)) + cal.kernel_overhead


def gemm_operand_bytes(compute_dtype: str, act_bytes: int) -> int:
    """Bytes per operand element a layer GEMM reads: 1 under FP8 (Transformer Engine's and
    torchao's GEMMs take FP8 operands, cast beforehand by passes counted apart), else the
    activations' ``act_bytes``; the output stays ``act_bytes``."""
    return 1 if compute_dtype == "fp8" else act_bytes


def memory_time(nbytes: float, gpu: GPUSpec, cal: Calibration) -> float:
    """Seconds for a memory-bound kernel moving ``nbytes``."""
    return nbytes / (gpu.hbm_bandwidth * cal.hbm_efficiency) + cal.kernel_overhead
