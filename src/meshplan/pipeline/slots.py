"""A pipeline rank's action list as slot numbers, what the simulators' clocks index.

Every action of a schedule, (kind, stage, micro-batch), gets one slot; each action on a rank then
reads as its own slot and the slot of the action it waits for (:func:`rank_program`), shared by
the dependency-driven simulator (:mod:`meshplan.pipeline.simulate`) and the lockstep one
(:mod:`meshplan.pipeline.lockstep`).
"""

from __future__ import annotations

import numpy as np

from meshplan.pipeline.schedules import Schedule


def rank_program(sched: Schedule, r: int, n_stages: int, m: int):
    """Rank r's actions as flat arrays: own slot and dependency slot.

    Slots number (kind, stage, micro-batch) as ((κ·S + stage)·M + mb) with κ = 0 for F, 1 for the
    input-gradient producers B and I, 2 for W. A dependency on another rank is a real slot, whose
    ready time includes the transfer; one on this rank (the last stage's B or I on its own F, a W
    on its I, ZBV's turn from stage p − 1 to p) needs no transfer and is checked here once — the
    producer must come earlier in the rank's list — and then points at the last slot, 3·S·M,
    which is "done at time 0", as do the first stage's forwards."""
    kind, stage, mb = sched.kind[r], sched.stage[r], sched.mb[r]
    S, M = n_stages, m
    kappa = np.array([0, 1, 1, 2], dtype=np.int64)[kind]
    own = (kappa * S + stage) * M + mb
    is_f, is_w = kind == 0, kind == 3
    free_dep = 3 * S * M
    dep = np.where(
        is_f,
        np.where(stage > 0, (stage - 1) * M + mb, free_dep),
        np.where(is_w, (S + stage) * M + mb, np.where(stage == S - 1, stage * M + mb, (S + stage + 1) * M + mb)),
    )
    if own.size:
        order = np.argsort(own, kind="stable")  # first occurrence of each slot first
        sorted_own = own[order]
        at = np.minimum(np.searchsorted(sorted_own, dep), own.size - 1)
        here = sorted_own[at] == dep  # produced on this rank
        if (order[at][here] > np.flatnonzero(here)).any():
            raise RuntimeError("pipeline schedule deadlocked: an action comes before what it needs on its own rank")
        dep = np.where(here, free_dep, dep)
    return own, dep
