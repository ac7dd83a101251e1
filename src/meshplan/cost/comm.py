"""Which collectives a plan issues, over which groups, and how long each takes.

The groups of each parallel axis follow the plan's rank order (:func:`collectives.placement`);
the per-layer TP and CP collectives and the after-pipeline DP synchronization are those described
in :mod:`meshplan.cost.step`. Shared by :func:`meshplan.estimate.estimate` and the search.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost import collectives as coll
from meshplan.cost.calibration import Calibration
from meshplan.cost.collectives import GroupPlacement
from meshplan.cost.fsdp_copies import fp8_gather_saving
from meshplan.cost.params import (
    embedding_params_per_rank, head_params_per_rank, kv_heads_per_rank, layer_params_per_rank, unit_tensors_per_rank,
)
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import PrecisionRecipe


@dataclass(frozen=True)
class Placements:
    """The group containing rank 0 for each collective a plan issues: TP, CP (ring attention),
    PP (stage-to-stage sends), the ZeRO shard group (dp_shard × cp), the whole DP × CP group
    (ZeRO-0 all-reduce) and the HSDP replica group (every dp_shard-th DP rank)."""

    tp: GroupPlacement
    cp: GroupPlacement
    pp: GroupPlacement
    shard: GroupPlacement
    dpcp: GroupPlacement
    rep: GroupPlacement


def placements(
    cluster: ClusterSpec, tp: int, cp: int, pp: int, dp: int, dp_shard: int, rank_order: tuple[str, ...]
) -> Placements:
    """Where each group of a tp × cp × pp × dp mesh sits (``dp_shard`` = dp without HSDP)."""
    sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
    place = lambda axes, **kw: coll.placement(cluster, sizes, rank_order, axes, **kw)  # noqa: E731
    return Placements(
        tp=place(("tp",)),
        cp=place(("cp",)),
        pp=place(("pp",)),
        shard=place(("dp", "cp"), span={"dp": dp_shard}),
        dpcp=place(("dp", "cp")),
        rep=place(("dp",), every=dp_shard),
    )


def plan_placements(cluster: ClusterSpec, plan) -> Placements:
    """:func:`placements` for a :class:`~meshplan.specs.plan.TrainingPlan`."""
    return placements(cluster, plan.tp, plan.cp, plan.pp, plan.dp, plan.dp_shard or plan.dp, plan.rank_order)


def tp_collective_time(act_msg: float, sp: bool, pl_tp: GroupPlacement, cluster: ClusterSpec, cal: Calibration) -> float:
    """One Megatron TP collective of an n·h·e activation: an all-reduce, or with sequence
    parallelism an all-gather plus a reduce-scatter (same bytes on the wire). 0 without TP."""
    if pl_tp.size <= 1:
        return 0.0
    if sp:
        return coll.collective_time("all_gather", act_msg, pl_tp, cluster, cal) + coll.collective_time(
            "reduce_scatter", act_msg, pl_tp, cluster, cal
        )
    return coll.collective_time("all_reduce", act_msg, pl_tp, cluster, cal)


def cp_kv_bytes(model: ModelSpec, tokens: float, tp: int, act_bytes: int) -> float:
    """Bytes one ring-attention step passes: the local K and V, 2·n·g_r·d·e (g_r K/V heads on this
    TP rank)."""
    return 2 * tokens * kv_heads_per_rank(model, tp) * model.head_dim * act_bytes


def per_tensor_time(op: str, tensors: tuple[int, ...], bytes_per: float, pl: GroupPlacement, cluster: ClusterSpec,
                    cal: Calibration) -> float:
    """Seconds of one collective per parameter tensor, Σᵢ T_op(nᵢ·w): each call pays the ring's
    latency (:func:`meshplan.cost.collectives.collective_time`), so a unit of k tensors costs
    (k − 1) latencies more than one call of its Σnᵢ·w bytes."""
    return sum(coll.collective_time(op, n * bytes_per, pl, cluster, cal) for n in tensors)


def fsdp_unit_times(
    model: ModelSpec,
    tp: int,
    pp: int,
    rec: PrecisionRecipe,
    pl_shard: GroupPlacement,
    cluster: ClusterSpec,
    cal: Calibration,
    fp8_gather: bool = False,
    per_tensor: bool = False,
) -> tuple[float, float, float, float, float, float]:
    """ZeRO-3 / FSDP collectives of one micro-batch, one per unit and direction, before overlap:
    (layer all-gather, layer reduce-scatter, embedding all-gather, embedding reduce-scatter, head
    all-gather, head reduce-scatter). Each unit all-gathers its P·w weight bytes over the shard
    group and reduce-scatters its P·γ gradient bytes (Rajbhandari et al. 2020, Sec. 7.2.2). The
    units are those torchtitan gives FSDP2 (Liang et al. 2024, Sec. 3.1): every decoder layer
    (P_l = :func:`layer_params_per_rank`), the embedding on the first stage (P_emb = V·h/t, plus
    learned positions) and the final norm with the LM head on the last stage (P_head = h + V·h/t,
    or the norm alone when a tied head shares the embedding's weight on one stage). With
    ``fp8_gather`` a layer gathers its Float8Linear weights as FP8 bytes, P_l·w − P_lin·(w − 1)
    (:func:`meshplan.cost.fsdp_copies.fp8_gather_saving`). ``per_tensor`` (DeepSpeed's ZeRO-3 of
    2021, ``zero3_comm`` blocking-per-tensor): one collective per parameter tensor of the unit
    (:func:`meshplan.cost.params.unit_tensors_per_rank`; :func:`per_tensor_time`), an FP8 saving
    spread over them in proportion."""
    sizes = (
        (layer_params_per_rank(model, tp), fp8_gather_saving(model, tp, rec.weight_bytes, fp8_gather)),
        (embedding_params_per_rank(model, tp), 0),
        (head_params_per_rank(model, tp, pp), 0),
    )
    out: list[float] = []
    if per_tensor:
        for (p, saving), parts in zip(sizes, unit_tensors_per_rank(model, tp, pp)):
            gathered = rec.weight_bytes - saving / p if p else rec.weight_bytes  # bytes a parameter moves
            out.append(per_tensor_time("all_gather", parts, gathered, pl_shard, cluster, cal))
            out.append(per_tensor_time("reduce_scatter", parts, rec.grad_bytes, pl_shard, cluster, cal))
        return tuple(out)  # type: ignore[return-value]
    for p, saving in sizes:
        out.append(coll.collective_time("all_gather", p * rec.weight_bytes - saving, pl_shard, cluster, cal))
        out.append(coll.collective_time("reduce_scatter", p * rec.grad_bytes, pl_shard, cluster, cal))
    return tuple(out)  # type: ignore[return-value]


def dp_sync_times(
    params: int,
    zero: int,
    once_per_step: bool,
    shard: int,
    rec: PrecisionRecipe,
    pl: Placements,
    cluster: ClusterSpec,
    cal: Calibration,
    gather_saving: float = 0,
) -> tuple[float, float]:
    """(gradient synchronization, weight all-gather) after a rank's pipeline work, before overlap:
    ZeRO-0 all-reduces the gradients over dp × cp; ZeRO-1/2 (and ZeRO-3 that keeps gradients
    unsharded through the step) reduce-scatter them over the shard group and all-gather the updated
    weights; per-layer ZeRO-3 did both inside the step. HSDP adds an all-reduce of the gradient
    shard across replicas. ``gather_saving``: the bytes FP8 all-gather saves on the rank's layers
    (:func:`meshplan.cost.fsdp_copies.fp8_gather_saving` each), off the weight all-gather."""
    grad_bytes = params * rec.grad_bytes
    if zero == 0:
        grad_comm = coll.collective_time("all_reduce", grad_bytes, pl.dpcp, cluster, cal)
        pg = 0.0
    elif zero in (1, 2) or once_per_step:
        grad_comm = coll.collective_time("reduce_scatter", grad_bytes, pl.shard, cluster, cal)
        pg = coll.collective_time("all_gather", params * rec.weight_bytes - gather_saving, pl.shard, cluster, cal)
    else:
        grad_comm = 0.0
        pg = 0.0
    if pl.rep.size > 1 and zero >= 1:
        grad_comm += coll.collective_time("all_reduce", grad_bytes / shard, pl.rep, cluster, cal)
    return grad_comm, pg
