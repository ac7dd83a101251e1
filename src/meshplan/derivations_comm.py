"""The derivations of a plan's collectives: each communication term of the step with its
operation, group, buffer and time, split into latency (NCCL's α₀ + steps·α) and bandwidth, as
:mod:`meshplan.cost.collectives` prices it (what ``meshplan explain`` shows under ``comm.*``).

Every time here is recomputed with :func:`~meshplan.cost.collectives.collective_cost` on the
group the composition used (:meth:`meshplan.cost.terms.Terms.place`), so it equals the term the
estimate added (``collective_cost(...).time == collective_time(...)``, tested); each row says how
many times a layer, a micro-batch or the step issues it.
"""

from __future__ import annotations

from meshplan.cost.collectives import CollectiveCost, GroupPlacement, collective_cost
from meshplan.cost.moe import alltoall_bytes
from meshplan.explain import Derivation
from meshplan.units import fmt_bytes, fmt_seconds

SOURCE = "meshplan.cost.collectives (Patarasuk & Yuan 2009; NCCL src/graph/tuning.cc latencies)"


def _where(pl: GroupPlacement) -> str:
    """A group as ``n GPUs (k per domain x g domains)``."""
    return f"{pl.size} GPUs" + (f" ({pl.per_node} per domain x {pl.nodes} domains)" if pl.nodes > 1 else " (one domain)")


def _p2p_where(pl: GroupPlacement) -> str:
    """Where a stage-to-stage send goes: between neighbours of the ``pl.size``-stage pipeline."""
    return f"neighbouring stages of {pl.size} ({'across domains' if pl.nodes > 1 else 'inside one domain'})"


def _one(c: CollectiveCost) -> str:
    """One collective's time as latency + bandwidth."""
    return f"{fmt_seconds(c.time)} = {fmt_seconds(c.latency_time)} latency + {fmt_seconds(c.time - c.latency_time)} bandwidth"


def _row(name: str, op: str, nbytes: float, pl: GroupPlacement, est, cal, times: str) -> tuple[str, str]:
    """One collective's line: its buffer, group and one call's time, and how often it is issued."""
    c = collective_cost(op, nbytes, pl, est.cluster, cal)
    where = _p2p_where(pl) if op == "send_recv" else _where(pl)
    return name, f"{fmt_bytes(nbytes)} {'between' if op == 'send_recv' else 'over'} {where}: {_one(c)}; {times}"


def collective_derivations(est, layers) -> list[Derivation]:
    """``comm.collectives`` (every collective a micro-batch issues, one line each; none on one GPU)
    and, for a mixture of experts with ep > 1, ``comm.ep_all_to_all`` (the expert all-to-all in full)."""
    p, m, terms = est.plan, est.model, layers.terms
    pl = terms.place(p.tp, p.cp, p.pp, p.dp, p.dp_shard or p.dp)
    cm = layers.cm
    rows: list[tuple[str, str]] = []
    sp = p.sequence_parallel and p.tp > 1
    if p.tp > 1:
        ops = (("AG", "all_gather"), ("RS", "reduce_scatter")) if sp else (("AR", "all_reduce"),)
        for short, op in ops:
            per_layer = ("2 per layer forward, 4 backward: the input projections' inputs re-gathered (the n·h·e activation)"
                         if short == "AG" and p.stack.tp_backward_overlap else "2 per layer forward, 2 backward (the n·h·e activation)")
            rows.append(_row(f"TP {short}", op, cm.act_msg, pl.tp, est, terms.cal, per_layer))
    if p.cp > 1:
        rows.append(("CP K|V", f"{fmt_seconds(cm.cp_kv)} a ring step forward, {fmt_seconds(cm.cp_dkv)} backward, over "
                               f"{_where(pl.cp)} (time.layer: what stays exposed)"))
    if p.pp > 1 and p.stack.pp_scatter_gather:  # 1/t of each message sent, then all-gathered over TP
        rows.append(_row("PP p2p", "send_recv", cm.p2p_bytes / p.tp, pl.pp, est, terms.cal,
                         "1/t of the message per micro-batch and stage boundary, forward and backward"))
        rows.append(_row("PP gather", "all_gather", cm.p2p_bytes, pl.tp, est, terms.cal,
                         f"after each receive, the message rebuilt (pp_scatter_gather); transfer {fmt_seconds(cm.p2p)} in all"))
    elif p.pp > 1:
        rows.append(_row("PP p2p", "send_recv", cm.p2p_bytes, pl.pp, est, terms.cal,
                         "per micro-batch and stage boundary, forward and backward"))
    if m.is_moe and p.ep > 1:
        ep_group = terms.expert_place(p.tp, p.cp, p.pp, p.dp, p.ep)[0]
        rows.append(_row("EP a2a", "all_to_all", _a2a_bytes(est, terms.e), ep_group, est, terms.cal,
                         "2 per MoE layer forward (dispatch, combine), 2 backward (comm.ep_all_to_all)"))
        if p.tp > 1:
            rows.append(("expert TP", f"{fmt_seconds(cm.expert_tp)} per MoE layer and direction: the dispatched tokens "
                                      f"all-gathered over TP and the experts' output reduce-scattered (meshplan.cost.moe)"))
    if layers.fsdp_per_layer:
        rows.append(("ZeRO-3 unit", f"all-gather {fmt_seconds(layers.u.all_gather)}, reduce-scatter "
                                    f"{fmt_seconds(layers.u.reduce_scatter)} per layer over {_where(pl.shard)} (time.fsdp)"))
    t = est.time
    hidden = t.hidden_comm
    if p.dp * p.cp > 1:
        rows.append(("DP sync", f"gradients {fmt_seconds(t.dp_comm_s)} exposed, {fmt_seconds(hidden.get('dp_grad', 0.0))} hidden; "
                                f"weight all-gather {fmt_seconds(t.param_gather_s)} exposed, "
                                f"{fmt_seconds(hidden.get('param_gather', 0.0))} hidden; over {_where(pl.shard if p.zero else pl.dpcp)}"))
    if not rows:  # one GPU: nothing to communicate
        return []
    cal = terms.cal
    out = [Derivation(
        "comm.collectives", "Collectives of the plan (one call each)",
        "t = α₀ + steps·α + bytes on the wire / (η·B) per tier (NCCL's flat ring across domains); "
        "AG all-gather, RS reduce-scatter, AR all-reduce, p2p send/recv, a2a all-to-all",
        (("α₀", f"{fmt_seconds(cal.collective_base_latency)} per call"),
         ("α", f"{fmt_seconds(est.cluster.scale_up.latency)} per step in a domain, "
               f"{fmt_seconds(est.cluster.scale_out.latency)} across domains"),) + tuple(rows),
        f"{len(rows)} kinds", SOURCE)]
    if m.is_moe and p.ep > 1:
        out.append(_ep_all_to_all(est, terms, layers))
    return out


def _a2a_bytes(est, e: int) -> float:
    """One dispatch's send buffer per GPU (:func:`meshplan.cost.moe.alltoall_bytes`), ``e`` bytes
    per activation element."""
    p = est.plan
    tokens = p.micro_batch * p.seq_len / p.cp
    return alltoall_bytes(est.model, tokens, p.tp, p.sequence_parallel and p.tp > 1, e)


def _ep_all_to_all(est, terms, layers) -> Derivation:
    """The expert all-to-all of one MoE layer and micro-batch: its buffer, group, time and count."""
    p, m = est.plan, est.model
    ep_group = terms.expert_place(p.tp, p.cp, p.pp, p.dp, p.ep)[0]
    S = _a2a_bytes(est, terms.e)
    c = collective_cost("all_to_all", S, ep_group, est.cluster, terms.cal)
    per = 4 if p.recompute == "full" else 2
    fwd, bwd = terms.a2a(p.tp, p.cp, p.pp, p.dp, p.ep, p.micro_batch, p.sequence_parallel and p.tp > 1, p.recompute == "full")
    return Derivation(
        "comm.ep_all_to_all", "Expert all-to-all (one MoE layer, one micro-batch)",
        "S = n·k·h·e / t (t with sequence parallelism); t_a2a = (n_ep − 1)·max(α, α_out) + max((k_d − 1)/n_ep·S/(η·B), "
        "(n_ep − k_d)/n_ep·S/(η·B_out)); 2 forward + " + f"{per} backward",
        (("n", f"{p.micro_batch * p.seq_len // p.cp:,} tokens per micro-batch and CP rank"),
         ("k", f"{m.experts_per_token} experts per token"), ("h", str(m.hidden)), ("e", f"{terms.e} bytes"),
         ("t", str(p.tp)), ("S", fmt_bytes(S)), ("group", _where(ep_group)), ("one", _one(c))),
        f"{fmt_seconds(fwd)} forward, {fmt_seconds(bwd)} backward per MoE layer and micro-batch, exposed",
        "meshplan.cost.moe.alltoall_times; Lepikhin et al. 2021 (GShard) Sec. 2.2; Megatron-Core MoEAlltoAllTokenDispatcher")
