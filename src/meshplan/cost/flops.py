"""FLOPs per training step: model FLOPs (the MFU basis) and hardware FLOPs (adds recompute).

Symbols: N_mm matmul parameters (LM head included, :mod:`meshplan.cost.params`), T tokens per
step = B·s, L layers, a query heads, d head dimension, s sequence length, B sequences per step.

* dense (all weight matmuls):  ``6·N_mm·T``  — 2 forward + 4 backward FLOPs per weight per token
  (Kaplan et al. 2020, Sec. 2.1; Narayanan et al. 2021, Eq. 3 without recompute).
* attention (QKᵀ and A·V):  forward ``4·s²·a·d`` per layer per sequence non-causal, half that
  causal; backward twice the forward, so per step ``12·L·a·d·s²·B`` (full) or ``6·L·a·d·s²·B``
  (causal). Causal is the default; ``full`` is the PaLM / older-Megatron / FlopCounterMode
  convention.
* recompute adds forward work to the hardware FLOPs only (HFU basis): full recompute repeats the
  layers' forward, ``2·L·N_layer·T`` plus the attention forward; selective recompute repeats the
  attention core's forward only, ``4·s²·a·d`` per layer per sequence non-causal (Korthikanti et
  al. 2022, Sec. 5). The LM head is never recomputed. Korthikanti's Eq. 8 prints the selective
  hardware FLOPs as ``72·B·L·s·h²·(1 + s/3h + V/12hL)``, whose attention term is three times
  the attention forward; one repeated forward gives ``72·B·L·s·h²·(1 + 2s/9h + V/12hL)``, which
  is what meshplan counts (the tests show the difference, 8·B·L·s²·h). torchtitan's op-level
  selective checkpointing ("op") repeats every second matmul of the layer in forward order (k, o
  and up for Llama: ``2·T·L·(h·g·d + a·d·h + h·f)``), not the attention core.

Identities checked in the tests: for GPT shapes (a·d = h, f = 4h, no GQA) with full attention
and full recompute this equals Narayanan et al. 2021 Eq. 3, ``96·B·s·L·h²·(1 + s/6h + V/16Lh)``;
without recompute Korthikanti et al. 2022 Eq. 7 with s/6h → the same attention term.

Mixture of experts: N_mm counts the weights a token passes through — the router, the shared
expert and k of the E routed experts (``ParamCounts.active_matmul``), so the dense FLOPs are
``6·N_active·T`` (Fedus et al. 2022, Switch Transformer, Sec. 2: FLOPs per token stay those of
the active experts; DeepSeek-V3 report Table 1: 37B activated of 671B). MLA's score matmul uses
the query/key head dimension d = d_nope + d_r and its value matmul d_v, so the attention forward
is ``2·s²·a·(d + d_v)`` non-causal (DeepSeek-V2 report, arXiv 2405.04434, Sec. 2.1).

All figures are exact integers.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.params import count_params, op_sac_recomputed
from meshplan.specs.model import ModelSpec


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one optimizer step (all GPUs together)."""

    dense: int  # 6·N_mm·T
    attention: int  # QKᵀ and A·V, forward + backward
    recompute: int  # extra forward work of activation recomputation

    @property
    def model(self) -> int:
        return self.dense + self.attention

    @property
    def hardware(self) -> int:
        return self.model + self.recompute


def attention_forward_flops_per_seq_layer(model: ModelSpec, seq_len: int, convention: str) -> int:
    """Forward FLOPs of QKᵀ and A·V for one sequence in one layer: 4·s²·a·d (full), 2·s²·a·d
    (causal)."""
    per = 2 if convention == "causal" else 4
    if model.is_mla:  # QKᵀ over d, A·V over d_v: half of each per convention
        return per // 2 * seq_len * seq_len * model.n_heads * (model.head_dim + model.value_head_dim)
    return per * seq_len * seq_len * model.q_dim


def step_flops(
    model: ModelSpec, seq_len: int, global_batch: int, recompute: str = "none", attention_flops: str = "causal",
    recomputed: float = 1.0,
) -> StepFlops:
    """Model and hardware FLOPs of one step of ``global_batch`` sequences of ``seq_len`` tokens;
    ``recomputed``: the share of the layers full recompute covers (recompute_layers,
    :func:`meshplan.cost.partial_recompute.recomputed_fraction`)."""
    counts = count_params(model)
    tokens = seq_len * global_batch
    dense = 6 * counts.active_matmul * tokens
    attn_fwd = attention_forward_flops_per_seq_layer(model, seq_len, attention_flops) * model.n_layers * global_batch
    attention = 3 * attn_fwd
    if recompute == "full":
        extra = 2 * counts.layers_active_matmul * tokens + attn_fwd
        if recomputed != 1.0:
            extra = extra * recomputed
    elif recompute == "selective":
        extra = attn_fwd
    elif recompute == "op":
        extra = 2 * sum(i * o for _, i, o in op_sac_recomputed(model)) * model.n_layers * tokens
    else:
        extra = 0
    return StepFlops(dense=dense, attention=attention, recompute=extra)
