"""Stages whose layers are of two kinds: :func:`meshplan.cost.compose.stage_times` builds every
stage from one kind of layer (``base``), and :func:`add_layer_mix` then turns n_k of stage k's
layers into the other kind (``other``), part by part. Shared by the mixture-of-experts layers
(:func:`meshplan.cost.moe.add_moe_layers`) and recompute of some layers per stage
(:mod:`meshplan.cost.partial_recompute`).

For each part X of stage k (compute, recompute, TP, CP, ZeRO-3, weight gradient, and the forward
and backward they make up): X_k ← X_k + n_k · (X_other − X_base), the backward's recompute counted
in its compute; ``extra`` (per layer, forward and backward) adds n_k · extra to the stage's forward
and backward only (the experts' all-to-alls)."""

from __future__ import annotations

from meshplan.cost.compose import LayerTimes, StageTimes


def add_layer_mix(st: StageTimes, per_stage: list, base: LayerTimes, other: LayerTimes, extra: tuple = (0.0, 0.0)) -> None:
    """``st`` with n_k = ``per_stage[k]`` layers of stage k of kind ``other`` instead of ``base``,
    in place (module docstring). Numbers or arrays over plans alike; every value is new, never
    changed in place (stages may share one array: the search's inner stages)."""
    for k, n in enumerate(per_stage):
        d = lambda name: n * (getattr(other, name) - getattr(base, name))  # noqa: E731
        rb = d("recompute")
        st.comp_fwd[k] = st.comp_fwd[k] + d("fwd")
        st.comp_bwd[k] = st.comp_bwd[k] + (d("bwd") + rb)
        st.recompute[k] = st.recompute[k] + rb
        st.tp_fwd[k] = st.tp_fwd[k] + d("tp_fwd")
        st.tp_bwd[k] = st.tp_bwd[k] + d("tp_bwd")
        st.cp_fwd[k] = st.cp_fwd[k] + d("cp_fwd")
        st.cp_bwd[k] = st.cp_bwd[k] + d("cp_bwd")
        st.fsdp_fwd[k] = st.fsdp_fwd[k] + d("fsdp_fwd")
        st.fsdp_bwd[k] = st.fsdp_bwd[k] + d("fsdp_bwd")
        st.wgt[k] = st.wgt[k] + d("wgt")
        st.fwd[k] = st.fwd[k] + (d("fwd") + d("tp_fwd") + d("cp_fwd") + d("fsdp_fwd") + n * extra[0])
        st.bwd[k] = st.bwd[k] + (d("bwd") + rb + d("tp_bwd") + d("cp_bwd") + d("fsdp_bwd") + n * extra[1])


def mixed_stage_activations(stage_act: list, per_stage: list, base_stored, other_stored) -> list:
    """Each stage's activations per micro-batch with n_k of its layers storing ``other_stored``
    bytes instead of ``base_stored``: a_k + n_k·(A_other − A_base)."""
    return [a + n * (other_stored - base_stored) for a, n in zip(stage_act, per_stage)]
