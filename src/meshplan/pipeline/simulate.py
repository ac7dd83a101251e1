"""Event simulation of a pipeline schedule with per-stage durations and transfer times.

Each rank runs its action list in order. An action starts when its rank is free and its
inputs have arrived:

* ``F(k, j)`` needs ``F(k−1, j)`` finished plus the transfer time from stage k−1 to k;
* ``B(k, j)`` needs ``B(k+1, j)`` finished plus the transfer time back (the last stage's B needs
  only its own F, which precedes it on the rank).

Zero-bubble schedules split the backward into ``I`` (gradient for the input: on the critical path,
it feeds stage k−1) and ``W`` (gradient for the weights: needed by nobody downstream, so it can
fill bubbles). ``I(k, j)`` depends on the next stage's input gradient like ``B``; ``W(k, j)`` on
``I(k, j)``. Their durations are ``bwd[k] − wgt[k]`` and ``wgt[k]``.
Activations of a micro-batch are freed by its ``B``, or by its ``W`` when the backward is split
(the weight gradient still needs the saved layer inputs).

The makespan is the latest finish. Per rank: busy time (sum of its durations), idle time
(makespan − busy: the bubble, including waits for transfers), and the peak activation memory,
found by walking the rank's list: an F adds a micro-batch to its chunk, a B frees it; the peak is
the largest Σ_j live_j·a_j over the walk, a_j the activation bytes of the rank's chunk j
(:mod:`meshplan.pipeline.live`, or the closed forms of :mod:`meshplan.pipeline.inflight`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from meshplan.pipeline.inflight import schedule_live_counts
from meshplan.pipeline.live import padded_peak_bytes, peak_bytes  # noqa: F401 (padded_peak_bytes: read from here by search.engine)
from meshplan.pipeline.blocking import runs_blocking, simulate_blocking
from meshplan.pipeline.deepspeed_steps import runs_deepspeed, simulate_deepspeed
from meshplan.pipeline.lockstep import runs_lockstep, simulate_lockstep
from meshplan.pipeline.result import SimResult
from meshplan.pipeline.schedules import Action, Schedule
from meshplan.pipeline.slots import rank_program


@lru_cache(maxsize=32)
def _as_schedule(ranks: tuple[tuple[Action, ...], ...]) -> Schedule:
    return Schedule.from_actions(ranks)


@lru_cache(maxsize=64)
def _structure(sched: Schedule, n_stages: int):
    """Per rank, the own and dependency slots as lists (what the clock loop reads) and as arrays:
    everything of the clock loop that does not depend on the durations, computed once per
    schedule."""
    m = max(sched.microbatches, 1)
    out = []
    for r in range(sched.pp):
        own, dep = rank_program(sched, r, n_stages, m)
        out.append((own.tolist(), dep.tolist(), own))
    return tuple(out)




#: how pipeline ranks advance (the stack's ``pipeline_runtime``): dependency-driven, torch's 2024
#: lockstep over its slot grid (:mod:`meshplan.pipeline.lockstep`), or DeepSpeed's pipeline
#: engine, 1F1B in blocking lockstep steps (:mod:`meshplan.pipeline.deepspeed_steps`), or
#: Megatron-LM's 1F1B and interleaved loops of 2021–22, every exchange blocking (:mod:`meshplan.pipeline.blocking`)
RUNTIMES = ("dependency", "lockstep", "deepspeed", "blocking")


def simulate(
    ranks,
    n_stages: int,
    fwd: list[float],
    bwd: list[float],
    transfer: float = 0.0,
    act_bytes: list[float] | None = None,
    keep_timeline: bool = False,
    wgt: list[float] | None = None,
    runtime: str = "dependency",
) -> SimResult:
    """Run the schedule (a :class:`Schedule` or action lists per rank); ``fwd[k]``/``bwd[k]`` are
    stage k's durations per micro-batch and ``wgt[k]`` the weight-gradient part of ``bwd[k]``
    (used by split backwards; default half). A run of a compiled schedule without the timeline is
    remembered (up to 100,000 actions): plans that differ only in what does not change the
    durations (their memory settings, say) get the same, immutable, result without a second run.
    ``runtime = "lockstep"`` runs a compiled multi-stage schedule slot by slot over torch's grid
    (:mod:`meshplan.pipeline.lockstep`), ``"deepspeed"`` a compiled 1F1B as DeepSpeed's
    ``TrainSchedule`` (:mod:`meshplan.pipeline.deepspeed_steps`), ``"blocking"`` a compiled 1F1B or
    interleaved schedule with Megatron-LM's blocking exchanges of 2021–22
    (:mod:`meshplan.pipeline.blocking`); other schedules run dependency-driven either way."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)} (got {runtime!r})")
    if isinstance(ranks, Schedule) and runs_blocking(ranks.name, ranks.pp, runtime, ranks.microbatches):
        return simulate_blocking(ranks, fwd, bwd, transfer, act_bytes, keep_timeline)
    if runtime == "deepspeed" and isinstance(ranks, Schedule) and runs_deepspeed(ranks.name, ranks.pp, runtime):
        return simulate_deepspeed(ranks, fwd, bwd, transfer, act_bytes, keep_timeline)
    if runtime == "lockstep" and isinstance(ranks, Schedule):
        if runs_lockstep(ranks.name, ranks.pp, runtime):
            return simulate_lockstep(ranks, fwd, bwd, transfer, act_bytes, keep_timeline, wgt)
    if isinstance(ranks, Schedule) and not keep_timeline and sum(k.size for k in ranks.kind) <= _REMEMBER_ACTIONS:
        key = lambda xs: None if xs is None else tuple(float(x) for x in xs)  # noqa: E731
        return _simulate_once(ranks, n_stages, key(fwd), key(bwd), float(transfer), key(act_bytes), key(wgt))
    return _simulate(ranks, n_stages, fwd, bwd, transfer, act_bytes, keep_timeline, wgt)


_REMEMBER_ACTIONS = 100_000  # larger schedules are rarely run twice with the same durations


@lru_cache(maxsize=128)
def _simulate_once(sched: Schedule, n_stages: int, fwd, bwd, transfer, act_bytes, wgt) -> SimResult:
    return _simulate(sched, n_stages, list(fwd), list(bwd), transfer, None if act_bytes is None else list(act_bytes), False,
                     None if wgt is None else list(wgt))


def _simulate(ranks, n_stages, fwd, bwd, transfer, act_bytes, keep_timeline, wgt) -> SimResult:
    sched = ranks if isinstance(ranks, Schedule) else _as_schedule(tuple(tuple(acts) for acts in ranks))
    pp = sched.pp
    m = max(sched.microbatches, 1)
    f_t = np.asarray(fwd, dtype=float)
    b_t = np.asarray(bwd, dtype=float)
    w_t = np.asarray(wgt, dtype=float) if wgt is not None else b_t / 2
    table = np.stack([f_t, b_t, b_t - w_t, w_t])  # rows: F, B, I, W
    structure = _structure(sched, n_stages)
    live = schedule_live_counts(sched, n_stages)
    owns = [s[0] for s in structure]
    deps = [s[1] for s in structure]
    dur_arrays = [table[sched.kind[r], sched.stage[r]] for r in range(pp)]
    durs = [d.tolist() for d in dur_arrays]
    # ready[slot]: when a consumer on the next (or previous) stage may start, i.e. the producer's
    # end plus the transfer; −1 until it has run; the last slot is always ready
    ready = [-1.0] * (3 * n_stages * m) + [0.0]
    pos = [0] * pp
    free = [0.0] * pp
    lens = [len(o) for o in owns]
    remaining = sum(lens)
    progressed = True
    while remaining and progressed:
        progressed = False
        for r in range(pp):
            i, n = pos[r], lens[r]
            if i == n:
                continue
            own, dep, dur = owns[r], deps[r], durs[r]
            t_free = free[r]
            start = i
            while i < n:
                t = ready[dep[i]]
                if t < 0.0:
                    break
                if t > t_free:
                    t_free = t
                t_free += dur[i]
                ready[own[i]] = t_free + transfer
                i += 1
            if i != start:
                remaining -= i - start
                pos[r], free[r] = i, t_free
                progressed = True
    if remaining:
        raise RuntimeError("pipeline schedule deadlocked: an action waits on one that never runs")
    busy, peaks, peak_act, lines = [], [], [], []
    act = np.asarray(act_bytes, dtype=float) if act_bytes is not None else np.zeros(n_stages)
    ready_arr = np.asarray(ready) if keep_timeline else None
    for r in range(pp):
        chunks, rows, peak = live[r]
        busy.append(sum(durs[r]))  # left to right, as the clock above adds them
        peaks.append(peak)
        peak_act.append(peak_bytes(rows, act[chunks]))
        if keep_timeline:
            ends = ready_arr[structure[r][2]] - transfer
            acts = sched.actions()[r] if isinstance(ranks, Schedule) else ranks[r]
            # (end + τ) − τ can round below the end, so end − duration below the rank's previous
            # end or below 0 (τ ≫ durations): no action starts before either
            starts = np.maximum(ends - dur_arrays[r], np.concatenate(([0.0], ends[:-1])))
            lines.append(tuple(zip(acts, starts.tolist(), ends.tolist())))
    return SimResult(
        makespan=max(free) if free else 0.0,
        finish=tuple(free),
        busy=tuple(busy),
        peak_inflight=tuple(peaks),
        peak_activation=tuple(peak_act),
        timeline=tuple(lines) if keep_timeline else None,
    )


def uniform_makespan(schedule: str, pp: int, m: int, vpp: int, f: float, b: float) -> float | None:
    """Closed form for equal stages and free transfers: (m + p − 1)·(f + b) for GPipe and 1F1B,
    (m·v + p − 1)·(f + b) for interleaved with per-chunk times f, b (Narayanan et al. 2021) — which
    needs m ≥ p (fewer micro-batches leave the later chunks waiting); ``None`` otherwise."""
    if schedule == "interleaved":
        return (m * vpp + pp - 1) * (f + b) if m >= pp else None
    return (m + pp - 1) * (f + b)


def zbh1_makespan(pp: int, m: int, f: float, b: float, w: float) -> float | None:
    """ZB-H1 with equal stages and free transfers, backward b = i + w split into input gradient i
    and weight gradient w: m·(f + b) + (p − 1)·(f + i − w) (Qi et al. 2024, Sec. 3.1: the bubble
    of 1F1B, (p − 1)·(f + b), shrinks by 2w per stage). It holds when m ≥ p and w ≤ i — the W's
    then fit in the drain's gaps; ``None`` otherwise (the simulation is then the answer)."""
    i = b - w
    if m < pp or w > i:
        return None
    return m * (f + b) + (pp - 1) * (f + i - w)
