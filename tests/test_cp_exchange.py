"""Context parallelism's K/V exchange per software stack: Transformer Engine's ring of send/recv
steps, and torch's all-gather of the repeated K/V with an fp32 dK/dV ring in backward."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.accuracy import map_runs
from meshplan.cost import collectives as coll
from meshplan.cost.calibration import calibration_for, synchronized
from meshplan.cost.comm import cp_kv_bytes, plan_placements
from meshplan.cost.compute import layer_op_times
from meshplan.cost.cp_exchange import cp_exchange_bytes, cp_exchange_collectives, cp_exposed_times, sdpa_kv_heads
from meshplan.cost.step import exposed
from meshplan.estimate import estimate


@pytest.fixture(scope="module")
def runs():
    return {r.id: r for r in map_runs()}


def _terms(run, kernels=None, synced=False):
    """(bytes, collective times, forward and backward attention) of one layer and micro-batch, on
    one GPU's calibration or (``synced``) on the run's cluster's, whose compute waits for its
    slowest GPU as the estimate's does (meshplan.cost.variability)."""
    m, cl, p = run.model, run.cluster, run.plan
    kernels = kernels or p.stack.kernels
    cal, e = calibration_for(cl.gpu), p.precision.activation_bytes
    if synced:
        cal = synchronized(cal, cl.num_gpus)
    tokens = p.micro_batch * p.seq_len / p.cp
    pl = plan_placements(cl, p)
    ops = layer_op_times(m, p.micro_batch, p.seq_len, p.tp, p.cp, p.sequence_parallel and p.tp > 1, p.attention,
                         p.attention_flops, cl.gpu, cal, p.precision.compute_dtype, e, kernels)
    nbytes = cp_exchange_bytes(m, tokens, p.tp, e, kernels)
    comm = cp_exchange_collectives(m, tokens, p.tp, e, kernels, p.cp, pl.cp, cl, cal)
    return nbytes, comm, ops.fwd_attention, ops.bwd_attention, pl.cp, cal


def test_8b_cp8_one_node(runs):
    # torchtitan Llama 3.1 8B, 8 H100 in one node, CP 8 at 256K: n = 32,768 tokens, no TP, K/V
    # repeated from 8 to the 32 query heads, d = 128, bf16
    run = runs["torchtitan_8b_8gpu_cp8_seq262144"]
    assert run.plan.stack.kernels == "compiled" and run.plan.cp == 8 and run.plan.tp == 1
    assert sdpa_kv_heads(run.model, 1, "compiled") == 32 and sdpa_kv_heads(run.model, 1, "fused") == 8
    (kv_b, dkv_b), (ag, dkv), fa, ba, pl, cal = _terms(run)
    assert kv_b == 32768 * 32 * 256 * 2 == 536_870_912  # 16x what Transformer Engine's ring sends
    assert dkv_b == 32768 * 32 * 256 * 4 == 1_073_741_824
    assert kv_b == 4 * cp_kv_bytes(run.model, 32768, 1, 2)
    assert (pl.size, pl.nodes) == (8, 1)
    assert ag == coll.collective_time("all_gather", 8 * kv_b, pl, run.cluster, cal)
    assert dkv == coll.collective_time("send_recv", dkv_b, pl, run.cluster, cal)
    # NCCL's latencies: the all-gather 8.4 µs + 7 NVLink steps of 3.4 µs, the send/recv one step
    assert ag == pytest.approx(10.217e-3, rel=1e-3) and dkv == pytest.approx(2.913e-3, rel=1e-3)
    # the all-gather hides behind the 29.8 ms step-0 call, each dK|dV transfer behind an 88.7 ms
    # backward step but the last
    assert fa / 8 == pytest.approx(29.8e-3, rel=1e-2) and ba / 8 == pytest.approx(88.7e-3, rel=1e-2)
    fwd, bwd = cp_exposed_times("compiled", 8, ag, dkv, fa, ba)
    assert fwd == 0.0
    assert bwd == dkv


def test_405b_cp4_across_nodes(runs):
    # torchtitan Llama 3.1 405B, TP 8 filling each node, CP 4 across 4 nodes at 128K: n = 32,768,
    # 128/8 = 16 query heads against 1 K/V head per TP rank
    run = runs["torchtitan_405b_512gpu_4d_cp4_seq131072"]
    assert (run.plan.tp, run.plan.cp) == (8, 4)
    (kv_b, dkv_b), (ag, dkv), fa, ba, pl, cal = _terms(run)
    assert kv_b == 32768 * 16 * 256 * 2 == 268_435_456
    assert dkv_b == 2 * kv_b
    assert kv_b == 16 * cp_kv_bytes(run.model, 32768, 8, 2)
    assert (pl.size, pl.per_node, pl.nodes) == (4, 1, 4)
    # NCCL's latencies: the all-gather 8.4 µs + 3 network steps of 14 µs, the send/recv one step
    assert ag == pytest.approx(17.557e-3, rel=1e-3) and dkv == pytest.approx(11.685e-3, rel=1e-3)
    fwd, bwd = cp_exposed_times("compiled", 4, ag, dkv, fa, ba)
    assert fwd == ag - fa / 4 == pytest.approx(2.72e-3, rel=1e-2)  # the step-0 call is 14.8 ms
    assert bwd == dkv  # 44.2 ms backward steps hide the all-gather and three transfers
    # per step: 8 micro-batches through the critical stage's 15 layers (126 over 8 stages); full
    # recompute re-runs the forward and its all-gather; on 512 GPUs the attention hiding them is
    # the slowest GPU's
    _, (ag, dkv), fa, ba, _, _ = _terms(run, synced=True)
    fwd, bwd = cp_exposed_times("compiled", 4, ag, dkv, fa, ba)
    plain = run.plan.replace(**{"kernels": "fused"})
    t_torch, t_fused = estimate(run.model, run.cluster, run.plan).time, estimate(run.model, run.cluster, plain).time
    n_l = run.model.n_layers // run.plan.pp
    assert t_torch.cp_comm_s == pytest.approx(8 * n_l * (fwd + bwd + fwd), rel=1e-12)
    assert t_fused.cp_comm_s == 0.0  # Transformer Engine's 16.8 MB K/V steps all hide


def test_exposed_formula_each_branch():
    # T_kv = 10, T_dkv = 3, A_f/c = 4, A_b/c = 2 (c = 4): every transfer partly exposed
    fwd, bwd = cp_exposed_times("eager", 4, 10.0, 3.0, 16.0, 8.0)
    assert fwd == 6.0
    assert bwd == 8.0 + 3 * 1.0 + 3.0
    f_te, b_te = cp_exposed_times("fused", 4, 10.0, 3.0, 16.0, 8.0)
    assert f_te == 3 * 6.0 and b_te == 3 * 1.0
    # one rank: nothing to exchange
    assert cp_exposed_times("compiled", 1, 0.0, 0.0, 16.0, 8.0) == (0.0, 0.0)
    # arrays give the scalars' values bit for bit
    cp, kv, dkv = np.array([2, 4, 8]), np.array([1e-3, 5e-3, 4e-2]), np.array([1e-2, 2e-3, 3e-3])
    fa, ba = np.array([0.03, 0.05, 0.1]), np.array([0.08, 0.2, 0.3])
    for kind in ("fused", "compiled"):
        af, ab = cp_exposed_times(kind, cp, kv, dkv, fa, ba)
        for i in range(3):
            assert (af[i], ab[i]) == cp_exposed_times(kind, int(cp[i]), float(kv[i]), float(dkv[i]), float(fa[i]), float(ba[i]))


def test_fused_ring_unchanged(runs):
    # Llama 3 405B at 128K (CP 16 across nodes, Megatron-style fused kernels): the ring of c − 1
    # send/recv steps of 2·n·g_r·d·e, backward twice the bytes (Liu et al. 2023)
    run = runs["llama3_405b_16384gpu_seq131072"]
    assert run.plan.stack.kernels == "fused"
    (kv_b, dkv_b), (step, back), fa, ba, pl, cal = _terms(run)
    assert kv_b == cp_kv_bytes(run.model, 8192, 8, 2) == 8192 * 1 * 128 * 2 * 2 and dkv_b == 2 * kv_b
    assert step == coll.collective_time("send_recv", kv_b, pl, run.cluster, cal) and back == 2 * step
    c = run.plan.cp
    assert cp_exposed_times("fused", c, step, back, fa, ba) == (
        (c - 1) * exposed(step, fa / c), (c - 1) * exposed(2 * step, ba / c))
    # slow enough links expose each of the c − 1 steps
    assert cp_exposed_times("fused", c, step, back, 0.0, 0.0) == (15 * step, 15 * 2 * step)


def test_search_screens_torch_cp_as_estimate_does():
    # Llama 3 8B on two nodes, TP 8 inside each, CP 2 across them at 64K, torch.compile's stack:
    # the screen's per-layer CP terms are estimate's (its bound is the 1F1B step for one stage)
    from meshplan.catalog import load_gpu, load_model
    from meshplan.search.engine import Engine
    from meshplan.search.space import SearchLimits, enumerate_plans
    from meshplan.specs.hardware import ClusterSpec
    from meshplan.specs.plan import TrainingPlan

    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 16)
    lim = SearchLimits(tp=8, cp=2, pp=1, micro_batch=1, recompute=("full",), zero=(1,), sequence_parallel=(True,),
                       tp_comm_overlap=(False,))
    table = enumerate_plans(model, 16, 8, 65536, (4,), lim)
    assert len(table) == 1
    for kernels in ("compiled", "fused"):
        base = TrainingPlan.of(global_batch=4, seq_len=65536, kernels=kernels)
        screen = Engine(model, cluster, base).evaluate(table)
        est = estimate(model, cluster, TrainingPlan.of(**{**base.model_dump(), **table.row(0)}))
        assert screen.peak_bytes[0] == est.peak_bytes
        assert screen.step_lower_bound[0] <= est.time.step_s
        # exact: the screen charges the compute the hidden K/V exchange's SMs slow as estimate does
        assert screen.step_lower_bound[0] == pytest.approx(est.time.step_s, rel=1e-9)
        assert est.time.contention_s > 0.0
        if kernels == "compiled":
            assert est.time.cp_comm_s > 0.0
        else:
            assert est.time.cp_comm_s == 0.0


def test_explain_shows_the_cp_exchange(runs):
    # explain's layer derivation names the CP collectives and their exposed seconds as the plan's
    # stack runs them; torchtitan 8B at CP 8 exposes only the last fp32 dK|dV transfer backward
    from meshplan.units import fmt_seconds

    run = runs["torchtitan_8b_8gpu_cp8_seq262144"]
    (_, _), (ag, dkv), fa, ba, _, _ = _terms(run)
    fwd, bwd = cp_exposed_times("compiled", 8, ag, dkv, fa, ba)
    assert (fwd, bwd) == (0.0, dkv) and run.plan.recompute == "full"
    est = estimate(run.model, run.cluster, run.plan)
    layer = next(d for d in est.derivations if d.key == "time.layer")
    rows = dict(layer.symbols)
    assert rows["CP comm"] == f"{fmt_seconds(ag)} K|V all-gather, {fmt_seconds(dkv)} fp32 dK|dV send/recv per ring step"
    assert rows["CP exposed"] == (
        f"0.0 µs / {fmt_seconds(dkv)} (torch's ring: the all-gather behind the step-0 call forward and backward, "
        "c = 8 dK|dV transfers, the last one exposed, recompute repeats the forward)")
    assert layer.source.endswith("meshplan.cost.cp_exchange")
    # Transformer Engine's ring: the step and its doubled backward, c − 1 = 15 steps hidden
    te = runs["llama3_405b_16384gpu_seq131072"]
    (_, _), (step, back), _, _, _, _ = _terms(te)
    rows = dict(next(d for d in estimate(te.model, te.cluster, te.plan).derivations if d.key == "time.layer").symbols)
    assert rows["CP comm"] == f"{fmt_seconds(step)} K|V send/recv, {fmt_seconds(back)} backward (K|V and dK|dV) per ring step"
    assert rows["CP exposed"].endswith("(Transformer Engine's ring: c − 1 = 15 steps, each behind 1/c of the attention)")
    # no CP, no rows
    plain = runs["torchtitan_8b_8gpu_cp1_seq32768"]
    layer = next(d for d in estimate(plain.model, plain.cluster, plain.plan).derivations if d.key == "time.layer")
    assert "CP comm" not in dict(layer.symbols) and layer.source == "meshplan.cost.compute"


def test_mla_and_tp_beyond_kv_heads():
    # DeepSeek-V3 (MLA: 128 heads, K d = 192, V d_v = 128), TP 8, 4,096 local tokens, bf16: every
    # stack sends 16 heads of K and V per rank, the values d_v wide
    from meshplan.catalog import load_model

    ds = load_model("deepseek-v3-671b")
    assert ds.is_mla and (ds.head_dim, ds.value_head_dim) == (192, 128)
    assert sdpa_kv_heads(ds, 8, "fused") == sdpa_kv_heads(ds, 8, "compiled") == 16
    assert cp_exchange_bytes(ds, 4096, 8, 2, "fused") == (41_943_040, 83_886_080)  # 4096·16·320·2
    assert cp_exchange_bytes(ds, 4096, 8, 2, "compiled") == (41_943_040, 83_886_080)  # fp32 dK|dV: 4096·16·320·4
    assert cp_kv_bytes(ds, 4096, 8, 2) == 50_331_648  # 2·n·g·d·e would count V 192 wide
    # Llama 3 8B (32 heads, 8 K/V heads) at TP 16: one replicated K/V head per rank for the fused
    # kernels, repeated to the rank's 2 query heads for torch's SDPA
    m = load_model("llama3-8b")
    assert sdpa_kv_heads(m, 16, "fused") == 1 and sdpa_kv_heads(m, 16, "eager") == 2
    assert cp_exchange_bytes(m, 1000, 16, 2, "fused") == (cp_kv_bytes(m, 1000, 16, 2), 2 * 1000 * 256 * 2) == (512_000, 1_024_000)
    assert cp_exchange_bytes(m, 1000, 16, 2, "eager") == (1_024_000, 2_048_000)
