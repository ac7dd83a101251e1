"""``meshplan calc checkpoint`` and ``calc failures`` on a plan (:mod:`meshplan.cli.calc_plan`):
the size, writers, step and run of the plan, the MTBF from the GPU count (said in a note), the
restart default shared by both, and agreement with ``estimate --tokens``' run with failures."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from meshplan.calc.run_length import FAILURES_PER_GPU_HOUR
from meshplan.cli.app import main
from meshplan.learn import generate
from meshplan.units import DAY, HOUR

P_405B = 405_853_388_800  # Llama 3.1 405B, meshplan.cost.params


def cli_json(*args: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["calc", *args, "--json"])
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


def test_checkpoint_of_the_405b_preset():
    d = cli_json("checkpoint", "--preset", "llama3-405b-16k")
    size = P_405B * 14 + 8  # bf16 weights, fp32 master, Adam moments
    assert d["params"] == P_405B and d["size_bytes"] == size and d["writers"] == 16_384
    assert d["write_time_s"] == pytest.approx(size / 2e12, rel=1e-12)  # 16,384 x 1 GB/s capped at 2 TB/s
    assert d["mtbf_s"] == pytest.approx(54 * DAY / 419, rel=1e-12)  # Llama 3's own rate on its own GPU count
    assert d["recovery_s"] == 300.0  # not the write time
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["estimate", "--preset", "llama3-405b-16k", "--json"]) == 0
    assert d["interval_steps"] == pytest.approx(d["young_interval_s"] / json.loads(out.getvalue())["time"]["step_s"], rel=1e-9)
    assert any("derived from 16,384 GPUs" in n for n in d["notes"])
    assert any("from the plan: llama3-405b" in n for n in d["notes"])


def test_checkpoint_params_with_gpus_derives_the_mtbf_and_says_so():
    d = cli_json("checkpoint", "--params", "70B", "--gpus", "512", "--price", "2")
    assert d["mtbf_s"] == pytest.approx(HOUR / (512 * FAILURES_PER_GPU_HOUR), rel=1e-12)  # 98.97 h
    assert d["recovery_s"] == 300.0 and d["write_time_s"] == pytest.approx(98.0)  # one writer at 10 GB/s
    assert d["cost_per_crash"] == pytest.approx(512 * 2 * (d["young_interval_s"] / 2 + 300) / 3600, rel=1e-12)
    assert "MTBF 99 h derived from 512 GPUs" in d["notes"][0]
    d = cli_json("checkpoint", "--params", "70B")
    assert "mtbf_s" not in d and d["notes"] == ["no MTBF: give --mtbf, --component, --gpus or a plan for the interval, waste and cost per crash"]
    d = cli_json("checkpoint", "--params", "70B", "--mtbf", "24h", "--recovery", "read-back")
    assert d["recovery_s"] == d["write_time_s"] == pytest.approx(98.0)  # source 001's restart: reading it back


def test_failures_of_the_plan_agree_with_estimate():
    d = cli_json("failures", "--preset", "llama3-405b-16k", "--tokens", "15.6T", "--runs", "0")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["estimate", "--preset", "llama3-405b-16k", "--tokens", "15.6T", "--json"]) == 0
    run = json.loads(out.getvalue())["run"]
    sc = d["scenarios"][0]
    assert d["work_s"] == pytest.approx(run["seconds"], rel=1e-12) and d["mtbf_s"] == run["failures"]["mtbf_s"]
    assert sc["checkpoint_s"] == pytest.approx(run["failures"]["checkpoint_write_s"], rel=1e-12)
    assert sc["recovery_s"] == run["failures"]["restart_s"] == 300.0
    assert sc["expected_time_s"] == pytest.approx(run["failures"]["expected_seconds"], rel=1e-12)
    assert sc["expected_time_s"] / DAY == pytest.approx(67.96, abs=0.01)
    # given times win over the plan's; the GPU count alone gives the MTBF
    d = cli_json("failures", "--work", "1d", "--checkpoint-time", "1min", "--gpus", "1024", "--runs", "0")
    assert d["mtbf_s"] == pytest.approx(HOUR / (1024 * FAILURES_PER_GPU_HOUR), rel=1e-12) and d["work_s"] == DAY


def test_learn_crash_cost_command_gives_its_answer():
    ex = generate("ckpt-crash-cost")
    assert "--recovery read-back" in ex.command
    d = cli_json(*ex.command.split()[2:-1])  # without --explain
    assert d["cost_per_crash"] == pytest.approx(ex.answer.value, rel=1e-12)
