"""Read a Hugging Face ``config.json`` into a :class:`~meshplan.specs.model.ModelSpec`.

Supported ``model_type`` values: ``gpt2``, ``gpt_neox``, ``llama``, ``mistral``, ``qwen2``,
``nemotron`` (Nemotron-4 and Minitron, ``NemotronForCausalLM``), the
mixture-of-experts ``mixtral``, ``qwen2_moe``, ``qwen3_moe`` and ``deepseek_v3`` (MLA), and
``gemma2``, ``gemma3_text`` and ``gemma3`` (whose ``text_config`` is read: meshplan plans the
language model, not the vision tower). Any other value (``t5``, ``bert``...) is refused by name,
not guessed at.

Where the keys go (*a* = attention heads, *h* = hidden size; a default in parentheses applies
when the key is absent or ``null``, as in ``transformers``):

=================  ============================  ============================  =============================
ModelSpec field    llama / mistral / qwen2       gpt2                          gpt_neox
=================  ============================  ============================  =============================
n_layers           num_hidden_layers             n_layer                       num_hidden_layers
hidden             hidden_size                   n_embd                        hidden_size
n_heads            num_attention_heads           n_head                        num_attention_heads
n_kv_heads         num_key_value_heads (a)       = n_head                      = num_attention_heads
head_dim           head_dim (h / a)              = n_embd / n_head             = hidden_size / heads
ffn_hidden         intermediate_size             n_inner (4·n_embd)            intermediate_size
vocab_size         vocab_size                    vocab_size                    vocab_size
max_position       max_position_embeddings       n_positions                   max_position_embeddings
mlp                hidden_act (silu): silu →     activation_function           hidden_act (gelu):
                   swiglu, gelu family → geglu   (gelu_new): gelu family →     gelu family → gelu,
                                                 gelu, relu → relu,            relu → relu,
                                                 relu2 → relu2                 relu2 → relu2
norm               rmsnorm                       layernorm                     layernorm
position           rope                          learned                       rope
tied_embeddings    tie_word_embeddings (false)   tie_word_embeddings (true)    tie_word_embeddings (false)
qkv_bias           llama: attention_bias         true                          attention_bias (true), which
                   (false); mistral: false;                                    must be true
                   qwen2: true
linear_bias        llama: attention_bias, which  true                          true
                   must equal mlp_bias (false);
                   mistral, qwen2: false
parallel_residual  false                         false                         use_parallel_residual (true)
dropout            attention_dropout (0) > 0     any of resid_pdrop,           attention_dropout (0) or
                                                 embd_pdrop, attn_pdrop        hidden_dropout (0) > 0
                                                 (0.1 each) > 0
=================  ============================  ============================  =============================

Shape keys (layers, width, heads, MLP width, vocabulary, positions) are required: a config
without them is not a real model's, and filling in a library default would give a plausible
but wrong size. Llama's ``attention_bias`` covers q, k, v *and* the output projection and
``mlp_bias`` the three MLP matrices; ModelSpec has one switch for q/k/v (``qkv_bias``) and one
for the output projection plus the MLP (``linear_bias``), so a Llama config whose two keys
differ is refused, and so is a GPT-NeoX config with ``attention_bias: false`` (its MLP keeps
its biases). A GPT-2 config with ``add_cross_attention: true`` is refused: cross-attention
belongs to encoder-decoder models.

The other types read the Llama keys above (mixtral and the Gemmas with Mistral's fixed biases:
none) plus:

=========================  ===========================  ===========================  ==========================  =========================
ModelSpec field            mixtral                      qwen2_moe / qwen3_moe        deepseek_v3                 gemma2 / gemma3_text
=========================  ===========================  ===========================  ==========================  =========================
n_experts                  num_local_experts            num_experts                  n_routed_experts            --
experts_per_token          num_experts_per_tok          num_experts_per_tok          num_experts_per_tok         --
expert_ffn_hidden          intermediate_size            moe_intermediate_size        moe_intermediate_size       --
shared_expert_ffn_hidden   --                           qwen2_moe:                   moe_intermediate_size x     --
                                                        shared_expert_intermediate   n_shared_experts (0)
                                                        _size, with its gate
dense_layers               --                           mlp_only_layers ([]) and     first_k_dense_replace (0)
                                                        (i+1) % decoder_sparse_step  first layers
                                                        (1) != 0
qkv_bias                   false                        qwen2_moe: qkv_bias (true);  false                       false
                                                        qwen3_moe: false
qk_norm                    false                        qwen3_moe: true              false                       gemma3_text: true
MLA                        --                           --                           q_lora_rank (none),         --
                                                                                     kv_lora_rank,
                                                                                     qk_rope_head_dim,
                                                                                     qk_nope_head_dim,
                                                                                     v_head_dim
norms_per_layer            2                            2                            2                           4
head_dim                   head_dim (h / a)             head_dim (h / a)             qk_nope + qk_rope           head_dim (required)
mlp                        hidden_act (silu)            hidden_act (silu)            hidden_act (silu)           hidden_activation
                                                                                                                 (gelu_pytorch_tanh)
tied_embeddings            tie_word_embeddings (false)  tie_word_embeddings (false)  tie_word_embeddings (false) tie_word_embeddings (true)
=========================  ===========================  ===========================  ==========================  =========================

``nemotron`` (``NemotronForCausalLM``, ``transformers`` ``models/nemotron``) reads the Llama keys
with three differences: the MLP is *not* gated (``up_proj`` -> act -> ``down_proj``, two matrices of
h × f; ``hidden_act`` defaults to ``relu2``, squared ReLU, and takes the GPT-2 / GPT-NeoX table),
the norms are Nemotron's LayerNorm1P (``nn.LayerNorm`` applied with weight + 1: a weight *and* a bias
of h each, so ``norm`` = layernorm, 2h per norm), and the head dimension is ``head_dim`` or h / a
(``transformers`` ignores NeMo's ``kv_channels``, so a ``kv_channels`` that disagrees with that head
dimension is refused rather than guessed between). ``partial_rotary_factor`` (0.5 in every published
Nemotron-4 / Minitron config: RoPE on half of each head) must be in (0, 1] and is otherwise ignored
like ``rotary_pct``: rotation is elementwise work, not a matmul or a parameter.
``attention_bias`` / ``mlp_bias`` follow Llama's rule (they must be equal).

``attention_bias`` must be false for qwen3_moe, deepseek_v3 and the Gemmas (their biases would
sit on the attention projections only, which ModelSpec's two switches cannot express, and no
published model sets it); deepseek_v3 ignores ``num_key_value_heads`` and ``head_dim`` (MLA
derives both). Gemma 3's published ``config.json`` files leave ``vocab_size`` (262,208) and
``max_position_embeddings`` (131,072) of their ``text_config`` to ``transformers``' defaults,
which are applied. Also ignored: the router's settings (``norm_topk_prob``, ``n_group``,
``topk_group``, ``routed_scaling_factor``, ``router_aux_loss_coef``, ``router_jitter_noise``),
DeepSeek's multi-token-prediction module (``num_nextn_predict_layers``: ``transformers`` does not
build it), Gemma's soft-capping and ``query_pre_attn_scalar``, and sliding-window patterns
(``layer_types``, ``sliding_window_pattern``).

Ignored keys, because they change no parameter shape and, at the planned sequence length, no
training FLOP that meshplan counts: ``rope_theta``, ``rope_scaling`` and ``rotary_emb_base``
(RoPE frequencies: elementwise work, not matmuls), ``rotary_pct`` (how many of each head's
dimensions rotate), ``sliding_window``, ``use_sliding_window`` and ``max_window_layers``
(meshplan counts full causal attention, which is exact while the planned sequence fits in the
window and an upper bound on the attention-score FLOPs beyond it), norm epsilons,
``initializer_range``, ``torch_dtype``, token ids, ``use_cache``, ``pretraining_tp``, GPT-2's
``n_ctx`` and attention-scaling switches, and the legacy GPT-NeoX keys
``attention_probs_dropout_prob`` / ``hidden_dropout_prob``, which ``transformers`` never reads.
Every key the mapping does read is type-checked, and a refusal names the Hugging Face key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshplan.bounded_parse import brief
from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec

#: Activation names of the GeLU family in ``transformers.activations.ACT2FN``.
_GELU_ACTS = frozenset(
    {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate", "gelu_10", "quick_gelu"}
)
#: Llama-style MLPs are always gated: act(gate(x)) * up(x).
_GATED_MLP = {"silu": "swiglu", "swish": "swiglu"} | dict.fromkeys(_GELU_ACTS, "geglu")
#: GPT-2 / GPT-NeoX MLPs are two plain matrices around the activation.
_PLAIN_MLP = dict.fromkeys(_GELU_ACTS, "gelu") | {"relu": "relu", "relu2": "relu2"}

#: ModelSpec field -> the Hugging Face key it is read from, per key dialect.
_LLAMA_KEYS = {
    "n_layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "ffn_hidden": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_position": "max_position_embeddings",
}
_GPT2_KEYS = {
    "n_layers": "n_layer",
    "hidden": "n_embd",
    "n_heads": "n_head",
    "ffn_hidden": "n_inner",
    "vocab_size": "vocab_size",
    "max_position": "n_positions",
}
_NEOX_KEYS = {
    "n_layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "n_heads": "num_attention_heads",
    "ffn_hidden": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_position": "max_position_embeddings",
}

#: ModelSpec fields outside the shape dialects -> the Hugging Face key most configs use.
_OTHER_KEYS = {"experts_per_token": "num_experts_per_tok", "expert_ffn_hidden": "moe_intermediate_size"}

#: model_type -> (default hidden_act, activation table) where it is not Llama's gated (silu, _GATED_MLP).
_ACTIVATIONS = {"nemotron": ("relu2", _PLAIN_MLP)}

#: (qkv_bias, linear_bias) for the Llama-like types whose biases are fixed by the architecture.
_FIXED_BIASES = {"mistral": (False, False), "qwen2": (True, False)}


class _Config:
    """Typed reads from a ``config.json`` mapping; each refusal names the Hugging Face key.

    An absent key and a JSON ``null`` mean the same thing, as in ``transformers``: the default.
    """

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self._raw = raw

    @property
    def raw(self) -> Mapping[str, Any]:
        return self._raw

    def optional_count(self, key: str) -> int | None:
        """A positive integer, or None when the key is absent or null."""
        value = self._raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(key, f"must be a positive integer (got {brief(value)})")
        return value

    def count(self, key: str) -> int:
        """A required positive integer."""
        value = self.optional_count(key)
        if value is None:
            raise InputError(key, "is required")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self._raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InputError(key, f"must be true or false (got {brief(value)})")
        return value

    def probability(self, key: str, default: float) -> float:
        value = self._raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise InputError(key, f"must be a probability between 0 and 1 (got {brief(value)})")
        return float(value)

    def any_positive(self, keys: tuple[str, ...], default: float) -> bool:
        """Whether any of these probabilities is above zero (all of them are checked)."""
        return any([self.probability(key, default) > 0 for key in keys])

    def activation(self, key: str, default: str, table: Mapping[str, str]) -> str:
        """The ModelSpec ``mlp`` kind for the activation named under ``key``."""
        value = self._raw.get(key)
        if value is None:
            value = default
        if not isinstance(value, str) or value not in table:
            raise InputError(key, f"{brief(value)} is not supported here (supported: {', '.join(sorted(table))})")
        return table[value]


def _split_heads(keys: Mapping[str, str], hidden: int, heads: int) -> int:
    """The head dimension h / a, refused unless exact."""
    if hidden % heads:
        raise InputError(keys["n_heads"], f"must divide {keys['hidden']} ({hidden}) exactly (got {heads})")
    return hidden // heads


def _shape(cfg: _Config, keys: Mapping[str, str]) -> dict[str, int]:
    """The integer fields every supported type reads the same way (through its own key names)."""
    return {field: cfg.count(keys[field]) for field in ("n_layers", "hidden", "n_heads", "vocab_size", "max_position")}


def _llama_like(cfg: _Config, keys: Mapping[str, str], model_type: str) -> dict[str, Any]:
    """Llama, Mistral and Qwen2: gated MLP, RMSNorm, RoPE, GQA; they differ only in biases
    (Nemotron reads the same keys with its own activation table, see :func:`_nemotron`)."""
    shape = _shape(cfg, keys)
    hidden, heads = shape["hidden"], shape["n_heads"]
    if model_type in _FIXED_BIASES:
        qkv_bias, linear_bias = _FIXED_BIASES[model_type]
    else:
        qkv_bias = cfg.flag("attention_bias", False)
        linear_bias = cfg.flag("mlp_bias", False)
        if qkv_bias != linear_bias:
            raise InputError(
                "mlp_bias",
                f"must equal attention_bias ({str(qkv_bias).lower()}): attention_bias also covers the "
                "output projection, which meshplan counts together with the MLP biases (linear_bias)",
            )
    return shape | {
        "n_kv_heads": cfg.optional_count(keys["n_kv_heads"]) or heads,
        "head_dim": cfg.optional_count(keys["head_dim"]) or _split_heads(keys, hidden, heads),
        "ffn_hidden": cfg.count(keys["ffn_hidden"]),
        "mlp": cfg.activation("hidden_act", *_ACTIVATIONS.get(model_type, ("silu", _GATED_MLP))),
        "norm": "rmsnorm",
        "position": "rope",
        "tied_embeddings": cfg.flag("tie_word_embeddings", False),
        "qkv_bias": qkv_bias,
        "linear_bias": linear_bias,
        "dropout": cfg.probability("attention_dropout", 0.0) > 0,
    }


def _gpt2(cfg: _Config, keys: Mapping[str, str], model_type: str) -> dict[str, Any]:
    """GPT-2: learned positions, LayerNorm, biases on every linear, lm_head tied to wte."""
    if cfg.flag("add_cross_attention", False):
        raise InputError("add_cross_attention", "must be false: meshplan plans decoder-only models")
    shape = _shape(cfg, keys)
    hidden, heads = shape["hidden"], shape["n_heads"]
    return shape | {
        "n_kv_heads": heads,
        "head_dim": _split_heads(keys, hidden, heads),
        "ffn_hidden": cfg.optional_count(keys["ffn_hidden"]) or 4 * hidden,
        "mlp": cfg.activation("activation_function", "gelu_new", _PLAIN_MLP),
        "norm": "layernorm",
        "position": "learned",
        "tied_embeddings": cfg.flag("tie_word_embeddings", True),
        "qkv_bias": True,
        "linear_bias": True,
        "dropout": cfg.any_positive(("resid_pdrop", "embd_pdrop", "attn_pdrop"), default=0.1),
    }


def _gpt_neox(cfg: _Config, keys: Mapping[str, str], model_type: str) -> dict[str, Any]:
    """GPT-NeoX / Pythia: RoPE, LayerNorm, biases everywhere, parallel residual by default."""
    if not cfg.flag("attention_bias", True):
        raise InputError(
            "attention_bias",
            "must be true: without it GPT-NeoX drops the attention biases but keeps the MLP ones, "
            "a split meshplan's linear_bias cannot express",
        )
    shape = _shape(cfg, keys)
    hidden, heads = shape["hidden"], shape["n_heads"]
    return shape | {
        "n_kv_heads": heads,
        "head_dim": _split_heads(keys, hidden, heads),
        "ffn_hidden": cfg.count(keys["ffn_hidden"]),
        "mlp": cfg.activation("hidden_act", "gelu", _PLAIN_MLP),
        "norm": "layernorm",
        "position": "rope",
        "tied_embeddings": cfg.flag("tie_word_embeddings", False),
        "qkv_bias": True,
        "linear_bias": True,
        "parallel_residual": cfg.flag("use_parallel_residual", True),
        "dropout": cfg.any_positive(("attention_dropout", "hidden_dropout"), default=0.0),
    }


def _nemotron(cfg: _Config, keys: Mapping[str, str], model_type: str) -> dict[str, Any]:
    """Nemotron-4 / Minitron: Llama's keys, a plain (not gated) squared-ReLU MLP, LayerNorm1P
    (weight and bias), partial RoPE; ``kv_channels`` must agree with the head dimension."""
    fields = _llama_like(cfg, keys, model_type)
    kv_channels = cfg.optional_count("kv_channels")
    if kv_channels is not None and kv_channels != fields["head_dim"]:
        raise InputError(
            "kv_channels",
            f"({kv_channels}) must equal the head dimension transformers uses, head_dim or hidden_size / "
            f"num_attention_heads ({fields['head_dim']}): transformers ignores kv_channels",
        )
    if cfg.probability("partial_rotary_factor", 0.5) == 0:
        raise InputError("partial_rotary_factor", "must be above 0 and at most 1 (got 0)")
    return fields | {"norm": "layernorm"}


def _no_attention_bias(cfg: _Config, model_type: str) -> None:
    if cfg.flag("attention_bias", False):
        raise InputError("attention_bias", f"must be false for {model_type}: biases on the attention projections alone are not modelled")


def _moe_common(cfg: _Config, experts_key: str, ffn_key: str) -> dict[str, Any]:
    return {
        "n_experts": cfg.count(experts_key),
        "experts_per_token": cfg.count("num_experts_per_tok"),
        "expert_ffn_hidden": cfg.count(ffn_key),
    }


def _mixtral(cfg: _Config, keys: Mapping[str, str], model_type: str) -> dict[str, Any]:
    """Mixtral: Mistral's attention, every MLP a mixture of E experts of width f, no shared one."""
    return _llama_like(cfg, keys, "mistral") | _moe_common(cfg, "num_local_experts", "intermediate_size")


def _layer_list(cfg: _Config, key: str, n_layers: int) -> list[int]:
    value = cfg.raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers for i in value):
        raise InputError(key, f"must be a list of layer indices between 0 and {n_layers - 1} (got {brief(value)})")
    return value


def _qwen_moe(cfg: _Config, keys: Mapping[str, str], model_type: str) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE: a layer i is MoE unless listed in mlp_only_layers or
    (i + 1) % decoder_sparse_step != 0; Qwen2-MoE adds a gated shared expert, Qwen3-MoE q/k norms."""
    if model_type == "qwen3_moe":
        _no_attention_bias(cfg, model_type)
    fields = _llama_like(cfg, keys, "qwen2" if model_type == "qwen2_moe" else "mistral")
    if model_type == "qwen2_moe":
        fields["qkv_bias"] = cfg.flag("qkv_bias", True)
    fields |= _moe_common(cfg, "num_experts", "moe_intermediate_size")
    n = fields["n_layers"]
    step = cfg.optional_count("decoder_sparse_step") or 1
    only = set(_layer_list(cfg, "mlp_only_layers", n))
    fields["dense_layers"] = tuple(i for i in range(n) if i in only or (i + 1) % step)
    if model_type == "qwen2_moe":
        fields["shared_expert_ffn_hidden"] = cfg.count("shared_expert_intermediate_size")
        fields["shared_expert_gate"] = True
    else:
        fields["qk_norm"] = True
    return fields


def _deepseek_v3(cfg: _Config, keys: Mapping[str, str], model_type: str) -> dict[str, Any]:
    """DeepSeek-V3: MLA attention, first_k_dense_replace dense layers, then MoE layers with
    n_shared_experts shared experts of the routed experts' width."""
    _no_attention_bias(cfg, model_type)
    shape = _shape(cfg, keys)
    nope, rope = cfg.count("qk_nope_head_dim"), cfg.count("qk_rope_head_dim")
    first_dense = cfg.optional_count("first_k_dense_replace") or 0
    if first_dense > shape["n_layers"]:
        raise InputError("first_k_dense_replace", f"must not exceed num_hidden_layers ({shape['n_layers']})")
    f_e = cfg.count("moe_intermediate_size")
    return shape | _moe_common(cfg, "n_routed_experts", "moe_intermediate_size") | {
        "n_kv_heads": shape["n_heads"],
        "head_dim": nope + rope,
        "ffn_hidden": cfg.count(keys["ffn_hidden"]),
        "mlp": cfg.activation("hidden_act", "silu", _GATED_MLP),
        "tied_embeddings": cfg.flag("tie_word_embeddings", False),
        "dropout": cfg.probability("attention_dropout", 0.0) > 0,
        "shared_expert_ffn_hidden": f_e * (cfg.optional_count("n_shared_experts") or 0),
        "dense_layers": tuple(range(first_dense)),
        "q_lora_rank": cfg.optional_count("q_lora_rank") or 0,
        "kv_lora_rank": cfg.count("kv_lora_rank"),
        "qk_rope_head_dim": rope,
        "v_head_dim": cfg.count("v_head_dim"),
    }


def _gemma(cfg: _Config, keys: Mapping[str, str], model_type: str) -> dict[str, Any]:
    """Gemma 2 / Gemma 3 text: GeGLU MLP, four RMSNorms per layer, tied embeddings by default,
    an explicit head_dim; Gemma 3 adds q/k norms."""
    _no_attention_bias(cfg, model_type)
    fields = _llama_like(cfg, keys, "mistral")
    return fields | {
        "head_dim": cfg.count("head_dim"),
        "mlp": cfg.activation("hidden_activation", "gelu_pytorch_tanh", _GATED_MLP),
        "tied_embeddings": cfg.flag("tie_word_embeddings", True),
        "norms_per_layer": 4,
        "qk_norm": model_type == "gemma3_text",
    }


#: transformers' Gemma3TextConfig defaults for the keys Gemma 3's published configs omit.
_GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262_208, "max_position_embeddings": 131_072}


_Reader = Callable[[_Config, Mapping[str, str], str], dict[str, Any]]

#: model_type -> (reader, ModelSpec field -> Hugging Face key).
_TYPES: dict[str, tuple[_Reader, Mapping[str, str]]] = {
    "gpt2": (_gpt2, _GPT2_KEYS),
    "gpt_neox": (_gpt_neox, _NEOX_KEYS),
    "llama": (_llama_like, _LLAMA_KEYS),
    "mistral": (_llama_like, _LLAMA_KEYS),
    "qwen2": (_llama_like, _LLAMA_KEYS),
    "nemotron": (_nemotron, _LLAMA_KEYS),
    "mixtral": (_mixtral, _LLAMA_KEYS),
    "qwen2_moe": (_qwen_moe, _LLAMA_KEYS),
    "qwen3_moe": (_qwen_moe, _LLAMA_KEYS),
    "deepseek_v3": (_deepseek_v3, _LLAMA_KEYS),
    "gemma2": (_gemma, _LLAMA_KEYS),
    "gemma3_text": (_gemma, _LLAMA_KEYS),
}


def supported_model_types() -> list[str]:
    """The ``model_type`` values :func:`model_from_hf_config` reads, sorted."""
    return sorted([*_TYPES, "gemma3"])


def _gemma3_text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's config inside a multimodal Gemma 3 ``config.json``."""
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise InputError("text_config", "is required for model_type gemma3 (a JSON object of the language model's keys)")
    out = _GEMMA3_TEXT_DEFAULTS | {k: v for k, v in text.items() if v is not None}
    out["model_type"] = "gemma3_text"
    return out


def model_from_hf_config(config: Any, name: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` mapping (see the module docstring).

    Raises :class:`~meshplan.errors.InputError` naming the offending Hugging Face key.
    """
    if not isinstance(config, Mapping):
        raise InputError("config", f"must be a JSON object of Hugging Face config keys (got {type(config).__name__})")
    model_type = config.get("model_type")
    if model_type is None:
        raise InputError("model_type", "is required (it names the architecture)")
    if not isinstance(model_type, str):
        raise InputError("model_type", f"must be a string (got {brief(model_type)})")
    if model_type == "gemma3":
        config = _gemma3_text_config(config)
    elif model_type == "gemma3_text":
        config = _GEMMA3_TEXT_DEFAULTS | {k: v for k, v in config.items() if v is not None}
    if model_type not in _TYPES and model_type != "gemma3":
        raise InputError("model_type", f"'{model_type}' is not supported (supported: {', '.join(supported_model_types())})")
    read, keys = _TYPES[config["model_type"]]
    fields = read(_Config(config), keys, config["model_type"])
    try:
        return ModelSpec.build(
            name=name or model_type, source=f"Hugging Face config.json (model_type {model_type})", **fields
        )
    except InputError as exc:
        # Bounds ModelSpec still checks (absurd sizes, n_kv_heads dividing n_heads) come back under
        # ModelSpec's field names, or "input" for the cross-field rule: report the key the user wrote.
        field = exc.field
        if field == "input":  # a cross-field rule: its message starts with the field it is about
            first = exc.rule.split(" ", 1)[0]
            field = first if first in ModelSpec.model_fields else "n_kv_heads"
        raise InputError(keys.get(field) or _OTHER_KEYS.get(field, field), exc.rule) from None
