"""FP8 training's saved activations: Transformer Engine keeps the FP8 copy of each linear layer's
input for the weight gradient (1 byte per element), torchao's Float8Linear keeps the 16-bit one."""

from __future__ import annotations

import pytest

from meshplan.accuracy.heldout import map_heldout_runs
from meshplan.catalog import load_gpu, load_model
from meshplan.cost.activations import layer_activation_items, layer_activations, mlp_backward_gradient_bytes, saved_gemm_input_bytes
from meshplan.estimate import estimate
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan
from meshplan.units import GiB


def test_only_fp8_on_the_fused_stack_saves_one_byte_inputs():
    assert saved_gemm_input_bytes("fp8", "fused", 2) == 1
    assert saved_gemm_input_bytes("fp8", "compiled", 2) == 2
    assert saved_gemm_input_bytes("fp8", "eager", 2) == 2
    assert saved_gemm_input_bytes("bf16", "fused", 2) == 2
    assert saved_gemm_input_bytes("fp16", "fused", 2) == 2


def test_gpt_layer_with_tp_and_sp_drops_from_34_to_29_sbh_over_t():
    # GPT-3 175B (MHA, GeLU 4h, dropout), flash attention, t = 8 with SP: 34·s·b·h/t in 16-bit;
    # in FP8 the QKV input (-1), MLP input (-1) and GeLU output (-4) halve, the attention output
    # gains an FP8 copy (+1): 29·s·b·h/t. The fp32 log-sum-exp is the same in both.
    m = load_model("gpt3-175b")
    s, b, t = 2048, 1, 8
    bf16 = layer_activations(m, b, s, t, 1, True, "none", "flash", 2)
    fp8 = layer_activations(m, b, s, t, 1, True, "none", "flash", 2, gemm_input_bytes=1)
    sbh = s * b * m.hidden
    lse = 4 * s * b * m.n_heads / t
    assert bf16.stored == 34 * sbh / t + lse
    assert fp8.stored == 29 * sbh / t + lse
    assert bf16.stored - fp8.stored == 5 * sbh / t


def test_gated_mlp_items_by_hand():
    # Llama 3 8B, t = 2 without SP, n = 4096 tokens: per item, bytes in FP8 vs bf16
    m = load_model("llama3-8b")
    n, t, h, f = 4096, 2, m.hidden, m.ffn_hidden
    a_d = m.n_heads // t * m.head_dim
    bf = dict((k, v) for k, v, _ in layer_activation_items(m, 1, n, t, 1, False, "flash", 2))
    f8 = dict((k, v) for k, v, _ in layer_activation_items(m, 1, n, t, 1, False, "flash", 2, gemm_input_bytes=1))
    assert f8["qkv_input"] == n * h * 1 and bf["qkv_input"] == n * h * 2
    assert f8["mlp_input"] == n * h * 1
    assert f8["out_proj_input"] == n * a_d * 3 and bf["out_proj_input"] == n * a_d * 2
    assert f8["mlp_hidden"] == n * (f // t) * (2 * 2 + 1) and bf["mlp_hidden"] == n * (f // t) * 3 * 2
    assert f8["norm1_input"] == bf["norm1_input"] and f8["q_k_v"] == bf["q_k_v"]


@pytest.mark.parametrize("kernels,expect_smaller", [("fused", True), ("compiled", False)])
def test_estimate_uses_the_stack_rule(kernels, expect_smaller):
    m = load_model("llama3-8b")
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 8)
    common = dict(dp=8, micro_batch=1, global_batch=8, seq_len=8192, zero=1, kernels=kernels)
    bf16 = estimate(m, cluster, TrainingPlan.of(precision=PrecisionRecipe(precision="bf16"), **common))
    fp8 = estimate(m, cluster, TrainingPlan.of(precision=PrecisionRecipe(precision="fp8"), **common))
    a16, a8 = bf16.stages[0].activations, fp8.stages[0].activations
    if expect_smaller:
        per_layer = layer_activations(m, 1, 8192, act_bytes=2).stored - layer_activations(m, 1, 8192, act_bytes=2, gemm_input_bytes=1).stored
        # the MLP backward frees the down-projection's saved input: 1 byte an element under FP8, 2 in bf16
        freed_less = mlp_backward_gradient_bytes(m, 8192, 1, False, 2, gemm_input_bytes=1) - mlp_backward_gradient_bytes(m, 8192, 1, False, 2)
        assert freed_less == 8192 * 14336 * (2 - 1)
        items16, items8 = bf16.stages[0].activation_items, fp8.stages[0].activation_items
        assert items16["backward_gradients"] - items8["backward_gradients"] == -freed_less
        # the peak is the loss's moment (its gradient buffers), before any layer's backward: the
        # working set is not built yet, so the activations at the peak differ by the stored bytes
        assert "logits_grad" in bf16.stages[0].other_items and items16["working_set_not_yet_built"] < 0
        assert a16 - a8 == pytest.approx(m.n_layers * per_layer, rel=1e-12)
        assert per_layer > 0
    else:
        assert a8 == a16


def test_nemo_fp8_runs_that_ran_fit_in_80gb():
    # NeMo 24.07's GPT-3 20B on 64 and 175B on 512 H100 ran in 80 GB: with TE's FP8 saved inputs
    # the predicted peaks (78.1 and 75.3 GiB) fit; with 16-bit saved inputs they did not (80.6, 81.6)
    runs = {r.id: r for r in map_heldout_runs()}
    for rid in ("nemo2407_gpt3_20b_64gpu", "nemo2407_gpt3_175b_512gpu"):
        r = runs[rid]
        est = estimate(r.model, r.cluster, r.plan)
        assert est.fits, rid
        assert 74 * GiB < est.peak_bytes < 80 * GiB, (rid, est.peak_bytes / GiB)


def test_materialized_attention_output_is_only_a_gemm_input():
    # without FlashAttention the context (A·V output) feeds only the output projection: FP8 alone
    m = load_model("gpt3-175b")
    n, t = 2048, 8
    a_d = m.n_heads // t * m.head_dim
    f8 = dict((k, v) for k, v, _ in layer_activation_items(m, 1, n, t, 1, True, "materialized", 2, gemm_input_bytes=1))
    bf = dict((k, v) for k, v, _ in layer_activation_items(m, 1, n, t, 1, True, "materialized", 2))
    assert f8["out_proj_input"] == n * a_d * 1
    assert bf["out_proj_input"] == n * a_d * 2
    assert f8["attention_scores"] == bf["attention_scores"]
