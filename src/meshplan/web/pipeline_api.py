"""``/api/pipeline``: a pipeline schedule simulated as ``meshplan pipeline --json`` gives it (the
CLI's :func:`~meshplan.cli.pipeline_cmd.run_pipeline` and :func:`~meshplan.cli.pipeline_cmd.to_json`),
and ``/api/view/pipeline``: the same with the closed-form check the CLI prints under it. Both take
``pipeline_runtime`` (dependency, lockstep, deepspeed or blocking) as ``meshplan pipeline --pipeline-runtime`` does."""

from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Depends, Query, Request

from meshplan.cli.pipeline_cmd import closed_form_lines, run_pipeline, schedule_names, to_json
from meshplan.cli.pipeline_runtime import RUNTIME_HELP
from meshplan.errors import InputError
from meshplan.web.errors import known_query

#: Most micro-batch stages (p·v·m) a request may simulate: a bounded request, and a Gantt a
#: browser draws at once.
MAX_WEB_STAGES = 20_000

router = APIRouter(prefix="/api", dependencies=[Depends(known_query)])


def _checked(**sim: Any) -> dict[str, Any]:
    """The keyword arguments of :func:`run_pipeline`, once the schedule is known and the micro-batch
    stages at most :data:`MAX_WEB_STAGES`: refused before any work, in the server process."""
    schedule, pp, m, vpp = sim["schedule"], sim["pp"], sim["m"], sim["vpp"]
    if schedule is not None and schedule not in schedule_names():
        raise InputError("schedule", f"unknown schedule '{schedule}' ({', '.join(schedule_names())})")
    stages = pp * (vpp if vpp is not None and vpp > 0 else 2) * m
    if pp > 0 and m > 0 and stages > MAX_WEB_STAGES:
        raise InputError("microbatches", f"p·v·m = {stages:,} is more than the {MAX_WEB_STAGES:,} micro-batch stages the web explorer draws")
    return sim


def pipeline_json(sim: dict[str, Any]) -> dict[str, Any]:
    """What ``/api/pipeline`` answers for the keyword arguments ``sim`` of :func:`run_pipeline`; run
    in a worker process."""
    return to_json(run_pipeline(**sim))


def pipeline_view_json(sim: dict[str, Any]) -> dict[str, Any]:
    """What ``/api/view/pipeline`` answers for the keyword arguments ``sim`` of
    :func:`run_pipeline`; run in a worker process."""
    run = run_pipeline(**sim)
    return {"pipeline": to_json(run), "closed_form": closed_form_lines(run, "units"),
            "per_stage": {"fwd": run["fwd"], "bwd": run["bwd"], "wgt": run["wgt"]}}


Schedule = Query(None, description=f"Pipeline schedule: {', '.join(schedule_names())} (default: 1f1b, or interleaved when vpp > 1).")
Pp = Query(4, description="Pipeline ranks p.")
M = Query(8, description="Micro-batches m per step.")
Vpp = Query(None, description="Virtual stages per rank (default: 1, or 2 for the interleaved schedules).")
Fwd = Query(None, description="Forward time per micro-batch of one rank's whole share (default: 1).")
Bwd = Query(None, description="Backward time per micro-batch of one rank's whole share (default: 2).")
Wgrad = Query(None, description="Weight-gradient part of bwd, for schedules that split the backward (default: half).")
Transfer = Query(0.0, description="Point-to-point time between consecutive stages.")
StageTimes = Query(None, description="Per virtual stage 'f0:b0,f1:b1,...' (or f:b:w) in pipeline order, instead of fwd/bwd.")
Runtime = Query(None, description=RUNTIME_HELP)


@router.get("/pipeline", tags=["pipeline"], summary="Simulate a pipeline schedule (the schema of `meshplan pipeline --json`)")
def api_pipeline(request: Request, schedule: Optional[str] = Schedule, pp: int = Pp, microbatches: int = M, vpp: Optional[int] = Vpp,
                 fwd: Optional[float] = Fwd, bwd: Optional[float] = Bwd, wgrad: Optional[float] = Wgrad,
                 transfer: float = Transfer, stage_times: Optional[str] = StageTimes,
                 pipeline_runtime: Optional[str] = Runtime) -> dict[str, Any]:
    sim = _checked(schedule=schedule, pp=pp, m=microbatches, vpp=vpp, fwd=fwd, bwd=bwd, wgrad=wgrad, transfer=transfer,
                   stage_times=stage_times, runtime=pipeline_runtime)
    return request.app.state.heavy.run(pipeline_json, sim)


@router.get("/view/pipeline", tags=["views"], summary="What the Pipeline view draws: the simulation and the closed-form check")
def api_view_pipeline(request: Request, schedule: Optional[str] = Schedule, pp: int = Pp, microbatches: int = M, vpp: Optional[int] = Vpp,
                      fwd: Optional[float] = Fwd, bwd: Optional[float] = Bwd, wgrad: Optional[float] = Wgrad,
                      transfer: float = Transfer, stage_times: Optional[str] = StageTimes,
                      pipeline_runtime: Optional[str] = Runtime) -> dict[str, Any]:
    sim = _checked(schedule=schedule, pp=pp, m=microbatches, vpp=vpp, fwd=fwd, bwd=bwd, wgrad=wgrad, transfer=transfer,
                   stage_times=stage_times, runtime=pipeline_runtime)
    return request.app.state.heavy.run(pipeline_view_json, sim)
