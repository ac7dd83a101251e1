"""Hugging Face ``nemotron`` configs (``NemotronForCausalLM``) against the catalog's Nemotron-4.

Fixtures: ``tests/data/hf/Nemotron-4-340B-Base`` and ``Nemotron-4-15B``. Their keys are exactly the
ones NVIDIA's converter writes for the published Hugging Face Nemotron-4 / Minitron checkpoints
(NVIDIA/NeMo ``scripts/checkpoint_converters/convert_nemotron_nemo_to_hf.py``, ``convert_hf_config``,
whose template is ``nvidia/Minitron-8B-Base``: ``relu2`` for NeMo's ``squared-relu``,
``partial_rotary_factor`` from ``rotary_percentage``, ``norm_eps``, ``tie_word_embeddings: false``,
``transformers_version`` "4.32.0.dev0"), with the values of the Nemotron-4 papers (340B: arXiv
2406.11704 Table 1; 15B: arXiv 2402.16819 Sec. 2) and NeMo's model configs (init_method_std, bos 2,
eos 3). NVIDIA publishes Nemotron-4 itself as NeMo checkpoints; the published Hugging Face
``config.json`` files were not readable from this project's reference library, so the fixtures are
the converter's output for those models, not downloaded copies.

The parameter counts are checked against the catalog entries ``nemotron4-15b`` / ``nemotron4-340b``
(whose totals tests/test_params.py derives from the papers) and against an independent count over
``transformers``' module layout (NemotronForCausalLM: q/k/v/o_proj, up_proj and down_proj, two
LayerNorm1P of weight + bias per layer, a final one, untied lm_head).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meshplan.catalog import load_model
from meshplan.catalog.hf_config import model_from_hf_config
from meshplan.cost.params import count_params
from meshplan.errors import InputError

HF = Path(__file__).parent / "data" / "hf"
CATALOG = {"Nemotron-4-340B-Base": "nemotron4-340b", "Nemotron-4-15B": "nemotron4-15b"}


def config(model: str) -> dict[str, Any]:
    return json.loads((HF / model / "config.json").read_text())


def transformers_count(c: dict[str, Any]) -> int:
    """NemotronForCausalLM's parameters, from the raw keys (not meshplan's mapping)."""
    h, f, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    a, g = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // a
    attention = h * a * d + 2 * h * g * d + a * d * h
    mlp = 2 * h * f  # up_proj, down_proj: not gated
    layernorm1p = 2 * h  # nn.LayerNorm weight and bias
    return V * h + L * (attention + mlp + 2 * layernorm1p) + layernorm1p + V * h


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_config_json_counts_exactly_the_catalog_model(model: str) -> None:
    spec = load_model(str(HF / model / "config.json"))
    catalog = load_model(CATALOG[model])
    assert spec.source == "Hugging Face config.json (model_type nemotron)"
    assert count_params(spec) == count_params(catalog)
    assert count_params(spec).total == transformers_count(config(model))
    shape = ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden", "vocab_size", "mlp", "norm",
             "position", "tied_embeddings", "qkv_bias", "linear_bias", "max_position")
    assert {k: getattr(spec, k) for k in shape} == {k: getattr(catalog, k) for k in shape}


def test_340b_total() -> None:
    # 96 x (attention 2·18432·96·192 + 2·18432·8·192, MLP 2·18432·73728, norms 4·18432)
    # + 2 x 256,000 x 18,432 (untied) + 2 x 18,432 (final LayerNorm1P): 9.4B + 331.6B, Table 1
    h = 18432
    expected = 96 * (2 * h * 96 * 192 + 2 * h * 8 * 192 + 2 * h * 73728 + 4 * h) + 2 * 256000 * h + 2 * h
    assert expected == 341_029_195_776
    assert count_params(load_model(str(HF / "Nemotron-4-340B-Base" / "config.json"))).total == expected


def test_cli_estimates_the_config_json_as_the_catalog_model() -> None:
    from test_cli import run_json

    flags = ("--gpu", "h100-sxm-80gb", "--gpus", "64", "--tp", "8", "--pp", "2", "--global-batch", "64")
    from_file = run_json("--model", str(HF / "Nemotron-4-15B" / "config.json"), *flags)
    from_catalog = run_json("--model", "nemotron4-15b", *flags)
    assert from_file["model"].pop("name") == "Nemotron-4-15B" and from_catalog["model"].pop("name") == "nemotron4-15b"
    assert from_file["model"] == from_catalog["model"]
    assert from_file["model"]["params_total"] == count_params(load_model("nemotron4-15b")).total == 15_628_775_424
    assert from_file["time"] == from_catalog["time"] and from_file["memory"] == from_catalog["memory"]


def test_activation_defaults_to_squared_relu_and_plain_table() -> None:
    c = config("Nemotron-4-15B")
    del c["hidden_act"]
    assert model_from_hf_config(c, name="x").mlp == "relu2"
    assert model_from_hf_config(c | {"hidden_act": "gelu"}, name="x").mlp == "gelu"  # not geglu: no gate
    with pytest.raises(InputError) as caught:
        model_from_hf_config(c | {"hidden_act": "silu"}, name="x")  # a gated SiLU is not NemotronMLP
    assert caught.value.field == "hidden_act"


def test_kv_channels_must_agree_with_head_dim() -> None:
    c = config("Nemotron-4-15B")
    assert model_from_hf_config(c | {"kv_channels": 128}, name="x").head_dim == 128
    # Minitron-8B's shape: 48 heads of 128 on a 4,096 width, which needs head_dim (kv_channels is NeMo's)
    minitron = c | {"hidden_size": 4096, "intermediate_size": 16384, "head_dim": 128, "kv_channels": 128}
    assert model_from_hf_config(minitron, name="x").q_dim == 48 * 128
    with pytest.raises(InputError) as caught:
        model_from_hf_config(c | {"kv_channels": 64}, name="x")
    assert caught.value.field == "kv_channels" and "\n" not in str(caught.value)


@pytest.mark.parametrize("key,value", [("partial_rotary_factor", 0), ("partial_rotary_factor", 1.5),
                                       ("partial_rotary_factor", "half"), ("mlp_bias", True), ("norm_eps", None)])
def test_bad_keys_are_named(key: str, value: Any) -> None:
    c = config("Nemotron-4-15B") | {key: value}
    if key == "norm_eps":  # ignored like every epsilon
        assert model_from_hf_config(c, name="x").norm == "layernorm"
        return
    with pytest.raises(InputError) as caught:
        model_from_hf_config(c, name="x")
    assert caught.value.field == key


def test_biases_follow_llamas_rule() -> None:
    m = model_from_hf_config(config("Nemotron-4-15B") | {"attention_bias": True, "mlp_bias": True}, name="x")
    assert m.qkv_bias and m.linear_bias
