"""Full recompute of some layers of each stage: Megatron-LM's ``--recompute-method block
--recompute-num-layers N`` (the first N layers of each virtual stage checkpointed whole, the rest
keeping their activations: Korthikanti et al. 2022, Sec. 4.1, "block" against "uniform") and
torchtitan's layer-level selective activation checkpointing (``selective_ac_option = "k"``: every
k-th block of a rank checkpointed, ``_apply_layer_sac``), which on a stage of n layers recomputes
⌊n/k⌋ of them.

A plan says it with ``recompute = full`` and ``recompute_layers = N``. Stage k of n_k layers then
holds r_k = min(N, n_k) recomputed layers and n_k − r_k that store everything:

* its times are those of n_k layers without recompute plus r_k × (a fully recomputed layer − a
  layer without recompute), part by part (compute, recompute, TP, CP, ZeRO-3);
* its activations per micro-batch are n_k·A_none + r_k·(A_full − A_none) (A: a layer's stored
  bytes, :func:`meshplan.cost.activations.layer_activations`), and the backward's working set is
  the larger of the two kinds' (a recomputed layer rebuilds its activations before its backward);
* the step's recompute FLOPs are those of full recompute times Σ_k r_k / L over the model's virtual
  stages (each layer lies in one).
"""

from __future__ import annotations

from typing import Optional

from meshplan.cost.compose import LayerTimes, StageTimes

#: the StageTimes parts a layer's difference adds to, each from the LayerTimes fields named
_PARTS = {
    "comp_fwd": ("fwd",), "comp_bwd": ("bwd", "recompute"), "recompute": ("recompute",), "tp_fwd": ("tp_fwd",),
    "tp_bwd": ("tp_bwd",), "cp_fwd": ("cp_fwd",), "cp_bwd": ("cp_bwd",), "fsdp_fwd": ("fsdp_fwd",), "fsdp_bwd": ("fsdp_bwd",),
    "wgt": ("wgt",), "fwd": ("fwd", "tp_fwd", "cp_fwd", "fsdp_fwd"), "bwd": ("bwd", "recompute", "tp_bwd", "cp_bwd", "fsdp_bwd"),
}


def recomputed_per_stage(split: tuple[int, ...], recompute_layers: Optional[int]) -> list[int]:
    """r_k = min(N, n_k): the layers stage k recomputes (every layer when N is None)."""
    return [n if recompute_layers is None else min(recompute_layers, n) for n in split]


def add_recomputed_layers(st: StageTimes, recomputed: list[int], plain: LayerTimes, full: LayerTimes) -> None:
    """Turn ``st``, the stage times of layers without recompute (``plain``), into those of the mix,
    in place: stage k's r_k recomputed layers add r_k × (``full`` − ``plain``) to each part."""
    for k, r in enumerate(recomputed):
        if not r:
            continue
        for part, names in _PARTS.items():
            getattr(st, part)[k] = getattr(st, part)[k] + r * sum(getattr(full, n) - getattr(plain, n) for n in names)


def mixed_stage_activations(stage_act: list, recomputed: list[int], plain_stored: float, full_stored: float) -> list:
    """Each stage's activations with its r_k recomputed layers storing ``full_stored`` bytes each
    instead of ``plain_stored``."""
    return [a + r * (full_stored - plain_stored) for a, r in zip(stage_act, recomputed)]


def recomputed_fraction(split: tuple[int, ...], recompute_layers: Optional[int]) -> float:
    """Σ_k r_k / Σ_k n_k: the share of the model's layers recomputed (1 when every layer is)."""
    total = sum(split)
    return sum(recomputed_per_stage(split, recompute_layers)) / total if total else 0.0
