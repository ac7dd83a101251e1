"""Pipeline schedules as ordered action lists per rank.

An action is ``(kind, stage, microbatch)`` with kind ``F`` (forward), ``B`` (whole backward), or
for split backwards ``I`` (input gradient) and ``W`` (weight gradient), and ``stage`` the virtual
stage (0 ≤ stage < p·v). Rank r runs its list in order. Lists read and print in
torch.distributed.pipelining's notation, ``{stage}{F|I|W|B}{microbatch}``: ``0F0``, ``1I3``,
``2W1``, one comma-separated row per rank (its communication and resharding actions, which
meshplan's simulator models as transfer times, are skipped when read).

* GPipe (Huang et al. 2019): all m forwards, then all m backwards.
* 1F1B (Narayanan et al. 2019/2021, "PipeDream-Flush"): rank r runs min(p − r − 1, m) warm-up
  forwards, then alternates one forward and one backward, then drains the remaining backwards.
* Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2): v model chunks per rank, virtual stage k on
  rank k mod p; forwards walk the chunks in rounds of q micro-batches; rank r warms up with
  (v − 1)·q + 2·(p − 1 − r) forwards (capped at m·v). With q = p this is Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``; like torch.distributed.pipelining's
  ``ScheduleInterleaved1F1B`` meshplan allows any m that splits into r = max(1, ⌊m/p⌋) equal
  rounds (q = m/r). Megatron warms up with all m·v forwards when m = p; torch and meshplan do not.
* ZB-H1 / interleaved zero bubble ("ZB1P", Qi et al. 2024, Sec. 3; torch's
  ``ScheduleInterleavedZeroBubble``): the backward is split into I (input gradient, on the
  critical path) and W (weight gradient). Warm-up (v − 1)·q + (p − 1 − r) forwards; in the steady
  state F, I and — once r steps have passed — the oldest pending W; torch's drain runs the I's
  first and the W's after. ZB-H1 (v = 1) follows each drain I with a W instead, which reaches the
  paper's bubble of (p − 1)·(F + I − W).
* ZBV (Qi et al. 2024, Sec. 6; torch's ``ScheduleZBVZeroBubble``): two chunks per rank placed in a
  V — rank r holds stages r and 2p − 1 − r — so the last stage sits on rank 0 next to the first;
  zero bubble when F = I = W.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from meshplan.errors import InputError


class Action(NamedTuple):
    kind: str  # "F" forward, "B" full backward, "I" input-gradient backward, "W" weight gradient
    stage: int  # virtual stage
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


def gpipe(pp: int, m: int) -> list[list[Action]]:
    return [[Action("F", r, j) for j in range(m)] + [Action("B", r, j) for j in range(m)] for r in range(pp)]


def one_f_one_b(pp: int, m: int) -> list[list[Action]]:
    ranks = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        acts = [Action("F", r, j) for j in range(warm)]
        for i in range(m - warm):
            acts.append(Action("F", r, warm + i))
            acts.append(Action("B", r, i))
        acts.extend(Action("B", r, j) for j in range(m - warm, m))
        ranks.append(acts)
    return ranks


def rounds_of(pp: int, m: int) -> int:
    """Micro-batches per round q of the interleaved schedules: m / max(1, ⌊m/p⌋), which must
    divide evenly (q = p when m is a multiple of p)."""
    n_rounds = max(1, m // pp)
    if m % n_rounds:
        raise InputError(
            "grad_accum",
            f"interleaved schedules need the {m} micro-batches to split into {n_rounds} equal rounds "
            f"(a multiple of {n_rounds}; any multiple of pp = {pp} works)",
        )
    return m // n_rounds


def _looped_1f1b(pp: int, m: int, vpp: int, zero_bubble: bool, drain_w: bool = False) -> list[list[Action]]:
    """Interleaved 1F1B, or its zero-bubble variants (module docstring), rank by rank.
    ``drain_w``: in the drain, follow each I with the oldest pending W (ZB-H1) instead of
    running all I's first (torch's ZB1P)."""
    q = rounds_of(pp, m) if vpp > 1 else m  # one chunk: rounds do not matter
    total = m * vpp
    ranks = []
    for r in range(pp):
        warm = min((vpp - 1) * q + (1 if zero_bubble else 2) * (pp - 1 - r), total)
        f_next = [0] * vpp  # next micro-batch per local chunk
        b_next = [0] * vpp
        w_next = [0] * vpp
        b_chunks: list[int] = []  # chunk of each backward, in order (for the matching W)
        w_done = 0

        def f_chunk(step: int) -> int:
            return (step // q) % vpp

        def b_chunk(step: int) -> int:
            return vpp - 1 - ((step - warm) // q) % vpp

        def take(counter: list[int], chunk: int) -> int:
            counter[chunk] += 1
            return counter[chunk] - 1

        acts: list[Action] = []
        bkind = "I" if zero_bubble else "B"
        for step in range(warm):
            c = f_chunk(step)
            acts.append(Action("F", c * pp + r, take(f_next, c)))
        for step in range(warm, total):
            c = f_chunk(step)
            acts.append(Action("F", c * pp + r, take(f_next, c)))
            c = b_chunk(step)
            acts.append(Action(bkind, c * pp + r, take(b_next, c)))
            b_chunks.append(c)
            if zero_bubble and step - warm >= r:
                c = b_chunks[w_done]
                acts.append(Action("W", c * pp + r, take(w_next, c)))
                w_done += 1
        for step in range(total, total + warm):
            c = b_chunk(step)
            acts.append(Action(bkind, c * pp + r, take(b_next, c)))
            b_chunks.append(c)
            if drain_w:
                c = b_chunks[w_done]
                acts.append(Action("W", c * pp + r, take(w_next, c)))
                w_done += 1
        if zero_bubble:
            for c in b_chunks[w_done:]:
                acts.append(Action("W", c * pp + r, take(w_next, c)))
        ranks.append(acts)
    return ranks


def interleaved(pp: int, m: int, vpp: int) -> list[list[Action]]:
    return _looped_1f1b(pp, m, vpp, zero_bubble=False)


def zero_bubble(pp: int, m: int, vpp: int = 1) -> list[list[Action]]:
    """torch's ZB1P (``ScheduleInterleavedZeroBubble``): drain runs all I's, then the W's."""
    return _looped_1f1b(pp, m, vpp, zero_bubble=True)


def zb_h1(pp: int, m: int) -> list[list[Action]]:
    """ZB-H1: one chunk per rank, W deferred by r steps, each drain I followed by a W. With
    F = I = W the makespan is m·(F + I + W) + (p − 1)·(F + I − W), a third of 1F1B's bubble, and
    every rank holds at most p micro-batches — 1F1B's peak (Qi et al. 2024, Sec. 3.1)."""
    return _looped_1f1b(pp, m, 1, zero_bubble=True, drain_w=True)


def zbv(pp: int, m: int) -> list[list[Action]]:
    """ZBV with two chunks per rank in a V (module docstring). Built for max(m, 2p − 1)
    micro-batches, as the pattern needs, then the actions of the extra ones are dropped."""
    n = max(m, 2 * pp - 1)
    last = 2 * pp - 1
    ranks = []
    for r in range(pp):
        s0, s1 = r, last - r
        f0 = f1 = b0 = b1 = 0
        acts: list[Action] = []
        for _ in range(2 * (pp - r) - 1):
            acts.append(Action("F", s0, f0)); f0 += 1
        for _ in range(r):
            acts.append(Action("F", s1, f1)); f1 += 1
            acts.append(Action("F", s0, f0)); f0 += 1
        for _ in range(pp - r):
            acts += [Action("F", s1, f1), Action("I", s1, b1), Action("W", s1, b1)]
            f1 += 1; b1 += 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                acts.append(Action("F", s0, f0)); f0 += 1
            acts += [Action("I", s0, b0), Action("W", s0, b0)]
            b0 += 1
            acts += [Action("F", s1, f1), Action("I", s1, b1), Action("W", s1, b1)]
            f1 += 1; b1 += 1
        w0, w1 = b0, b1
        for _ in range(r):
            acts.append(Action("I", s0, b0)); b0 += 1
            acts.append(Action("I", s1, b1)); b1 += 1
        for _ in range(pp - r):
            acts.append(Action("I", s0, b0)); b0 += 1
            acts.append(Action("W", s0, w0)); w0 += 1
        acts += [Action("W", s1, j) for j in range(w1, b1)]
        acts += [Action("W", s0, j) for j in range(w0, b0)]
        ranks.append([a for a in acts if a.microbatch < m])
    return ranks


#: name → (virtual stages per rank it takes: "1", "2" or ">=2", how stages sit on ranks)
SCHEDULES: dict[str, tuple[str, str]] = {
    "gpipe": ("1", "loop"),
    "1f1b": ("1", "loop"),
    "interleaved": (">=2", "loop"),
    "zbh1": ("1", "loop"),
    "interleaved-zb": (">=2", "loop"),
    "zbv": ("2", "v"),
}


def stage_style(schedule: str) -> str:
    """"loop" (stage k on rank k mod p) or "v" (rank r holds r and 2p − 1 − r)."""
    return SCHEDULES[schedule][1]


def check_vpp(schedule: str, vpp: int) -> None:
    """Raise an InputError when ``vpp`` does not suit ``schedule``."""
    if schedule not in SCHEDULES:
        raise InputError("schedule", f"unknown schedule '{schedule}' ({', '.join(SCHEDULES)})")
    rule = SCHEDULES[schedule][0]
    ok = {"1": vpp == 1, "2": vpp == 2, ">=2": vpp >= 2}[rule]
    if not ok:
        need = {"1": "vpp = 1", "2": "vpp = 2", ">=2": "vpp >= 2 virtual stages per rank"}[rule]
        raise InputError("vpp", f"the {schedule} schedule needs {need} (got {vpp})")


@lru_cache(maxsize=256)
def build_schedule(name: str, pp: int, m: int, vpp: int = 1) -> tuple[tuple[Action, ...], ...]:
    """Action lists per rank for ``name`` (one of :data:`SCHEDULES`; cached, immutable)."""
    check_vpp(name, vpp)
    if name == "gpipe":
        ranks = gpipe(pp, m)
    elif name == "1f1b":
        ranks = one_f_one_b(pp, m)
    elif name == "interleaved":
        ranks = interleaved(pp, m, vpp)
    elif name == "zbh1":
        ranks = zb_h1(pp, m)
    elif name == "interleaved-zb":
        ranks = zero_bubble(pp, m, vpp)
    else:
        ranks = zbv(pp, m)
    return tuple(tuple(acts) for acts in ranks)


def format_actions(ranks) -> list[str]:
    """One line per rank in torch's action notation (``0F0,0F1,0B0,...``)."""
    return [",".join(str(a) for a in acts) for acts in ranks]


_ACTION = re.compile(r"^(\d+)(F|I|W|B)(\d+)$")
_TORCH_NON_COMPUTE = re.compile(r"^\d+(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)\d*$")


def parse_actions(rows: list[str]) -> tuple[tuple[Action, ...], ...]:
    """Read one row per rank in torch's notation (the reverse of :func:`format_actions`).

    Empty cells (torch's idle steps) and torch's communication/resharding actions are skipped;
    anything else is refused with an :class:`InputError` naming the rank and the cell."""
    ranks = []
    for r, row in enumerate(rows):
        acts = []
        for cell in row.replace(";", ",").split(","):
            cell = cell.strip()
            if not cell or cell.lower() == "none" or _TORCH_NON_COMPUTE.match(cell):
                continue
            hit = _ACTION.match(cell)
            if not hit:
                raise InputError(f"actions.rank{r}", f"'{cell}' is not an action like 0F0, 1I3, 2W1 or 1B0")
            acts.append(Action(hit.group(2), int(hit.group(1)), int(hit.group(3))))
        ranks.append(tuple(acts))
    return tuple(ranks)
