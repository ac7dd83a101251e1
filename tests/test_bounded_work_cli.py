"""Hostile and careless command lines: each is one ``error:`` line (status 2) or a bounded,
correct answer, within 10 s and 1 GB (:mod:`bounded_support`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bounded_support import BYTES, SECONDS, bounded, one_error_line, run_main

ROOT = Path(__file__).resolve().parents[1]

REFUSED = [
    (["pipeline", "--fwd", "1e308", "--bwd", "1e308"], "error: fwd: must be between 1e-09 and 1e+12"),
    (["pipeline", "--pp", "2", "-m", "2", "--transfer", "1e16", "--json"], "error: transfer: must be between"),
    (["pipeline", "--fwd", "5e-324", "--bwd", "5e-324", "--json"], "error: fwd: must be between"),
    (["pipeline", "--fwd", "1", "--bwd", "2", "--transfer", "1e-7"], "error: bwd: 2 is more than 1e+06 times the shortest time"),
    (["pipeline", "--pp", "64", "-m", "1024", "--vpp", "8", "--json"], "error: microbatches: p·v·m = 524,288"),
    (["search", "--gpus", "8", "--batch-range", "nan,inf"], "error: batch_range: MIN and MAX must be a finite number"),
    (["search", "--gpus", "8", "--pp", "2", "--baseline", "tp=0"], "error: baseline: tp must be at least 1 (got 0)"),
    (["calc", "failures", "--work", "1000d", "--checkpoint-time", "1s", "--mtbf", "0.1h", "--runs", "2"],
     "error: runs: each run would see about 5.96e+05 failures"),
    (["calc", "failures", "--work", "54d", "--checkpoint-time", "98s", "--mtbf", "0.5h", "--runs", "1000000"],
     "error: runs: 1,000,000 runs × about"),
]


@pytest.mark.parametrize("args,line", REFUSED, ids=[" ".join(a)[:60] for a, _ in REFUSED])
def test_refused_in_one_line_within_bounds(args, line):
    (code, out, err), seconds, peak = bounded(lambda: run_main(args))
    assert one_error_line(code, out, err).startswith(line)
    assert seconds < SECONDS and peak < BYTES


def test_failures_whose_runs_all_take_as_long():
    args = ["calc", "failures", "--work", "1h", "--checkpoint-time", "98s", "--mtbf", "24h", "--runs", "2", "--json", "--explain"]
    (code, out, err), seconds, peak = bounded(lambda: run_main(args))
    assert code == 0, err
    assert "every run took the same time" in out or "standard errors" in out
    assert seconds < SECONDS and peak < BYTES


def test_failures_picture_of_a_long_run_is_drawn_at_the_picture_resolution(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.svg"
    args = ["calc", "failures", "--work", "100d", "--checkpoint-time", "1s", "--mtbf", "1h", "--runs", "2", "--out", str(out)]
    (code, _, err), seconds, peak = bounded(lambda: run_main(args))
    assert code == 0, err
    assert out.stat().st_size < 5_000_000  # 4,000 slices a lane, not 200,000 bars
    assert seconds < SECONDS and peak < BYTES


@pytest.mark.parametrize("body,field", [
    ("n_heads: 0", "model.n_heads"), ("n_heads: .inf", "model.n_heads"), ("n_heads: 4\nhead_dim: .inf", "model.head_dim"),
])
def test_model_yaml_with_impossible_heads(tmp_path, body, field):
    path = tmp_path / "m.yaml"
    path.write_text(f"name: x\nn_layers: 2\nhidden: 64\n{body}\nffn_hidden: 128\nvocab_size: 100\n")
    assert one_error_line(*run_main(["estimate", "--model", str(path)])).startswith(f"error: {field}: ")


@pytest.mark.parametrize("cmd", [["pipeline", "--out"], ["export", "--to", "deepspeed", "--out"]])
def test_out_names_too_long_for_the_file_system(tmp_path, cmd):
    name = str(tmp_path / ("a" * 300 + (".svg" if cmd[0] == "pipeline" else ".json")))
    line = one_error_line(*run_main(cmd + [name]))
    assert line.startswith("error: out: a name in ") and "the file system holds at most" in line


@pytest.mark.parametrize("cmd", [["export", "--to", "deepspeed"], ["pipeline"], ["calc", "roofline", "--gemm", "8x8x8"]])
def test_out_never_follows_a_dangling_link(tmp_path, cmd):
    if cmd[0] == "calc":
        pytest.importorskip("matplotlib")
    link, target = tmp_path / ("o.json" if cmd[0] == "export" else "o.svg"), tmp_path / "elsewhere"
    link.symlink_to(target)
    assert "is a symbolic link" in one_error_line(*run_main(cmd + ["--out", str(link)]))
    assert not target.exists()


def test_learn_on_input_that_is_not_utf8():
    script = "import sys; from meshplan.cli.app import main; sys.exit(main(['learn', '--seed', '1', '--count', '1']))"
    res = subprocess.run([sys.executable, "-c", script], input=b"\xff\xfe answer\n", capture_output=True, timeout=60,
                         env={"PYTHONPATH": str(ROOT / "src"), "PYTHONIOENCODING": "utf-8:strict", "PATH": "/usr/bin:/bin"})
    err = res.stderr.decode()
    assert res.returncode == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("error: input: the answer is not utf-8 text")


def test_pipeline_json_start_times_are_never_negative():
    code, out, err = run_main(["pipeline", "--pp", "4", "-m", "8", "--fwd", "0.3", "--bwd", "0.7", "--transfer", "1e5", "--json"])
    assert code == 0, err
    starts = [s for r in json.loads(out)["ranks"] for _, s, _ in r["timeline"]]
    assert min(starts) >= 0


@pytest.mark.parametrize("args,line", [
    (["calc", "failures", "--work", "1h", "--checkpoint-time", "98s", "--mtbf", "24h", "--seed", "-1"], "error: seed: must be at least 0"),
    (["calc", "loss-scale", "--synthetic", "--seed", "-5"], "error: seed: must be at least 0"),
    (["calc", "failures", "--work", "1e308", "--checkpoint-time", "98s", "--mtbf", "24h"], "error: interval: the run would have more than"),
])
def test_found_by_the_fuzz(args, line):
    assert one_error_line(*run_main(args)).startswith(line)


def test_dp_shard_equal_to_dp_reads_back_with_expert_parallelism():
    """search --json reports dp_shard = dp (no HSDP); estimate takes it back as the same plan."""
    base = ["estimate", "--model", "mixtral-8x7b", "--gpus", "32", "--pp", "2", "--ep", "4", "--zero", "2", "--json"]
    plain, shard = run_main(base), run_main(base + ["--dp-shard", "16"])
    assert plain[0] == shard[0] == 0, shard[2]
    assert shard[1] == plain[1]
    line = one_error_line(*run_main(base + ["--dp-shard", "8"]))
    assert line.startswith("error: dp_shard: HSDP (dp_shard) with expert parallelism")
