"""Megatron-LM's 2021–22 pipeline loops with every exchange blocking (``pipeline_runtime =
blocking``, :mod:`meshplan.pipeline.blocking`): a case worked by hand, never faster than the
dependency-driven run of the same actions, free where the exchanges wait for nothing."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.pipeline.blocking import runs_blocking
from meshplan.pipeline.schedules import compile_schedule
from meshplan.pipeline.simulate import simulate


def test_two_stages_two_micro_batches_by_hand():
    """1F1B, p = 2, m = 2, F = 1, B = 2, τ = 0.1. Rank 1 runs F0 B0 F1 B1; after B0 it exchanges
    with rank 0 (B0's gradient out, F1's activation in: send_backward_recv_forward) at
    max(4.1, 2.1) + 0.1 = 4.2, so F1 starts at 4.2, not at 4.1 as its input allows; B1 ends at 7.2,
    its gradient reaches rank 0 at 7.3, and rank 0's B1 ends at 9.3 (dependency-driven: 9.2)."""
    sched = compile_schedule("1f1b", 2, 2)
    blocking = simulate(sched, 2, [1.0, 1.0], [2.0, 2.0], transfer=0.1, runtime="blocking", keep_timeline=True)
    dependency = simulate(sched, 2, [1.0, 1.0], [2.0, 2.0], transfer=0.1)
    assert blocking.makespan == pytest.approx(9.3) and dependency.makespan == pytest.approx(9.2)
    starts = {str(a): s for rank in blocking.timeline for a, s, _ in rank}
    assert starts["1F0"] == pytest.approx(1.1) and starts["1F1"] == pytest.approx(4.2) and starts["0B1"] == pytest.approx(7.3)
    assert blocking.busy == dependency.busy == (6.0, 6.0)


@pytest.mark.parametrize(("name", "p", "m", "v"), [("1f1b", 4, 8, 1), ("1f1b", 8, 3, 1), ("interleaved", 4, 8, 2),
                                                   ("interleaved", 4, 4, 3), ("interleaved", 2, 6, 4)])
def test_never_faster_than_the_dependency_run_and_same_order(name, p, m, v):
    rng = np.random.default_rng(7)
    sched = compile_schedule(name, p, m, v)
    for _ in range(4):
        f = rng.uniform(0.5, 2.0, p * v).tolist()
        b = [x * rng.uniform(1.5, 3.0) for x in f]
        tau = float(rng.uniform(0.0, 0.3))
        blocking = simulate(sched, p * v, f, b, transfer=tau, runtime="blocking", keep_timeline=True)
        dependency = simulate(sched, p * v, f, b, transfer=tau, keep_timeline=True)
        assert blocking.makespan >= dependency.makespan - 1e-9
        assert blocking.busy == pytest.approx(dependency.busy)
        assert blocking.peak_inflight == dependency.peak_inflight
        for rank_b, rank_d in zip(blocking.timeline, dependency.timeline):
            assert [a for a, _, _ in rank_b] == [a for a, _, _ in rank_d]  # each rank's order kept
            ends = [e for _, _, e in rank_b]
            assert all(s >= e0 - 1e-12 for (_, s, _), e0 in zip(rank_b[1:], ends))  # one action at a time


def test_free_exchanges_of_equal_stages_cost_nothing():
    for name, v in (("1f1b", 1), ("interleaved", 2)):
        sched = compile_schedule(name, 4, 8, v)
        args = (sched, 4 * v, [1.0] * (4 * v), [2.0] * (4 * v))
        assert simulate(*args, runtime="blocking").makespan == pytest.approx(simulate(*args).makespan)


def test_the_runtime_applies_to_megatron_s_loops_only():
    assert runs_blocking("1f1b", 4, "blocking") and runs_blocking("interleaved", 4, "blocking")
    assert not runs_blocking("zbh1", 4, "blocking") and not runs_blocking("1f1b", 1, "blocking")
    assert not runs_blocking("1f1b", 4, "dependency")
    # Megatron-LM interleaves only with the micro-batches a multiple of p ("not divisible" assertion)
    assert runs_blocking("interleaved", 4, "blocking", 8) and not runs_blocking("interleaved", 4, "blocking", 6)
    from meshplan.specs.plan import TrainingPlan

    odd = TrainingPlan.of(pp=4, vpp=2, schedule="interleaved", global_batch=6, seq_len=1024, pipeline_runtime="blocking")
    assert odd.stack.pipeline_runtime == "dependency"
    even = TrainingPlan.of(pp=4, vpp=2, schedule="interleaved", global_batch=8, seq_len=1024, pipeline_runtime="blocking")
    assert even.stack.pipeline_runtime == "blocking"
