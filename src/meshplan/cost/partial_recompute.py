"""Full recompute of some layers of each stage: Megatron-LM's ``--recompute-method block
--recompute-num-layers N`` (the first N layers of each virtual stage checkpointed whole, the rest
keeping their activations: Korthikanti et al. 2022, Sec. 4.1, "block" against "uniform") and
torchtitan's layer-level selective activation checkpointing (``selective_ac_option = "k"``: every
k-th block of a rank checkpointed, ``_apply_layer_sac``), which on a stage of n layers recomputes
⌊n/k⌋ of them.

A plan says it with ``recompute = full`` and ``recompute_layers = N``. Stage k of n_k layers then
holds r_k = min(N, n_k) recomputed layers and n_k − r_k that store everything:

* its times are those of n_k layers without recompute plus r_k × (a fully recomputed layer − a
  layer without recompute), part by part (compute, recompute, TP, CP, ZeRO-3:
  :func:`meshplan.cost.layer_mix.add_layer_mix`);
* its activations per micro-batch are n_k·A_none + r_k·(A_full − A_none) (A: a layer's stored
  bytes, :func:`meshplan.cost.activations.layer_activations`;
  :func:`meshplan.cost.layer_mix.mixed_stage_activations`), and the backward's working set is the
  larger of the two kinds' (a recomputed layer rebuilds its activations before its backward);
* the step's recompute FLOPs are those of full recompute times Σ_k r_k / L over the model's virtual
  stages (each layer lies in one).
"""

from __future__ import annotations

from typing import Optional


def recomputed_per_stage(split: tuple[int, ...], recompute_layers: Optional[int]) -> list[int]:
    """r_k = min(N, n_k): the layers stage k recomputes (every layer when N is None)."""
    return [n if recompute_layers is None else min(recompute_layers, n) for n in split]


def recomputed_fraction(split: tuple[int, ...], recompute_layers: Optional[int]) -> float:
    """Σ_k r_k / Σ_k n_k: the share of the model's layers recomputed (1 when every layer is)."""
    total = sum(split)
    return sum(recomputed_per_stage(split, recompute_layers)) / total if total else 0.0
