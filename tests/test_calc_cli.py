"""``meshplan calc …``: every subcommand's JSON (one object, the library's figures), ``--explain``
(formula, symbols, result, source), the pictures, and bad input (one line naming the field, exit
status 2, nothing on stdout), through typer's CliRunner and through ``main``."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import xml.etree.ElementTree as ET

import pytest
import typer
import typer.testing
from typer.testing import CliRunner

from meshplan.cli.app import app, main

runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def build_the_cli_once():
    """typer's CliRunner turns the app into a click command on every call (~0.1 s); build it once."""
    built = typer.main.get_command(app)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.testing, "_get_command", lambda a: built if a is app else typer.main.get_command(a))
        yield

# one run of each subcommand, with the figure its JSON must hold
RUNS = [
    (["collective", "--size", "2GB", "--n", "8", "--bw", "50", "--latency", "5us", "--algorithm", "ring"], "bandwidth_s", 0.070),
    (["overlap", "--compute", "200ms", "--comm", "60ms", "--buckets", "40"], "overlap_fraction", 0.975),
    (["checkpoint", "--params", "70B", "--precision", "fp16", "--grad-dtype", "fp16", "--write-bw", "10"], "write_time_s", 98.0),
    (["zero", "--params", "7B", "--zero", "2", "--dp", "64"], "total_bytes", 15.53125e9),
    (["failures", "--work", "10h", "--mtbf", "1h", "--checkpoint-time", "60s", "--recovery", "2min", "--interval", "30min", "--runs", "0"],
     "mtbf_s", 3600.0),
    (["batch", "--target", "2048", "--micro", "4", "--dp", "8", "--micro-time", "120ms", "--allreduce-time", "50ms"], "step_s", 7.73),
    (["lr", "--base-lr", "3e-4", "--base-batch", "256", "--batch", "2048"], "linear_lr", 2.4e-3),
    (["formats", "fp16"], None, None),
    (["loss-scale", "--overflow", "steps=100:10,50"], "final_scale", 16384.0),
    (["roofline", "--gemm", "4096x4096x4096"], "intensity", 4096 / 3),
    (["cost", "--gpus", "16384", "--days", "77", "--kwh-price", "0.05"], "energy_dollars", 1059717.12),
]


def invoke(*args: str):
    return runner.invoke(app, ["calc", *args])


@pytest.mark.parametrize("args,key,value", RUNS, ids=[r[0][0] for r in RUNS])
def test_json_is_one_object_with_the_figures(args, key, value):
    res = invoke(*args, "--json")
    assert res.exit_code == 0, res.output
    assert res.stdout.count("\n") == 1
    d = json.loads(res.stdout)
    assert d["calculator"] == args[0]
    if key is not None:
        assert d[key] == pytest.approx(value, rel=1e-9)
    else:
        assert d["formats"][0]["max"] == 65504.0


@pytest.mark.parametrize("args,key,value", RUNS, ids=[r[0][0] for r in RUNS])
def test_explain_shows_formula_symbols_result_source(args, key, value):
    res = invoke(*args, "--explain")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "\n  = " in out and "\n    " in out  # formula, then symbols with their values
    d = json.loads(invoke(*args, "--json", "--explain").stdout)
    assert d["derivations"] and all(x["source"] and x["formula"] and x["value"] for x in d["derivations"])
    assert out.count("source: ") == len(d["derivations"])
    human = invoke(*args)
    assert human.exit_code == 0 and human.stdout.strip()


def test_explain_substitutes_values():
    out = invoke("checkpoint", "--params", "70B", "--precision", "fp16", "--grad-dtype", "fp16", "--mtbf", "24h", "--explain").stdout
    assert "optimal interval (Young)  [checkpoint.young]" in out
    assert "√(2·C·M)" in out and "98.000 s" in out and "24.00 h" in out and "68.59 min" in out
    assert "Young 1974" in out


def test_json_with_explain_carries_the_derivations():
    d = json.loads(invoke("roofline", "--gemm", "64x64x64", "--json", "--explain").stdout)
    keys = [x["key"] for x in d["derivations"]]
    assert keys == ["roofline.intensity", "roofline.ridge", "roofline.attainable", "roofline.time"]
    assert d["bound"] == "memory-bound"


def test_collective_trace_and_hierarchical():
    res = invoke("collective", "--n", "4", "--trace", "--elements", "8")
    assert res.exit_code == 0
    assert "reduce-scatter step 1/3: 0→1 c0, 1→2 c1, 2→3 c2, 3→0 c3" in res.stdout
    assert "result equals the element-wise sum on every rank" in res.stdout
    d = json.loads(invoke("collective", "--size", "20GB", "--n", "64", "--bw", "600", "--latency", "0", "--gpus-per-node", "8",
                          "--inter-bw", "12.5", "--inter-latency", "0", "--base-latency", "0", "--algorithm", "ring", "--simulate", "--json").stdout)
    assert [p["time_s"] for p in d["phases"]][1] == pytest.approx(0.35)
    assert d["simulation"]["correct"] and d["simulation"]["steps"] == 126


def test_failures_monte_carlo_and_timeline(tmp_path):
    svg = tmp_path / "timeline.svg"
    res = invoke("failures", "--work", "20h", "--mtbf", "2h", "--checkpoint-time", "2min", "--recovery", "5min",
                 "--in-memory-checkpoint-time", "5s", "--in-memory-recovery", "30s", "--runs", "300", "--out", str(svg))
    assert res.exit_code == 0, res.output
    assert "Monte Carlo, 300 runs (percentiles)" in res.stdout and "in-memory" in res.stdout
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    d = json.loads(invoke("failures", "--work", "20h", "--component", "gpu:64:128h", "--checkpoint-time", "2min",
                          "--runs", "200", "--json").stdout)
    assert d["mtbf_s"] == pytest.approx(2 * 3600)
    mc = d["scenarios"][0]["monte_carlo"]
    assert abs(mc["total_s"]["mean"] - d["scenarios"][0]["expected_time_s"]) < 4 * mc["total_s"]["stderr"]


@pytest.mark.parametrize("args", [
    ["lr", "--preset", "llama3-405b", "--out", "{dir}/lr.png"],
    ["lr", "--peak", "3e-4", "--warmup", "100", "--steps", "1000", "--floor", "3e-5", "--out", "{dir}/lr.svg"],
    ["roofline", "--elementwise", "16M", "--out", "{dir}/roof.svg"],
])
def test_pictures(args, tmp_path):
    args = [a.format(dir=tmp_path) for a in args]
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    path = tmp_path / args[-1].rsplit("/", 1)[-1]
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" if path.suffix == ".png" else ET.fromstring(data).tag.endswith("svg")


def test_missing_matplotlib_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    res = invoke("roofline", "--gemm", "8x8x8", "--out", str(tmp_path / "r.svg"))
    assert res.exit_code == 2
    assert res.stderr == "error: out: pictures need matplotlib: pip install 'meshplan[plot]'\n"


BAD = [
    (["collective", "--n", "1"], "error: n: must be at least 2"),
    (["collective", "--size", "0"], "error: size: must be a positive"),
    (["collective", "--size", "-1GB"], "error: size: must be a positive"),
    (["collective", "--size", "lots"], "error: size: 'lots' is not a size"),
    (["collective", "--op", "gossip"], "error: op: unknown op 'gossip'"),
    (["collective", "--n", "12", "--gpus-per-node", "8"], "error: gpus_per_node: must divide n"),
    (["collective", "--op", "all-gather", "--simulate"], "error: simulate:"),
    (["collective", "--efficiency", "1.5"], "error: efficiency: must be at most 1"),
    (["overlap", "--compute", "0ms", "--comm", "1ms"], "error: compute: must be a positive"),
    (["overlap", "--compute", "1s"], "error: comm:"),
    (["checkpoint", "--params", "0"], "error: params: must be a positive"),
    (["checkpoint", "--params", "7B", "--write-bw", "-10"], "error: write_bw: must be a positive"),
    (["checkpoint"], "error: params: give --params, or a plan"),
    (["checkpoint", "--params", "7B", "--preset", "llama3-405b-16k"], "error: params: give --params or a plan"),
    (["checkpoint", "--params", "7B", "--fs-bw", "-1"], "error: fs_bw: must be a non-negative"),
    (["failures", "--work", "1d"], "error: checkpoint_time: give --work and --checkpoint-time, or a plan"),
    (["failures", "--model", "llama3-8b", "--checkpoint-time", "1min"], "error: work: give --work, or --tokens"),
    (["zero", "--params", "7B", "--dp", "0"], "error: dp: must be a positive integer"),
    (["failures", "--work", "1d", "--checkpoint-time", "1min"], "error: mtbf:"),
    (["failures", "--work", "-1d", "--checkpoint-time", "1min", "--mtbf", "1h"], "error: work: must be a positive"),
    (["failures", "--work", "1d", "--checkpoint-time", "1min", "--component", "gpu:8"], "error: component:"),
    (["batch", "--target", "0"], "error: target: must be a positive integer"),
    (["batch", "--target", "64", "--micro", "0"], "error: micro_batch: must be a positive integer"),
    (["lr"], "error: peak:"),
    (["lr", "--base-lr", "-1", "--base-batch", "256", "--batch", "512"], "error: base_lr: must be a positive"),
    (["formats", "fp7"], "error: format: unknown format 'fp7'"),
    (["formats", "--elements", "4x-2"], "error: elements: must be a positive"),
    (["loss-scale"], "error: overflow:"),
    (["loss-scale", "--overflow", "0102"], "error: overflow:"),
    (["roofline", "--gemm", "4096x4096"], "error: gemm:"),
    (["roofline", "--gemm", "8x8x8", "--dtype", "fp4"], "error: format: unknown format 'fp4'"),
    (["roofline", "--gemm", "8x8x8", "--out", "r.pdf"], "error: out: must be a .svg or .png file"),
    (["cost", "--gpus", "0", "--days", "1"], "error: gpus: must be a positive integer"),
    (["cost", "--gpus", "8", "--days", "1", "--hours", "2"], "error: days:"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2(args, needle):
    res = invoke(*args)
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(needle), res.stderr
    assert "Traceback" not in res.stderr


def test_bad_input_through_main():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["calc", "collective", "--n", "1"])
    assert code == 2 and out.getvalue() == ""
    assert err.getvalue() == "error: n: must be at least 2 (got 1)\n"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["calc", "collective", "--n", "two"])  # click's own type check, made one line by main
    assert code == 2 and len(err.getvalue().splitlines()) == 1 and "--n" in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["calc", "checkpoint", "--params", "7B", "--precision", "fp64"])  # the plan option's choices
    assert code == 2 and len(err.getvalue().splitlines()) == 1 and "'--precision'" in err.getvalue()


FULL = [
    ["collective", "--size", "20GB", "--n", "64", "--gpus-per-node", "8", "--simulate"],
    ["overlap", "--compute", "242ms", "--grad-bytes", "20GB", "--n", "64", "--bw", "12.5", "--buckets", "40", "--mfu", "0.5"],
    ["checkpoint", "--params", "70B", "--mtbf", "24h", "--step-time", "10s", "--gpus", "512", "--price", "2", "--run", "30d"],
    ["zero", "--params", "7B", "--zero", "3", "--dp", "64", "--bw", "100"],
    ["failures", "--work", "5h", "--mtbf", "1h", "--checkpoint-time", "1min", "--in-memory-checkpoint-time", "2s", "--runs", "50"],
    ["batch", "--target", "4M", "--micro", "2", "--dp", "64", "--micro-time", "1s", "--allreduce-time", "0.2s", "--critical-batch", "2M", "--seq-len", "4096"],
    ["lr", "--base-lr", "3e-4", "--base-batch", "256", "--batch", "2048", "--steps", "100000", "--peak", "2.4e-3", "--warmup", "8000", "--at", "50000"],
    ["lr", "--preset", "llama3-405b"],
    ["formats", "--elements", "1M", "--value", "0.1"],
    ["loss-scale", "--synthetic", "--steps", "500", "--per-step", "50"],
    ["cost", "--gpus", "16384", "--params", "405B", "--tokens", "15.6T", "--days", "54", "--price", "2", "--pue", "1.4", "--kwh-price", "0.05"],
]


@pytest.mark.parametrize("args", FULL, ids=[" ".join(a[:3]) for a in FULL])
def test_every_figure_has_formula_and_source_with_all_options(args):
    res = invoke(*args, "--json", "--explain")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    missing = [x["key"] for x in d["derivations"] if not (x["source"] and x["formula"] and x["symbols"] is not None)]
    assert not missing
    assert invoke(*args).exit_code == 0
