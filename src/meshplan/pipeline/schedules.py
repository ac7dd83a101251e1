"""Pipeline schedules as ordered action lists per rank.

An action is ``(kind, stage, microbatch)`` with kind ``F`` (forward) or ``B`` (backward) and
``stage`` the virtual stage (0 ≤ stage < p·v). Rank r runs its list in order. Lists print in
torch.distributed.pipelining's notation, e.g. ``0F0``, ``1B3``.

* GPipe (Huang et al. 2019): all m forwards, then all m backwards.
* 1F1B (Narayanan et al. 2019/2021, "PipeDream-Flush"): rank r runs min(p − r − 1, m) warm-up
  forwards, then alternates one forward and one backward, then drains the remaining backwards.
* Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2; Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``): v model chunks per rank; forwards walk the
  chunks in groups of p micro-batches; rank r warms up with (p − r − 1)·2 + (v − 1)·p forwards
  (all m·v when m = p). Needs m to be a multiple of p.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from meshplan.errors import InputError


class Action(NamedTuple):
    kind: str  # "F" or "B"
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


def interleaved(pp: int, m: int, vpp: int) -> list[list[Action]]:
    if m % pp:
        raise InputError(
            "grad_accum", f"the interleaved schedule needs micro-batches ({m}) to be a multiple of pp ({pp})"
        )
    total = m * vpp
    group = pp * vpp

    def fwd(r: int, k: int) -> Action:
        chunk = (k % group) // pp
        mb = (k // group) * pp + k % pp
        return Action("F", r + chunk * pp, mb)

    def bwd(r: int, k: int) -> Action:
        chunk = vpp - 1 - (k % group) // pp
        mb = (k // group) * pp + k % pp
        return Action("B", r + chunk * pp, mb)

    ranks = []
    for r in range(pp):
        warm = total if m == pp else min((pp - r - 1) * 2 + (vpp - 1) * pp, total)
        acts = [fwd(r, k) for k in range(warm)]
        for i in range(total - warm):
            acts.append(fwd(r, warm + i))
            acts.append(bwd(r, i))
        acts.extend(bwd(r, k) for k in range(total - warm, total))
        ranks.append(acts)
    return ranks


@lru_cache(maxsize=256)
def build_schedule(name: str, pp: int, m: int, vpp: int = 1) -> tuple[tuple[Action, ...], ...]:
    """Action lists per rank for ``name`` in {gpipe, 1f1b, interleaved} (cached, immutable)."""
    if name == "gpipe":
        ranks = gpipe(pp, m)
    elif name == "1f1b":
        ranks = one_f_one_b(pp, m)
    elif name == "interleaved":
        ranks = interleaved(pp, m, vpp)
    else:
        raise InputError("schedule", f"unknown schedule '{name}' (gpipe, 1f1b, interleaved)")
    return tuple(tuple(acts) for acts in ranks)


def format_actions(ranks) -> list[str]:
    """One line per rank in torch's action notation (``0F0,0F1,0B0,...``)."""
    return [",".join(str(a) for a in acts) for acts in ranks]
