"""``meshplan pipeline --pipeline-runtime``: lockstep against dependency-driven on cases worked by
hand, the schedules and pipelines that run dependency-driven whatever is asked, ``--actions-file``
(lockstep only on a built schedule's grid), the JSON fields, the SVG title, the plan summary line
and the web explorer's pipeline view.

Hand-computed values (tests/test_pipeline_lockstep.py works the recursion slot by slot):
interleaved p = 2, m = 2, v = 2 with f = 1, b = 2 per chunk (--fwd 2 --bwd 4 per rank) takes 16 in
lockstep against 15 dependency-driven, which is the closed form (m·v + p − 1)·(f + b) = 5·3 = 15;
with a transfer of 0.5, 20 against 18. ZBV p = 2, m = 2 with f = 1, b = 2 per chunk: 15 against 14.
ZB-H1 p = 2, m = 4 with f = 1, i = w = 1/2: 10 against 9."""

from __future__ import annotations

import typing
import xml.etree.ElementTree as ET

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cli import render
from meshplan.cli.pipeline_runtime import RUNTIME_HELP
from meshplan.cli.pipeline_cmd import pipeline as pipeline_command
from meshplan.cli.pipeline_cmd import run_pipeline
from meshplan.cli.pipeline_runtime import check_runtime, lockstep_cost, matching_schedule
from meshplan.errors import InputError
from meshplan.estimate import estimate
from meshplan.pipeline.schedules import build_schedule, format_actions
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import TrainingPlan
from test_pipeline_cli import assert_one_error, run_cli, run_json

IL = ("--schedule", "interleaved", "--pp", "2", "-m", "2", "--vpp", "2", "--fwd", "2", "--bwd", "4")


# ---- JSON ---------------------------------------------------------------------------------------


def test_lockstep_interleaved_p2_m2_v2_by_hand():
    lock = run_json(*IL, "--pipeline-runtime", "lockstep")
    assert (lock["pipeline_runtime"], lock["pipeline_runtime_requested"]) == ("lockstep", "lockstep")
    assert lock["makespan"] == 16.0 and lock["dependency_makespan"] == 15.0
    assert lock["runtime_note"].startswith("lockstep over torch's grid (PipelineScheduleMulti")
    # rank 1 waits at slot 4 for the link of 2F1 it does not need yet: 3F0 starts at 4, not 3
    assert [tuple(x) for x in lock["ranks"][1]["timeline"]] == [
        ("1F0", 1.0, 2.0), ("1F1", 2.0, 3.0), ("3F0", 4.0, 5.0), ("3B0", 5.0, 7.0), ("3F1", 7.0, 8.0),
        ("3B1", 8.0, 10.0), ("1B0", 10.0, 12.0), ("1B1", 12.0, 14.0)]
    assert [(r["busy"], r["idle"]) for r in lock["ranks"]] == [(12.0, 4.0), (12.0, 4.0)]
    assert lock["bubble_fraction"] == 8 / 32 and lock["bubble_overhead"] == 8 / 24
    dep = run_json(*IL)
    assert (dep["pipeline_runtime"], dep["pipeline_runtime_requested"]) == ("dependency", "dependency")
    assert dep["makespan"] == dep["dependency_makespan"] == 15.0 == (2 * 2 + 2 - 1) * (1 + 2)
    assert [r["actions"] for r in dep["ranks"]] == [r["actions"] for r in lock["ranks"]]
    assert run_json(*IL, "--pipeline-runtime", "dependency") == dep
    slow = run_json(*IL, "--transfer", "0.5", "--pipeline-runtime", "lockstep")
    assert (slow["makespan"], slow["dependency_makespan"]) == (20.0, 18.0)


@pytest.mark.parametrize("args,lock,dep", [
    (("--schedule", "zbv", "--pp", "2", "-m", "2", "--fwd", "2", "--bwd", "4"), 15.0, 14.0),
    (("--schedule", "zbh1", "--pp", "2", "-m", "4", "--fwd", "1", "--bwd", "1"), 10.0, 9.0),
    # F = I = W = 1 on every chunk: every slot one unit, nothing to wait for beyond the data; each
    # rank is busy 3·m·v = 48 and the last starts p − 1 = 3 slots late: 51 both ways
    (("--schedule", "interleaved-zb", "--pp", "4", "-m", "8", "--vpp", "2", "--fwd", "2", "--bwd", "4"), 51.0, 51.0),
])
def test_lockstep_zero_bubble_schedules(args, lock, dep):
    d = run_json(*args, "--pipeline-runtime", "lockstep")
    assert d["pipeline_runtime"] == "lockstep"
    assert (d["makespan"], d["dependency_makespan"]) == (lock, dep)


@pytest.mark.parametrize("args,why", [
    (("--schedule", "1f1b", "--pp", "4", "-m", "8"), "torch runs 1f1b with a single-stage class (Schedule1F1B)"),
    (("--schedule", "gpipe", "--pp", "4", "-m", "8"), "torch runs gpipe with a single-stage class (ScheduleGPipe)"),
    (("--schedule", "interleaved", "--pp", "1", "-m", "4", "--vpp", "2"), "one pipeline rank sends and receives nothing"),
])
def test_single_stage_schedules_and_one_rank_say_they_run_dependency_driven(args, why):
    d = run_json(*args, "--pipeline-runtime", "lockstep")
    assert (d["pipeline_runtime"], d["pipeline_runtime_requested"]) == ("dependency", "lockstep")
    assert d["runtime_note"].startswith("dependency-driven: ") and why in d["runtime_note"]
    assert "--pipeline-runtime lockstep changes nothing" in d["runtime_note"]
    assert d["makespan"] == d["dependency_makespan"] == run_json(*args)["makespan"]
    code, out, err = run_cli(*args, "--pipeline-runtime", "lockstep")
    assert code == 0 and err == ""
    assert f"pipeline runtime: dependency-driven: {why}" in " ".join(out.split())
    assert "lockstep costs" not in out and "Gantt: one column" in out


# ---- human output and picture ------------------------------------------------------------------


def test_human_output_shows_the_runtime_and_its_cost():
    code, out, err = run_cli(*IL, "--pipeline-runtime", "lockstep", "--width", "40")
    assert code == 0 and err == ""
    flat = " ".join(out.split())
    assert "pipeline runtime: lockstep over torch's grid (PipelineScheduleMulti: a rank leaves each slot" in flat
    assert "Gantt (lockstep runtime): one column = 0.4 ms" in out
    assert "makespan 16 ms (lockstep)" in out
    assert ("lockstep costs +1 ms (+6.7%) over the dependency-driven makespan 15 ms "
            "(bubble fraction 0.200 dependency-driven)") in out
    assert "bubble fraction 0.250 (idle share" in out
    # the closed form is the dependency-driven makespan, and says so
    assert "(m·v + p − 1)·(f + b)/v = (2·2 + 2 − 1)·(2 + 4)/2 = 15 ms" in out
    assert "the dependency-driven simulation agrees with the closed form" in out
    code, out, _ = run_cli(*IL)
    assert "pipeline runtime: dependency-driven (an action waits only for its rank and its input)" in out
    assert "Gantt: one column" in out and "lockstep" not in out
    assert "  the simulation agrees with the closed form" in out


def test_human_output_when_lockstep_costs_nothing():
    args = ("--schedule", "interleaved-zb", "--pp", "4", "-m", "8", "--vpp", "2", "--fwd", "2", "--bwd", "4")
    code, out, err = run_cli(*args, "--pipeline-runtime", "lockstep")
    assert code == 0 and err == ""
    assert "makespan 51 ms (lockstep)" in out
    assert "lockstep costs nothing here: the dependency-driven makespan is the same, 51 ms" in out
    assert "lockstep costs +" not in out


def test_svg_title_names_the_runtime(tmp_path):
    path = tmp_path / "lock.svg"
    code, out, err = run_cli(*IL, "--pipeline-runtime", "lockstep", "--out", str(path))
    assert code == 0 and err == ""
    title = ET.fromstring(path.read_text(encoding="utf-8")).find("{http://www.w3.org/2000/svg}title").text
    assert title == "interleaved pipeline: p = 2, m = 2, v = 2, lockstep runtime (+1 ms, +6.7% over dependency-driven)"
    plain = tmp_path / "dep.svg"
    assert run_cli(*IL, "--out", str(plain))[0] == 0
    assert "lockstep" not in plain.read_text(encoding="utf-8")


# ---- --actions-file ------------------------------------------------------------------------------


def _write(tmp_path, name, rows):
    f = tmp_path / name
    f.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(f)


def test_actions_file_runs_lockstep_on_a_built_schedules_grid(tmp_path):
    f = _write(tmp_path, "il.txt", format_actions(build_schedule("interleaved", 2, 2, 2)))
    d = run_json("--actions-file", f, "--fwd", "2", "--bwd", "4", "--pipeline-runtime", "lockstep")
    assert (d["schedule"], d["pipeline_runtime"], d["makespan"], d["dependency_makespan"]) == ("from-file", "lockstep", 16.0, 15.0)
    assert d["runtime_note"].endswith("the file's actions are those of the interleaved schedule, whose grid this is")
    one = _write(tmp_path, "1f1b.txt", format_actions(build_schedule("1f1b", 3, 4, 1)))
    d = run_json("--actions-file", one, "--pipeline-runtime", "lockstep")
    assert d["pipeline_runtime"] == "dependency" and d["makespan"] == (4 + 3 - 1) * 3
    assert "the file's actions are the 1f1b schedule, which torch runs" in d["runtime_note"]


def test_actions_file_of_no_built_schedule_refuses_lockstep(tmp_path):
    # interleaved p = 2, m = 2, v = 2 with rank 0's first backwards swapped: no torch grid has it
    rows = ["0F0,0F1,2F0,2F1,2B0,0B0,2B1,0B1", "1F0,1F1,3F0,3B0,3F1,3B1,1B0,1B1"]
    f = _write(tmp_path, "own.txt", rows)
    assert matching_schedule(build_schedule("interleaved", 2, 2, 2), 2, 2, 2) == "interleaved"
    code, out, err = run_cli("--actions-file", f, "--pipeline-runtime", "lockstep")
    assert_one_error(code, out, err, "error: pipeline_runtime: lockstep replays torch's slot grid of a built schedule")
    assert "for p = 2, m = 2, v = 2" in err and "drop --pipeline-runtime lockstep" in err
    # dependency-driven, as before. Chunks f = 0.5, b = 1: rank 0's 0B0 waits for 1B0, which waits
    # for 2B0 (3–4) and rank 1 (free at 4.5): 1B0 4.5–5.5, 0B0 5.5–6.5, 2B1 6.5–7.5, 1B1 7.5–8.5,
    # 0B1 8.5–9.5 — against (m·v + p − 1)·(f + b) = 5·1.5 = 7.5 in torch's order
    d = run_json("--actions-file", f)
    assert d["pipeline_runtime"] == "dependency" and d["makespan"] == 9.5
    assert run_json("--schedule", "interleaved", "--pp", "2", "-m", "2")["makespan"] == 7.5


# ---- bad input, the option's help -----------------------------------------------------------------


def test_bad_runtime_is_one_line_naming_the_option():
    code, out, err = run_cli("--pipeline-runtime", "slots")
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "--pipeline-runtime" in err and "'slots'" in err
    with pytest.raises(InputError, match="pipeline_runtime: must be dependency, lockstep, deepspeed or blocking \\(got 'slots'\\)"):
        run_pipeline(None, 4, 8, None, None, None, None, 0.0, None, runtime="slots")
    assert check_runtime(None) == "dependency" and check_runtime(" lockstep ") == "lockstep"


def test_help_is_the_plan_options():
    hint = typing.get_type_hints(pipeline_command, include_extras=True)["pipeline_runtime"]
    info = typing.get_args(hint)[1]
    assert info.help == RUNTIME_HELP
    assert "PipelineScheduleMulti" in info.help and "--stack" in info.help


def test_lockstep_cost():
    assert lockstep_cost(16.0, 15.0) == (1.0, 1.0 / 15.0)
    assert lockstep_cost(0.0, 0.0) == (0.0, 0.0)


# ---- the plan summary line -------------------------------------------------------------------------


def test_plan_summary_line_names_lockstep_where_it_runs():
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 64)
    il = TrainingPlan(tp=2, pp=4, dp=8, vpp=2, schedule="interleaved", global_batch=128, seq_len=4096)

    def line(plan):
        return next(x for x in render.header(estimate(model, cluster, plan), None) if x.startswith("plan: "))

    lock = line(il.replace(**{"pipeline_runtime": "lockstep"}))
    assert "interleaved pipeline schedule, vpp 2, lockstep runtime; TP overlap off" in lock
    assert "lockstep" not in line(il)
    one = il.replace(**{"schedule": "1f1b", "vpp": 1, "pipeline_runtime": "lockstep"})
    assert "lockstep" not in line(one)
    flat = TrainingPlan.of(tp=2, pp=1, dp=32, vpp=2, schedule="interleaved", global_batch=128, seq_len=4096,
                        pipeline_runtime="lockstep")
    assert "lockstep" not in line(flat)


# ---- the web explorer -------------------------------------------------------------------------------


def test_web_pipeline_takes_the_runtime(client, capsys):
    from web_support import bad

    q = {"schedule": "interleaved", "pp": 2, "microbatches": 2, "vpp": 2, "fwd": 2, "bwd": 4, "pipeline_runtime": "lockstep"}
    got = client.get("/api/pipeline", params=q).json()
    capsys.readouterr()
    assert got == run_json(*IL, "--pipeline-runtime", "lockstep")
    assert (got["makespan"], got["dependency_makespan"]) == (16.0, 15.0)
    view = client.get("/api/view/pipeline", params=q).json()
    assert view["pipeline"]["pipeline_runtime"] == "lockstep"
    assert view["closed_form"][-1] == "  the dependency-driven simulation agrees with the closed form"
    plain = {k: v for k, v in q.items() if k != "pipeline_runtime"}
    assert client.get("/api/pipeline", params=plain).json()["pipeline_runtime"] == "dependency"
    rule = bad(client.get("/api/pipeline", params={**q, "pipeline_runtime": "slots"}), "pipeline_runtime")
    assert rule == "must be dependency, lockstep, deepspeed or blocking (got 'slots')"
    page = client.get("/pipeline").text
    assert 'data-field="pipeline_runtime"' in page and "<option>lockstep</option>" in page and 'id="pl-runtime"' in page
    assert "PipelineScheduleMulti" in page  # the option's help as the select's title
    js = client.get("/static/pipeline.js").text
    assert "dependency_makespan" in js and "pl-runtime-cost" in js


def test_web_pipeline_view_shows_the_runtime_and_its_cost(server, page):
    from web_support import loaded

    page.goto(f"{server}/pipeline?schedule=interleaved&pp=2&microbatches=2&vpp=2&fwd=2&bwd=4&pipeline_runtime=lockstep")
    loaded(page)
    assert page.input_value("#p-pipeline_runtime") == "lockstep"
    assert page.text_content("#pl-makespan") == "16"
    assert page.text_content("#pl-runtime") == "lockstep"
    assert page.text_content("#pl-runtime-cost") == "+1 (+6.7%) over dependency-driven 15"
    assert page.text_content("#pl-title").endswith(", lockstep runtime")
    page.select_option("#p-pipeline_runtime", "dependency")
    page.wait_for_function("document.getElementById('pl-makespan').textContent === '15'")
    assert page.text_content("#pl-runtime") == "dependency"
    assert page.text_content("#pl-runtime-cost").startswith("dependency-driven (an action waits only")
