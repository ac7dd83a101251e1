"""ModelSpec: the shape of a decoder-only transformer, enough to count every parameter exactly.

Symbols (used across meshplan's formulas):

=========  ===============================================  ============
symbol     meaning                                          field
=========  ===============================================  ============
L          transformer layers                               n_layers
h          hidden size (model width)                        hidden
a          query heads                                      n_heads
g          key/value heads (GQA groups; g = a for MHA)      n_kv_heads
d          head dimension (h / a unless stated)             head_dim
f          MLP hidden size                                  ffn_hidden
V          vocabulary size                                  vocab_size
P          learned position embeddings (0 for RoPE)         max_position (when learned)
E          routed experts per MoE layer (0: dense model)    n_experts
k          experts each token is routed to (top-k)          experts_per_token
f_e        MLP hidden size of one routed expert             expert_ffn_hidden
f_s        MLP hidden size of the shared expert(s)          shared_expert_ffn_hidden
r_q        query down-projection rank (MLA; 0: none)        q_lora_rank
r_kv       key/value down-projection rank (MLA; 0: no MLA)  kv_lora_rank
d_r        rotary part of each query/key head (MLA)         qk_rope_head_dim
d_v        value head dimension (MLA; d otherwise)          v_head_dim
=========  ===============================================  ============

Mixture of experts (Shazeer et al. 2017; Fedus et al. 2022, Switch Transformer; DeepSeek-V3
report, arXiv 2412.19437): a layer's MLP is replaced by a router (an h × E matmul), E routed
experts of which each token uses k, and optionally a shared expert every token uses (f_s; several
shared experts of one width are one MLP of their summed width, as Hugging Face builds them) with an
optional sigmoid gate (Qwen2-MoE: an h × 1 matmul). ``dense_layers`` lists the layers that keep a
dense MLP of width f (DeepSeek's ``first_k_dense_replace``, Qwen-MoE's ``mlp_only_layers`` and
``decoder_sparse_step``). Multi-head latent attention (MLA, DeepSeek-V2 report arXiv 2405.04434,
Sec. 2.1) is on when r_kv > 0: the query and key heads have d = d_nope + d_r dimensions
(``head_dim``), values d_v, and there is one K/V latent per token (n_kv_heads = n_heads).
``norms_per_layer`` = 4 for Gemma 2/3's pre- and post-norms around attention and MLP; ``qk_norm``
adds an RMSNorm of d on queries and keys (Qwen3, Gemma 3). Every default describes a dense model,
whose numbers these fields leave unchanged.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from meshplan.specs.base import Spec


class ModelSpec(Spec):
    """A decoder-only transformer: dense (Llama, Mistral, Qwen2, GPT-2/3, GPT-NeoX, Gemma 2/3) or
    mixture-of-experts (Mixtral, Qwen-MoE, DeepSeek-V3 with MLA)."""

    name: str = Field(min_length=1)
    n_layers: int = Field(gt=0, le=100_000)
    hidden: int = Field(gt=0, le=10_000_000)
    n_heads: int = Field(gt=0, le=100_000)
    n_kv_heads: int = Field(gt=0, le=100_000)
    head_dim: int = Field(gt=0, le=100_000)
    ffn_hidden: int = Field(gt=0, le=100_000_000)
    vocab_size: int = Field(gt=0, le=100_000_000)
    max_position: int = Field(default=8192, gt=0, le=100_000_000)
    # swiglu/geglu: gated, three matrices; gelu, relu and relu2 (squared ReLU, relu(x)², Nemotron-4;
    # Megatron-LM --squared-relu): two matrices around the activation
    mlp: Literal["swiglu", "geglu", "gelu", "relu", "relu2"] = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    position: Literal["rope", "learned"] = "rope"
    tied_embeddings: bool = False
    qkv_bias: bool = False
    linear_bias: bool = False  # bias on attention output and MLP linears (GPT-2/3, GPT-NeoX)
    parallel_residual: bool = False  # attention and MLP read the same input (GPT-NeoX, GPT-J)
    dropout: bool = False  # attention and hidden dropout active in training (GPT-2/3)
    norms_per_layer: Literal[2, 4] = 2  # 4: Gemma 2/3 pre- and post-norms
    qk_norm: bool = False  # RMSNorm of d on queries and keys (Qwen3, Gemma 3)
    n_experts: int = Field(default=0, ge=0, le=1_000_000)  # E routed experts; 0 = dense
    experts_per_token: int = Field(default=0, ge=0, le=1_000_000)  # top-k
    expert_ffn_hidden: int = Field(default=0, ge=0, le=100_000_000)  # f_e
    shared_expert_ffn_hidden: int = Field(default=0, ge=0, le=100_000_000)  # f_s (0: none)
    shared_expert_gate: bool = False  # sigmoid gate h x 1 on the shared expert (Qwen2-MoE)
    dense_layers: tuple[int, ...] = ()  # MoE models: layers with a dense MLP of width f
    q_lora_rank: int = Field(default=0, ge=0, le=100_000_000)  # MLA r_q (0: full-rank q_proj)
    kv_lora_rank: int = Field(default=0, ge=0, le=100_000_000)  # MLA r_kv (0: not MLA)
    qk_rope_head_dim: int = Field(default=0, ge=0, le=100_000)  # MLA d_r
    v_head_dim: int = Field(default=0, ge=0, le=100_000)  # MLA d_v (0: head_dim)
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})"
            )
        if self.n_experts:
            if not 1 <= self.experts_per_token <= self.n_experts:
                raise ValueError(
                    f"experts_per_token ({self.experts_per_token}) must be between 1 and n_experts ({self.n_experts})"
                )
            if self.expert_ffn_hidden < 1:
                raise ValueError("expert_ffn_hidden must be positive in a mixture-of-experts model")
            if self.linear_bias:
                raise ValueError("mixture-of-experts MLPs are modelled without biases (linear_bias false)")
            if any(not 0 <= i < self.n_layers for i in self.dense_layers) or len(set(self.dense_layers)) != len(self.dense_layers):
                raise ValueError(f"dense_layers must be distinct layer indices in 0 .. {self.n_layers - 1}")
        elif self.experts_per_token or self.expert_ffn_hidden or self.shared_expert_ffn_hidden or self.shared_expert_gate or self.dense_layers:
            raise ValueError("expert fields (experts_per_token, expert_ffn_hidden, shared experts, dense_layers) need n_experts > 0")
        if self.shared_expert_gate and not self.shared_expert_ffn_hidden:
            raise ValueError("shared_expert_gate needs a shared expert (shared_expert_ffn_hidden > 0)")
        if self.kv_lora_rank:
            if self.n_kv_heads != self.n_heads:
                raise ValueError("MLA (kv_lora_rank > 0) has one key/value head per query head: n_kv_heads must equal n_heads")
            if not 0 < self.qk_rope_head_dim < self.head_dim:
                raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be between 1 and head_dim - 1 ({self.head_dim - 1}) with MLA")
            if self.qkv_bias or self.linear_bias:
                raise ValueError("MLA is modelled without attention biases (qkv_bias and linear_bias false)")
        elif self.q_lora_rank or self.qk_rope_head_dim or self.v_head_dim:
            raise ValueError("q_lora_rank, qk_rope_head_dim and v_head_dim are MLA fields: they need kv_lora_rank > 0")
        return self

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def gated_mlp(self) -> bool:
        """SwiGLU/GeGLU have three MLP matrices (gate, up, down); GeLU/ReLU/squared-ReLU MLPs have two."""
        return self.mlp in ("swiglu", "geglu")

    @property
    def q_dim(self) -> int:
        """Width of the query projection, a·d."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections, g·d."""
        return self.n_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def value_head_dim(self) -> int:
        """d_v: MLA's value head dimension, else d."""
        return self.v_head_dim or self.head_dim

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        """Per layer, whether its MLP is a mixture of experts (all False for a dense model)."""
        dense = set(self.dense_layers)
        return tuple(self.is_moe and i not in dense for i in range(self.n_layers))

    @property
    def n_moe_layers(self) -> int:
        return sum(self.moe_layers)
