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
* Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2; Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``): v model chunks per rank; forwards walk the
  chunks in groups of p micro-batches; rank r warms up with (p − r − 1)·2 + (v − 1)·p forwards
  (all m·v when m = p). Needs m to be a multiple of p.
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
