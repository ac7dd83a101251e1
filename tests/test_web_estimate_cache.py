"""The estimate cache of ``/api/estimate``: a repeated request is answered with the bytes and
headers of the first answer, by raw query string in front of the application and by canonical
options behind validation; bad input is never kept; both maps stay bounded. And ``meshplan serve
--workers``, and the load benchmark's client end to end."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from meshplan.cli.app import main  # noqa: E402
from meshplan.errors import InputError  # noqa: E402
from meshplan.web import plan_api  # noqa: E402
from meshplan.web.estimate_cache import BoundedMap, CachedEstimates, EstimateCache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def asgi_get(app, path: str, query: bytes, method: str = "GET") -> tuple[int, list, bytes]:
    """One request through an ASGI callable: (status, headers, body)."""
    scope = {"type": "http", "method": method, "path": path, "query_string": query, "headers": []}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], start["headers"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_bounded_map_drops_the_oldest_insertion():
    m = BoundedMap(3)
    for k in "abcd":
        m.put(k, k.upper())
    assert len(m) == 3 and m.get("a") is None and [m.get(k) for k in "bcd"] == ["B", "C", "D"]
    m.put("b", "B2")  # a re-insertion keeps its place: b is still the oldest
    m.put("e", "E")
    assert m.get("b") is None and [m.get(k) for k in "cde"] == ["C", "D", "E"]
    with pytest.raises(ValueError, match="size must be at least 1"):
        BoundedMap(0)


def key_of(query: bytes):
    """A toy canonical form: ``tp=<int>`` only."""
    name, _, value = query.decode().partition("=")
    return (("tp", int(value)),) if name == "tp" and value.isdigit() else None


def test_cache_computes_once_per_canonical_key_and_bounds_both_maps():
    calls: list[tuple] = []

    def compute(key: tuple) -> bytes:
        calls.append(key)
        return json.dumps(dict(key)).encode()

    cache = EstimateCache(2, compute, key_of)
    k1, k2, k3 = (("tp", 1),), (("tp", 2),), (("tp", 4),)
    a1 = asyncio.run(cache.answer(k1, b"tp=1"))
    assert a1 == (b'{"tp": 1}', [(b"content-length", b"9"), (b"content-type", b"application/json")])
    assert asyncio.run(cache.answer(k1, b"tp=01")) is a1 is cache.raw.get(b"tp=1") is cache.raw.get(b"tp=01")
    asyncio.run(cache.answer(k2, b"tp=2"))
    asyncio.run(cache.answer(k3, b"tp=4"))
    assert calls == [k1, k2, k3]  # tp=01 was the canonical entry of tp=1
    assert cache.canonical.get(k1) is None and len(cache.canonical) == 2
    assert len(cache.raw) == 2 and cache.raw.get(b"tp=1") is None and cache.raw.get(b"tp=4")[0] == b'{"tp": 4}'
    asyncio.run(cache.answer(k1, b"tp=1"))
    assert calls == [k1, k2, k3, k1]


def test_concurrent_requests_for_a_new_plan_compute_it_once():
    started, release = threading.Event(), threading.Event()
    calls: list[tuple] = []

    def compute(key: tuple) -> bytes:
        calls.append(key)
        started.set()
        assert release.wait(10)
        if key[0][1] == 3:
            raise InputError("tp", "tp (3) must divide the number of attention heads (32)")
        return b"{}"

    cache = EstimateCache(8, compute, key_of)

    async def ask(key, queries):
        async def go():
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
            release.set()
        return await asyncio.gather(*(cache.answer(key, q) for q in queries), go(), return_exceptions=True)

    got = asyncio.run(ask((("tp", 8),), (b"tp=8", b"tp=08", b"tp=008")))
    assert calls == [(("tp", 8),)] and got[0] is got[1] is got[2] == (b"{}", [(b"content-length", b"2"), (b"content-type", b"application/json")])
    assert cache.pending == {} and len(cache.raw) == 3
    started.clear()
    release.clear()
    got = asyncio.run(ask((("tp", 3),), (b"tp=3", b"tp=03")))
    assert calls[1:] == [(("tp", 3),)] and all(isinstance(g, InputError) for g in got[:2])  # one error, both told
    assert cache.pending == {} and cache.canonical.get((("tp", 3),)) is None and cache.raw.get(b"tp=3") is None


def test_middleware_answers_without_the_application_and_passes_the_rest():
    calls: list[tuple] = []

    def compute(key: tuple) -> bytes:
        if key[0][1] == 3:
            raise InputError("tp", "tp (3) must divide the number of attention heads (32)")
        calls.append(key)
        return b'{"x": 1}'

    cache = EstimateCache(4, compute, key_of)

    async def unreachable(scope, receive, send):
        raise AssertionError(f"reached the application for {scope['method']} {scope['path']}?{scope['query_string']!r}")

    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"inner"})

    fast = CachedEstimates(unreachable, cache)
    ok = (200, [(b"content-length", b"8"), (b"content-type", b"application/json")], b'{"x": 1}')
    assert asgi_get(fast, "/api/estimate", b"tp=8") == ok  # new: computed in the middleware
    assert asgi_get(fast, "/api/estimate", b"tp=8") == ok  # known raw query
    assert asgi_get(fast, "/api/estimate", b"tp=08") == ok  # known canonical options
    assert calls == [(("tp", 8),)]
    passthrough = CachedEstimates(inner, cache)
    for path, query, method in (("/api/estimate", b"tp=x", "GET"),  # does not validate
                                ("/api/estimate", b"tp=3", "GET"),  # validates, then the plan is refused
                                ("/api/explain", b"tp=8", "GET"), ("/api/estimate", b"tp=8", "POST"),
                                ("/api/estimate", b"tp=8", "HEAD")):
        assert asgi_get(passthrough, path, query, method) == (299, [], b"inner"), (path, query, method)
    assert cache.raw.get(b"tp=3") is None and cache.raw.get(b"tp=x") is None


def test_query_key_validates_like_the_endpoint():
    from meshplan.web.plan_api import query_key

    assert query_key(b"tp=04&preset=llama3-405b-16k") == query_key(b"preset=llama3-405b-16k&tp=4") == (
        ("preset", "llama3-405b-16k"), ("tp", 4))
    assert query_key(b"sequence_parallel=false&price=2.50") == (("price", 2.5), ("sequence_parallel", False))
    assert query_key(b"global_batch_tokens=4M&model=llama%2D3") == (("global_batch_tokens", "4M"), ("model", "llama-3"))
    for bad_query in (b"tp=abc", b"tp=", b"tensor=2", b"tp=4&tp=8", b"schedule=looped", b"zero=5"):
        assert query_key(bad_query) is None, bad_query


def test_repeated_estimate_is_the_first_answer_byte_for_byte(client, monkeypatch):
    q = "preset=llama3-405b-16k&tp=4&price=1.2345678"
    first = client.get("/api/estimate?" + q)
    assert first.status_code == 200
    assert plan_api.estimates.raw.get(q.encode())[0] == first.content
    with monkeypatch.context() as m:  # the endpoint cannot answer: only the middleware can
        m.setattr(plan_api.estimates, "key_of_query", lambda query: pytest.fail("validated a known query"))
        m.setattr(plan_api.estimates, "answer", lambda key, query: pytest.fail("reached the endpoint"))
        again = client.get("/api/estimate?" + q)
    assert again.content == first.content
    for h in ("content-type", "content-length"):
        assert again.headers[h] == first.headers[h]
    assert first.headers["content-type"] == "application/json"
    # the same options spelled differently: a new raw key, the canonical entry's bytes
    other = "price=1.2345678&tp=04&preset=llama3-405b-16k"
    assert plan_api.estimates.raw.get(other.encode()) is None
    assert client.get("/api/estimate?" + other).content == first.content
    assert plan_api.estimates.raw.get(other.encode()) is plan_api.estimates.raw.get(q.encode())
    est = first.json()
    assert est["plan"]["tp"] == 4 and est["plan"]["dp"] == 16384 // (4 * 16)


def test_bad_input_is_never_cached(client):
    for q in ("tp=3&price=1.7654321", "tp=abc&price=1.7654321", "tensor=2&price=1.7654321"):
        for _ in range(2):
            r = client.get("/api/estimate?" + q)
            assert r.status_code == 422, r.text
        assert plan_api.estimates.raw.get(q.encode()) is None
    assert client.get("/api/estimate?tp=3&price=1.7654321").json()["field"] == "tp"


def test_serve_workers_bad_input(capsys):
    for n in ("0", "65"):
        capsys.readouterr()
        assert main(["serve", "--workers", n]) == 2
        assert capsys.readouterr().err.strip() == f"error: workers: must be between 1 and 64 (got {n})"


def test_load_benchmark_runs_both_modes_without_errors():
    """The benchmark end to end on a real server (1 s per mode, 4 clients): every request answered
    200; no figure is asserted (the machine is shared)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "web_load.py"), "--seconds", "1", "--clients", "4"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    for mode in ("repeat", "distinct"):
        assert f"mode {mode}: 4 concurrent clients" in out.stdout
    assert out.stdout.count("errors 0") == 2, out.stdout
    assert out.stdout.count("CPU per request: server") == 2


def test_load_benchmark_runs_the_contended_mode_without_errors():
    """``--mode contended``: cheap estimates beside one expensive request kept in flight, each
    answered 200 (no figure asserted)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "web_load.py"), "--mode", "contended", "--seconds", "1",
                          "--clients", "4"], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "mode contended: 4 concurrent clients" in out.stdout and "errors 0" in out.stdout, out.stdout
    assert "expensive requests in flight one after another" in out.stdout


def test_query_key_is_the_key_fastapi_validation_gives(client, monkeypatch):
    """The middleware's validation and the endpoint's (FastAPI's query model) give the same
    canonical options for the same query string."""
    from meshplan.web.plan_api import query_key

    queries = [b"preset=llama3-405b-16k&tp=4&pp=8&micro_batch=2", b"model=llama3-8b&gpus=64&tp=02&recompute=selective",
               b"model=llama3-70b&gpus=256&sequence_parallel=0&master_weights=true&zero=3&price=2.5&pue=1.2",
               b"model=llama2-13b&gpus=32&global_batch_tokens=4M&schedule=interleaved&vpp=2&pp=2&nic_gbps=400",
               b"preset=llama3-405b-16k&rank_order=tp%2Ccp%2Cpp%2Cdp&tokens=15.6T&oversubscription=7"]
    seen: list[tuple] = []

    async def record(key, query):
        seen.append(key)
        return b"{}", []

    monkeypatch.setattr(plan_api.estimates, "raw", BoundedMap(16))  # none of them known
    monkeypatch.setattr(plan_api.estimates, "key_of_query", lambda query: None)  # every request to the endpoint
    monkeypatch.setattr(plan_api.estimates, "answer", record)
    for q in queries:
        assert client.get("/api/estimate?" + q.decode()).status_code == 200
    assert seen == [query_key(q) for q in queries]
    assert all(k is not None for k in seen)
