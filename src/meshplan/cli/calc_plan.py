"""The inputs of ``meshplan calc checkpoint`` and ``calc failures`` taken from a plan.

Both commands take the plan options of ``meshplan estimate`` (``--preset``, ``--plan``, ``--model``,
``--gpus``, ... :data:`meshplan.cli.options.PLAN_OPTIONS`), resolved by the same
:func:`~meshplan.cli.options.resolve` and estimated by :func:`meshplan.estimate.estimate`: the
parameters and precision recipe give the checkpoint's size, the GPUs the writers and the cluster's
MTBF, the step time the interval in steps, ``--tokens`` the run's failure-free work. Without a plan
they take their inputs as before (``--params``, ``--work``, ``--checkpoint-time``).

Defaults that would answer silently with no sense are gone: with neither ``--mtbf`` nor
``--component``, the MTBF comes from the GPU count (a plan's, or ``--gpus``) at
:data:`meshplan.calc.run_length.FAILURES_PER_GPU_HOUR`, said in a note, and without any GPU count
``calc failures`` refuses and ``calc checkpoint`` says what it left out. The restart defaults to
:data:`meshplan.calc.checkpoint.DEFAULT_RECOVERY_S` in both (``--recovery read-back``: the write
time, as source 001 counts it).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Optional

from meshplan.calc import failures as fail_mod
from meshplan.calc.checkpoint import checkpoint_size, write_time
from meshplan.calc.inputs import count, parse_duration, parse_number, positive
from meshplan.calc.run_length import FAILURES_PER_GPU_HOUR, FS_BW, RATE_SOURCE, WRITE_BW_PER_GPU, gpu_mtbf
from meshplan.cli.options import PlanArgs, resolve
from meshplan.errors import InputError
from meshplan.specs.plan import PrecisionRecipe
from meshplan.units import GBPS, HOUR

#: plan options that the calculators also read without a plan (the checkpoint's recipe, --gpus, --price)
STANDALONE = ("precision", "grad_dtype", "master_weights", "gpus", "price")
READ_BACK = "read-back"


def plan_given(plan: PlanArgs) -> bool:
    """Whether any plan option beyond :data:`STANDALONE` was given."""
    return any(v is not None for k, v in asdict(plan).items() if k not in STANDALONE)


def estimate_of(plan: PlanArgs):
    """The plan's :class:`~meshplan.estimate.Estimate` (options resolved as ``meshplan estimate``'s)."""
    from meshplan.estimate import estimate

    setup = resolve(plan)
    return estimate(setup.model, setup.cluster, setup.plan, setup.budget)


def mtbf_of(mtbf: Optional[str], components: Optional[list[str]], gpus: Optional[int], notes: list[str]) -> Optional[float]:
    """``--mtbf``, or ``1/Σ(count/mtbf)`` of ``--component``, or the GPU count's ``1/(N·λ)`` (noted),
    or None."""
    if mtbf is not None and components:
        raise InputError("mtbf", "give the cluster's --mtbf or its --component rates, not both")
    if components:
        return fail_mod.cluster_mtbf([component(c) for c in components])
    if mtbf is not None:
        return parse_duration("mtbf", mtbf)
    if gpus is None:
        return None
    M = gpu_mtbf(gpus)
    notes.append(f"MTBF {M / HOUR:.3g} h derived from {gpus:,} GPUs at {FAILURES_PER_GPU_HOUR:.4g} failures per GPU-hour "
                 f"({RATE_SOURCE}); give --mtbf or --component to set it")
    return M


def component(text: str) -> fail_mod.Component:
    parts = text.split(":")
    if len(parts) != 3:
        raise InputError("component", f"'{text}' must be name:count:mtbf, e.g. gpu:16384:50000h")
    return fail_mod.Component(parts[0], count("component count", parse_number("component", parts[1])), parse_duration("component", parts[2]))


def recovery_of(text: str) -> Optional[float]:
    """Seconds, or None for :data:`READ_BACK` (the library's restart = write time)."""
    return None if text.strip().lower() == READ_BACK else parse_duration("recovery", text)


def checkpoint_inputs(plan: PlanArgs, params: Optional[str], write_bw: Optional[float], writers: Optional[int],
                      fs_bw: Optional[float], optimizer: str, notes: list[str]) -> dict[str, Any]:
    """``calc checkpoint``'s size, writers and plan figures: from ``--params`` and the recipe
    options (one writer at 10 GB/s unless told, source 001), or from the plan (every GPU a writer
    at 1 GB/s up to 2 TB/s, as ``estimate --tokens``; its step time and run length)."""
    if write_bw is not None:
        positive("write_bw", write_bw)
    if fs_bw is not None:
        positive("fs_bw", fs_bw, allow_zero=True)
    if params is not None:
        if plan_given(plan):
            raise InputError("params", "give --params or a plan (--preset, --plan, --model, ...), not both")
        recipe = PrecisionRecipe.build(where="precision", precision=plan.precision or "bf16", grad_dtype=plan.grad_dtype or "fp32",
                                       master_weights=True if plan.master_weights is None else plan.master_weights, optimizer=optimizer)
        return {"params": parse_number("params", params), "recipe": recipe, "writer_bw": (10.0 if write_bw is None else write_bw) * GBPS,
                "writers": 1 if writers is None else writers, "fs_bw": fs_bw * GBPS if fs_bw else None,
                "gpus": plan.gpus, "price": plan.price, "step_time": None, "run_time": None}
    if not plan_given(plan):
        raise InputError("params", "give --params, or a plan: --preset, --plan or estimate flags such as --model and --gpus")
    est = estimate_of(plan)
    run = est.run_cost()
    cap = FS_BW if fs_bw is None else fs_bw * GBPS
    notes.append(f"from the plan: {est.model.name}, {est.params.total:,} parameters, {est.plan.num_gpus:,} GPUs each writing "
                 f"its shard at {(WRITE_BW_PER_GPU if write_bw is None else write_bw * GBPS) / GBPS:g} GB/s"
                 + (f", at most {cap / GBPS:g} GB/s in total" if cap else "") + f"; step {est.time.step_s:.4g} s")
    return {"params": float(est.params.total), "recipe": est.plan.precision,
            "writer_bw": WRITE_BW_PER_GPU if write_bw is None else write_bw * GBPS,
            "writers": est.plan.num_gpus if writers is None else writers, "fs_bw": cap or None, "gpus": est.plan.num_gpus,
            "price": est.budget.price_per_gpu_hour, "step_time": est.time.step_s, "run_time": run["seconds"] if run else None}


def failures_inputs(plan: PlanArgs, work: Optional[str], checkpoint_time: Optional[str], notes: list[str]) -> dict[str, Any]:
    """``calc failures``' work, checkpoint time and GPU count: as given, the rest from the plan
    (its ``--tokens`` run's step time, its checkpoint as ``estimate --tokens`` writes it)."""
    W = None if work is None else parse_duration("work", work)
    C = None if checkpoint_time is None else parse_duration("checkpoint_time", checkpoint_time)
    if not plan_given(plan):
        if W is None or C is None:
            raise InputError("work" if W is None else "checkpoint_time",
                             "give --work and --checkpoint-time, or a plan: --preset, --plan or estimate flags (with --tokens)")
        return {"work": W, "checkpoint": C, "gpus": plan.gpus}
    est = estimate_of(plan)
    if W is None:
        run = est.run_cost()
        if run is None:
            raise InputError("work", "give --work, or --tokens for the plan's failure-free run time")
        W = run["seconds"]
        notes.append(f"work: {run['tokens']:.4g} tokens at the plan's {est.time.step_s:.4g} s per step, {W / HOUR / 24:,.2f} days")
    if C is None:
        size = checkpoint_size(est.params.total, est.plan.precision)
        C = write_time(size, WRITE_BW_PER_GPU, est.plan.num_gpus, FS_BW)
        notes.append(f"checkpoint time: {size / 1e12:,.3g} TB written by {est.plan.num_gpus:,} GPUs at {WRITE_BW_PER_GPU / GBPS:g} GB/s "
                     f"each, at most {FS_BW / GBPS:g} GB/s in total: {C:.3g} s")
    return {"work": W, "checkpoint": C, "gpus": est.plan.num_gpus}
