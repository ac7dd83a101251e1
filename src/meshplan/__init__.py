"""meshplan: plan distributed training of large language models.

Given a model, a cluster and a training plan run by a software stack, meshplan says whether the
plan fits in GPU memory (per pipeline stage), how long a step takes and where the time goes, the
MFU, and what a token budget costs, and it can show the derivation of every figure.

The library in ten lines::

    from meshplan import ClusterSpec, TrainingPlan, estimate, load_gpu, load_model, load_stack, search

    model = load_model("llama3-70b")
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 512)
    plan = TrainingPlan(tp=8, dp=64, global_batch=1024, seq_len=4096, stack=load_stack("torchtitan"))
    est = estimate(model, cluster, plan)
    print(est.time.step_s, est.peak_bytes / 2**30, est.mfu)
    best = search(model, cluster, plan).top[0].estimate
    print(best.plan.tp, best.plan.pp, best.time.step_s)

``estimate`` and ``search`` are imported with the package: they share their names with the
modules that define them (``meshplan.estimate``, ``meshplan.search``), and the package's attribute
is the function (reach the modules with ``importlib.import_module``). The other names are imported
on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from meshplan.errors import InputError
from meshplan.estimate import estimate  # noqa: E402  (after the module above: the name is the function)
from meshplan.search.run import search

__version__ = "0.1.0"

#: public name -> the module that defines it
_PUBLIC = {
    "Estimate": "meshplan.estimate",
    "Budget": "meshplan.estimate",
    "SearchLimits": "meshplan.search.space",
    "TrainingPlan": "meshplan.specs.plan",
    "PrecisionRecipe": "meshplan.specs.plan",
    "Stack": "meshplan.specs.stack",
    "ModelSpec": "meshplan.specs.model",
    "ClusterSpec": "meshplan.specs.hardware",
    "GPUSpec": "meshplan.specs.hardware",
    "load_model": "meshplan.catalog",
    "load_gpu": "meshplan.catalog",
    "load_stack": "meshplan.catalog",
    "stack_names": "meshplan.catalog",
    "validate_runs": "meshplan.accuracy.validate",
}

__all__ = ["InputError", "__version__", "estimate", "search", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'meshplan' has no attribute {name!r}")
    value = getattr(import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
