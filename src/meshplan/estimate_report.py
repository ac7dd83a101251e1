"""The whole object ``meshplan estimate --json`` prints (and ``/api/estimate`` serves): the
estimate's own JSON (:func:`meshplan.estimate_json.estimate_json`, ``Estimate.to_dict``) with
the run with failures under ``run.failures`` (:mod:`meshplan.calc.run_length`, with ``--tokens``)
and the ``advice`` (:mod:`meshplan.advice`); docs/schema.md."""

from __future__ import annotations

from typing import Any

from meshplan.advice import Advice, advise
from meshplan.calc.run_length import FailureModel, for_estimate


def extras(est, failure_model: FailureModel = FailureModel(), advice: bool = True,
           batch_flag: str = "--global-batch") -> tuple[dict[str, Any] | None, list[Advice]]:
    """The run with failures (None without tokens) and the advice (empty when not asked) of ``est``."""
    tips = advise(est.model, est.cluster, est.plan, est, est.budget, batch_flag=batch_flag) if advice else []
    return for_estimate(est, failure_model), tips


def report_json(est, failures: dict[str, Any] | None, tips: list[Advice]) -> dict[str, Any]:
    """``est.to_dict()`` with ``run.failures`` and ``advice``."""
    d = est.to_dict()
    if failures is not None:
        d["run"]["failures"] = failures
    d["advice"] = [a.to_dict() for a in tips]
    return d
