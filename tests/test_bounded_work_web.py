"""Hostile and careless web requests: a 422 (or 503) whose body is the OpenAPI error schema, or a bounded
answer, within 10 s and 1 GB; heavy requests run side by side (no global lock), in a bounded
number of slots with a bounded wait, each in a worker process with a time limit, and answer as
if they had run in the server."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from bounded_support import BYTES, SECONDS, bounded

pytest.importorskip("fastapi", reason="fastapi is not installed (the web extra)")
pytest.importorskip("httpx", reason="httpx is not installed (the test extra)")
from fastapi.testclient import TestClient  # noqa: E402

from meshplan.errors import InputError  # noqa: E402
from meshplan.web import Limits, calc_api, create_app, pipeline_api, plan_api  # noqa: E402
from meshplan.web.errors import ErrorBody, error_body  # noqa: E402
from meshplan.web.heavy import Unavailable  # noqa: E402

KEYS = {"field", "rule", "detail"}
#: A heavy request that takes seconds (the failures calculator near its event bound).
SLOW = "/api/calc/failures?work=54d&checkpoint_time=98s&mtbf=2.4h&runs=15000"
QUICK = "/api/calc/failures?work=1h&checkpoint_time=98s&mtbf=24h&runs=2"


@pytest.fixture(scope="module")
def web():
    with TestClient(create_app(), raise_server_exceptions=False) as client:  # the lifespan stops the workers
        yield client


def refusal(r, field: str, status: int = 422) -> str:
    body = r.json()
    assert r.status_code == status and set(body) == KEYS, (r.status_code, body)
    assert body["field"] == field and body["detail"] == f"{field}: {body['rule']}" and "\n" not in body["detail"]
    return body["rule"]


@pytest.mark.parametrize("url,field", [
    ("/api/pipeline?fwd=1e308&bwd=1e308", "fwd"),
    ("/api/pipeline?pp=2&microbatches=2&transfer=1e16", "transfer"),
    ("/api/view/plan?gpus=8&pp=4&global_batch=524288", "global_batch"),
    ("/api/explain?gpus=8&pp=4&global_batch=524288", "global_batch"),
    ("/api/estimate?gpus=8&pp=4&global_batch=524288", "global_batch"),
    ("/api/calc/failures?work=1000d&checkpoint_time=1s&mtbf=0.1h&runs=200", "runs"),
])
def test_refused_within_bounds(web, url, field):
    r, seconds, peak = bounded(lambda: web.get(url))
    refusal(r, field)
    assert seconds < SECONDS and peak < BYTES


@pytest.mark.parametrize("url", [
    "/api/calc/failures?work=1s&checkpoint_time=98s&mtbf=24h&in_memory_checkpoint_time=2s&seed=10000000",
    "/api/calc/failures?work=1h&checkpoint_time=98s&mtbf=24h&runs=2",
    "/api/view/plan?gpus=8&pp=4&global_batch=16384",  # too many actions for the Gantt: summarised without it
])
def test_answered_within_bounds(web, url):
    assert web.get(QUICK).status_code == 200  # a worker process started: its memory is counted too
    r, seconds, peak = bounded(lambda: web.get(url), web.app.state.heavy.pool.pids())
    assert r.status_code == 200, r.text[:500]
    assert seconds < SECONDS and peak < BYTES


def test_big_plan_view_has_no_gantt(web):
    assert web.get("/api/view/plan?gpus=8&pp=4&global_batch=16384").json()["timeline"] is None


@pytest.mark.parametrize("body,field", [
    ({"gpus": 8, "batch_range": "nan,inf"}, "batch_range"),
    ({"gpus": 8, "pp": 2, "baseline": "tp=0"}, "baseline"),
])
def test_search_cases_name_the_field(web, body, field):
    assert "internal error" not in refusal(web.post("/api/search", json=body), field)


def test_openapi_error_schema_is_the_body_sent(web):
    spec = web.get("/openapi.json").json()
    assert spec["components"]["schemas"]["ErrorBody"]["required"] == ["field", "rule", "detail"]
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, ops in spec["paths"].items():
        for op in ops.values():
            for code in ("422", "404", "429", "503"):
                if code in op["responses"]:
                    ref = op["responses"][code]["content"]["application/json"]["schema"]["$ref"]
                    assert ref == "#/components/schemas/ErrorBody", (path, code)


def test_heavy_requests_wait_for_a_slot_then_503():
    app = create_app(Limits(heavy_slots=1, heavy_wait_s=0.2))
    web = TestClient(app, raise_server_exceptions=False)
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with app.state.heavy.slot():
            taken.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    taken.wait(10)
    try:
        refusal(web.get("/api/calc/failures?work=1h&checkpoint_time=98s&mtbf=24h&runs=2"), "server", 503)
        assert web.get("/api/gpus").status_code == 200  # cheap requests never wait
    finally:
        release.set()
        t.join()
    assert web.get("/api/calc/failures?work=1h&checkpoint_time=98s&mtbf=24h&runs=2").status_code == 200


def test_calculators_run_side_by_side_and_keep_their_answers_apart(web):
    urls = [f"/api/calc/failures?work={h}h&checkpoint_time=98s&mtbf=24h&runs=50&seed={h}" for h in range(1, 9)]
    alone = [web.get(u).json() for u in urls]
    with ThreadPoolExecutor(4) as pool:
        together = [r.json() for r in pool.map(web.get, urls)]
    assert together == alone


# ---- heavy work in worker processes ------------------------------------------------------------

SIM = {"schedule": "zbh1", "pp": 4, "m": 8, "vpp": None, "fwd": None, "bwd": None, "wgrad": None, "transfer": 0.0,
       "stage_times": None, "runtime": None}


@pytest.mark.parametrize("url,work,args", [
    ("/api/view/plan?model=llama3-8b&gpus=8&pp=2", plan_api.plan_view_json, ({"model": "llama3-8b", "gpus": 8, "pp": 2},)),
    ("/api/explain?preset=llama3-405b-16k", plan_api.explain_json, ({"preset": "llama3-405b-16k"},)),
    ("/api/pipeline?schedule=zbh1&pp=4&microbatches=8", pipeline_api.pipeline_json, (SIM,)),
    ("/api/view/pipeline?schedule=zbh1&pp=4&microbatches=8", pipeline_api.pipeline_view_json, (SIM,)),
    ("/api/calc/failures?work=1h&checkpoint_time=98s&mtbf=24h&runs=50&seed=3", calc_api.run_calculator,
     ("failures", [("work", "1h"), ("checkpoint_time", "98s"), ("mtbf", "24h"), ("runs", "50"), ("seed", "3")])),
])
def test_heavy_answer_is_the_one_computed_in_the_server(web, url, work, args):
    r = web.get(url)
    assert r.status_code == 200, r.text[:500]
    assert r.json() == json.loads(json.dumps(work(*args)))


def test_heavy_work_runs_in_another_process(web):
    assert web.app.state.heavy.run(os.getpid) != os.getpid()


@pytest.mark.parametrize("url,work,args", [
    ("/api/pipeline?fwd=1e308&bwd=1e308", pipeline_api.pipeline_json, ({**SIM, "schedule": None, "fwd": 1e308, "bwd": 1e308},)),
    ("/api/view/pipeline?schedule=zbh1&pp=4&microbatches=8&stage_times=1:2,x", pipeline_api.pipeline_view_json,
     ({**SIM, "stage_times": "1:2,x"},)),
    ("/api/calc/failures?work=abc&checkpoint_time=98s&mtbf=24h", calc_api.run_calculator,
     ("failures", [("work", "abc"), ("checkpoint_time", "98s"), ("mtbf", "24h")])),
])
def test_bad_input_found_in_the_worker_is_the_servers_422(web, url, work, args):
    with pytest.raises(InputError) as here:
        work(*args)
    r = web.get(url)
    assert r.status_code == 422 and r.json() == error_body(here.value)


def test_validation_error_in_the_worker_is_an_input_error(web):
    with pytest.raises(InputError) as err:
        web.app.state.heavy.run(ErrorBody.model_validate, {"field": "x"})
    assert (err.value.field, err.value.rule) == ("rule", "is required")


def test_heavy_work_past_its_time_limit_is_stopped_with_503():
    with TestClient(create_app(Limits(heavy_slots=1, heavy_timeout_s=0.3)), raise_server_exceptions=False) as web:
        assert web.get(QUICK).status_code == 200
        t0 = time.perf_counter()
        rule = refusal(web.get(SLOW), "server", 503)
        assert time.perf_counter() - t0 < 2 and "passed the 0.3 s a heavy request may take" in rule
        assert web.get(QUICK).status_code == 200  # a new worker process took its place


def test_a_worker_killed_at_work_gives_503_and_is_replaced():
    with TestClient(create_app(Limits(heavy_slots=1)), raise_server_exceptions=False) as web:
        pool = web.app.state.heavy.pool
        assert web.get(QUICK).status_code == 200
        (pid,) = pool.pids()
        with ThreadPoolExecutor(1) as run:
            slow = run.submit(web.get, SLOW)
            while pool.pids():  # taken for the request
                time.sleep(0.01)
            time.sleep(0.2)
            os.kill(pid, signal.SIGKILL)
            assert "stopped (signal 9)" in refusal(slow.result(), "server", 503)
        assert web.get(QUICK).status_code == 200 and pool.pids() != [pid]


def killed(pid: int) -> None:
    """Kill process ``pid`` and wait until it has exited (its pipes closed)."""
    os.kill(pid, signal.SIGKILL)
    for _ in range(500):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    return
        except OSError:
            return
        time.sleep(0.01)


def test_dead_idle_workers_are_replaced(web):
    assert web.get(QUICK).status_code == 200
    for pid in web.app.state.heavy.pool.pids():
        killed(pid)
    assert web.get(QUICK).status_code == 200


def test_a_worker_that_exits_or_runs_out_of_memory_is_unavailable_then_replaced(web):
    heavy = web.app.state.heavy
    with pytest.raises(Unavailable, match="stopped \\(exit status 3\\)"):
        heavy.run(os._exit, 3)
    with pytest.raises(Unavailable, match="ran out of memory"):
        heavy.run(bytearray, 1 << 62)
    assert heavy.run(os.getpid) in heavy.pool.pids()


def test_shutdown_stops_the_workers():
    with TestClient(create_app()) as web:
        assert web.get(QUICK).status_code == 200
        pids = web.app.state.heavy.pool.pids()
    assert pids
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
