"""Every published run of ``meshplan validate`` as a preset of ``meshplan estimate``
(``meshplan.accuracy.run_presets``): the preset resolves to the very model, cluster and plan
``validate`` predicts, so the estimate is the row's prediction to the last digit; the published
step time and peak memory print beside meshplan's; options override it; bad names are one line.
"""

from __future__ import annotations

import json

import pytest
from test_cli import run_cli

from meshplan.accuracy.run_presets import run_ids
from meshplan.accuracy.validate import predict, runs_of
from meshplan.cli.options import PlanArgs, resolve
from meshplan.estimate import estimate
from meshplan.presets import PRESETS, Preset, get_preset
from meshplan.units import GiB

ROW = "torchtitan_405b_512gpu_3d_1f1b"


def runs_of_plan(row_id: str):
    return {r.id: r for r in runs_of("all")}[row_id].plan


def test_every_supported_run_resolves_to_the_plan_validate_predicts():
    runs = [r for r in runs_of("all") if r.supported]
    assert len(runs) > 200  # visible and held out
    for run in runs:
        setup = resolve(PlanArgs(preset=run.id))
        assert (setup.model, setup.cluster, setup.plan) == (run.model, run.cluster, run.plan), run.id
        assert setup.preset.published.step_s == run.published_step_s
        assert setup.preset.published.peak_memory_gib == run.published_mem_gib


def test_the_estimate_is_the_rows_prediction_exactly():
    runs = {r.id: r for r in runs_of("all")}
    for row_id in (ROW, "korthikanti22_530B_dp8_2240gpu", "dgxc_grok1_314b_fp8_64gpu", "llmfoundry_a100_40gb_3b_32gpu",
                   "trainy_h200_llama3_8b@32gpu"):
        setup = resolve(PlanArgs(preset=row_id))
        est = estimate(setup.model, setup.cluster, setup.plan, setup.budget)
        row = predict(runs[row_id])
        assert est.time.step_s == row.predicted_step_s
        assert est.peak_bytes / GiB == row.predicted_mem_gib


def test_ids_are_case_insensitive_and_listed_in_validates_order():
    assert get_preset(ROW.upper()).name == ROW
    assert run_ids() == [r.id for r in runs_of("all")]


def test_estimate_prints_published_step_and_memory_and_the_assumptions():
    code, out, err = run_cli("estimate", "--preset", ROW)
    assert (code, err) == (0, "")
    row = predict({r.id: r for r in runs_of("visible")}[ROW])
    assert f"preset {ROW}: published run of `meshplan validate` (torchtitan), 512 x" in out
    step = next(line for line in out.splitlines() if line.strip().startswith("step time (s)"))
    assert step.split()[-3:] == [f"{row.predicted_step_s:.3f}", "40.96", f"{100 * row.error:+.1f}%"]
    mem = next(line for line in out.splitlines() if "peak memory (GiB" in line)
    assert mem.split()[-3:] == [f"{row.predicted_mem_gib:.1f}", "82.5", f"{100 * row.mem_error:+.1f}%"]
    assert "note: published step time: global batch tokens / (tokens/s per GPU x GPUs) = 2,097,152 / (100 x 512)" in out
    assert "note: full activation checkpointing of every layer" in out


def test_options_override_the_run():
    base = resolve(PlanArgs(preset=ROW)).plan
    over = resolve(PlanArgs(preset=ROW, schedule="interleaved", vpp=2)).plan
    assert (over.schedule, over.vpp) == ("interleaved", 2)
    kept = ("precision", "global_batch", "micro_batch")
    assert {k: getattr(over, k) for k in kept} == {k: getattr(base, k) for k in kept}
    assert base.stack.name == over.stack.name == "torchtitan-2024" and base.stack.pp_buffers == "per-micro-batch"
    # the profile's rules apply to the new layout: torch's 2024 lockstep runtime runs the multi-stage schedule
    assert (base.stack.pipeline_runtime, over.stack.pipeline_runtime) == ("dependency", "lockstep")
    assert over.stack.model_copy(update={"pipeline_runtime": "dependency"}) == base.stack
    # the fields no option sets still yield to a stage they do not apply to
    assert resolve(PlanArgs(preset=ROW, zero="1")).plan.stack.fsdp_accumulate_unsharded is False


def test_a_new_pipeline_drops_the_presets_layer_split(monkeypatch):
    split = "7,8*14,7"  # 126 layers on 16 ranks, one fewer on the first and last
    values = dict(PRESETS["llama3-405b-16k"].values, vpp=1, schedule="1f1b", layer_split=split)
    monkeypatch.setitem(PRESETS, "split", Preset("split", "a 1F1B split", values))
    assert resolve(PlanArgs(preset="split")).plan.layer_split == (7,) + (8,) * 14 + (7,)
    for change in ({"pp": 8}, {"vpp": 2}, {"schedule": "gpipe"}):
        assert resolve(PlanArgs(preset="split", **change)).plan.layer_split is None, change
    assert resolve(PlanArgs(preset="split", pp=8, layer_split="15,16*6,15")).plan.layer_split == (15,) + (16,) * 6 + (15,)


def test_json_estimate_and_explain_take_a_run_preset():
    code, out, err = run_cli("estimate", "--preset", "dgxc_llama31_8b_fp8_8gpu", "--json")
    assert (code, err) == (0, "")
    d = json.loads(out)
    assert (d["plan"]["tp"], d["plan"]["cp"], d["plan"]["precision"]) == (1, 2, "fp8")
    code, out, err = run_cli("explain", "--preset", "dgxc_llama31_8b_fp8_8gpu", "--figure", "mfu")
    assert code == 0 and "Model FLOPs utilization" in out


@pytest.mark.parametrize("name, rule", [
    ("opt_175b_992gpu", "published run 'opt_175b_992gpu' cannot be estimated: 147 TFLOP/s is an 'up to' peak"),
    ("torchtitan_405b_512gpu", "did you mean torchtitan_405b_512gpu_3d_1f1b,"),
    ("zzzz", "named presets: llama3-405b-16k, llama3-405b-8k; or a run id that `meshplan validate --set all` lists)"),
])
def test_bad_run_names_are_one_line(name, rule):
    code, out, err = run_cli("estimate", "--preset", name)
    assert (code, out) == (2, "")
    assert err.startswith("error: preset: ") and rule in err and err.count("\n") == 1


@pytest.mark.parametrize("row_id", ["torchtitan_405b_512gpu_3d_1f1b", "dgxc_grok1_314b_fp8_64gpu"])
def test_search_ranks_the_published_layout(row_id):
    """The run's plan is the search's baseline, estimated exactly as validate predicts it; the
    searched plans vary ZeRO and EP (a ZeRO-3 pipeline's unsharded accumulation, an EP 8 run)."""
    code, out, err = run_cli("search", "--preset", row_id, "--top", "3", "--json")
    assert (code, err) == (0, ""), err
    d = json.loads(out)
    row = predict({r.id: r for r in runs_of("all")}[row_id])
    assert d["baseline"]["time"]["step_s"] == row.predicted_step_s
    assert d["baseline"]["plan"]["zero"] == runs_of_plan(row_id).zero
    assert len(d["top"]) == 3 and {p["plan"]["zero"] for p in d["top"]} <= {0, 1, 2, 3}
