"""Hostile and careless web requests: a 422 (or 503) whose body is the OpenAPI error schema, or a bounded
answer, within 10 s and 1 GB; heavy requests run side by side (no global lock), in a bounded
number of slots with a bounded wait."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from bounded_support import BYTES, SECONDS, bounded

pytest.importorskip("fastapi", reason="fastapi is not installed (the web extra)")
pytest.importorskip("httpx", reason="httpx is not installed (the test extra)")
from fastapi.testclient import TestClient  # noqa: E402

from meshplan.web import Limits, create_app  # noqa: E402

KEYS = {"field", "rule", "detail"}


@pytest.fixture(scope="module")
def web():
    return TestClient(create_app(), raise_server_exceptions=False)


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
    r, seconds, peak = bounded(lambda: web.get(url))
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
