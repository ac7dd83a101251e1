"""ZeRO-3 / FSDP units (embedding, layers, final norm + LM head) in the step time, and the memory
peak as the larger of two backward moments (meshplan.cost.compose, .comm)."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost import collectives as coll
from meshplan.cost.calibration import calibration_for
from meshplan.cost.comm import fsdp_unit_times, plan_placements
from meshplan.cost.compute import embedding_op_times
from meshplan.cost.compose import layer_times, rank_other_items, stage_times
from meshplan.cost.params import embedding_params_per_rank, head_params_per_rank, layer_params_per_rank
from meshplan.estimate import estimate
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import TrainingPlan


def _lt(units, kept=False, reshard=True, fsdp=True):
    # binary fractions: every sum below is exact
    return layer_times(
        fwd=1.0, bwd=2.0, wgt=1.0, fwd_gemm=0.75, bwd_gemm=1.5, fwd_attention=0.125, bwd_attention=0.25,
        recompute=0.0, full_recompute=False, emb=(0.125, 0.25, 0.0), head=(0.25, 0.5, 0.25), tp_one=0.0, sp=False,
        tp_comm_overlap=True, cp=1, cp_comm=(0.0, 0.0), fsdp_per_layer=fsdp, all_gather=0.5, reduce_scatter=0.5,
        reshard_after_forward=reshard, fsdp_units=units, embedding_kept=kept,
    )


def test_embedding_and_head_units_charged_on_first_and_last_stage():
    lt = _lt((1.0, 1.0, 0.75, 0.75))
    assert lt.fsdp_fwd == 0.0 and lt.fsdp_bwd == 0.0  # a layer's collectives hide behind its compute
    assert lt.fsdp_emb_fwd == 1.0 - 0.125  # the embedding's compute is a lookup: almost all exposed
    assert lt.fsdp_emb_bwd == 2.0 - 0.25  # gathered again (resharded after forward), reduce-scattered
    assert lt.fsdp_head_fwd == 0.75 - 0.25
    assert lt.fsdp_head_bwd == 0.75 - 0.5  # kept gathered after forward: only the reduce-scatter
    st = stage_times((2, 2), lt)
    assert st.fsdp_fwd == [0.875, 0.5] and st.fsdp_bwd == [1.75, 0.25]
    assert st.fwd == [2 * 1.0 + 0.125 + 0.875, 2 * 1.0 + 0.25 + 0.5]
    assert st.bwd == [2 * 2.0 + 0.25 + 1.75, 2 * 2.0 + 0.5 + 0.25]
    one = stage_times((4,), lt)
    assert one.fsdp_fwd == [0.875 + 0.5] and one.fsdp_bwd == [1.75 + 0.25]


def test_tied_or_kept_weights_skip_the_backward_gather():
    assert _lt((1.0, 1.0, 0.75, 0.75), kept=True).fsdp_emb_bwd == 1.0 - 0.25
    assert _lt((1.0, 1.0, 0.75, 0.75), reshard=False).fsdp_emb_bwd == 1.0 - 0.25
    assert _lt((1.0, 1.0, 0.75, 0.75), fsdp=False).fsdp_emb_fwd == 0.0


def test_unit_sizes_tied_and_untied():
    model, gpu = load_model("llama3-8b"), load_gpu("h100-sxm-80gb")
    cluster = ClusterSpec.of(gpu, 64)
    plan = TrainingPlan(dp=64, zero=3, seq_len=4096, global_batch=64)
    cal, pl = calibration_for(gpu), plan_placements(cluster, plan).shard
    t = fsdp_unit_times(model, 1, 1, plan.precision, pl, cluster, cal)
    sizes = [layer_params_per_rank(model, 1), embedding_params_per_rank(model, 1), head_params_per_rank(model, 1, 1)]
    assert sizes[1] == 128256 * 4096 and sizes[2] == 128256 * 4096 + 4096
    for i, p in enumerate(sizes):
        assert t[2 * i] == coll.collective_time("all_gather", p * plan.precision.weight_bytes, pl, cluster, cal)
        assert t[2 * i + 1] == coll.collective_time("reduce_scatter", p * plan.precision.grad_bytes, pl, cluster, cal)
    tied = model.model_copy(update={"tied_embeddings": True})
    assert head_params_per_rank(tied, 1, 1) == 4096  # the head unit is the final norm alone
    assert fsdp_unit_times(tied, 1, 1, plan.precision, pl, cluster, cal)[4] < t[4]


def test_estimate_charges_the_units():
    """ZeRO-3 over 64 GPUs, one micro-batch: the exposed FSDP time holds at least the embedding's
    collectives (gathered before forward and backward, reduce-scattered) less its lookup's compute."""
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 64)
    plan = TrainingPlan(dp=64, zero=3, seq_len=4096, global_batch=64)
    est = estimate(model, cluster, plan)
    cal = calibration_for(cluster.gpu)
    _, _, eag, ers, hag, hrs = fsdp_unit_times(model, 1, 1, plan.precision, plan_placements(cluster, plan).shard, cluster, cal)
    emb = embedding_op_times(model, 1, 4096, 1, 1, cluster.gpu, cal, plan.precision.activation_bytes)
    floor = (eag - emb.fwd) + (eag + ers - emb.bwd)
    assert floor > 0 and est.time.fsdp_comm_s >= floor


def _items(**kw):
    base = dict(reserve=0.0, holds_head=True, logits_grad=100.0, head_act=300.0, zero=3, shard=4, params=1000,
                layer_params=200, head_params=50, kept_embedding_params=0, weight_bytes=2, grad_bytes=4,
                reshard_after_forward=True, once_per_step=False, tp=1, act_msg=0.0, pp=1, p2p_bytes=0.0,
                down_params=50, layer_stored=0.0, logits_block=0.0)
    return rank_other_items(**(base | kw))


def test_peak_is_the_larger_backward_moment():
    # head moment: logits' gradient 100 + head unit 50·2 = 200; layer moment: 2·200·2 + 2·200·4 − 300 = 900
    it = _items()
    assert it == {"runtime_reserve": 0.0, "logits_grad": 0.0, "gathered_weights": 800, "grad_reduce_buckets": 1600,
                  "head_activations_freed": -300.0}
    # large head activations (logits): the head moment wins, no buckets, nothing freed
    it = _items(head_act=3000.0)
    assert it == {"runtime_reserve": 0.0, "logits_grad": 100.0, "gathered_weights": 100, "grad_reduce_buckets": 0.0,
                  "head_activations_freed": 0.0}
    # a stage without the LM head: the top layer's backward, nothing freed
    it = _items(holds_head=False)
    assert it["gathered_weights"] == 800 and it["grad_reduce_buckets"] == 1600 and "logits_grad" not in it
    # weights kept gathered: the whole stage (beside its shard) at the head moment
    assert _items(reshard_after_forward=False, head_act=3000.0)["gathered_weights"] == 2000
    # ZeRO-1: only the logits' gradient (the sum is unchanged from a plain list)
    assert _items(zero=1) == {"runtime_reserve": 0.0, "logits_grad": 100.0}


def test_layer_moment_is_its_mlp_or_its_end():
    """The top layer's backward peaks at its MLP (the previous layer's gradients being reduced,
    of its own only the down projection's: (200 + 50)·4 = 1,000, beside its working set), or, with
    few activations, at its end (all its gradients beside the previous layer's, 2·200·4 = 1,600,
    its stored activations and working set freed)."""
    mlp = _items(layer_stored=2000.0, working=500.0)  # 1,000 > 1,600 − 2,500
    assert mlp["grad_reduce_buckets"] == (200 + 50) * 4 and "layer_activations_freed" not in mlp
    end = _items(layer_stored=100.0, working=200.0)  # 1,000 < 1,600 − 300
    assert end["grad_reduce_buckets"] == 2 * 200 * 4 and end["layer_activations_freed"] == -300.0
    # both moments as totals, the working set counted with the activations: A + W + other
    for it, stored, working, moment in ((mlp, 2000.0, 500.0, 500.0 + 1000), (end, 100.0, 200.0, 1600 - 100.0)):
        assert working + sum(it.values()) == 800 - 300 + moment  # gathered 2·200·2, head freed −300
    # no ZeRO-2/3: neither
    assert "layer_activations_freed" not in _items(zero=1, layer_stored=100.0, working=200.0)


def test_peak_moments_vectorized_equal_scalar():
    zero = np.array([0, 1, 2, 3, 3, 3])
    shard = np.array([4, 4, 4, 4, 1, 4])
    head_act = np.array([300.0, 300.0, 300.0, 300.0, 300.0, 3000.0])
    stored = np.array([100.0, 100.0, 100.0, 100.0, 3000.0, 100.0])  # the layer's end or its MLP
    arr = _items(zero=zero, shard=shard, head_act=head_act, tp=np.ones(6, dtype=np.int64), layer_stored=stored, working=200.0)
    for i in range(6):
        one = _items(zero=int(zero[i]), shard=int(shard[i]), head_act=float(head_act[i]), layer_stored=float(stored[i]), working=200.0)
        for k, v in arr.items():
            assert np.broadcast_to(v, (6,))[i] == one.get(k, 0.0), (i, k)
        assert sum(np.broadcast_to(v, (6,))[i] for v in arr.values()) == sum(one.values())


@pytest.mark.parametrize("pp", [1, 2])
def test_estimate_total_is_persistent_plus_activations_plus_moment(pp):
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 16)
    est = estimate(model, cluster, TrainingPlan(dp=16 // pp, pp=pp, zero=3, seq_len=2048, global_batch=32))
    for s in est.stages:
        assert s.total == s.weights + s.gradients + s.optimizer + s.activations + sum(s.other_items.values())
        assert s.activation_items.get("head_activations_freed", 0.0) <= 0.0 and min(s.other_items.values()) >= 0
