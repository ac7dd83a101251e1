"""Mixture-of-experts, MLA and Gemma configs: meshplan's parameter counts against the
``transformers`` classes instantiated on the meta device (``AutoModelForCausalLM.from_config``),
for small configs of each type and for the real models' published configs (written out here;
nothing is downloaded)."""

from __future__ import annotations

import pytest

from meshplan.catalog import load_model
from meshplan.catalog.hf_config import model_from_hf_config
from meshplan.cost.params import count_params
from meshplan.errors import InputError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

#: Published configs (Hugging Face Hub config.json, the keys that shape the model).
REAL = {
    "Mixtral-8x7B-v0.1": {
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
        "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False,
    },
    "Qwen1.5-MoE-A2.7B": {
        "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,
        "num_key_value_heads": 16, "vocab_size": 151936, "max_position_embeddings": 8192, "num_experts": 60,
        "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
    },
    "Qwen3-30B-A3B": {
        "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "num_experts": 128, "num_experts_per_tok": 8,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False, "attention_bias": False,
    },
    "DeepSeek-V3": {
        "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
        "max_position_embeddings": 163840, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    },
    "gemma-2-9b": {
        "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
        "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
    },
    "gemma-2-27b": {
        "model_type": "gemma2", "hidden_size": 4608, "intermediate_size": 36864, "num_hidden_layers": 46,
        "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "vocab_size": 256000,
        "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh",
    },
    "gemma-3-1b": {
        "model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
        "max_position_embeddings": 32768, "hidden_activation": "gelu_pytorch_tanh",
    },
    # the multimodal config.json: text_config omits vocab_size and max_position_embeddings
    "gemma-3-27b": {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
            "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
        },
    },
}

#: Totals as transformers counts them (sum of numel on the meta device) and the published sizes.
PUBLISHED_TOTAL = {
    "Mixtral-8x7B-v0.1": 46_702_792_704,  # "46.7B total parameters" (Mixtral of Experts, arXiv 2401.04088)
    "DeepSeek-V3": 671_026_404_352,  # "671B total" (arXiv 2412.19437); the Hub's 685B adds the MTP module
    "gemma-2-9b": 9_241_705_984,
    "gemma-2-27b": 27_227_128_320,
    "Qwen3-30B-A3B": 30_532_122_624,  # "30.5B" (Qwen3 technical report)
}
#: Active parameters as published, in billions, and the range that rounding allows: 12.9B
#: (Mixtral paper), "37B" (DeepSeek-V3 report, truncated), 3.3B (Qwen3 report, truncated).
PUBLISHED_ACTIVE_B = {"Mixtral-8x7B-v0.1": (12.85, 12.95), "DeepSeek-V3": (37.0, 38.0), "Qwen3-30B-A3B": (3.3, 3.4)}

#: Small configs of each type, with the features switched on (dense layers, shared experts,
#: q_lora_rank none, odd head_dim, untied Gemma, qkv_bias off).
SMALL = {
    "mixtral": {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 101,
                "max_position_embeddings": 128, "num_local_experts": 5, "num_experts_per_tok": 2},
    "qwen2_moe": {"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 80, "moe_intermediate_size": 24,
                  "shared_expert_intermediate_size": 40, "num_hidden_layers": 5, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 99, "max_position_embeddings": 64, "num_experts": 6,
                  "num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": [3], "qkv_bias": False},
    "qwen3_moe": {"model_type": "qwen3_moe", "hidden_size": 48, "intermediate_size": 72, "moe_intermediate_size": 16,
                  "num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 10,
                  "vocab_size": 77, "max_position_embeddings": 64, "num_experts": 8, "num_experts_per_tok": 3,
                  "mlp_only_layers": [0, 2], "tie_word_embeddings": True},
    "deepseek_v3": {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 112, "moe_intermediate_size": 16,
                    "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 97, "max_position_embeddings": 64,
                    "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
                    "n_group": 2, "topk_group": 1, "q_lora_rank": None, "kv_lora_rank": 24, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 12, "v_head_dim": 20},
    "gemma2": {"model_type": "gemma2", "hidden_size": 40, "intermediate_size": 72, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12, "vocab_size": 83,
               "max_position_embeddings": 64, "tie_word_embeddings": False},
    "gemma3_text": {"model_type": "gemma3_text", "hidden_size": 40, "intermediate_size": 72, "num_hidden_layers": 3,
                    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 83,
                    "max_position_embeddings": 64},
}


def _hf_model(config: dict):
    """The transformers model of ``config`` on the meta device (Gemma 3: its language model)."""
    raw = dict(config)
    if raw["model_type"] == "gemma3":
        raw = dict(raw["text_config"])
    kind = raw.pop("model_type")
    cfg = transformers.AutoConfig.for_model(kind, **raw)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


def _hf_counts(config: dict) -> tuple[int, int]:
    """(total, active) from the instantiated model: active drops (E - k)/E of the routed experts'
    weights (the tensors under ``.experts.``; shared experts are ``shared_expert(s)``)."""
    model = _hf_model(config)
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    cfg = model.config
    e = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None) or getattr(cfg, "n_routed_experts", 0)
    k = getattr(cfg, "num_experts_per_tok", 0) or 0
    return total, (total - routed + routed * k // e if e else total)


@pytest.mark.parametrize("name", sorted(SMALL) + sorted(REAL))
def test_counts_equal_transformers(name):
    config = SMALL.get(name) or REAL[name]
    spec = model_from_hf_config(config, name)
    total, active = _hf_counts(config)
    counts = count_params(spec)
    assert counts.total == total
    assert counts.active == active
    if name in PUBLISHED_TOTAL:
        assert counts.total == PUBLISHED_TOTAL[name]
    if name in PUBLISHED_ACTIVE_B:
        low, high = PUBLISHED_ACTIVE_B[name]
        assert low <= counts.active / 1e9 < high


def test_moe_shapes_read_from_config():
    ds = model_from_hf_config(REAL["DeepSeek-V3"], "ds")
    assert (ds.n_experts, ds.experts_per_token, ds.expert_ffn_hidden, ds.shared_expert_ffn_hidden) == (256, 8, 2048, 2048)
    assert ds.dense_layers == (0, 1, 2) and ds.n_moe_layers == 58
    assert (ds.head_dim, ds.value_head_dim, ds.q_lora_rank, ds.kv_lora_rank, ds.qk_rope_head_dim) == (192, 128, 1536, 512, 64)
    q = model_from_hf_config(SMALL["qwen2_moe"], "q")
    # layer i is MoE when (i + 1) % 2 == 0 and i is not in mlp_only_layers [3]
    assert q.moe_layers == (False, True, False, False, False)
    g = model_from_hf_config(REAL["gemma-3-27b"], "g")
    assert (g.vocab_size, g.max_position, g.norms_per_layer, g.qk_norm, g.tied_embeddings) == (262208, 131072, 4, True, True)


@pytest.mark.parametrize(
    "config, field",
    [
        (REAL["DeepSeek-V3"] | {"attention_bias": True}, "attention_bias"),
        (REAL["DeepSeek-V3"] | {"first_k_dense_replace": 62}, "first_k_dense_replace"),
        (REAL["Mixtral-8x7B-v0.1"] | {"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({k: v for k, v in REAL["Mixtral-8x7B-v0.1"].items() if k != "num_local_experts"}, "num_local_experts"),
        (SMALL["qwen2_moe"] | {"mlp_only_layers": [7]}, "mlp_only_layers"),
        ({k: v for k, v in REAL["gemma-2-9b"].items() if k != "head_dim"}, "head_dim"),
        ({"model_type": "gemma3"}, "text_config"),
    ],
)
def test_bad_moe_configs_name_the_key(config, field):
    with pytest.raises(InputError) as exc:
        model_from_hf_config(config, "bad")
    assert exc.value.field == field


CATALOG = {
    "mixtral-8x7b": "Mixtral-8x7B-v0.1",
    "qwen3-30b-a3b": "Qwen3-30B-A3B",
    "deepseek-v3-671b": "DeepSeek-V3",
    "gemma2-9b": "gemma-2-9b",
    "gemma2-27b": "gemma-2-27b",
    "gemma3-27b": "gemma-3-27b",
}


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_catalog_entries_equal_their_configs(name):
    mine = load_model(name)
    theirs = model_from_hf_config(REAL[CATALOG[name]], name)
    assert count_params(mine).total == count_params(theirs).total
    assert count_params(mine).active_matmul == count_params(theirs).active_matmul
    assert mine.moe_layers == theirs.moe_layers
