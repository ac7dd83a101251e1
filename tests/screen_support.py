"""A check shared by the tests that hold the search's screen to ``estimate``."""

from __future__ import annotations

import numpy as np

from meshplan.estimate import estimate
from meshplan.search.engine import Engine
from meshplan.search.run import plan_of
from meshplan.specs.plan import TrainingPlan


def sampled_peaks_match(model, cluster, base: TrainingPlan, table, samples: int, seed: int) -> list[TrainingPlan]:
    """Screen ``table`` and assert that ``samples`` of its plans, drawn with ``seed``, have the peak
    memory ``estimate`` gives them, to the bit; the plans drawn."""
    screen = Engine(model, cluster, base).evaluate(table)
    plans = []
    for i in np.random.default_rng(seed).choice(len(table), samples, replace=False).tolist():
        plan = plan_of(base, table, i)
        assert screen.peak_bytes[i] == estimate(model, cluster, plan).peak_bytes, table.row(i)
        plans.append(plan)
    return plans
