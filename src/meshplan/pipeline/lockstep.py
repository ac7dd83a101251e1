"""Lockstep execution of torch's multi-stage pipeline schedules, slot by slot.

torch.distributed.pipelining runs its multi-stage schedules (``PipelineScheduleMulti`` and its
subclasses ``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``;
meshplan's interleaved, interleaved-zb and zbh1, zbv) from a precomputed grid, ``pipeline_order[rank][slot]``: one compute action
or ``None`` per rank and slot, the ``None`` cells aligning the ranks. In the runtime of the torch
builds torchtitan's published runs used (torch 1963fc8, 2024-12),
``PipelineScheduleMulti._step_microbatches`` walks the grid: at slot t a rank runs its action, then
posts in one ``batch_isend_irecv``

* its own sends: the activation of a forward F of stage s to the rank of s + 1 (none for the last
  stage), the input gradient of a backward B or I of stage s to the rank of s − 1 (none for stage 0);
  a weight gradient W sends nothing;
* the receives its neighbours' actions of the same slot imply: from a rank whose slot-t action is a
  forward of stage s when this rank holds s + 1, from one whose slot-t action is a B or I of stage s
  when this rank holds s − 1;

and waits for all of them (``_batch_p2p(ops).wait()``) before slot t + 1. Every send pairs with a
receive in the same slot, so the exchanges are links between two ranks. A link completes when both
ends have posted it and the message has moved, and a rank leaves slot t when its action and all its
links of slot t are done. With ``d_r(t)`` the duration of rank r's action at slot t (0 for
``None``), ``τ`` the transfer time of one send/receive (meshplan's p2p time) and ``L_r(t)`` the ranks linked to r at slot t, the max-plus
recursion is

    c_r(t) = e_r(t − 1) + d_r(t)                                  (rank r's action ends)
    e_r(t) = max(c_r(t), max over q in L_r(t) of max(c_r(t), c_q(t)) + τ)   (r leaves slot t)

from ``e_r(−1) = 0``; rank r finishes at ``e_r`` of its last slot. The dependency-driven simulator
(:mod:`meshplan.pipeline.simulate`, Megatron's behaviour and torch's single-stage ``Schedule1F1B``
and ``ScheduleGPipe``) keeps only the constraints of the data: an action waits for its rank and for
its input. Every such constraint holds here too — the input of an action at slot t was sent at an
earlier slot t′ < t, and the receiver left t′ only after that link — so with the same action order
per rank the lockstep makespan is never shorter (the tests check both this and where it is strictly
longer).

Later torch builds (2.13 among them) derive these classes from ``_PipelineScheduleRuntime``,
which lowers the same grid into per-rank lists with explicit sends and receives: a receive is
posted ahead and waited just before the action that needs it, sends are waited at the end of the
step — dependency-driven, as :mod:`meshplan.pipeline.simulate` models.

Grid, per torch's generators (equal to torch's ``pipeline_order`` in the tests): rank r starts with
r idle slots. Interleaved 1F1B (``_get_1f1b_rank_ops``, q micro-batches per round): w = min((v − 1)·q
+ 2·(p − 1 − r), m·v) warm-up forwards, then v·p + 2·(p − 1 − r) − (w + r) idle slots, then
forward/backward pairs, then w cool-down backwards each after an idle slot. Interleaved zero
bubble and ZB-H1 (``ScheduleInterleavedZeroBubble``, with one stage per rank for ZB-H1; the same
generator with the backward split): w = min((v − 1)·q + p − 1 − r, m·v) forwards, p − 1 − r idle
slots, forward/I pairs each followed by a W from the r-th on, the remaining I's and W's, then
``_add_bubbles_to_actions`` delays any forward whose input was not produced in an earlier slot by
an idle slot. ZBV: the pattern of max(m, 2p − 1) micro-batches, the actions of the micro-batches
beyond m left as idle slots.

With fewer micro-batches than ranks (and for interleaved 1F1B with v > 2 some m not a multiple of
p) torch's grid puts some actions in, or before, the slot of the action producing their input; its
lockstep runtime then runs them before the input has arrived. meshplan does not replay that (the
step would be shorter than the data allows): it applies torch's bubble pass to every action, not
only to forwards, so that each waits in idle slots until its input was produced in an earlier one
(:func:`inputs_precede` tells whether torch's grid needed it).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from meshplan.pipeline.inflight import schedule_live_counts
from meshplan.pipeline.live import peak_bytes
from meshplan.pipeline.result import SimResult
from meshplan.pipeline.schedules import Action, Schedule, _zbv, compile_schedule, rounds_of, stage_style
from meshplan.pipeline.slots import rank_program
from meshplan.pipeline.stages import rank_of

#: meshplan schedules that torch runs with a multi-stage class (lockstep in its 2024 runtime);
#: "gpipe" and "1f1b" are torch's single-stage classes, always dependency-driven
LOCKSTEP_SCHEDULES = ("interleaved", "interleaved-zb", "zbh1", "zbv")


def runs_lockstep(schedule: str, pp: int, runtime: str) -> bool:
    """Whether a plan with ``schedule`` on ``pp`` ranks runs slot by slot: the lockstep runtime,
    a multi-stage schedule (:data:`LOCKSTEP_SCHEDULES`) and more than one pipeline rank. torch's
    single-stage schedules (GPipe, 1F1B) run dependency-driven whatever the runtime."""
    return runtime == "lockstep" and schedule in LOCKSTEP_SCHEDULES and pp > 1


def runtime_words(schedule: str, pp: int, m: int, vpp: int, runtime: str) -> str:
    """How the plan's pipeline advances, in words (for derivations and reports)."""
    if runtime == "deepspeed" and schedule == "1f1b" and pp > 1:
        return "DeepSpeed's TrainSchedule: steps that each begin with a blocking exchange with one neighbour"
    if not runs_lockstep(schedule, pp, runtime):
        if runtime == "lockstep" and pp > 1:
            return "dependency-driven: torch runs this schedule with a single-stage class"
        return "dependency-driven"
    if inputs_precede(schedule, pp, m, vpp):
        return "lockstep over torch's grid"
    return "lockstep over torch's grid, with idle slots until each input has arrived (torch's grid runs some actions before their input)"


def _looped_pattern(p: int, m: int, v: int, r: int, split: bool) -> list[bool]:
    """Rank r's row of the grid of torch's ``_get_1f1b_rank_ops``: True for an action, False for
    an idle slot, before zero bubble's ``_add_bubbles_to_actions``."""
    q = rounds_of(p, m) if v > 1 else 0  # one chunk: the rounds do not shift the warm-up
    total = m * v
    warm = min((v - 1) * q + (1 if split else 2) * (p - 1 - r), total)
    row = [False] * r + [True] * warm
    if warm:
        post = (p - r - 1) if split else (v * p + 2 * (p - 1 - r)) - (warm + r)
        row += [False] * max(post, 0)
    for k in range(total - warm):  # steady: F, B (or F, I and from the r-th on a W)
        row += [True, True] + ([True] if split and k >= r else [])
    for k in range(total - warm, total):  # cool-down: B after an idle slot (or I and its W)
        row += [True, True] if split and k >= r else ([True] if split else [False, True])
    if split:
        row += [True] * min(r, total)  # the W's still pending
    return row


def _zbv_pattern(p: int, m: int) -> list[list[bool]]:
    """torch's ZBV grid, per rank: r idle slots, then the pattern of max(m, 2p − 1) micro-batches
    with the actions of micro-batches m and beyond left idle."""
    ranks = _zbv(p, max(m, 2 * p - 1))
    return [[False] * r + (ranks[r][2] < m).tolist() for r in range(p)]


def _add_bubbles(sched: Schedule, rows: list[list[bool]], forwards_only: bool) -> list[list[bool]]:
    """torch's ``_add_bubbles_to_actions``: slot by slot, a rank's next action waits (an idle slot
    is inserted) while its input from another rank has not been produced in an earlier slot;
    idle slots already in the row pass as they are. torch checks forwards only
    (``forwards_only``); checking every action makes any grid one whose inputs precede."""
    p, S, M = sched.pp, sched.n_stages, max(sched.microbatches, 1)
    programs = [rank_program(sched, r, S, M) for r in range(p)]
    free = 3 * S * M
    seen = np.zeros(free + 1, dtype=bool)
    seen[free] = True
    nxt_row, nxt_act = [0] * p, [0] * p
    out: list[list[bool]] = [[] for _ in range(p)]
    while any(nxt_row[r] < len(rows[r]) for r in range(p)):
        new: list[int] = []
        idled = False
        for r in range(p):
            if nxt_row[r] >= len(rows[r]):
                continue
            if not rows[r][nxt_row[r]]:
                out[r].append(False)
                nxt_row[r] += 1
                idled = True
                continue
            own, dep = programs[r][0][nxt_act[r]], programs[r][1][nxt_act[r]]
            checked = not forwards_only or sched.kind[r][nxt_act[r]] == 0
            if checked and not seen[dep]:
                out[r].append(False)
                continue
            out[r].append(True)
            nxt_row[r] += 1
            nxt_act[r] += 1
            new.append(own)
        if not new and not idled:
            raise RuntimeError(f"the {sched.name} schedule deadlocks: no rank can run its next action")
        seen[new] = True
    return out


@lru_cache(maxsize=64)
def torch_rows(name: str, pp: int, m: int, vpp: int) -> tuple[tuple[bool, ...], ...]:
    """torch's ``pipeline_order`` grid for ``name`` (one of :data:`LOCKSTEP_SCHEDULES`), per rank
    True for an action (in the order of :func:`~meshplan.pipeline.schedules.compile_schedule`)
    and False for an idle slot (module docstring)."""
    sched = compile_schedule(name, pp, m, vpp)
    if name == "zbv":
        rows = _zbv_pattern(pp, m)
    elif name == "interleaved":
        rows = [_looped_pattern(pp, m, vpp, r, split=False) for r in range(pp)]
    elif name in ("interleaved-zb", "zbh1"):
        rows = _add_bubbles(sched, [_looped_pattern(pp, m, vpp, r, split=True) for r in range(pp)], forwards_only=True)
    else:
        raise ValueError(f"'{name}' is not a multi-stage schedule of torch (dependency-driven)")
    for r in range(pp):
        if sum(rows[r]) != sched.kind[r].size:
            raise RuntimeError(f"torch's grid of {name} has {sum(rows[r])} actions on rank {r}, meshplan {sched.kind[r].size}")
    return tuple(tuple(row) for row in rows)


@lru_cache(maxsize=64)
def torch_slots(name: str, pp: int, m: int, vpp: int) -> tuple[np.ndarray, ...]:
    """Per rank, the slot of each of its actions in the grid lockstep replays: torch's
    (:func:`torch_rows`) when every cross-rank input comes from an earlier slot
    (:func:`inputs_precede`), else torch's grid with the bubble pass applied to every action."""
    rows = torch_rows(name, pp, m, vpp)
    if not inputs_precede(name, pp, m, vpp):
        rows = _add_bubbles(compile_schedule(name, pp, m, vpp), [list(r) for r in rows], forwards_only=False)
    return tuple(np.flatnonzero(np.asarray(row, dtype=bool)) for row in rows)


@lru_cache(maxsize=64)
def _producers(sched: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """(rank, slot) of the action producing the cross-rank input of each cell of torch's grid,
    shape (p, slots); −1 where the cell is idle or its input is local (or there is none)."""
    p, S, M = sched.pp, sched.n_stages, max(sched.microbatches, 1)
    slots = [np.flatnonzero(np.asarray(row, dtype=bool)) for row in torch_rows(sched.name, p, sched.microbatches, S // p)]
    n_slots = max((int(s[-1]) + 1 for s in slots if s.size), default=0)
    code_rank = np.full(3 * S * M + 1, -1, dtype=np.int64)
    code_slot = np.full(3 * S * M + 1, -1, dtype=np.int64)
    programs = [rank_program(sched, r, S, M) for r in range(p)]
    for r, (own, _) in enumerate(programs):
        code_rank[own], code_slot[own] = r, slots[r]
    code_rank[-1] = code_slot[-1] = -1  # "no input" (first stage, or produced on this rank)
    pr = np.full((p, n_slots), -1, dtype=np.int64)
    pt = np.full((p, n_slots), -1, dtype=np.int64)
    for r, (_, dep) in enumerate(programs):
        pr[r, slots[r]], pt[r, slots[r]] = code_rank[dep], code_slot[dep]
    return pr, pt


@lru_cache(maxsize=64)
def inputs_precede(name: str, pp: int, m: int, vpp: int) -> bool:
    """Whether every action of torch's grid whose input comes from another rank sits in a later
    slot than the action producing it, so that the slot's waits alone deliver every input.
    torch's generators guarantee it for m ≥ p (for interleaved 1F1B with v > 2, for m a multiple
    of p); with fewer micro-batches their grids put some actions in, or before, their producer's
    slot, where torch's lockstep runtime would run them before the input arrives. meshplan
    replays such grids with the bubble pass applied to every action (:func:`torch_slots`)."""
    sched = compile_schedule(name, pp, m, vpp)
    pr, pt = _producers(sched)
    has = pr >= 0
    return bool((pt[has] < np.nonzero(has)[1]).all())


@lru_cache(maxsize=64)
def _links(sched: Schedule):
    """The grid as arrays: the slots, and the links as (slot, rank a, rank b) sorted by slot —
    one per cross-rank send: F of stage s < S − 1 to the rank of s + 1, B or I of stage s > 0 to
    the rank of s − 1."""
    p, S = sched.pp, sched.n_stages
    slots = torch_slots(sched.name, p, sched.microbatches, S // p)
    style = stage_style(sched.name)
    n_slots = max((int(s[-1]) + 1 for s in slots if s.size), default=0)
    t_l, a_l, b_l = [], [], []
    owner = np.array([rank_of(k, p, style) for k in range(S)], dtype=np.int64)
    for r in range(p):
        kind, stage = sched.kind[r], sched.stage[r]
        fwd = (kind == 0) & (stage < S - 1)
        bwd = ((kind == 1) | (kind == 2)) & (stage > 0)
        peer = np.where(fwd, owner[np.minimum(stage + 1, S - 1)], owner[np.maximum(stage - 1, 0)])
        send = (fwd | bwd) & (peer != r)
        t_l.append(slots[r][send])
        a_l.append(np.full(int(send.sum()), r, dtype=np.int64))
        b_l.append(peer[send])
    t = np.concatenate(t_l) if t_l else np.zeros(0, np.int64)
    order = np.argsort(t, kind="stable")
    t, a, b = t[order], np.concatenate(a_l)[order], np.concatenate(b_l)[order]
    bounds = np.searchsorted(t, np.arange(n_slots + 1))
    return n_slots, a, b, bounds


def simulate_lockstep(
    sched: Schedule,
    fwd,
    bwd,
    transfer: float = 0.0,
    act_bytes=None,
    keep_timeline: bool = False,
    wgt=None,
) -> SimResult:
    """Run compiled schedule ``sched`` (one of :data:`LOCKSTEP_SCHEDULES`) in lockstep over torch's
    grid (module docstring); ``fwd``/``bwd``/``wgt`` per virtual stage as for
    :func:`~meshplan.pipeline.simulate.simulate`, ``transfer`` the time of one send/receive."""
    p, n_stages = sched.pp, sched.n_stages
    slots = torch_slots(sched.name, p, sched.microbatches, n_stages // p)
    n_slots, a, b, bounds = _links(sched)
    f_t = np.asarray(fwd, dtype=float)
    b_t = np.asarray(bwd, dtype=float)
    w_t = np.asarray(wgt, dtype=float) if wgt is not None else b_t / 2
    table = np.stack([f_t, b_t, b_t - w_t, w_t])  # rows: F, B, I, W
    dur_r = [table[sched.kind[r], sched.stage[r]] for r in range(p)]
    d = np.zeros((p, n_slots))
    for r in range(p):
        d[r, slots[r]] = dur_r[r]
    e = np.zeros(p)
    ends = np.zeros((p, n_slots))
    for t in range(n_slots):
        c = e + d[:, t]
        e = c.copy()
        lo, hi = bounds[t], bounds[t + 1]
        if hi > lo:
            done = np.maximum(c[a[lo:hi]], c[b[lo:hi]]) + transfer
            np.maximum.at(e, a[lo:hi], done)
            np.maximum.at(e, b[lo:hi], done)
        ends[:, t] = c
    finish = tuple(float(e[r]) for r in range(p))
    live = schedule_live_counts(sched, n_stages)
    act = np.asarray(act_bytes, dtype=float) if act_bytes is not None else np.zeros(n_stages)
    lines = []
    if keep_timeline:
        for r, acts in enumerate(sched.actions()):
            end = ends[r, slots[r]]
            lines.append(tuple(zip(acts, (end - dur_r[r]).tolist(), end.tolist())))
    return SimResult(
        makespan=max(finish) if finish else 0.0,
        finish=finish,
        busy=tuple(float(sum(dur_r[r].tolist())) for r in range(p)),
        peak_inflight=tuple(live[r][2] for r in range(p)),
        peak_activation=tuple(peak_bytes(live[r][1], act[live[r][0]]) for r in range(p)),
        timeline=tuple(lines) if keep_timeline else None,
    )


def torch_grid(name: str, pp: int, m: int, vpp: int) -> list[list[Action | None]]:
    """torch's ``pipeline_order`` for ``name``: per rank, one action or None per slot."""
    sched = compile_schedule(name, pp, m, vpp)
    grid = []
    for row, acts in zip(torch_rows(name, pp, m, vpp), sched.actions()):
        it = iter(acts)
        grid.append([next(it) if cell else None for cell in row])
    return grid
