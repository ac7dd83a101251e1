"""The derivation of a layer's parameters per TP rank, shared by the exercises tp-weights and
l3-weights: exact counts from the shapes, the same derivation in both."""

from __future__ import annotations

import pytest

from meshplan.catalog import load_model
from meshplan.learn import generate
from meshplan.learn.ex_comm import layer_params_derivation


@pytest.mark.parametrize("name,tp,count,kv", [
    # Q and O h·h/t each, K and V h·(K/V heads per rank)·128 each, SwiGLU 3·h·f/t, two RMSNorms of h
    ("llama3-405b", 8, 2 * 16384 * 16384 // 8 + 2 * 16384 * 1 * 128 + 3 * 16384 * 53248 // 8 + 2 * 16384, "1 K/V head"),
    ("llama3-70b", 8, 2 * 8192 * 8192 // 8 + 2 * 8192 * 1 * 128 + 3 * 8192 * 28672 // 8 + 2 * 8192, "1 K/V head"),
    ("llama3-70b", 16, 2 * 8192 * 8192 // 16 + 2 * 8192 * 1 * 128 + 3 * 8192 * 28672 // 16 + 2 * 8192, "1 K/V head"),  # 8 heads replicated
    ("llama3-70b", 2, 2 * 8192 * 8192 // 2 + 2 * 8192 * 4 * 128 + 3 * 8192 * 28672 // 2 + 2 * 8192, "4 K/V heads"),
])
def test_layer_params_per_rank_exact(name, tp, count, kv):
    per, d = layer_params_derivation(load_model(name), tp)
    assert per == count
    assert d.key == "tp.layer_params" and d.value == f"{count:,}"
    assert dict(d.symbols)["g_r"] == kv and dict(d.symbols)["t"] == str(tp)


def test_both_exercises_show_the_same_derivation():
    assert 398_491_648 == layer_params_derivation(load_model("llama3-405b"), 8)[0]
    l3 = generate("l3-weights")  # Llama 3 405B, TP 8
    tp = generate("tp-weights")  # Llama 3 70B, TP 8
    assert l3.solution[0] == layer_params_derivation(load_model("llama3-405b"), 8)[1]
    assert tp.solution[0] == layer_params_derivation(load_model("llama3-70b"), 8)[1]
    assert dict(l3.solution[0].symbols)["h"] == "16,384" and dict(tp.solution[0].symbols)["f"] == "28,672"
    assert l3.answer.value == pytest.approx(2 * 8 * 398_491_648)  # 8 layers of bf16 weights on a middle stage
