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
  critical path) and W (weight gradient). Warm-up (v − 1)·q + (p − 1 − r) forwards, then
  forward/I pairs, each I from the r-th on followed by the oldest pending W, so that W fills what
  would be bubble; the W's still pending run at the end. With v = 1 this is ZB-H1, whose bubble
  is (p − 1)·(F + I − W) when m ≥ p and W ≤ I.
* ZBV (Qi et al. 2024, Sec. 6; torch's ``ScheduleZBVZeroBubble``): two chunks per rank placed in a
  V — rank r holds stages r and 2p − 1 − r — so the last stage sits on rank 0 next to the first;
  zero bubble when F = I = W.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from meshplan.errors import InputError


class Action(NamedTuple):
    kind: str  # "F" forward, "B" full backward, "I" input-gradient backward, "W" weight gradient
    stage: int  # virtual stage
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


KINDS = ("F", "B", "I", "W")  # kind codes 0..3 of the array form


@dataclass(frozen=True, eq=False)
class Schedule:
    """A schedule as parallel integer arrays per rank (kind code into :data:`KINDS`, virtual
    stage, micro-batch): the form the simulator runs, built without one Python object per
    action so that p = 64, m = 1024, v = 8 (a million actions) stays fast."""

    pp: int
    n_stages: int
    microbatches: int
    kind: tuple[np.ndarray, ...]
    stage: tuple[np.ndarray, ...]
    mb: tuple[np.ndarray, ...]
    name: str = ""  # the generator's name (compile_schedule); "" for action lists read or given

    def actions(self) -> tuple[tuple[Action, ...], ...]:
        return tuple(
            tuple(Action(KINDS[k], st, j) for k, st, j in zip(kd.tolist(), sg.tolist(), mb.tolist()))
            for kd, sg, mb in zip(self.kind, self.stage, self.mb)
        )

    @staticmethod
    def from_actions(ranks) -> "Schedule":
        """The array form of any action lists (parsed from torch's notation, say)."""
        code = {k: i for i, k in enumerate(KINDS)}
        kinds, stages, mbs = [], [], []
        for acts in ranks:
            kinds.append(np.array([code[a.kind] for a in acts], dtype=np.int64))
            stages.append(np.array([a.stage for a in acts], dtype=np.int64))
            mbs.append(np.array([a.microbatch for a in acts], dtype=np.int64))
        n_stages = 1 + max((int(s.max()) for s in stages if s.size), default=0)
        m = 1 + max((int(j.max()) for j in mbs if j.size), default=0)
        return Schedule(len(kinds), n_stages, m, tuple(kinds), tuple(stages), tuple(mbs))


def _rank_arrays(kind: list[int], stage: list[int], mb: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.asarray(kind, dtype=np.int64), np.asarray(stage, dtype=np.int64), np.asarray(mb, dtype=np.int64)


def _gpipe(pp: int, m: int):
    """GPipe as arrays: all forwards, then all backwards."""
    j = np.arange(m, dtype=np.int64)
    out = []
    for r in range(pp):
        out.append((np.repeat(np.array([0, 1]), m), np.full(2 * m, r, dtype=np.int64), np.concatenate([j, j])))
    return out


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


def warmup_forwards(pp: int, m: int, vpp: int, factor: int, rank: int) -> int:
    """Forwards rank ``rank`` runs before its first backward in 1F1B (``factor`` 1) and its looped
    variants (``factor`` 2 for interleaving, Megatron's ``num_warmup_microbatches``):
    min((v − 1)·q + factor·(p − 1 − r), m·v), q = :func:`rounds_of` with v > 1, else m."""
    q = rounds_of(pp, m) if vpp > 1 else m  # one chunk: rounds do not matter
    return min((vpp - 1) * q + factor * (pp - 1 - rank), m * vpp)


def _looped(pp: int, m: int, vpp: int, factor: int, split: bool = False):
    """1F1B and its looped variants, rank by rank (module docstring), as arrays.

    The k-th forward of a rank runs chunk ⌊k/q⌋ mod v on micro-batch ⌊k/(q·v)⌋·q + k mod q; the
    k-th backward the chunks in reverse order, same micro-batches. Rank r warms up with
    (v − 1)·q + factor·(p − 1 − r) forwards, then alternates forward and backward, then drains
    the backwards. With ``split`` the backward is I then W: from the r-th backward on, each I is
    followed by the oldest pending W (steady state and drain alike), and the W's still pending
    run at the end — torch's ``ScheduleInterleavedZeroBubble``."""
    q = rounds_of(pp, m) if vpp > 1 else m  # one chunk: rounds do not matter
    total = m * vpp
    k = np.arange(total, dtype=np.int64)
    chunk_f = (k // q) % vpp
    mb_seq = (k // (q * vpp)) * q + k % q
    out = []
    for r in range(pp):
        warm = warmup_forwards(pp, m, vpp, factor, r)
        n_st = total - warm
        f_stage, b_stage = chunk_f * pp + r, (vpp - 1 - chunk_f) * pp + r
        # the sequence as (stream, index): stream 0 = forwards, 1 = backwards (B or I), 2 = W's;
        # the b-th backward (b ≥ delay) is followed by W number b − delay
        delay = r if split else total
        b = np.arange(total, dtype=np.int64)  # backward number: steady ones first, then the drain
        has_w = b >= delay
        steady, drain = slice(0, n_st), slice(n_st, total)
        parts_stream = [np.zeros(warm, np.int64)]
        parts_index = [np.arange(warm, dtype=np.int64)]
        for sl, with_f in ((steady, True), (drain, False)):
            bb, hw = b[sl], has_w[sl]
            width = (2 if with_f else 1) + 1  # F?, B, W?
            stream = np.full((bb.size, width), -1, np.int64)
            index = np.zeros((bb.size, width), np.int64)
            col = 0
            if with_f:
                stream[:, 0], index[:, 0] = 0, warm + bb
                col = 1
            stream[:, col], index[:, col] = 1, bb
            stream[hw, col + 1], index[hw, col + 1] = 2, bb[hw] - delay
            keep = stream.ravel() >= 0
            parts_stream.append(stream.ravel()[keep])
            parts_index.append(index.ravel()[keep])
        if split:
            emitted = max(0, total - delay)
            parts_stream.append(np.full(total - emitted, 2, np.int64))
            parts_index.append(np.arange(emitted, total, dtype=np.int64))
        stream, idx = np.concatenate(parts_stream), np.concatenate(parts_index)
        kind = np.where(stream == 0, 0, np.where(stream == 1, 2 if split else 1, 3))
        stage = np.where(stream == 0, f_stage[idx], b_stage[idx])
        out.append((kind, stage, mb_seq[idx]))
    return out


def _zbv(pp: int, m: int):
    """ZBV with two chunks per rank in a V (module docstring). Built for max(m, 2p − 1)
    micro-batches, as the pattern needs, then the actions of the extra ones are dropped."""
    n = max(m, 2 * pp - 1)
    last = 2 * pp - 1
    F, I, W = 0, 2, 3
    out = []
    for r in range(pp):
        s0, s1 = r, last - r
        f0 = f1 = b0 = b1 = 0
        kind: list[int] = []
        stage: list[int] = []
        mb: list[int] = []

        def put(kd: int, st: int, j: int) -> None:
            kind.append(kd), stage.append(st), mb.append(j)

        for _ in range(2 * (pp - r) - 1):
            put(F, s0, f0); f0 += 1
        for _ in range(r):
            put(F, s1, f1); f1 += 1
            put(F, s0, f0); f0 += 1
        for _ in range(pp - r):
            put(F, s1, f1); put(I, s1, b1); put(W, s1, b1)
            f1 += 1; b1 += 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                put(F, s0, f0); f0 += 1
            put(I, s0, b0); put(W, s0, b0)
            b0 += 1
            put(F, s1, f1); put(I, s1, b1); put(W, s1, b1)
            f1 += 1; b1 += 1
        w0, w1 = b0, b1
        for _ in range(r):
            put(I, s0, b0); b0 += 1
            put(I, s1, b1); b1 += 1
        for _ in range(pp - r):
            put(I, s0, b0); b0 += 1
            put(W, s0, w0); w0 += 1
        for j in range(w1, b1):
            put(W, s1, j)
        for j in range(w0, b0):
            put(W, s0, j)
        kd, sg, j = _rank_arrays(kind, stage, mb)
        keep = j < m
        out.append((kd[keep], sg[keep], j[keep]))
    return out


#: name → (virtual stages per rank it takes: "1", "2" or ">=2", how stages sit on ranks)
SCHEDULES: dict[str, tuple[str, str]] = {
    "gpipe": ("1", "loop"),
    "1f1b": ("1", "loop"),
    "interleaved": (">=2", "loop"),
    "zbh1": ("1", "loop"),
    "interleaved-zb": (">=2", "loop"),
    "zbv": ("2", "v"),
}


#: Schedules recognised by name but not modelled, with why (a refusal names them, not "unknown").
#: DualPipe (DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.2.1) feeds micro-batches from both ends
#: of the pipeline, holds two copies of the parameters (2x weights per rank) and overlaps one
#: micro-batch's MoE all-to-all with another's compute inside a forward-backward chunk pair;
#: DualPipe-V (deepseek-ai/DualPipe, "Cut-in-half") folds it onto a V of p ranks like zbv. Neither
#: the chunk-pair overlap nor the two-ended feed is in meshplan's schedule simulation.
UNMODELLED_SCHEDULES: dict[str, str] = {
    "dualpipe": "DualPipe (DeepSeek-V3: micro-batches fed from both pipeline ends, two parameter copies, "
                "the MoE all-to-all overlapped inside forward-backward chunk pairs) is not modelled; "
                "the nearest modelled schedules are zbh1 and zbv",
    "dualpipev": "DualPipe-V (DualPipe cut in half onto a V of p ranks, with the all-to-all overlapped inside "
                 "forward-backward chunk pairs) is not modelled; the nearest modelled schedule is zbv",
}


def stage_style(schedule: str) -> str:
    """"loop" (stage k on rank k mod p) or "v" (rank r holds r and 2p − 1 − r)."""
    return SCHEDULES[schedule][1]


def check_vpp(schedule: str, vpp: int) -> None:
    """Raise an InputError when ``vpp`` does not suit ``schedule``."""
    if schedule in UNMODELLED_SCHEDULES:
        raise InputError("schedule", UNMODELLED_SCHEDULES[schedule])
    if schedule not in SCHEDULES:
        raise InputError("schedule", f"unknown schedule '{schedule}' ({', '.join(SCHEDULES)})")
    rule = SCHEDULES[schedule][0]
    ok = {"1": vpp == 1, "2": vpp == 2, ">=2": vpp >= 2}[rule]
    if not ok:
        need = {"1": "vpp = 1", "2": "vpp = 2", ">=2": "vpp >= 2 virtual stages per rank"}[rule]
        raise InputError("vpp", f"the {schedule} schedule needs {need} (got {vpp})")


@lru_cache(maxsize=64)
def compile_schedule(name: str, pp: int, m: int, vpp: int = 1) -> Schedule:
    """The array form of schedule ``name`` (one of :data:`SCHEDULES`; cached)."""
    check_vpp(name, vpp)
    if name == "gpipe":
        ranks = _gpipe(pp, m)
    elif name == "1f1b":
        ranks = _looped(pp, m, 1, factor=1)
    elif name == "interleaved":
        ranks = _looped(pp, m, vpp, factor=2)
    elif name == "zbh1":
        ranks = _looped(pp, m, 1, factor=1, split=True)
    elif name == "interleaved-zb":
        ranks = _looped(pp, m, vpp, factor=1, split=True)
    else:
        ranks = _zbv(pp, m)
    kinds, stages, mbs = zip(*ranks)
    return Schedule(pp, pp * vpp, m, tuple(kinds), tuple(stages), tuple(mbs), name)


@lru_cache(maxsize=64)
def build_schedule(name: str, pp: int, m: int, vpp: int = 1) -> tuple[tuple[Action, ...], ...]:
    """Action lists per rank for ``name`` (one of :data:`SCHEDULES`; cached, immutable)."""
    return compile_schedule(name, pp, m, vpp).actions()


def gpipe(pp: int, m: int) -> tuple[tuple[Action, ...], ...]:
    return build_schedule("gpipe", pp, m, 1)


def interleaved(pp: int, m: int, vpp: int) -> tuple[tuple[Action, ...], ...]:
    return build_schedule("interleaved", pp, m, vpp)


def one_f_one_b(pp: int, m: int) -> tuple[tuple[Action, ...], ...]:
    return build_schedule("1f1b", pp, m, 1)


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
