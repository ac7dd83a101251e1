"""Micro-batches held per chunk by each pipeline rank, in closed form for the looped schedules.

The memory peak of a rank is max over its states of Σ_j live_j·a_j (live_j micro-batches held by
chunk j, a_j that chunk's activation bytes; :func:`meshplan.pipeline.live.peak_bytes`). The
simulator finds the states by walking the rank's action list; for the schedules built by
:func:`meshplan.pipeline.schedules._looped` — 1F1B, interleaved 1F1B, ZB-H1 and interleaved
zero bubble — the states that can hold the peak follow from the schedule's arithmetic.

Rank r of p runs n_F = m·v forwards; the k-th forward uses chunk ⌊k/q⌋ mod v (q micro-batches a
round), the k-th backward frees chunk v − 1 − (⌊k/q⌋ mod v). After n forwards chunk j has received

    F_j(n) = ⌊n/(q·v)⌋·q + clip(n mod (q·v) − j·q, 0, q)

micro-batches, and after n releases it has lost F_{v−1−j}(n). The rank warms up with
w_r = min((v − 1)·q + f·(p − 1 − r), m·v) forwards (f = 2 for interleaved 1F1B, else 1), then
step b = 0, 1, …, m·v − w_r − 1 runs F(w_r + b), then the backward b, then (split backwards only)
the weight gradient W(b − r) when b ≥ r. Activations are freed by B, or by W when the backward is
split (Qi et al. 2024: W still needs the layer inputs). Counts only grow in the warm-up and only
shrink in the drain, so every state is dominated by one right after a steady-state forward:

    row_b = F(w_r + b + 1) − F^rev(ρ_b),   ρ_b = b (B frees) or max(0, b − r) (W frees),

or, when the warm-up takes all m·v forwards, the single row F(m·v). Only one period of b is
needed: F(n + q·v) = F(n) + q in every chunk, so row_{b+q·v} = row_b once ρ grows with b; and
while ρ_b = 0 (b < r, split backwards) each row is dominated by the next. GPipe holds all m
micro-batches of its one chunk at once. Rows that another row equals or exceeds in every chunk are
dropped; what is left equals the simulator's undominated rows (tests assert it over a grid of p, m,
v).

ZBV (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", Sec. 6, Fig. 8; torch's
``ScheduleZBVZeroBubble``) puts stages s₀ = r and s₁ = 2p − 1 − r on rank r and is built for
n = max(m, 2p − 1) micro-batches, the actions of micro-batches j ≥ m dropped
(:func:`meshplan.pipeline.schedules._zbv`). An F adds to its chunk, a W frees (I keeps the
activations), so with f_c and w_c the forwards and W's of chunk c run so far, the live counts are

    c_c = min(f_c, m) − min(w_c, m).

Warm-up: 2(p − r) − 1 forwards of s₀, then r pairs F(s₁), F(s₀): counts only grow, to
(min(2p − 1 − r, m), min(r, m)). Then p − r triples F(s₁) I(s₁) W(s₁); right after the i-th F,
c₁ = min(r + i + 1, m) − min(i, m) ≤ min(r + 1, m), so the first is largest:

    P = (min(2p − 1 − r, m), min(r + 1, m)).

Steady state, k = 0 … n − p − 1 (none when n = p): F(s₀) (while f₀ < n) I(s₀) W(s₀), then
F(s₁) I(s₁) W(s₁), with f₀ = 2p − 1 − r + k, w₀ = k, f₁ = p + k, w₁ = p − r + k at the start.
The states right after the two forwards are

    A_k = (min(2p − r + k, m) − k,      min(p + k, m) − min(p − r + k, m)),
    B_k = (min(2p − r + k, m) − k − 1,  min(p + k + 1, m) − min(p − r + k, m)),

every other state of the step lying below one of them or below A_{k+1}. Each component of A_k
and B_k is non-increasing in k (min(a + k, m) − k and min(a + k, m) − min(b + k, m) with a ≥ b
are), so A₀ and B₀ dominate the steady state. The cool-down runs only I's and W's and frees.
The undominated rows of rank r are therefore those of {P, A₀, B₀} (P alone when n = p), in the
order the walk meets them.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from meshplan.pipeline.live import live_count_peaks
from meshplan.pipeline.schedules import Schedule, check_vpp, compile_schedule, rounds_of, stage_style
from meshplan.pipeline.stages import stages_of_rank

#: schedule → (warm-up factor f, backward split) for the schedules built by ``_looped``
LOOPED = {"1f1b": (1, False), "interleaved": (2, False), "zbh1": (1, True), "interleaved-zb": (1, True)}
#: schedules whose live counts :func:`live_rows` gives in closed form
CLOSED_FORM = frozenset(LOOPED) | {"gpipe", "zbv"}


def forwards_per_chunk(n: np.ndarray, q: int, v: int) -> np.ndarray:
    """F_j(n) for every chunk j (last axis) of every n: ⌊n/(q·v)⌋·q + clip(n mod (q·v) − j·q, 0, q)."""
    n = np.asarray(n, dtype=np.int64)[..., None]
    j = np.arange(v, dtype=np.int64)
    return (n // (q * v)) * q + np.minimum(np.maximum(n % (q * v) - j * q, 0), q)


def undominated(rows: np.ndarray) -> np.ndarray:
    """The rows of ``rows`` that no other row exceeds or equals in every column (of equal rows the
    first is kept), in their order."""
    if len(rows) <= 1:
        return rows
    ge = (rows[None, :, :] >= rows[:, None, :]).all(axis=2)  # ge[i, j]: row j >= row i
    earlier = np.tri(len(rows), k=-1, dtype=bool)  # earlier[i, j]: j < i
    dominated = (ge & (~ge.T | earlier)).any(axis=1)
    return rows[~dominated]


def _looped_rows_many(name: str, pp: int, ms, vpp: int) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's state rows right after a steady-state forward (module docstring) for each
    micro-batch count of ``ms``, as one array (len(ms), p, n, v) over counts, ranks, steps b and
    chunks, zero where a rank runs no step, and the mask (len(ms), p, n) of the steps each rank
    runs (n the longest period of the counts; a shorter one's extra steps are masked off).

    With one chunk (v = 1, q = m) F(n) = n for n ≤ m, so the count after step b is
    min(w_r + b + 1, m) − ρ_b, which never grows once ρ_b grows with b: from the first step on when
    B frees (ρ_b = b), and from b = r on when W frees (ρ_b = max(0, b − r); the first step is
    b = min(r, n_st − 1), the last one when n_st ≤ r). The first step's row is then the largest,
    and the only one returned. F of every count 0 … m·v is tabulated once and looked up."""
    factor, split = LOOPED[name]
    v = vpp
    m = np.asarray(ms, dtype=np.int64).reshape(-1, 1, 1)  # (M, 1, 1)
    q = np.array([rounds_of(pp, x) if v > 1 else x for x in m.ravel().tolist()], dtype=np.int64).reshape(m.shape)
    total = m * v
    r = np.arange(pp, dtype=np.int64)[None, :, None]  # (1, p, 1)
    warm = np.minimum((v - 1) * q + factor * (pp - 1 - r), total)  # (M, p, 1)
    n_st = np.maximum(total - warm, 1)  # a warm-up of all m·v forwards leaves the row b = 0
    first = np.minimum(r, n_st - 1) if split else np.zeros_like(warm)
    period = np.minimum(q * v, total) if v > 1 else np.ones_like(total)  # (M, 1, 1): the steps of one period
    step = np.arange(int(period.max(initial=0)), dtype=np.int64)
    b = first + step  # (M, p, n): step numbers
    keep = (b < n_st) & (step < period)
    n_fwd = np.minimum(warm + b + 1, total)
    freed = np.minimum(np.maximum(0, b - r) if split else b, total)
    n_counts = int(total.max(initial=0)) + 1  # every n_fwd and ρ_b
    counts = np.arange(n_counts, dtype=np.int64)
    table = forwards_per_chunk(counts[None, :], q[:, :, 0, None], v).reshape(-1, v)  # F_j(n) per (count, n)
    base = np.arange(len(m), dtype=np.int64)[:, None, None] * n_counts
    at = np.nonzero(keep)  # only the steps run (counts of shorter periods leave padding)
    rows = np.zeros(keep.shape + (v,), dtype=np.int64)
    rows[at] = table[(base + n_fwd)[at]] - table[(base + freed)[at]][:, ::-1]
    return rows, keep  # (M, p, n, v), the steps not run zero


def _looped_rows(name: str, pp: int, m: int, vpp: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_looped_rows_many` of the one count m: (p, n, v) and the mask (p, n)."""
    rows, keep = _looped_rows_many(name, pp, [m], vpp)
    return rows[0], keep[0]


def looped_live_rows(name: str, pp: int, m: int, vpp: int) -> tuple[np.ndarray, ...]:
    """Per rank, the undominated live-count rows (chunks in increasing stage order) of schedule
    ``name`` (one of :data:`LOOPED`), from the closed form of the module docstring."""
    rows, keep = _looped_rows(name, pp, m, vpp)
    if vpp == 1:  # one chunk: the largest count
        top = np.where(keep, rows[..., 0], -1).max(axis=1)
        return tuple(np.array([[x]], dtype=np.int64) for x in top.tolist())
    return tuple(undominated(rows[i][keep[i]]) for i in range(pp))


def _zbv_rows_many(pp: int, ms) -> tuple[np.ndarray, np.ndarray]:
    """The rows P, A₀, B₀ of ZBV (module docstring) of every rank for each micro-batch count of
    ``ms``, as one array (len(ms), p, 3, 2), and the mask (len(ms), p, 3) of those a rank has (P
    alone when n = max(m, 2p − 1) equals p)."""
    p = pp
    m = np.asarray(ms, dtype=np.int64).reshape(-1, 1)  # (M, 1)
    r = np.arange(p, dtype=np.int64)[None, :]
    top0 = np.minimum(2 * p - r, m)
    low = np.minimum(p - r, m)
    rows = np.stack([
        np.stack([np.minimum(2 * p - 1 - r, m), np.minimum(r + 1, m)], axis=-1),
        np.stack([top0, np.minimum(p, m) - low], axis=-1),
        np.stack([top0 - 1, np.minimum(p + 1, m) - low], axis=-1),
    ], axis=-2)
    keep = np.zeros((len(m), p, 3), dtype=bool)
    keep[:, :, 0] = True
    keep[:, :, 1:] = (np.maximum(m, 2 * p - 1) > p)[:, :, None]
    return rows, keep


def _zbv_rows(pp: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_zbv_rows_many` of the one count m: (p, 3, 2) and the mask (p, 3)."""
    rows, keep = _zbv_rows_many(pp, [m])
    return rows[0], keep[0]


def zbv_live_rows(pp: int, m: int) -> tuple[np.ndarray, ...]:
    """Per rank r, the undominated live-count rows (c₀ of stage r, c₁ of stage 2p − 1 − r) of ZBV:
    those of P, A₀, B₀ of the module docstring, P alone when n = max(m, 2p − 1) equals p."""
    rows, keep = _zbv_rows(pp, m)
    return tuple(undominated(rows[r][keep[r]]) for r in range(pp))


def state_rows(name: str, pp: int, m: int, vpp: int) -> np.ndarray:
    """Every rank's candidate live-count rows as one array (p, n, v), chunks in increasing stage
    order, rows a rank lacks all zero: the closed forms' rows before the dominated ones are dropped
    (for one chunk, only the largest count), so a superset of each rank's :func:`live_rows`, computed
    for all ranks at once. The peak max_rows Σ_j row_j·a_j over them equals the peak over
    :func:`live_rows` to the bit: with a_j ≥ 0, a row that another equals or exceeds in every chunk
    sums to no more (rounded products and sums are monotone in their operands), and an all-zero
    row sums to 0, the floor of :func:`meshplan.pipeline.live.peak_bytes`. Dropping the
    dominated rows costs O(n²) per rank, more than the rows it saves (half of one period are
    repeats, none dominated), so they stay."""
    return state_rows_many(name, pp, [m], vpp)[0]


def state_rows_many(name: str, pp: int, ms, vpp: int) -> np.ndarray:
    """:func:`state_rows` of every micro-batch count of ``ms`` at once, as one array
    (len(ms), p, n, v), each count's rows padded with all-zero rows to the longest (which, as
    :func:`state_rows` says, leaves every peak unchanged to the bit). The closed forms are
    evaluated on all counts together; other schedules walk each count."""
    ms = [int(x) for x in ms]
    if name == "gpipe":
        return np.broadcast_to(np.array(ms, dtype=np.int64)[:, None, None, None], (len(ms), pp, 1, 1)).copy()
    if name in LOOPED:
        rows, keep = _looped_rows_many(name, pp, ms, vpp)
        if vpp == 1:  # one chunk: the largest count
            return np.where(keep, rows[..., 0], -1).max(axis=2)[:, :, None, None]
        return rows  # the steps a rank does not run are zero
    if name == "zbv":
        check_vpp(name, vpp)
        rows, keep = _zbv_rows_many(pp, ms)
        return np.where(keep[..., None], rows, 0)
    each = [live_rows(name, pp, m, vpp) for m in ms]
    out = np.zeros((len(ms), pp, max(len(x) for e in each for x in e), vpp), dtype=np.int64)
    for i, e in enumerate(each):
        for r, x in enumerate(e):
            out[i, r, : len(x)] = x
    return out


def last_stage_live_peaks(rows: np.ndarray, name: str, pp: int, vpp: int) -> np.ndarray:
    """Per micro-batch count of :func:`state_rows_many`'s ``rows`` (counts, p, n, v): the largest
    number of micro-batches the pipeline's last stage holds in flight, its column (the rank's
    last chunk, chunks in increasing stage order) on the rank that runs it (p − 1; rank 0 for V
    schedules). For 1F1B 1, for GPipe m (:func:`meshplan.cost.compose.kept_outputs_bytes`)."""
    n_stages = pp * vpp
    r = next(r for r in range(pp) if n_stages - 1 in stages_of_rank(r, pp, vpp, stage_style(name)))
    return rows[:, r, :, -1].max(axis=1)


def distinct_state_rows(rows: np.ndarray) -> np.ndarray:
    """The rows of ``rows`` (..., n, v), such as :func:`state_rows_many` gives, without repeats and
    all-zero rows: each list's distinct non-zero rows (in increasing order of their code
    Σ_j row_j·K^j), then all-zero rows, cut to the longest list (at least one row). A repeated row
    sums to the same Σ_j row_j·a_j and an all-zero row to 0, the floor of the peak, so the peak
    over the result is the one over ``rows``, to the bit; the looped schedules repeat about half of
    a period's rows. Returned unchanged when the codes would not fit in 63 bits."""
    v = rows.shape[-1]
    radix = int(rows.max(initial=0)) + 1
    if rows.shape[-2] <= 1 or rows.min(initial=0) < 0 or v * math.log2(radix) >= 62:
        return rows
    code = rows[..., 0].copy()
    for j in range(1, v):
        code = code * radix + rows[..., j]
    order = np.argsort(code, axis=-1, kind="stable")
    ranked = np.take_along_axis(code, order, axis=-1)
    fresh = ranked != 0
    fresh[..., 1:] &= ranked[..., 1:] != ranked[..., :-1]
    slot = np.cumsum(fresh, axis=-1) - 1
    k = max(1, int(slot[..., -1].max(initial=0)) + 1)
    out = np.zeros(rows.shape[:-2] + (k, v), dtype=rows.dtype)
    at = np.nonzero(fresh)
    lead = at[:-1]
    out[lead + (slot[at],)] = rows[lead + (order[at],)]
    return out


@lru_cache(maxsize=4096)
def live_rows(name: str, pp: int, m: int, vpp: int) -> tuple[np.ndarray, ...]:
    """Per rank, undominated live-count rows over the rank's chunks in increasing stage order:
    closed forms for GPipe, the looped schedules and ZBV (cached); the simulator's walk for any
    other schedule."""
    if name == "gpipe":
        return tuple(np.array([[m]], dtype=np.int64) for _ in range(pp))
    if name in LOOPED:
        return looped_live_rows(name, pp, m, vpp)
    if name == "zbv":
        check_vpp(name, vpp)
        return zbv_live_rows(pp, m)
    sched = compile_schedule(name, pp, m, vpp)
    return tuple(rows for _, rows, _ in live_count_peaks(sched, pp * vpp))


def schedule_live_counts(sched: Schedule, n_stages: int) -> tuple[tuple[np.ndarray, np.ndarray, int], ...]:
    """:func:`meshplan.pipeline.live.live_count_peaks`, from the closed forms of this module when
    ``sched`` is a compiled GPipe, looped or ZBV schedule (the peak count is the largest row sum: the
    row with it is never dominated), else by walking the action lists."""
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
