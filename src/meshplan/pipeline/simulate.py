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
the largest Σ_j live_j·a_j over the walk, a_j the activation bytes of the rank's chunk j.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from meshplan.pipeline.schedules import Action, Schedule, stage_style
from meshplan.pipeline.stages import stages_of_rank


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
    """Per rank, the own and dependency slots as lists (what the clock loop reads) and as arrays:
    everything of the clock loop that does not depend on the durations, computed once per
    schedule."""
    m = max(sched.microbatches, 1)
    out = []
    for r in range(sched.pp):
        own, dep = _rank_program(sched, r, n_stages, m)
        out.append((own.tolist(), dep.tolist(), own))
    return tuple(out)


def _signs(kind: np.ndarray) -> np.ndarray:
    """+1 for F (a micro-batch's activations arrive), −1 for B and W (freed), 0 for I (kept: the
    weight gradient W still needs them)."""
    return np.where(kind == 0, 1, np.where((kind == 1) | (kind == 3), -1, 0))


def _live_counts(stage: np.ndarray, sign: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(chunks, rows, peak): the rank's stages in increasing order; the micro-batches of each
    chunk alive after each action, keeping only rows no other row exceeds in every chunk (the
    only candidates for the memory peak, whatever each chunk's bytes); and the most chunks
    alive at once."""
    chunks = np.unique(stage)
    if stage.size == 0:
        return chunks, np.zeros((0, 0), dtype=np.int64), 0
    if chunks.size == 1:
        held = np.cumsum(sign)
        peak = int(max(held.max(), 0))
        return chunks, np.array([[peak]], dtype=np.int64), peak
    onehot = (stage[:, None] == chunks[None, :]) * sign[:, None]
    counts = np.cumsum(onehot, axis=0)
    peak = int(max(counts.sum(axis=1).max(), 0))
    # a row can only be undominated right before a release (or at the end)
    rows = _unique_rows(counts[np.append(sign[1:] <= 0, True)])
    if len(rows) <= 2048:
        ge = (rows[None, :, :] >= rows[:, None, :]).all(axis=2)  # ge[i, j]: row j >= row i
        np.fill_diagonal(ge, False)
        kept = rows[~ge.any(axis=1)]  # rows are distinct, so >= elsewhere means dominated
    else:
        rows = rows[np.argsort(-rows.sum(axis=1), kind="stable")]
        kept = rows[:1]
        for row in rows[1:]:
            if not (kept >= row).all(axis=1).any():
                kept = np.vstack([kept, row])
    return chunks, kept.astype(np.int64), peak


def _unique_rows(rows: np.ndarray) -> np.ndarray:
    """Distinct rows of a non-negative integer matrix (one integer code per row when it fits)."""
    base = int(rows.max(initial=0)) + 1
    if rows.shape[1] * np.log2(base + 1) < 62:
        code = np.zeros(len(rows), dtype=np.int64)
        for j in range(rows.shape[1]):
            code = code * base + rows[:, j]
        _, first = np.unique(code, return_index=True)
        return rows[np.sort(first)]
    return np.unique(rows, axis=0)


@lru_cache(maxsize=256)
def live_count_peaks(sched: Schedule, n_stages: int) -> tuple[tuple[np.ndarray, np.ndarray, int], ...]:
    """Per rank, :func:`_live_counts` of its action list: the chunk stages, the undominated rows
    of live micro-batches per chunk, and the peak count. The activation peak of a rank whose
    chunks hold a_j bytes per micro-batch is max(0, max over rows of Σ_j row_j·a_j)
    (:func:`peak_bytes`)."""
    return tuple(_live_counts(sched.stage[r], _signs(sched.kind[r])) for r in range(sched.pp))


def schedule_live_counts(sched: Schedule, n_stages: int) -> tuple[tuple[np.ndarray, np.ndarray, int], ...]:
    """:func:`live_count_peaks`, from the closed forms of :mod:`meshplan.pipeline.inflight` when
    ``sched`` is a compiled GPipe, looped or ZBV schedule (the peak count is the largest row sum: the
    row with it is never dominated), else by walking the action lists."""
    from meshplan.pipeline.inflight import CLOSED_FORM, live_rows

    if sched.name not in CLOSED_FORM or n_stages != sched.n_stages:
        return live_count_peaks(sched, n_stages)
    v = sched.n_stages // sched.pp
    rows = live_rows(sched.name, sched.pp, sched.microbatches, v)
    style = stage_style(sched.name)
    return tuple(
        (np.array(sorted(stages_of_rank(r, sched.pp, v, style)), dtype=np.int64), rows[r],
         int(max(rows[r].sum(axis=1).max(initial=0), 0)))
        for r in range(sched.pp)
    )


def peak_bytes(rows: np.ndarray, act) -> "np.ndarray | float":
    """max(0, max over rows of Σ_j row_j·a_j), the sum taken left to right over the chunks j.
    ``act`` holds a_j (one plan: a sequence of numbers) or has shape (plans, chunks); the result
    is a float or an array over plans."""
    act = np.asarray(act, dtype=float)
    if rows.shape[0] == 0:
        return 0.0 if act.ndim == 1 else np.zeros(act.shape[0])
    if act.ndim == 1:
        total = rows[:, 0] * act[0]
        for j in range(1, rows.shape[1]):
            total = total + rows[:, j] * act[j]
        return float(max(total.max(), 0.0))
    total = rows[None, :, 0] * act[:, 0, None]
    for j in range(1, rows.shape[1]):
        total = total + rows[None, :, j] * act[:, j, None]
    return np.maximum(total.max(axis=1), 0.0)


def padded_peak_bytes(rows: np.ndarray, act: np.ndarray) -> np.ndarray:
    """:func:`peak_bytes` of every rank at once: ``rows`` (ranks, n, chunks) holds each rank's
    live-count rows, padded with all-zero rows (:func:`meshplan.pipeline.inflight.state_rows`),
    ``act`` (plans, ranks, chunks) each rank's chunk activations in the order of its rows' columns;
    ``rows`` may also be (plans, ranks, n, chunks), rows of each plan's own. The same left-to-right
    sum over the chunks and the floor at 0, so the result, of shape (plans, ranks), equals
    ``peak_bytes`` of each rank's rows to the bit (an all-zero row sums to 0, the floor)."""
    act = np.asarray(act, dtype=float)
    total = rows[..., 0] * act[:, :, None, 0]
    for j in range(1, rows.shape[-1]):
        total = total + rows[..., j] * act[:, :, None, j]
    return np.maximum(total.max(axis=2), 0.0)


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


#: how pipeline ranks advance (``TrainingPlan.pipeline_runtime``): dependency-driven, or torch's
#: 2024 lockstep over its slot grid (:mod:`meshplan.pipeline.lockstep`)
RUNTIMES = ("dependency", "lockstep")


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
    (:mod:`meshplan.pipeline.lockstep`); other schedules run dependency-driven either way."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)} (got {runtime!r})")
    if runtime == "lockstep" and isinstance(ranks, Schedule):
        from meshplan.pipeline.lockstep import runs_lockstep, simulate_lockstep

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
            lines.append(tuple(zip(acts, (ends - dur_arrays[r]).tolist(), ends.tolist())))
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
