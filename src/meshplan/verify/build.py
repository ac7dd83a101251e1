"""The Hugging Face ``transformers`` model for a :class:`~meshplan.specs.model.ModelSpec`.

:func:`hf_config` writes the spec as a ``config.json`` mapping, the inverse of
:func:`meshplan.catalog.hf_config.model_from_hf_config` (a test reads it back and gets the same spec);
:func:`build_model` instantiates the ``*ForCausalLM`` class of that config:

===============================================  ===========  ====================================
ModelSpec                                        model_type   class
===============================================  ===========  ====================================
RoPE, RMSNorm, gated MLP, equal q/k/v and        llama        LlamaForCausalLM
linear biases
RoPE, RMSNorm, gated MLP, q/k/v biases only      qwen2        Qwen2ForCausalLM
learned positions, LayerNorm, 2-matrix MLP,      gpt2         GPT2LMHeadModel
all biases, sequential residual
RoPE, LayerNorm, 2-matrix MLP, all biases        gpt_neox     GPTNeoXForCausalLM
===============================================  ===========  ====================================

Any other combination has no Hugging Face class here and is refused by name.

Where the model is built: ``device="meta"`` (shapes only: nothing is allocated, so a 405B model costs
no memory; FLOPs can be counted there), inside a caller's ``FakeTensorMode`` (fake CPU tensors: the
kernels torch would pick on CPU are dispatched, e.g. SDPA's CPU flash kernel), or ``"cpu"`` for a real
run (the collective counting on gloo). Weights are never loaded: verification needs shapes and
dispatch, not values.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec

#: ModelSpec.mlp -> the activation name each config dialect uses for it
_GATED_ACT = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh"}
_PLAIN_ACT = {"gelu": "gelu_new", "relu": "relu", "relu2": "relu2"}
DROPOUT = 0.1  # the probability written when the spec trains with dropout (GPT-2's default)


def model_type(model: ModelSpec) -> str:
    """The Hugging Face ``model_type`` whose class has exactly ``model``'s parameters."""
    extras = [what for what, on in (("experts", model.is_moe), ("MLA", model.is_mla), ("q/k norms", model.qk_norm),
                                    ("four norms per layer", model.norms_per_layer == 4)) if on]
    if extras:
        raise InputError("model", f"'{model.name}' has {', '.join(extras)}: meshplan verify builds dense llama, qwen2, gpt2 and gpt_neox models")
    if model.position == "rope" and model.norm == "rmsnorm" and model.gated_mlp and not model.parallel_residual:
        if model.qkv_bias == model.linear_bias:
            return "llama"
        if model.qkv_bias and not model.linear_bias:
            return "qwen2"
    if model.position == "learned" and model.norm == "layernorm" and not model.gated_mlp:
        if model.qkv_bias and model.linear_bias and not model.parallel_residual and model.n_kv_heads == model.n_heads:
            return "gpt2"
    if model.position == "rope" and model.norm == "layernorm" and not model.gated_mlp:
        if model.qkv_bias and model.linear_bias and model.n_kv_heads == model.n_heads:
            return "gpt_neox"
    raise InputError(
        "model",
        f"'{model.name}' ({model.position} positions, {model.norm}, {model.mlp} MLP, "
        f"qkv_bias={model.qkv_bias}, linear_bias={model.linear_bias}, parallel_residual={model.parallel_residual}) "
        "matches no Hugging Face class meshplan verify builds (llama, qwen2, gpt2, gpt_neox)",
    )


def hf_config(model: ModelSpec) -> dict[str, Any]:
    """``model`` as a Hugging Face ``config.json`` mapping (see the module docstring)."""
    kind = model_type(model)
    p = DROPOUT if model.dropout else 0.0
    if kind in ("gpt2", "gpt_neox") and model.head_dim * model.n_heads != model.hidden:
        raise InputError("model", f"{kind} needs head_dim x n_heads = hidden ({model.head_dim} x {model.n_heads} != {model.hidden})")
    if kind in ("llama", "qwen2"):
        cfg: dict[str, Any] = {
            "num_hidden_layers": model.n_layers,
            "hidden_size": model.hidden,
            "num_attention_heads": model.n_heads,
            "num_key_value_heads": model.n_kv_heads,
            "head_dim": model.head_dim,
            "intermediate_size": model.ffn_hidden,
            "vocab_size": model.vocab_size,
            "max_position_embeddings": model.max_position,
            "hidden_act": _GATED_ACT[model.mlp],
            "tie_word_embeddings": model.tied_embeddings,
            "attention_dropout": p,
        }
        if kind == "llama":
            cfg |= {"attention_bias": model.qkv_bias, "mlp_bias": model.linear_bias}
    elif kind == "gpt2":
        cfg = {
            "n_layer": model.n_layers,
            "n_embd": model.hidden,
            "n_head": model.n_heads,
            "n_inner": model.ffn_hidden,
            "vocab_size": model.vocab_size,
            "n_positions": model.max_position,
            "activation_function": _PLAIN_ACT[model.mlp],
            "tie_word_embeddings": model.tied_embeddings,
            "resid_pdrop": p,
            "embd_pdrop": p,
            "attn_pdrop": p,
        }
    else:  # gpt_neox
        cfg = {
            "num_hidden_layers": model.n_layers,
            "hidden_size": model.hidden,
            "num_attention_heads": model.n_heads,
            "intermediate_size": model.ffn_hidden,
            "vocab_size": model.vocab_size,
            "max_position_embeddings": model.max_position,
            "hidden_act": "gelu" if model.mlp == "gelu" else model.mlp,
            "tie_word_embeddings": model.tied_embeddings,
            "use_parallel_residual": model.parallel_residual,
            "attention_bias": True,
            "attention_dropout": p,
            "hidden_dropout": p,
        }
    return {"model_type": kind, **cfg}


def build_model(model: ModelSpec, *, device: Any = "meta", attn: str = "sdpa", dtype: Any = None):
    """The ``*ForCausalLM`` module of ``model``, in training mode, built on ``device`` (``"meta"``,
    ``"cpu"``, or ``None`` to build wherever the caller's mode puts it, e.g. under FakeTensorMode),
    with attention implementation ``attn`` (``"sdpa"`` or ``"eager"``) and parameters of ``dtype``
    (default fp32)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(hf_config(model))
    kind = cfg.pop("model_type")
    config = AutoConfig.for_model(kind, **cfg)
    config._attn_implementation = attn
    dtype = dtype or torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        if device is None:
            net = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
        else:
            with torch.device(device):
                net = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    finally:
        torch.set_default_dtype(old)
    net.train()
    return net


def parts(net) -> dict[str, Any]:
    """The pieces of a built model meshplan's cost model names: ``embed`` (token embedding),
    ``positions`` (learned position embedding or None), ``layers`` (ModuleList), ``norm`` (final
    norm), ``head`` (LM head), ``rotary`` (RoPE module or None), ``base`` (the decoder without head),
    ``drop`` (embedding dropout or None)."""
    base = net.base_model
    if hasattr(base, "embed_tokens"):  # llama, qwen2
        return {"base": base, "embed": base.embed_tokens, "positions": None, "layers": base.layers, "norm": base.norm,
                "head": net.lm_head, "rotary": base.rotary_emb, "drop": None}
    if hasattr(base, "wte"):  # gpt2
        return {"base": base, "embed": base.wte, "positions": base.wpe, "layers": base.h, "norm": base.ln_f,
                "head": net.lm_head, "rotary": None, "drop": base.drop}
    return {"base": base, "embed": base.embed_in, "positions": None, "layers": base.layers,  # gpt_neox
            "norm": base.final_layer_norm, "head": net.embed_out, "rotary": base.rotary_emb, "drop": base.emb_dropout}
