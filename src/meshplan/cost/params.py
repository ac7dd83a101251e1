"""Exact parameter counts: per layer, embeddings, total, per pipeline stage and per GPU.

Symbols as in :mod:`meshplan.specs.model` (L, h, a, g, d, f, V, P) and ``t`` for the tensor-parallel
size. Per transformer layer:

* attention weights  ``h·a·d + 2·h·g·d + a·d·h``   (Q, K, V, output projection)
* attention biases   ``a·d + 2·g·d`` if qkv_bias, ``+ h`` for the output projection if linear_bias
* MLP weights        ``3·h·f`` gated (SwiGLU/GeGLU: gate, up, down) or ``2·h·f`` (GeLU/ReLU)
* MLP biases         ``f + h`` (two-matrix MLP) or ``2f + h`` (gated) if linear_bias
* norms              ``2·h`` per norm for LayerNorm (weight and bias), ``h`` for RMSNorm; two norms

Outside the layers: token embedding ``V·h``, learned positions ``P·h``, the final norm, and the LM
head ``V·h`` unless tied to the embedding.

Matmul parameters (the basis of the 6N rule) are the weights of the linear layers, the LM head
included (it is a matmul even when tied); embedding lookups, norms and biases are not matmuls.
Checked against the published totals: Llama 3.1 8B 8,030,261,248; 70B 70,553,706,496;
405B 405,853,388,800.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.specs.model import ModelSpec


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer layer, by part."""

    attention_weights: int
    attention_biases: int
    mlp_weights: int
    mlp_biases: int
    norms: int

    @property
    def matmul(self) -> int:
        return self.attention_weights + self.mlp_weights

    @property
    def total(self) -> int:
        return (
            self.attention_weights + self.attention_biases + self.mlp_weights + self.mlp_biases + self.norms
        )


@dataclass(frozen=True)
class ParamCounts:
    """Whole-model parameter counts."""

    layer: LayerParams
    n_layers: int
    embedding: int  # token embedding V·h
    position_embedding: int  # P·h when learned, else 0
    final_norm: int
    lm_head: int  # V·h when untied, else 0 (shares the embedding)
    lm_head_matmul: int  # V·h always: the LM head GEMM exists even when tied

    @property
    def layers_total(self) -> int:
        return self.layer.total * self.n_layers

    @property
    def total(self) -> int:
        return self.layers_total + self.embedding + self.position_embedding + self.final_norm + self.lm_head

    @property
    def matmul(self) -> int:
        """Weights of every matmul, the LM head included: the N of the 6·N·tokens rule."""
        return self.layer.matmul * self.n_layers + self.lm_head_matmul

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.position_embedding - self.lm_head


def layer_matmuls(model: ModelSpec) -> list[tuple[str, int, int]]:
    """The layer's weight matmuls in forward order as (name, input width, output width), with
    separate q, k, v projections as Hugging Face and torchtitan write them: q, k, v, o, then
    gate, up, down (gated MLP) or fc1, fc2."""
    h, f, q, kv = model.hidden, model.ffn_hidden, model.q_dim, model.kv_dim
    attn = [("q", h, q), ("k", h, kv), ("v", h, kv), ("o", q, h)]
    mlp = [("gate", h, f), ("up", h, f), ("down", f, h)] if model.gated_mlp else [("fc1", h, f), ("fc2", f, h)]
    return attn + mlp


def matmuls_per_rank(model: ModelSpec, tp: int) -> dict[str, tuple[float, float]]:
    """(input width, output width) of each layer matmul on one TP rank: column-parallel ones
    (q, k, v, gate, up, fc1) split their output t ways, row-parallel ones (o, down, fc2) their
    input, producing a full-width partial sum."""
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    q, kv = model.q_dim / tp, kv_heads_per_rank(model, tp) * d
    table = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h),
             "gate": (h, f / tp), "up": (h, f / tp), "down": (f / tp, h), "fc1": (h, f / tp), "fc2": (f / tp, h)}
    return {name: table[name] for name, _, _ in layer_matmuls(model)}


def op_sac_recomputed(model: ModelSpec) -> list[tuple[str, int, int]]:
    """The matmuls torchtitan's op-level selective activation checkpointing recomputes: every
    second one in forward order (its policy saves the output of the 1st, 3rd, ... mm)."""
    return layer_matmuls(model)[1::2]


def _norm_params(model: ModelSpec) -> int:
    return 2 * model.hidden if model.norm == "layernorm" else model.hidden


def layer_params(model: ModelSpec) -> LayerParams:
    """One transformer layer's parameters (see the module docstring for the formula)."""
    h, f = model.hidden, model.ffn_hidden
    q, kv = model.q_dim, model.kv_dim
    attn_w = h * q + 2 * h * kv + q * h
    attn_b = (q + 2 * kv if model.qkv_bias else 0) + (h if model.linear_bias else 0)
    n_in = 2 if model.gated_mlp else 1
    mlp_w = (n_in + 1) * h * f
    mlp_b = (n_in * f + h) if model.linear_bias else 0
    return LayerParams(attn_w, attn_b, mlp_w, mlp_b, 2 * _norm_params(model))


def count_params(model: ModelSpec) -> ParamCounts:
    """All parameter counts of ``model``."""
    vh = model.vocab_size * model.hidden
    return ParamCounts(
        layer=layer_params(model),
        n_layers=model.n_layers,
        embedding=vh,
        position_embedding=model.max_position * model.hidden if model.position == "learned" else 0,
        final_norm=_norm_params(model),
        lm_head=0 if model.tied_embeddings else vh,
        lm_head_matmul=vh,
    )


# ---- per GPU under tensor parallelism -------------------------------------------------------------


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """K/V heads a TP rank holds: g/t, or one replicated head when t > g (t a multiple of g)."""
    return max(1, model.n_kv_heads // tp)


def padded_vocab(model: ModelSpec, tp: int) -> int:
    """Vocabulary rows after padding to a multiple of t (each rank holds ceil(V/t) rows)."""
    return -(-model.vocab_size // tp) * tp


def layer_params_per_rank(model: ModelSpec, tp: int) -> int:
    """Parameters of one layer held by one TP rank (Megatron's column/row split).

    Column-parallel Q/K/V and MLP-in weights and their biases are split t ways; row-parallel
    output and MLP-out weights are split t ways, their biases replicated; norms are replicated.
    K/V heads are replicated when t exceeds the number of K/V heads."""
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    q = model.q_dim // tp
    kv = kv_heads_per_rank(model, tp) * d
    attn_w = h * q + 2 * h * kv + q * h
    attn_b = (q + 2 * kv if model.qkv_bias else 0) + (h if model.linear_bias else 0)
    n_in = 2 if model.gated_mlp else 1
    mlp_w = (n_in + 1) * h * (f // tp)
    mlp_b = (n_in * (f // tp) + h) if model.linear_bias else 0
    return attn_w + attn_b + mlp_w + mlp_b + 2 * _norm_params(model)


def embedding_params_per_rank(model: ModelSpec, tp: int) -> int:
    """Input side on the first stage: vocab-parallel embedding (V/t rows) + learned positions
    (replicated)."""
    pos = model.max_position * model.hidden if model.position == "learned" else 0
    return padded_vocab(model, tp) // tp * model.hidden + pos


def head_params_per_rank(model: ModelSpec, tp: int, pp: int) -> int:
    """Output side on the last stage: final norm + LM head (V/t rows). A tied head shares the
    embedding when both sit on one stage (pp = 1); with pp > 1 the last stage keeps its own copy
    (Megatron and torchtitan both do)."""
    head = padded_vocab(model, tp) // tp * model.hidden
    if model.tied_embeddings and pp == 1:
        head = 0
    return _norm_params(model) + head


def rank_params(model: ModelSpec, tp: int, pp: int, n_layers: int, has_embedding: bool, has_head: bool) -> int:
    """Parameters one GPU holds: its pipeline rank's ``n_layers`` layers split by TP, plus the
    embedding on the rank with the first stage and the final norm and LM head on the one with the
    last."""
    params = n_layers * layer_params_per_rank(model, tp)
    if has_embedding:
        params += embedding_params_per_rank(model, tp)
    if has_head:
        params += head_params_per_rank(model, tp, pp)
    return params
