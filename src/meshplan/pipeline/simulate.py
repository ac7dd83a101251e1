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


@lru_cache(maxsize=256)
def _compile(ranks: tuple[tuple[Action, ...], ...], n_stages: int):
    """Per rank, each action as (own slot, dependency slot or −1, is_forward, stage, transfer?).

    Slots number the (kind, stage, micro-batch) triples so the simulation works on flat lists."""
    slot: dict[tuple[str, int, int], int] = {}
    for acts in ranks:
        for a in acts:
            slot.setdefault((a.kind, a.stage, a.microbatch), len(slot))
    last = n_stages - 1

    def grad_from(stage: int, mb: int) -> int:
        """Slot of the action that produces the input gradient of ``stage`` (B or I)."""
        got = slot.get(("B", stage, mb))
        return slot.get(("I", stage, mb), -2) if got is None else got

    compiled = []
    for acts in ranks:
        row = []
        for a in acts:
            own = slot[(a.kind, a.stage, a.microbatch)]
            if a.kind == "F":
                dep = slot.get(("F", a.stage - 1, a.microbatch), -2) if a.stage > 0 else -1
                row.append((own, dep, "F", a.stage, a.stage > 0))
            elif a.kind == "W":
                row.append((own, slot.get(("I", a.stage, a.microbatch), -2), "W", a.stage, False))
            elif a.kind in ("B", "I"):
                if a.stage == last:
                    dep = slot.get(("F", a.stage, a.microbatch), -2)
                else:
                    dep = grad_from(a.stage + 1, a.microbatch)
                row.append((own, dep, a.kind, a.stage, a.stage != last))
            else:
                raise ValueError(f"unknown action kind {a.kind!r}")
        compiled.append(tuple(row))
    return tuple(compiled), len(slot)


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
    """Run the action lists; ``fwd[k]``/``bwd[k]`` are stage k's durations per micro-batch and
    ``wgt[k]`` the weight-gradient part of ``bwd[k]`` (used by split backwards; default half)."""
    ranks = tuple(tuple(acts) for acts in ranks)
    compiled, n_slots = _compile(ranks, n_stages)
    pp = len(ranks)
    w_t = list(wgt) if wgt is not None else [x / 2 for x in bwd]
    dur = {"F": fwd, "B": bwd, "W": w_t, "I": [b - w for b, w in zip(bwd, w_t)]}
    done = [-1.0] * n_slots  # finish time; −1 = not yet run
    pos = [0] * pp
    free = [0.0] * pp
    lines: list[list[tuple[Action, float, float]]] = [[] for _ in range(pp)]
    remaining = sum(len(a) for a in compiled)
    progressed = True
    while remaining and progressed:
        progressed = False
        for r in range(pp):
            row = compiled[r]
            i, t_free = pos[r], free[r]
            while i < len(row):
                own, dep, kind, stage, xfer = row[i]
                if dep == -1:
                    ready = 0.0
                else:
                    if dep < 0 or done[dep] < 0.0:
                        break
                    ready = done[dep] + transfer if xfer else done[dep]
                start = t_free if t_free > ready else ready
                t_free = start + dur[kind][stage]
                done[own] = t_free
                if keep_timeline:
                    lines[r].append((ranks[r][i], start, t_free))
                i += 1
            if i != pos[r]:
                remaining -= i - pos[r]
                pos[r], free[r] = i, t_free
                progressed = True
    if remaining:
        raise RuntimeError("pipeline schedule deadlocked: an action waits on one that never runs")
    busy, peaks, peak_bytes = [], [], []
    for r in range(pp):
        b = mem = peak_mem = 0.0
        held = peak = 0
        for _, _, kind, stage, _ in compiled[r]:
            w = act_bytes[stage] if act_bytes else 0.0
            b += dur[kind][stage]
            if kind == "F":
                held += 1
                mem += w
                if held > peak:
                    peak = held
                if mem > peak_mem:
                    peak_mem = mem
            elif kind in ("B", "W"):  # I keeps the activations: W still needs them
                held -= 1
                mem -= w
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


def zbh1_makespan(pp: int, m: int, f: float, b: float, w: float) -> float | None:
    """ZB-H1 with equal stages and free transfers, backward b = i + w split into input gradient i
    and weight gradient w: m·(f + b) + (p − 1)·(f + i − w) (Qi et al. 2024, Sec. 3.1: the bubble
    of 1F1B, (p − 1)·(f + b), shrinks by 2w per stage). It holds when m ≥ p and w ≤ i — the W's
    then fit in the drain's gaps; ``None`` otherwise (the simulation is then the answer)."""
    i = b - w
    if m < pp or w > i:
        return None
    return m * (f + b) + (pp - 1) * (f + i - w)
