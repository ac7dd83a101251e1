"""The step-time prediction interval (meshplan.accuracy.interval): split-conformal order statistics,
the fallback to broader groups, the residuals file (fails when stale), and the coverage ``validate``
reports on the held-out runs."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from test_validate_cli import assert_one_error, run_cli

from meshplan.accuracy.coverage import coverage
from meshplan.accuracy.interval import (
    WRITE_COMMAND, Residual, conformal_ratios, interval_for, load_residuals, min_runs, residuals_json, residuals_of,
)
from meshplan.cli import validate_cmd
from meshplan.errors import InputError


@pytest.fixture(scope="module")
def everything(validated_all):
    return validated_all


def _res(ratio: float, *, source="s", family="fused", generation="H100", gpus=64, run_set="visible") -> Residual:
    return Residual(f"r{ratio}", source, run_set, gpus, generation, family, "nemo", 1.0, ratio)


def test_order_statistics_of_split_conformal():
    # n >= 2/alpha - 1: 9 runs at 80 %, 19 at 90 %, 3 at 50 %
    assert [min_runs(x) for x in (0.5, 0.8, 0.9, 0.95)] == [3, 9, 19, 39]
    ratios = [float(i) for i in range(1, 10)]  # 1..9, shuffled order does not matter
    assert conformal_ratios(ratios[::-1], 0.8) == (1.0, 9.0)  # k_lo = floor(10·0.1) = 1, k_hi = ceil(10·0.9) = 9
    assert conformal_ratios(ratios[:8], 0.8) is None
    ratios = [float(i) for i in range(1, 22)]  # n = 21: k_lo = floor(22·0.1) = 2, k_hi = ceil(22·0.9) = 20
    assert conformal_ratios(ratios, 0.8) == (2.0, 20.0)
    assert conformal_ratios(ratios, 0.5) == (5.0, 17.0)  # floor(22·0.25) = 5, ceil(22·0.75) = 17


def test_the_narrowest_group_with_enough_runs_is_used_and_the_fallback_said():
    near = [_res(1.0 + i / 100, gpus=4096) for i in range(9)]  # 9 runs at >2048 GPUs: enough at 80 %
    far = [_res(2.0 + i / 100, generation="A100") for i in range(20)]
    iv = interval_for(10.0, "fused", "H100", 8192, 0.8, near + far)
    assert (iv.low, iv.high, iv.runs, iv.group, iv.note) == (10.0, 10.8, 9, "fused stacks on H100 at >2048 GPUs", "")
    iv = interval_for(10.0, "fused", "H100", 8192, 0.9, near + far)  # 90 % needs 19: falls back twice
    assert (iv.runs, iv.group) == (29, "fused stacks")
    assert iv.note == "only 9 runs of fused stacks on H100 at >2048 GPUs; 9 runs of fused stacks on H100: the 90 % interval needs 19"
    # k_lo = floor(30·0.05) = 1 (ratio 1.00), k_hi = ceil(30·0.95) = 29 (ratio 2.19, the largest)
    assert iv.low == pytest.approx(10.0) and iv.high == pytest.approx(21.9)
    assert iv.scaled(20.0) == pytest.approx((20.0, 43.8))
    with pytest.raises(InputError, match="the 95 % interval needs at least 39 validated runs; 29 are known"):
        interval_for(10.0, "fused", "H100", 64, 0.95, near + far)


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.2])
def test_a_level_outside_zero_one_is_refused(bad):
    with pytest.raises(InputError, match="must be a level between 0 and 1"):
        interval_for(1.0, "fused", "H100", 8, bad)


def test_residuals_file_is_current(everything):
    """Fails when a change moved predictions (or the runs) without rewriting the file."""
    text = resources.files("meshplan.catalog").joinpath("data", "residuals.json").read_text()
    assert text == residuals_json(everything.rows), f"residuals.json is stale: run `{WRITE_COMMAND}`"
    assert len(load_residuals()) == len(json.loads(text)["runs"]) == 206
    assert [r.id for r in load_residuals()] == [r.id for r in everything.supported()]


def test_coverage_on_the_held_out_runs(everything):
    cov = coverage(residuals_of(everything.rows), 0.8)
    got = [(m["name"], m["rows"], m["covered"], m["runs"]) for m in cov["methods"]]
    assert got == [("visible → held-out", "held-out", 145, 153), ("leave one source out", "held-out", 117, 153),
                   ("leave one source out", "visible", 36, 53)]
    assert cov["methods"][1]["coverage"] == 117 / 153


def test_validate_reports_coverage_and_refuses_a_bad_level(everything, monkeypatch):
    monkeypatch.setattr(validate_cmd, "build_report", lambda sources=None, run_set="visible": everything)
    code, out, err = run_cli("--json", "--set", "all", "--interval", "0.9")
    assert (code, err) == (0, "")
    cov = json.loads(out)["interval_coverage"]
    assert cov["level"] == 0.9 and [m["covered"] for m in cov["methods"]] == [153, 140, 37]
    code, out, err = run_cli("--set", "all")
    assert "leave one source out: 117 of 153 held-out runs inside (76.5%)" in out
    assert_one_error(*run_cli("--interval", "1.5"), "interval: must be a level between 0 and 1")
    assert_one_error(*run_cli("--write-residuals", "x.txt"), "write-residuals: must be a .json file")
