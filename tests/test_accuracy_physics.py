"""The physical effects behind the accuracy figures: the power-capped GPU, the element-wise
traffic and loss buffers of each software stack, and the held-out set of published runs."""

from __future__ import annotations

import contextlib
import io
import json
from fractions import Fraction

import pytest

from meshplan.accuracy import RUN_SETS, predict, published_runs, runs_of, validate_runs
from meshplan.accuracy.formulas import megatron_r08_flops
from meshplan.accuracy.heldout import heldout_runs, map_heldout_runs
from meshplan.catalog import load_gpu, load_model
from meshplan.cli.app import main
from meshplan.cost.activations import loss_grad_bytes
from meshplan.cost.calibration import HOPPER, STATIC_POWER_FRACTION, calibration_for, power_cap_clock_ratio, power_capped, synchronized
from meshplan.cost.compute import (
    elementwise_bytes,
    input_gradient_sum_bytes,
    layer_op_times,
    projection_gemms,
    rope_bytes,
    softmax_bytes,
)
from meshplan.cost.fsdp_copies import fsdp2_unit_copy_times, gather_pool_bytes
from meshplan.cost.kernel_time import gemm_time, memory_time
from meshplan.cost.params import count_params
from meshplan.errors import InputError
from meshplan.estimate import estimate
from meshplan.pipeline.stages import layer_split
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import TrainingPlan


# ---- power cap ----------------------------------------------------------------------------------


def test_power_cap_scales_every_peak_by_the_cube_root_of_the_dynamic_power_ratio():
    h100 = load_gpu("h100-sxm-80gb")
    capped = power_capped(h100, 500)
    assert STATIC_POWER_FRACTION * 700 == pytest.approx(126.3, abs=1e-9)  # the H200's idle board power
    r = ((500 - 126.3) / (700 - 126.3)) ** (1 / 3)
    assert r == pytest.approx(0.86685, abs=1e-5)
    assert power_cap_clock_ratio(500, 700) == pytest.approx(r, rel=1e-12)
    for dtype in ("fp32", "tf32", "bf16", "fp16", "fp8"):
        assert capped.peak(dtype) == h100.peak(dtype) * power_cap_clock_ratio(500, 700)
    assert capped.peak("bf16") / 1e12 == pytest.approx(857.7, abs=0.1)
    assert (capped.hbm_bandwidth, capped.hbm_bytes, capped.tdp_watts) == (h100.hbm_bandwidth, h100.hbm_bytes, 500.0)
    # NVIDIA rates its own power-limited Hopper, the H100 NVL (132 SMs, 400 W), at 835 TFLOP/s
    # dense BF16; the law gives 773 (-7.4 %): a data-sheet clock, not one sustained under load
    # (the 700 W part is rated at 1830 MHz and sustains 1455 MHz on a large GEMM)
    assert power_capped(h100, 400).peak("bf16") / 1e12 == pytest.approx(773.1, abs=0.1)
    assert power_capped(h100, 700).peak_flops == h100.peak_flops


def test_power_cap_ratio_is_one_at_the_tdp_and_falls_faster_than_the_cube_root_of_the_power():
    assert power_cap_clock_ratio(700, 700) == 1.0
    for watts in (300, 400, 500, 600):
        assert power_cap_clock_ratio(watts, 700) < (watts / 700) ** (1 / 3)
    # same fraction of a different TDP: the same ratio (the static share scales with the TDP)
    assert power_cap_clock_ratio(200, 400) == pytest.approx(power_cap_clock_ratio(350, 700), rel=1e-12)


@pytest.mark.parametrize("watts", [0, -5, 126.3, 701])
def test_power_cap_outside_zero_to_tdp_is_refused(watts):
    with pytest.raises(InputError, match="gpu.power_cap"):
        power_capped(load_gpu("h100-sxm-80gb"), watts)


# ---- software stack: element-wise kernels and the loss ---------------------------------------------


def test_elementwise_bytes_per_stack():
    assert elementwise_bytes(2, "fused") == elementwise_bytes(2, "compiled") == {"norm": 4, "swiglu": 6}
    # eager RMSNorm: cast 2+4, square 4+4, mean 4, scale 4+4, cast 4+2, weight 2+2
    assert elementwise_bytes(2, "eager") == {"norm": 36, "swiglu": 10}
    # RoPE: the fused kernel reads and writes once each way; torch's, compiled or eager, casts to
    # fp32 (2+4), multiplies the complex pairs (4+4) and casts back (4+2), each way
    assert rope_bytes(2, "fused") == (4, 4)
    assert rope_bytes(2, "compiled") == rope_bytes(2, "eager") == (20, 20)


def test_rope_only_for_rotary_models():
    """A model with learned positions runs no RoPE: its layer moves the RoPE bytes less."""
    gpu = load_gpu("h100-sxm-80gb")
    rotary = load_model("llama3-8b")
    learned = rotary.model_copy(update={"position": "learned", "max_position": 8192})
    args = (2, 8192, 1, 1, False, "flash", "causal", gpu, HOPPER, "bf16", 2, "fused")
    a, b = layer_op_times(rotary, *args), layer_op_times(learned, *args)
    elems = 2 * 8192 * (32 + 8) * 128
    w = gpu.hbm_bandwidth * HOPPER.hbm_efficiency
    assert a.fwd_memory - b.fwd_memory == pytest.approx(4 * elems / w, rel=1e-12)
    assert a.bwd_memory - b.bwd_memory == pytest.approx(4 * elems / w, rel=1e-12)


LLAMA8B = load_model("llama3-8b")


def _ops(kernels, cal=HOPPER):
    """One stack's layer, with FlashAttention-2 on every stack (the attention kernel is the plan's
    ``attention_kernel``, tests/test_attention_kernel.py): the stacks differ elsewhere. ``cal``:
    one GPU's calibration, or a cluster's (:func:`meshplan.cost.calibration.synchronized`)."""
    gpu = load_gpu("h100-sxm-80gb")
    return layer_op_times(LLAMA8B, 2, 8192, 1, 1, False, "flash", "causal", gpu, cal, "bf16", 2, kernels,
                          attention_kernel="flash2"), gpu


def _repeat_kv(gpu):
    """torch's GQA K/V copy on the torch stacks (compute.repeat_kv_bytes): 8 -> 32 heads of 128."""
    return memory_time(2 * 2 * 8192 * 128 * (8 + 32) * 2, gpu, HOPPER) + HOPPER.kernel_overhead


def test_stacks_differ_in_memory_bound_time_and_in_the_projections_gemms():
    (fused, gpu), (eager, _), (compiled, _) = _ops("fused"), _ops("eager"), _ops("compiled")
    rep = _repeat_kv(gpu)
    n, h, f, ad = 2 * 8192, 4096, 14336, (32 + 8) * 128
    # the torch stacks sum the input gradients of the separate q, k, v (and gate, up) GEMMs:
    # compiled, inside both reductions of RMSNorm's backward, each reading 3 (2) gradients where
    # one would do: 2 x (2 + 1) x n·h·e, no kernel of its own; eager, autograd's 2 + 1 adds of
    # read 2, write 1: 3 x (2 + 1) x n·h·e in three kernels
    sum_compiled, sum_eager = 2 * 3 * n * h * 2, 3 * 3 * n * h * 2
    assert (sum_compiled, sum_eager) == (805_306_368, 1_207_959_552)
    assert input_gradient_sum_bytes(projection_gemms(LLAMA8B, n, 1, "compiled"), h, 2, "compiled") == sum_compiled
    assert input_gradient_sum_bytes(projection_gemms(LLAMA8B, n, 1, "eager"), h, 2, "eager") == sum_eager
    assert input_gradient_sum_bytes(projection_gemms(LLAMA8B, n, 1, "fused"), h, 2, "fused") == 0
    w = gpu.hbm_bandwidth * HOPPER.hbm_efficiency
    # torch's RoPE (rope_bytes): 16 bytes more an element each way than the fused kernel's, whose
    # backward moves 2e, and three more kernels a forward
    rope = 16 * n * ad / w
    o = HOPPER.kernel_overhead
    assert compiled.fwd_memory - fused.fwd_memory == pytest.approx(rep + rope + 3 * o, rel=1e-12)
    assert compiled.bwd_memory - fused.bwd_memory == pytest.approx(rep + sum_compiled / w + rope + 6 * o, rel=1e-12)
    assert (eager.fwd_attention, eager.bwd_attention) == (compiled.fwd_attention, compiled.bwd_attention) == (
        fused.fwd_attention, fused.bwd_attention)
    # the GEMMs: Megatron's fused QKV and gate|up, torch's seven projections, both stacks alike
    peak = gpu.peak("bf16")

    def fwd_sum(shapes):
        return sum(float(gemm_time(m, nn, k, gpu, HOPPER, peak, 2)) for m, nn, k in shapes)

    assert fused.fwd_gemm == pytest.approx(fwd_sum([(n, 6144, h), (n, h, h), (n, 2 * f, h), (n, h, f)]), rel=1e-12)
    separate = [(n, h, h), (n, 1024, h), (n, 1024, h), (n, h, h), (n, f, h), (n, f, h), (n, h, f)]
    assert eager.fwd_gemm == compiled.fwd_gemm == pytest.approx(fwd_sum(separate), rel=1e-12)
    assert eager.bwd_gemm == compiled.bwd_gemm > fused.bwd_gemm
    # extra bytes: 2 norms x (36 - 4) x n·h + SwiGLU (10 - 6) x n·f (RoPE alike: 20 each way)
    extra = 2 * 32 * n * h + 4 * n * f
    expected = extra / w + (24 - 10) * o
    assert eager.fwd_memory - compiled.fwd_memory == pytest.approx(expected)
    # the backward: twice the forward's element-wise bytes, but RoPE's once, plus the sums
    assert eager.bwd_memory == pytest.approx(
        2 * eager.fwd_memory - rep + sum_eager / w + 3 * o - 20 * n * ad / w, rel=1e-12)


def test_materialized_softmax_is_one_fused_kernel_each_way():
    """Megatron's fused scale + causal mask + softmax reads the scores and writes the probabilities
    (2e), its backward reads the gradient and the probabilities and writes the input gradient (3e);
    eager runs scale, masked_fill and softmax apart (6e; backward 3e + 2e + 2e)."""
    assert softmax_bytes(2, "fused") == softmax_bytes(2, "compiled") == (4, 6)
    assert softmax_bytes(2, "eager") == (12, 14)
    gpu = load_gpu("a100-sxm-80gb")
    cal = calibration_for(gpu)
    model = load_model("gpt3-175b")
    args = (model, 1, 2048, 8, 1, True, "materialized", "causal", gpu, cal, "bf16", 2)
    fused, eager = layer_op_times(*args, "fused"), layer_op_times(*args, "eager")
    scores = 1 * (96 // 8) * 2048 * 2048  # b·a/t·s² on one TP rank
    w = gpu.hbm_bandwidth * cal.hbm_efficiency
    assert eager.fwd_attention - fused.fwd_attention == pytest.approx(scores * (12 - 4) / w, rel=1e-9)
    assert eager.bwd_attention - fused.bwd_attention == pytest.approx(scores * (14 - 6) / w, rel=1e-9)


def test_loss_buffers_per_stack():
    m = load_model("llama3-8b")
    per = 4 * 2 * 8192 * 128256  # fp32 logits of 16,384 tokens over the 128,256-entry vocabulary
    assert loss_grad_bytes(m, 2, 8192, 1, 1, "fused") == per == 8_405_385_216
    assert loss_grad_bytes(m, 2, 8192, 1, 1, "eager") == 2 * per
    # a compiled loss (the plan's loss_kernels): only the bf16 gradient of the logits
    assert loss_grad_bytes(m, 2, 8192, 1, 1, "compiled", 2) == per // 2
    # with TP, torch's loss_parallel: one more fp32 logits shard (zeros, exp and sum beside the saved x)
    assert loss_grad_bytes(m, 2, 8192, 8, 2, "compiled") == 3 * 4 * 8192 * (128256 // 8)
    assert loss_grad_bytes(m, 2, 8192, 8, 2, "fused") == 4 * 8192 * (128256 // 8)


def test_torch_stack_estimate_holds_one_more_fp32_logits_on_the_last_stage():
    """Compiled blocks with torch's eager cross-entropy beside them (compile_loss off, torchtitan
    of 2024) against Megatron's fused loss: one more fp32 logits tensor at the peak, the bf16
    logits' block the caching allocator keeps reserved beside the eager loss's fp32 tensors, the
    final norm's fp32 input and 1/RMS (it runs eager beside the compiled blocks), and FSDP2's
    all-gather pool."""
    model = load_model("llama3-8b")
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 8)
    plans = {k: TrainingPlan.build(where="plan", dp=8, micro_batch=2, global_batch=16, seq_len=8192, zero=3,
                                   recompute="op", kernels=k, compile_loss=False, attention_kernel="flash2")
             for k in ("fused", "compiled")}  # one attention kernel on both: the stacks differ elsewhere
    est = {k: estimate(model, cluster, p) for k, p in plans.items()}
    n, V, h = 2 * 8192, 128_256, 4096
    # the peak is the loss's backward on both stacks: the layers' working sets (larger on the torch
    # stack by its repeated K/V) are not built yet. FSDP2's fp32 shards are the master copy: no
    # bf16 shard, 2 bytes less per parameter (the model's 8,030,261,248 over 8 ranks)
    bf16_shard = 2 * 8_030_261_248 // 8
    # under torch.compile, op-level checkpointing keeps no down-projection output (the backward
    # never reads it): n·h·e less in each of the 32 layers (activations.op_sac_saved)
    down_outputs = 32 * n * h * 2
    # FSDP2's all-gather pool on its copy-in stream (the torch stack's ZeRO-3; Megatron's has none):
    # the final norm + LM head unit's bf16 buffer beside a block's, at the loss (the head unit last)
    pool = gather_pool_bytes(model, 1, 1, ((32, True, True),), 2)
    assert pool == (V * h + h) * 2 + 218_112_000 * 2 == est["compiled"].stages[0].other_items["all_gather_pool"]
    diff = 4 * n * V + 2 * n * V + (4 * n * h + 4 * n) - bf16_shard - down_outputs + pool
    assert est["compiled"].peak_bytes - est["fused"].peak_bytes == diff == 6_574_046_208 + 1_486_905_344
    assert est["compiled"].stages[0].other_items["freed_logits_block"] == 2 * n * V
    assert "freed_logits_block" not in est["fused"].stages[0].other_items
    # same fused element-wise kernels; the torch stack adds the GQA K/V copy forward, backward and
    # in the op-level recompute of each of the 32 layers, runs q, k, v and gate, up as separate
    # GEMMs and sums their input gradients (inside the norms' backward), FSDP2's copies (every
    # layer and the embedding copied out forward and backward, the head unit forward, each copied
    # in once; one micro-batch per step) and torch's foreach AdamW with clip_grad_norm_ (92 bytes
    # a parameter against the fused step's 30)
    # per layer: the layer model's difference between the stacks (forward, backward, op-level
    # recompute; test_stacks_differ_in_memory_bound_time_and_in_the_projections_gemms)
    # (the cluster's calibration: its compute at the slowest GPU's pace, meshplan.cost.variability)
    synced = synchronized(HOPPER, cluster.num_gpus)
    (fused_ops, _), (compiled_ops, _) = _ops("fused", synced), _ops("compiled", synced)
    per_layer = sum(getattr(compiled_ops, k) - getattr(fused_ops, k) for k in ("fwd", "bwd", "fwd_op_recompute"))
    assert per_layer > 3 * _repeat_kv(cluster.gpu)
    co, ci, e_co, e_ci, h_co, h_ci = fsdp2_unit_copy_times(model, 1, 1, plans["compiled"].precision, cluster.gpu, calibration_for(cluster.gpu))
    copies = 32 * (2 * co + ci) + 2 * e_co + e_ci + h_co + h_ci
    optimizer = est["fused"].time.optimizer_s * (92 / 30 - 1)
    assert est["compiled"].time.optimizer_s == pytest.approx(est["fused"].time.optimizer_s * 92 / 30, rel=1e-12)
    # and torch's eager loss moves (e + 20) + (24 + e) bytes a logit where Megatron's fused one
    # moves (e + 16) + (12 + e): 16 more a logit (compute.head_op_times)
    cal = calibration_for(cluster.gpu)
    loss = n * V * (4 + 12) / (cluster.gpu.hbm_bandwidth * cal.hbm_efficiency)
    assert est["compiled"].time.step_s - est["fused"].time.step_s == pytest.approx(32 * per_layer + copies + optimizer + loss, rel=1e-6)
    assert est["compiled"].time.fsdp_comm_s - est["fused"].time.fsdp_comm_s == pytest.approx(copies, rel=1e-9)


def test_unknown_kernels_value_is_refused():
    with pytest.raises(InputError):
        TrainingPlan.build(where="plan", global_batch=8, seq_len=128, kernels="jit")


# ---- the held-out set ---------------------------------------------------------------------------


def test_heldout_runs_are_separate_from_the_ground_truth():
    ids = [r["id"] for r in heldout_runs()]
    assert len(ids) == len(set(ids)) == 153
    assert not set(ids) & {r["id"] for r in published_runs()}
    runs = map_heldout_runs()
    assert all(r.supported for r in runs)
    assert {r.group for r in runs} == {"nemo2407", "mbridge", "dgxc", "mtnlg", "llmfoundry"}


def test_heldout_step_times_follow_the_published_figures():
    runs = {r.id: r for r in map_heldout_runs()}
    assert runs["nemo2407_llama3_8b_8gpu"].published_step_s == float(Fraction(128 * 8192, 12036 * 8))
    assert runs["mtnlg_530b_2240gpu"].published_step_s == 60.1
    p = runs["nemo2407_llama3_70b_64gpu"].plan
    assert (p.tp, p.pp, p.cp, p.dp, p.vpp, p.schedule, p.precision.precision) == (4, 4, 2, 2, 5, "interleaved", "fp8")
    q = runs["mtnlg_530b_3360gpu"].plan
    assert (q.dp, q.grad_accum, q.recompute, q.attention) == (12, 160, "full", "materialized")


def test_megatron_bridge_rows_agree_with_their_own_tflops_column():
    """Megatron-Bridge prints tokens/s per GPU and model TFLOP/s per GPU; the second is the first
    times Megatron-LM's causal FLOP count per token (s/(2h) in the attention term), to the
    table's rounding — the non-causal r0.8 count would be 7 % (70B) and 4 % (405B) higher. The step
    comes from the tokens; the plans are Megatron-Core's with bf16 gradient reduction."""
    rows = {r["id"]: r for r in heldout_runs() if r["group"] == "mbridge"}
    assert len(rows) == 4
    arch = {"llama3-70b": (80, 8192, 64, 8, 28672), "llama3-405b": (126, 16384, 128, 8, 53248)}
    for run in (r for r in map_heldout_runs() if r.group == "mbridge"):
        raw, p = rows[run.id], run.plan
        L, h, a, g, f = arch[raw["model"]]
        per_token = megatron_r08_flops(1, 8192, L, h, a, g, 128, f, 128256, gated=True, causal=True) / 8192
        implied = per_token * raw["tokens_per_s_per_gpu"] / 10**12
        assert abs(implied - raw["model_tflops_per_gpu"]) <= Fraction(1, 2) + raw["model_tflops_per_gpu"] * Fraction(2, 1000), run.id
        full = megatron_r08_flops(1, 8192, L, h, a, g, 128, f, 128256, gated=True) / 8192
        assert full / per_token > Fraction(104, 100)
        assert run.published_step_s == float(Fraction(raw["global_batch"] * 8192, raw["tokens_per_s_per_gpu"] * raw["gpus"]))
        assert (p.tp, p.pp, p.cp, p.vpp, p.zero, p.recompute) == (raw["tp"], raw["pp"], raw["cp"], raw["vp"], 1, "none")
        assert (p.precision.precision, p.precision.grad_dtype, p.stack.kernels, p.stack.tp_comm_overlap) == ("fp8", "bf16", "fused", True)
    # the 405B recipe's split (embedding and loss counted as a layer each) is meshplan's default one
    big = next(r for r in map_heldout_runs() if r.id == "mbridge2511_llama31_405b_1024gpu")
    assert layer_split(126, 8, 8) == (1,) + (2,) * 62 + (1,) and big.plan.layer_split is None


def test_dgxc_rows_agree_with_their_own_throughput_and_recipes():
    """DGX Cloud Benchmarking prints the step time and the cluster's tokens/s of each column; the
    two agree (tokens/s = global batch x sequence / step) to the table's rounding of the step, which
    catches a mistyped cell (the 405B 96-GPU "8.7  5" reads 8.75). Each row's plan carries its
    workload's recipe: layout, micro-batch, accumulation, recompute, attention kernel, gradients."""
    rows = {r["id"]: r for r in heldout_runs() if r["group"] == "dgxc"}
    assert len(rows) == 88 and sum(r["precision"] == "bf16" for r in rows.values()) == 44
    runs = {r.id: r for r in map_heldout_runs() if r.group == "dgxc"}
    for rid, raw in rows.items():
        run, p = runs[rid], runs[rid].plan
        tokens = raw["global_batch"] * raw["seq_len"]
        step = Fraction(str(raw["step_time_s"]))
        assert abs(Fraction(tokens) / step / raw["tokens_per_s"] - 1) < Fraction(3, 1000), rid
        assert run.published_step_s == float(step)
        assert p.dp * p.tp * p.pp * p.cp == raw["gpus"] and p.grad_accum * p.micro_batch * p.dp == raw["global_batch"]
        assert p.ep == raw.get("ep", 1) and (p.ep > 1) == run.model.is_moe
        assert (p.vpp, p.zero, p.stack.kernels, p.sequence_parallel, p.stack.tp_comm_overlap) == (raw["vp"], 1, "fused", p.tp > 1, p.tp > 1)
        assert p.schedule == ("interleaved" if raw["vp"] > 1 else "1f1b")
    # the recipes' settings, as their scripts give them
    r = {k: runs[k].plan for k in ("dgxc_nemotron4_340b_bf16_128gpu", "dgxc_gpt3_175b_fp8_2048gpu",
                                    "dgxc_nemotron4_15b_bf16_16gpu", "dgxc_llama31_8b_fp8_8gpu")}
    assert (r["dgxc_nemotron4_340b_bf16_128gpu"].recompute, r["dgxc_nemotron4_340b_bf16_128gpu"].stack.attention_kernel) == ("selective", "flash2")
    assert r["dgxc_nemotron4_340b_bf16_128gpu"].grad_accum == 16 and r["dgxc_gpt3_175b_fp8_2048gpu"].grad_accum == 64
    assert r["dgxc_gpt3_175b_fp8_2048gpu"].stack.attention_kernel == "flash2" and runs["dgxc_gpt3_175b_fp8_2048gpu"].model.dropout
    assert (r["dgxc_nemotron4_15b_bf16_16gpu"].precision.grad_dtype, r["dgxc_nemotron4_15b_bf16_16gpu"].stack.attention_kernel) == ("fp32", "cudnn")
    assert (r["dgxc_llama31_8b_fp8_8gpu"].precision.grad_dtype, r["dgxc_llama31_8b_fp8_8gpu"].cp) == ("bf16", 2)
    # the 405B runs: GPT-2's tokenizer padded to 51,200, 16 query groups, and the proxies' layers
    proxy, full = runs["dgxc_llama31_405b_fp8_32gpu"], runs["dgxc_llama31_405b_bf16_2304gpu"]
    assert (proxy.model.n_layers, proxy.plan.pp, proxy.plan.vpp, proxy.plan.dp) == (7, 1, 1, 2)
    assert (full.model.n_layers, full.model.vocab_size, full.model.n_kv_heads) == (126, 51200, 16)
    assert (full.plan.pp, full.plan.vpp, full.plan.dp, full.plan.grad_accum) == (9, 7, 16, 63)
    assert runs["dgxc_llama31_405b_bf16_96gpu"].published_step_s == 8.75
    # the report splits the source by compute precision: 44 BF16 and 44 FP8 rows
    rep = validate_runs(run_set="held-out")
    split = {k: g.supported for k, g in rep.source_precisions.items() if k.startswith("dgxc/")}
    assert split == {"dgxc/bf16": 44, "dgxc/fp8": 44} and "mbridge/fp8" not in rep.source_precisions
    # Grok-1: 8 experts, top 2, over EP 8 (2 and 4 on the one- and two-node proxies), as NeMo builds it
    grok, small = runs["dgxc_grok1_314b_fp8_512gpu"], runs["dgxc_grok1_314b_bf16_8gpu"]
    assert (grok.model.n_experts, grok.model.experts_per_token, grok.model.n_layers, grok.model.vocab_size) == (8, 2, 64, 128256)
    assert (grok.model.tied_embeddings, grok.model.norms_per_layer, grok.plan.stack.attention_kernel) == (False, 2, "flash2")
    assert (grok.plan.tp, grok.plan.pp, grok.plan.cp, grok.plan.dp, grok.plan.ep, grok.plan.vpp) == (4, 8, 2, 8, 8, 8)
    assert (small.model.n_layers, small.plan.seq_len, small.plan.dp, small.plan.ep, small.plan.grad_accum) == (2, 4096, 2, 2, 512)
    # the one cell that disagrees with its column: 70B BF16 on 2,048 GPUs prints 14.98 s, while its
    # tokens/s, MFU and days for 1T tokens
    # all come from 14.92 s; the row takes 14.92
    odd = rows["dgxc_llama31_70b_bf16_2048gpu"]
    assert odd["printed_step_time_s"] == 14.98 and odd["step_time_s"] == 14.92
    assert round(4096 * 8192 / 14.92) == 2248957 and round(4096 * 8192 / 14.98) == 2239949
    # MFU per GPU is the same at every scale for the same step: the 1,024-GPU column's 14.92 s prints
    # 53.38 %, as the 2,048-GPU column does; 14.98 s would print 53.17 %
    assert round(53.38 * 14.92 / 14.98, 2) == 53.17
    assert round(1e12 / 2248957 / 86400, 2) == 5.15 != round(1e12 / (4096 * 8192 / 14.98) / 86400, 2)


def test_llm_foundry_rows_are_mpt_by_its_own_parameter_count():
    """Every LLM Foundry row: meshplan's count of the MPT config equals the table's NumParams to
    the parameter; the step is the global batch's tokens over the published tokens/s per GPU; the
    plan is FSDP over every GPU with the table's micro-batch and checkpointing."""
    rows = {r["id"]: r for r in heldout_runs() if r["group"] == "llmfoundry"}
    assert len(rows) == 49
    for run in (r for r in map_heldout_runs() if r.group == "llmfoundry"):
        raw, p = rows[run.id], run.plan
        assert count_params(run.model).total == raw["params"], run.id
        n = raw["gpus"]
        assert run.published_step_s == float(Fraction(raw["global_batch"] * 2048, raw["tokens_per_s_per_gpu"] * n))
        assert (p.dp, p.tp, p.pp, p.zero, p.stack.kernels, p.micro_batch) == (n, 1, 1, 3, "eager", raw["micro_batch"])
        assert p.recompute == ("full" if raw["activation_checkpointing"] else "none")
        assert p.grad_accum * p.micro_batch * n == raw["global_batch"]
    # PURE mixed precision reduces in bf16, DEFAULT in fp32
    assert map_heldout_runs()[-1].plan.precision.grad_dtype == "bf16"
    fp8 = next(r for r in map_heldout_runs() if r.id == "llmfoundry_h100_fp8_3b_8gpu").plan
    assert (fp8.precision.precision, fp8.stack.kernels, fp8.stack.fp8_library) == ("fp8", "eager", "transformer-engine")
    h100 = next(r for r in map_heldout_runs() if r.id == "llmfoundry_h100_bf16_7b_8gpu")
    assert h100.plan.precision.grad_dtype == "fp32" and h100.published_step_s == pytest.approx(48 * 2048 / (8 * 10643))


def test_run_sets_and_predictions_through_estimate():
    assert RUN_SETS == ("visible", "held-out", "all")
    assert len(runs_of("all")) == len(runs_of("visible")) + len(runs_of("held-out"))
    rep = validate_runs(run_set="held-out")
    assert rep.run_set == "held-out" and rep.to_dict()["set"] == "held-out"
    assert rep.overall.supported == 153
    run = [r for r in map_heldout_runs() if r.id == "nemo2407_llama2_7b_8gpu"][0]
    assert predict(run).predicted_step_s == estimate(run.model, run.cluster, run.plan).time.step_s
    assert calibration_for(run.cluster.gpu) is HOPPER
    with pytest.raises(InputError, match="set"):
        runs_of("hidden")


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_cli_validate_set_held_out_json_and_bad_input():
    code, out, _ = run_cli("validate", "--set", "held-out", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["set"] == "held-out" and set(doc["groups"]) == {"nemo2407", "mbridge", "dgxc", "mtnlg", "llmfoundry"}
    code, out, err = run_cli("validate", "--set", "hidden")
    assert code == 2 and "set" in err and "Traceback" not in err + out
    code, out, err = run_cli("validate", "--source", "mtnlg")  # a held-out source, visible set
    assert code == 2 and "--set all" in err
    code, out, _ = run_cli("validate", "--set", "all", "--source", "mtnlg,bloom", "--json")
    assert code == 0 and set(json.loads(out)["groups"]) == {"mtnlg", "bloom"}
