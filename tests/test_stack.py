"""Stacks: the software that runs a plan (meshplan.specs.stack), its profiles
(catalog/data/stacks.yaml) and the one switch that picks them (--stack, --set)."""

from __future__ import annotations

import json

import pytest
from test_cli import run_cli, run_json

from meshplan.catalog import load_stack, stack_names, stack_overrides, stack_profile, stack_recompute, stack_schedules
from meshplan.cli.options import PLAN_OPTIONS, PlanArgs, parse_set, resolve
from meshplan.errors import InputError
from meshplan.search.space import RECOMPUTE, SCHEDULE_NAMES
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import BEHAVIOUR_FIELDS, DEFAULT_STACK, RULES, Stack, applied, ignored

#: the fifteen behaviour fields that left TrainingPlan
MOVED = ("kernels", "compile_loss", "pp_buffers", "pp_return_outputs", "fsdp_head_in_root", "fsdp_fp8_all_gather",
         "fp8_linears", "attention_kernel", "pipeline_runtime", "tp_overlap_kind", "reshard_after_forward",
         "overlap_grad_reduce", "overlap_param_gather", "fsdp_accumulate_unsharded", "tp_comm_overlap")


#: behaviour fields added to the stack since, never plan fields
ADDED = ("zero3_comm", "tp_backward_overlap", "pp_scatter_gather", "grad_accumulation")


def test_the_behaviour_fields_live_in_the_stack_not_the_plan():
    assert sorted(BEHAVIOUR_FIELDS) == sorted(MOVED + ADDED) and len(MOVED) == 15
    assert not set(ADDED) & set(TrainingPlan.model_fields)
    assert not set(MOVED) & set(TrainingPlan.model_fields)
    # 34 fields, 15 moved into the stack, the stack added, then recompute_layers (a plan's choice, not behaviour)
    assert "stack" in TrainingPlan.model_fields and len(TrainingPlan.model_fields) == 34 - 15 + 1 + 1
    with pytest.raises(ValueError, match="kernels"):
        TrainingPlan(global_batch=8, seq_len=1024, kernels="eager")  # the constructor is strict: no flat stack field
    flat = TrainingPlan.of(global_batch=8, seq_len=1024, kernels="eager")  # .of takes them flat, on purpose
    assert flat == TrainingPlan(global_batch=8, seq_len=1024, stack=Stack(kernels="eager"))
    # only the common one keeps a flag; the rest are --set
    assert "tp_comm_overlap" in PLAN_OPTIONS and not set(MOVED) - {"tp_comm_overlap"} & set(PLAN_OPTIONS)


def test_every_profile_gives_every_field_with_its_source():
    names = stack_names()
    assert {"megatron-core", "nemo", "torchtitan", "torchtitan-2024", "fsdp2-eager", "deepspeed", "deepspeed-zero3",
            "deepspeed-zero3-2021", "nanotron", "composer", "megatron-deepspeed", "megatron-lm-2021", "megatron-lm-2022"} == set(names)
    for name in names:
        entry = stack_profile(name)
        assert entry["title"] and entry["release"] and entry["summary"], name
        assert list(entry["fields"]) == list(BEHAVIOUR_FIELDS), name  # every field, in the Stack's order
        for field, e in entry["fields"].items():
            assert e["source"].strip() and e["why"].strip(), (name, field)
        assert set(stack_schedules(name)) <= set(SCHEDULE_NAMES), name
        assert set(stack_recompute(name)) <= set(RECOMPUTE) and "none" in stack_recompute(name), name
        assert load_stack(name).name == name
    # meshplan's defaults are the megatron-core profile's: no plan changed its numbers by the move
    assert load_stack(DEFAULT_STACK) == Stack()
    assert load_stack("torchtitan").kernels == "compiled" and load_stack("fsdp2-eager").kernels == "eager"
    assert stack_schedules("megatron-core") == ("1f1b", "interleaved") and stack_schedules("composer") == ()


def test_the_rules_ignore_what_a_plan_cannot_use():
    tt = load_stack("torchtitan-2024")
    zero1 = TrainingPlan(global_batch=8, seq_len=1024, zero=1, stack=tt)
    # ZeRO-1, no pipeline, no TP overlap: the FSDP2 and pipeline fields are set aside, each by its rule
    names = [f for f, _, _ in ignored(tt, zero1)]
    assert set(names) == {"tp_overlap_kind", "pp_buffers", "fsdp_accumulate_unsharded", "pp_return_outputs",
                          "fsdp_head_in_root", "pipeline_runtime"}
    assert names == [r.field for r in RULES if r.field in names]  # in the rules' order
    assert (zero1.stack.fsdp_head_in_root, zero1.stack.pp_buffers, zero1.stack.pipeline_runtime) == (False, "in-flight", "dependency")
    # ZeRO-3 without pipelining: the root unit applies and the accumulation does not
    z3 = TrainingPlan(dp=8, global_batch=8, seq_len=1024, zero=3, stack=tt)
    assert z3.stack.fsdp_head_in_root is True and z3.stack.fsdp_accumulate_unsharded is False and z3.stack.reshard_after_forward
    # ZeRO-3 pipelined: torch's schedules keep weights gathered, so no reshard and the reduce-scatter is not overlapped
    piped = TrainingPlan(pp=4, vpp=2, schedule="interleaved", global_batch=8, seq_len=1024, zero=3, stack=tt)
    s = piped.stack
    assert (s.fsdp_accumulate_unsharded, s.reshard_after_forward, s.overlap_grad_reduce) == (True, False, False)
    assert (s.fsdp_head_in_root, s.pp_buffers, s.pp_return_outputs, s.pipeline_runtime) == (False, "per-micro-batch", True, "lockstep")
    # a rule only sets a field to its neutral value: applying twice changes nothing, and a plan equals its own copy
    for plan in (zero1, z3, piped):
        assert applied(plan.stack, plan) == plan.stack
        assert TrainingPlan(**plan.model_dump()) == plan


def test_a_stack_own_contradiction_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match="fp8_linears torchao needs the compiled or eager kernels"):
        Stack(fp8_linears="torchao")
    with pytest.raises(InputError, match="unknown stack 'nosuch'"):
        load_stack("nosuch")
    assert parse_set(["kernels=eager", "compile-loss=off", "tp_comm_overlap=1"]) == {
        "kernels": "eager", "compile_loss": False, "tp_comm_overlap": True}
    for bad, rule in ((["kernels"], "FIELD=VALUE"), (["zero=3"], "unknown stack field 'zero'"), (["compile_loss=maybe"], "true or false")):
        with pytest.raises(InputError, match=rule):
            parse_set(bad)


def test_overrides_are_against_the_profile_as_it_applies_to_the_plan():
    setup = resolve(PlanArgs(stack="torchtitan", set_fields=["kernels=eager"], zero="1"))
    assert setup.stack.name == "torchtitan" and setup.stack.kernels == "eager"
    assert stack_overrides(setup.plan.stack, setup.plan) == {"kernels": "eager"}  # not the fields ZeRO-1 sets aside
    assert stack_overrides(setup.stack) == {"kernels": "eager"}
    # --stack replaces a preset's stack and its settings; --set and the kept flag go on top of either
    run = "torchtitan_405b_512gpu_3d_1f1b"
    assert resolve(PlanArgs(preset=run)).plan.stack.name == "torchtitan-2024"
    assert resolve(PlanArgs(preset=run, stack="megatron-core")).plan.stack == applied(Stack(), resolve(PlanArgs(preset=run)).plan)
    assert resolve(PlanArgs(preset=run, tp_comm_overlap=False)).plan.stack.tp_comm_overlap is False


def test_the_stack_decides_the_answer_and_every_output_names_it():
    """Done-when of the stack work: Llama 3 70B on 512 H100 at TP 8 under torchtitan and
    Megatron-Core give different steps, each named in plan.stack and in the text header."""
    args = ("--model", "llama3-70b", "--gpus", "512", "--tp", "8")
    tt, mc = run_json(*args, "--stack", "torchtitan"), run_json(*args, "--stack", "megatron-core")
    assert (tt["plan"]["stack"]["name"], mc["plan"]["stack"]["name"]) == ("torchtitan", "megatron-core")
    assert tt["plan"]["stack"]["kernels"] == "compiled" and mc["plan"]["stack"]["kernels"] == "fused"
    assert tt["time"]["step_s"] > mc["time"]["step_s"]  # torch.compile'd blocks, no fused loss, FlashAttention-2
    assert run_json(*args) == mc  # the default stack is megatron-core
    code, out, err = run_cli("estimate", *args, "--stack", "torchtitan")
    assert code == 0 and "stack: torchtitan (torchtitan" in out.splitlines()[2]
    code, out, err = run_cli("estimate", *args, "--stack", "nosuch")
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1
    assert err.startswith("error: stack: unknown stack 'nosuch' (profiles: megatron-core, nemo,")


def test_estimate_json_stack_reads_back_to_the_same_estimate():
    """plan.stack's name and overrides are the --stack and --set that give it again."""
    d = run_json("--model", "llama3-8b", "--gpus", "16", "--pp", "2", "--zero", "3", "--stack", "torchtitan",
                 "--set", "pp_return_outputs=true", "--set", "kernels=eager")
    st = d["plan"]["stack"]
    assert st["overrides"] == {"kernels": "eager", "pp_return_outputs": True}
    again = run_json("--model", "llama3-8b", "--gpus", "16", "--pp", "2", "--zero", "3", "--stack", st["name"],
                     *[w for k, v in st["overrides"].items() for w in ("--set", f"{k}={json.dumps(v).strip(chr(34))}")])
    assert again == d
    assert all(k in st for k in BEHAVIOUR_FIELDS)


def test_stacks_command_lists_profiles_and_sources():
    code, out, _ = run_cli("stacks", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["name"] for r in rows] == stack_names()
    code, out, _ = run_cli("stacks", "torchtitan-2024", "--json")
    one = json.loads(out)
    assert one["fields"]["pipeline_runtime"] == "lockstep" and "1963fc8" in one["sources"]["pipeline_runtime"]["source"]
    assert [r["field"] for r in one["rules"]] == [r.field for r in RULES]
    code, _, err = run_cli("stacks", "nosuch")
    assert code == 2 and "unknown stack 'nosuch'" in err


def test_search_proposes_only_what_the_stack_runs():
    base = ("search", "--model", "llama3-8b", "--gpus", "32", "--seq-len", "4096", "--global-batch", "64", "--top", "40", "--json")
    code, out, err = run_cli(*base)
    got = json.loads(out)
    assert code == 0 and got["stack"]["name"] == "megatron-core"
    assert {r["plan"]["schedule"] for r in got["top"] if r["plan"]["pp"] > 1} <= {"1f1b", "interleaved"}
    assert "op" not in {r["plan"]["recompute"] for r in got["top"]}  # torchtitan's op-level SAC is not Megatron's
    code, out, _ = run_cli(*base, "--stack", "composer")
    composer = json.loads(out)["top"]
    assert code == 0 and all(r["plan"]["pp"] == 1 for r in composer)  # Composer has no pipeline
    assert {r["plan"]["recompute"] for r in composer} <= {"none", "full"}
    code, out, _ = run_cli(*base, "--stack", "composer", "--recompute", "selective")  # asked for: a what-if
    assert code == 0 and {r["plan"]["recompute"] for r in json.loads(out)["top"]} == {"selective"}
    code, out, err = run_cli(*base[:-1], "--schedules", "zbv", "--max-pp", "4")  # a what-if outside the stack: asked, searched
    assert code == 0 and "pipeline schedules it runs: 1f1b, interleaved" in out and "zbv" in out
    code, out, _ = run_cli(*base, "--stacks", "megatron-core,torchtitan")
    both = json.loads(out)["stacks"]
    assert [s["stack"]["name"] for s in both] == ["megatron-core", "torchtitan"]
    assert both[1]["top"][0]["plan"]["stack"]["name"] == "torchtitan"


ROUND_TRIPS = [
    ("--model", "llama3-8b", "--gpus", "16", "--pp", "2", "--zero", "3", "--stack", "torchtitan", "--set", "kernels=eager",
     "--gpus-per-node", "4", "--nic-gbps", "25", "--dp-shard", "4"),
    ("--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--vpp", "2", "--stack", "nemo", "--precision", "fp8",
     "--recompute", "selective", "--rank-order", "tp,cp,pp,dp", "--pod-size", "32", "--oversubscription", "2"),
    ("--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--ep", "8", "--zero", "3", "--stack", "fsdp2-eager",
     "--set", "fsdp_head_in_root=false", "--grad-dtype", "bf16", "--no-master-weights"),
    ("--preset", "llama3-405b-8k",),
    ("--preset", "trainy_h200_llama3_8b@32gpu", "--tokens", "2T", "--price", "3.1", "--pue", "1.2"),
]


@pytest.mark.parametrize("args", ROUND_TRIPS, ids=lambda a: " ".join(a)[:40])
def test_estimate_json_is_a_plan_file_that_gives_the_same_estimate(args, tmp_path):
    """Every plan and stack field, and the cluster, round-trip: estimate --json, read back by
    --plan, estimates the same to the last digit; `meshplan import` prints flags that do too."""
    code, out, err = run_cli("estimate", *args, "--json")
    assert code == 0, err
    path = tmp_path / "estimate.json"
    path.write_text(out)
    code, again, err = run_cli("estimate", "--plan", str(path), "--json")
    assert code == 0 and json.loads(again) == json.loads(out), err
    code, printed, err = run_cli("import", str(path))
    words = [w for line in printed.splitlines()[1:] if not line.startswith("#") for w in line.rstrip(" \\").split()]
    assert words[:2] == ["meshplan", "estimate"]
    code, flags, err = run_cli(*words[1:], "--json")
    assert code == 0 and json.loads(flags) == json.loads(out), err


def test_pipeline_takes_the_stacks_runtime():
    code, out, _ = run_cli("pipeline", "--pp", "2", "-m", "2", "--vpp", "2", "--stack", "torchtitan-2024", "--json")
    lock = json.loads(out)
    code, out, _ = run_cli("pipeline", "--pp", "2", "-m", "2", "--vpp", "2", "--stack", "megatron-core", "--json")
    dep = json.loads(out)
    assert (lock["pipeline_runtime"], dep["pipeline_runtime"]) == ("lockstep", "dependency")
    assert lock["makespan"] > dep["makespan"]
    code, out, _ = run_cli("pipeline", "--pp", "2", "-m", "2", "--vpp", "2", "--stack", "torchtitan-2024", "--pipeline-runtime", "dependency", "--json")
    assert json.loads(out)["makespan"] == dep["makespan"]


def test_readme_library_example_runs_and_prints_what_it_says(capsys):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"## Library\n\n```python\n(.*?)```", readme, re.S).group(1)
    assert len(code.strip().splitlines()) <= 10
    exec(compile(code, "README.md", "exec"), {})
    first, second = capsys.readouterr().out.splitlines()
    step, gib, mfu = (float(x) for x in first.split())
    assert (round(step, 2), round(gib, 1), round(100 * mfu, 1)) == (9.91, 74.5, 36.2)  # the comment's figures
    tp, pp, schedule, best = second.split()
    assert float(best) < step and schedule in ("gpipe", "1f1b", "interleaved", "interleaved-zb", "zbh1", "zbv")
