"""``calc roofline``: is an operation compute- or memory-bound on a GPU?

Williams, Waterman & Patterson 2009 ("Roofline: an insightful visual performance model", CACM
52(4)): an operation doing ``F`` FLOPs while moving ``Q`` bytes to and from HBM has arithmetic
intensity ``I = F/Q``; on a GPU with peak ``P`` (FLOP/s, dense, for the dtype) and HBM bandwidth
``β`` it attains at most ``min(P, I·β)``. The ridge point ``I* = P/β`` separates memory-bound
(``I < I*``) from compute-bound operations; the time is at least ``max(F/P, Q/β)``.

* GEMM ``[M×K]·[K×N]``: ``F = 2·M·N·K``; ``Q = (M·K + K·N + M·N)·b`` reading both operands and
  writing the result once in a ``b``-byte dtype (``--no-output`` counts the reads only, as
  source 004 does).
* Element-wise over ``n`` elements: ``F = f·n``, ``Q = (r + w)·n·b`` for ``r`` tensors read and
  ``w`` written (ReLU: f = 1, r = w = 1).

Peaks and bandwidths come from the GPU catalog (``meshplan gpus``).
"""

from __future__ import annotations

from meshplan.calc.formats import get_format
from meshplan.calc.inputs import count, positive
from meshplan.calc.result import CalcResult, derive, num, secs
from meshplan.catalog import load_gpu
from meshplan.errors import InputError
from meshplan.units import GBPS, TFLOPS

ROOFLINE = "Williams, Waterman & Patterson 2009, Roofline, CACM 52(4)"
PEAK_DTYPE = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16", "fp8-e4m3": "fp8", "fp8-e5m2": "fp8"}


def gemm_work(M: int, N: int, K: int, nbytes: int, output: bool = True) -> tuple[float, float]:
    """(FLOPs, bytes) of a GEMM."""
    return 2.0 * M * N * K, float(M * K + K * N + (M * N if output else 0)) * nbytes


def elementwise_work(n: float, nbytes: int, flops_per_element: float = 1.0, reads: int = 1, writes: int = 1) -> tuple[float, float]:
    return flops_per_element * n, (reads + writes) * n * nbytes


def roofline(flops: float, nbytes: float, gpu: str = "h100-sxm-80gb", dtype: str = "bf16", label: str = "") -> CalcResult:
    F = positive("flops", flops)
    Q = positive("bytes", nbytes)
    spec = load_gpu(gpu)
    fmt = get_format(dtype)
    P = spec.peak(PEAK_DTYPE[fmt.name])
    beta = spec.hbm_bandwidth
    ridge = P / beta
    intensity = F / Q
    attain = min(P, intensity * beta)
    t = max(F / P, Q / beta)
    bound = "compute-bound" if intensity >= ridge else "memory-bound"
    data = {"gpu": spec.name, "dtype": fmt.name, "label": label, "flops": F, "bytes": Q, "intensity": intensity,
            "peak_flops": P, "hbm_bandwidth": beta, "ridge": ridge, "attainable_flops": attain, "bound": bound,
            "min_time_s": t, "fraction_of_peak": attain / P}
    derivs = [
        derive("roofline.intensity", "arithmetic intensity", "F / Q", [("F", f"{num(F)} FLOP"), ("Q", f"{num(Q)} bytes")],
               f"{num(intensity)} FLOP/byte", ROOFLINE),
        derive("roofline.ridge", f"ridge point ({spec.name}, {fmt.name})", "P / β",
               [("P", f"{num(P / TFLOPS)} TFLOP/s dense"), ("β", f"{num(beta / GBPS)} GB/s HBM")], f"{num(ridge)} FLOP/byte",
               f"{ROOFLINE}; {spec.sources.get('peak_tflops', '')}"),
        derive("roofline.attainable", "attainable FLOP/s", "min(P, I·β)",
               [("I", num(intensity)), ("P", f"{num(P / TFLOPS)} TFLOP/s"), ("β", f"{num(beta / GBPS)} GB/s")],
               f"{num(attain / TFLOPS)} TFLOP/s ({num(100 * attain / P)}% of peak): {bound}", ROOFLINE),
        derive("roofline.time", "lower bound on its time", "max(F/P, Q/β)", [("F/P", secs(F / P)), ("Q/β", secs(Q / beta))],
               secs(t), ROOFLINE),
    ]
    return CalcResult("roofline", data, tuple(derivs))


def gemm_roofline(shape: str, gpu: str = "h100-sxm-80gb", dtype: str = "bf16", output: bool = True) -> CalcResult:
    """``shape`` = ``MxNxK``."""
    parts = str(shape).lower().replace("*", "x").replace("×", "x").split("x")
    if len(parts) != 3:
        raise InputError("gemm", f"'{shape}' must be MxNxK, e.g. 4096x4096x4096")
    try:
        M, N, K = (count("gemm", int(p)) for p in parts)
    except ValueError:
        raise InputError("gemm", f"'{shape}' must be three whole numbers MxNxK") from None
    F, Q = gemm_work(M, N, K, get_format(dtype).storage_bytes, output)
    return roofline(F, Q, gpu, dtype, f"GEMM {M}x{N}x{K}" + ("" if output else " (reads only)"))


def elementwise_roofline(n: float, gpu: str = "h100-sxm-80gb", dtype: str = "bf16", flops_per_element: float = 1.0,
                         reads: int = 1, writes: int = 1) -> CalcResult:
    n = positive("elementwise", n)
    positive("flops_per_element", flops_per_element)
    r, w = count("reads", reads, 0), count("writes", writes, 0)
    if r + w == 0:
        raise InputError("reads", "an element-wise op reads or writes at least one tensor")
    F, Q = elementwise_work(n, get_format(dtype).storage_bytes, flops_per_element, r, w)
    return roofline(F, Q, gpu, dtype, f"element-wise over {num(n)} elements")
