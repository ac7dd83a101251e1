"""The torchtitan 405B pipeline rows against what torchtitan 9dec370 and torch 1963fc8 ran:
micro-batches, stage split, FSDP's gradient reduce-scatter after the last backward."""

import pytest

from meshplan.accuracy import map_runs
from meshplan.cost.calibration import calibration_for
from meshplan.cost.fsdp_copies import fsdp2_step_copy_times
from meshplan.estimate import estimate
from meshplan.pipeline.stages import default_layer_split


@pytest.fixture(scope="module")
def runs():
    return {r.id: r for r in map_runs() if r.supported}


def torchtitan_split(n_layers: int, total_stages: int) -> tuple[int, ...]:
    """torchtitan's ``generate_split_points`` (parallelisms/pipelining_utils.py, late 2024): the
    first stage ⌊L/S⌋ layers, the middle stages one more while the remainder lasts, the last
    stage what is left."""
    base, extra = divmod(n_layers, total_stages)
    splits, current = [], 0
    for i in range(total_stages - 1):
        if i == 0:
            current += base
        elif extra > 0:
            current += base + 1
            extra -= 1
        else:
            current += base
        splits.append(current)
    bounds = [0, *splits, n_layers]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize("n_layers,stages", [(126, 8), (126, 16), (32, 8), (80, 6), (81, 8), (10, 4), (7, 7)])
def test_meshplans_default_split_is_torchtitans(n_layers, stages):
    assert default_layer_split(n_layers, stages) == torchtitan_split(n_layers, stages)


def test_405b_rows_run_what_torchtitan_ran(runs):
    one, il = runs["torchtitan_405b_512gpu_3d_1f1b"].plan, runs["torchtitan_405b_512gpu_3d_interleaved"].plan
    # local batch 32; n_microbatches = pp x stages per rank (8, and 16 with 2 stages per rank)
    assert (one.schedule, one.vpp, one.num_microbatches, one.micro_batch) == ("1f1b", 1, 8, 4)
    assert (il.schedule, il.vpp, il.num_microbatches, il.micro_batch) == ("interleaved", 2, 16, 2)
    assert default_layer_split(126, 8) == (15, 16, 16, 16, 16, 16, 16, 15)
    assert default_layer_split(126, 16) == (7,) + (8,) * 14 + (7,)
    for p in (one, il):
        assert (p.zero, p.stack.reshard_after_forward, p.stack.fsdp_accumulate_unsharded, p.stack.overlap_grad_reduce) == (3, False, True, False)


def test_fsdp_without_pipeline_still_overlaps_its_reduce_scatter(runs):
    p = runs["torchtitan_8b_8gpu_fsdp_compile_fp8"].plan
    assert (p.pp, p.stack.reshard_after_forward, p.stack.fsdp_accumulate_unsharded, p.stack.overlap_grad_reduce) == (1, True, False, True)
    assert any("stage.py" in a for a in runs["torchtitan_405b_512gpu_3d_1f1b"].assumptions)


def test_pipeline_reduce_scatter_is_exposed_whole(runs):
    """Overlapped, only the last layer's bucket (1/n of the reduce-scatter) would show; issued
    after the last backward, all of it does: n = 15 layers on the critical first rank."""
    r = runs["torchtitan_405b_512gpu_3d_1f1b"]
    ran = estimate(r.model, r.cluster, r.plan).time
    # the stack's rule ignores overlap_grad_reduce under the unsharded accumulation (meshplan.specs.stack.RULES)
    assert r.plan.replace(overlap_grad_reduce=True).stack.overlap_grad_reduce is False
    # the counterfactual the rule forbids, priced by copying the plan past its validation
    forced = r.plan.model_copy(update={"stack": r.plan.stack.model_copy(update={"overlap_grad_reduce": True})})
    hidden = estimate(r.model, r.cluster, forced).time
    assert ran.critical_rank == hidden.critical_rank == 0
    # overlapped, the hidden 14/15 also slow the backward by their SMs' share (meshplan.cost.contention)
    assert ran.contention["dp_grad"] == 0.0 < hidden.contention["dp_grad"]
    # FSDP2's copy-in of the 16 units' accumulated fp32 gradients stands on the compute stream either way
    first = estimate(r.model, r.cluster, r.plan).stages[0]
    copy_in, _ = fsdp2_step_copy_times(first.params, 16, r.plan.precision, r.cluster.gpu, calibration_for(r.cluster.gpu))
    assert first.layers == 15 and 0.025 < copy_in < 0.027  # 6.24e9 parameters x 8 bytes at 80 % of 2.4 TB/s
    rs = ran.dp_comm_s - copy_in
    assert rs == pytest.approx(15 * (hidden.dp_comm_s - copy_in - hidden.contention["dp_grad"]), rel=1e-12)
    # fp32 gradients of 15 layers + embedding per TP rank over DP 8 across nodes: about 0.47 s
    assert 0.40 < rs < 0.55
