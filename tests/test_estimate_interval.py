"""The step-time prediction interval on every estimate: ``estimate`` (text and --json: time, run and
MFU ranges), ``search`` (each top plan's interval and which overlap) and the web's JSON."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from test_validate_cli import assert_one_error

from meshplan.accuracy.interval import conformal_ratios, load_residuals, plan_interval
from meshplan.cli.app import main
from meshplan.cli.search_report import overlap_line, overlaps
from meshplan.accuracy.interval import StepInterval


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def default_json():
    code, out, err = cli("estimate", "--json", "--tokens", "1e12", "--price", "2", "--no-advice")
    assert (code, err) == (0, "")
    return json.loads(out)


def test_json_interval_is_the_conformal_quantiles_of_its_group(default_json):
    t = default_json["time"]
    # llama3-8b on 8 H100 with Megatron-Core: the group is fused stacks on H100 at <=128 GPUs
    group = [r.ratio for r in load_residuals() if (r.family, r.generation) == ("fused", "H100") and r.gpus <= 128]
    assert t["interval_basis"] == {"group": "fused stacks on H100 at <=128 GPUs", "runs": len(group), "note": ""}
    assert len(group) == 52
    lo, hi = conformal_ratios(group, 0.8)
    assert t["interval_level"] == 0.8
    assert t["step_s_interval"] == [t["step_s"] * lo, t["step_s"] * hi]
    run, mfu = default_json["run"], default_json["throughput"]["mfu"]
    assert run["days_interval"] == pytest.approx([run["days"] * lo, run["days"] * hi], rel=1e-12)
    assert run["dollars_interval"] == pytest.approx([run["dollars"] * lo, run["dollars"] * hi], rel=1e-12)
    assert default_json["throughput"]["mfu_interval"] == pytest.approx([mfu / hi, mfu / lo], rel=1e-12)


def test_interval_level_option_and_text(default_json):
    code, out, err = cli("estimate", "--json", "--interval", "0.9", "--no-advice")
    t = json.loads(out)["time"]
    assert t["interval_level"] == 0.9
    assert t["step_s_interval"][0] <= default_json["time"]["step_s_interval"][0]
    assert t["step_s_interval"][1] >= default_json["time"]["step_s_interval"][1]
    code, out, err = cli("estimate", "--tokens", "1e12", "--no-advice")
    step, (lo, hi) = default_json["time"]["step_s"], default_json["time"]["step_s_interval"]
    assert f"step {step:.1f} s ({lo:.1f}–{hi:.1f} s, 80 %): the measured step's prediction interval" in out
    assert "residuals of 52 validated runs of fused stacks on H100 at <=128 GPUs" in out
    assert "80 % interval (from the step's)" in out


@pytest.mark.parametrize("bad", ["1.5", "0", "-0.1"])
def test_bad_interval_is_one_error_line(bad):
    assert_one_error(*cli("estimate", "--interval", bad), "interval: must be a level between 0 and 1")


def test_a_level_needing_more_runs_than_known_is_one_error_line():
    assert_one_error(*cli("estimate", "--interval", "0.999"), "interval: the 99.9 % interval needs at least 1999 validated runs")


def test_fallback_is_stated_for_a_group_without_runs():
    from meshplan.catalog import load_gpu
    from meshplan.specs import ClusterSpec, TrainingPlan

    plan = TrainingPlan.of(dp=8, global_batch=8, seq_len=4096)
    iv = plan_interval(plan, ClusterSpec.of(load_gpu("b200"), 8), 2.0)
    assert iv.group == "fused stacks" and iv.runs == 137
    assert iv.note == "only 0 runs of fused stacks on B200 at <=128 GPUs; 0 runs of fused stacks on B200: the 80 % interval needs 9"


def test_overlaps_and_the_line():
    def iv(lo, hi):
        return StepInterval(1.0, lo, hi, 0.8, "g", 10)

    ivs = [iv(1.0, 1.2), iv(1.1, 1.3), iv(1.25, 1.4), iv(2.0, 2.2)]
    assert overlaps(ivs) == [[2], [1, 3], [2], []]
    assert overlap_line(ivs) == ("Within each other's 80 % step-time interval (the ranking between them is within "
                                 "meshplan's error): #1 with #2; #2 with #3")
    assert overlap_line(ivs[:2]).startswith("All 2 top plans lie within each other's 80 % step-time interval")
    assert overlap_line([iv(1, 2), iv(3, 4)]).startswith("No two top plans' 80 % step-time intervals overlap")


def test_search_json_and_text_carry_each_top_plans_interval():
    args = ("search", "--model", "llama3-8b", "--gpus", "64", "--top", "3", "--tp", "1", "--pp", "1", "--cp", "1")
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["interval_level"] == 0.8
    for t in d["top"]:
        lo, hi = t["time"]["step_s_interval"]
        assert lo < hi and t["time"]["interval_basis"]["group"] == "fused stacks on H100 at <=128 GPUs"
        assert t["interval_overlaps"] == [r for r in (1, 2, 3) if r != t["rank"]]
    code, out, err = cli(*args)
    assert "All 3 top plans lie within each other's 80 % step-time interval" in out
    assert_one_error(*cli(*args, "--interval", "2"), "interval: must be a level between 0 and 1")
