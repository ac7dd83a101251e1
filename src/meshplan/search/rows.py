"""Rows of a plan table coded as integers, so that a term is computed once per distinct row of
what it depends on and gathered per plan (:mod:`meshplan.search.engine`).

A row of small non-negative integer columns is coded in mixed radix (each column a digit,
:func:`digit`); the distinct codes, in increasing order, number the distinct rows
(:func:`distinct`), by a table over the codes where they are small, else by a sort. Every
function keeps the order of the rows, so a computation over distinct rows gathered back gives
each plan the value of its own row, to the bit.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np


def gather(fn: Callable[..., tuple], keys: list[np.ndarray], n_out: int) -> np.ndarray:
    """fn(*key) for every row of the stacked ``keys``, computed once per distinct row:
    an array (rows, n_out)."""
    values, inverse = gather_distinct(fn, keys, n_out)
    return values[inverse]


def ranks(code: np.ndarray) -> tuple[np.ndarray, int]:
    """Per entry of a non-negative integer code, the number of its value among the distinct values
    in increasing order, and how many there are. A table over 0 .. max(code) when that is no
    longer than a few times the entries (the codes of a plan table are small), else a sort."""
    n = len(code)
    top = int(code.max(initial=-1)) + 1
    if top > 4 * n + 65536:
        values, inverse = np.unique(code, return_inverse=True)
        return inverse.ravel(), len(values)
    present = np.zeros(top, dtype=bool)
    present[code] = True
    number = np.cumsum(present, dtype=np.int64)
    return (number - 1).take(code), int(number[-1]) if top else 0


def distinct(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of a non-negative integer code, in increasing order: one index holding
    each, and per entry the number of its value (:func:`ranks`)."""
    inverse, count = ranks(code)
    where = np.empty(count, dtype=np.int64)
    where[inverse] = np.arange(len(code))  # any entry of a value holds it
    return where, inverse


def digit(col: np.ndarray) -> tuple[np.ndarray, int]:
    """A column's digit in a mixed-radix code, and its radix: the value less the column's minimum
    when the values span at most 64, else the rank of the value among the column's distinct values
    (both keep the order)."""
    col = np.asarray(col, dtype=np.int64)
    low = int(col.min(initial=0))
    span = int(col.max(initial=0)) - low + 1
    if span <= 64:
        return (col - low if low else col), span
    return ranks(col - low if low else col)


def code_rows(digits: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct` of the rows of stacked columns given by their :func:`digit` values (or
    any codes 0 .. radix − 1 that keep the order), through their mixed-radix code, renumbered
    whenever it would outgrow :func:`distinct`'s table (renumbering keeps the order: the same
    rows, in the same order)."""
    code = np.zeros(len(digits[0][0]), dtype=np.int64)
    radix = 1
    table = 4 * len(code) + 65536
    for digit, size in digits:
        if radix > 1 and radix * size > table:  # renumber the codes so far: a table pass, not a sort
            code, radix = ranks(code)
        if radix > 1:
            code *= size  # in place: code is this function's own array
            code += digit
        else:
            code = digit.astype(np.int64, copy=True)
        radix *= size
    return distinct(code)


def distinct_rows(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct` of the rows of the stacked integer columns ``keys``."""
    return code_rows([digit(col) for col in keys])


class Digits:
    """The :func:`digit` of each named column of a table, computed once and shared by every key
    built from the columns."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.columns, self._digits = columns, {}

    def digit(self, name: str) -> tuple[np.ndarray, int]:
        """The column's :func:`digit`."""
        if name not in self._digits:
            self._digits[name] = digit(self.columns[name])
        return self._digits[name]

    def rows(self, names: str) -> tuple[np.ndarray, np.ndarray]:
        """:func:`distinct_rows` of the columns ``names`` (space-separated)."""
        return code_rows([self.digit(name) for name in names.split()])


def gather_distinct(fn: Callable[..., tuple], keys: list[np.ndarray], n_out: int,
                     rows: Optional[tuple[np.ndarray, np.ndarray]] = None) -> tuple[np.ndarray, np.ndarray]:
    """fn(*key) once per distinct row of the stacked ``keys``: the values (distinct rows, n_out)
    and, per row, the index of its distinct row (``rows``: the keys' :func:`distinct_rows` when
    known)."""
    where, inverse = distinct_rows(keys) if rows is None else rows
    args = np.stack([np.asarray(k)[where] for k in keys], axis=1).tolist()
    values = np.array([fn(*row) for row in args], dtype=float).reshape(len(args), n_out)
    return values, inverse


def slices_by(values: np.ndarray) -> dict:
    """Per value of the sorted ``values``, the slice of its entries."""
    cuts = (np.flatnonzero(np.diff(values)) + 1).tolist()
    return {int(values[lo]): slice(lo, hi) for lo, hi in zip([0, *cuts], [*cuts, len(values)])}
