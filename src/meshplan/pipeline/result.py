"""The outcome of a pipeline schedule's run: :class:`SimResult`, what both simulators return
(:mod:`meshplan.pipeline.simulate`, dependency-driven, and :mod:`meshplan.pipeline.lockstep`, slot
by slot)."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.pipeline.schedules import Action


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
