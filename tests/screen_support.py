"""A check shared by the tests that hold the search's screen to ``estimate``."""

from __future__ import annotations

import numpy as np

from meshplan.estimate import estimate
from meshplan.search.engine import Engine
from meshplan.search.run import plan_of
from meshplan.specs.plan import TrainingPlan


def sampled_peaks_match(model, cluster, base: TrainingPlan, table, samples: int, seed: int, stack=None,
                        bounds: bool = False) -> list[TrainingPlan]:
    """:func:`peaks_match` on ``samples`` plans of ``table`` drawn with ``seed``."""
    rows = np.random.default_rng(seed).choice(len(table), samples, replace=False).tolist()
    return peaks_match(model, cluster, base, table, rows, stack, bounds)


def peaks_match(model, cluster, base: TrainingPlan, table, rows: list[int], stack=None, bounds: bool = False) -> list[TrainingPlan]:
    """Screen ``table`` for ``stack`` (default: the base's) and assert that its plans ``rows`` have
    the peak memory ``estimate`` gives them, to the bit (with ``bounds``, also a step lower bound
    no longer than their step); their plans."""
    screen = Engine(model, cluster, base, stack).evaluate(table)
    plans = []
    for i in rows:
        plan = plan_of(base, table, i, stack)
        est = estimate(model, cluster, plan)
        assert screen.peak_bytes[i] == est.peak_bytes, table.row(i)
        assert not bounds or screen.step_lower_bound[i] <= est.time.step_s * (1 + 1e-12), table.row(i)
        plans.append(plan)
    return plans
