"""A rank's memory as its peak's moment holds it: the activations the moment has freed
or not yet built are activations, not buffers, so the ``other`` column (buffers and reserves) is
never negative; and ZeRO-3 gathers only units the rank holds."""

from __future__ import annotations

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.compose import FREED_ACTIVATIONS
from meshplan.estimate import estimate
from meshplan.specs import ClusterSpec, PrecisionRecipe, TrainingPlan


def test_freed_head_activations_count_with_the_activations():
    """``meshplan estimate --model gemma2-9b --gpu h200-sxm-141gb --gpus 256 --pp 2 --micro-batch 4
    --seq-len 32768 --recompute full --zero 3 --precision fp32 --attention materialized
    --gpus-per-node 4``: the last rank peaks at its top layer's backward, the LM head's
    activations (fp32 logits of 4 × 32,768 tokens × 256,000 entries, 137,975,824,384 bytes)
    already freed. 'other' was −120.59 GiB, the freed logits taken off the buffers while the
    activations still held them; now the activations are those live at the peak, the same as
    the first rank's (both hold 21 layers of one micro-batch), and 'other' the same buffers."""
    model, cluster = load_model("gemma2-9b"), ClusterSpec.of(load_gpu("h200-sxm-141gb"), 256, gpus_per_node=4)
    plan = TrainingPlan(pp=2, dp=128, micro_batch=4, seq_len=32768, global_batch=512, recompute="full", zero=3,
                        precision=PrecisionRecipe(precision="fp32", master_weights=False), attention="materialized")
    first, last = estimate(model, cluster, plan).stages
    assert last.activation_items["head_activations_freed"] == -137_975_824_384
    assert last.activation_items["stored"] - first.activation_items["stored"] == 137_975_824_384
    assert last.activations == first.activations == 369_635_622_912  # 344.25 GiB
    assert last.other == first.other == 8_489_443_328  # 7.91 GiB: reserve, gathered weights, buckets, PP buffers
    assert last.total == 378_760_017_088  # unchanged: 352.75 GiB
    for s in (first, last):
        assert not FREED_ACTIVATIONS & s.other_items.keys() and min(s.other_items.values()) >= 0


def test_working_set_not_yet_built_counts_with_the_activations():
    """At the loss's backward (the head moment) no layer has rebuilt its working set W: the item
    taking it off stands with the activations, which then hold the stored activations and the
    layer's backward gradients less them, and 'other' the loss's buffers."""
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 8)
    (s,) = estimate(model, cluster, TrainingPlan(dp=8, seq_len=8192, global_batch=16, micro_batch=2, recompute="full")).stages
    w = s.activation_items["backward_working_set"] + s.activation_items["backward_gradients"]
    assert s.activation_items["working_set_not_yet_built"] == -w < 0
    assert s.activations == s.activation_items["stored"]
    assert s.other == sum(s.other_items.values()) and min(s.other_items.values()) >= 0 and s.other_items["logits_grad"] > 0


def test_a_stage_of_one_layer_prefetches_no_second_layer():
    """ZeRO-3 at a stage's top layer holds that layer and the unit prefetched for the next
    backward (:func:`meshplan.cost.compose.prefetched_unit`). Llama 3 8B on 32 pipeline ranks has
    one layer per stage: the layer below is another rank's, so a middle rank holds its one layer,
    P_l·w = 436,224,000 bytes (it counted 2·P_l·w, its whole stage twice over), and the first rank
    its layer and the embedding it gathers again for its backward, (P_l + P_emb)·w — never more
    than the rank's whole weights."""
    from meshplan.cost.params import embedding_params_per_rank, layer_params_per_rank

    model, h100 = load_model("llama3-8b"), load_gpu("h100-sxm-80gb")
    est = estimate(model, ClusterSpec.of(h100, 256), TrainingPlan(pp=32, dp=8, seq_len=4096, global_batch=256, zero=3))
    layer, emb = layer_params_per_rank(model, 1) * 2, embedding_params_per_rank(model, 1) * 2
    assert est.stages[1].other_items["gathered_weights"] == layer == 436_224_000
    assert est.stages[0].other_items["gathered_weights"] == layer + emb == 1_486_897_152
    for s in est.stages:
        assert s.other_items["gathered_weights"] <= s.params * 2
    # two layers a stage: the layer in use and the one below, as before
    two = estimate(model, ClusterSpec.of(h100, 128), TrainingPlan(pp=16, dp=8, seq_len=4096, global_batch=128, zero=3))
    assert two.stages[1].other_items["gathered_weights"] == 2 * layer
