"""Activation memory per layer: Korthikanti et al. 2022 Table 2 reproduced exactly for GPT
shapes, and the Llama equivalent derived by hand from the tensor list.

All byte counts here are integers far below 2**53 and every division is by a power of two, so
the floats meshplan returns are exact; they are compared with ``==`` through ``Fraction``.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from meshplan.catalog import load_model
from meshplan.cost.activations import (
    embedding_activation_bytes,
    head_activation_bytes,
    layer_activation_items,
    layer_activations,
)
from meshplan.specs.model import ModelSpec


def gpt_like(L: int, h: int, a: int, V: int = 51200, s: int = 2048) -> ModelSpec:
    """Korthikanti's model: MHA, f = 4h GeLU MLP, LayerNorm, dropout, learned positions."""
    return ModelSpec(
        name=f"gpt-{L}x{h}", n_layers=L, hidden=h, n_heads=a, n_kv_heads=a, head_dim=h // a,
        ffn_hidden=4 * h, vocab_size=V, max_position=s, mlp="gelu", norm="layernorm",
        position="learned", qkv_bias=True, linear_bias=True, dropout=True,
    )


GPT22B = gpt_like(48, 6144, 64)
GPT175B = load_model("gpt3-175b")  # h = 12288, a = 96, dropout on

# (model, s, b, t): Korthikanti's 22B (t = 8, b = 4) and 175B (t = 8, b = 1) configurations,
# plus a couple of other TP sizes
CASES = [
    (GPT22B, 2048, 4, 8),
    (GPT175B, 2048, 1, 8),
    (GPT22B, 2048, 1, 4),
    (GPT175B, 2048, 2, 2),
]


def korthikanti(model: ModelSpec, s: int, b: int, t: int) -> dict[str, Fraction]:
    """Table 2 of Korthikanti et al. 2022 (bytes per layer, 16-bit activations)."""
    h, a = model.hidden, model.n_heads
    sbh = s * b * h
    r = Fraction(a * s, h)  # as/h
    return {
        "none": sbh * (34 + 5 * r),
        "tp": sbh * (10 + Fraction(24, t) + 5 * r / t),
        "tp_sp": sbh * (Fraction(34, t) + 5 * r / t),
        "tp_selective": sbh * (10 + Fraction(24, t)),
        "tp_sp_selective": Fraction(34 * sbh, t),
        "full": Fraction(2 * sbh),
    }


def stored(model, s, b, t=1, sp=False, recompute="none", cp=1, attention="materialized"):
    la = layer_activations(model, b, s, tp=t, cp=cp, sequence_parallel=sp, recompute=recompute, attention=attention, act_bytes=2)
    return Fraction(la.stored)


@pytest.mark.parametrize("model,s,b,t", CASES)
def test_korthikanti_table2(model, s, b, t):
    k = korthikanti(model, s, b, t)
    assert stored(model, s, b) == k["none"]
    assert stored(model, s, b, t) == k["tp"]
    assert stored(model, s, b, t, sp=True) == k["tp_sp"]
    assert stored(model, s, b, t, recompute="selective") == k["tp_selective"]
    assert stored(model, s, b, t, sp=True, recompute="selective") == k["tp_sp_selective"]
    assert stored(model, s, b, recompute="full") == k["full"]
    # with SP the kept layer input is sharded too
    assert stored(model, s, b, t, sp=True, recompute="full") == k["full"] / t


def test_korthikanti_22b_numbers():
    """The 22B shape at s = 2048, b = 4, t = 8 in bytes: sbh = 50,331,648; 5as/h = 106.67."""
    s, b, h = 2048, 4, 6144
    sbh = s * b * h
    assert sbh == 50_331_648
    assert stored(GPT22B, s, b) == 34 * sbh + 5 * 64 * s * s * b == 7_079_985_152
    assert stored(GPT22B, s, b, 8, sp=True) == (34 * sbh + 5 * 64 * s * s * b) // 8 == 884_998_144
    assert stored(GPT22B, s, b, 8, sp=True, recompute="selective") == 34 * sbh // 8 == 213_909_504


def test_gpt_item_list_adds_to_34():
    """The tensor list behind 34·sbh: 11 (attention linear) + 19 (MLP) + 4 (norms)."""
    s, b, h = 2048, 1, 6144
    items = {n: Fraction(v) for n, v, _ in layer_activation_items(GPT22B, b, s, 1, 1, False, "materialized", 2)}
    sbh = s * b * h
    assert items["q_k_v"] == 6 * sbh
    assert items["mlp_hidden"] == 16 * sbh  # GeLU input and fc2 input, 4h each, 2 bytes
    assert items["attention_out_dropout_mask"] == items["mlp_dropout_mask"] == sbh
    assert items["attention_scores"] == 2 * 64 * s * s * b
    assert items["attention_dropout"] == 3 * 64 * s * s * b  # mask (1 byte) + output (2 bytes)
    linear = sum(v for n, v in items.items() if n not in ("attention_scores", "attention_dropout"))
    assert linear == 34 * sbh


def test_llama3_405b_per_layer_by_hand():
    """Llama 3 405B, b = 1, s = 8192, t = 8 with SP, FlashAttention, no dropout, bf16.

    n = 8192 tokens, h = 16384, a/t = 16 query heads, g/t = 1 K/V head, d = 128, f/t = 6656:
      norm-1 input, QKV input, norm-2 input, MLP input: 4 × n·h·2/8        = 4 × 33,554,432
      Q, K, V:            n·(16 + 2·1)·128·2                            =      37,748,736
      out-proj input:     n·16·128·2                                    =      33,554,432
      SwiGLU (gate|up and down-proj input): 3·n·6656·2                  =     327,155,712
      flash softmax log-sum-exp: 4·n·16 (fp32)                          =         524,288
    """
    m = load_model("llama3-405b")
    n = 8192
    per_layer = 4 * (n * 16384 * 2 // 8) + n * (16 + 2) * 128 * 2 + n * 16 * 128 * 2 + 3 * n * 6656 * 2 + 4 * n * 16
    assert per_layer == 533_200_896
    none = layer_activations(m, 1, 8192, tp=8, sequence_parallel=True, recompute="none", attention="flash")
    sel = layer_activations(m, 1, 8192, tp=8, sequence_parallel=True, recompute="selective", attention="flash")
    full = layer_activations(m, 1, 8192, tp=8, sequence_parallel=True, recompute="full", attention="flash")
    # the MLP backward's gradients at its peak: the layer output's n·h·2/8 and SwiGLU's three n·6656·2
    # (down-projection input, gate and up gradients) less the down-projection input it freed
    grads = n * 16384 * 2 // 8 + 3 * n * 6656 * 2 - n * 6656 * 2
    assert grads == 251_658_240
    assert none.stored == per_layer
    assert none.working == none.gradients == grads
    assert sel.stored == per_layer - 4 * n * 16  # selective drops only the softmax statistics
    assert sel.working == 4 * n * 16 + grads
    assert full.stored == n * 16384 * 2 // 8 == 33_554_432  # the layer input, sharded by SP
    assert full.working == per_layer - full.stored + grads  # the rebuilt layer reads the kept input
    assert sum(b for _, b in none.items) == none.stored
    assert dict(full.items) == {"layer_input": full.stored}


@pytest.mark.parametrize("model,attention", [(load_model("llama3-70b"), "flash"), (GPT22B, "materialized"), (GPT175B, "flash")])
def test_full_recompute_working_set_is_the_unrecomputed_layer(model, attention):
    """Full recompute rebuilds the layer but its input, which the checkpoint kept and the rebuilt
    layer reads (one tensor, not two), and its backward adds the MLP's gradients as without
    recompute."""
    for sp in (False, True):
        none = layer_activations(model, 2, 2048, tp=8, sequence_parallel=sp, recompute="none", attention=attention)
        full = layer_activations(model, 2, 2048, tp=8, sequence_parallel=sp, recompute="full", attention=attention)
        assert full.working == none.stored - full.stored + none.working
        assert full.stored + full.working == none.stored + none.gradients  # the same layer at its backward's peak
        assert full.stored < none.stored


@pytest.mark.parametrize("model,attention", [(load_model("llama3-8b"), "flash"), (GPT22B, "materialized")])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_context_parallel_divides_by_c(model, attention, recompute):
    """With CP each GPU holds s/c of the queries: every term (the s² scores too: (s/c)·s per
    head) is divided by c."""
    for c in (2, 4):
        base = layer_activations(model, 1, 4096, tp=2, cp=1, sequence_parallel=True, recompute=recompute, attention=attention)
        split = layer_activations(model, 1, 4096, tp=2, cp=c, sequence_parallel=True, recompute=recompute, attention=attention)
        assert split.stored == base.stored / c
        assert split.working == base.working / c


def test_activations_scale_linearly_with_micro_batch():
    m = load_model("llama3-8b")
    one = layer_activations(m, 1, 4096, tp=2, sequence_parallel=True)
    four = layer_activations(m, 4, 4096, tp=2, sequence_parallel=True)
    assert four.stored == 4 * one.stored


def test_flash_vs_materialized_scores():
    """Materialized attention keeps the b·a·s² softmax output (2 bytes); FlashAttention keeps only
    the fp32 log-sum-exp per query and head."""
    m = load_model("llama3-8b")  # no dropout
    s, a = 4096, 32
    mat = dict((n, v) for n, v, _ in layer_activation_items(m, 1, s, 1, 1, False, "materialized", 2))
    fl = dict((n, v) for n, v, _ in layer_activation_items(m, 1, s, 1, 1, False, "flash", 2))
    assert mat["attention_scores"] == a * s * s * 2
    assert "attention_dropout" not in mat
    assert fl["flash_softmax_stats"] == 4 * s * a
    assert sum(mat.values()) - sum(fl.values()) == a * s * s * 2 - 4 * s * a


def test_embedding_and_head_activations():
    """Korthikanti Sec. 4.3: embedding dropout mask sbh (÷t with SP); last stage keeps the final
    norm and LM-head inputs (2 × 2sbh, ÷t with SP) and the fp32 logits 4·s·b·V/t, with V padded
    to a multiple of t (50257 → 50264: each rank holds 6283 vocabulary rows)."""
    gpt = GPT175B
    s, b, t, h, V = 2048, 1, 8, 12288, 50264
    assert embedding_activation_bytes(gpt, b, s, t, 1, True) == s * b * h / t
    assert embedding_activation_bytes(gpt, b, s, t, 1, False) == s * b * h
    assert embedding_activation_bytes(load_model("llama3-8b"), b, s, t, 1, True) == 0.0  # no dropout
    assert Fraction(head_activation_bytes(gpt, b, s, t, 1, True, 2)) == Fraction(4 * s * b * h, t) + Fraction(4 * s * b * V, t)


def test_op_level_selective_keeps_every_other_matmul_output():
    """recompute 'op' (torchtitan): the layer input plus the outputs of q, v, gate and down, the
    attention output and its fp32 log-sum-exp; the backward rebuilds the rest from the layer
    input, so the working set is the whole layer's activations less what was kept (the down
    projection's output is none of them: only the residual add reads it), plus that input.
    Compiled, the partitioner keeps no down-projection output."""
    m = load_model("llama3-8b")
    n, e, h = 8192, 2, 4096
    la = layer_activations(m, 1, 8192, recompute="op")
    expected = n * e * (h + 4096 + 1024 + 14336 + h + 4096) + 4 * n * 32
    assert la.stored == expected
    full = layer_activations(m, 1, 8192, recompute="none").stored
    grads = n * h * e + 2 * n * 14336 * e  # the MLP backward's gradients (mlp_backward_gradient_bytes)
    down = n * h * e
    assert la.working == full - (la.stored - down) + n * h * e + grads
    compiled = layer_activations(m, 1, 8192, recompute="op", kernels="compiled")
    assert compiled.stored == expected - down
    assert "down_output" not in dict(compiled.items) and dict(la.items)["down_output"] == down
    # Gemma's post-norms read the down projection's output in their backward: kept either way
    gemma = load_model("gemma2-9b")
    assert dict(layer_activations(gemma, 1, 8192, recompute="op", kernels="compiled").items)["down_output"] == 8192 * 3584 * 2
    assert layer_activations(m, 1, 8192, recompute="full").stored < la.stored < la.working
