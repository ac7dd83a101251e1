"""The search endpoints: ``POST /api/search`` starts ``meshplan search`` (the CLI's own
:func:`~meshplan.cli.search_cmd.execute`) in a worker thread, ``GET /api/search/{id}`` reports its
progress and, when it is done, the result in the schema of ``meshplan search --json``.

The top plans are reported as soon as they are known (``result`` while the job still runs,
``partial`` true); the baseline's place and the memory front follow. Work is bounded: one search
runs at a time (a second is answered 429, unless the running one has reported its top plans:
then it stops where it is and keeps what it has), a search may evaluate at most
``Limits.max_search_plans`` plans and run ``Limits.search_seconds`` seconds. A space over the
plan limit, or a search past its time while screening, is refused with one line naming the limit
in words; past the screen, a search stopped by its time keeps what it found (``result.stopped``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, ValidationError, create_model

from meshplan.cli.options import PLAN_OPTIONS
from meshplan.cli.search_cmd import _json as search_json
from meshplan.cli.search_cmd import execute
from meshplan.cli.search_options import SearchArgs, option_types
from meshplan.errors import InputError
from meshplan.search.run import OBJECTIVES, SearchResult, Stopped
from meshplan.search.space import SpaceTooLarge
from meshplan.specs.base import input_error_from
from meshplan.web.errors import error_body, unprocessable
from meshplan.web.plan_api import plan_args
from meshplan.web.plan_link import plan_link

#: Seconds ``POST /api/search`` waits for the search to pass its checks (or fail them) before
#: answering 202 with the job id.
CHECK_WAIT_S = 10.0
KEEP_JOBS = 16
#: Seconds a new search waits for the running one to stop once it has reported its top plans.
TAKE_OVER_WAIT_S = 5.0
#: What a search too large or too long may change, in the words of the Search view's form.
NARROW = "fix an axis (TP, PP, CP, ...), narrow the batch range or lower a largest-degree limit (largest TP, PP, CP, ...)"

#: The search options of ``meshplan search`` (:class:`~meshplan.cli.search_options.SearchArgs`), with
#: the objective as a choice, at most 100 plans, and the front on by default.
_SEARCH_OPTIONS: dict[str, Any] = {
    **{name: (tp, Field(default, description=help)) for name, (tp, default, help) in option_types().items()},
    "objective": (Literal[OBJECTIVES], Field("throughput", description=f"Rank by {', '.join(OBJECTIVES)}.")),
    "top": (int, Field(10, description="How many plans to return (1 to 100).")),
    "baseline": (Optional[str], Field(None, description="Place this plan in the ranking, e.g. tp=8,pp=16,vpp=8,schedule=interleaved.")),
    "pareto": (bool, Field(True, description="Also find the memory vs throughput front.")),
}

SearchRequest = create_model(
    "SearchRequest",
    __config__=ConfigDict(extra="forbid"),
    **{name: (tp, Field(None, description=opt.help)) for name, (tp, opt) in PLAN_OPTIONS.items() if name != "plan_file"},
    **_SEARCH_OPTIONS,
)


@dataclass
class Job:
    id: str
    started: float = field(default_factory=time.perf_counter)
    status: str = "running"  # running, done, error
    phase: str = "checking"
    done: int = 0
    total: int = 0
    simulated: int = 0
    result: Optional[dict[str, Any]] = None
    error: Optional[dict[str, str]] = None
    finished: Optional[float] = None
    checked: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    cancel: Optional[str] = None  # why the search is to stop where it is (a newer search), in words

    def view(self) -> dict[str, Any]:
        end = self.finished if self.finished is not None else time.perf_counter()
        out: dict[str, Any] = {"id": self.id, "status": self.status, "phase": self.phase, "done": self.done,
                               "total": self.total, "simulated": self.simulated, "elapsed_s": end - self.started,
                               "partial": self.status == "running" and self.result is not None}
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        return out


class Searches:
    """The jobs of one server: at most one running, the last :data:`KEEP_JOBS` kept."""

    def __init__(self, max_plans: int, seconds: float):
        self.max_plans, self.seconds = max_plans, seconds
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.lock = threading.Lock()
        self.running: Optional[Job] = None
        self.ids = itertools.count(1)

    def start(self, values: dict[str, Any]) -> Job:
        self._take_over()
        with self.lock:
            if self.running is not None:
                raise InputError("search", f"search {self.running.id} is still running; one search runs at a time")
            job = Job(id=str(next(self.ids)))
            self.jobs[job.id] = job
            while len(self.jobs) > KEEP_JOBS:
                self.jobs.popitem(last=False)
            self.running = job
        threading.Thread(target=self._run, args=(job, values), daemon=True, name=f"search-{job.id}").start()
        return job

    def _take_over(self) -> None:
        """A running search that has reported its top plans stops where it is (keeping what it
        has) for a new one; one still looking for them keeps the server."""
        running = self.running
        if running is not None and running.result is not None:
            running.cancel = f"search {running.id} stopped here: a newer search started"
            running.ended.wait(TAKE_OVER_WAIT_S)

    def _progress(self, job: Job):
        def progress(phase: str, done: int, total: int) -> None:
            job.checked.set()
            if phase == "screen":
                job.phase, job.done, job.total = phase, done, total
                if total > self.max_plans:
                    raise Stopped(too_many(total, self.max_plans))
            else:
                job.phase = "simulate" if job.result is None else "extras"
                job.simulated = done
            if job.cancel is not None:
                raise Stopped(job.cancel)
            if time.perf_counter() - job.started > self.seconds:
                raise Stopped(f"stopped after {self.seconds:g} s, the longest a search may run on this server; {NARROW}")
        return progress

    def _publish(self, job: Job, values: dict[str, Any]):
        def on_top(result: SearchResult) -> None:
            if result.top:
                job.result = result_json(result, result.top[0].estimate.cluster.num_gpus, values)
                job.phase = "extras"
        return on_top

    def _run(self, job: Job, values: dict[str, Any]) -> None:
        try:
            search = SearchArgs(**{k: values.pop(k) for k in option_types() if k in values})
            search.check(max_top=100)
            run = {k: values.pop(k) for k in ("baseline", "pareto") if k in values}
            result, cluster, _ = execute(plan_args(values), search, progress=self._progress(job), max_plans=self.max_plans,
                                         on_top=self._publish(job, values), **run)
            job.result = result_json(result, cluster.num_gpus, values)
            job.status = "done"
        except SpaceTooLarge as err:
            job.error, job.status = error_body(InputError("search", too_many(err.plans, err.limit))), "error"
        except Stopped as stop:  # while screening: nothing to keep
            job.error, job.status = error_body(InputError("search", stop.reason)), "error"
        except InputError as err:
            job.error, job.status = error_body(err), "error"
        except ValidationError as err:  # a rule across fields: still one line
            job.error, job.status = error_body(input_error_from(err)), "error"
        except Exception as err:  # a defect, not bad input: reported, never left running
            job.error, job.status = error_body(InputError("search", f"internal error ({type(err).__name__}: {err})")), "error"
        finally:
            job.finished = time.perf_counter()
            job.phase = "finished"
            with self.lock:
                self.running = None
            job.checked.set()
            job.ended.set()


def result_json(result: SearchResult, num_gpus: int, values: dict[str, Any]) -> dict[str, Any]:
    """``meshplan search --json`` of ``result`` with ``links``: the Plan view's options for each
    top plan and for the baseline (:func:`~meshplan.web.plan_link.plan_link`; ``values``, the
    search's plan options)."""
    out = search_json(result, num_gpus)
    out["links"] = {"top": [plan_link(values, r.estimate.plan, num_gpus) for r in result.top], "baseline": None}
    if result.baseline is not None:
        try:
            out["links"]["baseline"] = plan_link(values, result.baseline.estimate.plan, num_gpus)
        except InputError:  # a baseline the Plan view cannot take (a rule it breaks): no link
            pass
    return out


def too_many(plans: int, limit: int) -> str:
    """The refusal of a space of ``plans`` plans, over the server's ``limit``, in words."""
    return f"the space holds {plans:,} plans, more than the {limit:,} a search may evaluate on this server; {NARROW}"


router = APIRouter(prefix="/api")


@router.post("/search", tags=["search"], status_code=202,
             summary="Start a search (the options of `meshplan search`); poll GET /api/search/{id}",
             responses={422: {"description": "bad input: field and rule"}, 429: {"description": "a search is already running"}})
def api_search(body: SearchRequest, request: Request):  # type: ignore[valid-type]
    searches: Searches = request.app.state.searches
    try:
        job = searches.start(body.model_dump(exclude_none=True))
    except InputError as err:
        return JSONResponse(error_body(err), status_code=429)
    job.checked.wait(CHECK_WAIT_S)
    if job.status == "error":
        return unprocessable(InputError(job.error["field"], job.error["rule"]))
    return JSONResponse(job.view(), status_code=200 if job.status == "done" else 202)


@router.get("/search/{job_id}", tags=["search"], summary="A search's progress, and its result (the schema of `meshplan search --json`) when done")
def api_search_job(job_id: str, request: Request):
    job = request.app.state.searches.jobs.get(job_id)
    if job is None:
        return JSONResponse({"field": "id", "rule": f"no search {job_id!r} (finished searches are kept for a while)",
                             "detail": f"id: no search {job_id!r}"}, status_code=404)
    return job.view()
