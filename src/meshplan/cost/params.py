"""Exact parameter counts: per layer, embeddings, total, per pipeline stage and per GPU.

Symbols as in :mod:`meshplan.specs.model` (L, h, a, g, d, f, V, P) and ``t`` for the tensor-parallel
size. Per transformer layer:

* attention weights  ``h·a·d + 2·h·g·d + a·d·h``   (Q, K, V, output projection)
* attention biases   ``a·d + 2·g·d`` if qkv_bias, ``+ h`` for the output projection if linear_bias
* MLP weights        ``3·h·f`` gated (SwiGLU/GeGLU: gate, up, down) or ``2·h·f`` (GeLU/ReLU)
* MLP biases         ``f + h`` (two-matrix MLP) or ``2f + h`` (gated) if linear_bias
* norms              ``2·h`` per norm for LayerNorm (weight and bias), ``h`` for RMSNorm; two norms

Multi-head latent attention (DeepSeek-V2 report, arXiv 2405.04434, Sec. 2.1; DeepSeek-V3 report,
arXiv 2412.19437, Sec. 2.1.1) replaces Q, K, V with low-rank projections, d = d_nope + d_r:

* queries   ``h·r_q + r_q·a·d`` (down, up) with r_q > 0, else ``h·a·d``
* keys/values  ``h·(r_kv + d_r)`` (latent and the shared rotary key) ``+ r_kv·a·(d_nope + d_v)``
* output    ``a·d_v·h``; norms of the latents ``r_q + r_kv``

``qk_norm`` adds ``2·d`` (query and key RMSNorms), Gemma 2/3 have four norms per layer.

A mixture-of-experts layer (Fedus et al. 2022, Switch Transformer, Sec. 2; DeepSeek-V3 report
Sec. 2.1.2) has, instead of the dense MLP, with n_m = 3 gated or 2 matrices per MLP:

* router     ``h·E`` (+ ``h`` for Qwen2-MoE's shared-expert gate)
* experts    ``E·n_m·h·f_e`` in all, of which a token uses ``k·n_m·h·f_e`` (the active experts)
* shared     ``n_m·h·f_s``

so the model holds ``L_d`` dense layers and ``L − L_d`` MoE layers; the *active* parameters
(the ``N`` of the FLOPs) count k experts, the *total* all E. Mixtral 8x7B: 46,702,792,704 total,
12,879,925,248 active; DeepSeek-V3: 671,026,419,200 total, 37,554,466,816 active (37B in the
report) — equal to ``transformers`` on the meta device (tests).

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
    router_weights: int = 0  # MoE router h·E (+ shared-expert gate h)
    expert_weights: int = 0  # all routed experts, E·n_m·h·f_e
    active_expert_weights: int = 0  # the k a token uses, k·n_m·h·f_e

    @property
    def matmul(self) -> int:
        return self.attention_weights + self.mlp_weights + self.router_weights + self.expert_weights

    @property
    def active_matmul(self) -> int:
        """Weights one token's forward multiplies: the matmuls with k of the E routed experts."""
        return self.attention_weights + self.mlp_weights + self.router_weights + self.active_expert_weights

    @property
    def total(self) -> int:
        return (
            self.attention_weights + self.attention_biases + self.mlp_weights + self.mlp_biases + self.norms
            + self.router_weights + self.expert_weights
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
    moe_layer: LayerParams | None = None  # MoE models: a mixture-of-experts layer (``layer`` the dense one)
    n_moe_layers: int = 0

    @property
    def _layer_kinds(self) -> tuple[tuple[LayerParams, int], ...]:
        if self.moe_layer is None:
            return ((self.layer, self.n_layers),)
        return ((self.layer, self.n_layers - self.n_moe_layers), (self.moe_layer, self.n_moe_layers))

    @property
    def layers_total(self) -> int:
        return sum(kind.total * n for kind, n in self._layer_kinds)

    @property
    def layers_matmul(self) -> int:
        return sum(kind.matmul * n for kind, n in self._layer_kinds)

    @property
    def layers_active_matmul(self) -> int:
        return sum(kind.active_matmul * n for kind, n in self._layer_kinds)

    @property
    def experts(self) -> int:
        """Routed expert weights of the whole model (0 for a dense model)."""
        return self.moe_layer.expert_weights * self.n_moe_layers if self.moe_layer else 0

    @property
    def total(self) -> int:
        return self.layers_total + self.embedding + self.position_embedding + self.final_norm + self.lm_head

    @property
    def matmul(self) -> int:
        """Weights of every matmul, the LM head included (every expert of an MoE model)."""
        return self.layers_matmul + self.lm_head_matmul

    @property
    def active_matmul(self) -> int:
        """Matmul weights a token passes through, the LM head included: the N of the 6·N·tokens
        rule (equal to ``matmul`` for a dense model; k of E routed experts for an MoE model)."""
        return self.layers_active_matmul + self.lm_head_matmul

    @property
    def active(self) -> int:
        """Parameters a token uses: the total less the routed experts it is not sent to."""
        if self.moe_layer is None:
            return self.total
        idle = self.moe_layer.expert_weights - self.moe_layer.active_expert_weights
        return self.total - idle * self.n_moe_layers

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.position_embedding - self.lm_head


def layer_matmuls(model: ModelSpec) -> list[tuple[str, int, int]]:
    """The layer's weight matmuls in forward order as (name, input width, output width), with
    separate q, k, v projections as Hugging Face and torchtitan write them: q, k, v, o, then
    gate, up, down (gated MLP) or fc1, fc2."""
    h, f, q, kv = model.hidden, model.ffn_hidden, model.q_dim, model.kv_dim
    attn = [("q", h, q), ("k", h, kv), ("v", h, kv), ("o", q, h)]
    if model.is_mla:
        attn = _mla_matmuls(model)
    mlp = [("gate", h, f), ("up", h, f), ("down", f, h)] if model.gated_mlp else [("fc1", h, f), ("fc2", f, h)]
    return attn + mlp


#: MLA's attention matmul names (:func:`layer_matmuls`).
MLA_NAMES = frozenset({"q", "q_a", "q_b", "kv_a", "kv_b", "o"})


def _mla_matmuls(model: ModelSpec) -> list[tuple[str, int, int]]:
    """MLA's attention matmuls in forward order (module docstring): q (or q_a, q_b), kv_a, kv_b, o."""
    h, a, d, r_q, r_kv = model.hidden, model.n_heads, model.head_dim, model.q_lora_rank, model.kv_lora_rank
    d_r, d_v = model.qk_rope_head_dim, model.value_head_dim
    q = [("q_a", h, r_q), ("q_b", r_q, a * d)] if r_q else [("q", h, a * d)]
    return q + [("kv_a", h, r_kv + d_r), ("kv_b", r_kv, a * (d - d_r + d_v)), ("o", a * d_v, h)]


def matmuls_per_rank(model: ModelSpec, tp: int) -> dict[str, tuple[float, float]]:
    """(input width, output width) of each layer matmul on one TP rank: column-parallel ones
    (q, k, v, gate, up, fc1) split their output t ways, row-parallel ones (o, down, fc2) their
    input, producing a full-width partial sum."""
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    q, kv = model.q_dim / tp, kv_heads_per_rank(model, tp) * d
    table = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h),
             "gate": (h, f / tp), "up": (h, f / tp), "down": (f / tp, h), "fc1": (h, f / tp), "fc2": (f / tp, h)}
    if model.is_mla:  # down-projections replicated across TP (Megatron-Core MLA), the rest split
        table.update({name: (i, o) if name in ("q_a", "kv_a") else (i / tp, o) if name == "o" else (i, o / tp)
                      for name, i, o in _mla_matmuls(model)})
    return {name: table[name] for name, _, _ in layer_matmuls(model)}


def op_sac_recomputed(model: ModelSpec) -> list[tuple[str, int, int]]:
    """The matmuls torchtitan's op-level selective activation checkpointing recomputes: every
    second one in forward order (its policy saves the output of the 1st, 3rd, ... mm)."""
    return layer_matmuls(model)[1::2]


def _norm_params(model: ModelSpec) -> int:
    return 2 * model.hidden if model.norm == "layernorm" else model.hidden


def _attention_norms(model: ModelSpec) -> int:
    """Norms inside attention: q/k RMSNorms (2·d) and MLA's latent RMSNorms (r_q + r_kv)."""
    return (2 * model.head_dim if model.qk_norm else 0) + model.q_lora_rank + model.kv_lora_rank


def _attention_weights(model: ModelSpec, tp: int) -> int:
    """Attention weights on one TP rank (tp = 1: the whole layer's)."""
    if model.is_mla:
        return sum(int(i * o) for i, o in (matmuls_per_rank(model, tp)[name] for name, _, _ in _mla_matmuls(model)))
    q = model.q_dim // tp
    kv = kv_heads_per_rank(model, tp) * model.head_dim
    return model.hidden * q + 2 * model.hidden * kv + q * model.hidden


def _mlp_matrices(model: ModelSpec) -> int:
    """n_m: 3 matrices per gated MLP (gate, up, down), 2 otherwise."""
    return 3 if model.gated_mlp else 2


def layer_params(model: ModelSpec, moe: bool = False) -> LayerParams:
    """One transformer layer's parameters (see the module docstring for the formula); ``moe``
    selects a mixture-of-experts layer of an MoE model, else its dense-MLP layer."""
    h, f = model.hidden, model.ffn_hidden
    q, kv = model.q_dim, model.kv_dim
    attn_w = _attention_weights(model, 1)
    attn_b = (q + 2 * kv if model.qkv_bias else 0) + (h if model.linear_bias else 0)
    n_in = 2 if model.gated_mlp else 1
    norms = model.norms_per_layer * _norm_params(model) + _attention_norms(model)
    if moe:
        n_m, E = _mlp_matrices(model), model.n_experts
        router = h * E + (h if model.shared_expert_gate else 0)
        experts = n_m * h * model.expert_ffn_hidden
        return LayerParams(attn_w, attn_b, n_m * h * model.shared_expert_ffn_hidden, 0, norms,
                           router, E * experts, model.experts_per_token * experts)
    mlp_w = (n_in + 1) * h * f
    mlp_b = (n_in * f + h) if model.linear_bias else 0
    return LayerParams(attn_w, attn_b, mlp_w, mlp_b, norms)


def count_params(model: ModelSpec) -> ParamCounts:
    """All parameter counts of ``model``."""
    vh = model.vocab_size * model.hidden
    return ParamCounts(
        moe_layer=layer_params(model, moe=True) if model.is_moe else None,
        n_moe_layers=model.n_moe_layers,
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


def layer_params_per_rank(model: ModelSpec, tp: int, moe: bool = False, ep: int = 1) -> int:
    """Parameters of one layer held by one GPU of a TP group (Megatron's column/row split).

    Column-parallel Q/K/V and MLP-in weights and their biases are split t ways; row-parallel
    output and MLP-out weights are split t ways, their biases replicated; norms are replicated.
    K/V heads are replicated when t exceeds the number of K/V heads; MLA's down-projections are
    replicated. A mixture-of-experts layer (``moe``) holds the replicated router, the shared
    expert split t ways and E/ep routed experts split t ways (:func:`expert_params_per_rank`;
    Megatron-Core's expert tensor parallel size equal to t)."""
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    q = model.q_dim // tp
    kv = kv_heads_per_rank(model, tp) * d
    attn_w = _attention_weights(model, tp)
    attn_b = (q + 2 * kv if model.qkv_bias else 0) + (h if model.linear_bias else 0)
    norms = model.norms_per_layer * _norm_params(model) + _attention_norms(model)
    if moe:
        router = h * model.n_experts + (h if model.shared_expert_gate else 0)
        shared = _mlp_matrices(model) * h * (model.shared_expert_ffn_hidden // tp)
        return attn_w + attn_b + norms + router + shared + expert_params_per_rank(model, tp, ep)
    n_in = 2 if model.gated_mlp else 1
    mlp_b = (n_in * (f // tp) + h) if model.linear_bias else 0
    return linear_weights_per_rank(model, tp) + attn_b + mlp_b + norms


def linear_weights_per_rank(model: ModelSpec, tp: int) -> int:
    """The weights of one dense layer's linear projections on one GPU of a TP group: attention
    (:func:`_attention_weights`) and MLP, ``n_m·h·f/t``, without biases or norms. torchao's
    Float8 training converts exactly these ``nn.Linear`` modules of a block (torchtitan leaves the
    LM head out, ``filter_fqns = ["output"]``), and FSDP2 all-gathers their weights in FP8 under
    ``enable_fsdp_float8_all_gather`` (:func:`meshplan.cost.fsdp_copies.fp8_gather_saving`); a
    bias stays in the compute dtype."""
    return _attention_weights(model, tp) + _mlp_matrices(model) * model.hidden * (model.ffn_hidden // tp)


def down_projection_params_per_rank(model: ModelSpec, tp: int, moe: bool = False, ep: int = 1) -> int:
    """The MLP's output (down) projection of one layer on one GPU of a TP group, ``h·f/t`` and its
    replicated bias: the first weights a layer's backward reaches, so the only ones whose gradient
    exists at its MLP's backward (:func:`meshplan.cost.compose.rank_other_items`). A mixture-of-
    experts layer (``moe``): the E/ep local experts' ``h·f_e/t`` each and the shared expert's
    ``h·f_s/t``."""
    h = model.hidden
    if moe:
        return model.n_experts // ep * h * (model.expert_ffn_hidden // tp) + h * (model.shared_expert_ffn_hidden // tp)
    return h * (model.ffn_hidden // tp) + (h if model.linear_bias else 0)


def largest_layer_params(model: ModelSpec, tp: int, ep: int = 1) -> tuple[int, int]:
    """The parameters of the model's largest layer on one GPU of a TP group, the one ZeRO-3's
    buffers hold (an MoE model's mixture-of-experts layer if larger than its dense layers), and
    its down projection's (:func:`down_projection_params_per_rank`)."""
    dense = layer_params_per_rank(model, tp), down_projection_params_per_rank(model, tp)
    if not model.is_moe:
        return dense
    moe = layer_params_per_rank(model, tp, moe=True, ep=ep), down_projection_params_per_rank(model, tp, moe=True, ep=ep)
    return moe if moe[0] > dense[0] else dense


def expert_params_per_rank(model: ModelSpec, tp: int, ep: int) -> int:
    """Routed-expert weights of one MoE layer on one GPU: E/ep experts, each split t ways,
    ``(E/ep)·n_m·h·f_e/t``."""
    return model.n_experts // ep * _mlp_matrices(model) * model.hidden * (model.expert_ffn_hidden // tp)


def moe_layers_in(model: ModelSpec, split: tuple[int, ...], stages) -> int:
    """How many of the layers of virtual ``stages`` (indices into ``split``, the layers per virtual
    stage in pipeline order) are mixture-of-experts layers."""
    if not model.is_moe:
        return 0
    flags = model.moe_layers
    starts = [sum(split[:k]) for k in range(len(split))]
    return sum(sum(flags[starts[k]:starts[k] + split[k]]) for k in stages)


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


def rank_params(
    model: ModelSpec, tp: int, pp: int, n_layers: int, has_embedding: bool, has_head: bool,
    n_moe_layers: int = 0, ep: int = 1,
) -> int:
    """Parameters one GPU holds: its pipeline rank's ``n_layers`` layers split by TP (of which
    ``n_moe_layers`` are mixture-of-experts layers with E/ep experts), plus the embedding on the
    rank with the first stage and the final norm and LM head on the one with the last."""
    params = (n_layers - n_moe_layers) * layer_params_per_rank(model, tp)
    if n_moe_layers:
        params += n_moe_layers * layer_params_per_rank(model, tp, moe=True, ep=ep)
    if has_embedding:
        params += embedding_params_per_rank(model, tp)
    if has_head:
        params += head_params_per_rank(model, tp, pp)
    return params


# ---- tensor by tensor (ZeRO-3 that gathers each parameter on its own) ---------------------------


def layer_tensors_per_rank(model: ModelSpec, tp: int) -> tuple[int, ...]:
    """Element counts of one dense layer's parameter tensors on one GPU of a TP group, as
    Megatron's GPT layer holds them — the model code DeepSpeed's ZeRO-3 of 2021 partitioned and
    gathered one tensor at a time (``zero3_comm`` blocking-per-tensor,
    :class:`meshplan.specs.stack.Stack`): each norm's weight (and bias, LayerNorm), Q/K/V fused in
    one weight ((a·d/t + 2·g_r·d)·h, its bias with qkv_bias) or MLA's projections one by one, the
    output projection (and its bias), the MLP's input fused in one weight (n_in·f/t·h: gate and up
    together when gated) and its output (each with a bias under linear_bias), q/k norms. They sum
    to :func:`layer_params_per_rank` exactly."""
    f, n_in = model.ffn_hidden // tp, 2 if model.gated_mlp else 1
    mlp = (n_in * f * model.hidden, f * model.hidden)
    return _attention_tensors(model, tp) + mlp + ((n_in * f, model.hidden) if model.linear_bias else ())


def moe_layer_tensors_per_rank(model: ModelSpec, tp: int, ep: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """One mixture-of-experts layer's parameter tensors on one GPU, as :func:`layer_tensors_per_rank`
    counts a dense one: (the norms, attention, router — and Qwen2-MoE's shared-expert gate — and
    the shared expert's fused input and output weights; the E/ep routed experts' fused input and
    output weights, two a expert). The two sum to :func:`layer_params_per_rank` (``moe``) less
    :func:`expert_params_per_rank`, and to :func:`expert_params_per_rank`."""
    h, n_in = model.hidden, 2 if model.gated_mlp else 1
    dense = _attention_tensors(model, tp) + (h * model.n_experts,) + ((h,) if model.shared_expert_gate else ())
    fs, fe = model.shared_expert_ffn_hidden // tp, model.expert_ffn_hidden // tp
    if fs:
        dense += (n_in * fs * h, fs * h)
    return dense, (n_in * fe * h, fe * h) * (model.n_experts // ep)


def _attention_tensors(model: ModelSpec, tp: int) -> tuple[int, ...]:
    """The norms' and the attention's tensors of :func:`layer_tensors_per_rank` (the output
    projection's bias with linear_bias)."""
    h, d = model.hidden, model.head_dim
    out: list[int] = list((h, h) if model.norm == "layernorm" else (h,)) * model.norms_per_layer
    if model.qk_norm:
        out += [d, d]
    if model.is_mla:
        out += [int(i * o) for i, o in (matmuls_per_rank(model, tp)[name] for name, _, _ in _mla_matmuls(model))]
        out += [r for r in (model.q_lora_rank, model.kv_lora_rank) if r]
    else:
        q, kv = model.q_dim // tp, kv_heads_per_rank(model, tp) * d
        out += [(q + 2 * kv) * h, q * h]
        if model.qkv_bias:
            out.append(q + 2 * kv)
    if model.linear_bias:
        out.append(h)  # the output projection's bias (row-parallel: replicated)
    return tuple(out)


def unit_tensors_per_rank(model: ModelSpec, tp: int, pp: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The parameter tensors of ZeRO-3's three kinds of unit on one GPU: a dense layer
    (:func:`layer_tensors_per_rank`), the embedding (the vocab-parallel table, and the learned
    positions) and the head (the final norm's weight and bias, the LM head unless a tied head
    shares the embedding on one stage); each sums to its unit's parameter count."""
    h = model.hidden
    table = padded_vocab(model, tp) // tp * h
    embedding = (table,) + ((model.max_position * h,) if model.position == "learned" else ())
    head = ((h, h) if model.norm == "layernorm" else (h,)) + (() if model.tied_embeddings and pp == 1 else (table,))
    return layer_tensors_per_rank(model, tp), embedding, head
