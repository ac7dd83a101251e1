"""The activation peak of every plan of a pipeline shape, and the rank that has it.

Per schedule, its live micro-batch counts (:mod:`meshplan.pipeline.inflight`) times each stage's
activations give every rank's peak (:func:`meshplan.pipeline.simulate.padded_peak_bytes`); ranks
that hold the same stages form a class, and each plan's peak and worst rank come from the
classes' maxima (:func:`peak_rank`).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from meshplan.pipeline.inflight import distinct_state_rows
from meshplan.pipeline.simulate import padded_peak_bytes


#: padded live-count products (pairs × ranks × rows × chunks) small enough for one call
ONE_CALL = 1 << 16


def peak_rank(stored: np.ndarray, pair_inv: np.ndarray, cls_of: np.ndarray, cls_ranks: list[np.ndarray],
               fixed: np.ndarray, working: np.ndarray, other: np.ndarray,
               merged: Optional[np.ndarray] = None, kept: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """Per plan: the largest rank total ((w + g + o) + (activations + working)) + other items and
    the first rank that has it, as ``estimate``'s maximum over ranks; ``stored`` (pairs × ranks)
    holds the activation peaks, ``pair_inv`` each plan's pair, ``cls_of`` each rank's class,
    ``cls_ranks`` each class's ranks, ``fixed`` and ``other`` the classes' terms (classes ×
    plans) and ``working`` each plan's. ``kept`` (classes × plans): the last stage's kept
    outputs beyond those in flight (:func:`meshplan.cost.compose.kept_outputs_bytes`), the other
    items' last, added to them. ``merged`` (classes × plans, −inf where it does not apply): the other items of a second moment without activations, the step's end of a
    pipeline that returns its outputs (:func:`meshplan.cost.compose.merged_outputs_items`); a
    rank's total is the larger of the two, and where the second wins, every rank of the class
    has it and the class's first rank is the first to.

    Rounding to nearest is monotone, so a rank's total never decreases with its activations s:
    within a class, whose ranks share the other terms, the largest total is that of the largest
    activations M_c, first reached on the first rank holding M_c, and the plan's worst rank is the
    first such rank among the classes that reach the peak. A rank with s < M_c ties only if
    rounding closes the gap: each of the three roundings moves a difference by at most two ulps of
    the largest intermediate magnitude u (one ulp per operand, two across a binade edge), so a gap
    M_c − s above 6 ulp(u) keeps the totals apart. Plans where some class's gap is within 8 ulp(u)
    are taken rank by rank (tests/test_search_screen.py drives both ways)."""
    S = stored.T  # (ranks, pairs)
    top, first = np.empty((len(cls_ranks), S.shape[1])), np.empty((len(cls_ranks), S.shape[1]), dtype=np.int64)
    gap = np.full(S.shape[1], np.inf)  # per pair: the smallest gap below a class's largest activations
    for ci, ranks in enumerate(cls_ranks):
        part = S[ranks]
        top[ci] = part.max(axis=0)
        if len(ranks) > 1:
            first[ci] = ranks[(part == top[ci]).argmax(axis=0)]
            gap = np.minimum(gap, top[ci] - np.where(part < top[ci], part, -np.inf).max(axis=0))
        else:
            first[ci] = ranks[0]
    inner = fixed + (np.take(top, pair_inv, axis=1) + working)
    if kept is not None:
        other = other + kept
    totals = inner + other
    first = np.take(first, pair_inv, axis=1)
    if merged is not None:
        at_end = fixed + merged
        end_wins = at_end > totals
        totals = np.where(end_wins, at_end, totals)
        first = np.where(end_wins, np.array([r.min() for r in cls_ranks])[:, None], first)
    peak = totals.max(axis=0)
    worst = np.where(totals == peak, first, len(cls_of)).min(axis=0)
    # inner sums non-negative terms: its largest entry is the largest intermediate magnitude
    close = np.flatnonzero(gap[pair_inv] <= 8 * np.spacing(np.maximum(peak, inner.max(axis=0))))
    if len(close):
        by_rank = (fixed[cls_of][:, close] + (stored[pair_inv[close]].T + working[close])) + other[cls_of][:, close]
        if merged is not None:
            by_rank = np.maximum(by_rank, fixed[cls_of][:, close] + merged[cls_of][:, close])
        worst[close] = by_rank.argmax(axis=0)
    return peak, worst


def memory_microbatches(schedule: str, pp: int, m: np.ndarray) -> np.ndarray:
    """Micro-batch counts with the same live-count structure as ``m``: the schedule's steady state
    repeats, so every m ≥ 2p (for the interleaved schedules: every multiple of p from 2p on, whose
    rounds are p long) holds the same undominated live counts, peak and last action per rank as
    m = 2p (asserted over a grid in tests/test_search.py). GPipe holds all m micro-batches: kept."""
    if schedule == "gpipe":
        return m
    same = m >= 2 * pp
    if schedule in ("interleaved", "interleaved-zb"):
        same &= m % pp == 0
    return np.where(same, 2 * pp, m)


def pair_peaks(rows: np.ndarray, m_inv: np.ndarray, act_pairs: np.ndarray, pp: int, v: int) -> np.ndarray:
    """Every rank's activation peak (pairs × ranks) per (micro-batch count, kernel row) pair:
    ``rows`` (counts × ranks × rows × chunks) the live counts of each distinct count
    (:func:`meshplan.pipeline.inflight.state_rows_many`), ``m_inv`` each pair's count, ``act_pairs``
    (pairs × ranks × chunks) each pair's stage activations per rank's chunk. Small products in one
    call; larger ones per count, its distinct rows only (repeats and padding dropped). The counts
    are made doubles (exact: small integers) before they are gathered per pair, so that the
    products do not convert them again."""
    n_pairs, n_counts = len(act_pairs), rows.shape[0]
    if rows.shape[2] * n_pairs * pp * v <= ONE_CALL:  # small: every pair at once
        return padded_peak_bytes(rows.astype(float)[m_inv], act_pairs)
    if rows.shape[2] > 8 and n_pairs > 8 * n_counts:  # worth dropping the repeats
        rows = distinct_state_rows(rows)
    held = rows.any(axis=(1, 3))  # (counts, n): the rows some rank holds
    n_held = held.shape[1] - np.argmax(held[:, ::-1], axis=1)
    rows = rows.astype(float)
    stored = np.empty((n_pairs, pp))
    for i in range(n_counts):
        sel = np.flatnonzero(m_inv == i) if n_counts > 1 else slice(None)
        stored[sel] = padded_peak_bytes(rows[i, :, : n_held[i]], act_pairs[sel])
    return stored
