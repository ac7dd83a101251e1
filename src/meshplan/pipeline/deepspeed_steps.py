"""DeepSpeed's pipeline engine: 1F1B in lockstep steps, its sends and receives blocking.

DeepSpeed's ``PipelineEngine`` (used by Megatron-DeepSpeed: BLOOM, GPT-NeoX, MT-NLG) runs
``TrainSchedule`` (``deepspeed/runtime/pipe/schedule.py``): 2·(m + p − 1) steps, where stage s
runs a forward on the steps of its own parity and a backward on the others — micro-batch
⌊t/2⌋ − ⌊s/2⌋ forward on an even step of an even stage (⌊(t − 1)/2⌋ − ⌊s/2⌋ on an odd step of an
odd one), ⌊t/2⌋ − p + ⌊(s + 1)/2⌋ backward on an even step of an odd stage (⌊(t − 1)/2⌋ − p + 1 +
⌊s/2⌋ on an odd step of an even one), nothing where the id is outside 0 .. m − 1. Per stage that
is 1F1B's order (p − s warm-up forwards, then forward/backward pairs), but each step begins with
its exchanges: a forward step sends the gradient of the stage's previous backward to s − 1 and
receives its activation from s − 1; a backward step receives its gradient from s + 1 and sends the
activation of the previous forward to s + 1. Neighbours have opposite parities, so at every step a
stage exchanges with one neighbour only, which runs the matching pair in the same order. The
exchanges are ``p2p.send``/``p2p.recv`` (``deepspeed/runtime/pipe/p2p.py``): NCCL point-to-point
on the compute stream, which completes only when both ends have posted it, before the step's
compute. With c_s(t) the end of stage s's compute at step t (c_s(−1) = 0), q its partner at step
t, k ∈ {0, 1, 2} the transfers they exchange and τ one transfer:

    e_s(t) = max(c_s(t − 1), c_q(t − 1)) + k·τ   (k > 0; else c_s(t − 1))
    c_s(t) = e_s(t) + d_s(t)

d_s(t) the step's forward or backward (0 when none). The gradient reduction, optimizer and tied
weights' reduction run after the last step (``ReduceGrads``, ``OptimizerStep``): after the drain,
not overlapped (the profiles' ``overlap_grad_reduce`` false). Every data dependency of the
dependency-driven simulation holds here too, with the same order per stage, so the makespan is
never shorter; it is longer where a stage waits for a neighbour that is still computing to
exchange what neither needs yet (tests/test_deepspeed_steps.py).
"""

from __future__ import annotations

import numpy as np

from meshplan.pipeline.inflight import schedule_live_counts
from meshplan.pipeline.live import peak_bytes
from meshplan.pipeline.result import SimResult
from meshplan.pipeline.schedules import Schedule


def runs_deepspeed(schedule: str, pp: int, runtime: str, m: int = 0) -> bool:
    """Whether a plan runs DeepSpeed's ``TrainSchedule``: its runtime ``deepspeed``, schedule
    1F1B (the only one the engine runs) and more than one pipeline rank (any ``m``)."""
    return runtime == "deepspeed" and schedule == "1f1b" and pp > 1


def step_action(t: int, s: int, p: int) -> tuple[int, bool]:
    """(micro-batch, forward?) of stage ``s`` of ``p`` at step ``t`` of ``TrainSchedule``
    (``_step_to_micro_batch``; the micro-batch may be outside 0 .. m − 1: nothing to run)."""
    if t % 2 == s % 2:
        return (t // 2 if t % 2 == 0 else (t - 1) // 2) - s // 2, True
    if t % 2 == 0:  # an odd stage's backward
        return t // 2 - p + (s + 1) // 2, False
    return (t - 1) // 2 - p + 1 + s // 2, False


def train_steps(p: int, m: int) -> list[list[tuple[int, int, bool]]]:
    """Per stage, its (step, micro-batch, forward?) with a micro-batch to run, in order."""
    out: list[list[tuple[int, int, bool]]] = [[] for _ in range(p)]
    for t in range(2 * (m + p - 1)):
        for s in range(p):
            mb, forward = step_action(t, s, p)
            if 0 <= mb < m:
                out[s].append((t, mb, forward))
    return out


def simulate_deepspeed(sched: Schedule, fwd, bwd, transfer: float = 0.0, act_bytes=None, keep_timeline: bool = False) -> SimResult:
    """Run compiled 1F1B ``sched`` (one stage per rank) as DeepSpeed's ``TrainSchedule`` (module
    docstring); ``fwd``/``bwd`` per stage, ``transfer`` the time of one send/receive."""
    p, m = sched.pp, sched.microbatches
    f, b = np.asarray(fwd, dtype=float), np.asarray(bwd, dtype=float)
    n_steps = 2 * (m + p - 1)
    valid = lambda mb: 0 <= mb < m  # noqa: E731
    c = np.zeros(p)
    prev = [-1] * p  # each stage's micro-batch of the previous step
    spans: list[list[tuple[float, float]]] = [[] for _ in range(p)]  # per stage, (start, end) of its actions
    busy = np.zeros(p)
    for t in range(n_steps):
        acts = [step_action(t, s, p) for s in range(p)]
        e = c.copy()
        for s in range(1, p):  # a forward step exchanges with s − 1, which runs a backward step
            mb, forward = acts[s]
            if forward:
                k = int(valid(prev[s])) + int(valid(mb))  # SendGrad(previous), RecvActivation(current)
                if k:
                    e[s] = e[s - 1] = max(c[s], c[s - 1]) + k * transfer
        d = np.array([(f[s] if acts[s][1] else b[s]) if valid(acts[s][0]) else 0.0 for s in range(p)])
        if keep_timeline:
            for s in range(p):
                if d[s]:
                    spans[s].append((float(e[s]), float(e[s] + d[s])))
        busy += d
        c = e + d
        prev = [a[0] for a in acts]
    live = schedule_live_counts(sched, p)
    act = np.asarray(act_bytes, dtype=float) if act_bytes is not None else np.zeros(p)
    finish = tuple(float(x) for x in c)
    return SimResult(
        makespan=max(finish) if finish else 0.0,
        finish=finish,
        busy=tuple(float(x) for x in busy),
        peak_inflight=tuple(live[r][2] for r in range(p)),
        peak_activation=tuple(peak_bytes(live[r][1], act[live[r][0]]) for r in range(p)),
        # the stages run 1F1B's actions in 1F1B's order (tests/test_deepspeed_steps.py)
        timeline=tuple(tuple((a, *span) for a, span in zip(acts, spans[r])) for r, acts in enumerate(sched.actions()))
        if keep_timeline else None,
    )
