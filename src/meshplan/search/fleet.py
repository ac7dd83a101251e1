"""GPUs vs days: the best plan for each of several GPU counts, and the counts worth buying.

For every GPU count N of the sweep the search (:func:`meshplan.search.run.search`) finds the plan
with the fewest days for the token budget, D(N) = tokens / tokens per step × step(N) / 86,400 s,
on the same model, batch and network (only the GPU count changes). Its GPU-hours are
N · D(N) · 24. A count is on the front when no smaller count trains at least as fast: more GPUs
are worth having only if they cut the days, so the front is the counts whose D(N) is below the
D of every smaller count (Pareto-optimal in fewer GPUs and fewer days).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from meshplan.errors import InputError
from meshplan.estimate import Budget
from meshplan.search.run import Ranked, SearchResult, search
from meshplan.search.space import SearchLimits
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import Stack

MAX_COUNTS = 32


@dataclass
class FleetPoint:
    """One GPU count: the search's result (its best plan first) and whether the count is on the
    GPUs-vs-days front."""

    num_gpus: int
    result: SearchResult
    on_front: bool = False

    @property
    def best(self) -> Optional[Ranked]:
        return self.result.top[0] if self.result.top else None

    @property
    def days(self) -> Optional[float]:
        run = self.best.estimate.run_cost() if self.best else None
        return run["days"] if run else None


def parse_gpu_counts(text: str, gpus_per_node: int) -> tuple[int, ...]:
    """``"4096:16384"`` (from the first count, doubling, up to the last; the last always
    included) or ``"4096,8192,12288"`` (a list), each count a positive multiple of the node size
    (or, below one node, a divisor of it). Sorted, without repeats."""
    text = text.strip()

    def count(part: str) -> int:
        try:
            n = int(part.replace("_", "").strip())
        except ValueError:
            raise InputError("gpus-range", f"'{part.strip()}' is not a whole number of GPUs (use MIN:MAX such as 4096:16384, or a list such as 4096,8192)") from None
        if n < 1:
            raise InputError("gpus-range", f"GPU counts must be positive (got {n})")
        if (n >= gpus_per_node and n % gpus_per_node) or (n < gpus_per_node and gpus_per_node % n):
            raise InputError("gpus-range", f"{n:,} GPUs is not a multiple of the {gpus_per_node}-GPU node (or a divisor of it)")
        return n

    if ":" in text:
        parts = text.split(":")
        if len(parts) != 2:
            raise InputError("gpus-range", f"expected MIN:MAX such as 4096:16384 (got '{text}')")
        lo, hi = count(parts[0]), count(parts[1])
        if hi < lo:
            raise InputError("gpus-range", f"MIN ({lo:,}) must not exceed MAX ({hi:,})")
        out, n = [], lo
        while n < hi:
            out.append(n)
            n *= 2
        out.append(hi)
    else:
        out = [count(p) for p in text.split(",") if p.strip()]
        if not out:
            raise InputError("gpus-range", "expected MIN:MAX or a comma-separated list of GPU counts")
    counts = tuple(sorted(set(out)))
    if len(counts) > MAX_COUNTS:
        raise InputError("gpus-range", f"at most {MAX_COUNTS} GPU counts (got {len(counts)})")
    return counts


def cluster_with(cluster: ClusterSpec, num_gpus: int) -> ClusterSpec:
    """``cluster`` with ``num_gpus`` GPUs (same GPU, nodes, fabric, pods and oversubscription)."""
    try:
        return ClusterSpec.model_validate({**cluster.model_dump(), "num_gpus": num_gpus})
    except Exception as err:  # pydantic: one line naming the rule
        raise InputError("gpus-range", str(err).splitlines()[-1].strip()) from None


def gpu_front(
    model: ModelSpec,
    cluster: ClusterSpec,
    base: TrainingPlan,
    limits: SearchLimits,
    counts: tuple[int, ...],
    budget: Budget,
    *,
    headroom: float = 0.0,
    global_batches: Optional[tuple[int, ...]] = None,
    progress: Optional[Callable[[str, int, int], None]] = None,
    stack: Optional[Stack] = None,
) -> list[FleetPoint]:
    """The best plan by time-to-train for each GPU count of ``counts`` (module docstring), with
    the front marked."""
    if not budget.tokens:
        raise InputError("tokens", "the GPUs-vs-days front (--gpus-range) needs --tokens")
    points = []
    for n in counts:
        res = search(
            model, cluster_with(cluster, n), base, limits, global_batches=global_batches, objective="time-to-train",
            budget=budget, top_k=1, headroom=headroom, progress=progress, stack=stack,
        )
        points.append(FleetPoint(n, res))
    mark_front(points)
    return points


def mark_front(points: list[FleetPoint]) -> None:
    """Set ``on_front`` on the points (sorted by GPU count) whose days beat every smaller count."""
    best = float("inf")
    for pt in sorted(points, key=lambda p: p.num_gpus):
        d = pt.days
        pt.on_front = d is not None and d < best
        if d is not None and d < best:
            best = d
