"""Hugging Face ``config.json`` -> ModelSpec, checked against real configs and published sizes.

The fixtures under ``tests/data/hf/<model>/config.json`` are the configs published on the
Hugging Face Hub. Every one is checked two independent ways against the model's published
parameter count (what ``sum(p.numel() for p in model.parameters())`` reports in ``transformers``):

* ``params_from_config`` counts from the raw config dict, one formula per architecture, written
  from the ``transformers`` module layout and not from meshplan's key mapping;
* ``params_from_spec`` counts from the ModelSpec that meshplan built, so a key the loader drops
  or mis-maps (a bias, tying, learned positions) shows up as a wrong total.

Neither uses ``meshplan.cost.params``: these tests are the independent derivation it is checked
against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.catalog import load_model
from meshplan.catalog.hf_config import model_from_hf_config, supported_model_types
from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec

DATA = Path(__file__).parent / "data"
HF = DATA / "hf"

#: Published totals. Pythia and GPT-NeoX pad their vocabularies (50,304 and 50,432 rows for
#: tokenizers of about 50,280 tokens) and the published counts include the padded rows, as the
#: config's vocab_size does; Llama 3's paper rounds its vocabulary to 128K but the checkpoint,
#: config and count use 128,256.
PUBLISHED = {
    "Llama-3.1-8B": 8_030_261_248,
    "Mistral-7B-v0.1": 7_241_732_096,
    "Qwen2-7B": 7_615_616_512,
    "Qwen2-0.5B": 494_032_768,  # ties lm_head to the embeddings
    "gpt2": 124_439_808,  # openai-community/gpt2; lm_head is wte
    "pythia-160m": 162_322_944,  # untied: embed_in and embed_out are separate
    "gpt-neox-20b": 20_554_567_680,
}


def hf_config(model: str) -> dict[str, Any]:
    return json.loads((HF / model / "config.json").read_text())


# ---- independent counts -----------------------------------------------------------------------
def _llama_like_params(c: dict[str, Any]) -> int:
    """LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM."""
    h, layers, vocab, f = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    a = c["num_attention_heads"]
    g = c.get("num_key_value_heads") or a
    d = c.get("head_dim") or h // a
    qkv_bias = c["model_type"] == "qwen2"  # Qwen2 hard-codes bias=True on q_proj, k_proj, v_proj
    attention = h * a * d + 2 * h * g * d + a * d * h  # q_proj, k_proj, v_proj, o_proj
    attention += (a * d + 2 * g * d) if qkv_bias else 0
    mlp = 3 * h * f  # gate_proj, up_proj, down_proj, no biases
    norms = 2 * h  # input_layernorm, post_attention_layernorm: RMSNorm weight only
    lm_head = 0 if c.get("tie_word_embeddings", False) else vocab * h
    return vocab * h + layers * (attention + mlp + norms) + h + lm_head  # + final norm


def _gpt2_params(c: dict[str, Any]) -> int:
    """GPT2LMHeadModel: wte, wpe, Conv1D layers with biases, LayerNorm (weight + bias)."""
    h, layers, vocab, positions = c["n_embd"], c["n_layer"], c["vocab_size"], c["n_positions"]
    f = c.get("n_inner") or 4 * h
    layernorm = 2 * h
    attention = (h * 3 * h + 3 * h) + (h * h + h)  # c_attn (fused q, k, v), c_proj
    mlp = (h * f + f) + (f * h + h)  # c_fc, c_proj
    return vocab * h + positions * h + layers * (2 * layernorm + attention + mlp) + layernorm  # lm_head is wte


def _gpt_neox_params(c: dict[str, Any]) -> int:
    """GPTNeoXForCausalLM: embed_in, fused query_key_value, dense, MLP, LayerNorms, embed_out."""
    h, layers, vocab, f = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    layernorm = 2 * h
    attention = (h * 3 * h + 3 * h) + (h * h + h)  # query_key_value, dense
    mlp = (h * f + f) + (f * h + h)  # dense_h_to_4h, dense_4h_to_h
    embed_out = 0 if c.get("tie_word_embeddings", False) else vocab * h
    return vocab * h + layers * (2 * layernorm + attention + mlp) + layernorm + embed_out


def params_from_config(c: dict[str, Any]) -> int:
    counter = {
        "llama": _llama_like_params,
        "mistral": _llama_like_params,
        "qwen2": _llama_like_params,
        "gpt2": _gpt2_params,
        "gpt_neox": _gpt_neox_params,
    }[c["model_type"]]
    return counter(c)


def params_from_spec(m: ModelSpec) -> int:
    """One formula over ModelSpec's fields, for every architecture."""
    h, f = m.hidden, m.ffn_hidden
    norm = h if m.norm == "rmsnorm" else 2 * h
    attention = h * m.q_dim + 2 * h * m.kv_dim + m.q_dim * h
    attention += (m.q_dim + 2 * m.kv_dim) if m.qkv_bias else 0
    attention += h if m.linear_bias else 0  # output projection bias
    mlp_in = 2 if m.gated_mlp else 1
    mlp = (mlp_in + 1) * h * f + ((mlp_in * f + h) if m.linear_bias else 0)
    embeddings = m.vocab_size * h + (m.max_position * h if m.position == "learned" else 0)
    lm_head = 0 if m.tied_embeddings else m.vocab_size * h
    return embeddings + m.n_layers * (2 * norm + attention + mlp) + norm + lm_head


# ---- real models ------------------------------------------------------------------------------
@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_independent_count_matches_published_total(model: str) -> None:
    assert params_from_config(hf_config(model)) == PUBLISHED[model]


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_loaded_spec_carries_every_parameter(model: str) -> None:
    spec = load_model(str(HF / model / "config.json"))
    assert spec.name == model  # the folder name, as `hf download` lays models out
    assert spec.source == f"Hugging Face config.json (model_type {hf_config(model)['model_type']})"
    assert params_from_spec(spec) == PUBLISHED[model]


def test_llama_3_1_8b_fields() -> None:
    m = model_from_hf_config(hf_config("Llama-3.1-8B"), name="llama")
    assert (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.head_dim) == (32, 4096, 32, 8, 128)
    assert (m.ffn_hidden, m.vocab_size, m.max_position) == (14336, 128256, 131072)
    assert (m.mlp, m.norm, m.position) == ("swiglu", "rmsnorm", "rope")
    assert not (m.tied_embeddings or m.qkv_bias or m.linear_bias or m.parallel_residual or m.dropout)


def test_mistral_has_no_biases_and_its_sliding_window_changes_nothing() -> None:
    config = hf_config("Mistral-7B-v0.1")
    m = model_from_hf_config(config, name="mistral")
    assert (m.n_kv_heads, m.head_dim, m.ffn_hidden, m.vocab_size) == (8, 128, 14336, 32000)
    assert not (m.qkv_bias or m.linear_bias or m.tied_embeddings)
    without_window = {k: v for k, v in config.items() if k != "sliding_window"}
    assert model_from_hf_config(without_window, name="mistral") == m


def test_qwen2_has_qkv_bias_only_and_small_models_tie() -> None:
    big = model_from_hf_config(hf_config("Qwen2-7B"), name="qwen2-7b")
    small = model_from_hf_config(hf_config("Qwen2-0.5B"), name="qwen2-0.5b")
    for m in (big, small):
        assert m.qkv_bias and not m.linear_bias
        assert (m.mlp, m.norm) == ("swiglu", "rmsnorm")
    assert (big.n_kv_heads, big.head_dim, big.tied_embeddings) == (4, 128, False)
    assert (small.n_kv_heads, small.head_dim, small.tied_embeddings) == (2, 64, True)


def test_gpt2_fields() -> None:
    m = model_from_hf_config(hf_config("gpt2"), name="gpt2")
    assert m.tied_embeddings
    assert m.n_kv_heads == m.n_heads == 12
    assert (m.head_dim, m.ffn_hidden, m.max_position) == (64, 3072, 1024)  # n_inner absent: 4 * 768
    assert (m.mlp, m.norm, m.position) == ("gelu", "layernorm", "learned")
    assert m.qkv_bias and m.linear_bias and m.dropout and not m.parallel_residual


def test_gpt_neox_fields() -> None:
    pythia = model_from_hf_config(hf_config("pythia-160m"), name="pythia")
    neox = model_from_hf_config(hf_config("gpt-neox-20b"), name="neox")  # no use_parallel_residual key
    for m in (pythia, neox):
        assert m.parallel_residual and not m.tied_embeddings
        assert (m.mlp, m.norm, m.position) == ("gelu", "layernorm", "rope")  # gelu_fast is GeLU too
        assert m.qkv_bias and m.linear_bias and not m.dropout
        assert m.n_kv_heads == m.n_heads
    assert (neox.n_heads, neox.head_dim, neox.ffn_hidden) == (64, 96, 24576)


# ---- key variants that real configs use -------------------------------------------------------
def test_llama_optional_keys_default_like_transformers() -> None:
    config = hf_config("Llama-3.1-8B")
    for key in ("num_key_value_heads", "attention_bias", "mlp_bias", "tie_word_embeddings", "hidden_act"):
        del config[key]
    config["head_dim"] = None
    m = model_from_hf_config(config, name="x")
    assert (m.n_kv_heads, m.head_dim, m.mlp, m.tied_embeddings, m.qkv_bias) == (32, 128, "swiglu", False, False)


def test_llama_explicit_head_dim_and_gelu_gate() -> None:
    config = hf_config("Llama-3.1-8B") | {"head_dim": 256, "hidden_act": "gelu_pytorch_tanh"}
    m = model_from_hf_config(config, name="x")
    assert (m.head_dim, m.q_dim, m.mlp) == (256, 32 * 256, "geglu")


def test_llama_with_all_biases_counts_them() -> None:
    config = hf_config("Llama-3.1-8B") | {"attention_bias": True, "mlp_bias": True}
    m = model_from_hf_config(config, name="x")
    assert m.qkv_bias and m.linear_bias
    per_layer = (4096 + 2 * 1024) + 4096 + (2 * 14336 + 4096)  # q, k, v; o_proj; gate, up, down
    assert params_from_spec(m) == PUBLISHED["Llama-3.1-8B"] + 32 * per_layer


def test_gpt2_variants() -> None:
    config = hf_config("gpt2") | {"n_inner": 1000, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    config |= {"activation_function": "relu", "tie_word_embeddings": False}
    m = model_from_hf_config(config, name="x")
    assert (m.ffn_hidden, m.mlp, m.dropout, m.tied_embeddings) == (1000, "relu", False, False)


def test_gpt_neox_sequential_residual_and_explicit_attention_bias() -> None:
    config = hf_config("pythia-160m") | {"use_parallel_residual": False, "attention_bias": True}
    assert not model_from_hf_config(config, name="x").parallel_residual


def test_empty_name_falls_back_to_model_type() -> None:
    assert model_from_hf_config(hf_config("gpt2"), name="").name == "gpt2"


# ---- refusals ---------------------------------------------------------------------------------
def refusal(config: Any) -> InputError:
    with pytest.raises(InputError) as caught:
        model_from_hf_config(config, name="x")
    return caught.value


SUPPORTED = [
    "deepseek_v3", "gemma2", "gemma3", "gemma3_text", "gpt2", "gpt_neox", "llama", "mistral", "mixtral",
    "nemotron", "qwen2", "qwen2_moe", "qwen3_moe",
]


@pytest.mark.parametrize("model_type", ["deepseek_v2", "t5", "bert", "gemma"])
def test_unsupported_model_type_is_refused_by_name(model_type: str) -> None:
    err = refusal(hf_config("Mistral-7B-v0.1") | {"model_type": model_type})
    assert err.field == "model_type"
    assert f"'{model_type}'" in str(err)
    assert str(err) == f"model_type: '{model_type}' is not supported (supported: {', '.join(SUPPORTED)})"
    assert supported_model_types() == SUPPORTED


def test_missing_or_malformed_model_type() -> None:
    config = hf_config("gpt2")
    del config["model_type"]
    assert (refusal(config).field, refusal(config).rule) == ("model_type", "is required (it names the architecture)")
    assert refusal(config | {"model_type": 7}).field == "model_type"


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("Llama-3.1-8B", "hidden_size"),
        ("Llama-3.1-8B", "intermediate_size"),
        ("Qwen2-7B", "vocab_size"),
        ("gpt2", "n_embd"),
        ("gpt2", "n_positions"),
        ("pythia-160m", "num_hidden_layers"),
        ("gpt-neox-20b", "intermediate_size"),
    ],
)
def test_missing_shape_key_is_named(model: str, key: str) -> None:
    config = hf_config(model)
    del config[key]
    err = refusal(config)
    assert (err.field, err.rule) == (key, "is required")
    assert refusal(config | {key: None}).field == key


@pytest.mark.parametrize("value", [-4096, 0, "4096", 4096.0, 4096.5, True, [4096], {"v": 1}])
def test_bad_integer_is_named(value: Any) -> None:
    err = refusal(hf_config("Llama-3.1-8B") | {"hidden_size": value})
    assert err.field == "hidden_size"
    assert err.rule == f"must be a positive integer (got {value!r})"


def test_negative_value_in_each_dialect() -> None:
    assert refusal(hf_config("gpt2") | {"n_layer": -12}).field == "n_layer"
    assert refusal(hf_config("pythia-160m") | {"num_attention_heads": -1}).field == "num_attention_heads"
    assert refusal(hf_config("Qwen2-0.5B") | {"num_key_value_heads": -2}).field == "num_key_value_heads"


@pytest.mark.parametrize("config", [[1, 2], "llama", None, 3])
def test_non_mapping_is_refused(config: Any) -> None:
    err = refusal(config)
    assert err.field == "config"
    assert "must be a JSON object" in err.rule


@pytest.mark.parametrize(("attention_bias", "mlp_bias"), [(True, False), (False, True)])
def test_llama_bias_split_modelspec_cannot_express_is_refused(attention_bias: bool, mlp_bias: bool) -> None:
    err = refusal(hf_config("Llama-3.1-8B") | {"attention_bias": attention_bias, "mlp_bias": mlp_bias})
    assert err.field == "mlp_bias"
    assert "attention_bias" in err.rule


def test_gpt_neox_without_attention_bias_is_refused() -> None:
    assert refusal(hf_config("pythia-160m") | {"attention_bias": False}).field == "attention_bias"


def test_gpt2_cross_attention_is_refused() -> None:
    assert refusal(hf_config("gpt2") | {"add_cross_attention": True}).field == "add_cross_attention"


@pytest.mark.parametrize(
    ("model", "key", "value"),
    [
        ("Llama-3.1-8B", "hidden_act", "relu"),  # a gated ReLU is not a ModelSpec mlp kind
        ("gpt2", "activation_function", "silu"),
        ("pythia-160m", "hidden_act", 3),
        ("Llama-3.1-8B", "tie_word_embeddings", "yes"),
        ("pythia-160m", "use_parallel_residual", 1),
        ("gpt2", "resid_pdrop", 1.5),
        ("gpt2", "attn_pdrop", "0.1"),
        ("Llama-3.1-8B", "attention_dropout", -0.1),
    ],
)
def test_bad_option_is_named(model: str, key: str, value: Any) -> None:
    assert refusal(hf_config(model) | {key: value}).field == key


def test_heads_must_split_hidden_without_head_dim() -> None:
    assert refusal(hf_config("gpt2") | {"n_head": 7}).field == "n_head"
    assert refusal(hf_config("pythia-160m") | {"num_attention_heads": 7}).field == "num_attention_heads"
    assert refusal(hf_config("Llama-3.1-8B") | {"num_attention_heads": 31}).field == "num_attention_heads"
    # With head_dim given, hidden need not split evenly (transformers allows it).
    uneven = {"num_attention_heads": 31, "num_key_value_heads": 31, "head_dim": 128}
    assert model_from_hf_config(hf_config("Llama-3.1-8B") | uneven, name="x").q_dim == 31 * 128


def test_modelspec_rules_come_back_under_the_hf_key() -> None:
    err = refusal(hf_config("Llama-3.1-8B") | {"num_key_value_heads": 6})
    assert err.field == "num_key_value_heads"
    assert "must divide" in err.rule
    assert refusal(hf_config("gpt2") | {"vocab_size": 10**9}).field == "vocab_size"


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(model=st.sampled_from(sorted(PUBLISHED)), data=st.data())
def test_any_single_bad_value_gives_a_spec_or_an_input_error(model: str, data: st.DataObject) -> None:
    config = hf_config(model)
    key = data.draw(st.sampled_from(sorted(config) + ["head_dim", "n_inner", "attention_bias", "mlp_bias"]))
    config[key] = data.draw(_JSON_VALUES)
    try:
        assert isinstance(model_from_hf_config(config, name="x"), ModelSpec)
    except InputError as err:
        assert "\n" not in str(err)


# ---- the path loader --------------------------------------------------------------------------
def test_load_model_reads_a_config_json_path(tmp_path: Path) -> None:
    path = tmp_path / "my-model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(hf_config("Qwen2-0.5B")))
    m = load_model(str(path))
    assert m.name == "my-model"
    assert params_from_spec(m) == PUBLISHED["Qwen2-0.5B"]


def test_load_model_refuses_malformed_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": 4096,')
    with pytest.raises(InputError, match="not valid JSON"):
        load_model(str(path))


def test_load_model_refuses_json_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(InputError) as caught:
        load_model(str(path))
    assert caught.value.field == "config"


def test_load_model_reads_a_meshplan_yaml() -> None:
    m = load_model(str(DATA / "models" / "custom.yaml"))
    assert m.name == "custom-1b"
    assert (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.head_dim) == (16, 2048, 32, 8, 64)
    assert (m.ffn_hidden, m.vocab_size, m.tied_embeddings) == (8192, 128256, True)
    assert params_from_spec(m) == 1_235_814_400  # meta-llama/Llama-3.2-1B's published total
