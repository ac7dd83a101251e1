"""Side-by-side rows: what torch measured, what meshplan predicts, the difference, the tolerance.

Tolerances are fixed by what each quantity is, never per run:

==========================================  ===========
quantity                                    tolerance
==========================================  ===========
dense FLOPs, attention FLOPs (same          exact
convention), parameter / gradient /
optimizer-state bytes per rank,
collective counts
activations, peak memory                    10 %
collective bytes                            1 %
==========================================  ===========

A row may carry a *known difference*: a named, explained framework behaviour that meshplan's model
deliberately does not describe (for example torch's plain column-parallel TP all-reducing the input
gradient of q, k and v separately where Megatron's fused QKV does it once). Its amount is shown in
its own column and added to meshplan's prediction before the row is judged, so the tolerance
itself never moves; every known difference is listed with its explanation under the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EXACT = 0.0
ACTIVATIONS = 0.10
PEAK = 0.10
COLLECTIVE_BYTES = 0.01


@dataclass(frozen=True)
class KnownDifference:
    """A framework behaviour meshplan's model does not describe, with why."""

    name: str
    explanation: str


@dataclass(frozen=True)
class Row:
    """One compared quantity. ``known`` is the amount of the named known differences (``notes``)
    that the measurement is expected to exceed meshplan's figure by."""

    item: str
    measured: float
    predicted: float
    tolerance: float
    unit: str
    known: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def expected(self) -> float:
        return self.predicted + self.known

    @property
    def difference(self) -> float:
        return self.measured - self.expected

    @property
    def relative(self) -> float:
        """Difference relative to the expected figure (0 when both are 0)."""
        if self.expected == 0:
            return 0.0 if self.measured == 0 else float("inf")
        return self.difference / abs(self.expected)

    @property
    def ok(self) -> bool:
        if self.tolerance == EXACT:
            return self.measured == self.expected
        return abs(self.difference) <= self.tolerance * abs(self.expected)

    @property
    def verdict(self) -> str:
        return "ok" if self.ok else "BEYOND"

    def to_dict(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "measured": self.measured,
            "predicted": self.predicted,
            "known_difference": self.known,
            "expected": self.expected,
            "difference": self.difference,
            "relative": self.relative if self.expected or not self.measured else None,
            "tolerance": self.tolerance,
            "unit": self.unit,
            "notes": list(self.notes),
            "verdict": self.verdict,
        }


@dataclass
class Comparison:
    """The rows of one ``meshplan verify`` command, with what was run and the known differences."""

    kind: str  # flops | memory | comm
    title: str
    rows: list[Row] = field(default_factory=list)
    known: dict[str, KnownDifference] = field(default_factory=dict)
    setup: dict[str, Any] = field(default_factory=dict)  # what torch ran: model, shapes, plan

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.ok]

    def add(self, row: Row, *known: KnownDifference) -> Row:
        for k in known:
            self.known.setdefault(k.name, k)
        self.rows.append(row)
        return row

    def row(self, item: str) -> Row:
        """The row named ``item`` (KeyError when absent)."""
        for r in self.rows:
            if r.item == item:
                return r
        raise KeyError(item)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "title": self.title,
            "ok": self.ok,
            "setup": self.setup,
            "rows": [r.to_dict() for r in self.rows],
            "known_differences": {k: v.explanation for k, v in self.known.items()},
        }
