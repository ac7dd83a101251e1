"""torchao's Float8 scaling passes (meshplan.cost.float8) against Transformer Engine's model and
inside a layer's op times."""

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.calibration import calibration_for
from meshplan.cost.compute import (
    MLP_GEMM_NAMES,
    dense_gemm_shapes,
    fp8_cast_bytes,
    layer_op_times,
    moe_mlp_gemms,
    projection_gemms,
    repeat_kv_bytes,
)
from meshplan.cost.kernel_time import memory_time
from meshplan.estimate import estimate
from meshplan.specs import ClusterSpec, TrainingPlan
from meshplan.specs.plan import PrecisionRecipe
from meshplan.cost.float8 import torchao_float8_passes

H100 = load_gpu("h100-sxm-80gb")
CAL = calibration_for(H100)
LLAMA8B = load_model("llama3-8b")
TOKENS = 2 * 8192  # torchtitan's 8B rows: local batch 2 of 8,192 tokens


def test_qkv_projection_of_llama3_8b_by_hand():
    """Fused wq|wk|wv of Llama 3 8B on 16,384 tokens: m = 16,384, n = 4,096 + 2·1,024 = 6,144,
    k = 4,096. Forward: input 67,108,864 and weight 25,165,824 elements at 2e + 1 = 5 bytes
    (amax read 2, cast read 2 write 1); backward: the output gradient's 100,663,296 elements at
    7 bytes (cast and its column-major copy, read 1 write 1) and the copies of input and weight
    at 2; op-level AC re-casts input and weight at e + 1 = 3."""
    m, n, k = 16384, 6144, 4096
    p = torchao_float8_passes([(m, n, k)], 2)
    assert p.fwd_bytes == 5 * (67_108_864 + 25_165_824) == 461_373_440
    assert p.bwd_bytes == 7 * 100_663_296 + 2 * 92_274_688 == 889_192_448
    assert p.recompute_bytes == 3 * 92_274_688 == 276_824_064
    # kernels: 3 per cast (amax in two stages, cast), 1 per copy
    assert (p.fwd_kernels, p.bwd_kernels, p.recompute_kernels) == (6, 6, 2)


def test_torchao_adds_the_gradients_column_major_copy_to_transformer_engines_count():
    """Over forward and backward, torchao moves exactly 2·m·n bytes more than the fused stack's
    model: the output gradient's FP8 copy (read 1, write 1), for any GEMM list."""
    gemms = dense_gemm_shapes(LLAMA8B, TOKENS, 1)
    te_f, te_b, w_f, w_b = fp8_cast_bytes([(*g, 1) for g in gemms], 2)
    ao = torchao_float8_passes(gemms, 2)
    assert ao.fwd_bytes == te_f + w_f
    assert ao.bwd_bytes - (te_b + w_b) == 2 * sum(m * n for m, n, _ in gemms)
    # the layer: m·n summed over QKV, output projection, gate|up, down = 16,384 · 43,008
    assert sum(m * n for m, n, _ in gemms) == 16384 * (6144 + 4096 + 28672 + 4096) == 704_643_072
    assert ao.fwd_bytes + ao.bwd_bytes == 9_512_681_472


def _ops(kernels: str, dtype: str = "fp8"):
    """FlashAttention-2 on every stack: the stacks' attention kernel is the plan's choice
    (tests/test_attention_kernel.py), not what these tests compare."""
    return layer_op_times(LLAMA8B, 2, 8192, 1, 1, False, "flash", "causal", H100, CAL, dtype, 2, kernels, attention_kernel="flash2")


def _rope_extra(elems: float = TOKENS * 40 * 128) -> tuple[float, float]:
    """What torch's RoPE adds over the fused kernel's (compute.rope_bytes), forward and backward,
    for ``elems`` rotated elements of q and k (Llama 3 8B: 16,384 tokens × 40 heads of 128): a
    cast, the complex multiply and the cast back, 2e + 16 bytes each way against 2e forward (whose
    backward meshplan takes at 2e, not twice); 16 bytes more both ways, and three kernels more a
    forward (two casts and two complex multiplies where the fused stack counts one kernel)."""
    more = 16 * elems / (H100.hbm_bandwidth * CAL.hbm_efficiency)
    k = CAL.kernel_overhead
    return more + 3 * k, more + 6 * k


def _grad_sum_time() -> float:
    """The compiled stack's sum of the separate projections' input gradients at TP 1
    (compute.input_gradient_sum_bytes): 2·(2 + 1)·n·h·e bytes read inside the norms' backward
    reductions, no kernel of its own."""
    return 2 * 3 * TOKENS * 4096 * 2 / (H100.hbm_bandwidth * CAL.hbm_efficiency)


def test_compiled_stack_charges_torchaos_passes_and_fused_keeps_its_own():
    gemms = dense_gemm_shapes(LLAMA8B, TOKENS, 1)
    # the fused stack (Megatron-Core) casts the weights once per step, not in a micro-batch's time
    te_f, te_b, w_f, w_b = fp8_cast_bytes([(*g, 1) for g in gemms], 2)
    # compiled, AOTAutograd's CSE casts the input wq, wk, wv (w1, w3) share once: the fused shapes
    ao = torchao_float8_passes(gemms, 2)
    k = CAL.kernel_overhead
    fused, compiled = _ops("fused"), _ops("compiled")
    # same attention; the GEMMs differ (torch's separate projections); the element-wise work of
    # both stacks is the same before the casts
    assert (fused.fwd_attention, fused.bwd_attention) == (compiled.fwd_attention, compiled.bwd_attention)
    te = lambda nbytes: memory_time(nbytes, H100, CAL) + (len(gemms) - 1) * k  # noqa: E731
    exp_f = memory_time(ao.fwd_bytes, H100, CAL) + (ao.fwd_kernels - 1) * k - te(te_f)
    exp_b = memory_time(ao.bwd_bytes, H100, CAL) + (ao.bwd_kernels - 1) * k - te(te_b)
    rep = _repeat_kv_time()  # torch's GQA K/V copy, also on the compiled stack only
    rope_f, rope_b = _rope_extra()  # torch's RoPE, on the compiled stack too
    assert fused.weight_cast == te(w_f + w_b) and compiled.weight_cast == 0.0
    assert compiled.fwd_memory - fused.fwd_memory == pytest.approx(exp_f + rep + rope_f, rel=1e-12)
    assert compiled.bwd_memory - fused.bwd_memory == pytest.approx(exp_b + rep + _grad_sum_time() + rope_b, rel=1e-12)
    # op-level checkpointing re-casts every input and weight on the torchao stack only
    rec = memory_time(ao.recompute_bytes, H100, CAL) + (ao.recompute_kernels - 1) * k
    assert compiled.fwd_op_recompute - fused.fwd_op_recompute == pytest.approx(rec + rep + rope_f, rel=1e-12)
    # 2.0 GB moved again per layer: about 0.75 ms at 80 % of 3.35 TB/s
    assert ao.recompute_bytes == 3 * sum(m * k_ + k_ * n for m, n, k_ in gemms) == 1_962_934_272
    assert 0.00073 < rec < 0.00077


def test_eager_fp8_casts_the_shared_input_once_per_projection():
    """Eager, nothing de-duplicates the casts: each of wq, wk, wv (w1, w3) casts the n·h input
    itself, 2 + 1 more input casts per layer than compiled (at 2e + 1 = 5 bytes forward, the
    column-major copy 2 backward, the op-level recompute e + 1 = 3)."""
    compiled, eager = _ops("compiled"), _ops("eager")
    more = 3 * TOKENS * 4096  # elements of the input cast again
    k = CAL.kernel_overhead
    separate = [(TOKENS, n, 4096) for n in (4096, 1024, 1024)] + [(TOKENS, 4096, 4096)] + \
        [(TOKENS, 14336, 4096)] * 2 + [(TOKENS, 4096, 14336)]
    ao_e, ao_c = torchao_float8_passes(separate, 2), torchao_float8_passes(dense_gemm_shapes(LLAMA8B, TOKENS, 1), 2)
    assert ao_e.fwd_bytes - ao_c.fwd_bytes == 5 * more
    assert ao_e.bwd_bytes - ao_c.bwd_bytes == 2 * more
    assert ao_e.recompute_bytes - ao_c.recompute_bytes == 3 * more
    rec = lambda p: memory_time(p.recompute_bytes, H100, CAL) + (p.recompute_kernels - 1) * k  # noqa: E731
    cast = lambda p: memory_time(p.fwd_bytes, H100, CAL) + (p.fwd_kernels - 1) * k  # noqa: E731
    # op-level recompute = the forward's element-wise work without its casts + every second GEMM
    # (the same on both) + the re-casts
    eager_elementwise, compiled_elementwise = eager.fwd_memory - cast(ao_e), compiled.fwd_memory - cast(ao_c)
    assert eager.fwd_op_recompute - compiled.fwd_op_recompute == pytest.approx(
        eager_elementwise - compiled_elementwise + rec(ao_e) - rec(ao_c), rel=1e-9)
    assert eager.fwd_gemm == compiled.fwd_gemm


def _repeat_kv_time() -> float:
    return memory_time(repeat_kv_bytes(TOKENS, 32, 8, 128, 2), H100, CAL) + CAL.kernel_overhead


def test_repeat_kv_of_llama3_8b_by_hand():
    """32 query and 8 K/V heads of 128: K and V each read 8·128 and write 32·128 elements per
    token, 2 bytes each: 2 · 16,384 · 128 · 40 · 2 bytes."""
    assert repeat_kv_bytes(TOKENS, 32, 8, 128, 2) == 2 * 16384 * 128 * 40 * 2 == 335_544_320


def test_bf16_differs_between_stacks_by_torchs_rope_the_repeat_kv_copy_and_the_separate_projections():
    """Without FP8 the compiled and fused stacks share their fused norms and SwiGLU; torch's
    RoPE runs its complex multiply outside Inductor's kernels, torch's SDPA adds the GQA K/V copy
    forward and backward (and in op-level recompute), and torch's separate q, k, v and gate, up
    GEMMs their own times and the sum of their input gradients."""
    compiled, fused = _ops("compiled", "bf16"), _ops("fused", "bf16")
    rep = _repeat_kv_time()
    rope_f, rope_b = _rope_extra()
    assert compiled.fwd_memory - fused.fwd_memory == pytest.approx(rep + rope_f, rel=1e-12)
    assert compiled.bwd_memory - fused.bwd_memory == pytest.approx(rep + rope_b + _grad_sum_time(), rel=1e-12)
    assert compiled.fwd_op_recompute - fused.fwd_op_recompute == pytest.approx(rep + rope_f, rel=1e-12)
    assert (compiled.fwd_attention, compiled.bwd_attention) == (fused.fwd_attention, fused.bwd_attention)
    assert compiled.fwd_gemm > fused.fwd_gemm and compiled.bwd_gemm > fused.bwd_gemm


def test_no_copy_without_grouped_query_attention():
    mha = load_model("llama2-7b")  # 32 heads, 32 K/V heads
    args = (mha, 1, 4096, 1, 1, False, "flash", "causal", H100, CAL, "bf16", 2)
    compiled, fused = (layer_op_times(*args, k, attention_kernel="flash2") for k in ("compiled", "fused"))
    rope_f, rope_b = _rope_extra(4096 * 64 * 128)  # 4,096 tokens, 32 + 32 heads of 128
    assert compiled.fwd_memory - fused.fwd_memory == pytest.approx(rope_f, rel=1e-12)
    assert compiled.fwd_op_recompute - fused.fwd_op_recompute == pytest.approx(rope_f, rel=1e-12)
    grad_sum = 2 * 3 * 4096 * 4096 * 2 / (H100.hbm_bandwidth * CAL.hbm_efficiency)
    assert compiled.bwd_memory - fused.bwd_memory == pytest.approx(grad_sum + rope_b, rel=1e-12)


def test_the_lm_head_stays_16_bit_under_fp8():
    """torchtitan leaves the output projection out of Float8Linear (``module_filter_fn=lambda mod,
    fqn: fqn != "output"``) and Megatron-Core's output layer is no Transformer Engine module: the
    head's GEMMs run at the 16-bit peak under an FP8 recipe."""
    from meshplan.cost.compute import head_op_times

    for loss in ("fused", "compiled", "eager"):
        args = (LLAMA8B, 2, 8192, 1, 1, H100, CAL)
        assert head_op_times(*args, "fp8", 2, loss) == head_op_times(*args, "bf16", 2, loss)
    # 2·n·V·h FLOPs a GEMM: 17.2 TFLOP over 16,384 tokens and the 128,256-entry vocabulary
    assert 2 * TOKENS * 128256 * 4096 == 17_214_228_922_368


def test_fp8_gemms_read_one_byte_operands():
    """The memory floor of an FP8 GEMM: FP8 operands at 1 byte an element, the 16-bit output at 2.
    Llama 3 70B's K projection on TP 8 (one K/V head of 128) over 131,072 tokens is memory-bound:
    it reads the 131,072 × 8,192 input to write 128 columns."""
    from meshplan.cost.calibration import gemm_calibration
    from meshplan.cost.compute import projection_gemms
    from meshplan.cost.kernel_time import gemm_bounds, gemm_operand_bytes, gemm_time

    assert (gemm_operand_bytes("fp8", 2), gemm_operand_bytes("bf16", 2), gemm_operand_bytes("fp32", 4)) == (1, 2, 4)
    m, n, k = 131072, 128, 8192
    w = H100.hbm_bandwidth * CAL.hbm_efficiency
    t_flop, t_mem = gemm_bounds(m, n, k, H100, CAL, H100.peak("fp8"), 1, 2)
    assert t_mem == pytest.approx(((m * k + k * n) * 1 + m * n * 2) / w, rel=1e-15)
    assert t_mem > t_flop
    assert gemm_bounds(m, n, k, H100, CAL, H100.peak("fp8"), 2)[1] == pytest.approx((m * k + k * n + m * n) * 2 / w, rel=1e-15)
    # the layer model charges every FP8 projection so, forward, input and weight gradient, at FP8's
    # own sustained η_max (0.62 on Hopper, where bf16 sustains 0.70)
    model = load_model("llama3-70b")
    ops = layer_op_times(model, 16, 8192, 8, 1, True, "flash", "causal", H100, CAL, "fp8", 2, "compiled")
    peak = H100.peak("fp8")
    cal8 = gemm_calibration(CAL, "fp8")
    assert (cal8.gemm_efficiency, CAL.gemm_efficiency) == (0.62, 0.70)
    fwd = sum(float(gemm_time(a, b, c, H100, cal8, peak, 1, 2)) for _, (a, b, c) in projection_gemms(model, 131072, 8, "compiled"))
    assert ops.fwd_gemm == pytest.approx(fwd, rel=1e-12)


def test_transformer_engines_cast_bytes_by_hand():
    """Llama 3 8B's gate|up GEMM on 16,384 tokens, m = 16,384, n = 28,672, k = 4,096, bf16
    operands (e = 2): the input's 67,108,864 elements at 2e + 1 = 5 bytes forward and its FP8
    transpose at 2 backward, the output gradient's 469,762,048 at 5; the weight's 117,440,512 at 5
    forward (cast) and 2 backward (transpose). Eight experts of one GEMM each count eight times."""
    m, n, k = 16384, 28672, 4096
    act_f, act_b, w_f, w_b = fp8_cast_bytes([(m, n, k, 1)], 2)
    assert (act_f, act_b) == (5 * 67_108_864, 5 * 469_762_048 + 2 * 67_108_864) == (335_544_320, 2_483_027_968)
    assert (w_f, w_b) == (5 * 117_440_512, 2 * 117_440_512) == (587_202_560, 234_881_024)
    assert fp8_cast_bytes([(m, n, k, 8)], 2) == (8 * act_f, 8 * act_b, 8 * w_f, 8 * w_b)


def test_megatron_core_casts_the_weights_once_a_step_and_composer_every_micro_batch():
    """Transformer Engine's linears on the fused stack (Megatron-Core passes is_first_microbatch)
    cast the weights on a step's first micro-batch only: the layer's weight_cast, per step, out of
    the micro-batch's forward and backward. Called without the flag (Composer, the eager stack
    with fp8_linears transformer-engine) they cast every micro-batch: no per-step part, input and
    weight casts inside each micro-batch's forward."""
    k = CAL.kernel_overhead
    gemms = [(*g, 1) for g in dense_gemm_shapes(LLAMA8B, TOKENS, 1)]
    act_f, act_b, w_f, w_b = fp8_cast_bytes(gemms, 2)
    fused, fused_bf16 = _ops("fused"), _ops("fused", "bf16")
    assert fused.weight_cast == memory_time(w_f + w_b, H100, CAL) + (len(gemms) - 1) * k
    assert fused.fwd_memory - fused_bf16.fwd_memory == pytest.approx(memory_time(act_f, H100, CAL) + (len(gemms) - 1) * k, rel=1e-12)
    assert fused.bwd_memory - fused_bf16.bwd_memory == pytest.approx(memory_time(act_b, H100, CAL) + (len(gemms) - 1) * k, rel=1e-12)
    # 1.53 GB of weight casts and transposes a layer: 0.57 ms at 80 % of 3.35 TB/s and 4 launches
    assert w_f + w_b == 7 * sum(kk * n for _, n, kk, _ in gemms) == 7 * 218_103_808 == 1_526_726_656
    assert 0.00058 < fused.weight_cast < 0.00059
    te_eager, eager_bf16 = (layer_op_times(LLAMA8B, 2, 8192, 1, 1, False, "flash", "causal", H100, CAL, dtype, 2, "eager",
                                           fp8_linears="transformer-engine", attention_kernel="flash2") for dtype in ("fp8", "bf16"))
    separate = [(*g, 1) for _, g in projection_gemms(LLAMA8B, TOKENS, 1, "eager")]
    e_f, e_b, ew_f, ew_b = fp8_cast_bytes(separate, 2)
    assert te_eager.weight_cast == 0.0
    assert te_eager.fwd_memory - eager_bf16.fwd_memory == pytest.approx(memory_time(e_f + ew_f, H100, CAL) + (len(separate) - 1) * k, rel=1e-12)
    assert te_eager.bwd_memory - eager_bf16.bwd_memory == pytest.approx(memory_time(e_b + ew_b, H100, CAL) + (len(separate) - 1) * k, rel=1e-12)


def test_the_step_pays_every_layers_weight_casts_once():
    """Megatron-Core's FP8 step: the first micro-batch's forward crosses all 32 layers (two
    pipeline stages here) with their weights cast, once: L · weight_cast on top of the schedule,
    a part of its own in the breakdown, which still adds up to the step. BF16 has none."""
    cluster = ClusterSpec.of(H100, 8)
    plan = TrainingPlan(tp=2, pp=2, dp=2, micro_batch=1, global_batch=32, seq_len=8192, sequence_parallel=True,
                        precision=PrecisionRecipe(precision="fp8"))
    est = estimate(LLAMA8B, cluster, plan)
    ops = layer_op_times(LLAMA8B, 1, 8192, 2, 1, True, "flash", "causal", H100, CAL, "fp8", 2, "fused")
    assert est.time.fp8_weight_cast_s == 32 * ops.weight_cast > 0
    parts = est.time.breakdown()
    assert parts["fp8_weight_cast"] == est.time.fp8_weight_cast_s
    assert sum(parts.values()) == pytest.approx(est.time.step_s, rel=1e-12)
    bf16 = estimate(LLAMA8B, cluster, plan.model_copy(update={"precision": PrecisionRecipe()}))
    assert bf16.time.fp8_weight_cast_s is None and "fp8_weight_cast" not in bf16.time.breakdown()


def test_moe_layers_cast_their_experts_weights_and_tokens():
    """An MoE layer's FP8 GEMMs are its attention projections and its experts (the router stays
    16-bit): the E/ep local experts' inputs and output gradients every micro-batch, their weights
    once a step; the step pays dense and MoE layers' weight casts by their counts."""
    mixtral = load_model("mixtral-8x7b")
    t, ep, tokens = 2, 8, 4096
    moe_ops = layer_op_times(mixtral, 1, tokens, t, 1, True, "flash", "causal", H100, CAL, "fp8", 2, "fused", moe=True, ep=ep)
    attention = [(*g, 1) for nm, g in projection_gemms(mixtral, tokens, t) if nm not in MLP_GEMM_NAMES]
    experts = moe_mlp_gemms(mixtral, tokens, t, ep)[1:]  # the router excluded
    # one local expert (8/ep) receiving n·k = 8,192 tokens: gate|up 2·14,336/t wide, down from 14,336/t
    assert experts == [(8192, 14336, 4096, 1), (8192, 4096, 7168, 1)]
    act_f, act_b, w_f, w_b = fp8_cast_bytes(attention + experts, 2)
    k = CAL.kernel_overhead
    assert moe_ops.weight_cast == memory_time(w_f + w_b, H100, CAL) + (len(attention) + 1) * k
    moe_bf16 = layer_op_times(mixtral, 1, tokens, t, 1, True, "flash", "causal", H100, CAL, "bf16", 2, "fused", moe=True, ep=ep)
    assert moe_ops.fwd_memory - moe_bf16.fwd_memory == pytest.approx(memory_time(act_f, H100, CAL) + (len(attention) + 1) * k, rel=1e-12)
    assert moe_ops.bwd_memory - moe_bf16.bwd_memory == pytest.approx(memory_time(act_b, H100, CAL) + (len(attention) + 1) * k, rel=1e-12)
    plan = TrainingPlan(tp=t, pp=1, dp=8, ep=ep, micro_batch=1, global_batch=64, seq_len=tokens, precision=PrecisionRecipe(precision="fp8"))
    est = estimate(mixtral, ClusterSpec.of(H100, 16), plan)
    assert est.time.fp8_weight_cast_s == 32 * moe_ops.weight_cast
