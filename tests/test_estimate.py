"""Whole estimates: the breakdown adds up, the headline figures follow from their definitions,
switches move the numbers the right way, bad plans are refused, and Llama 3 405B on 16K H100s
lands near its published throughput."""

from __future__ import annotations

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.params import count_params
from meshplan.errors import InputError
from meshplan.estimate import Budget, Estimate, estimate
from meshplan.specs import ClusterSpec, PrecisionRecipe, TrainingPlan
from meshplan.units import DAY, GiB, HOUR, TFLOPS

H100 = load_gpu("h100-sxm-80gb")
A100 = load_gpu("a100-sxm-80gb")

LLAMA3_405B_16K = dict(
    tp=8, cp=1, pp=16, dp=128, vpp=2, schedule="interleaved", micro_batch=1, global_batch=2048,
    seq_len=8192, recompute="none", zero=2, rank_order=("tp", "cp", "pp", "dp"),
)

#: name -> (model, gpus, cluster options, plan)
PLANS = {
    "8b_dp8_zero1": ("llama3-8b", 8, {}, dict(dp=8, global_batch=64, seq_len=8192, zero=1)),
    "70b_tp8_pp4_dp2_selective": ("llama3-70b", 64, {}, dict(tp=8, pp=4, dp=2, global_batch=32, seq_len=4096, recompute="selective")),
    "405b_16k": ("llama3-405b", 16384, dict(pod_size=3072, oversubscription=7), LLAMA3_405B_16K),
    "8b_zero3_dp64": ("llama3-8b", 64, {}, dict(dp=64, global_batch=64, seq_len=1024, zero=3)),
    "8b_tp8_cp2": ("llama3-8b", 16, {}, dict(tp=8, cp=2, dp=1, global_batch=4, seq_len=2048)),
    "8b_pp4_gpipe_full": ("llama3-8b", 8, {}, dict(pp=4, dp=2, global_batch=16, seq_len=4096, schedule="gpipe", recompute="full")),
    "70b_a100_zero0": ("llama3-70b", 64, {}, dict(tp=8, pp=8, dp=1, global_batch=16, seq_len=2048, zero=0, recompute="full")),
}


def run(key: str, budget: Budget | None = None, gpu=None, **cluster_kw) -> Estimate:
    model, gpus, ckw, plan = PLANS[key]
    gpu = gpu or (A100 if key.endswith("a100_zero0") else H100)
    cluster = ClusterSpec.of(gpu, gpus, **{**ckw, **cluster_kw})
    return estimate(load_model(model), cluster, TrainingPlan.of(**plan), budget)


@pytest.fixture(scope="module", params=sorted(PLANS))
def est(request) -> Estimate:
    return run(request.param, Budget(tokens=1e12, price_per_gpu_hour=2.5))


def test_breakdown_adds_up_to_step(est):
    t = est.time
    parts = t.breakdown()
    assert set(parts) == {"compute", "recompute", "tp_comm", "cp_comm", "fsdp_comm", "pipeline_bubble", "dp_comm", "optimizer", "param_gather"}
    assert all(v >= 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(t.step_s, rel=1e-9)
    assert est.to_dict()["time"]["breakdown"] == parts
    assert 0 <= t.critical_rank < est.plan.pp
    # the per-kind accounting (durations × micro-batches) matches the simulator's own clock:
    # busy parts + idle = the critical rank's finish
    on_rank = t.compute_s + t.tp_comm_s + t.cp_comm_s + t.fsdp_comm_s + t.pipeline_bubble_s
    assert on_rank == pytest.approx(t.per_rank_finish_s[t.critical_rank], rel=1e-9)
    assert est.sim.busy[t.critical_rank] == pytest.approx(on_rank - t.pipeline_bubble_s, rel=1e-9)


def test_flops_and_throughput_definitions(est):
    p = est.plan
    tokens = p.global_batch * p.seq_len
    d = est.to_dict()
    assert d["flops"]["breakdown"]["dense"] == 6 * count_params(est.model).matmul * tokens
    assert d["flops"]["model_per_step"] == est.flops.dense + est.flops.attention
    assert est.tokens_per_s == pytest.approx(tokens / est.time.step_s, rel=1e-12)
    peak = est.cluster.gpu.peak("bf16")
    assert est.mfu == pytest.approx(est.flops.model / (p.num_gpus * peak * est.time.step_s), rel=1e-12)
    assert est.hfu == pytest.approx(est.flops.hardware / (p.num_gpus * peak * est.time.step_s), rel=1e-12)
    assert est.model_tflops_per_gpu == pytest.approx(est.mfu * peak / TFLOPS, rel=1e-12)
    assert est.hfu >= est.mfu
    assert (est.hfu > est.mfu) == (p.recompute != "none")
    assert 0 < est.mfu < 1


def test_run_cost(est):
    run_ = est.run_cost()
    tokens = 1e12
    days = tokens / est.tokens_per_s / DAY
    assert run_["days"] == pytest.approx(days, rel=1e-12)
    assert run_["gpu_hours"] == pytest.approx(days * DAY / HOUR * est.plan.num_gpus, rel=1e-12)
    assert run_["dollars"] == pytest.approx(run_["gpu_hours"] * 2.5, rel=1e-12)
    assert run_["energy_mwh"] == pytest.approx(run_["gpu_hours"] * est.cluster.gpu.tdp_watts / 1e6, rel=1e-12)
    assert est.to_dict()["run"] == run_


def test_no_budget_no_run_cost():
    assert run("8b_dp8_zero1").run_cost() is None
    assert "dollars" not in run("8b_dp8_zero1", Budget(tokens=1e9)).run_cost()


def test_comm_parts_only_where_their_axis_exists(est):
    p, t = est.plan, est.time
    if p.tp == 1:
        assert t.tp_comm_s == 0.0
    else:
        assert t.tp_comm_s > 0.0
    if p.cp == 1:
        assert t.cp_comm_s == 0.0
    if not (p.zero == 3 and p.shard_degree > 1):
        assert t.fsdp_comm_s == 0.0
    if p.pp == 1:
        assert t.pipeline_bubble_s == 0.0
    if p.recompute == "none":
        assert t.recompute_s == 0.0
    else:
        assert t.recompute_s > 0.0


def test_cp_comm_exposed_across_nodes():
    """tp = 8 fills the node, so the cp pair sits on two nodes: each ring step's K/V send over the
    NIC outlasts 1/c of the (short, s = 2048) attention and shows."""
    e = run("8b_tp8_cp2")
    assert e.time.cp_comm_s > 0.0


def test_fsdp_comm_exposed_for_short_sequences():
    """ZeRO-3 over 64 GPUs (8 nodes) with 1,024-token micro-batches: the per-layer weight
    all-gather is longer than the layer's compute."""
    e = run("8b_zero3_dp64")
    assert e.time.fsdp_comm_s > 0.0
    assert "gathered_weights" in e.stages[0].other_items


@pytest.mark.parametrize("key", ["70b_tp8_pp4_dp2_selective", "8b_zero3_dp64", "8b_tp8_cp2", "405b_16k"])
def test_slower_nic_never_faster(key):
    steps = [run(key, nic_bandwidth=bw).time.step_s for bw in (100e9, 50e9, 25e9, 12.5e9)]
    assert steps == sorted(steps)
    assert steps[-1] > steps[0]


def test_larger_global_batch_lowers_bubble_fraction():
    model = load_model("llama3-70b")
    cluster = ClusterSpec.of(H100, 64)
    fractions = []
    for gb in (8, 16, 32, 64):
        plan = TrainingPlan(tp=8, pp=4, dp=2, global_batch=gb, seq_len=4096, recompute="selective")
        fractions.append(estimate(model, cluster, plan).time.bubble_fraction)
    assert fractions == sorted(fractions, reverse=True)
    assert len(set(fractions)) == 4


def test_critical_rank_and_stages_of_gpipe():
    e = run("8b_pp4_gpipe_full")
    assert [s.peak_inflight for s in e.stages] == [e.plan.grad_accum] * 4
    assert e.time.recompute_s > 0


# ---- refused plans ---------------------------------------------------------------------------


def _refuse(model="llama3-8b", gpus=8, gpu=H100, **plan):
    plan.setdefault("global_batch", 16)
    plan.setdefault("seq_len", 2048)
    with pytest.raises(InputError) as err:
        estimate(load_model(model), ClusterSpec.of(gpu, gpus), TrainingPlan.of(**plan))
    return err.value


def test_refuses_axes_not_matching_gpus():
    err = _refuse(tp=2, dp=2)
    assert err.field == "gpus"


def test_refuses_tp_not_dividing_heads():
    err = _refuse(model="llama2-13b", gpus=16, tp=16, dp=1)  # 40 heads
    assert err.field == "tp" and "attention heads (40)" in str(err)


def test_refuses_tp_vs_kv_heads():
    # tp must divide the KV heads or be a multiple of them. 24 query heads and 12 KV heads with
    # tp = 8: 8 divides 24, but neither 12 % 8 nor 8 % 12 is 0, so only the KV rule fails
    from meshplan.specs.model import ModelSpec

    m = ModelSpec(name="odd", n_layers=4, hidden=768, n_heads=24, n_kv_heads=12, head_dim=32, ffn_hidden=2048, vocab_size=1000)
    with pytest.raises(InputError, match="KV heads"):
        estimate(m, ClusterSpec.of(H100, 8), TrainingPlan(tp=8, global_batch=8, seq_len=128))


def test_refuses_pp_times_vpp_over_layers():
    err = _refuse(pp=8, dp=1, vpp=8, schedule="interleaved", global_batch=8)
    assert err.field == "pp"


def test_refuses_ep_on_dense():
    err = _refuse(dp=8, ep=2)
    assert err.field == "ep"


def test_refuses_interleaved_with_m_not_splitting_into_rounds():
    """Interleaved schedules run rounds of q micro-batches, with max(1, ⌊m/p⌋) rounds that must
    be equal: m = 9 on p = 4 makes 2 rounds of 4.5 (refused); m = 6 makes one round of 6
    (accepted, as torch's ScheduleInterleaved1F1B does)."""
    err = _refuse(pp=4, dp=2, vpp=2, schedule="interleaved", global_batch=18)  # m = 9
    assert err.field == "global_batch" and "2 equal rounds" in str(err)
    ok = TrainingPlan(pp=4, dp=2, vpp=2, schedule="interleaved", global_batch=12, seq_len=2048)  # m = 6
    assert estimate(load_model("llama3-8b"), ClusterSpec.of(H100, 8), ok).plan.grad_accum == 6


def test_refuses_fp8_on_a100():
    err = _refuse(gpu=A100, dp=8, precision=PrecisionRecipe(precision="fp8"))
    assert err.field == "precision" and "fp8" in str(err)


def test_fp8_mfu_against_bf16_peak():
    e = estimate(load_model("llama3-8b"), ClusterSpec.of(H100, 8), TrainingPlan(dp=8, global_batch=16, seq_len=4096, precision=PrecisionRecipe(precision="fp8")))
    assert e.mfu_peak == H100.peak("bf16")


# ---- Llama 3 405B on 16,384 H100s -----------------------------------------------------------


def test_llama3_405b_16k_sanity():
    """Llama 3 paper Table 4: 400 TFLOP/s per GPU (BF16 MFU 41 %) for TP8 CP1 PP16 DP128 at 8K
    sequences and 16M-token batches. A sanity bound, not a calibration target: the prediction
    must land within 15 %, every stage must fit in 80 GiB, and the split must be Llama 3's."""
    e = run("405b_16k")
    assert e.plan.num_gpus == 16384
    assert e.plan.grad_accum == 16
    assert abs(e.model_tflops_per_gpu / 400.0 - 1) < 0.15
    assert all(s.total <= 80 * GiB for s in e.stages)
    assert e.fits
    per_rank_layers = [s.layers for s in e.stages]
    assert per_rank_layers == [7] + [8] * 14 + [7]
    assert e.time.bubble_fraction > 0
    assert e.time.dp_comm_s >= 0
    # the 15.6T-token budget takes weeks, not days or years
    days = run("405b_16k", Budget(tokens=15.6e12)).run_cost()["days"]
    assert 40 < days < 120


def test_hsdp_shard_group_keeps_the_real_strides():
    """HSDP shards over dp_shard consecutive dp ranks (× cp). With rank order tp, dp, cp, pp and
    dp = 4, dp_shard = 2, cp = 2 on 8-GPU nodes, rank 0's shard group is {0, 1, 4, 5}: one node.
    With dp = 8, dp_shard = 2, cp = 2 it is {0, 1, 8, 9}: two nodes (cp's stride is tp·dp = 8,
    not tp·dp_shard)."""
    from meshplan.cost.collectives import placement

    cl = ClusterSpec.of(H100, 32)
    order = ("tp", "dp", "cp", "pp")
    one_node = placement(cl, {"tp": 1, "dp": 4, "cp": 2, "pp": 4}, order, ("dp", "cp"), span={"dp": 2})
    assert (one_node.size, one_node.per_node, one_node.nodes) == (4, 4, 1)
    two_nodes = placement(cl, {"tp": 1, "dp": 8, "cp": 2, "pp": 2}, order, ("dp", "cp"), span={"dp": 2})
    assert (two_nodes.size, two_nodes.per_node, two_nodes.nodes) == (4, 2, 2)


def test_full_recompute_repeats_context_parallel_exchange():
    """Full recompute reruns each layer's forward in the backward, ring exchange included: the CP
    time grows by exactly the forward's share."""
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(H100, 16)
    base = dict(cp=16, global_batch=1, seq_len=32768, zero=1)
    none = estimate(model, cluster, TrainingPlan.of(**base, recompute="none")).time
    full = estimate(model, cluster, TrainingPlan.of(**base, recompute="full")).time
    assert none.cp_comm_s > 0
    assert full.cp_comm_s > none.cp_comm_s


@pytest.mark.parametrize("schedule,vpp", [("zbh1", 1), ("interleaved-zb", 2), ("zbv", 2)])
def test_zero_bubble_schedules_in_the_estimate(schedule, vpp):
    """Split-backward schedules: the parts still add up; their bubble is below 1F1B's; ZBV folds
    the pipeline so rank 0 holds the embedding and the LM head (and the logits' gradient)."""
    model, cluster = load_model("llama3-70b"), ClusterSpec.of(H100, 64)
    base = dict(tp=8, pp=4, dp=2, global_batch=64, seq_len=4096)
    est = estimate(model, cluster, TrainingPlan.of(**base, schedule=schedule, vpp=vpp))
    ref = estimate(model, cluster, TrainingPlan.of(**base))
    assert sum(est.time.breakdown().values()) == pytest.approx(est.time.step_s, rel=1e-9)
    assert est.time.bubble_fraction < ref.time.bubble_fraction
    stages = est.to_dict()["memory"]["stages"]
    holder = 0 if schedule == "zbv" else 3
    assert "logits_grad" in stages[holder]["other_detail"]
    assert sum(s["params"] for s in stages) == sum(s["params"] for s in ref.to_dict()["memory"]["stages"])


def test_fp8_casts_cost_hbm_traffic():
    """FP8 with dynamic scaling reads each bf16 operand twice (amax, then cast) and writes one
    byte: 5 bytes per element of input and weight forward; backward the output gradient's cast
    and the FP8 transposes of input and weight (2 bytes per element each)."""
    from meshplan.cost.compute import fp8_cast_bytes

    m, n, k = 8192, 6144, 4096
    act_f, act_b, weight_f, weight_b = fp8_cast_bytes([(m, n, k, 1)], 2)
    assert (act_f, weight_f) == (5 * m * k, 5 * k * n)
    assert (act_b, weight_b) == (5 * m * n + 2 * m * k, 2 * k * n)
    # so FP8 is faster than BF16, but less than the 2x of its peak
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(H100, 8)
    base = dict(dp=8, global_batch=16, seq_len=8192, recompute="selective", zero=3)
    bf16 = estimate(model, cluster, TrainingPlan.of(**base)).time.step_s
    fp8 = estimate(model, cluster, TrainingPlan.of(**base, precision=PrecisionRecipe(precision="fp8"))).time.step_s
    assert 1.0 < bf16 / fp8 < 1.6
