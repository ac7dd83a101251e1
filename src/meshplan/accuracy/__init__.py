"""Accuracy against published training runs (the library side of ``meshplan validate``).

:func:`map_runs` turns every run of ``catalog/data/published_runs.yaml`` into a meshplan plan (or
an ``unsupported`` row with its reason), with the published step time derived by the source's own
FLOP formula and every unstated setting recorded as an assumption; :func:`validate_runs` predicts
them with the same ``estimate`` as ``meshplan estimate`` and reports errors and MAPE per source.
"""

from meshplan.accuracy.mapping import map_run, map_runs
from meshplan.accuracy.runs import MappedRun, published_run, published_runs
from meshplan.accuracy.validate import RUN_SETS, GroupSummary, RunResult, ValidationReport, predict, runs_of, validate_runs

__all__ = [
    "RUN_SETS",
    "GroupSummary",
    "MappedRun",
    "RunResult",
    "ValidationReport",
    "map_run",
    "map_runs",
    "predict",
    "published_run",
    "published_runs",
    "runs_of",
    "validate_runs",
]
