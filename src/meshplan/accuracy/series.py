"""Scaling series: one layout published at several GPU counts, and how meshplan's error moves
along it.

The scale buckets of :mod:`meshplan.accuracy.groups` average runs of different sources, models
and layouts, so a bias that grows from bucket to bucket can come from *which* runs sit in the
larger buckets as much as from scale itself. A series removes that: it is the predicted runs of
one source that share everything but the data-parallel width (and so the GPU count and, perhaps,
the global batch): the same GPU, the same whole model and the same whole plan with its stack
(compute precision, sequence length, TP, CP, PP, virtual stages, EP, micro-batch, recompute,
kernels and every other setting) but for ``dp`` and ``global_batch`` — :func:`series_key`. Along
a series only what grows with the GPU count changes.

For a series whose smallest and largest GPU counts are N₀ and N₁, with T tokens a step and a step
of t seconds, the throughput per GPU is T / (t·N), and the **scaling efficiency** from N₀ to N₁ is

    E = (T₁ / (t₁·N₁)) / (T₀ / (t₀·N₀))

taken once with the published steps (E_pub) and once with meshplan's (E_pred). With signed errors
ε = t̂/t − 1, E_pred / E_pub = (1 + ε₀) / (1 + ε₁) exactly: meshplan scales the series better than
measured exactly when its error at N₁ is more negative than at N₀. The **drift** is the
least-squares slope of ε over log₂ N, in error per doubling of the GPU count, over every point of
the series. A series is **strong** scaling when T is the same at every point, **weak** when T/N
is, and **mixed** otherwise.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from statistics import linear_regression, mean, median
from typing import Any, Optional


def series_key(run: Any) -> tuple[str, str]:
    """(key, label) of the series a supported :class:`~meshplan.accuracy.runs.MappedRun` belongs
    to. The key holds everything but the data-parallel width (module docstring): the source, the
    GPU, the whole model and the whole plan, its stack included, less ``dp`` and ``global_batch``
    (a digest of them). The label names the fields a reader tells series apart by."""
    m, p = run.model, run.plan
    fixed = [run.group, run.cluster.gpu.model_dump(), m.model_dump(), p.model_dump(exclude={"dp", "global_batch"})]
    key = hashlib.sha256(json.dumps(fixed, sort_keys=True, default=str).encode()).hexdigest()[:16]
    layout = f"TP{p.tp} CP{p.cp} PP{p.pp}" + (f" VP{p.vpp}" if p.vpp > 1 else "") + (f" EP{p.ep}" if p.ep > 1 else "")
    recompute = "" if p.recompute == "none" else f", {p.recompute} recompute"
    return key, (f"{run.group}: {m.name} ({m.n_layers} layers), {p.precision.precision}, seq {p.seq_len:,}, {layout}, "
                 f"micro-batch {p.micro_batch}{recompute}, {p.stack.name} {p.stack.kernels}, {run.cluster.gpu.name}")


@dataclass
class SeriesSummary:
    """One scaling series (module docstring), its points in increasing GPU count."""

    label: str
    group: str  # the source group
    rows: list[str]  # run ids
    gpus: list[int]
    tokens: list[int]  # tokens a step at each point
    errors: list[float]  # signed step errors
    kind: str  # strong | weak | mixed
    published_efficiency: float  # E_pub, smallest to largest GPU count
    predicted_efficiency: float  # E_pred
    drift_per_doubling: float  # least-squares slope of the error over log2 N


def efficiency(tokens: tuple[float, float], steps: tuple[float, float], gpus: tuple[int, int]) -> float:
    """E = (T₁/(t₁·N₁)) / (T₀/(t₀·N₀)): throughput per GPU at the second point over the first's."""
    (t0, t1), (s0, s1), (n0, n1) = tokens, steps, gpus
    return (t1 / (s1 * n1)) / (t0 / (s0 * n0))


def drift(gpus: list[int], errors: list[float]) -> float:
    """Least-squares slope of ``errors`` over log₂ ``gpus``: error per doubling of the GPU count
    (needs two distinct GPU counts)."""
    if len(set(gpus)) < 2:
        raise ValueError("a drift needs two distinct GPU counts")
    return linear_regression([math.log2(n) for n in gpus], errors).slope


def scaling_kind(tokens: list[int], gpus: list[int]) -> str:
    """strong (the same tokens a step at every point), weak (the same tokens per GPU), or mixed."""
    if len(set(tokens)) == 1:
        return "strong"
    t0, n0 = tokens[0], gpus[0]
    return "weak" if all(t * n0 == t0 * n for t, n in zip(tokens, gpus)) else "mixed"


def scaling_series(rows: list[Any]) -> dict[str, SeriesSummary]:
    """The series of the predicted rows (:class:`~meshplan.accuracy.validate.RunResult`, grouped
    by ``series_id``) with a published step that span two GPU counts or more, by label in
    first-seen order; a row at a GPU count its series already holds is left out (the first one
    seen is kept), and a label two series share gets its order of appearance, `` (2)``."""
    by: dict[str, list[Any]] = {}
    for r in rows:
        if r.status == "ok" and r.series_id and r.error is not None:
            by.setdefault(r.series_id, []).append(r)
    out: dict[str, SeriesSummary] = {}
    for members in by.values():
        points: dict[int, Any] = {}
        for r in members:
            points.setdefault(r.gpus, r)
        if len(points) < 2:
            continue
        ordered = [points[n] for n in sorted(points)]
        first, last = ordered[0], ordered[-1]
        ends = (first.tokens, last.tokens), (first.gpus, last.gpus)
        gpus, tokens, errors = [r.gpus for r in ordered], [r.tokens for r in ordered], [r.error for r in ordered]
        label, k = first.series, 2
        while label in out:
            label, k = f"{first.series} ({k})", k + 1
        out[label] = SeriesSummary(
            label=label, group=first.group, rows=[r.id for r in ordered], gpus=gpus, tokens=tokens,
            errors=errors, kind=scaling_kind(tokens, gpus),
            published_efficiency=efficiency(ends[0], (first.published_step_s, last.published_step_s), ends[1]),
            predicted_efficiency=efficiency(ends[0], (first.predicted_step_s, last.predicted_step_s), ends[1]),
            drift_per_doubling=drift(gpus, errors),
        )
    return out


@dataclass
class DriftSummary:
    """The drifts of a report's series: their count, mean and median (error per doubling), and how
    many drift to the fast side (negative: meshplan scales the series better than measured)."""

    series: int
    mean: Optional[float]
    median: Optional[float]
    fast: int


def drift_summary(series: dict[str, SeriesSummary]) -> DriftSummary:
    """Every series weighted alike (a series of 8 points counts as one of 2)."""
    d = [s.drift_per_doubling for s in series.values()]
    if not d:
        return DriftSummary(0, None, None, 0)
    return DriftSummary(len(d), mean(d), median(d), sum(x < 0 for x in d))


__all__ = ["DriftSummary", "SeriesSummary", "drift", "drift_summary", "efficiency", "scaling_kind",
           "scaling_series", "series_key"]
