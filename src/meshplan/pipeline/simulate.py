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
found by walking the rank's list: an F adds the stage's activation bytes, a B frees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from meshplan.pipeline.schedules import Action, Schedule


@dataclass(frozen=True)
class SimResult:
    makespan: float
    finish: tuple[float, ...]  # per rank: when its last action ends
    busy: tuple[float, ...]  # per rank
    peak_inflight: tuple[int, ...]  # per rank: most micro-batch chunks held at once
    peak_activation: tuple[float, ...]  # per rank: bytes, weighted by each stage's activation size
    timeline: tuple[tuple[tuple[Action, float, float], ...], ...] | None = None

    @property
    def idle(self) -> tuple[float, ...]:
        return tuple(self.makespan - b for b in self.busy)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the step, averaged over ranks: idle / makespan."""
        n = len(self.busy)
        return sum(self.idle) / (n * self.makespan) if self.makespan > 0 else 0.0

    @property
    def bubble_overhead(self) -> float:
        """Idle time relative to ideal compute, averaged over ranks: idle / busy."""
        return sum(self.idle) / sum(self.busy) if sum(self.busy) > 0 else 0.0


@lru_cache(maxsize=32)
def _as_schedule(ranks: tuple[tuple[Action, ...], ...]) -> Schedule:
    return Schedule.from_actions(ranks)


@lru_cache(maxsize=64)
def _structure(sched: Schedule, n_stages: int):
    """Per rank, the own and dependency slots as lists (what the clock loop reads) and as arrays,
    and the ±1 activation signs of the memory walk: everything that does not depend on the
    durations, computed once per schedule."""
    m = max(sched.microbatches, 1)
    out = []
    for r in range(sched.pp):
        own, dep = _rank_program(sched, r, n_stages, m)
        kind = sched.kind[r]
        sign = np.where(kind == 0, 1, np.where((kind == 1) | (kind == 3), -1, 0))  # I keeps them: W needs them
        out.append((own.tolist(), dep.tolist(), own, sign))
    return tuple(out)


def _rank_program(sched: Schedule, r: int, n_stages: int, m: int):
    """Rank r's actions as flat arrays: own slot and dependency slot.

    Slots number (kind, stage, micro-batch) as ((κ·S + stage)·M + mb) with κ = 0 for F, 1 for the
    input-gradient producers B and I, 2 for W. A dependency on another rank is a real slot, whose
    ready time includes the transfer; one on this rank (the last stage's B or I on its own F, a W
    on its I, ZBV's turn from stage p − 1 to p) needs no transfer and is checked here once — the
    producer must come earlier in the rank's list — and then points at the last slot, 3·S·M,
    which is "done at time 0", as do the first stage's forwards."""
    kind, stage, mb = sched.kind[r], sched.stage[r], sched.mb[r]
    S, M = n_stages, m
    kappa = np.array([0, 1, 1, 2], dtype=np.int64)[kind]
    own = (kappa * S + stage) * M + mb
    is_f, is_w = kind == 0, kind == 3
    free_dep = 3 * S * M
    dep = np.where(
        is_f,
        np.where(stage > 0, (stage - 1) * M + mb, free_dep),
        np.where(is_w, (S + stage) * M + mb, np.where(stage == S - 1, stage * M + mb, (S + stage + 1) * M + mb)),
    )
    if own.size:
        order = np.argsort(own, kind="stable")  # first occurrence of each slot first
        sorted_own = own[order]
        at = np.minimum(np.searchsorted(sorted_own, dep), own.size - 1)
        here = sorted_own[at] == dep  # produced on this rank
        if (order[at][here] > np.flatnonzero(here)).any():
            raise RuntimeError("pipeline schedule deadlocked: an action comes before what it needs on its own rank")
        dep = np.where(here, free_dep, dep)
    return own, dep


def simulate(
    ranks,
    n_stages: int,
    fwd: list[float],
    bwd: list[float],
    transfer: float = 0.0,
    act_bytes: list[float] | None = None,
    keep_timeline: bool = False,
    wgt: list[float] | None = None,
) -> SimResult:
    """Run the schedule (a :class:`Schedule` or action lists per rank); ``fwd[k]``/``bwd[k]`` are
    stage k's durations per micro-batch and ``wgt[k]`` the weight-gradient part of ``bwd[k]``
    (used by split backwards; default half)."""
    sched = ranks if isinstance(ranks, Schedule) else _as_schedule(tuple(tuple(acts) for acts in ranks))
    pp = sched.pp
    m = max(sched.microbatches, 1)
    f_t = np.asarray(fwd, dtype=float)
    b_t = np.asarray(bwd, dtype=float)
    w_t = np.asarray(wgt, dtype=float) if wgt is not None else b_t / 2
    table = np.stack([f_t, b_t, b_t - w_t, w_t])  # rows: F, B, I, W
    structure = _structure(sched, n_stages)
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
    busy, peaks, peak_bytes, lines = [], [], [], []
    act = np.asarray(act_bytes, dtype=float) if act_bytes is not None else np.zeros(n_stages)
    ready_arr = np.asarray(ready) if keep_timeline else None
    for r in range(pp):
        stage, sign = sched.stage[r], structure[r][3]
        busy.append(sum(durs[r]))  # left to right, as the clock above adds them
        held = np.cumsum(sign)
        peaks.append(int(held.max()) if held.size else 0)
        mem = np.cumsum(sign * act[stage])
        peak_bytes.append(float(max(mem.max(), 0.0)) if mem.size else 0.0)
        if keep_timeline:
            ends = ready_arr[structure[r][2]] - transfer
            acts = sched.actions()[r] if isinstance(ranks, Schedule) else ranks[r]
            lines.append(tuple(zip(acts, (ends - dur_arrays[r]).tolist(), ends.tolist())))
    return SimResult(
        makespan=max(free) if free else 0.0,
        finish=tuple(free),
        busy=tuple(busy),
        peak_inflight=tuple(peaks),
        peak_activation=tuple(peak_bytes),
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
