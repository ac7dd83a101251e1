"""DeepSpeed's pipeline engine (meshplan.pipeline.deepspeed_steps): TrainSchedule's steps, their
blocking exchanges, and where they make a step longer than the dependency-driven 1F1B."""

from __future__ import annotations

import importlib

import pytest

from meshplan.accuracy import runs_of
from meshplan.pipeline.deepspeed_steps import runs_deepspeed, simulate_deepspeed, step_action, train_steps
from meshplan.pipeline.schedules import compile_schedule
from meshplan.pipeline.simulate import simulate

estimate = importlib.import_module("meshplan.estimate").estimate


def test_train_schedule_steps_as_deepspeed_numbers_them():
    # p = 4: stage 0 forwards micro-batches 0..3 on steps 0, 2, 4, 6 and its first backward on
    # step 7; the last stage forwards 0 on step 3 and backs it on step 4
    assert [step_action(t, 0, 4) for t in (0, 2, 6, 7)] == [(0, True), (1, True), (3, True), (0, False)]
    assert [step_action(t, 3, 4) for t in (3, 4, 5, 6)] == [(0, True), (0, False), (1, True), (1, False)]
    steps = train_steps(4, 6)
    assert all(len(s) == 12 for s in steps)  # every stage: 6 forwards and 6 backwards
    assert steps[0][-1][0] == 2 * (6 + 4 - 1) - 1  # stage 0's last backward on the last step


@pytest.mark.parametrize("p,m", [(2, 2), (4, 6), (5, 3), (8, 32)])
def test_each_stage_runs_1f1b_in_its_order(p, m):
    sched = compile_schedule("1f1b", p, m, 1)
    for stage, acts in enumerate(sched.actions()):
        assert [(mb, fw) for _, mb, fw in train_steps(p, m)[stage]] == [(a.microbatch, a.kind == "F") for a in acts]


def test_two_stages_by_hand():
    # p = 2, m = 2, forward 1, backward 2, transfer 0.5. Stage 0 runs F0, F1, B0, B1 on steps 0, 2,
    # 3, 5; stage 1 F0, B0, F1, B1 on steps 1, 2, 3, 4. Step 1: F0's activation crosses at
    # max(1, 0) + 0.5, stage 1's F0 runs [1.5, 2.5]; step 2 exchanges nothing (stage 0's forward has
    # no previous stage, stage 1's backward no next): B0 [2.5, 4.5], F1 [1.5, 2.5]; step 3 moves B0's
    # gradient and F1's activation, two transfers after both ends arrive: max(2.5, 4.5) + 1 = 5.5,
    # then B0 on stage 0 [5.5, 7.5] and F1 on stage 1 [5.5, 6.5]; step 4: B1 [6.5, 8.5]; step 5
    # moves B1's gradient at max(8.5, 7.5) + 0.5 = 9 (stage 1 is done when its send is): stage 0's
    # B1 [9, 11]. Dependency-driven, the
    # same order ends at 10 (stage 1's F1 waits only for its own B0, stage 0's B0 only for the gradient).
    sched = compile_schedule("1f1b", 2, 2, 1)
    r = simulate_deepspeed(sched, [1.0, 1.0], [2.0, 2.0], 0.5, keep_timeline=True)
    dep = simulate(sched, 2, [1.0, 1.0], [2.0, 2.0], 0.5)
    starts = {(rank, a.kind, a.microbatch): s for rank, line in enumerate(r.timeline) for a, s, _ in line}
    assert starts == {(0, "F", 0): 0.0, (0, "F", 1): 1.5, (0, "B", 0): 5.5, (0, "B", 1): 9.0,
                      (1, "F", 0): 1.5, (1, "B", 0): 2.5, (1, "F", 1): 5.5, (1, "B", 1): 6.5}
    assert r.finish == (11.0, 9.0) and r.busy == (6.0, 6.0)
    assert dep.makespan == 10.0 and r.makespan == 11.0


@pytest.mark.parametrize("p,m,tau", [(4, 8, 0.0), (4, 8, 0.3), (12, 32, 0.1), (35, 70, 0.05)])
def test_never_shorter_than_dependency_driven(p, m, tau):
    sched = compile_schedule("1f1b", p, m, 1)
    f = [1.0 + 0.1 * (s % 3) for s in range(p)]
    b = [2.0 * x for x in f]
    ds, dep = simulate_deepspeed(sched, f, b, tau), simulate(sched, p, f, b, tau)
    assert ds.makespan >= dep.makespan - 1e-12
    assert ds.busy == pytest.approx(dep.busy)
    assert simulate(sched, p, f, b, tau, runtime="deepspeed").makespan == ds.makespan


def test_runs_only_1f1b_on_pipelines():
    assert runs_deepspeed("1f1b", 4, "deepspeed") and not runs_deepspeed("1f1b", 1, "deepspeed")
    assert not runs_deepspeed("interleaved", 4, "deepspeed") and not runs_deepspeed("1f1b", 4, "dependency")


def test_megatron_deepspeed_rows_run_deepspeeds_engine():
    rows = {r.id: r for r in runs_of("all") if r.supported and r.plan.stack.name == "megatron-deepspeed"}
    assert set(rows) >= {"bloom_176b_384gpu", "gpt_neox_20b_96gpu", "mtnlg_530b_2240gpu"}
    bloom = rows["bloom_176b_384gpu"]
    assert bloom.plan.stack.pipeline_runtime == "deepspeed"
    assert bloom.plan.stack.pp_scatter_gather  # TP 4 without sequence parallelism: messages split over TP
    ratios = []
    for split in (True, False):
        plan = bloom.plan.replace(pp_scatter_gather=split)
        ds = estimate(bloom.model, bloom.cluster, plan).time
        dep = estimate(bloom.model, bloom.cluster, plan.replace(pipeline_runtime="dependency")).time
        ratios.append(ds.makespan_s / dep.makespan_s)
    # the blocking exchanges make BLOOM's pipeline 1.7 % longer (90.2 → 91.7 s); 6 % with whole
    # messages, four times the transfer (93.9 → 99.6 s)
    assert 1.01 < ratios[0] < 1.03 and 1.04 < ratios[1] < 1.08
