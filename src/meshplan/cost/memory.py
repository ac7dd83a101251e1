"""Memory per GPU: persistent model state sharded by ZeRO, and the transient buffers.

For a GPU holding ``P`` parameters (its pipeline stage's layers split by TP, plus the embedding
on the first stage and the LM head on the last), with bytes per parameter w (weights), γ
(gradients) and ω (optimizer: master copy, fp32 gradient copy, moments) from the precision
recipe and ``N`` the ZeRO shard degree (DP shard group × CP):

=======  ==========  ==========  ============
ZeRO     weights     gradients   optimizer
=======  ==========  ==========  ============
0        w·P         γ·P         ω·P
1        w·P         γ·P         ω·P/N
2        w·P         γ·P/N       ω·P/N
3        w·P/N       γ·P/N       ω·P/N
=======  ==========  ==========  ============

(Rajbhandari et al. 2020, Sec. 5; with the 2+2+12 recipe: 16, 4 + 12/N, 2 + 14/N and 16/N bytes per
parameter. torch's FSDP2 keeps its fp32 shards as the master copy: w = 4 and ω less the master's 4,
:func:`state_bytes_per_param`.) Transient buffers are itemized under ``other``: ZeRO-3's gathered weights (the layer in
use and the one prefetched, or the whole stage when weights are not freed after forward), the
gradient reduce-scatter buckets of ZeRO-2/3, TP and PP communication buffers, the gradient of the
fp32 logits on the last stage, and the runtime reserve (CUDA context, library workspaces, NCCL).
The logits' gradient and the ZeRO buffers live at different moments of the backward, so the peak
takes the larger of the two moments (:func:`meshplan.cost.compose.rank_other_items`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshplan.cost.compose import pick
from meshplan.specs.plan import PrecisionRecipe


@dataclass(frozen=True)
class ModelState:
    weights: float
    gradients: float
    optimizer: float


def state_bytes_per_param(recipe: PrecisionRecipe, fsdp2: Any = False) -> tuple[Any, Any, Any]:
    """(w, γ, ω): persistent bytes per parameter of weights, gradients and optimizer state.

    The recipe's own split (:class:`meshplan.specs.plan.PrecisionRecipe`) keeps compute-dtype
    weights beside an fp32 master copy in the optimizer (Megatron's distributed optimizer,
    DeepSpeed ZeRO: 2 + 4 + 12 = 18 bytes for bf16 with fp32 gradients). torch's FSDP2
    (``fsdp2``: :func:`meshplan.cost.fsdp_copies.runs_fsdp2`) keeps no such pair: under its
    ``MixedPrecisionPolicy`` the sharded parameter itself is the fp32 copy the optimizer steps,
    cast to the compute dtype only into the all-gather's input (``FSDPParam.all_gather_inputs``),
    so the master's 4 bytes are the weights' and no compute-dtype shard persists: w = 4,
    ω = ω_recipe − 4 (4 + 4 + 8 = 16 bytes for torchtitan's bf16 training with fp32 reduction).
    A recipe without a master copy is the same on both. Elementwise over an array ``fsdp2``."""
    master = recipe.master_bytes
    return (pick(fsdp2, master or recipe.weight_bytes, recipe.weight_bytes), recipe.grad_bytes,
            pick(fsdp2, recipe.optimizer_bytes - master, recipe.optimizer_bytes))


def model_state_bytes(params: float, recipe: PrecisionRecipe, zero: int, shard: int, fsdp2: Any = False) -> ModelState:
    """Persistent bytes of ``params`` parameters under ZeRO stage ``zero`` over ``shard`` ranks
    (table in the module docstring), with the bytes per parameter of
    :func:`state_bytes_per_param` (``fsdp2``: torch's FSDP2 keeps its fp32 shards as the master
    copy); numbers, or arrays over plans."""
    wb, gb, ob = state_bytes_per_param(recipe, fsdp2)
    w = params * wb / pick(zero >= 3, shard, 1)
    g = params * gb / pick(zero >= 2, shard, 1)
    o = params * ob / pick(zero >= 1, shard, 1)
    return ModelState(w, g, o)


@dataclass(frozen=True)
class StageMemory:
    """Peak memory of one pipeline rank (all its virtual stages), bytes per GPU."""

    rank: int
    layers: int
    params: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float
    peak_inflight: int
    activation_items: dict[str, float] = field(default_factory=dict)
    other_items: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other
