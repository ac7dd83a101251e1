"""Megatron-LM's pipeline before late 2022: every stage-to-stage exchange blocking.

Megatron-LM's ``p2p_communication._communicate`` (v2.6, 2021-08, to the variable-sequence-length
rewrite of 2022-11) posts a call's sends and receives with ``torch.distributed.batch_isend_irecv``,
waits on every request and then calls ``torch.cuda.synchronize()`` ("to protect against race
condition when using batch_isend_irecv()"). Its 1F1B and interleaved loops
(``megatron/schedules.py``) call it after each forward or backward: the call sends what the action
produced (a forward's activation to the next stage, a backward's gradient to the previous one)
and receives what the rank's next action needs (``send_forward_recv_backward``,
``send_backward_recv_forward``, ``send_forward_backward_recv_forward_backward``, ...). NCCL's
point-to-point completes only when both ends have posted it, so a call is a rendezvous with the
neighbours it exchanges with.

Each rank runs its actions in the schedule's order (the same order as the dependency-driven
simulation). With a_r(i) the moment rank r reaches its i-th call (the end of its previous call
plus the action between), and P(i) the calls of the neighbours holding the other ends of its
messages, the call ends at

    e_r(i) = max(a_r(i), max over P(i) of a_q(j)) + τ   (τ one transfer; a_r(i) when it moves nothing)

Messages in opposite directions or to both neighbours travel at once (NVLink and the NICs are full
duplex), so a call costs one τ. Every data dependency of the dependency-driven simulation still
holds, in the same order per rank, so the makespan is never shorter; it is longer wherever a rank
waits for a neighbour that is still computing to exchange what it does not need yet.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

import numpy as np

from meshplan.pipeline.inflight import schedule_live_counts
from meshplan.pipeline.live import peak_bytes
from meshplan.pipeline.result import SimResult
from meshplan.pipeline.schedules import Schedule, warmup_forwards

#: the schedules Megatron-LM's loops run, which the blocking runtime applies to
BLOCKING_SCHEDULES = ("1f1b", "interleaved")


def runs_blocking(schedule: str, pp: int, runtime: str, m: int = 0) -> bool:
    """Whether a plan runs Megatron-LM's blocking exchanges: runtime ``blocking``, a 1F1B or
    interleaved schedule, more than one pipeline rank, and for interleaving ``m`` micro-batches a
    multiple of p (``megatron/schedules.py`` asserts it: "number of microbatches is not divisible by
    pipeline-parallel size when using interleaved schedule")."""
    return runtime == "blocking" and schedule in BLOCKING_SCHEDULES and pp > 1 and (schedule != "interleaved" or m % pp == 0)


def _program(kinds: list[int], stages: list[int], mbs: list[int], n: int, looped: bool, warm: int, m: int) -> list:
    """One rank's program as Megatron-LM v2.6's loops run its actions (kind 0 forward, else
    backward): an int ``i`` runs action i, a pair ``(sends, receives)`` is one blocking exchange of
    messages numbered ``(d·n + stage)·m + micro-batch`` (d = 0: the activation a forward of
    ``stage`` sends on; d = 1: the gradient a backward of ``stage`` sends back; ``m`` micro-batches).
    The actions are ``warm`` leading forwards (Megatron's ``num_warmup_microbatches``), then
    forward/backward pairs, then the remaining backwards.

    * 1F1B (``forward_backward_pipelining_without_interleaving``): each warm-up forward between
      ``recv_forward`` and ``send_forward``; in the steady state ``send_forward_recv_backward``
      after the forward and ``send_backward_recv_forward`` after the backward (``send_backward``
      after the last); each cool-down backward between ``recv_backward`` and ``send_backward``.
    * interleaved (``..._with_interleaving``, ``looped``): one ``recv_forward`` first; after each
      warm-up forward ``send_forward_recv_forward`` (the last one also receiving the first
      backward's gradient); after each forward/backward pair one
      ``send_forward_backward_recv_forward_backward``; after each cool-down backward
      ``send_backward_recv_backward``."""
    needs, makes = [], []  # per action: the message it receives first and the one it sends on
    for k, st, mb in zip(kinds, stages, mbs):
        if k == 0:
            needs.append([(st - 1) * m + mb] if st > 0 else [])
            makes.append([st * m + mb] if st < n - 1 else [])
        else:
            needs.append([(n + st + 1) * m + mb] if st < n - 1 else [])
            makes.append([(n + st) * m + mb] if st > 0 else [])
    need = lambda i: [] if i is None else needs[i]  # noqa: E731
    fwds = [i for i, k in enumerate(kinds) if k == 0]
    bwds = [i for i, k in enumerate(kinds) if k != 0]
    pairs = list(zip(fwds[warm:], bwds))
    cool = bwds[len(pairs):]
    after = lambda xs, i: xs[j] if (j := bisect_right(xs, i)) < len(xs) else None  # noqa: E731  (xs ascending)
    out: list = []
    call = lambda sends, recvs: out.append((sends, recvs))  # noqa: E731
    if not looped:
        for i in fwds[:warm]:
            call([], need(i))
            out.append(i)
            call(makes[i], [])
        if pairs:
            call([], need(pairs[0][0]))
        for k, (f, b) in enumerate(pairs):
            out.append(f)
            call(makes[f], need(b))
            out.append(b)
            call(makes[b], need(pairs[k + 1][0]) if k + 1 < len(pairs) else [])
        for b in cool:
            call([], need(b))
            out.append(b)
            call(makes[b], [])
        return out
    call([], need(fwds[0]) if fwds else [])
    for k, i in enumerate(fwds[:warm]):
        out.append(i)
        last = k == warm - 1
        call(makes[i], need(after(fwds, i)) + (need(bwds[0]) if last and pairs else []))
    if not pairs and bwds:
        call([], need(bwds[0]))
    for f, b in pairs:
        out += [f, b]
        call(makes[f] + makes[b], need(after(fwds, f)) + need(after(bwds, b)))
    for b in cool:
        out.append(b)
        call(makes[b], need(after(bwds, b)))
    return out


def simulate_blocking(sched: Schedule, fwd, bwd, transfer: float = 0.0, act_bytes=None, keep_timeline: bool = False) -> SimResult:
    """Run compiled 1F1B or interleaved ``sched`` with every exchange blocking (module docstring);
    ``fwd``/``bwd`` per virtual stage, ``transfer`` the time of one send/receive."""
    p, n = sched.pp, sched.n_stages
    f, b = np.asarray(fwd, dtype=float), np.asarray(bwd, dtype=float)
    looped = n > p
    m = int(max((int(mb.max()) for mb in sched.mb if len(mb)), default=-1)) + 1
    progs, durations = [], []
    for r, (kd, sg, mb) in enumerate(zip(sched.kind, sched.stage, sched.mb)):
        kinds, stages = kd.tolist(), sg.tolist()
        warm = warmup_forwards(p, sched.microbatches, n // p, 2 if looped else 1, r)
        progs.append(_program(kinds, stages, mb.tolist(), n, looped, warm, m))
        durations.append([float((f if kind == 0 else b)[k]) for kind, k in zip(kinds, stages)])
    # each call numbered g (a program item −g − 1), with the ranks and calls at its messages' other ends
    call_rank: list[int] = []
    sender: dict[int, int] = {}  # message -> the call that sends it
    receiver: dict[int, int] = {}  # and the call that receives it
    for r, prog in enumerate(progs):
        for j, item in enumerate(prog):
            if type(item) is tuple:
                g = len(call_rank)
                call_rank.append(r)
                sender.update(dict.fromkeys(item[0], g))
                receiver.update(dict.fromkeys(item[1], g))
                prog[j] = (g, item)
    if sender.keys() != receiver.keys():
        raise ValueError(f"messages sent or received only once: {sorted(sender.keys() ^ receiver.keys())[:3]}")
    partners: list[tuple[int, ...]] = [()] * len(call_rank)
    for prog in progs:
        for j, item in enumerate(prog):
            if type(item) is tuple:
                g, (sends, recvs) = item
                partners[g] = tuple(receiver[msg] for msg in sends) + tuple(sender[msg] for msg in recvs)
                prog[j] = -g - 1
    clock = [0.0] * p  # each rank's time at its next item
    pos = [0] * p  # each rank's next item
    reached = [-1.0] * len(call_rank)  # per call: when its rank got there (−1: not yet)
    starts: list[list[float]] = [[0.0] * len(d) for d in durations]
    work, queued = deque(range(p)), [True] * p  # ranks to advance, each queued once
    while work:
        r = work.popleft()
        queued[r] = False
        prog, dur, start = progs[r], durations[r], starts[r]
        i, t = pos[r], clock[r]
        while i < len(prog):
            item = prog[i]
            if item >= 0:  # an action
                start[item] = t
                t += dur[item]
                i += 1
                continue
            g = -item - 1
            reached[g] = t
            others = partners[g]
            if any(reached[o] < 0 for o in others):
                break  # a neighbour has not reached its end of the exchange yet
            if others:
                t = max(t, max(reached[o] for o in others)) + transfer
            i += 1
            for o in others:
                rank = call_rank[o]
                if not queued[rank]:
                    queued[rank] = True
                    work.append(rank)
        pos[r], clock[r] = i, t
    if any(pos[r] < len(progs[r]) for r in range(p)):
        raise ValueError("the blocking exchanges deadlock: a rank waits for a neighbour that never reaches the exchange")
    finish = tuple(clock)
    live = schedule_live_counts(sched, n)
    act = np.asarray(act_bytes, dtype=float) if act_bytes is not None else np.zeros(n)
    timeline = None
    if keep_timeline:
        timeline = tuple(tuple((a, starts[r][i], starts[r][i] + durations[r][i]) for i, a in enumerate(acts))
                         for r, acts in enumerate(sched.actions()))
    return SimResult(
        makespan=max(finish) if finish else 0.0,
        finish=finish,
        busy=tuple(float(sum(d)) for d in durations),
        peak_inflight=tuple(live[r][2] for r in range(p)),
        peak_activation=tuple(peak_bytes(live[r][1], act[live[r][0]]) for r in range(p)),
        timeline=timeline,
    )
