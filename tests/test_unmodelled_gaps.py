"""Layouts and schedules meshplan recognises but does not model: each is refused with one line
that names the field and says why, exit 2, never a traceback."""

from __future__ import annotations

import pytest

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
