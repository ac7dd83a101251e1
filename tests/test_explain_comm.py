"""``meshplan explain`` derives every collective of a plan (``comm.collectives``) and the expert
all-to-all (``comm.ep_all_to_all``): each time shown is the one the estimate used."""

from __future__ import annotations

import pytest

from meshplan import ClusterSpec, TrainingPlan, estimate, load_gpu, load_model
from meshplan.cost import collectives as coll
from meshplan.cost.moe import alltoall_bytes, expert_group_placements
from meshplan.units import fmt_seconds
from test_bad_input import run_cli

H100 = load_gpu("h100-sxm-80gb")


@pytest.fixture(scope="module")
def mixtral():
    plan = TrainingPlan.of(tp=2, pp=4, dp=8, ep=8, global_batch=64, seq_len=4096)
    return estimate(load_model("mixtral-8x7b"), ClusterSpec.of(H100, 64), plan)


def _derivation(est, key):
    return next(d for d in est.derivations if d.key == key)


def test_the_expert_all_to_all_is_derived_as_priced(mixtral):
    est, p = mixtral, mixtral.plan
    d = _derivation(est, "comm.ep_all_to_all")
    S = alltoall_bytes(est.model, p.micro_batch * p.seq_len, p.tp, True, 2)
    assert S == 1 * 4096 * 2 * 4096 * 2 / 2  # n·k·h·e / t: 32 MiB
    group = expert_group_placements(est.cluster, p.tp, p.cp, p.pp, p.dp, p.ep, p.rank_order)[0]
    assert (group.size, group.per_node, group.nodes) == (8, 4, 2)  # tp 2 inside: 4 of the 8 per node
    one = coll.collective_time("all_to_all", S, group, est.cluster, est.calibration)
    # dispatch and combine forward (2), their gradients backward (2)
    assert d.value == f"{fmt_seconds(2 * one)} forward, {fmt_seconds(2 * one)} backward per MoE layer and micro-batch, exposed"
    # NCCL's latency: 7 peers, each a network step of 14 µs (the slower tier)
    lat = coll.collective_cost("all_to_all", S, group, est.cluster, est.calibration).latency_time
    assert lat == pytest.approx(7 * 14e-6, rel=1e-12)


def test_every_collective_kind_of_the_plan_has_a_row(mixtral):
    rows = dict(_derivation(mixtral, "comm.collectives").symbols)
    assert {"TP AG", "TP RS", "PP p2p", "EP a2a", "expert TP", "DP sync"} <= set(rows)
    assert "2 per MoE layer forward (dispatch, combine)" in rows["EP a2a"]
    dense = estimate(load_model("llama3-8b"), ClusterSpec.of(H100, 16), TrainingPlan.of(tp=8, dp=2, global_batch=16, seq_len=4096,
                                                                                        sequence_parallel=False))
    rows = dict(_derivation(dense, "comm.collectives").symbols)
    assert "TP AR" in rows and "EP a2a" not in rows and not any(d.key == "comm.ep_all_to_all" for d in dense.derivations)


def test_the_tp_rows_are_the_layers_collectives(mixtral):
    """The rows' times are the ones the layer added: ``tp_collective_time`` is AG + RS of n·h·e."""
    from meshplan.cost.comm import placements, tp_collective_time
    from meshplan.units import fmt_bytes

    est, p = mixtral, mixtral.plan
    rows = dict(_derivation(est, "comm.collectives").symbols)
    act = p.micro_batch * p.seq_len * est.model.hidden * 2
    pl = placements(est.cluster, p.tp, p.cp, p.pp, p.dp, p.dp, p.rank_order).tp
    ag = coll.collective_time("all_gather", act, pl, est.cluster, est.calibration)
    rs = coll.collective_time("reduce_scatter", act, pl, est.cluster, est.calibration)
    assert ag + rs == tp_collective_time(act, True, pl, est.cluster, est.calibration)
    assert rows["TP AG"].startswith(f"{fmt_bytes(act)} over 2 GPUs (one domain): {fmt_seconds(ag)} = ")
    assert rows["TP RS"].startswith(f"{fmt_bytes(act)} over 2 GPUs (one domain): {fmt_seconds(rs)} = ")


def test_explain_cli_shows_the_all_to_all():
    code, out, err = run_cli("explain", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--pp", "4", "--ep", "8")
    assert code == 0, err
    assert "[comm.ep_all_to_all]" in out and "[comm.collectives]" in out
