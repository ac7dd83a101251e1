"""The search: enumerate, screen every plan at once, then simulate the contenders exactly.

1. :func:`~meshplan.search.space.enumerate_plans` lists the space and counts structural rejects.
2. :class:`~meshplan.search.engine.Engine` gives every plan its exact peak memory and a lower
   bound on its step time; plans above the usable HBM, (1 − headroom) × HBM, are rejected.
3. Best first: feasible plans in order of their bound on the objective are estimated exactly
   (:func:`meshplan.estimate.estimate`, the pipeline simulation included) until the k-th best
   exact value beats the next bound — no plan left unsimulated can enter the top k.

Objectives (lower is better): seconds per token (``throughput``), days for the token budget
(``time-to-train``) and dollars for it (``cost``). For one GPU count and batch they order plans
alike; they differ when the batch varies (``--batch-range``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from meshplan.catalog import requested_stack
from meshplan.errors import InputError
from meshplan.estimate import Budget, Estimate, estimate
from meshplan.search.engine import Engine, Screen
from meshplan.search.space import PlanTable, SearchLimits, enumerate_plans
from meshplan.specs.rules import REASONS
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import Stack
from meshplan.units import DAY, HOUR

OBJECTIVES = ("throughput", "time-to-train", "cost")


class Stopped(Exception):
    """Raised by a progress callback to end a search early, with the ``reason`` in words. Raised
    while the space is screened, it ends the search; raised later, the search returns what it has
    (:attr:`SearchResult.stopped`): the best of the plans simulated so far, the baseline counted
    as far as it got, the front up to the memory it reached."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Ranked:
    """One exactly estimated plan and its objective value."""

    estimate: Estimate
    score: float


@dataclass
class BaselinePlace:
    """Where a given plan lands: its estimate, whether it fits, and how many feasible plans of the
    space are faster (exactly counted up to ``better_exact``; beyond that, a bound)."""

    estimate: Estimate
    fits: bool
    faster_at_most: int
    faster_exact: Optional[int]
    feasible: int
    value: float = 0.0  # its objective value

    @property
    def percentile(self) -> float:
        """Share of feasible plans that beat it, at most (0 = the best)."""
        faster = self.faster_exact if self.faster_exact is not None else self.faster_at_most
        return faster / self.feasible if self.feasible else 0.0


@dataclass
class SearchResult:
    evaluated: int
    feasible: int
    rejected: dict[str, int]
    seconds: float
    simulated: int
    objective: str
    top: list[Ranked]
    closest: list[tuple[Estimate, float]] = field(default_factory=list)  # when nothing fits: (plan, bytes over)
    baseline: Optional[BaselinePlace] = None
    pareto: list[Ranked] = field(default_factory=list)
    usable_bytes: float = 0.0
    stack: Optional[Stack] = None  # the stack the plans were searched for, as requested
    stopped: Optional[str] = None  # why the search stopped early (Stopped), in words; None when it ran to the end
    stopped_in: Optional[str] = None  # where: "top", "baseline" or "pareto"


def _score(objective: str, seconds_per_token: np.ndarray | float, num_gpus: int, budget: Budget):
    """Objective value from seconds per token (lower is better)."""
    if objective == "throughput":
        return seconds_per_token
    tokens = budget.tokens or 1.0
    if objective == "time-to-train":
        return seconds_per_token * tokens / DAY
    price = budget.price_per_gpu_hour if budget.price_per_gpu_hour is not None else 1.0
    return seconds_per_token * tokens * num_gpus / HOUR * price


def plan_of(base: TrainingPlan, table: PlanTable, i: int, stack: Optional[Stack] = None) -> TrainingPlan:
    """The plan of row ``i`` of ``table``: its axes and switches over ``base``, run by ``stack``
    (default: the base's), whose rules apply to the row (:func:`meshplan.specs.stack.applied`)."""
    # the table's recompute mode covers every layer: a base's recompute of some layers does not carry over
    return TrainingPlan.of(**{**base.model_dump(), "stack": base.stack if stack is None else stack, "recompute_layers": None,
                              **table.row(i)})


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    base: TrainingPlan,
    limits: SearchLimits = SearchLimits(),
    *,
    global_batches: Optional[tuple[int, ...]] = None,
    objective: str = "throughput",
    budget: Budget = Budget(),
    top_k: int = 10,
    headroom: float = 0.0,
    baseline: Optional[TrainingPlan] = None,
    pareto: bool = False,
    progress: Optional[Callable[[str, int, int], None]] = None,
    max_exact: int = 20_000,
    stack: Optional[Stack] = None,
    on_top: Optional[Callable[[SearchResult], None]] = None,
) -> SearchResult:
    """Search the plans of ``limits`` for ``model`` on ``cluster`` (module docstring). ``base``
    supplies what is not searched (sequence length, global batch, precision, attention, rank order);
    ``stack`` runs the plans, its rules applied to each (default: the base's profile and what the
    base sets over it, :func:`~meshplan.catalog.requested_stack`). ``progress`` reports long runs
    and may end them (:class:`Stopped`); ``on_top(result)`` is called once the top plans are
    known, before the baseline is placed and the front is walked."""
    _check_options(objective, headroom, top_k)
    t0 = time.perf_counter()
    batches = global_batches or (base.global_batch,)
    table = enumerate_plans(model, cluster.num_gpus, cluster.gpus_per_node, base.seq_len, batches, limits)
    stack = requested_stack(base) if stack is None else stack
    engine = Engine(model, cluster, base, stack)
    n = len(table)
    done = [0]

    def tick(k: int) -> None:
        done[0] += k
        if progress:
            progress("screen", done[0], n)

    screen = engine.evaluate(table, tick)
    usable = cluster.gpu.hbm_bytes * (1.0 - headroom)
    fits = screen.peak_bytes <= usable
    rejected = dict(table.rejected)
    n_oom = int((~fits).sum())
    if n_oom:
        rejected["memory"] = n_oom
    tokens = table.global_batch * base.seq_len
    bound = _score(objective, screen.step_lower_bound / tokens, cluster.num_gpus, budget)
    result = SearchResult(
        evaluated=n, feasible=int(fits.sum()), rejected=rejected, seconds=0.0, simulated=0,
        objective=objective, top=[], usable_bytes=usable, stack=stack,
    )
    exact = _Exact(model, cluster, base, table, stack, budget, objective, progress)
    feasible_idx = np.flatnonzero(fits)
    order = feasible_idx[np.argsort(bound[feasible_idx], kind="stable")]
    try:
        result.stopped_in = "top"
        result.top = _best_first(order, bound, top_k, max_exact, exact)
        if not len(feasible_idx) and n:
            result.closest = _closest(screen.peak_bytes - usable, top_k, exact)
        _mark(result, exact, t0)
        if on_top is not None:
            on_top(result)
        if baseline is not None:
            result.stopped_in = "baseline"
            result.baseline = _place(model, cluster, baseline, budget, objective, usable, len(feasible_idx))
            _count_faster(result.baseline, order, bound, exact)
        if pareto and len(feasible_idx):
            result.stopped_in = "pareto"
            _memory_front(screen, feasible_idx, bound, exact, max_exact, result.pareto)
        result.stopped_in = None
    except Stopped as stop:
        if result.stopped_in == "top":  # the best of the plans simulated so far
            result.top = sorted((r for r in exact.values() if r.estimate.peak_bytes <= usable), key=lambda r: r.score)[:top_k]
        result.stopped = stop.reason
    _mark(result, exact, t0)
    return result


class _Exact(dict):
    """The plans of the table estimated exactly so far, by row; calling it with a row estimates
    that row once (reported to ``progress`` as ``simulate``)."""

    def __init__(self, model, cluster, base, table, stack, budget, objective, progress):
        super().__init__()
        self.args = (model, cluster, base, table, stack, budget, objective, progress)

    def __call__(self, i: int) -> Ranked:
        if i not in self:
            model, cluster, base, table, stack, budget, objective, progress = self.args
            est = estimate(model, cluster, plan_of(base, table, i, stack), budget)
            self[i] = Ranked(est, float(_score(objective, est.time.step_s / est.plan.tokens_per_step, cluster.num_gpus, budget)))
            if progress:
                progress("simulate", len(self), 0)
        return self[i]


def _mark(result: SearchResult, exact: dict, t0: float) -> None:
    """The plans simulated and the seconds taken so far, in ``result``."""
    result.simulated = len(exact)
    result.seconds = time.perf_counter() - t0


def _best_first(order: np.ndarray, bound: np.ndarray, top_k: int, max_exact: int, run: _Exact) -> list[Ranked]:
    """The ``top_k`` best plans: feasible plans simulated in order of their bound (``order``)
    until the k-th best exact value beats the next bound (or ``max_exact`` plans are simulated)."""
    best: list[Ranked] = []
    for i in order.tolist():
        if len(best) >= top_k and bound[i] >= best[top_k - 1].score:
            break
        if len(run) >= max_exact:
            break
        best.append(run(i))
        best.sort(key=lambda r: r.score)
    return best[:top_k]


def _check_options(objective: str, headroom: float, top_k: int) -> None:
    """The search's own options; each refusal names the option."""
    if objective not in OBJECTIVES:
        raise InputError("objective", f"must be one of {', '.join(OBJECTIVES)} (got {objective!r})")
    if not 0.0 <= headroom < 1.0:
        raise InputError("headroom", f"must be a fraction in [0, 1) (got {headroom})")
    if top_k < 1:
        raise InputError("top", f"must be at least 1 (got {top_k})")


def _closest(over: np.ndarray, top_k: int, run) -> list[tuple[Estimate, float]]:
    """When no plan fits: the ``top_k`` plans least over the memory limit (``over``, bytes per
    plan), estimated exactly, each with its bytes over."""
    return [(run(i).estimate, float(over[i])) for i in np.argsort(over, kind="stable")[:top_k].tolist()]


def _place(model, cluster, plan, budget, objective, usable, n_feasible) -> BaselinePlace:
    """The baseline's exact estimate, its objective value and whether it fits; the plans faster
    than it are counted by :func:`_count_faster`."""
    est = estimate(model, cluster, plan, budget)
    value = float(_score(objective, est.time.step_s / plan.tokens_per_step, cluster.num_gpus, budget))
    return BaselinePlace(est, est.peak_bytes <= usable, 0, None, n_feasible, value)


def _count_faster(place: BaselinePlace, order: np.ndarray, bound: np.ndarray, run) -> None:
    """How many feasible plans beat the baseline: at most those whose bound is below its value;
    exactly, by simulating them, when there are at most 2,000."""
    maybe = order[bound[order] < place.value]
    place.faster_at_most = int(len(maybe))
    if len(maybe) <= 2000:
        place.faster_exact = sum(1 for i in maybe.tolist() if run(i).score < place.value)


def _memory_front(screen: Screen, feasible_idx: np.ndarray, bound: np.ndarray, run, max_exact: int, front: list[Ranked]) -> None:
    """Plans no other feasible plan beats on both peak memory and the objective, into ``front`` by
    increasing memory: walking plans by memory, a plan is simulated only when its bound could beat
    the best value seen at lower memory."""
    by_mem = feasible_idx[np.lexsort((bound[feasible_idx], screen.peak_bytes[feasible_idx]))]
    best = np.inf
    simulated = 0
    for i in by_mem.tolist():
        if bound[i] >= best:
            continue
        if simulated >= max_exact:
            break
        simulated += 1
        r = run(i)
        if r.score < best:
            best = r.score
            front.append(r)


def describe_rejections(rejected: dict[str, int]) -> list[tuple[str, int, str]]:
    """(reason key, count, rule) for each reason, most plans first."""
    return sorted(((k, v, REASONS.get(k, k)) for k, v in rejected.items()), key=lambda x: -x[1])
