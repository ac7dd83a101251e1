"""The whole object ``meshplan estimate --json`` prints (and ``/api/estimate`` serves): the
estimate's own JSON (:func:`meshplan.estimate_json.estimate_json`, ``Estimate.to_dict``) with
the run with failures under ``run.failures`` (:mod:`meshplan.calc.run_length`, with ``--tokens``),
the ``advice`` (:mod:`meshplan.advice`) and the step time's prediction interval
(:mod:`meshplan.accuracy.interval`): ``time.step_s_interval``, ``time.interval_level``,
``time.interval_basis``, and the ranges that follow from it — days, GPU-hours and dollars scale
with the step time (``[x · low / step, x · high / step]``), MFU inversely
(``[mfu · step / high, mfu · step / low]``); docs/schema.md."""

from __future__ import annotations

from typing import Any

from meshplan.accuracy.interval import LEVEL, StepInterval, estimate_interval
from meshplan.advice import Advice, advise
from meshplan.calc.run_length import FailureModel, for_estimate


def extras(est, failure_model: FailureModel = FailureModel(), advice: bool = True,
           batch_flag: str = "--global-batch") -> tuple[dict[str, Any] | None, list[Advice]]:
    """The run with failures (None without tokens) and the advice (empty when not asked) of ``est``."""
    tips = advise(est.model, est.cluster, est.plan, est, est.budget, batch_flag=batch_flag) if advice else []
    return for_estimate(est, failure_model), tips


def report_json(est, failures: dict[str, Any] | None, tips: list[Advice], level: float = LEVEL) -> dict[str, Any]:
    """``est.to_dict()`` with ``run.failures``, ``advice`` and the interval at ``level``."""
    d = est.to_dict()
    if failures is not None:
        d["run"]["failures"] = failures
    d["advice"] = [a.to_dict() for a in tips]
    add_interval(d, estimate_interval(est, level))
    return d


def add_interval(d: dict[str, Any], iv: StepInterval) -> None:
    """The interval's fields in an estimate's JSON ``d`` (module docstring)."""
    d["time"].update(iv.to_dict())
    mfu = d["throughput"]["mfu"]
    d["throughput"]["mfu_interval"] = [mfu * iv.step_s / iv.high, mfu * iv.step_s / iv.low]
    run = d.get("run")
    for key in ("days", "gpu_hours", "dollars"):
        if run and key in run:
            run[f"{key}_interval"] = list(iv.scaled(run[key]))
