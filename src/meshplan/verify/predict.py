"""The collectives meshplan's model charges for one step, per pipeline rank, as a list (with
FSDP2's copies beside them).

:func:`meshplan.estimate.estimate` composes communication *times*; this module lists the same
collectives it times, with the same sizes from the same cost functions, so that they can be counted
against a real run. Per micro-batch on a GPU holding ``n = b·s`` tokens (cp = 1), with ``e`` bytes
per activation element, ``w``/``γ`` bytes per weight/gradient, and the pipeline rank's virtual
stages (first stage: embedding; last: final norm and LM head):

==============  ==============================================  ================================
axis            collective (bytes, nccl-tests size)             when
==============  ==============================================  ================================
tp, no SP       2 all-reduce (n·h·e) per layer forward and      every micro-batch
                backward; embedding all-reduce forward; LM
                head all-reduce of the input gradient backward
tp, SP          2 all-gather + 2 reduce-scatter (n·h·e) per     every micro-batch
                layer, forward and backward; embedding
                reduce-scatter forward, all-gather backward;
                LM head all-gather forward, reduce-scatter
                backward
dp, ZeRO-0      all-reduce of the rank's gradients (P·γ)        once per step, in the last
                                                                backward
dp, ZeRO-3      all-gather (P_layer·w) forward, again in        every micro-batch
                backward when weights are resharded after
                forward, reduce-scatter (P_layer·γ) backward,
                per layer; the same for the embedding unit
                (P_emb, first stage) and the final norm + LM
                head unit (P_head, last stage, kept gathered
                after forward: no backward all-gather)
fsdp2           on the torch stacks, FSDP2's copy-out (2·P·w,   with each all-gather and
                bytes read and written) and copy-in             reduce-scatter above
                (P·(w + γ)) of each unit
                (:mod:`meshplan.cost.fsdp_copies`)
pp              send + recv of the activation (n·h·e, ÷t with   every micro-batch, both ways,
                SP) at every stage boundary between ranks       at each stage boundary
cp              ring attention: c − 1 sends + recvs of K and    every micro-batch, per layer
                V (n·g·(d + d_v)·e) forward; 2·(c − 1)
                backward (K and V, and their gradients)
==============  ==============================================  ================================

``tests/test_verify_comm.py`` checks that timing this list with
:func:`meshplan.cost.collectives.collective_time` gives back ``estimate``'s TP communication time.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.cp_exchange import cp_exchange_bytes
from meshplan.cost.fsdp_copies import copy_in_bytes, copy_out_bytes, runs_fsdp2
from meshplan.cost.params import embedding_params_per_rank, head_params_per_rank, layer_params_per_rank
from meshplan.pipeline.schedules import stage_style
from meshplan.pipeline.stages import layer_split, stages_of_rank
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.verify.compare import COLLECTIVE_BYTES, EXACT, Comparison, KnownDifference, Row
from meshplan.verify.layout import hsdp, torch_plan


@dataclass(frozen=True)
class Collective:
    """``count`` collectives of ``bytes`` each over ``axis`` in ``phase`` (forward, backward,
    pipeline: the p2p transfers, optimizer)."""

    axis: str
    kind: str
    phase: str
    bytes: float
    count: int

    @property
    def total_bytes(self) -> float:
        return self.bytes * self.count


def rank_stages(model: ModelSpec, plan: TrainingPlan, rank: int) -> tuple[list[int], list[int]]:
    """The virtual stages of pipeline rank ``rank`` and the layers of every virtual stage."""
    split = list(layer_split(model.n_layers, plan.pp, plan.vpp, plan.layer_split))
    mine = stages_of_rank(rank, plan.pp, plan.vpp, stage_style(plan.schedule)) if plan.pp > 1 else [0]
    return list(mine), split


def activation_bytes(model: ModelSpec, plan: TrainingPlan) -> float:
    """One activation tensor on one GPU, n·h·e: the TP message (nccl-tests size)."""
    return plan.micro_batch * plan.seq_len / plan.cp * model.hidden * plan.precision.activation_bytes


def predicted(model: ModelSpec, plan: TrainingPlan, rank: int) -> list[Collective]:
    """Every collective meshplan's model charges pipeline rank ``rank`` in one step."""
    mine, split = rank_stages(model, plan, rank)
    last = len(split) - 1
    m, t = plan.grad_accum, plan.tp
    sp = plan.sequence_parallel and t > 1
    act = activation_bytes(model, plan)
    layers = sum(split[k] for k in mine)
    first_here, last_here = 0 in mine, last in mine
    out: list[Collective] = []
    if t > 1:
        if sp:
            for phase in ("forward", "backward"):
                out.append(Collective("tp", "all_gather", phase, act, m * 2 * layers))
                out.append(Collective("tp", "reduce_scatter", phase, act, m * 2 * layers))
            if first_here:
                out.append(Collective("tp", "reduce_scatter", "forward", act, m))
                out.append(Collective("tp", "all_gather", "backward", act, m))
            if last_here:
                out.append(Collective("tp", "all_gather", "forward", act, m))
                out.append(Collective("tp", "reduce_scatter", "backward", act, m))
        else:
            out.append(Collective("tp", "all_reduce", "forward", act, m * (2 * layers + first_here)))
            out.append(Collective("tp", "all_reduce", "backward", act, m * (2 * layers + last_here)))
    params_layer = layer_params_per_rank(model, t)
    params = layers * params_layer
    if first_here:
        params += embedding_params_per_rank(model, t)
    if last_here:
        params += head_params_per_rank(model, t, plan.pp)
    rec = plan.precision
    shard_axis = "dp_shard" if hsdp(plan) else "dp"
    if plan.dp > 1 and plan.zero == 0:
        out.append(Collective("dp", "all_reduce", "backward", params * rec.grad_bytes, 1))
    elif plan.dp > 1 and plan.zero in (1, 2):
        out.append(Collective(shard_axis, "reduce_scatter", "backward", params * rec.grad_bytes, 1))
        out.append(Collective(shard_axis, "all_gather", "optimizer", params * rec.weight_bytes, 1))
    elif plan.dp > 1 and plan.zero == 3:
        # FSDP units on this rank: (parameters, how many, gathered again before backward)
        units = [(params_layer, layers, plan.stack.reshard_after_forward)]
        if first_here:
            kept = model.tied_embeddings and plan.pp == 1  # the LM head reuses the weight at the end of forward
            units.append((embedding_params_per_rank(model, t), 1, plan.stack.reshard_after_forward and not kept))
        if last_here:
            units.append((head_params_per_rank(model, t, plan.pp), 1, False))
        fsdp2 = runs_fsdp2(plan.zero, plan.stack.kernels)
        for p_unit, n, again in units:
            out.append(Collective(shard_axis, "all_gather", "forward", p_unit * rec.weight_bytes, m * n))
            if again:
                out.append(Collective(shard_axis, "all_gather", "backward", p_unit * rec.weight_bytes, m * n))
            out.append(Collective(shard_axis, "reduce_scatter", "backward", p_unit * rec.grad_bytes, m * n))
            if fsdp2:  # a copy-out after every all-gather, a copy-in before every reduce-scatter
                out.append(Collective("fsdp2", "copy_out", "forward", copy_out_bytes(p_unit, rec), m * n))
                if again:
                    out.append(Collective("fsdp2", "copy_out", "backward", copy_out_bytes(p_unit, rec), m * n))
                out.append(Collective("fsdp2", "copy_in", "backward", copy_in_bytes(p_unit, rec), m * n))
    if hsdp(plan) and plan.zero >= 1:
        out.append(Collective("dp_rep", "all_reduce", "backward", params * rec.grad_bytes / plan.shard_degree, 1))
    if plan.cp > 1:  # ring attention per layer: c − 1 K/V steps forward, K/V and dK/dV backward
        kv, _ = cp_exchange_bytes(model, plan.micro_batch * plan.seq_len / plan.cp, t, plan.precision.activation_bytes, "fused")
        for kind in ("send", "recv"):
            out.append(Collective("cp", kind, "forward", kv, m * layers * (plan.cp - 1)))
            out.append(Collective("cp", kind, "backward", kv, m * layers * 2 * (plan.cp - 1)))
    if plan.pp > 1:
        p2p = act / (t if sp else 1)
        owner = {k: r for r in range(plan.pp) for k in rank_stages(model, plan, r)[0]}
        boundaries = sum((k < last and owner[k + 1] != rank) + (k > 0 and owner[k - 1] != rank) for k in mine)
        out.append(Collective("pp", "send", "pipeline", p2p, m * boundaries))
        out.append(Collective("pp", "recv", "pipeline", p2p, m * boundaries))
    return [c for c in out if c.count]


# ---- what torch issues beyond meshplan's model ----------------------------------------------------

UNFUSED_COLWISE = KnownDifference(
    "unfused-column-parallel-inputs",
    "torch's ColwiseParallel on the Hugging Face model's separate q, k, v (and gate, up) projections "
    "all-reduces each projection's input gradient on its own in backward: 3 + 2 all-reduces per Llama "
    "layer where Megatron's fused QKV and gate|up linears issue 1 + 1 (2 + 1 extra of n·h·e per layer "
    "and micro-batch). Sequence parallelism gathers once per block (PrepareModuleInput) and so matches.",
)
LOSS_PARALLEL = KnownDifference(
    "loss-parallel-cross-entropy",
    "The vocabulary-parallel cross-entropy (torch's loss_parallel, like Megatron's) all-reduces three "
    "per-token statistics (max logit, sum of exponentials, target logit: b·s fp32 each) per micro-batch "
    "on the last stage; meshplan's model does not count them (b·s·4 bytes, against n·h·e per layer).",
)
SP_NORM_GRADS = KnownDifference(
    "sp-norm-grads-partial",
    "With sequence parallelism the norm weights are replicated DTensors whose gradients come out "
    "Partial; DTensor all-reduces such a gradient (h fp32) every time an op reads it, which is 3 times "
    "in AdamW's single-tensor step, per norm (2 per layer, plus the final norm on the last stage); "
    "under FSDP2 its post-backward reduces it once per micro-batch instead. "
    "Megatron all-reduces them once per step; meshplan's model counts neither (h bytes each).",
)


ZERO1_COLLECTIVES = KnownDifference(
    "zero-redundancy-optimizer-collectives",
    "torch's ZeRO-1 (DDP with ZeroRedundancyOptimizer) all-reduces the gradients where Megatron's "
    "distributed optimizer, which meshplan models, reduce-scatters them (P·γ either way in nccl-tests' "
    "sizes; on the wire 2(N−1)/N against (N−1)/N), and after its step each rank broadcasts the "
    "parameters it updated, one bucket per rank, where Megatron all-gathers them (P·w in all).",
)
HSDP_PER_UNIT = KnownDifference(
    "hsdp-all-reduce-per-unit",
    "FSDP2's HSDP all-reduces each unit's gradient shard across replicas in the unit's post-backward "
    "(on the last micro-batch, set_requires_all_reduce): one all-reduce per unit where meshplan counts "
    "one of the stage's whole shard, P·γ/N bytes in all either way.",
)


def known_extra(model: ModelSpec, plan: TrainingPlan, rank: int) -> list[tuple[KnownDifference, Collective]]:
    """The collectives torch's layout issues that meshplan's model does not describe, each with
    its named difference (a negative count: one meshplan charges that torch replaces)."""
    mine, split = rank_stages(model, plan, rank)
    last_here = len(split) - 1 in mine
    layers = sum(split[k] for k in mine)
    m, t = plan.grad_accum, plan.tp
    sp = plan.sequence_parallel and t > 1
    out: list[tuple[KnownDifference, Collective]] = []
    if plan.dp > 1 and plan.zero == 1:
        for c in predicted(model, plan, rank):
            if c.axis == "dp" and c.kind == "reduce_scatter":
                out.append((ZERO1_COLLECTIVES, Collective("dp", "reduce_scatter", c.phase, c.bytes, -1)))
                out.append((ZERO1_COLLECTIVES, Collective("dp", "all_reduce", c.phase, c.bytes, 1)))
            if c.axis == "dp" and c.kind == "all_gather":
                out.append((ZERO1_COLLECTIVES, Collective("dp", "all_gather", c.phase, c.bytes, -1)))
                out.append((ZERO1_COLLECTIVES, Collective("dp", "broadcast", c.phase, c.bytes / plan.dp, plan.dp)))
    if hsdp(plan) and plan.zero == 3:
        units = layers + (0 in mine) + last_here
        out.append((HSDP_PER_UNIT, Collective("dp_rep", "all_reduce", "backward", 0.0, units - 1)))
    if t > 1 and not sp:
        extra = 2 + (1 if model.gated_mlp else 0)
        out.append((UNFUSED_COLWISE, Collective("tp", "all_reduce", "backward", activation_bytes(model, plan), m * layers * extra)))
    if t > 1 and last_here:
        out.append((LOSS_PARALLEL, Collective("tp", "all_reduce", "forward", plan.micro_batch * plan.seq_len * 4, 3 * m)))
    if sp:
        norms = 2 * layers + (1 if last_here else 0)
        size = model.hidden * plan.precision.weight_bytes
        if plan.dp > 1 and plan.zero == 3:  # FSDP2 reduces the Partial gradient once, in its post-backward
            out.append((SP_NORM_GRADS, Collective("tp", "all_reduce", "backward", size, m * norms)))
        else:
            out.append((SP_NORM_GRADS, Collective("tp", "all_reduce", "optimizer", size, 3 * norms)))
    return out


def _aggregate(items) -> dict[tuple[str, str, str], list[float]]:
    agg: dict[tuple[str, str, str], list[float]] = {}
    for axis, kind, phase, nbytes, count in items:
        a = agg.setdefault((axis, kind, phase), [0, 0.0])
        a[0] += count
        a[1] += nbytes * count
    return agg


def measured_aggregate(records: list[dict]) -> dict[tuple[str, str, str], list[float]]:
    """(axis, kind, phase) -> [count, bytes] of one rank's counted step."""
    return _aggregate((r["axis"], r["kind"], r["phase"], r["bytes"], 1) for r in records)


def compare(model: ModelSpec, plan: TrainingPlan, results: list[dict]) -> Comparison:
    """Rows per pipeline rank and (axis, collective, phase): count (exact) and bytes (1 %).
    ``results`` are :func:`meshplan.verify.launch.launch`'s per-rank dicts for this plan. Ranks of
    one pipeline rank are shown once when their measurements agree, else each on its own."""
    asked, plan = plan, torch_plan(plan)
    device = results[0].get("device", "cpu") if results else "cpu"
    group = "NCCL process group (one GPU per rank)" if device == "cuda" else "gloo CPU process group"
    c = Comparison("comm", f"Collectives (and FSDP2's copies) of one step ({plan.grad_accum} micro-batches of {plan.micro_batch} x {plan.seq_len} tokens)")
    groups: dict[int, list[dict]] = {}
    for res in results:
        groups.setdefault(res["pp_rank"], []).append(res)
    shown = []
    for pp_rank in sorted(groups):
        meas = [(res["rank"], measured_aggregate(res["records"])) for res in groups[pp_rank]]
        if all(a == meas[0][1] for _, a in meas):
            shown.append((("ranks " if len(meas) > 1 else "rank ") + ",".join(str(r) for r, _ in meas), pp_rank, meas[0][1]))
        else:
            shown.extend((f"rank {r}", pp_rank, a) for r, a in meas)
    for label, pp_rank, got in shown:
        pred = _aggregate((x.axis, x.kind, x.phase, x.bytes, x.count) for x in predicted(model, plan, pp_rank))
        extra = known_extra(model, plan, pp_rank)
        known = _aggregate((x.axis, x.kind, x.phase, x.bytes, x.count) for _, x in extra)
        names: dict[tuple[str, str, str], list[KnownDifference]] = {}
        for k, x in extra:
            names.setdefault((x.axis, x.kind, x.phase), []).append(k)
        where = f"{label} (pp {pp_rank})" if plan.pp > 1 else label
        for key in sorted(set(got) | set(pred) | set(known)):
            g, p, k = got.get(key, [0, 0.0]), pred.get(key, [0, 0.0]), known.get(key, [0, 0.0])
            notes = names.get(key, [])
            tag = " ".join(key)
            c.add(Row(f"{where}: {tag}: count", g[0], p[0], EXACT, "ops", known=k[0], notes=tuple(n.name for n in notes)), *notes)
            c.add(Row(f"{where}: {tag}: bytes", g[1], p[1], EXACT if key[0] == "fsdp2" else COLLECTIVE_BYTES, "B", known=k[1],
                      notes=tuple(n.name for n in notes)), *notes)
    c.setup = {
        "model": model.name, "tp": plan.tp, "cp": plan.cp, "pp": plan.pp, "dp": plan.dp, "zero": asked.zero, "dp_shard": plan.dp_shard,
        "meshplan_plan": {"zero": plan.zero, "reshard_after_forward": plan.stack.reshard_after_forward},
        "sequence_parallel": plan.sequence_parallel and plan.tp > 1, "schedule": plan.schedule if plan.pp > 1 else None,
        "micro_batches": plan.grad_accum, "micro_batch": plan.micro_batch, "seq_len": plan.seq_len,
        "device": device,
        "how": f"{group}, one counted step after two warm-up steps, TorchDispatchMode on c10d ops and FSDP2's copy ops",
    }
    if plan.cp > 1:
        c.setup["cp"] = plan.cp
        c.setup["how"] = (f"reference ring attention (meshplan.verify.ring) of the model's attention shapes on a {group} "
                          "of cp ranks, one step, TorchDispatchMode on c10d ops")
        agree = sum(bool(res.get("matches_full_attention")) for res in results)
        c.add(Row("ranks whose ring attention equals full attention (output, dQ, dK, dV)", agree, len(results), EXACT, "ranks"))
    return c
