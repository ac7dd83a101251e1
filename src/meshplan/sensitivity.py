"""How the step time of a plan moves with the hardware: elasticities by central differences.

The elasticity of the step time t to a parameter x is

    e = d ln t / d ln x

(a 1 % larger x changes the step by about e %), estimated by a central difference over
x·(1 − δ) and x·(1 + δ) with δ = 10 % (:data:`DELTA`):

    e ≈ ln(t₊ / t₋) / ln((1 + δ) / (1 − δ)),    t₋ = t(x·(1 − δ)),  t₊ = t(x·(1 + δ))

exact for a step that goes as x^e (a rate's 1/x: e = −1), and for a mix of terms the
share-weighted mean of their exponents, to second order in δ. Each parameter is changed alone,
the plan, the model and everything else of the cluster kept:

* ``peak_flops`` F: every dense peak of the GPU in proportion (bf16's, and fp8's for an FP8 plan:
  the tensor cores' clock);
* ``hbm_bandwidth`` W: HBM bandwidth;
* ``scale_up_bandwidth`` B_up: per GPU per direction inside the scale-up (NVLink) domain;
* ``scale_out_bandwidth`` B_out: per GPU per direction across the fabric (NIC);
* ``latency`` α: the per-step latency of collectives, both tiers (α_up, α_out) together;
* ``gpus`` N at the same global batch B (sequences) and micro-batch b: dp varied, tp·cp·pp kept,
  at the nearest valid counts below and above (dp' dividing B/b and passing every rule of the plan
  and cluster), e = ln(t(N₊) / t(N₋)) / ln(N₊ / N₋), one-sided where only one side exists. The
  valid counts are rarely N·(1 ± δ): a batch of 2,048 sequences on dp = 128 allows 64 and 256.

Days at a fixed token budget and batch are steps × t, so their elasticity is t's; GPU-hours
(N·t) and dollars add 1 to the GPU count's.

The model's times are bytes over a rate, FLOPs over a rate, latencies α and the calibration's
fixed costs t_k, the per-kernel overhead and the collectives' per-call latency α₀
(:mod:`meshplan.cost.calibration`), combined by sums, products with counts, maxima and the
pipeline's schedule (sums and maxima). Scaling F, W, B_up and B_out by λ and α, t_k by 1/λ
therefore scales every time, and the step, by exactly 1/λ (bit for bit when λ is a power of 2:
:func:`scale_hardware`), and Euler's theorem on homogeneous functions gives, for exact
derivatives,

    e_F + e_W + e_up + e_out − e_α − e_tk = −1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from pydantic import ValidationError

from meshplan.errors import InputError
from meshplan.estimate import Estimate, estimate
from meshplan.specs.hardware import ClusterSpec
from meshplan.units import GBPS, TB, TFLOPS, US

#: δ: the relative change of each hardware parameter on either side
DELTA = 0.10
#: the most GPU counts tried on each side before giving that side up
GPU_TRIES = 8

#: parameter -> what it is, in words
LABELS: dict[str, str] = {
    "peak_flops": "peak FLOP/s (dense, every dtype)",
    "hbm_bandwidth": "HBM bandwidth",
    "scale_up_bandwidth": "scale-up (NVLink) bandwidth",
    "scale_out_bandwidth": "scale-out (NIC) bandwidth",
    "latency": "collective latency (both tiers)",
    "gpus": "GPU count (same global batch)",
}
#: the hardware parameters changed by a factor (:func:`scaled`)
FACTORED: tuple[str, ...] = ("peak_flops", "hbm_bandwidth", "scale_up_bandwidth", "scale_out_bandwidth", "latency")


@dataclass(frozen=True)
class Elasticity:
    """``parameter``'s elasticity e of the step (None where no change of it was valid), the steps
    t₋ and t₊ at its lower and higher value, those values as factors of the baseline's, and the
    baseline value in words."""

    parameter: str
    elasticity: Optional[float]
    step_s_minus: Optional[float]
    step_s_plus: Optional[float]
    factor_minus: Optional[float]
    factor_plus: Optional[float]
    baseline: str
    gpus_minus: Optional[int] = None
    gpus_plus: Optional[int] = None

    @property
    def label(self) -> str:
        return LABELS[self.parameter]

    def to_dict(self) -> dict:
        out = {"parameter": self.parameter, "label": self.label, "elasticity": self.elasticity,
               "step_s_minus": self.step_s_minus, "step_s_plus": self.step_s_plus,
               "factor_minus": self.factor_minus, "factor_plus": self.factor_plus, "baseline": self.baseline}
        if self.parameter == "gpus":
            out.update(gpus_minus=self.gpus_minus, gpus_plus=self.gpus_plus)
        return out


def scaled(cluster: ClusterSpec, parameter: str, factor: float) -> ClusterSpec:
    """``cluster`` with one hardware ``parameter`` (:data:`FACTORED`) times ``factor``."""
    gpu, up, out = cluster.gpu, cluster.scale_up, cluster.scale_out
    if parameter == "peak_flops":
        peaks = {k: (None if v is None else v * factor) for k, v in gpu.peak_flops.model_dump().items()}
        return cluster.model_copy(update={"gpu": gpu.model_copy(update={"peak_flops": type(gpu.peak_flops)(**peaks)})})
    if parameter == "hbm_bandwidth":
        return cluster.model_copy(update={"gpu": gpu.model_copy(update={"hbm_bandwidth": gpu.hbm_bandwidth * factor})})
    if parameter == "scale_up_bandwidth":
        return cluster.model_copy(update={"scale_up": up.model_copy(update={"bandwidth": up.bandwidth * factor})})
    if parameter == "scale_out_bandwidth":
        return cluster.model_copy(update={"scale_out": out.model_copy(update={"bandwidth": out.bandwidth * factor})})
    if parameter == "latency":
        return cluster.model_copy(update={"scale_up": up.model_copy(update={"latency": up.latency * factor}),
                                          "scale_out": out.model_copy(update={"latency": out.latency * factor})})
    raise ValueError(f"unknown hardware parameter {parameter!r} (parameters: {', '.join(FACTORED)})")


def scale_hardware(cluster: ClusterSpec, factor: float) -> ClusterSpec:
    """``cluster`` with every rate (F, W, B_up, B_out) times ``factor`` and every latency α over it:
    the step of any plan on it is t/``factor`` but for the calibration's fixed costs t_k (per-kernel
    overhead, per-call collective latency), which no hardware figure sets (module docstring)."""
    for parameter in FACTORED:
        cluster = scaled(cluster, parameter, 1.0 / factor if parameter == "latency" else factor)
    return cluster


def e_words(e: Optional[float]) -> str:
    """An elasticity as the tables and the chart write it: signed, three decimals, no −0.000."""
    if e is None:
        return "—"
    return f"{e:+.3f}" if round(e, 3) else "0.000"


def central(t_minus: float, t_plus: float, x_minus: float, x_plus: float) -> float:
    """e = ln(t₊ / t₋) / ln(x₊ / x₋): the elasticity between two points (module docstring)."""
    return math.log(t_plus / t_minus) / math.log(x_plus / x_minus)


def _baseline_words(est: Estimate, parameter: str) -> str:
    c = est.cluster
    if parameter == "peak_flops":
        return f"{c.gpu.peak_flops.bf16 / TFLOPS:,.1f} TFLOP/s bf16"
    if parameter == "hbm_bandwidth":
        return f"{c.gpu.hbm_bandwidth / TB:.2f} TB/s"
    if parameter == "scale_up_bandwidth":
        return f"{c.scale_up.bandwidth / GBPS:g} GB/s"
    if parameter == "scale_out_bandwidth":
        return f"{c.scale_out.bandwidth / GBPS:g} GB/s"
    if parameter == "latency":
        return f"{c.scale_up.latency / US:g} / {c.scale_out.latency / US:g} µs"
    return f"{c.num_gpus:,} GPU" + ("s" if c.num_gpus > 1 else "")


def with_gpus(cluster: ClusterSpec, num_gpus: int) -> ClusterSpec:
    """``cluster`` with ``num_gpus`` GPUs, everything else as it is (the scale-out tier spans them)."""
    tier = cluster.scale_out.model_copy(update={"size": max(num_gpus, cluster.scale_up.size)})
    return ClusterSpec.build("cluster", gpu=cluster.gpu, num_gpus=num_gpus, scale_up=cluster.scale_up, scale_out=tier,
                             pod_size=cluster.pod_size, oversubscription=cluster.oversubscription)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def neighbour_counts(est: Estimate) -> tuple[Optional[Estimate], Optional[Estimate]]:
    """The estimates of the plan at the nearest valid data-parallel sizes below and above its own
    (the global batch, micro-batch and tp·cp·pp kept; module docstring), None where none of the
    :data:`GPU_TRIES` nearest divisors of B/b on that side is valid."""
    p = est.plan
    found: list[Optional[Estimate]] = []
    divisors = _divisors(p.global_batch // p.micro_batch)
    for side in ([d for d in reversed(divisors) if d < p.dp], [d for d in divisors if d > p.dp]):
        got = None
        for dp in side[:GPU_TRIES]:
            try:
                plan = p.replace(dp=dp)
                got = estimate(est.model, with_gpus(est.cluster, plan.num_gpus), plan, est.budget)
                break
            except (InputError, ValidationError, ValueError):
                continue
        found.append(got)
    return found[0], found[1]


def _gpu_elasticity(est: Estimate) -> Elasticity:
    """The GPU count's row: central between the two neighbours, else one-sided with the baseline."""
    lo, hi = neighbour_counts(est)
    n, t = est.plan.num_gpus, est.time.step_s
    points = [(e.plan.num_gpus, e.time.step_s) for e in (lo, hi) if e is not None]
    if not points:
        e = None
    else:
        (n0, t0), (n1, t1) = (points if len(points) == 2 else sorted([(n, t), points[0]]))
        e = central(t0, t1, n0, n1)
    return Elasticity("gpus", e, lo.time.step_s if lo else None, hi.time.step_s if hi else None,
                      lo.plan.num_gpus / n if lo else None, hi.plan.num_gpus / n if hi else None, _baseline_words(est, "gpus"),
                      lo.plan.num_gpus if lo else None, hi.plan.num_gpus if hi else None)


def sensitivity(est: Estimate, delta: float = DELTA) -> list[Elasticity]:
    """The step's elasticity to each hardware parameter of ``est``'s cluster (module docstring),
    largest magnitude first (a parameter without a valid change last)."""
    rows = []
    lo, hi = 1.0 - delta, 1.0 + delta
    for parameter in FACTORED:
        t_lo, t_hi = (estimate(est.model, scaled(est.cluster, parameter, f), est.plan, est.budget).time.step_s for f in (lo, hi))
        rows.append(Elasticity(parameter, central(t_lo, t_hi, lo, hi), t_lo, t_hi, lo, hi, _baseline_words(est, parameter)))
    rows.append(_gpu_elasticity(est))
    return sorted(rows, key=lambda r: (r.elasticity is None, -abs(r.elasticity or 0.0)))


__all__ = ["DELTA", "Elasticity", "LABELS", "FACTORED", "scaled", "scale_hardware", "central", "with_gpus",
           "neighbour_counts", "sensitivity", "e_words"]
