

def test_a_stage_of_one_layer_prefetches_no_second_layer():
    """ZeRO-3 at a stage's top layer holds that layer and the unit prefetched for the next
    backward (:func:`meshplan.cost.compose.prefetched_unit`). Llama 3 8B on 32 pipeline ranks has
    one layer per stage: the layer below is another rank's, so a middle rank holds its one layer,
    P_l·w = 436,224,000 bytes (it counted 2·P_l·w, its whole stage twice over), and the first rank
    its layer and the embedding it gathers again for its backward, (P_l + P_emb)·w — never more
    than the rank's whole weights."""
    from meshplan.cost.params import embedding_params_per_rank, layer_params_per_rank

    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 256)
    est = estimate(model, cluster, TrainingPlan(pp=32, dp=8, seq_len=4096, global_batch=256, zero=3))
    layer, emb = layer_params_per_rank(model, 1) * 2, embedding_params_per_rank(model, 1) * 2
    assert est.stages[1].other_items["gathered_weights"] == layer == 436_224_000
    assert est.stages[0].other_items["gathered_weights"] == layer + emb == 1_486_897_152
    for s in est.stages:
        assert s.other_items["gathered_weights"] <= s.params * 2
    # two layers a stage: the layer in use and the one below, as before
    two = estimate(model, ClusterSpec.of(load_gpu("h100-sxm-80gb"), 128), TrainingPlan(pp=16, dp=8, seq_len=4096, global_batch=128, zero=3))
    assert two.stages[1].other_items["gathered_weights"] == 2 * layer
