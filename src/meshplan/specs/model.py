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
=========  ===============================================  ============
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from meshplan.specs.base import Spec


class ModelSpec(Spec):
    """A dense decoder-only transformer (Llama, Mistral, Qwen2, GPT-2/3, GPT-NeoX families)."""

    name: str = Field(min_length=1)
    n_layers: int = Field(gt=0, le=100_000)
    hidden: int = Field(gt=0, le=10_000_000)
    n_heads: int = Field(gt=0, le=100_000)
    n_kv_heads: int = Field(gt=0, le=100_000)
    head_dim: int = Field(gt=0, le=100_000)
    ffn_hidden: int = Field(gt=0, le=100_000_000)
    vocab_size: int = Field(gt=0, le=100_000_000)
    max_position: int = Field(default=8192, gt=0, le=100_000_000)
    mlp: Literal["swiglu", "geglu", "gelu", "relu"] = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    position: Literal["rope", "learned"] = "rope"
    tied_embeddings: bool = False
    qkv_bias: bool = False
    linear_bias: bool = False  # bias on attention output and MLP linears (GPT-2/3, GPT-NeoX)
    parallel_residual: bool = False  # attention and MLP read the same input (GPT-NeoX, GPT-J)
    dropout: bool = False  # attention and hidden dropout active in training (GPT-2/3)
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})"
            )
        return self

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def gated_mlp(self) -> bool:
        """SwiGLU/GeGLU have three MLP matrices (gate, up, down); GeLU/ReLU MLPs have two."""
        return self.mlp in ("swiglu", "geglu")

    @property
    def q_dim(self) -> int:
        """Width of the query projection, a·d."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections, g·d."""
        return self.n_kv_heads * self.head_dim
