"""Layouts and recipes meshplan recognises but does not model (issue 38, item 4): each is refused
with one line that names the field and says why, exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.errors import InputError
from meshplan.interop import load_plan_file
from meshplan.specs.plan import TrainingPlan
from test_cli import run_cli


def refused(*args: str) -> str:
    code, out, err = run_cli("estimate", *args)
    assert (code, out) == (2, "") and err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def test_ep_spanning_tp_x_dp_is_refused_by_name() -> None:
    # DeepSeek-V3-style EP64 on stages of TP4 x DP32 ranks: ep divides tp·dp = 128, not dp = 32
    err = refused("--model", "deepseek-v3-671b", "--gpus", "2048", "--tp", "4", "--pp", "16", "--ep", "64")
    assert err.startswith("error: ep: ep (64) must divide dp (32): expert parallelism spanning tp x cp x dp")
    assert "Megatron-Core's MoE parallel folding" in err and "= 128" in err
    # an ep that divides neither keeps the plain rule
    assert refused("--model", "deepseek-v3-671b", "--gpus", "2048", "--tp", "4", "--pp", "16", "--ep", "48") == \
        "error: ep: ep (48) must divide dp (32)"
    with pytest.raises(ValueError, match="parallel folding"):
        TrainingPlan.of(tp=4, dp=32, ep=64, global_batch=32, seq_len=4096)


@pytest.mark.parametrize("schedule,nearest", [("dualpipe", "zbh1 and zbv"), ("dualpipev", "zbv")])
def test_dualpipe_schedules_are_refused_with_why(schedule: str, nearest: str) -> None:
    err = refused("--pp", "4", "--schedule", schedule)
    assert err.startswith("error: schedule: DualPipe") and "is not modelled" in err and err.endswith(nearest)
    code, _, err = run_cli("search", "--gpus", "8", "--schedules", f"1f1b,{schedule}")
    assert code == 2 and err.startswith("error: schedules: DualPipe") and err.count("\n") == 1


TOML = """[model]
name = "llama3"
flavor = "8B"
converters = ["quantize.linear.float8"]
[parallelism]
data_parallel_shard_degree = 8
[training]
local_batch_size = 2
seq_len = 8192
[quantize.linear.float8]
{recipe}
"""


@pytest.mark.parametrize("recipe", ["rowwise", "rowwise_with_gw_hp"])
def test_fp8_rowwise_scaling_is_refused_by_name(tmp_path: Path, recipe: str) -> None:
    path = tmp_path / "job.toml"
    path.write_text(TOML.format(recipe=f'recipe_name = "{recipe}"'))
    with pytest.raises(InputError) as caught:
        load_plan_file(str(path))
    assert caught.value.field == "quantize.linear.float8.recipe_name"
    err = refused("--plan", str(path))
    assert err.startswith(f"error: quantize.linear.float8.recipe_name: '{recipe}' is not modelled") and "row-wise" in err
    for ok in ('recipe_name = "tensorwise"', ""):  # tensorwise, torchao's default, is what cost/float8.py models
        path.write_text(TOML.format(recipe=ok))
        assert load_plan_file(str(path)).parsed.plan["precision"]["precision"] == "fp8"
