"""The web explorer's JSON API (FastAPI TestClient): every endpoint answers with the CLI's own JSON
for the same input, bad input is 422 naming the field and the rule, and work per request is bounded."""

from __future__ import annotations

import json
import socket
import time

import pytest
from web_support import bad

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from meshplan.cli.app import main  # noqa: E402
from meshplan.web import Limits, create_app  # noqa: E402
from meshplan.web.search_api import Job  # noqa: E402


def cli_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def cli_error(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(list(args)) == 2
    return capsys.readouterr().err.strip()


# ---- /api/estimate, /api/explain, /api/view/plan ------------------------------------------------


def test_estimate_is_the_cli_json_for_the_405b_preset(client, capsys):
    got = client.get("/api/estimate", params={"preset": "llama3-405b-16k"})
    assert got.status_code == 200
    assert got.json() == cli_json(capsys, "estimate", "--preset", "llama3-405b-16k", "--json")
    plan = got.json()["plan"]
    assert (plan["tp"], plan["cp"], plan["pp"], plan["dp"], plan["vpp"]) == (8, 1, 16, 128, 8)
    assert plan["global_batch_tokens"] == 16 * 2**20
    t = got.json()["time"]  # the Plan view's step card shows the interval (static/plan.js)
    assert t["interval_level"] == 0.8 and t["step_s_interval"][0] < t["step_s_interval"][1]
    assert t["interval_basis"]["group"] == "fused stacks on H100"  # 16,384 GPUs: too few runs above 2,048 (8)


def test_estimate_with_flags_is_the_cli_json(client, capsys):
    params = {"model": "llama3-70b", "gpus": 256, "tp": 8, "pp": 4, "seq_len": 8192, "global_batch_tokens": "4M",
              "recompute": "selective", "tokens": "15T", "price": 2.5, "sequence_parallel": "false", "zero": "1"}
    got = client.get("/api/estimate", params=params).json()
    flags = ["--model", "llama3-70b", "--gpus", "256", "--tp", "8", "--pp", "4", "--seq-len", "8192", "--global-batch-tokens", "4M",
             "--recompute", "selective", "--tokens", "15T", "--price", "2.5", "--no-sequence-parallel", "--zero", "1"]
    assert got == cli_json(capsys, "estimate", *flags, "--json")
    assert got["plan"]["dp"] == 8 and got["plan"]["sequence_parallel"] is False
    assert got["run"]["tokens"] == 15e12 and got["run"]["dollars"] == pytest.approx(got["run"]["gpu_hours"] * 2.5)


def test_estimate_stack_and_tp_overlap_choices_are_the_cli_json(client, capsys):
    """The Plan view's software-stack and TP-overlap choices reach the estimate as the CLI's flags do."""
    params = {"model": "llama3-70b", "gpus": 256, "tp": 8, "seq_len": 8192, "global_batch": 256, "zero": "3",
              "kernels": "compiled", "tp_comm_overlap": "true", "tp_overlap_kind": "micro-pipeline"}
    got = client.get("/api/estimate", params=params).json()
    flags = ["--model", "llama3-70b", "--gpus", "256", "--tp", "8", "--seq-len", "8192", "--global-batch", "256", "--zero", "3",
             "--set", "kernels=compiled", "--tp-comm-overlap", "--set", "tp_overlap_kind=micro-pipeline"]
    assert got == cli_json(capsys, "estimate", *flags, "--json")
    stack = got["plan"]["stack"]
    assert (stack["kernels"], stack["tp_comm_overlap"], stack["tp_overlap_kind"]) == ("compiled", True, "micro-pipeline")
    off = client.get("/api/estimate", params={**params, "tp_comm_overlap": "false"}).json()
    assert off["time"]["step_s"] > got["time"]["step_s"]  # the fused forward collectives hide part of the TP traffic


def test_estimate_bad_input_names_the_field_like_the_cli(client, capsys):
    rule = bad(client.get("/api/estimate", params={"tp": 3}), "tp")
    assert cli_error(capsys, "estimate", "--tp", "3") == f"error: tp: {rule}"
    assert rule == "tp (3) must divide the number of attention heads (32)"
    assert "integer" in bad(client.get("/api/estimate", params={"tp": "abc"}), "tp")
    assert bad(client.get("/api/estimate", params={"tensor": 2}), "tensor") == "unknown field"
    assert "unknown preset" in bad(client.get("/api/estimate", params={"preset": "nope"}), "preset")
    assert "not both" in bad(client.get("/api/estimate", params={"global_batch": 64, "global_batch_tokens": "4M"}), "global_batch_tokens")
    assert "1f1b" in bad(client.get("/api/estimate", params={"schedule": "looped"}), "schedule")
    assert "must be at least 1" in bad(client.get("/api/estimate", params={"pue": 0.5}), "pue")


def test_estimate_reads_no_file_a_request_names(client, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text("{}")
    assert "catalog names only" in bad(client.get("/api/estimate", params={"model": str(cfg)}), "model")
    assert bad(client.get("/api/estimate", params={"plan_file": str(cfg)}), "plan_file") == "unknown field"


def test_explain_gives_the_estimate_derivations(client, capsys):
    d = client.get("/api/explain", params={"model": "llama3-8b", "tp": 2}).json()["derivations"]
    est = client.get("/api/estimate", params={"model": "llama3-8b", "tp": 2}).json()
    keys = [x["key"] for x in d]
    assert "model.params_total" in keys and len(keys) == len(set(keys))
    params = next(x for x in d if x["key"] == "model.params_total")
    assert params["value"].replace(",", "") == str(est["model"]["params_total"])  # the same figure, explained
    text = cli_json_text(capsys, "explain", "--model", "llama3-8b", "--tp", "2")
    for x in d:
        assert f"{x['title']}  [{x['key']}]" in text and f"  = {x['formula']}" in text


def cli_json_text(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out


def without_extras(est: dict) -> dict:
    """An estimate's JSON without its advice and its run with failures: the Plan view's bundle
    leaves out these slow parts (the page fetches /api/estimate for them)."""
    est = {k: v for k, v in est.items() if k != "advice"}
    if est.get("run"):
        est["run"] = {k: v for k, v in est["run"].items() if k != "failures"}
    return est


def test_view_plan_bundles_estimate_pipeline_assumptions(client):
    q = {"preset": "llama3-405b-16k"}
    d = client.get("/api/view/plan", params=q).json()
    full = client.get("/api/estimate", params=q).json()
    assert "failures" in full["run"] and "advice" in full
    assert d["estimate"] == without_extras(full)
    assert client.get("/api/view/plan", params={"tp": 8, "preset": "llama3-405b-16k"}).content == \
        client.get("/api/view/plan", params={"preset": "llama3-405b-16k", "tp": "08"}).content  # kept, by canonical options
    tl = d["timeline"]
    assert (tl["pp"], tl["microbatches"], tl["vpp"]) == (16, 16, 8)
    assert tl["makespan"] == d["estimate"]["time"]["makespan_s"]
    assert [len(r["actions"]) for r in tl["ranks"]] == [2 * 16 * 8] * 16  # F and B of 16 micro-batches on 8 chunks
    assert d["preset"]["name"] == "llama3-405b-16k"
    rows = {r[0]: r for r in d["published"]["rows"]}
    assert rows["step time (s)"][1] == f"{d['estimate']['time']['step_s']:.3f}"
    assert rows["MFU (their formula)"][2] == "41%"
    b = d["assumptions"]["bytes_per_param"]
    assert b["total"] == 18 == d["estimate"]["plan"]["bytes_per_param"]  # Megatron: 2 + 4 + (4 + 8)
    assert b["weights"] + b["gradients"] + b["master_weights"] + b["gradient_fp32_copy"] + b["optimizer_moments"] == b["total"]
    assert d["assumptions"]["gpu"]["mfu_peak_tflops"] == pytest.approx(989.4)
    assert d["breakdown_labels"]["pipeline_bubble"] == "pipeline bubble (idle)"


def test_view_plan_of_a_validated_run(client, capsys):
    """A run id of ``meshplan validate`` is a preset here too: its model and GPU by name, the
    published step and memory beside meshplan's as ``meshplan estimate`` prints them."""
    q = {"preset": "torchtitan_405b_512gpu_3d_1f1b"}
    d = client.get("/api/view/plan", params=q).json()
    assert d["estimate"] == without_extras(cli_json(capsys, "estimate", "--preset", q["preset"], "--json"))
    assert (d["preset"]["values"]["model"], d["preset"]["values"]["gpu"]) == ("llama3-405b", "h100-sxm-96gb-500w")
    rows = {r[0]: r for r in d["published"]["rows"]}
    assert rows["step time (s)"][2] == "40.96"
    assert rows["peak memory (GiB, the fullest GPU)"][1:3] == [f"{d['estimate']['memory']['peak_bytes'] / 2**30:.1f}", "82.5"]


def test_view_plan_fp32_recipe_and_no_timeline_for_huge_pipelines(client):
    d = client.get("/api/view/plan", params={"precision": "fp32"}).json()
    assert d["assumptions"]["bytes_per_param"]["total"] == 16
    big = client.get("/api/view/plan", params={"pp": 8, "vpp": 2, "global_batch": 1024}).json()
    assert big["estimate"]["plan"]["grad_accum"] == 1024
    assert big["timeline"] is None  # 8 ranks x 1,024 micro-batches x 2 chunks x 2 actions > 20,000


def test_gpus_and_presets(client, capsys):
    assert client.get("/api/gpus").json() == cli_json(capsys, "gpus", "--json")
    names = [p["name"] for p in client.get("/api/presets").json()]
    assert names == ["llama3-405b-16k", "llama3-405b-8k"]


# ---- /api/pipeline ---------------------------------------------------------------------------


def test_pipeline_is_the_cli_json(client, capsys):
    q = {"schedule": "interleaved", "pp": 4, "microbatches": 8, "vpp": 2, "fwd": 1.5, "bwd": 3, "transfer": 0.1}
    got = client.get("/api/pipeline", params=q).json()
    assert got == cli_json(capsys, "pipeline", "--schedule", "interleaved", "--pp", "4", "-m", "8", "--vpp", "2",
                           "--fwd", "1.5", "--bwd", "3", "--transfer", "0.1", "--json")


def test_view_pipeline_closed_form_1f1b(client):
    d = client.get("/api/view/pipeline", params={"pp": 4, "microbatches": 8}).json()
    p = d["pipeline"]
    assert p["makespan"] == pytest.approx((8 + 4 - 1) * (1 + 2))  # (m + p − 1)·(f + b)
    assert p["bubble_fraction"] == pytest.approx(3 / 11)  # (p − 1)/(m + p − 1)
    assert p["bubble_overhead"] == pytest.approx(3 / 8)  # (p − 1)/m
    assert d["closed_form"][-1].strip() == "the simulation agrees with the closed form"


def test_pipeline_bad_input(client):
    assert "positive integer" in bad(client.get("/api/pipeline", params={"pp": 0}), "pp")
    assert "unknown schedule" in bad(client.get("/api/pipeline", params={"schedule": "looped"}), "schedule")
    assert "20,000" in bad(client.get("/api/pipeline", params={"pp": 64, "microbatches": 1000}), "microbatches")
    assert bad(client.get("/api/pipeline", params={"schedule": "1f1b", "vpp": 3}), "vpp") == "the 1f1b schedule needs vpp = 1 (got 3)"
    assert "number" in bad(client.get("/api/pipeline", params={"fwd": "fast"}), "fwd")
    assert "one forward:backward pair per virtual stage" in bad(client.get("/api/pipeline", params={"pp": 2, "stage_times": "1:2"}), "stage_times")
    # a misspelt parameter is refused, not answered for the defaults
    for path in ("/api/pipeline", "/api/view/pipeline"):
        rule = bad(client.get(path, params={"p": 2}), "p")
        assert rule == "unknown parameter (this endpoint takes: schedule, pp, microbatches, vpp, fwd, bwd, wgrad, transfer, stage_times, pipeline_runtime)"


# ---- /api/calc -----------------------------------------------------------------------------------


def test_calc_lists_every_calculator_with_its_options(client):
    calcs = {c["name"]: c for c in client.get("/api/calc").json()}
    assert list(calcs) == ["collective", "overlap", "checkpoint", "zero", "failures", "batch", "lr", "formats", "loss-scale", "roofline", "cost"]
    keys = {o["key"] for o in calcs["collective"]["options"]}
    assert {"size", "n", "op", "simulate", "trace", "gpus_per_node"} <= keys
    assert not keys & {"json", "explain", "out"}
    # --params or a plan: the form offers a preset, a model on GPUs and the recipe, not every plan flag
    assert next(o for o in calcs["checkpoint"]["options"] if o["key"] == "params")["required"] is False
    for name in ("checkpoint", "failures"):
        keys = {o["key"] for o in calcs[name]["options"]}
        assert {"preset", "model", "gpus", "tokens"} <= keys and not keys & {"tp", "pp", "vpp", "layer_split"}


def test_calc_collective_is_the_cli_json_with_the_ring_trace(client, capsys):
    got = client.get("/api/calc/collective", params={"size": "2GB", "n": 8, "trace": "true"}).json()
    assert got == cli_json(capsys, "calc", "collective", "--size", "2GB", "--n", "8", "--trace", "--json", "--explain")
    sim = got["simulation"]
    assert len(sim["trace"]) == 2 * (8 - 1) * 8  # 2(n−1) steps, n sends each
    assert sim["correct"] is True and sim["steps"] == sim["model_steps"] == 14
    assert got["sent_bytes_per_gpu"] == pytest.approx(2 * 7 / 8 * 2e9)  # 2(n−1)/n·S


@pytest.mark.parametrize("name, params", [
    ("overlap", [("compute", "200ms"), ("comm", "60ms"), ("buckets", "4")]),
    ("checkpoint", [("params", "405B"), ("component", "gpu:16384:50000h"), ("component", "host:2048:100000h")]),
    ("zero", [("params", "70B"), ("zero", "3"), ("dp", "64")]),
    ("failures", [("work", "54d"), ("checkpoint_time", "98s"), ("mtbf", "2.4h"), ("runs", "200")]),
    ("failures", [("preset", "llama3-405b-16k"), ("tp", "8"), ("runs", "50")]),  # a plan's option the form leaves out
    ("batch", [("target", "2048"), ("dp", "128")]),
    ("lr", [("preset", "llama3-405b")]),
    ("formats", [("names", "bf16,fp16"), ("value", "3.14159")]),
    ("loss-scale", [("overflow", "0010011")]),
    ("roofline", [("gemm", "4096x4096x4096")]),
    ("cost", [("gpus", "16384"), ("days", "54"), ("price", "2")]),
])
def test_every_calculator_answers_as_the_cli(client, capsys, name, params):
    got = client.get(f"/api/calc/{name}", params=params)
    assert got.status_code == 200, got.text
    flags = []
    for k, v in params:
        if k == "names":
            continue
        flags += [f"--{k.replace('_', '-')}", v]
    positional = [v for k, v in params if k == "names"][0].split(",") if any(k == "names" for k, _ in params) else []
    extra = ["--no-progress"] if name == "failures" else []
    assert got.json() == cli_json(capsys, "calc", name, *flags, *extra, "--json", "--explain", *positional)
    assert got.json()["derivations"], "the page shows each figure's derivation"


def test_calc_bad_input(client):
    assert bad(client.get("/api/calc/collective", params={"n": 1}), "n") == "must be at least 2 (got 1)"
    assert "integer" in bad(client.get("/api/calc/collective", params={"n": "two"}), "n")
    assert "unknown option" in bad(client.get("/api/calc/collective", params={"bandwidth": 3}), "bandwidth")
    assert "unknown calculator" in bad(client.get("/api/calc/teleport"), "calculator")
    assert "give --params, or a plan" in bad(client.get("/api/calc/checkpoint"), "params")
    assert "20,000" in bad(client.get("/api/calc/failures", params={"work": "54d", "checkpoint_time": "98s", "mtbf": "3h", "runs": 1_000_000}), "runs")
    assert "true or false" in bad(client.get("/api/calc/collective", params={"simulate": "maybe"}), "simulate")


# ---- /api/search -----------------------------------------------------------------------------------


def _finish(client, job: dict) -> dict:
    for _ in range(600):
        if job["status"] != "running":
            return job
        time.sleep(0.05)
        job = client.get(f"/api/search/{job['id']}").json()
    raise AssertionError("search did not finish")


def test_search_is_the_cli_json(client, capsys):
    body = {"model": "llama3-8b", "gpus": 8, "seq_len": 4096, "global_batch": 64, "max_micro_batch": 2, "top": 5, "pareto": True}
    r = client.post("/api/search", json=body)
    assert r.status_code in (200, 202), r.text
    job = _finish(client, r.json())
    assert job["status"] == "done" and job["phase"] == "finished"
    assert job["done"] == job["total"] == job["result"]["evaluated"]
    want = cli_json(capsys, "search", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64",
                    "--max-micro-batch", "2", "--top", "5", "--pareto", "--json")
    got = job["result"]
    for key in ("evaluated", "feasible", "rejected", "simulated", "objective", "top", "pareto"):
        assert got[key] == want[key], key
    assert len(got["top"]) == 5 and got["top"][0]["rank"] == 1


def test_search_links_open_the_very_plans_found(client):
    """Each top plan's link (and the baseline's) is the Plan view's query of that plan: estimated
    from it, the same JSON as the search's (the estimate's advice and run with failures aside), EP
    and the stack's fields included."""
    body = {"model": "mixtral-8x7b", "gpus": 64, "grad_dtype": "bf16", "tokens": "1T", "price": 2.5, "top": 3, "pareto": False, "max_pp": 2,
            "baseline": "tp=2,ep=4"}
    got = _finish(client, client.post("/api/search", json=body).json())["result"]
    links = got["links"]
    assert len(links["top"]) == 3 and any(t["plan"]["ep"] > 1 for t in got["top"])
    for entry, query in zip(got["top"], links["top"]):
        assert "dp" not in query and query["gpus"] == 64
        est = client.get("/api/estimate", params=query).json()
        assert without_extras(est) == without_extras({k: v for k, v in entry.items() if k in est}), query
    base = client.get("/api/estimate", params=links["baseline"]).json()  # the baseline's JSON has no interval
    assert (base["plan"], base["memory"], base["time"]["step_s"]) == (got["baseline"]["plan"], got["baseline"]["memory"], got["baseline"]["time"]["step_s"])


def test_search_bad_input(client):
    assert "needs --tokens" in bad(client.post("/api/search", json={"objective": "time-to-train"}), "tokens")
    assert "between 1 and 100" in bad(client.post("/api/search", json={"top": 0}), "top")
    assert bad(client.post("/api/search", json={"gpu_count": 8}), "gpu_count") == "unknown field"
    assert "catalog names only" in bad(client.post("/api/search", json={"model": "/etc/hostname"}), "model")
    r = client.get("/api/search/999999")
    assert r.status_code == 404 and r.json()["field"] == "id"


def test_search_work_is_bounded():
    small = TestClient(create_app(Limits(max_search_plans=10)))
    rule = bad(small.post("/api/search", json={"model": "llama3-8b", "gpus": 8, "global_batch": 64}), "search")
    assert "more than the 10 a search may evaluate" in rule and "--" not in rule  # the limits in words, not flags
    quick = TestClient(create_app(Limits(search_seconds=0.0)))
    rule = bad(quick.post("/api/search", json={"model": "llama3-8b", "gpus": 8, "global_batch": 64}), "search")
    assert "stopped after 0 s" in rule and "largest TP" in rule and "--" not in rule
    busy = create_app()
    busy.state.searches.running = Job(id="7")
    r = TestClient(busy).post("/api/search", json={})
    assert r.status_code == 429 and r.json()["field"] == "search" and "search 7 is still running" in r.json()["rule"]


def test_search_reports_its_top_plans_first_and_gives_way_to_a_newer_one(client):
    """The top plans come while the baseline and the front are still computed (``partial``); a new
    search then stops the running one where it is, and that one keeps its top plans and says why."""
    job = client.post("/api/search", json={"preset": "llama3-405b-16k"}).json()
    for _ in range(600):
        if job.get("partial") or job["status"] != "running":
            break
        time.sleep(0.05)
        job = client.get(f"/api/search/{job['id']}").json()
    assert job["partial"] and job["phase"] == "extras" and len(job["result"]["top"]) == 10
    newer = client.post("/api/search", json={"model": "llama3-8b", "gpus": 8, "global_batch": 64, "max_micro_batch": 2})
    assert newer.status_code in (200, 202), newer.text
    old = client.get(f"/api/search/{job['id']}").json()
    assert old["status"] == "done" and old["result"]["top"] == job["result"]["top"]
    assert "a newer search started" in old["result"]["stopped"]["reason"] and old["result"]["stopped"]["in"] in ("baseline", "pareto")
    assert _finish(client, newer.json())["status"] == "done"


# ---- pages, static files, OpenAPI, the command ---------------------------------------------------


def test_pages_and_assets(client):
    assert client.get("/", follow_redirects=False).headers["location"] == "/plan"
    for view, marker in (("plan", 'id="chart-memory"'), ("search", 'id="run-search"'), ("pipeline", 'id="chart-pipeline"'), ("calc", 'id="ring-panel"')):
        page = client.get(f"/{view}")
        assert page.status_code == 200 and marker in page.text
        assert "http://" not in page.text and "https://" not in page.text  # nothing from outside
    assert 'value="llama3-405b-16k"' in client.get("/plan").text
    js = client.get("/vendor/plotly.min.js")
    assert js.status_code == 200 and js.text.startswith("/**") and "plotly.js" in js.text[:300]
    for f in ("app.css", "common.js", "plan.js", "search.js", "pipeline.js", "calc.js", "gantt.js"):
        assert client.get(f"/static/{f}").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/api/estimate", "/api/explain", "/api/view/plan", "/api/search", "/api/search/{job_id}", "/api/pipeline",
              "/api/view/pipeline", "/api/calc", "/api/calc/{name}", "/api/gpus", "/api/presets"):
        assert p in paths, p
    assert {q["name"] for q in paths["/api/estimate"]["get"]["parameters"]} >= {"preset", "tp", "pp", "seq_len", "global_batch_tokens"}


def test_serve_command_bad_input(capsys):
    assert cli_error(capsys, "serve", "--port", "0") == "error: port: must be between 1 and 65535 (got 0)"
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
        assert cli_error(capsys, "serve", "--port", str(port)) == f"error: port: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert cli_error(capsys, "serve", "--host", " ").startswith("error: host: must not be empty")
    assert cli_error(capsys, "serve", "--host", "no-such-host.invalid").startswith("error: host: cannot resolve 'no-such-host.invalid'")
    assert cli_error(capsys, "serve", "--host", "192.0.2.1").startswith("error: host: cannot listen on 192.0.2.1:8765")  # TEST-NET-1
