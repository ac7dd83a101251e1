"""torch's lockstep multi-stage pipeline runtime (meshplan.pipeline.lockstep): its grid against
torch's ``pipeline_order``, the max-plus recursion on a case worked by hand, how it compares with
the dependency-driven simulator, and the plan setting through estimate, the accuracy rows, the
engines' configs, the search, the CLI and the web API."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from meshplan.accuracy import map_runs
from meshplan.catalog import load_gpu, load_model
from meshplan.cli.app import main
from meshplan.estimate import estimate
from meshplan.interop import canonical, export, parse_text, to_plan
from meshplan.pipeline.lockstep import (
    LOCKSTEP_SCHEDULES, inputs_precede, runs_lockstep, simulate_lockstep, torch_grid, torch_rows, torch_slots,
)
from meshplan.pipeline.schedules import compile_schedule, rounds_of
from meshplan.pipeline.simulate import simulate
from meshplan.pipeline.slots import rank_program
from meshplan.search.engine import Engine
from meshplan.search.run import plan_of, search
from meshplan.search.space import SearchLimits, enumerate_plans
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import Stack

H100 = load_gpu("h100-sxm-80gb")
VS = {"interleaved": (2, 3), "interleaved-zb": (2, 3), "zbh1": (1,), "zbv": (2,)}


def _cases(max_p: int, m_of):
    for name in LOCKSTEP_SCHEDULES:
        for p in range(2, max_p + 1):
            for m in m_of(p):
                for v in VS[name]:
                    if v > 1 and name != "zbv":
                        try:
                            rounds_of(p, m)
                        except ValueError:
                            continue
                    yield name, p, m, v


# ---- the grid is torch's ------------------------------------------------------------------------

TORCH_CASES = [
    ("interleaved", 2, 4, 2), ("interleaved", 4, 8, 2), ("interleaved", 4, 8, 3), ("interleaved", 4, 12, 2),
    ("interleaved", 4, 6, 2), ("interleaved", 8, 16, 2), ("interleaved", 4, 4, 2), ("interleaved", 4, 2, 2),
    ("interleaved", 4, 3, 2), ("interleaved", 7, 11, 3),
    ("interleaved-zb", 2, 4, 2), ("interleaved-zb", 4, 8, 2), ("interleaved-zb", 4, 8, 3), ("interleaved-zb", 4, 12, 2),
    ("interleaved-zb", 4, 6, 2), ("interleaved-zb", 8, 16, 2), ("interleaved-zb", 4, 2, 2),
    ("zbh1", 2, 2, 1), ("zbh1", 4, 4, 1), ("zbh1", 4, 8, 1), ("zbh1", 4, 6, 1), ("zbh1", 8, 16, 1), ("zbh1", 4, 2, 1),
    ("zbh1", 8, 3, 1),
    ("zbv", 2, 4, 2), ("zbv", 4, 8, 2), ("zbv", 4, 4, 2), ("zbv", 4, 6, 2), ("zbv", 8, 16, 2), ("zbv", 4, 2, 2),
]


def _torch_order(name: str, p: int, m: int, v: int) -> list[list[str | None]]:
    """torch's ``pipeline_order`` (idle slots as None), built on stand-in stages of rank 0."""
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = {"interleaved": sched.ScheduleInterleaved1F1B, "interleaved-zb": sched.ScheduleInterleavedZeroBubble,
           "zbh1": sched.ScheduleInterleavedZeroBubble, "zbv": sched.ScheduleZBVZeroBubble}[name]
    n = p * v
    local = [0, n - 1] if name == "zbv" else [k * p for k in range(v)]
    stages = [SimpleNamespace(group_size=p, group_rank=0, num_stages=n, stage_index=s, is_first=s == 0,
                              is_last=s == n - 1, submod=None) for s in local]
    order = cls(stages, m).pipeline_order
    return [[None if a is None else str(a) for a in order[r]] for r in range(p)]


def _strip(row):
    row = list(row)
    while row and row[-1] is None:
        row.pop()
    return row


@pytest.mark.parametrize("name,p,m,v", TORCH_CASES, ids=[f"{n}-p{p}-m{m}-v{v}" for n, p, m, v in TORCH_CASES])
def test_grid_is_torchs_pipeline_order_idle_slots_included(name, p, m, v):
    """meshplan's per-rank action order (compile_schedule, equal to torch's compute order) placed
    on torch's slots gives torch's pipeline_order cell for cell (trailing idle slots aside: they
    run nothing and link nothing)."""
    theirs = _torch_order(name, p, m, v)
    ours = [[None if a is None else str(a) for a in row] for row in torch_grid(name, p, m, v)]
    assert [_strip(r) for r in ours] == [_strip(r) for r in theirs]


def test_grid_worked_out():
    rows = [[str(a) if a else "-" for a in row] for row in torch_grid("interleaved", 2, 2, 2)]
    assert rows == [
        ["0F0", "0F1", "2F0", "2F1", "-", "-", "-", "2B0", "-", "2B1", "-", "0B0", "-", "0B1"],
        ["-", "1F0", "1F1", "-", "3F0", "3B0", "3F1", "3B1", "-", "1B0", "-", "1B1"],
    ]
    assert [r.tolist() for r in torch_slots("interleaved", 2, 2, 2)] == [[0, 1, 2, 3, 7, 9, 11, 13], [1, 2, 4, 5, 6, 7, 9, 11]]


# ---- the recursion, by hand -----------------------------------------------------------------------

def test_hand_computed_interleaved_p2_m2_v2():
    """F = 1, B = 2 on every stage. τ = 0, slot by slot (rank 0 | rank 1; e = when each leaves):
    0: 0F0 ends 1 | idle, linked by 0F0's send: e = 1, 1.   1: 0F1 2 | 1F0 2 → 2, 2.
    2: 2F0 3 | 1F1 3 → 3, 3.   3: 2F1 4 | idle, linked → 4, 4.   4: idle | 3F0 5 (last stage,
    sends nothing) → 4, 5.   5: idle | 3B0 7, linked → 7, 7.   6: idle | 3F1 8 → 7, 8.
    7: 2B0 9 | 3B1 10, linked both ways → 10, 10.   9: 2B1 12 | 1B0 12 → 12, 12.
    11: 0B0 14 | 1B1 14, linked → 14, 14.   13: 0B1 16. Finish (16, 14); dependency-driven (15, 13).
    With τ = 0.5 every link ends half a second after its later end: (20, 18)."""
    s = compile_schedule("interleaved", 2, 2, 2)
    f, b = [1.0] * 4, [2.0] * 4
    lock = simulate_lockstep(s, f, b, 0.0, keep_timeline=True)
    assert lock.finish == (16.0, 14.0)
    assert simulate(s, 4, f, b, 0.0).finish == (15.0, 13.0)
    assert [(str(a), st, en) for a, st, en in lock.timeline[1]] == [
        ("1F0", 1.0, 2.0), ("1F1", 2.0, 3.0), ("3F0", 4.0, 5.0), ("3B0", 5.0, 7.0), ("3F1", 7.0, 8.0),
        ("3B1", 8.0, 10.0), ("1B0", 10.0, 12.0), ("1B1", 12.0, 14.0)]
    slow = simulate_lockstep(s, f, b, 0.5, keep_timeline=True)
    assert slow.finish == (20.0, 18.0)
    assert [(str(a), st) for a, st, _ in slow.timeline[0]] == [
        ("0F0", 0.0), ("0F1", 1.5), ("2F0", 3.0), ("2F1", 4.5), ("2B0", 9.5), ("2B1", 13.0), ("0B0", 15.5), ("0B1", 18.0)]
    assert simulate(s, 4, f, b, 0.5).finish == (18.0, 15.5)
    assert lock.busy == (12.0, 12.0) and lock.peak_inflight == simulate(s, 4, f, b).peak_inflight


def test_hand_computed_zbh1_p2_m2():
    """ZB-H1, F = I = W = 1: torch's grid (0F0 - 0F1 0I0 0W0 0I1 0W1 | - 1F0 1I0 1F1 1I1 1W0 1W1)
    has no slot where a rank waits for a message it does not need: 7 = dependency's 7 with τ = 0.
    τ = 0.5: 0F0 ends 1, its link 1.5; 1F0 1.5–2.5, link 3; 1I0 3–4 → 0I0's input at 4.5 ... 8.5."""
    s = compile_schedule("zbh1", 2, 2, 1)
    assert simulate_lockstep(s, [1.0, 1.0], [2.0, 2.0], 0.0).finish == (7.0, 7.0)
    assert simulate(s, 2, [1.0, 1.0], [2.0, 2.0], 0.0).finish == (7.0, 7.0)
    assert simulate_lockstep(s, [1.0, 1.0], [2.0, 2.0], 0.5).finish == (8.5, 8.5)
    assert simulate(s, 2, [1.0, 1.0], [2.0, 2.0], 0.5).finish == (8.0, 7.5)


# ---- against the dependency-driven simulator ----------------------------------------------------

@pytest.mark.parametrize("name", LOCKSTEP_SCHEDULES)
def test_lockstep_never_starts_an_action_earlier(name):
    """Every constraint of the dependency-driven run holds in lockstep (module docstring), so with
    any stage times and transfer every action starts no earlier, and the makespan is no shorter —
    also for torch's grids with fewer micro-batches than ranks, which meshplan replays with every
    input awaited."""
    rng = np.random.default_rng(7)
    n = 0
    for nm, p, m, v in _cases(5, lambda p: (1, 2, p - 1, p, p + 1, 2 * p)):
        if nm != name:
            continue
        s = compile_schedule(nm, p, m, v)
        S = p * v
        for _ in range(3):
            f = rng.uniform(0.5, 2.0, S)
            b = f * rng.uniform(1.5, 3.0, S)
            w = b * rng.uniform(0.2, 0.6, S)
            tau = float(rng.uniform(0.0, 0.4))
            lock = simulate_lockstep(s, f, b, tau, keep_timeline=True, wgt=w)
            dep = simulate(s, S, f, b, tau, keep_timeline=True, wgt=w)
            assert lock.makespan >= dep.makespan - 1e-9
            for r in range(p):
                for (a1, s1, _), (a2, s2, _) in zip(lock.timeline[r], dep.timeline[r]):
                    assert a1 == a2 and s1 >= s2 - 1e-9, (nm, p, m, v, r, a1)
            assert lock.busy == dep.busy
            n += 1
    assert n >= 30


def test_equal_stages_and_free_transfers_are_not_enough_for_equality():
    """Disproved for interleaved 1F1B: with F = B = 1 on every stage and no transfer time, rank 1
    still receives 2F1 in slot 3, which it needs only in slot 6, before it may start 3F0. Holds for
    the zero-bubble grids when F = I = W (every slot one unit), not for ZBV with fewer than 2p − 1
    micro-batches."""
    def both(name, p, m, v, f, b):
        s = compile_schedule(name, p, m, v)
        S = p * v
        return simulate_lockstep(s, [f] * S, [b] * S).makespan, simulate(s, S, [f] * S, [b] * S).makespan

    assert both("interleaved", 2, 2, 2, 1.0, 1.0) == (11.0, 10.0)
    assert both("interleaved", 2, 4, 2, 1.0, 1.0) == (19.0, 18.0)
    assert both("interleaved", 4, 8, 2, 1.0, 2.0)[0] > both("interleaved", 4, 8, 2, 1.0, 2.0)[1]
    for name, p, m, v in (("interleaved-zb", 4, 8, 2), ("interleaved-zb", 2, 4, 3), ("zbh1", 4, 8, 1), ("zbh1", 3, 6, 1)):
        lock, dep = both(name, p, m, v, 1.0, 2.0)  # F = I = W = 1
        assert lock == dep
    assert both("zbv", 2, 2, 2, 1.0, 2.0) == (15.0, 14.0)
    assert both("zbh1", 2, 4, 1, 1.0, 1.0) == (10.0, 9.0)  # I = W = 1/2: equal stages, unequal slots


def test_torch_grids_with_fewer_microbatches_are_replayed_with_inputs_awaited():
    assert inputs_precede("interleaved", 4, 8, 2) and inputs_precede("zbv", 4, 2, 2) and inputs_precede("zbh1", 4, 4, 1)
    assert not inputs_precede("interleaved", 4, 2, 2) and not inputs_precede("zbh1", 4, 2, 1)
    assert not inputs_precede("interleaved", 7, 11, 3)  # m ≥ p, not a multiple of p, v = 3
    # torch's zbh1 grid for p = 4, m = 2 puts 0I0 in 1I0's slot (slot 5); replayed one slot later
    torch0 = [str(a) if a else "-" for a in torch_grid("zbh1", 4, 2, 1)[0]]
    assert torch0 == ["0F0", "0F1", "-", "-", "-", "0I0", "0W0", "0I1", "0W1"]
    assert torch_slots("zbh1", 4, 2, 1)[0].tolist() != [i for i, c in enumerate(torch_rows("zbh1", 4, 2, 1)[0]) if c]
    for name, p, m, v in _cases(6, lambda p: range(1, 2 * p + 1)):
        sched = compile_schedule(name, p, m, v)
        slots = torch_slots(name, p, m, v)
        S, M = p * v, m
        where = {}
        for r in range(p):
            own, _ = rank_program(sched, r, S, M)
            where.update(zip(own.tolist(), slots[r].tolist()))
        for r in range(p):
            _, dep = rank_program(sched, r, S, M)
            for d, t in zip(dep.tolist(), slots[r].tolist()):
                assert d == 3 * S * M or where[d] < t, (name, p, m, v, r)


def test_single_stage_schedules_and_one_rank_run_dependency_driven():
    assert not runs_lockstep("1f1b", 8, "lockstep") and not runs_lockstep("gpipe", 8, "lockstep")
    assert not runs_lockstep("interleaved", 1, "lockstep") and not runs_lockstep("interleaved", 8, "dependency")
    assert runs_lockstep("zbh1", 2, "lockstep") and runs_lockstep("zbv", 2, "lockstep")
    for name in ("1f1b", "gpipe"):
        s = compile_schedule(name, 4, 8, 1)
        f, b = [1.0, 1.5, 1.2, 0.9], [2.0, 2.5, 2.1, 1.7]
        assert simulate(s, 4, f, b, 0.1, runtime="lockstep") == simulate(s, 4, f, b, 0.1)
    with pytest.raises(ValueError):
        simulate(compile_schedule("1f1b", 2, 2, 1), 2, [1, 1], [1, 1], runtime="lockstep-ish")


# ---- the plan setting ------------------------------------------------------------------------------

def test_plan_setting_default_and_validation():
    p = TrainingPlan(global_batch=32, seq_len=4096)
    assert p.stack.pipeline_runtime == "dependency"
    with pytest.raises(ValueError, match="pipeline_runtime"):
        TrainingPlan.of(global_batch=32, seq_len=4096, pipeline_runtime="slots")


def test_estimate_lockstep_adds_time_only_to_multi_stage_schedules():
    model = load_model("llama3-8b")
    cluster = ClusterSpec.of(H100, 64)
    il = TrainingPlan(tp=2, pp=4, dp=8, vpp=2, schedule="interleaved", global_batch=128, seq_len=4096)
    dep, lock = estimate(model, cluster, il), estimate(model, cluster, il.replace(**{"pipeline_runtime": "lockstep"}))
    assert lock.time.step_s > dep.time.step_s
    assert lock.time.pipeline_bubble_s > dep.time.pipeline_bubble_s
    assert lock.time.compute_s == dep.time.compute_s and lock.peak_bytes == dep.peak_bytes
    assert lock.to_dict()["plan"]["stack"]["pipeline_runtime"] == "lockstep"
    one = il.replace(**{"schedule": "1f1b", "vpp": 1})
    assert estimate(model, cluster, one.replace(**{"pipeline_runtime": "lockstep"})).time == estimate(model, cluster, one).time


# ---- the torchtitan rows ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs():
    return {r.id: r for r in map_runs() if r.supported}


def test_torchtitan_405b_interleaved_row_runs_in_lockstep(runs):
    """torch 1963fc8's ScheduleInterleaved1F1B is a PipelineScheduleMulti: lockstep costs the row
    about 0.56 s (28.15 → 28.70 s against a published 32.0 s); the 1F1B row (Schedule1F1B, single
    stage) is dependency-driven."""
    il, one = runs["torchtitan_405b_512gpu_3d_interleaved"], runs["torchtitan_405b_512gpu_3d_1f1b"]
    assert il.plan.stack.pipeline_runtime == "lockstep" and one.plan.stack.pipeline_runtime == "dependency"
    assert any("lockstep" in a and "PipelineScheduleMulti" in a for a in il.assumptions)
    assert any("Schedule1F1B" in a for a in one.assumptions)
    lock = estimate(il.model, il.cluster, il.plan).time
    dep = estimate(il.model, il.cluster, il.plan.replace(**{"pipeline_runtime": "dependency"})).time
    assert 0.45 < lock.step_s - dep.step_s < 0.60
    assert lock.step_s == pytest.approx(28.70, abs=0.15)
    assert lock.step_s - dep.step_s == pytest.approx(lock.makespan_s - dep.makespan_s, abs=1e-9)
    assert estimate(one.model, one.cluster, one.plan.replace(**{"pipeline_runtime": "lockstep"})).time.step_s \
        == estimate(one.model, one.cluster, one.plan).time.step_s


# ---- the engines' configs ---------------------------------------------------------------------------

def _plan(**kw):
    kw.setdefault("global_batch", kw.get("micro_batch", 1) * kw.get("dp", 1) * 4)
    kw.setdefault("seq_len", 4096)
    return TrainingPlan.of(**kw)


LOCKSTEP_IL = _plan(tp=4, pp=2, dp=2, vpp=2, schedule="interleaved", zero=3, fsdp_accumulate_unsharded=True,
                    overlap_grad_reduce=False, micro_batch=2, pipeline_runtime="lockstep")


@pytest.mark.parametrize("engine", ["megatron", "torchtitan", "torchtitan-toml", "deepspeed", "nanotron"])
def test_export_warns_that_the_engine_runs_dependency_driven(engine):
    model = load_model("llama3-70b")
    result = export(engine, model, LOCKSTEP_IL)
    assert [w for w in result.warnings if w.startswith("pipeline_runtime: ")], result.warnings
    fields = {**parse_text(result.text).plan, "seq_len": 4096}
    if engine == "deepspeed":  # with AutoTP DeepSpeed derives the total batch: micro x accumulation x dp
        assert "global_batch" not in fields
        fields.update(dp=LOCKSTEP_IL.dp, global_batch=LOCKSTEP_IL.global_batch)
    back = to_plan(fields)
    assert back.stack.pipeline_runtime == "dependency"
    dep = export(engine, model, LOCKSTEP_IL.replace(**{"pipeline_runtime": "dependency"}))
    assert not [w for w in dep.warnings if w.startswith("pipeline_runtime")]


def test_torchtitan_import_reads_dependency_and_says_how_to_get_lockstep():
    text = export("torchtitan", load_model("llama3-70b"), LOCKSTEP_IL.replace(**{"pipeline_runtime": "dependency"})).text
    parsed = parse_text(text)
    assert parsed.plan.get("pipeline_runtime", "dependency") == "dependency"
    assert any(n.startswith("pipeline_runtime: Interleaved1F1B") and "--set pipeline_runtime=lockstep" in n for n in parsed.notes)
    one = export("torchtitan", load_model("llama3-70b"), LOCKSTEP_IL.replace(**{"schedule": "1f1b", "vpp": 1})).text
    assert not any(n.startswith("pipeline_runtime") for n in parse_text(one).notes)


def test_canonical_drops_lockstep_where_it_changes_nothing():
    one = _plan(pp=4, dp=2, pipeline_runtime="lockstep")
    assert canonical(one).stack.pipeline_runtime == "dependency"
    assert canonical(_plan(dp=2, pipeline_runtime="lockstep")).stack.pipeline_runtime == "dependency"
    assert canonical(LOCKSTEP_IL).stack.pipeline_runtime == "lockstep"


# ---- the search ---------------------------------------------------------------------------------------

def test_search_settles_in_lockstep_and_its_bound_still_holds():
    """The base plan's runtime reaches every plan the search settles (exact estimates), and the
    screen's step bound, computed without lockstep, stays below the lockstep steps: best-first
    finds the exhaustive best."""
    model = load_model("llama3-8b")
    cluster = ClusterSpec.of(H100, 8)
    stack = Stack(pipeline_runtime="lockstep")  # as requested: the pp 1 base itself runs dependency-driven
    base = TrainingPlan(global_batch=32, seq_len=4096, stack=stack)
    lim = SearchLimits(max_micro_batch=2, recompute=("none",), zero=(1,), schedules=("1f1b", "interleaved", "zbh1", "zbv"), max_vpp=2)
    table = enumerate_plans(model, 8, 8, 4096, (32,), lim)
    screen = Engine(model, cluster, base, stack).evaluate(table)
    exact = []
    for i in range(len(table)):
        plan = plan_of(base, table, i, stack)
        est = estimate(model, cluster, plan)
        assert screen.step_lower_bound[i] <= est.time.step_s * (1 + 1e-12), plan
        if est.peak_bytes <= cluster.gpu.hbm_bytes:
            exact.append(est.time.step_s)
    assert any(runs_lockstep(table.row(i)["schedule"], table.row(i)["pp"], "lockstep") for i in range(len(table)))
    res = search(model, cluster, base, lim, top_k=5, stack=stack)
    for r in res.top:
        p = r.estimate.plan
        assert p.stack.pipeline_runtime == ("lockstep" if runs_lockstep(p.schedule, p.pp, "lockstep") else "dependency")
    assert [r.estimate.time.step_s for r in res.top] == sorted(exact)[:5]


# ---- CLI and web ------------------------------------------------------------------------------------------

ARGS = ["--model", "llama3-8b", "--gpus", "64", "--tp", "2", "--pp", "4", "--vpp", "2", "--seq-len", "4096", "--global-batch", "128"]


def _cli_json(capsys, *args):
    capsys.readouterr()
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_estimate_explain_and_bad_value(capsys):
    lock = _cli_json(capsys, "estimate", *ARGS, "--set", "pipeline_runtime=lockstep", "--json")
    dep = _cli_json(capsys, "estimate", *ARGS, "--json")
    assert (lock["plan"]["stack"]["pipeline_runtime"], dep["plan"]["stack"]["pipeline_runtime"]) == ("lockstep", "dependency")
    assert lock["time"]["step_s"] > dep["time"]["step_s"]
    capsys.readouterr()
    assert main(["explain", *ARGS, "--set", "pipeline_runtime=lockstep"]) == 0
    out = capsys.readouterr().out
    assert "lockstep over torch's grid" in out and "meshplan.pipeline.lockstep" in out
    assert main(["explain", *ARGS[:8], "--seq-len", "4096", "--set", "pipeline_runtime=lockstep", "--schedule", "1f1b", "--vpp", "1"]) == 0
    # torch runs 1F1B with a single-stage class: the stack's rule sets the runtime aside, and the header says so
    assert "lockstep" not in capsys.readouterr().out
    assert main(["estimate", *ARGS[:8], "--seq-len", "4096", "--set", "pipeline_runtime=lockstep", "--schedule", "1f1b", "--vpp", "1"]) == 0
    assert "not used by this plan: pipeline_runtime" in " ".join(capsys.readouterr().out.split())
    assert main(["estimate", *ARGS, "--set", "pipeline_runtime=slots"]) == 2
    err = capsys.readouterr().err.strip()
    assert "stack.pipeline_runtime" in err and "'dependency', 'lockstep', 'deepspeed' or 'blocking'" in err and "Traceback" not in err


def test_web_plan_view_offers_the_runtime(client):
    from meshplan.web.views import CHOICES

    assert ("pipeline_runtime", "pipeline runtime", ("dependency", "lockstep", "deepspeed", "blocking")) in CHOICES
    page = client.get("/plan").text
    assert 'data-field="pipeline_runtime"' in page and "<option>lockstep</option>" in page
    params = dict(zip(["model", "gpus", "tp", "pp", "vpp", "seq_len", "global_batch"], ARGS[1::2]))
    lock = client.get("/api/estimate", params={**params, "pipeline_runtime": "lockstep"}).json()
    dep = client.get("/api/estimate", params=params).json()
    assert lock["plan"]["stack"]["pipeline_runtime"] == "lockstep" and lock["time"]["step_s"] > dep["time"]["step_s"]
