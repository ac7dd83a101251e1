"""Memory per GPU: model-state bytes per parameter under each precision convention and ZeRO
stage, the seeds' worked numbers, and the per-stage memory of whole estimates."""

from __future__ import annotations

from fractions import Fraction

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.activations import embedding_activation_bytes, head_activation_bytes, layer_activations
from meshplan.cost.memory import model_state_bytes
from meshplan.cost.params import count_params
from meshplan.estimate import estimate
from meshplan.specs import ClusterSpec, PrecisionRecipe, TrainingPlan
from meshplan.units import GB, GiB

ZERO_PAPER = PrecisionRecipe(precision="bf16", grad_dtype="bf16", master_weights=True)  # 2+2+12
NO_MASTER = PrecisionRecipe(precision="bf16", grad_dtype="bf16", master_weights=False)  # 2+2+8
MEGATRON = PrecisionRecipe(precision="bf16", grad_dtype="fp32", master_weights=True)  # 2+4+12
FP32 = PrecisionRecipe(precision="fp32", grad_dtype="fp32")  # 4+4+8
COPIES = PrecisionRecipe(precision="bf16", grad_dtype="bf16", master_weights=True, grad_fp32_copy=True)  # 2+2+4+4+8

H100 = load_gpu("h100-sxm-80gb")


def per_param(recipe: PrecisionRecipe, zero: int, n: int) -> Fraction:
    st = model_state_bytes(1, recipe, zero, n)
    return Fraction(st.weights) + Fraction(st.gradients) + Fraction(st.optimizer)


# ---- bytes per parameter ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [64, 128, 1024])
def test_zero_stages_2_2_12(n):
    """Rajbhandari et al. 2020 Sec. 5 with K = 12: 16, 4 + 12/N, 2 + 14/N, 16/N bytes/param.
    N a power of two, so the floats are exact."""
    assert per_param(ZERO_PAPER, 0, n) == 16
    assert per_param(ZERO_PAPER, 1, n) == 4 + Fraction(12, n)
    assert per_param(ZERO_PAPER, 2, n) == 2 + Fraction(14, n)
    assert per_param(ZERO_PAPER, 3, n) == Fraction(16, n)


def test_zero_stages_non_power_of_two():
    n = 96
    assert float(per_param(ZERO_PAPER, 1, n)) == pytest.approx(4 + 12 / 96, rel=1e-15)
    assert float(per_param(ZERO_PAPER, 2, n)) == pytest.approx(2 + 14 / 96, rel=1e-15)
    assert float(per_param(ZERO_PAPER, 3, n)) == pytest.approx(16 / 96, rel=1e-15)


def test_zero_split_by_part():
    st = model_state_bytes(1000, ZERO_PAPER, 2, 8)
    assert (st.weights, st.gradients, st.optimizer) == (2000, 250, 1500)
    st = model_state_bytes(1000, ZERO_PAPER, 3, 8)
    assert (st.weights, st.gradients, st.optimizer) == (250, 250, 1500)
    st = model_state_bytes(1000, ZERO_PAPER, 3, 1)  # shard of one: nothing is divided
    assert (st.weights, st.gradients, st.optimizer) == (2000, 2000, 12000)


@pytest.mark.parametrize(
    "recipe,w,g,o,total",
    [
        (FP32, 4, 4, 8, 16),  # fp32 (4+4+8): no master copy needed
        (NO_MASTER, 2, 2, 8, 12),  # bf16, no master (2+2+8)
        (ZERO_PAPER, 2, 2, 12, 16),  # ZeRO paper (2+2+12)
        (MEGATRON, 2, 4, 12, 18),  # Megatron (2+4+12)
        (COPIES, 2, 2, 16, 20),  # bf16 + fp32 copies (2+2+4+4+8)
    ],
)
def test_five_conventions_of_plan_docstring(recipe, w, g, o, total):
    assert recipe.weight_bytes == w
    assert recipe.grad_bytes == g
    assert recipe.optimizer_bytes == o
    assert recipe.bytes_per_param == total


def test_recipe_details():
    assert PrecisionRecipe(precision="fp8").weight_bytes == 2  # fp8 training keeps bf16 weights
    assert PrecisionRecipe(precision="fp8").activation_bytes == 2
    assert FP32.activation_bytes == 4
    assert FP32.master_bytes == 0  # master_weights=True is moot for fp32 weights
    assert PrecisionRecipe(optimizer="sgd", grad_dtype="bf16").optimizer_bytes == 4 + 4  # master + momentum
    assert TrainingPlan(global_batch=1, seq_len=1).precision.bytes_per_param == 18  # default: Megatron


@pytest.mark.parametrize("d", [8, 64, 128])
def test_megatron_distributed_optimizer(d):
    """Megatron-LM docs (dist_optimizer.md; published_runs.yaml
    megatron_distributed_optimizer_bytes_per_param): bf16 params + fp32 grads 18 → 6 + 12/d;
    fp16 params + fp16 grads (fp32 grad copy) 20 → 4 + 16/d; fp32 16 → 8 + 8/d. The
    distributed optimizer is ZeRO-1: only the optimizer-owned bytes are sharded."""
    assert per_param(MEGATRON, 1, d) == 6 + Fraction(12, d)
    fp16 = PrecisionRecipe(precision="fp16", grad_dtype="fp16", master_weights=True, grad_fp32_copy=True)
    assert fp16.bytes_per_param == 20
    assert per_param(fp16, 1, d) == 4 + Fraction(16, d)
    assert per_param(FP32, 1, d) == 8 + Fraction(8, d)


# ---- seeds ------------------------------------------------------------------------------------


def test_seed_001_zero_calculator():
    """Seed 001, ZeRO section: 7B, mixed-precision Adam (2+2+12). All four answers are right."""
    P = 7 * 10**9

    def gb(zero, n):
        return float(P * per_param(ZERO_PAPER, zero, n)) / GB

    assert gb(0, 1) == 112.0  # "112 GB"
    assert gb(1, 64) == 29.3125  # "29.3 GB" = 7e9·(4 + 12/64)
    assert gb(2, 64) == 15.53125  # "15.5 GB" = 7e9·(2 + 14/64)
    assert gb(3, 64) == 1.75  # "1.75 GB" = 7e9·16/64
    # "ZeRO-3 with 8 GPUs gives 16/8 = 2 bytes/param × 30B = 60 GB"
    assert float(30 * 10**9 * per_param(ZERO_PAPER, 3, 8)) / GB == 60.0


def test_seed_000_405b_unsharded_state():
    """Seed 000 ("Model Memory Requirements"): 810 + 3,240 + 810 = "4,860 GB" for 405B: bf16
    weights and gradients and fp32 Adam moments, i.e. the 12-byte (2+2+8) convention without an
    fp32 master copy, applied to the nominal 405e9. With the exact 405,853,388,800 parameters
    the same convention gives 4,870.24 GB (0.2 % more); mixed-precision training that keeps fp32
    master weights (2+2+12) needs 6,493.7 GB."""
    seed = model_state_bytes(405 * 10**9, NO_MASTER, 0, 1)
    assert seed.weights + seed.gradients + seed.optimizer == 4_860 * 10**9
    P = count_params(load_model("llama3-405b")).total
    assert P * NO_MASTER.bytes_per_param == 4_870_240_665_600
    assert round(P * NO_MASTER.bytes_per_param / GB, 1) == 4870.2
    assert round(P * ZERO_PAPER.bytes_per_param / GB, 1) == 6493.7


def test_seed_004_zero_table():
    """Seed 004, "ZeRO Stages" table: Stage 1 ~N(2+2+8/N), Stage 2 ~N(2+10/N), Stage 3 ~N·12/N.
    These are the 12-byte (2+2+8, no master copy) convention — consistent with the seed's own
    "405B × 12 bytes = 4.86 TB" — but the table heads the section on mixed-precision ZeRO, whose
    paper (and meshplan's ZeRO recipe) keeps an fp32 master copy: 4 + 12/N, 2 + 14/N, 16/N.
    Both are asserted; the seed's table is only right for a no-master-weights optimizer."""
    for n in (8, 1024):
        assert per_param(NO_MASTER, 1, n) == 2 + 2 + Fraction(8, n)
        assert per_param(NO_MASTER, 2, n) == 2 + Fraction(10, n)
        assert per_param(NO_MASTER, 3, n) == Fraction(12, n)
        assert per_param(ZERO_PAPER, 1, n) == 4 + Fraction(12, n)
        assert per_param(ZERO_PAPER, 2, n) == 2 + Fraction(14, n)
        assert per_param(ZERO_PAPER, 3, n) == Fraction(16, n)
    # "Stage 3 on 1,024 GPUs: 4.86 TB / 1,024 = 4.75 GB": 4.746 GB with the nominal 405e9,
    # 4.756 GB with the exact count (12 bytes), 6.341 GB with master weights (16 bytes)
    P = count_params(load_model("llama3-405b")).total
    assert round(float(405 * 10**9 * per_param(NO_MASTER, 3, 1024)) / GB, 3) == 4.746
    assert round(float(P * per_param(NO_MASTER, 3, 1024)) / GB, 3) == 4.756
    assert round(float(P * per_param(ZERO_PAPER, 3, 1024)) / GB, 3) == 6.341


# ---- per-stage memory of an estimate ----------------------------------------------------------


def _est(model="llama3-8b", gpus=8, **plan):
    plan.setdefault("micro_batch", 1)
    plan.setdefault("seq_len", 4096)
    return estimate(load_model(model), ClusterSpec.of(H100, gpus), TrainingPlan.of(**plan))


PLANS = [
    dict(dp=8, global_batch=64, zero=1),
    dict(dp=8, global_batch=64, zero=3),
    dict(pp=4, dp=2, global_batch=16),
    dict(tp=2, pp=2, dp=2, global_batch=16, recompute="selective"),
    dict(pp=4, dp=2, global_batch=16, schedule="gpipe"),
    dict(pp=2, dp=4, vpp=2, schedule="interleaved", global_batch=16, zero=2),
]


@pytest.mark.parametrize("plan", PLANS)
def test_stage_totals_are_sums_of_parts(plan):
    est = _est(**plan)
    for s in est.stages:
        assert s.total == s.weights + s.gradients + s.optimizer + s.activations + s.other
        assert s.activations == pytest.approx(sum(s.activation_items.values()), rel=1e-12)
        assert s.other == pytest.approx(sum(s.other_items.values()), rel=1e-12)
        assert s.other_items["runtime_reserve"] == 2 * GiB
        st = model_state_bytes(s.params, est.plan.precision, est.plan.zero, est.plan.shard_degree)
        assert (s.weights, s.gradients, s.optimizer) == (st.weights, st.gradients, st.optimizer)
    assert est.peak_bytes == max(s.total for s in est.stages)
    assert est.fits == (est.peak_bytes <= est.capacity_bytes)
    d = est.to_dict()["memory"]
    assert d["fits"] == est.fits
    assert d["headroom_bytes"] == est.capacity_bytes - est.peak_bytes


def test_fits_flag_both_ways():
    small = _est(dp=8, global_batch=64, zero=1)
    assert small.fits and small.peak_bytes <= 80 * GiB
    # 18 B/param unsharded (144.5 GB for 8B) alone exceeds 80 GiB
    big = _est(dp=8, global_batch=64, zero=0, micro_batch=8)
    assert not big.fits and big.peak_bytes > 80 * GiB


@pytest.mark.parametrize("pp,m", [(4, 8), (4, 2), (4, 1), (2, 16), (4, 4)])
def test_1f1b_inflight_is_min_p_minus_r_m(pp, m):
    dp = 8 // pp
    est = _est(pp=pp, dp=dp, global_batch=m * dp)
    stages = est.to_dict()["memory"]["stages"]
    assert [s["peak_inflight_microbatches"] for s in stages] == [min(pp - r, m) for r in range(pp)]


@pytest.mark.parametrize("m", [1, 4, 8])
def test_gpipe_inflight_is_m(m):
    est = _est(pp=4, dp=2, global_batch=2 * m, schedule="gpipe")
    assert [s.peak_inflight for s in est.stages] == [m] * 4


def test_stage_activations_are_inflight_times_stage_bytes():
    """1F1B, pp = 4, m = 8, llama3-8b: rank r holds min(4 − r, 8) micro-batches of its 8 layers;
    the last rank also keeps the final-norm/LM-head inputs and fp32 logits."""
    est = _est(pp=4, dp=2, global_batch=16)
    m = load_model("llama3-8b")
    la = layer_activations(m, 1, 4096)
    head = head_activation_bytes(m, 1, 4096, 1, 1, False, 2)
    emb = embedding_activation_bytes(m, 1, 4096, 1, 1, False)
    assert emb == 0.0
    expected = [4 * 8 * la.stored, 3 * 8 * la.stored, 2 * 8 * la.stored, 1 * (8 * la.stored + head)]
    assert [s.activation_items["stored"] for s in est.stages] == pytest.approx(expected, rel=1e-12)
    # no recompute: the layer's backward adds only the MLP's gradients, n·h·e + 2·n·f·e (n = 4,096)
    assert all(s.activation_items["backward_working_set"] == 0 for s in est.stages)
    assert all(s.activation_items["backward_gradients"] == 4096 * (4096 + 2 * 14336) * 2 == la.working for s in est.stages)


def test_zero3_gathered_weights():
    """At the peak of a stage without the LM head (backward of its top layer) ZeRO-3 holds the
    layer in use and the prefetched one; at the head moment of the last stage, the final norm +
    LM head unit kept gathered after forward; with weights kept gathered, the whole stage beside
    its shard (docs/verify.md: FSDPMemTracker's Unsharded Param)."""
    model = load_model("llama3-8b")
    layer_params = count_params(model).layer.total
    est = _est(dp=4, pp=2, global_batch=64, zero=3)
    s = est.stages[0]
    assert s.other_items["gathered_weights"] == 2 * layer_params * 2  # layer in use + prefetched, bf16
    assert s.weights == s.params * 2 / 4
    one = _est(dp=8, global_batch=64, zero=3).stages[0]
    head = model.hidden + model.vocab_size * model.hidden  # final norm + untied LM head
    assert one.other_items["gathered_weights"] == head * 2
    assert one.activation_items["head_activations_freed"] == 0.0 and one.other_items["grad_reduce_buckets"] == 0.0
    kept = _est(dp=8, global_batch=64, zero=3, reshard_after_forward=False).stages[0]
    assert kept.other_items["gathered_weights"] == kept.params * 2
    for z in (0, 1, 2):
        assert "gathered_weights" not in _est(dp=8, global_batch=64, zero=z).stages[0].other_items


def test_bigger_micro_batch_more_activation_memory():
    one = _est(pp=2, dp=4, global_batch=32, micro_batch=1)
    two = _est(pp=2, dp=4, global_batch=32, micro_batch=2)
    for a, b in zip(one.stages, two.stages):
        assert b.activations > a.activations
        # same in-flight count here (m = 8 and 4 both ≥ p), so exactly twice the stored bytes
        assert b.activation_items["stored"] == pytest.approx(2 * a.activation_items["stored"], rel=1e-12)


def test_recompute_ordering_of_activation_memory():
    acts = {}
    for r in ("none", "selective", "full"):
        est = _est(tp=2, pp=2, dp=2, global_batch=16, recompute=r)
        acts[r] = [s.activations for s in est.stages]
    for rank in range(2):
        assert acts["full"][rank] < acts["selective"][rank] < acts["none"][rank]


def test_memory_independent_of_dp_for_zero0_but_not_zero1():
    """Without ZeRO every DP rank holds all model state; ZeRO-1 shards the optimizer over DP."""
    a = _est(dp=4, gpus=4, global_batch=4, zero=0).stages[0]
    b = _est(dp=8, gpus=8, global_batch=8, zero=0).stages[0]
    assert (a.weights, a.gradients, a.optimizer) == (b.weights, b.gradients, b.optimizer)
    c = _est(dp=4, gpus=4, global_batch=4, zero=1).stages[0]
    d = _est(dp=8, gpus=8, global_batch=8, zero=1).stages[0]
    assert d.optimizer == c.optimizer / 2


@pytest.mark.parametrize(
    "recipe,expected",
    [
        # reads: gradient + moments + master copy (or the weights) ; writes: moments + master + weights
        (MEGATRON, (4 + 8 + 4) + (8 + 4 + 2)),  # 30
        (ZERO_PAPER, (2 + 8 + 4) + (8 + 4 + 2)),  # 28
        (NO_MASTER, (2 + 8 + 2) + (8 + 0 + 2)),  # 22: updates the bf16 weights in place
        (FP32, (4 + 8 + 4) + (8 + 0 + 4)),  # 28
        (PrecisionRecipe(grad_dtype="bf16", grad_fp32_copy=True), (2 + 4 + 8 + 4) + (8 + 4 + 2)),  # 32
        (PrecisionRecipe(optimizer="sgd"), (4 + 4 + 4) + (4 + 4 + 2)),  # 22: one momentum buffer
    ],
)
def test_optimizer_step_bytes_follow_the_recipe(recipe, expected):
    assert recipe.optimizer_step_bytes == expected


def test_optimizer_step_time_scales_with_the_recipe():
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 8)
    times = {}
    for name, recipe in (("megatron", MEGATRON), ("no_master", NO_MASTER)):
        plan = TrainingPlan(dp=8, zero=0, global_batch=8, seq_len=1024, precision=recipe)
        times[name] = estimate(model, cluster, plan).time.optimizer_s
    assert times["megatron"] / times["no_master"] == pytest.approx(30 / 22, rel=1e-12)


def test_fsdp_accumulating_unsharded_holds_gathered_weights_and_gradients():
    """ZeRO-3 whose weights stay gathered and gradients unsharded through the step's micro-batches
    (torch.distributed.pipelining with FSDP2) holds, beyond its shards, the other (1 − 1/N) of
    the stage's weights and of its gradients — one full copy of each — and reduce-scatters once per
    step instead of per layer and micro-batch."""
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 32)
    base = dict(pp=4, dp=8, zero=3, global_batch=64, seq_len=4096, reshard_after_forward=False)
    per = estimate(model, cluster, TrainingPlan.of(**base)).to_dict()
    acc = estimate(model, cluster, TrainingPlan.of(**base, fsdp_accumulate_unsharded=True)).to_dict()
    s = acc["memory"]["stages"][1]
    P = s["params"]
    assert s["other_detail"]["unsharded_gradients"] == pytest.approx(P * 4 * (1 - 1 / 8), rel=1e-12)  # fp32
    assert s["gradients"] + s["other_detail"]["unsharded_gradients"] == pytest.approx(P * 4, rel=1e-12)
    assert s["other_detail"]["gathered_weights"] == pytest.approx(P * 2 * (1 - 1 / 8), rel=1e-12)
    assert "unsharded_gradients" not in per["memory"]["stages"][1]["other_detail"]
    assert acc["time"]["breakdown"]["fsdp_comm"] == 0.0 and acc["time"]["breakdown"]["dp_comm"] > 0.0


def test_fsdp_accumulate_unsharded_needs_pipelined_zero3():
    """torch's pipeline schedules accumulate unsharded: without ZeRO-3 and pp > 1 the stack's rule
    sets the field aside, and a plan with both keeps it."""
    assert TrainingPlan.of(dp=8, zero=2, global_batch=8, seq_len=1024, fsdp_accumulate_unsharded=True).stack.fsdp_accumulate_unsharded is False
    assert TrainingPlan.of(dp=8, zero=3, global_batch=8, seq_len=1024, fsdp_accumulate_unsharded=True).stack.fsdp_accumulate_unsharded is False
    piped = TrainingPlan.of(dp=4, pp=2, zero=3, global_batch=8, seq_len=1024, fsdp_accumulate_unsharded=True)
    assert piped.stack.fsdp_accumulate_unsharded is True and piped.stack.reshard_after_forward is False


def test_backward_working_set_counts_at_the_layer_moment_only():
    """A recomputed layer's working set W lives in its backward, after the loss's: at the head
    moment it is taken off again, at the layer moment it adds to what the head freed."""
    from meshplan.cost.compose import rank_other_items

    common = dict(reserve=0.0, holds_head=True, head_act=10.0, zero=0, shard=1, params=100, layer_params=10, head_params=5,
                  kept_embedding_params=0, weight_bytes=2, grad_bytes=4, reshard_after_forward=True, once_per_step=False,
                  tp=1, act_msg=1.0, pp=1, p2p_bytes=1.0, down_params=2, layer_stored=4.0, logits_block=0.0)
    head = rank_other_items(logits_grad=50.0, working=20.0, **common)  # 50 > 20 − 10
    assert head["logits_grad"] == 50.0 and head["working_set_not_yet_built"] == -20.0
    assert "head_activations_freed" not in head
    layer = rank_other_items(logits_grad=5.0, working=20.0, **common)  # 5 < 20 − 10
    assert layer["logits_grad"] == 0.0 and layer["head_activations_freed"] == -10.0
    assert "working_set_not_yet_built" not in layer
    # with W counted among the activations: A + W + other = A + max(50, W − 10) and A + max(5, W − 10)
    assert 20.0 + sum(head.values()) == 50.0 and 20.0 + sum(layer.values()) == 10.0


def test_fsdp2_keeps_its_fp32_shards_as_the_master_copy():
    """torchtitan's bf16 training with fp32 reduction: Megatron and DeepSpeed keep bf16 weights
    beside an fp32 master (2 + 4 + 12 = 18 bytes a parameter); FSDP2's sharded parameter is the
    fp32 copy the optimizer steps, cast to bf16 only into the all-gather's input (4 + 4 + 8 = 16)."""
    from meshplan.cost.memory import state_bytes_per_param

    bf16 = PrecisionRecipe(precision="bf16", grad_dtype="fp32")
    assert state_bytes_per_param(bf16) == (2, 4, 12) and sum(state_bytes_per_param(bf16)) == bf16.bytes_per_param == 18
    assert state_bytes_per_param(bf16, True) == (4, 4, 8)
    # no master copy to fold in: fp32 training, and bf16 weights without a master, are the same on both
    fp32 = PrecisionRecipe(precision="fp32", grad_dtype="fp32")
    assert state_bytes_per_param(fp32, True) == state_bytes_per_param(fp32) == (4, 4, 8)
    pure = PrecisionRecipe(precision="bf16", grad_dtype="bf16", master_weights=False)
    assert state_bytes_per_param(pure, True) == state_bytes_per_param(pure) == (2, 2, 8)
    st = model_state_bytes(8_000, bf16, 3, 8, fsdp2=True)
    assert (st.weights, st.gradients, st.optimizer) == (4_000, 4_000, 8_000)
    # elementwise over plans, as the search screens them
    import numpy as np

    zero = np.array([1, 3, 3])
    st = model_state_bytes(8_000, bf16, zero, 8, fsdp2=(zero == 3) & np.array([True, True, False]))
    assert st.weights.tolist() == [16_000, 4_000, 2_000] and st.optimizer.tolist() == [12_000, 8_000, 12_000]


def test_estimate_counts_fsdp2_state_on_the_torch_stacks_only():
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 8)
    P = count_params(model).total
    kw = dict(dp=8, zero=3, global_batch=8, seq_len=2048)
    for kernels, per_param in (("fused", 18), ("compiled", 16), ("eager", 16)):
        (st,) = estimate(model, cluster, TrainingPlan.of(kernels=kernels, **kw)).stages
        assert st.weights + st.gradients + st.optimizer == per_param * P / 8
    # ZeRO-1 on the torch stack keeps the recipe's split (no FSDP2)
    (st,) = estimate(model, cluster, TrainingPlan.of(kernels="compiled", **(kw | {"zero": 1}))).stages
    assert st.weights == 2 * P and st.optimizer == 12 * P / 8


def test_fsdp2_root_unit_of_2024_holds_embedding_head_and_last_block():
    """torchtitan's units until pytorch/torchtitan#1094: the root (embedding, final norm, LM head)
    is never resharded after forward, the last block is kept gathered, and the LM head's bf16
    gradient waits for the root's post-backward, at the end of the backward."""
    from meshplan.cost.compose import rank_other_items

    common = dict(reserve=0.0, holds_head=True, head_act=0.0, zero=3, shard=8, params=1_000, layer_params=30,
                  head_params=50, kept_embedding_params=0, weight_bytes=2, grad_bytes=4, reshard_after_forward=True,
                  once_per_step=False, tp=1, act_msg=0.0, pp=1, p2p_bytes=0.0, root_embedding_params=40,
                  down_params=10, layer_stored=1_000.0, logits_block=0.0)
    # head moment (the loss's buffers win): the head unit alone, or the root and the last block
    own = rank_other_items(logits_grad=1e6, **common)
    root = rank_other_items(logits_grad=1e6, head_in_root=True, **common)
    assert own["gathered_weights"] == 2 * 50 and root["gathered_weights"] == 2 * (50 + 40 + 30)
    assert root["root_gradients_held"] == 0.0 and "root_gradients_held" not in own
    # layer moment: the layer in use and the prefetched one, plus the root and the head's gradient
    own = rank_other_items(logits_grad=0.0, **common)
    root = rank_other_items(logits_grad=0.0, head_in_root=True, **common)
    assert own["gathered_weights"] == 2 * 2 * 30 and root["gathered_weights"] == 2 * (2 * 30 + 40 + 50)
    # the top layer's MLP: the previous layer's gradients and its down projection's (10)
    assert root["root_gradients_held"] == 2 * 50 and own["grad_reduce_buckets"] == root["grad_reduce_buckets"] == (30 + 10) * 4
    # weights kept gathered (ZeRO-2-like) or accumulated unsharded: the root changes nothing
    for kw in ({"reshard_after_forward": False}, {"once_per_step": True}):
        assert rank_other_items(logits_grad=0.0, **(common | kw)) == rank_other_items(logits_grad=0.0, head_in_root=True, **(common | kw))


def test_root_unit_plan_is_torchs_fsdp2_without_a_pipeline():
    ok = dict(dp=8, zero=3, kernels="eager", global_batch=8, seq_len=2048, fsdp_head_in_root=True)
    TrainingPlan.of(**ok)
    assert TrainingPlan.of(**ok).stack.fsdp_head_in_root is True
    for other in ({"zero": 1}, {"kernels": "fused"}, {"pp": 2, "global_batch": 16}):  # no FSDP2 root unit: set aside
        assert TrainingPlan.of(**(ok | other)).stack.fsdp_head_in_root is False
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 8)
    # 8,192-token sequences: the loss's fp32 buffers make the head moment the peak either way
    own, root = (estimate(model, cluster, TrainingPlan.of(**(ok | {"seq_len": 8192, "fsdp_head_in_root": v}))) for v in (False, True))
    assert own.stages[0].other_items["logits_grad"] == root.stages[0].other_items["logits_grad"] > 0
    counts = count_params(model)
    emb, block = counts.embedding, counts.layer.total
    # the loss's moment: the embedding and the last block gathered in bf16 beside the head unit; and
    # FSDP2's all-gather pool, the root's buffer (embedding and head) beside a block's where the own
    # units' ends with the head unit's beside one: the embedding's bf16 bytes more
    pools = [e.stages[0].other_items["all_gather_pool"] for e in (own, root)]
    assert pools[1] - pools[0] == 2 * emb
    assert root.peak_bytes - own.peak_bytes == 2 * (emb + block) + 2 * emb
    # and the embedding is not gathered again before its backward
    assert root.time.fsdp_comm_s < own.time.fsdp_comm_s
