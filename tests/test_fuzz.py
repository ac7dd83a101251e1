"""A seeded, bounded fuzz of the error contract: a few hundred random command lines (run in this
process through :func:`meshplan.cli.app.main`, the CLI's entry) and API requests (FastAPI's test
client), built from valid values and hostile ones (0, negatives, NaN, infinities, 1e308, 5e-324,
empty, long, non-ASCII). Every answer is a result or a refusal in the contract's form: exit 0 (or
1 from ``search`` when no plan fits), or exit 2 with one ``error:`` line and no traceback; an HTTP answer that is not 200/202 is a 4xx or
503 whose body is ``{field, rule, detail}``, never a 500."""

from __future__ import annotations

import random
import time

import pytest
from bounded_support import run_main

#: BUDGET_S bounds a run of cases against a hang, not for speed: the cases take 30–50 s alone and
#: `make test` runs other tests beside them on the same cores
SEED, CLI_CASES, WEB_CASES, BUDGET_S = 36, 220, 260, 240.0

HOSTILE = ["0", "-1", "1e308", "-1e308", "nan", "inf", "-inf", "5e-324", "", "x", "9" * 40, "1e16", "0.5", "ä€", "1,2", "2**8"]
NUMBERS = ["1", "2", "4", "8", "16", "64", "1000", "0.3", "3e-3"]
DURATIONS = ["1s", "98s", "5min", "2.4h", "24h", "54d", "1000d", "0s", "-1h", "1x"]
SIZES = ["1GB", "2GiB", "512MB", "0B", "1e30B", "-5GB"]

CLI = {
    "estimate": {"--gpus": NUMBERS, "--tp": NUMBERS[:4], "--pp": NUMBERS[:4], "--cp": NUMBERS[:3], "--micro-batch": NUMBERS[:4],
                 "--seq-len": ["1024", "4096", "131072"], "--global-batch": ["8", "64", "1024", "524288"],
                 "--zero": ["0", "1", "2", "3"], "--model": ["llama3-8b", "gemma2-9b", "nope"], "--recompute": ["none", "full", "selective"]},
    "pipeline": {"--pp": NUMBERS[:5], "-m": NUMBERS[:6], "--vpp": NUMBERS[:3], "--fwd": NUMBERS, "--bwd": NUMBERS, "--transfer": NUMBERS,
                 "--schedule": ["1f1b", "gpipe", "interleaved", "zbh1", "zbv", "nope"], "--json": None},
    "calc failures": {"--work": DURATIONS, "--checkpoint-time": DURATIONS, "--mtbf": DURATIONS, "--runs": ["0", "2", "100", "1000000"],
                      "--seed": ["0", "10000000"], "--in-memory-checkpoint-time": DURATIONS, "--json": None},
    "calc collective": {"--op": ["all-reduce", "all-gather", "nope"], "--size": SIZES, "--n": NUMBERS, "--json": None},
    "calc batch": {"--target": NUMBERS, "--micro": NUMBERS[:4], "--dp": NUMBERS[:4], "--micro-time": DURATIONS, "--json": None},
    "calc lr": {"--peak": ["3e-4", "1"], "--warmup": NUMBERS, "--steps": NUMBERS, "--schedule": ["cosine", "linear", "x"]},
    "calc roofline": {"--gemm": ["8x8x8", "4096x4096x4096", "0x1x1", "x"], "--dtype": ["bf16", "fp8-e4m3", "int3"], "--json": None},
    "calc cost": {"--gpus": NUMBERS, "--days": NUMBERS, "--price": NUMBERS, "--json": None},
    "calc zero": {"--params": ["8B", "405B", "0"], "--zero": ["0", "1", "2", "3", "4"], "--dp": NUMBERS, "--json": None},
    "search": {"--gpus": ["8"], "--model": ["llama3-8b"], "--batch-range": ["4M,16M", "nan,inf", "16M,4M"], "--baseline": ["tp=0", "tp=2", "pp=3", "x"],
               "--pp": ["1", "2"], "--tp": ["1", "8"], "--top": ["1", "3"]},
}

#: Options a command needs to get past its first check, given first (a random value may follow).
BASE = {"calc failures": ["--work", "54d", "--checkpoint-time", "98s", "--mtbf", "24h", "--runs", "100"],
        "calc batch": ["--target", "2048"], "calc cost": ["--gpus", "8", "--days", "1"]}

WEB = {
    "/api/estimate": {"gpus": NUMBERS, "tp": NUMBERS[:4], "pp": NUMBERS[:4], "global_batch": ["64", "524288"], "micro_batch": NUMBERS[:3]},
    "/api/view/plan": {"gpus": NUMBERS, "pp": NUMBERS[:4], "global_batch": ["64", "16384", "524288"], "seq_len": ["4096", "0"]},
    "/api/explain": {"gpus": NUMBERS, "tp": NUMBERS[:4], "zero": ["0", "3", "9"]},
    "/api/pipeline": {"pp": NUMBERS[:5], "microbatches": NUMBERS[:6], "vpp": NUMBERS[:3], "fwd": NUMBERS, "bwd": NUMBERS, "transfer": NUMBERS,
                      "schedule": ["1f1b", "interleaved", "zbv", "nope"]},
    "/api/view/pipeline": {"pp": NUMBERS[:5], "microbatches": NUMBERS[:6], "fwd": NUMBERS, "stage_times": ["1:2", "1:2,1:2", "a:b"]},
    "/api/calc/failures": {"work": DURATIONS, "checkpoint_time": DURATIONS, "mtbf": DURATIONS, "runs": ["0", "2", "200", "20000"],
                           "seed": ["0", "10000000"], "in_memory_checkpoint_time": DURATIONS},
    "/api/calc/collective": {"op": ["all-reduce", "nope"], "size": SIZES, "n": NUMBERS, "simulate": ["true", "maybe"], "elements": NUMBERS},
    "/api/calc/loss-scale": {"steps": ["10", "1000", "1e9"], "seed": NUMBERS[:3], "format": ["fp16", "bf16", "x"]},
    "/api/learn": {"seed": NUMBERS + ["-1"], "topic": ["memory", "nope"]},
}


def _value(rng: random.Random, pool):
    return rng.choice(HOSTILE) if rng.random() < 0.3 else rng.choice(pool)


def _cli_case(rng: random.Random) -> list[str]:
    cmd = rng.choice(sorted(CLI))
    args = cmd.split() + BASE.get(cmd, [])
    for opt in rng.sample(sorted(CLI[cmd]), rng.randint(1, min(5, len(CLI[cmd])))):
        pool = CLI[cmd][opt]
        args += [opt] if pool is None else [opt, _value(rng, pool)]
    return args


def _web_case(rng: random.Random) -> tuple[str, dict[str, str]]:
    path = rng.choice(sorted(WEB))
    names = rng.sample(sorted(WEB[path]), rng.randint(1, min(4, len(WEB[path]))))
    return path, {n: _value(rng, WEB[path][n]) for n in names}


def test_cli_fuzz_keeps_the_error_contract():
    rng, t0, done = random.Random(SEED), time.perf_counter(), 0
    for _ in range(CLI_CASES):
        args = _cli_case(rng)
        if args[0] == "search" and "--batch-range" in args and rng.random() < 0.5:
            continue  # a valid batch range searches for seconds: keep a few
        code, out, err = run_main(args)
        ok = (0, 1, 2) if args[0] == "search" else (0, 2)  # search: 1 when no plan fits, said on stdout
        assert "Traceback" not in err and code in ok, (args, code, err[-1500:])
        if code == 2:
            assert out == "" and len(err.splitlines()) == 1 and err.startswith("error: "), (args, err)
        done += 1
        assert time.perf_counter() - t0 < BUDGET_S, f"{done} cases took more than {BUDGET_S} s"
    assert done > CLI_CASES // 2


def test_web_fuzz_never_answers_500():
    pytest.importorskip("fastapi", reason="fastapi is not installed (the web extra)")
    pytest.importorskip("httpx", reason="httpx is not installed (the test extra)")
    from fastapi.testclient import TestClient

    from meshplan.web import create_app

    web = TestClient(create_app(), raise_server_exceptions=False)
    rng, t0 = random.Random(SEED), time.perf_counter()
    for _ in range(WEB_CASES):
        path, params = _web_case(rng)
        r = web.get(path, params=params)
        assert r.status_code in (200, 422, 503), (path, params, r.status_code, r.text[:800])
        if r.status_code != 200:
            body = r.json()
            assert set(body) == {"field", "rule", "detail"} and "\n" not in body["detail"], (path, params, body)
            assert "internal error" not in body["rule"], (path, params, body)
        assert time.perf_counter() - t0 < BUDGET_S
