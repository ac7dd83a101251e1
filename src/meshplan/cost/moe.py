"""Mixture-of-experts layers in a plan: expert parallelism, its all-to-all, and the split of
model state into dense and expert parameters.

Expert parallelism (ep, Lepikhin et al. 2021, GShard, Sec. 2.2; Fedus et al. 2022, Switch
Transformer, Sec. 2.2) spreads the E routed experts of every MoE layer over ``ep`` GPUs, E/ep
each; everything else (attention, router, shared expert, dense layers, embeddings) stays
replicated as before. meshplan's rule, as in Megatron-Core with the expert tensor-parallel size
equal to tp: the ep group is carved out of the data-parallel axis — ``ep`` consecutive dp indices,
so in Megatron's rank order (tp, cp, dp, pp) it sits just outside tp and cp — and ``ep`` must
divide dp and E. Expert parameters are then replicated over the *expert data-parallel* group,
every ep-th dp index times cp: ``N_e = dp·cp/ep`` ranks, over which ZeRO shards their
gradients and optimizer state and the gradients are synchronized (Megatron-Core MoE docs,
"expert data parallel"; DeepSpeed-MoE, Rajbhandari et al. 2022, Sec. 5).

Per MoE layer and micro-batch each GPU dispatches its tokens' k copies to the experts' GPUs and
combines the results back: two all-to-alls forward (dispatch, combine) and two backward (their
gradients), two more with full recompute, each of ``S = n·k·h·e / t`` bytes (n = b·s/c tokens;
with sequence parallelism, which Megatron requires for ep with tp > 1, each TP rank sends its
1/t of them). With tp > 1 the experts are split t ways, so Megatron-Core's all-to-all dispatcher
then all-gathers the dispatched tokens over the TP group and reduce-scatters the experts' output
before the combine (``MoEAlltoAllTokenDispatcher``: ``gather_from_sequence_parallel_region`` after
the dispatch, ``reduce_scatter_to_sequence_parallel_region`` before the combine): one all-gather
and one reduce-scatter of ``n·k·h·e`` each way, where a dense MLP's sequence parallelism moves
``n·h·e``, and outside Transformer Engine's TP overlap (:func:`expert_tp_time`). Routing is
taken as balanced and dropless (no capacity factor: Megatron-Core's default and DeepSeek-V3's
training, report Sec. 2.1.2), the all-to-alls as exposed (not hidden
behind the attention of another micro-batch, as DeepSeek's DualPipe does). With ep = 1 there is
no all-to-all: every GPU holds every expert.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.cost import collectives as coll
from meshplan.cost.calibration import Calibration
from meshplan.cost.collectives import GroupPlacement
from meshplan.cost.comm import Placements, per_tensor_time, tp_collective_time
from meshplan.cost.compose import LayerTimes, StageTimes
from meshplan.cost.layer_mix import add_layer_mix
from meshplan.cost.params import expert_params_per_rank, layer_params_per_rank, moe_layer_tensors_per_rank
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan


def moe_layers_per_stage(model: ModelSpec, split: tuple[int, ...]) -> list[int]:
    """MoE layers of each virtual stage (``split``: layers per virtual stage in model order)."""
    flags = model.moe_layers
    out, start = [], 0
    for n in split:
        out.append(sum(flags[start:start + n]))
        start += n
    return out


def alltoall_bytes(model: ModelSpec, tokens: float, tp: int, sp: bool, act_bytes: int) -> float:
    """One dispatch (or combine) all-to-all's send buffer per GPU: ``n·k·h·e``, ÷ t with
    sequence parallelism."""
    return tokens * model.experts_per_token * model.hidden * act_bytes / (tp if sp else 1)


def expert_placements(cluster: ClusterSpec, plan: TrainingPlan) -> tuple[GroupPlacement, GroupPlacement]:
    """(ep group, expert data-parallel group) containing rank 0: ep consecutive dp indices, and
    every ep-th dp index times all of cp."""
    return expert_group_placements(cluster, plan.tp, plan.cp, plan.pp, plan.dp, plan.ep, plan.rank_order)


def expert_group_placements(
    cluster: ClusterSpec, tp: int, cp: int, pp: int, dp: int, ep: int, rank_order: tuple[str, ...]
) -> tuple[GroupPlacement, GroupPlacement]:
    """:func:`expert_placements` from the degrees and the rank order."""
    sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
    ep_group = coll.placement(cluster, sizes, rank_order, ("dp",), span={"dp": ep})
    edp = coll.placement(cluster, sizes, rank_order, ("dp", "cp"), every={"dp": ep})
    return ep_group, edp


def expert_dp_placements(pl: Placements, edp: GroupPlacement) -> Placements:
    """The plan's placements with the ZeRO shard and data-parallel groups replaced by the expert
    data-parallel group (what the expert parameters synchronize over; no HSDP replicas)."""
    return replace(pl, shard=edp, dpcp=edp, rep=GroupPlacement(1, 1, 1, 1))


def expert_tp_time(model: ModelSpec, tokens: float, pl_tp: GroupPlacement, act_bytes: int,
                   cluster: ClusterSpec, cal: Calibration) -> float:
    """One direction's expert TP exchange of one MoE layer and micro-batch: the all-gather of the
    dispatched tokens and the reduce-scatter of the experts' output over the TP group, each of
    ``n·k·h·e`` (module docstring); exposed, in the MLP half's place. 0 without TP."""
    if pl_tp.size <= 1:
        return 0.0
    return tp_collective_time(tokens * model.experts_per_token * model.hidden * act_bytes, True, pl_tp, cluster, cal)


def alltoall_times(
    model: ModelSpec, tokens: float, tp: int, sp: bool, act_bytes: int, full_recompute: bool,
    ep_group: GroupPlacement, cluster: ClusterSpec, cal: Calibration,
) -> tuple[float, float]:
    """(forward, backward) exposed all-to-all seconds of one MoE layer and micro-batch: 2 and 2
    (4 with full recompute) of :func:`alltoall_bytes` over the ep group; 0 when ep = 1."""
    if ep_group.size <= 1:
        return 0.0, 0.0
    one = coll.collective_time("all_to_all", alltoall_bytes(model, tokens, tp, sp, act_bytes), ep_group, cluster, cal)
    return 2 * one, (4 if full_recompute else 2) * one


@dataclass(frozen=True)
class ExpertComm:
    """Per virtual stage: exposed all-to-all seconds per micro-batch, forward and backward."""

    fwd: list
    bwd: list


def add_moe_layers(
    st: StageTimes, moe_per_stage: list[int], dense: LayerTimes, moe: LayerTimes, a2a: tuple[float, float]
) -> ExpertComm:
    """Turn ``st``, computed as if every layer were a dense one (``dense``), into the stage times
    of the real mix, in place: stage k's n_m MoE layers add n_m × (MoE − dense layer) to each part
    (compute, recompute, TP with the expert exchange, ZeRO-3; :func:`meshplan.cost.layer_mix.add_layer_mix`)
    and n_m × the all-to-alls to its forward and backward."""
    add_layer_mix(st, moe_per_stage, dense, moe, a2a)
    return ExpertComm([n_m * a2a[0] for n_m in moe_per_stage], [n_m * a2a[1] for n_m in moe_per_stage])


def rank_expert_params(model: ModelSpec, tp: int, ep: int, n_moe_layers: int) -> int:
    """Routed-expert parameters one GPU holds apart from the rest, n_m layers × E/ep experts
    split t ways; 0 when ep = 1, where the experts are replicated like every other weight (and
    sharded with them, HSDP included)."""
    return n_moe_layers * expert_params_per_rank(model, tp, ep) if n_moe_layers and ep > 1 else 0


def expert_shard_degree(plan: TrainingPlan) -> int:
    """N_e = dp·cp/ep: ranks holding the same experts, over which ZeRO shards their state."""
    return plan.dp // plan.ep * plan.cp


def moe_fsdp_layer_times(
    model: ModelSpec, tp: int, ep: int, rec, pl_shard: GroupPlacement, edp: GroupPlacement,
    cluster: ClusterSpec, cal: Calibration, per_tensor: bool = False,
) -> tuple[float, float]:
    """ZeRO-3 / FSDP (all-gather, reduce-scatter) of one MoE layer before overlap: its dense part
    (attention, router, shared expert) over the shard group, its E/ep experts over the expert
    data-parallel group (Rajbhandari et al. 2020, Sec. 7.2.2, per parameter group); ``per_tensor``:
    one collective per parameter tensor (:func:`meshplan.cost.params.moe_layer_tensors_per_rank`,
    :func:`meshplan.cost.comm.per_tensor_time`)."""
    if per_tensor:
        dense, experts = moe_layer_tensors_per_rank(model, tp, ep)
        groups = ((dense + experts, pl_shard),) if ep == 1 else ((dense, pl_shard), (experts, edp))
        return (sum(per_tensor_time("all_gather", parts, rec.weight_bytes, pl, cluster, cal) for parts, pl in groups),
                sum(per_tensor_time("reduce_scatter", parts, rec.grad_bytes, pl, cluster, cal) for parts, pl in groups))
    if ep == 1:  # every GPU holds every expert: one unit over the shard group, as a dense layer
        layer = layer_params_per_rank(model, tp, moe=True)
        return (coll.collective_time("all_gather", layer * rec.weight_bytes, pl_shard, cluster, cal),
                coll.collective_time("reduce_scatter", layer * rec.grad_bytes, pl_shard, cluster, cal))
    experts = expert_params_per_rank(model, tp, ep)
    dense = layer_params_per_rank(model, tp, moe=True, ep=ep) - experts
    ag = coll.collective_time("all_gather", dense * rec.weight_bytes, pl_shard, cluster, cal)
    ag += coll.collective_time("all_gather", experts * rec.weight_bytes, edp, cluster, cal)
    rs = coll.collective_time("reduce_scatter", dense * rec.grad_bytes, pl_shard, cluster, cal)
    rs += coll.collective_time("reduce_scatter", experts * rec.grad_bytes, edp, cluster, cal)
    return ag, rs
