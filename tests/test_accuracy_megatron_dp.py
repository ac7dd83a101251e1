"""The Megatron-LM README's 16B and 32B rows, the pair that bounds the 32B row's residual
(docs/accuracy.md, "Megatron-LM README"): the same parameters per GPU, DP 48 and micro-batches,
one DP group per node pair against one per node, and the overlap rule of Megatron-Core's
distributed optimizer that meshplan charges for them."""

from __future__ import annotations

import pytest

from meshplan.accuracy import map_runs
from meshplan.cost.comm import dp_sync_times, plan_placements
from meshplan.cost.compose import after_pipeline
from meshplan.cost.variability import straggler_factor
from meshplan.estimate import estimate


@pytest.fixture(scope="module")
def pair():
    rows = {r.id: r for r in map_runs() if r.group == "megatron_readme" and r.supported}
    out = {}
    for name in ("16B", "32B"):
        run = rows[f"megatron_readme_h100_{name}"]
        out[name] = (run, estimate(run.model, run.cluster, run.plan))
    return out


def test_the_pair_holds_the_same_gradients_per_gpu(pair):
    (r16, e16), (r32, e32) = pair["16B"], pair["32B"]
    assert (r16.plan.tp, r32.plan.tp) == (4, 8)
    assert r16.plan.dp == r32.plan.dp == 48
    assert r16.plan.grad_accum == r32.plan.grad_accum == 4
    # P per GPU: 16B (h 6144, 32 layers) over TP 4, 32B (h 7168, 48 layers) over TP 8
    assert e16.stages[0].params == 3_851_907_072
    assert e32.stages[0].params == 3_848_556_544
    # fp32 gradients: Megatron forces accumulate_allreduce_grads_in_fp32 under --bf16
    assert r16.plan.precision.grad_bytes == r32.plan.precision.grad_bytes == 4
    # the same compute, less what the hidden TP collectives' SMs add (meshplan.cost.contention),
    # each at its own cluster's slowest GPU's pace (192 and 384 GPUs: meshplan.cost.variability)
    kernels = lambda e: (e.time.compute_s - e.time.contention["tp"]) / straggler_factor(e.plan.num_gpus)  # noqa: E731
    assert kernels(e32) == pytest.approx(kernels(e16), rel=0.005)


def test_tp8_puts_one_dp_member_per_node_tp4_two(pair):
    (r16, _), (r32, _) = pair["16B"], pair["32B"]
    s16, s32 = plan_placements(r16.cluster, r16.plan).shard, plan_placements(r32.cluster, r32.plan).shard
    assert (s16.size, s16.per_node, s16.nodes) == (48, 2, 24)
    assert (s32.size, s32.per_node, s32.nodes) == (48, 1, 48)


def test_reduce_scatter_of_one_member_per_node_is_bounded_by_the_nic(pair):
    """C ≥ (n − 1)/n · P·γ / B_NIC: 47/48 · 15.39 GB / 50 GB/s = 0.301 s; the 16B's hierarchical
    collective sends half the bytes over the fabric per NIC, so its C is below the 32B's."""
    out = {}
    for name, (run, est) in pair.items():
        pl = plan_placements(run.cluster, run.plan)
        p = est.stages[0].params
        out[name] = dp_sync_times(p, 1, False, 48, run.plan.precision, pl, run.cluster, est.calibration)
    p32 = pair["32B"][1].stages[0].params
    line_rate = 47 / 48 * p32 * 4 / 50e9
    assert line_rate == pytest.approx(0.3014, abs=1e-4)
    c32, a32 = out["32B"]
    c16, a16 = out["16B"]
    assert c32 >= line_rate and a32 >= line_rate / 2
    assert c16 < 0.6 * c32 and a16 < 0.6 * a32


def test_exposed_dp_time_follows_the_last_microbatch_and_first_forward_windows(pair):
    """Megatron-Core starts the bucketed reduce-scatter in the last micro-batch's backward and the
    chained all-gathers before the next step's first forward: exposed = max(C − B, C/L) and
    max(A − F, A/L); on the 32B row C > B and A > F, so both are C − B and A − F."""
    run, est = pair["32B"]
    pl = plan_placements(run.cluster, run.plan)
    c, a = dp_sync_times(est.stages[0].params, 1, False, 48, run.plan.precision, pl, run.cluster, est.calibration)
    # less what the hidden parts' SMs add to the compute they overlap (meshplan.cost.contention)
    exposed_rs = est.time.dp_comm_s - est.time.contention["dp_grad"]
    exposed_ag = est.time.param_gather_s - est.time.contention["param_gather"]
    window_b, window_f = c - exposed_rs, a - exposed_ag
    # the windows are one micro-batch's backward and forward: together one micro-batch's work
    assert window_b + window_f == pytest.approx(est.sim.busy[0] / run.plan.grad_accum, rel=1e-9)
    assert window_b == pytest.approx(2 * window_f, rel=0.1)  # backward ≈ twice the forward
    again = after_pipeline(grad_comm=c, param_gather=a, last_bwd=window_b, first_fwd=window_f, n_layers=48,
                           overlap_grad_reduce=True, overlap_param_gather=True)
    assert again == pytest.approx((exposed_rs, exposed_ag), rel=1e-12)
    # the line-rate floor of the step: compute (with its contention, at the slowest of 384 GPUs'
    # pace) + (C_min − B) + (A_min − F) ≈ 0.998 s (Transformer Engine's cuDNN attention), 10 % over
    # the published step
    line_c = 47 / 48 * est.stages[0].params * 4 / 50e9
    floor = est.time.compute_s + (line_c - window_b) + (line_c / 2 - window_f)
    assert floor == pytest.approx(0.998, abs=0.002)
    assert floor > run.published_step_s * 1.10
