"""The plan endpoints: ``/api/estimate`` (the schema of ``meshplan estimate --json``),
``/api/explain`` (the derivations ``meshplan explain`` prints), ``/api/view/plan`` (what the Plan
view draws, in one request) and the catalogs.

The query parameters are the plan options of ``meshplan estimate`` (:data:`PLAN_OPTIONS`, one name
per option: ``seq_len`` for ``--seq-len``) and are resolved by the CLI's own
:func:`~meshplan.cli.options.resolve`: defaults, then the preset, then what the request gives.
Only catalog models are accepted: the server reads no file a request names.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any, Optional
from urllib.parse import parse_qsl

from fastapi import APIRouter, Query, Request, Response
from pydantic import ConfigDict, Field, ValidationError, create_model

from meshplan.catalog import gpu_entry, gpu_names, load_gpu, model_names
from meshplan.cli.options import PLAN_OPTIONS, PlanArgs, Setup, resolve
from meshplan.cli.pipeline_cmd import to_json as pipeline_json
from meshplan.cli.render import BREAKDOWN_LABELS, gpu_row, published_table
from meshplan.errors import InputError
from meshplan.estimate import Estimate, estimate
from meshplan.estimate_report import extras, report_json
from meshplan.specs.stack import BEHAVIOUR_FIELDS
from meshplan.presets import PRESETS, Preset
from meshplan.specs.hardware import GPUSpec
from meshplan.specs.model import ModelSpec
from meshplan.units import GBPS, TFLOPS
from meshplan.web.estimate_cache import BoundedMap, EstimateCache

#: Most pipeline actions the Plan view's Gantt receives; larger plans are summarised without it
#: (and their timeline is not kept while estimating).
MAX_GANTT_ACTIONS = 20_000
#: Most micro-batch stages (micro-batches × pp × vpp) a request's estimate simulates: under a second
#: and 100 MB. More (a huge global batch on few GPUs) is refused before any work.
MAX_WEB_PLAN_STAGES = 131_072
#: Estimates kept as JSON for repeated requests of ``/api/estimate`` (by canonical options and by
#: raw query string: :mod:`meshplan.web.estimate_cache`).
ESTIMATE_CACHE = 1024
#: Plan view answers kept as JSON bytes, by the plan they resolve to: a slider moved back to a
#: value it had is answered at once (a Llama 3 405B view with its Gantt is about 270 KB).
VIEW_CACHE = 64

_SKIP = {"plan_file", "set_fields"}  # the server reads no file a request names; stack fields come by name
#: the stack's fields a request may set by name (each a ``--set FIELD=VALUE``); tp_comm_overlap is a plan option
STACK_QUERY = tuple(k for k in BEHAVIOUR_FIELDS if k not in PLAN_OPTIONS)


def _plan_query_model():
    fields: dict[str, Any] = {}
    for name, (tp, opt) in PLAN_OPTIONS.items():
        if name in _SKIP:
            continue
        fields[name] = (tp, Field(None, description=opt.help))
    for name in STACK_QUERY:
        fields[name] = (Optional[str], Field(None, description=f"Override the stack's {name} (as --set {name}=VALUE)."))
    return create_model("PlanQuery", __config__=ConfigDict(extra="forbid"), **fields)


PlanQuery = _plan_query_model()
PlanParams = Annotated[PlanQuery, Query()]  # type: ignore[valid-type]


def plan_args(values: dict[str, Any]) -> PlanArgs:
    """Plan options (names of :data:`PLAN_OPTIONS`) as the CLI's :class:`PlanArgs`; models and GPUs
    must be catalog names."""
    unknown = sorted(set(values) - (set(PLAN_OPTIONS) - _SKIP) - set(STACK_QUERY))
    if unknown:
        raise InputError(unknown[0], "unknown field")
    model = values.get("model")
    if model is not None and model not in model_names():
        raise InputError("model", f"unknown model '{model}' (models: {', '.join(model_names())}); the web explorer takes catalog names only")
    gpu = values.get("gpu")
    if gpu is not None:
        try:
            gpu_entry(gpu)  # the server reads no GPU file a request names
        except InputError:
            raise InputError("gpu", f"unknown GPU '{gpu}' (GPUs: {', '.join(gpu_names())}); the web explorer takes catalog names only") from None
    sets = [f"{k}={values[k]}" for k in STACK_QUERY if values.get(k) not in (None, "")]
    args = {k: v for k, v in values.items() if v is not None and k not in STACK_QUERY}
    return PlanArgs(**args, set_fields=sets or None)


def bounded_setup(values: dict[str, Any]) -> Setup:
    """The CLI's resolution of plan options ``values``, refused (InputError on ``global_batch``)
    when its pipeline has more than :data:`MAX_WEB_PLAN_STAGES` micro-batch stages."""
    setup = resolve(plan_args(values))
    p = setup.plan
    stages = p.num_microbatches * p.pp * p.vpp
    if stages > MAX_WEB_PLAN_STAGES:
        raise InputError("global_batch", f"{p.num_microbatches:,} micro-batches × pp {p.pp} × vpp {p.vpp} = {stages:,} micro-batch "
                         f"stages, more than the {MAX_WEB_PLAN_STAGES:,} the web explorer simulates; take a smaller batch or more GPUs")
    return setup


def gantt_fits(setup: Setup) -> bool:
    """Whether the plan's pipeline (at most 3 actions a micro-batch stage) fits the Gantt."""
    p = setup.plan
    return 3 * p.num_microbatches * p.pp * p.vpp <= MAX_GANTT_ACTIONS


def run_estimate(setup: Setup, keep_timeline: bool = False) -> Estimate:
    return estimate(setup.model, setup.cluster, setup.plan, setup.budget, keep_timeline=keep_timeline)


def derivations(est: Estimate) -> list[dict[str, Any]]:
    return [{**asdict(d), "symbols": [list(s) for s in d.symbols]} for d in est.derivations]


def assumptions(est: Estimate) -> dict[str, Any]:
    """What the figures rest on: bytes per parameter of the recipe, the efficiency constants of the
    GPU generation with their rationale, the GPU's catalog figures and the units."""
    rec, cal, gpu = est.plan.precision, est.calibration, est.cluster.gpu
    constants = {k: v for k, v in asdict(cal).items() if k not in ("generation", "rationale")}
    return {
        "bytes_per_param": {
            "weights": rec.weight_bytes,
            "gradients": rec.grad_bytes,
            "master_weights": rec.master_bytes,
            "gradient_fp32_copy": rec.grad_copy_bytes,
            "optimizer_moments": rec.state_bytes,
            "total": rec.bytes_per_param,
            "activation_element": rec.activation_bytes,
        },
        "calibration": {"generation": cal.generation, "constants": constants, "rationale": cal.rationale},
        "gpu": {**gpu_row(gpu), "mfu_peak_tflops": est.mfu_peak / TFLOPS, "compute_dtype": rec.compute_dtype},
        "network": {
            "gpus_per_node": est.cluster.gpus_per_node,
            "scale_up_gbps": est.cluster.scale_up.bandwidth / GBPS,
            "scale_out_gbps": est.cluster.scale_out.bandwidth / GBPS,
            "pod_size": est.cluster.pod_size,
            "oversubscription": est.cluster.oversubscription,
        },
        "units": [
            "memory in GiB (2^30 bytes), as torch and nvidia-smi report",
            "bandwidth in GB/s (1e9 bytes/s) per GPU per direction",
            "peak FLOP/s dense (no 2:4 sparsity); MFU against the compute dtype's peak, FP8 runs against BF16",
            f"attention FLOPs counted {est.plan.attention_flops} ({'half the s² work' if est.plan.attention_flops == 'causal' else 'the full s² work'})",
            "bubble fraction = idle share of the step; bubble overhead = idle relative to busy time",
        ],
    }


def timeline(est: Estimate) -> Optional[dict[str, Any]]:
    """The plan's pipeline as ``meshplan pipeline --json`` gives it (one micro-batch step, times in
    seconds), or None when it has more than :data:`MAX_GANTT_ACTIONS` actions."""
    tl = est.sim.timeline
    if tl is None or sum(len(r) for r in tl) > MAX_GANTT_ACTIONS:
        return None
    p = est.plan
    run = {"schedule": p.schedule, "pp": p.pp, "m": p.num_microbatches, "v": p.vpp,
           "ranks": [tuple(a for a, _, _ in r) for r in tl], "result": est.sim}
    return pipeline_json(run)


def published(est: Estimate, setup: Setup) -> Optional[dict[str, Any]]:
    """The preset's published figures next to meshplan's, as ``meshplan estimate`` prints them."""
    preset = setup.preset
    if preset is None or preset.published is None:
        return None
    table = published_table(est, preset)
    rows = [list(r) for r in zip(*(list(c.cells) for c in table.columns))] if table is not None else []
    return {"source": preset.published.source, "formula": preset.published.formula, "rows": rows}


def preset_info(p: Preset) -> dict[str, Any]:
    """A preset as JSON: a published run's model and GPU specs by their names."""
    values = {k: (v.name if isinstance(v, (ModelSpec, GPUSpec)) else v) for k, v in p.values.items()}
    return {"name": p.name, "description": p.description, "values": values, "notes": list(p.notes)}


router = APIRouter(prefix="/api")


def estimate_key(q: Any) -> tuple:
    """The canonical options of a validated :data:`PlanQuery`: sorted ``(name, value)`` pairs of
    what the request gives."""
    return tuple(sorted(q.model_dump(exclude_none=True).items()))


def query_key(query_string: bytes) -> Optional[tuple]:
    """The canonical options of a raw query string, validated as FastAPI validates the query of
    ``/api/estimate`` (decoded as Starlette decodes it); None when it does not validate or names a
    parameter twice."""
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    values = dict(pairs)
    if len(values) != len(pairs):
        return None
    try:
        return estimate_key(PlanQuery.model_validate(values))
    except ValidationError:
        return None


def estimate_json(key: tuple) -> bytes:
    """The body of ``/api/estimate`` for canonical options ``key``: ``meshplan estimate --json``
    (with its run with failures and its advice: :mod:`meshplan.estimate_report`)."""
    values = dict(key)
    return json.dumps(full_json(run_estimate(bounded_setup(values)), plan_args(values)), allow_nan=False).encode()


def full_json(est: Estimate, args: PlanArgs) -> dict[str, Any]:
    """``meshplan estimate --json`` of ``est`` (options ``args``): with its run with failures and
    its advice (:mod:`meshplan.estimate_report`)."""
    failures, tips = extras(est, batch_flag="--global-batch-tokens" if args.global_batch_tokens else "--global-batch")
    return report_json(est, failures, tips)


estimates = EstimateCache(ESTIMATE_CACHE, estimate_json, query_key)


@router.get("/estimate", tags=["plan"], summary="Estimate one plan (the schema of `meshplan estimate --json`)",
            response_class=Response, responses={200: {"content": {"application/json": {}}}, 422: {"description": "bad input: field and rule"}})
async def api_estimate(request: Request, q: PlanParams) -> Response:
    # what CachedEstimates (estimate_cache.py) leaves: validated by FastAPI, bad options raise
    body, _ = await estimates.answer(estimate_key(q), request.scope["query_string"])
    return Response(body, media_type="application/json")


def explain_json(values: dict[str, Any]) -> dict[str, Any]:
    """What ``/api/explain`` answers for plan options ``values``; run in a worker process."""
    return {"derivations": derivations(run_estimate(bounded_setup(values)))}


def view_estimate_json(est: Estimate) -> dict[str, Any]:
    """``meshplan estimate --json`` of ``est`` without its run with failures and its advice, the
    slow parts (the Plan view takes them from ``/api/estimate`` once it has drawn the plan)."""
    d = report_json(est, None, [])
    del d["advice"]
    return d


def plan_view_json(values: dict[str, Any]) -> dict[str, Any]:
    """What ``/api/view/plan`` answers for plan options ``values``; run in a worker process."""
    setup = bounded_setup(values)
    est = run_estimate(setup, keep_timeline=gantt_fits(setup))
    return {
        "estimate": view_estimate_json(est),
        "derivations": derivations(est),
        "assumptions": assumptions(est),
        "timeline": timeline(est),
        "published": published(est, setup),
        "preset": preset_info(setup.preset) if setup.preset else None,
        "breakdown_labels": BREAKDOWN_LABELS,
    }


def in_worker(request: Request, work: Any, q: Any) -> dict[str, Any]:
    """``work`` (:func:`explain_json` or :func:`plan_view_json`) for the plan options of ``q``, in a
    heavy slot's worker process; bad or out-of-bounds options are refused here first, at no cost
    to a slot."""
    values = q.model_dump(exclude_none=True)
    bounded_setup(values)
    return request.app.state.heavy.run(work, values)


@router.get("/explain", tags=["plan"], summary="The derivation of each figure (what `meshplan explain` prints)")
def api_explain(q: PlanParams, request: Request) -> dict[str, Any]:
    return in_worker(request, explain_json, q)


view_answers = BoundedMap(VIEW_CACHE)


@router.get("/view/plan", tags=["views"], summary="Everything the Plan view draws: estimate, derivations, assumptions, pipeline",
            response_class=Response, responses={200: {"content": {"application/json": {}}}})
def api_view_plan(q: PlanParams, request: Request) -> Response:
    values = q.model_dump(exclude_none=True)
    key = setup_key(bounded_setup(values))  # bad or out-of-bounds options are refused here, at no cost to a slot
    body = view_answers.get(key)
    if body is None:
        body = json.dumps(request.app.state.heavy.run(plan_view_json, values), allow_nan=False).encode()
        view_answers.put(key, body)
    return Response(body, media_type="application/json")


def setup_key(setup: Setup) -> str:
    """What a Plan view answer depends on: the preset named and the model, cluster, plan and budget
    as resolved, so that two queries of one plan (a preset alone, and with its own pp given) share
    one answer."""
    return repr((setup.preset.name if setup.preset else None, setup.model, setup.cluster, setup.plan, setup.budget))


@router.get("/presets", tags=["catalog"], summary="Named plans of published runs")
def api_presets() -> list[dict[str, Any]]:
    return [preset_info(p) for p in PRESETS.values()]


@router.get("/gpus", tags=["catalog"], summary="The GPU catalog (as `meshplan gpus --json`)")
def api_gpus() -> list[dict[str, Any]]:
    return [gpu_row(load_gpu(n)) for n in gpu_names()]


__all__ = ["router", "PlanQuery", "plan_args", "run_estimate"]
