"""Every published run of ``meshplan validate`` as a preset of ``meshplan estimate``.

``meshplan estimate --preset <run id>`` (and ``explain``, ``search`` and ``export``) starts from
the plan ``validate`` predicts for that row — the same model, cluster and plan, so the estimate
is the row's prediction to the last digit — and prints the published step time and peak memory
beside meshplan's, with every assumption made where the source is silent. Other options override
the plan as they override a named preset's: ``--preset torchtitan_405b_512gpu_3d_1f1b --schedule
interleaved --vpp 2`` asks what the run would have done with the other schedule.

The row ids are those ``validate`` prints (``--set all``), case-insensitive: the ground truth's
ids, ``<id>@<n>gpu`` where a row holds several measurements, and the held-out runs' ids.
"""

from __future__ import annotations

from difflib import get_close_matches
from functools import lru_cache
from typing import Any

from meshplan.accuracy.runs import MappedRun
from meshplan.accuracy.validate import runs_of
from meshplan.errors import InputError
from meshplan.interop import extra_fields_of, options_of_fields
from meshplan.named_presets import Preset, Published
from meshplan.units import GBPS


@lru_cache(maxsize=1)
def _runs() -> dict[str, MappedRun]:
    """Every mapped run, visible and held out, by lower-case row id."""
    return {r.id.lower(): r for r in runs_of("all")}


def run_ids() -> list[str]:
    """The row ids a preset may name, in ``validate``'s order (unsupported rows included)."""
    return [r.id for r in _runs().values()]


def supported_runs() -> list[tuple[str, str]]:
    """(row id, one line) of every run a preset can estimate, in ``validate``'s order."""
    return [(r.id, f"{r.source}: {r.gpus:,} x {r.gpu}") for r in _runs().values() if r.supported]


def close_run_ids(name: str, n: int = 3) -> list[str]:
    """Up to ``n`` row ids that look like ``name`` (difflib's ratio ≥ 0.6)."""
    return [_runs()[k].id for k in get_close_matches(name.strip().lower(), list(_runs()), n=n)]


def run_values(run: MappedRun) -> tuple[dict[str, Any], dict[str, Any]]:
    """The mapped run as (option values, plan fields no option sets): the model and GPU as specs,
    the cluster's node size, NIC bandwidth and pods, and every plan field."""
    plan, cluster = run.plan, run.cluster
    assert plan is not None and cluster is not None and run.model is not None
    fields = plan.model_dump()
    values = options_of_fields(fields)  # the stack as its profile and what the plan sets over it
    values.update(
        model=run.model, gpu=cluster.gpu, gpus=cluster.num_gpus, gpus_per_node=cluster.scale_up.size,
        nic_gbps=cluster.scale_out.bandwidth / GBPS, pod_size=cluster.pod_size,
        oversubscription=cluster.oversubscription, attention_flops=plan.attention_flops,
    )
    return values, extra_fields_of(fields)


def run_preset(name: str) -> Preset | None:
    """The preset of the published run whose row id is ``name`` (case-insensitive), None when no
    row has that id; a row meshplan cannot express is an error that gives its reason."""
    run = _runs().get(name.strip().lower())
    if run is None:
        return None
    if not run.supported:
        raise InputError("preset", f"published run '{run.id}' cannot be estimated: {run.reason}")
    values, extra = run_values(run)
    published = Published(source=run.source, step_s=run.published_step_s, peak_memory_gib=run.published_mem_gib)
    notes = ((f"published step time: {run.formula}",) if run.formula else ()) + tuple(run.assumptions)
    return Preset(
        name=run.id,
        description=f"published run of `meshplan validate` ({run.group}), {run.gpus:,} x {run.gpu}",
        values=values, published=published, notes=notes, extra=extra,
    )
