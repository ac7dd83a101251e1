"""Event simulation of a pipeline schedule with per-stage durations and transfer times.

Each rank runs its action list in order. An action starts when its rank is free and its
inputs have arrived:

* ``F(k, j)`` needs ``F(k−1, j)`` finished plus the transfer time from stage k−1 to k;
* ``B(k, j)`` needs ``B(k+1, j)`` finished plus the transfer time back (the last stage's B needs
  only its own F, which precedes it on the rank).

The makespan is the latest finish. Per rank: busy time (sum of its durations), idle time
(makespan − busy: the bubble, including waits for transfers), and the peak activation memory,
found by walking the rank's list: an F adds the stage's activation bytes, a B frees them.
"""

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


def simulate(
    ranks: list[list[Action]],
    n_stages: int,
    fwd: list[float],
    bwd: list[float],
    transfer: float = 0.0,
    act_bytes: list[float] | None = None,
    keep_timeline: bool = False,
) -> SimResult:
    """Run the action lists; ``fwd[k]``/``bwd[k]`` are stage k's durations per micro-batch."""
    pp = len(ranks)
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * pp
    free = [0.0] * pp
    lines: list[list[tuple[Action, float, float]]] = [[] for _ in range(pp)]
    remaining = sum(len(a) for a in ranks)
    last = n_stages - 1
    progressed = True
    while remaining and progressed:
        progressed = False
        for r in range(pp):
            acts = ranks[r]
            while pos[r] < len(acts):
                a = acts[pos[r]]
                if a.kind == "F":
                    if a.stage == 0:
                        ready = 0.0
                    else:
                        dep = done.get(("F", a.stage - 1, a.microbatch))
                        if dep is None:
                            break
                        ready = dep + transfer
                    dur = fwd[a.stage]
                else:
                    if a.stage == last:
                        dep = done.get(("F", a.stage, a.microbatch))
                        if dep is None:
                            break
                        ready = dep
                    else:
                        dep = done.get(("B", a.stage + 1, a.microbatch))
                        if dep is None:
                            break
                        ready = dep + transfer
                    dur = bwd[a.stage]
                start = max(free[r], ready)
                end = start + dur
                done[(a.kind, a.stage, a.microbatch)] = end
                free[r] = end
                if keep_timeline:
                    lines[r].append((a, start, end))
                pos[r] += 1
                remaining -= 1
                progressed = True
    if remaining:
        raise RuntimeError("pipeline schedule deadlocked: an action waits on one that never runs")
    busy = []
    peaks = []
    peak_bytes = []
    for r in range(pp):
        b = 0.0
        held = peak = 0
        mem = peak_mem = 0.0
        for a in ranks[r]:
            if a.kind == "F":
                b += fwd[a.stage]
                held += 1
                mem += act_bytes[a.stage] if act_bytes else 0.0
            else:
                b += bwd[a.stage]
                held -= 1
                mem -= act_bytes[a.stage] if act_bytes else 0.0
            peak = max(peak, held)
            peak_mem = max(peak_mem, mem)
        busy.append(b)
        peaks.append(peak)
        peak_bytes.append(peak_mem)
    return SimResult(
        makespan=max(free),
        finish=tuple(free),
        busy=tuple(busy),
        peak_inflight=tuple(peaks),
        peak_activation=tuple(peak_bytes),
        timeline=tuple(tuple(l) for l in lines) if keep_timeline else None,
    )


def uniform_makespan(schedule: str, pp: int, m: int, vpp: int, f: float, b: float) -> float:
    """Closed form for equal stages and free transfers: (m + p − 1)·(f + b) for GPipe and 1F1B,
    (m·v + p − 1)·(f + b) for interleaved with per-chunk times f, b (Narayanan et al. 2021)."""
    if schedule == "interleaved":
        return (m * vpp + pp - 1) * (f + b)
    return (m + pp - 1) * (f + b)
