"""Micro-batches alive on a pipeline rank, walked from its action list, and the activation peak
they give.

Walking a rank's list, an F adds a micro-batch to its chunk, a B frees it (or the W when the
backward is split: the weight gradient still needs the saved layer inputs; an I keeps it). The
peak activation memory of the rank is the largest Σ_j live_j·a_j over the walk, a_j the activation
bytes of the rank's chunk j: only the rows of live counts that no other row exceeds in every chunk
can hold it (:func:`live_count_peaks`), and :func:`peak_bytes` takes the peak over them. The
closed forms of the looped schedules give the same rows without the walk
(:mod:`meshplan.pipeline.inflight`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from meshplan.pipeline.schedules import Schedule


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
