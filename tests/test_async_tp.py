"""torch's micro-pipelined TP (AsyncTP): which collectives it hides, what a fused op costs, and that
estimate, the search's screen and the torchtitan rows use it."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.accuracy import map_runs
from meshplan.catalog import load_gpu, load_model
from meshplan.cost import collectives as coll
from meshplan.cost.async_tp import fused_exposed, micro_pipeline_tp_times
from meshplan.cost.calibration import calibration_for, synchronized
from meshplan.cost.comm import plan_placements, tp_collective_time
from meshplan.cost.compute import dense_gemm_shapes
from meshplan.cost.kernel_time import gemm_time, memory_time
from meshplan.estimate import estimate
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan
from meshplan.units import fmt_seconds

H100 = load_gpu("h100-sxm-80gb")
CAL = calibration_for(H100)
PEAK = H100.peak("bf16")
L70 = load_model("llama3-70b")


def _plan(**kw):
    base = dict(tp=8, dp=4, global_batch=8, seq_len=8192, micro_batch=2, recompute="full", zero=3,
                tp_comm_overlap=True)
    return TrainingPlan.of(**(base | kw))


def test_fused_op_is_one_chunk_pipeline_plus_decomposition():
    # Llama 3 70B MLP output projection on TP 8, 8,192 tokens: (8192, 8192, 3584)
    m, n, k = 8192.0, 8192.0, 3584.0
    g1 = float(gemm_time(m, n, k, H100, CAL, PEAK))
    g8 = 8 * float(gemm_time(m / 8, n, k, H100, CAL, PEAK))
    assert g8 > g1  # eight 1,024-row GEMMs are slower than one: smaller waves, eight launches
    # transfer shorter than 7/8 of the chunked GEMMs: only the decomposition costs
    assert fused_exposed(0.5 * g8, [(m, n, k)], 8, H100, CAL, PEAK, 2) == pytest.approx(g8 - g1, rel=1e-12)
    # longer: the surplus over 7/8 of the chunks is exposed (the local chunk hides one transfer)
    c = 2.0 * g8
    assert fused_exposed(c, [(m, n, k)], 8, H100, CAL, PEAK, 2) == pytest.approx(c - 7 / 8 * g8 + g8 - g1, rel=1e-12)
    # two ranks: half the chunks can hide the transfer
    g2 = 2 * float(gemm_time(m / 2, n, k, H100, CAL, PEAK))
    assert fused_exposed(g2, [(m, n, k)], 2, H100, CAL, PEAK, 2) == pytest.approx(g2 / 2 + g2 - g1, rel=1e-12)


def test_an_all_gather_feeds_every_consumer_chunk_by_chunk():
    """torch's fused all-gather + matmuls multiplies each gathered chunk by every consumer's weight
    (wq, wk, wv): the chunked GEMMs of all consumers hide the transfer, and each pays its own
    decomposition. Llama 3 70B on TP 8, 16,384 tokens: q (n, 1024, 8192), k and v (n, 128, 8192)."""
    n = 16384.0
    shapes = [(n, 1024.0, 8192.0), (n, 128.0, 8192.0), (n, 128.0, 8192.0)]
    g1 = [float(gemm_time(*s, H100, CAL, PEAK)) for s in shapes]
    g8 = [8 * float(gemm_time(s[0] / 8, s[1], s[2], H100, CAL, PEAK)) for s in shapes]
    c = 2.0 * sum(g8)
    assert fused_exposed(c, shapes, 8, H100, CAL, PEAK, 2) == pytest.approx(c - 7 / 8 * sum(g8) + sum(g8) - sum(g1), rel=1e-12)
    # a transfer the q chunks alone could not hide, all three consumers' chunks do
    short = 7 / 8 * sum(g8) * 0.99
    assert short > 7 / 8 * g8[0]
    assert fused_exposed(short, shapes, 8, H100, CAL, PEAK, 2) == pytest.approx(sum(g8) - sum(g1), rel=1e-12)


def test_torch_stack_fuses_the_separate_projections():
    """On the torch stacks the forward all-gathers feed wq, wk, wv and w1, w3 as separate GEMMs."""
    cluster = ClusterSpec.of(H100, 32)
    pl = plan_placements(cluster, _plan()).tp
    tokens = 2 * 8192.0
    msg = tokens * L70.hidden * 2
    ag = coll.collective_time("all_gather", msg, pl, cluster, CAL)
    rs = coll.collective_time("reduce_scatter", msg, pl, cluster, CAL)
    fwd, bwd = micro_pipeline_tp_times(L70, tokens, 8, True, pl, cluster, CAL, "bf16", 2, "compiled")
    f = lambda c, s: fused_exposed(c, s, 8, H100, CAL, PEAK, 2)  # noqa: E731
    red = memory_time((1 + 1 / 8) * msg, H100, CAL)
    q, kv, o = (tokens, 1024, 8192), (tokens, 128, 8192), (tokens, 8192, 1024)
    gate = (tokens, 3584, 8192)
    down = (tokens, 8192, 3584)
    assert fwd == pytest.approx(f(ag, [q, kv, kv]) + f(rs, [o]) + red + f(ag, [gate, gate]) + f(rs, [down]) + red, rel=1e-12)
    assert bwd == pytest.approx(f(ag, [(tokens, 1024, 8192)]) + f(ag, [(tokens, 3584, 8192)]) + 2 * rs, rel=1e-12)


def test_which_collectives_are_fused_in_a_llama_block():
    cluster = ClusterSpec.of(H100, 32)
    plan = _plan()
    pl = plan_placements(cluster, plan).tp
    tokens = 2 * 8192.0
    msg = tokens * L70.hidden * 2
    ag = coll.collective_time("all_gather", msg, pl, cluster, CAL)
    rs = coll.collective_time("reduce_scatter", msg, pl, cluster, CAL)
    fwd, bwd = micro_pipeline_tp_times(L70, tokens, 8, True, pl, cluster, CAL, "bf16", 2)
    qkv, out, mlp_in, mlp_out = dense_gemm_shapes(L70, tokens, 8)
    assert qkv == (tokens, (64 // 8 + 2 * 1) * 128, 8192) and mlp_out == (tokens, 8192, 28672 // 8)
    f = lambda c, s: fused_exposed(c, [s], 8, H100, CAL, PEAK, 2)  # noqa: E731
    red = memory_time((1 + 1 / 8) * msg, H100, CAL)
    # forward: both all-gathers and both reduce-scatters fused, each reduce-scatter then sums its partials
    assert fwd == pytest.approx(f(ag, qkv) + f(rs, out) + red + f(ag, mlp_in) + f(rs, mlp_out) + red, rel=1e-12)
    # backward: the gradient all-gathers fused with wo's and w2's input-gradient GEMMs; the two
    # input-gradient reduce-scatters (inputs are sums of GEMMs) exposed whole
    assert bwd == pytest.approx(f(ag, (tokens, 64 * 128 // 8, 8192)) + f(ag, (tokens, 28672 // 8, 8192)) + 2 * rs, rel=1e-12)
    assert bwd > 2 * rs
    # between Megatron's userbuffers overlap (all hidden here) and no overlap
    assert 0.0 < fwd < 2 * (ag + rs) and 2 * rs < bwd < 2 * (ag + rs)
    # without sequence parallelism the all-reduces are untouched; without TP nothing
    ar = tp_collective_time(msg, False, pl, cluster, CAL)
    assert micro_pipeline_tp_times(L70, tokens, 8, False, pl, cluster, CAL, "bf16", 2) == (2 * ar, 2 * ar)
    pl1 = plan_placements(ClusterSpec.of(H100, 4), _plan(tp=1, dp=4)).tp
    assert micro_pipeline_tp_times(L70, tokens, 1, True, pl1, cluster, CAL, "bf16", 2) == (0.0, 0.0)


def test_estimate_charges_the_micro_pipeline_between_userbuffers_and_no_overlap():
    cluster = ClusterSpec.of(H100, 32)
    t = {kind: estimate(L70, cluster, _plan(tp_overlap_kind=kind)).time for kind in ("userbuffers", "micro-pipeline")}
    # no overlap at all: neither TP overlap nor the backward's own (tp_backward_overlap)
    none = dict(tp_comm_overlap=False, tp_backward_overlap=False)
    off = estimate(L70, cluster, _plan(**none)).time
    tp = {k: v.breakdown()["tp_comm"] for k, v in t.items()}
    assert tp["userbuffers"] < tp["micro-pipeline"] < off.breakdown()["tp_comm"]
    assert t["userbuffers"].step_s < t["micro-pipeline"].step_s < off.step_s
    # the kind matters only when TP overlap is on
    same = estimate(L70, cluster, _plan(**none, tp_overlap_kind="micro-pipeline")).time
    assert same.step_s == off.step_s
    # one micro-batch of 80 layers: forward, backward and full recompute's repeated forward, plus
    # the embedding's and LM head's half collectives (2 x (AG + RS) / 2 each way)
    # (its GEMMs at the pace of the slowest of the 32 GPUs, as the estimate's: meshplan.cost.variability)
    pl = plan_placements(cluster, _plan()).tp
    fwd, bwd = micro_pipeline_tp_times(L70, 2 * 8192.0, 8, True, pl, cluster, synchronized(CAL, 32), "bf16", 2)
    one = tp_collective_time(2 * 8192.0 * 8192 * 2, True, pl, cluster, CAL)
    assert tp["micro-pipeline"] == pytest.approx(80 * (2 * fwd + bwd) + 2 * one, rel=1e-9)
    est = estimate(L70, cluster, _plan(tp_overlap_kind="micro-pipeline"))
    assert est.to_dict()["plan"]["stack"]["tp_overlap_kind"] == "micro-pipeline"
    # explain's layer derivation shows the same exposed seconds, the backward with the recomputed forward
    layer = next(d for d in est.derivations if d.key == "time.layer")
    assert dict(layer.symbols)["TP exposed"] == (
        f"{fmt_seconds(fwd)} / {fmt_seconds(bwd + fwd)} (micro-pipelined, torch AsyncTP: fused "
        "all-gather/reduce-scatter matmuls in t chunks, recompute repeats the forward)")
    shown = {kind: dict(next(d for d in estimate(L70, cluster, _plan(**kw)).derivations if d.key == "time.layer").symbols)["TP exposed"]
             for kind, kw in (("userbuffers", {}), ("off", none))}
    assert shown["userbuffers"] == "0.0 µs / 0.0 µs (userbuffers: behind the layer's GEMMs, recompute repeats the forward)"
    assert shown["off"] == f"{fmt_seconds(2 * one)} / {fmt_seconds(4 * one)} (not overlapped, recompute repeats the forward)"


def test_screen_uses_the_plans_overlap_kind():
    from meshplan.search.engine import Engine
    from meshplan.search.run import plan_of
    from meshplan.specs.stack import Stack
    from meshplan.search.space import SearchLimits, enumerate_plans

    cluster = ClusterSpec.of(H100, 32)
    lim = SearchLimits(tp=8, max_micro_batch=1, max_vpp=1, tp_comm_overlap=(True,), recompute=("full",), zero=(3,),
                       sequence_parallel=(True,))
    table = enumerate_plans(L70, 32, 8, 8192, (8,), lim)
    assert len(table) > 0
    bounds = {}
    for kind in ("userbuffers", "micro-pipeline"):
        # the stack as requested: applied to the TP 1 base its overlap fields would not apply
        stack = Stack(tp_comm_overlap=True, tp_overlap_kind=kind)
        base = TrainingPlan(global_batch=8, seq_len=8192, stack=stack)
        screen = Engine(L70, cluster, base, stack).evaluate(table)
        for i in range(len(table)):
            est = estimate(L70, cluster, plan_of(base, table, i, stack))
            assert screen.peak_bytes[i] == est.peak_bytes
            assert screen.step_lower_bound[i] <= est.time.step_s
        bounds[kind] = screen.step_lower_bound
    assert np.all(bounds["micro-pipeline"] > bounds["userbuffers"])


def test_torchtitan_asynctp_rows_run_the_micro_pipeline():
    runs = {r.id: r for r in map_runs() if r.group == "torchtitan"}
    a, b = runs["torchtitan_70b_256gpu_2d_asynctp"], runs["torchtitan_70b_256gpu_2d"]
    assert a.plan.stack.tp_comm_overlap and a.plan.stack.tp_overlap_kind == "micro-pipeline"
    assert not b.plan.stack.tp_comm_overlap
    assert runs["torchtitan_405b_512gpu_3d_1f1b"].plan.stack.tp_overlap_kind == "micro-pipeline"
    ta = estimate(a.model, a.cluster, a.plan).time.step_s
    tb = estimate(b.model, b.cluster, b.plan).time.step_s
    # measured 19.764 s -> 18.703 s (1.057x); Megatron-style overlap would predict 1.29x
    assert 1.0 < tb / ta < 1.2
    ub = estimate(a.model, a.cluster, a.plan.replace(**{"tp_overlap_kind": "userbuffers"})).time.step_s
    assert tb / ub > 1.25
    assert a.plan.precision == PrecisionRecipe(precision="fp8", grad_dtype="fp32")


@pytest.mark.parametrize(("name", "mla", "moe"), [("deepseek-v3-671b", True, True), ("mixtral-8x7b", False, True)])
def test_blocks_other_than_llama_leave_their_halves_exposed(name, mla, moe):
    model = load_model(name)
    assert (model.is_mla, model.is_moe) == (mla, moe)
    cluster = ClusterSpec.of(H100, 32)
    pl = plan_placements(cluster, _plan()).tp
    tokens = 4096.0
    msg = tokens * model.hidden * 2
    ag = coll.collective_time("all_gather", msg, pl, cluster, CAL)
    rs = coll.collective_time("reduce_scatter", msg, pl, cluster, CAL)
    qkv, out, mlp_in, mlp_out = dense_gemm_shapes(model, tokens, 8)
    f = lambda c, s: fused_exposed(c, [s], 8, H100, CAL, PEAK, 2)  # noqa: E731
    red = memory_time((1 + 1 / 8) * msg, H100, CAL)
    fwd, bwd = micro_pipeline_tp_times(model, tokens, 8, True, pl, cluster, CAL, "bf16", 2)
    attn_fwd = ag + rs if mla else f(ag, qkv) + f(rs, out) + red
    attn_bwd = ag + rs if mla else f(ag, (tokens, out[2], out[1])) + rs
    assert (fwd, bwd) == pytest.approx((attn_fwd + ag + rs, attn_bwd + ag + rs), rel=1e-12)
