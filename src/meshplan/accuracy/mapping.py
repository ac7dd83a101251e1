"""The ground truth as meshplan plans: each run's id prefix picks the mapper of its source
(:mod:`meshplan.accuracy.megatron`, :mod:`meshplan.accuracy.meta`, :mod:`meshplan.accuracy.others`),
whose :class:`~meshplan.accuracy.runs.MappedRun` rows are checked as ``estimate`` checks a plan."""

from __future__ import annotations

from typing import Any, Callable

from meshplan.accuracy import megatron, meta, others
from meshplan.accuracy.runs import MappedRun, published_runs, unsupported
from meshplan.errors import InputError
from meshplan.specs.validate import check_plan

Mapper = Callable[[dict[str, Any]], list[MappedRun]]


def _mappers() -> list[tuple[str, str, Mapper]]:
    return [
        ("narayanan21_", "narayanan21", megatron.map_narayanan21),
        ("korthikanti22_", "korthikanti22", megatron.map_korthikanti22),
        ("megatron_readme_", "megatron_readme", megatron.map_megatron_readme),
        ("llama3_", "llama3", meta.map_llama3),
        ("bloom_", "bloom", others.map_bloom),
        ("opt_", "opt", others.map_opt),
        ("gpt_neox_", "neox", others.map_neox),
        ("torchtitan_", "torchtitan", meta.map_torchtitan),
        ("trainy_", "trainy", meta.map_trainy),
    ]


def group_of(run_id: str) -> str:
    for prefix, group, _ in _mappers():
        if run_id.startswith(prefix):
            return group
    return "other"


def map_run(raw: dict[str, Any]) -> list[MappedRun]:
    """The meshplan form of one ground-truth run (a list: some rows hold several measurements).
    A run no mapper knows, or whose plan meshplan refuses, comes back unsupported with the
    reason."""
    for prefix, group, mapper in _mappers():
        if raw["id"].startswith(prefix):
            try:
                runs = mapper(raw)
                for run in runs:
                    if run.supported:  # the checks ``estimate`` makes, so refusals surface here
                        check_plan(run.model, run.cluster, run.plan)
                return runs
            except InputError as exc:
                return [unsupported(raw, group, str(raw.get("source", ""))[:60], f"meshplan cannot express the plan: {exc}")]
    return [unsupported(raw, "other", str(raw.get("source", ""))[:60], "no mapping for this source yet")]


def map_runs() -> list[MappedRun]:
    """Every ground-truth run mapped, in file order. Not cached: the clusters carry the current
    calibration's latencies (``ClusterSpec.of``), exactly as ``meshplan estimate`` builds them."""
    out: list[MappedRun] = []
    for raw in published_runs():
        out.extend(map_run(raw))
    return out
