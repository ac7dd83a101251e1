"""Run length with failures (:mod:`meshplan.calc.run_length`) and ``meshplan estimate --tokens``'s
figures with failures: the published default rate, the MTBF from the GPU count, the checkpoint
from the plan, Daly's interval and expectation, the seeded Monte Carlo's range, and bad input."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from meshplan.calc.checkpoint import DEFAULT_RECOVERY_S, daly_interval
from meshplan.calc.failures import expected_time
from meshplan.calc.run_length import (FAILURES_PER_GPU_HOUR, MC_MAX_FAILURES, FailureModel, gpu_mtbf,
                                      run_with_failures)
from meshplan.cli.app import main
from meshplan.specs.plan import PrecisionRecipe
from meshplan.units import DAY, GBPS

BF16_ADAM = PrecisionRecipe(precision="bf16", grad_dtype="fp32", master_weights=True)


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_default_rate_is_llama3s_interruptions():
    # 419 unexpected interruptions in 54 days on 16,384 GPUs
    assert FAILURES_PER_GPU_HOUR == 419 / (16_384 * 54 * 24)
    assert FAILURES_PER_GPU_HOUR == pytest.approx(1.9733e-5, rel=1e-4)
    # on those 16,384 GPUs the MTBF is the paper's 54 days / 419 = 3.09 h
    assert gpu_mtbf(16_384) == pytest.approx(54 * DAY / 419, rel=1e-12)
    assert gpu_mtbf(16_384) == pytest.approx(11_135.08, abs=0.01)
    # M = 1/(N·λ): half the GPUs, twice the MTBF
    assert gpu_mtbf(8_192) == pytest.approx(2 * gpu_mtbf(16_384), rel=1e-12)
    assert gpu_mtbf(8, rate=1e-4) == pytest.approx(3600 / 8e-4, rel=1e-12)


def test_405b_on_16k_gpus():
    work = 62.45 * DAY
    f = run_with_failures(work, 16_384, 405e9, BF16_ADAM)
    size = 405e9 * 14 + 8  # bf16 weights 2 + fp32 master 4 + Adam moments 8 bytes per parameter
    assert f["checkpoint_bytes"] == size
    # 16,384 writers at 1 GB/s = 16.4 TB/s, capped by the filesystem's 2 TB/s
    assert f["checkpoint_write_s"] == pytest.approx(size / 2e12, rel=1e-12)
    assert f["checkpoint_write_s"] == pytest.approx(2.835, abs=1e-3)
    M, C = gpu_mtbf(16_384), f["checkpoint_write_s"]
    assert f["mtbf_s"] == M and f["mtbf_from"] == "gpus" and f["restart_s"] == DEFAULT_RECOVERY_S == 300.0
    assert f["interval_s"] == pytest.approx(daly_interval(C, M), rel=1e-12)
    assert f["interval_s"] == pytest.approx(249.4, abs=0.5)  # about 4.2 minutes
    ET = expected_time(work, f["interval_s"], C, 300.0, M)
    assert f["expected_seconds"] == pytest.approx(ET, rel=1e-12)
    assert f["goodput"] == pytest.approx(work / ET, rel=1e-12)
    assert f["expected_failures"] == pytest.approx(ET / M, rel=1e-12)
    # first order: C/τ + τ/2M + R/M = 1.14% + 1.12% + 2.69% of the time
    first = C / f["interval_s"] + f["interval_s"] / 2 / M + 300 / M
    assert 1 - f["goodput"] == pytest.approx(first, rel=0.03)
    assert f["goodput"] == pytest.approx(0.952, abs=0.001)
    mc = f["monte_carlo"]
    assert mc["runs"] == 400 and mc["seed"] == 0
    assert mc["days_p10"] < mc["days_p50"] < mc["days_p90"]
    assert mc["days_p10"] < f["expected_days"] < mc["days_p90"]
    assert mc["days_mean"] == pytest.approx(f["expected_days"], rel=2e-3)
    assert run_with_failures(work, 16_384, 405e9, BF16_ADAM) == f  # seeded


def test_given_mtbf_no_cap_and_no_monte_carlo():
    fm = FailureModel(mtbf=3600.0, write_bw=10 * GBPS, fs_bw=None, restart=60.0, runs=0)
    f = run_with_failures(10 * 3600.0, 8, 70e9, BF16_ADAM, fm)
    assert f["mtbf_s"] == 3600.0 and f["mtbf_from"] == "given" and f["failures_per_gpu_hour"] is None
    assert f["checkpoint_write_s"] == pytest.approx((70e9 * 14 + 8) / 80e9, rel=1e-12)  # 8 writers x 10 GB/s
    assert f["monte_carlo"] is None
    assert f["expected_seconds"] == pytest.approx(expected_time(36000.0, f["interval_s"], f["checkpoint_write_s"], 60.0, 3600.0))


def test_bounds():
    # more failures per run than the Monte Carlo simulates: the expectation only, and why
    f = run_with_failures(1000 * DAY, 16_384, 8e9, BF16_ADAM)
    assert f["expected_failures"] > MC_MAX_FAILURES and f["monte_carlo"] is None and "failures per run" in f["monte_carlo_skipped"]
    # a restart 100x the MTBF never succeeds: said, not raised
    f = run_with_failures(DAY, 16_384, 8e9, BF16_ADAM, FailureModel(mtbf=60.0, restart=6000.0))
    assert f["finishes"] is False and "restart" in f["why"]


@pytest.mark.parametrize("kw, field", [(dict(rate=0), "failure_rate"), (dict(write_bw=-1), "ckpt_write_bw"),
                                       (dict(restart=math.inf), "restart"), (dict(runs=1), "runs")])
def test_bad_model(kw, field):
    from meshplan.errors import InputError

    with pytest.raises(InputError) as e:
        FailureModel(**kw)
    assert e.value.field == field


def test_done_when_405b_run_with_failures():
    """`meshplan estimate --preset llama3-405b-16k --tokens 15.6T` shows days with failures and their range."""
    code, out, err = run_cli("estimate", "--preset", "llama3-405b-16k", "--tokens", "15.6T")
    assert code == 0, err
    assert "wall-clock (days), step time only" in out and "64.67" in out
    assert "wall-clock (days), with failures, expected" in out and "67.96" in out
    assert "p10–p90 (Monte Carlo, 400 runs, seed 0)" in out
    assert "419 unexpected interruptions in 54 days on 16,384 H100 GPUs" in out
    code, out, _ = run_cli("estimate", "--preset", "llama3-405b-16k", "--tokens", "15.6T", "--json")
    run = json.loads(out)["run"]
    f = run["failures"]
    assert run["days"] == pytest.approx(64.67, abs=0.01)
    assert f["expected_days"] > run["days"] and f["expected_seconds"] / run["seconds"] == pytest.approx(1 / f["goodput"])
    assert f["monte_carlo"]["days_p10"] < f["monte_carlo"]["days_p90"]


def test_estimate_failure_options():
    _, out, _ = run_cli("estimate", "--tokens", "1T", "--mtbf", "2h", "--restart", "10min", "--ckpt-write-bw", "5",
                        "--ckpt-fs-bw", "0", "--json")
    f = json.loads(out)["run"]["failures"]
    assert f["mtbf_s"] == 7200.0 and f["restart_s"] == 600.0 and f["fs_bw"] is None
    assert f["checkpoint_write_s"] == pytest.approx(f["checkpoint_bytes"] / 40e9)  # 8 GPUs x 5 GB/s
    _, out, _ = run_cli("estimate", "--json")
    assert json.loads(out)["run"] is None  # no tokens, no run


@pytest.mark.parametrize("args, line", [
    (["--mtbf", "3h", "--failure-rate", "1e-5"], "error: mtbf: give --mtbf or --failure-rate, not both"),
    (["--restart", "soon"], "error: restart:"),
    (["--ckpt-write-bw", "0"], "error: ckpt_write_bw: must be greater than 0"),
    (["--failure-rate", "-1"], "error: failure_rate:"),
])
def test_bad_failure_options(args, line):
    code, out, err = run_cli("estimate", "--tokens", "1T", *args)
    assert code == 2 and out == "" and err.startswith(line) and len(err.strip().splitlines()) == 1
