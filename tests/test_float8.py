"""torchao's Float8 scaling passes (meshplan.cost.float8) against Transformer Engine's model and
inside a layer's op times."""

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.calibration import calibration_for
from meshplan.cost.compute import dense_gemm_shapes, fp8_cast_bytes, layer_op_times, memory_time, repeat_kv_bytes
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
    te_f, te_b = fp8_cast_bytes(gemms, 2)
    ao = torchao_float8_passes(gemms, 2)
    assert ao.fwd_bytes == te_f
    assert ao.bwd_bytes - te_b == 2 * sum(m * n for m, n, _ in gemms)
    # the layer: m·n summed over QKV, output projection, gate|up, down = 16,384 · 43,008
    assert sum(m * n for m, n, _ in gemms) == 16384 * (6144 + 4096 + 28672 + 4096) == 704_643_072
    assert ao.fwd_bytes + ao.bwd_bytes == 9_512_681_472


def _ops(kernels: str, dtype: str = "fp8"):
    return layer_op_times(LLAMA8B, 2, 8192, 1, 1, False, "flash", "causal", H100, CAL, dtype, 2, kernels)


def test_compiled_stack_charges_torchaos_passes_and_fused_keeps_its_own():
    gemms = dense_gemm_shapes(LLAMA8B, TOKENS, 1)
    te_f, te_b = fp8_cast_bytes(gemms, 2)
    ao = torchao_float8_passes(gemms, 2)
    k = CAL.kernel_overhead
    fused, compiled = _ops("fused"), _ops("compiled")
    # same GEMMs and attention; the element-wise work of both stacks is the same before the casts
    assert (fused.fwd_gemm, fused.bwd_gemm, fused.fwd_attention) == (compiled.fwd_gemm, compiled.bwd_gemm, compiled.fwd_attention)
    te = lambda nbytes: memory_time(nbytes, H100, CAL) + (len(gemms) - 1) * k  # noqa: E731
    exp_f = memory_time(ao.fwd_bytes, H100, CAL) + (ao.fwd_kernels - 1) * k - te(te_f)
    exp_b = memory_time(ao.bwd_bytes, H100, CAL) + (ao.bwd_kernels - 1) * k - te(te_b)
    rep = _repeat_kv_time()  # torch's GQA K/V copy, also on the compiled stack only
    assert compiled.fwd_memory - fused.fwd_memory == pytest.approx(exp_f + rep, rel=1e-12)
    assert compiled.bwd_memory - fused.bwd_memory == pytest.approx(exp_b + rep, rel=1e-12)
    # op-level checkpointing re-casts every input and weight on the torchao stack only
    rec = memory_time(ao.recompute_bytes, H100, CAL) + (ao.recompute_kernels - 1) * k
    assert compiled.fwd_op_recompute - fused.fwd_op_recompute == pytest.approx(rec + rep, rel=1e-12)
    # 2.0 GB moved again per layer: about 0.75 ms at 80 % of 3.35 TB/s
    assert ao.recompute_bytes == 3 * sum(m * k_ + k_ * n for m, n, k_ in gemms) == 1_962_934_272
    assert 0.00073 < rec < 0.00077


def _repeat_kv_time() -> float:
    return memory_time(repeat_kv_bytes(TOKENS, 32, 8, 128, 2), H100, CAL) + CAL.kernel_overhead


def test_repeat_kv_of_llama3_8b_by_hand():
    """32 query and 8 K/V heads of 128: K and V each read 8·128 and write 32·128 elements per
    token, 2 bytes each: 2 · 16,384 · 128 · 40 · 2 bytes."""
    assert repeat_kv_bytes(TOKENS, 32, 8, 128, 2) == 2 * 16384 * 128 * 40 * 2 == 335_544_320


def test_bf16_differs_between_stacks_by_the_repeat_kv_copy_only():
    """Without FP8 the compiled and fused stacks share their fused element-wise chains; torch's
    SDPA adds the GQA K/V copy forward and backward (and in op-level recompute), nothing else."""
    compiled, fused = _ops("compiled", "bf16"), _ops("fused", "bf16")
    rep = _repeat_kv_time()
    assert compiled.fwd_memory - fused.fwd_memory == pytest.approx(rep, rel=1e-12)
    assert compiled.bwd_memory - fused.bwd_memory == pytest.approx(rep, rel=1e-12)
    assert compiled.fwd_op_recompute - fused.fwd_op_recompute == pytest.approx(rep, rel=1e-12)
    assert (compiled.fwd_gemm, compiled.bwd_gemm, compiled.fwd_attention, compiled.bwd_attention) == (
        fused.fwd_gemm, fused.bwd_gemm, fused.fwd_attention, fused.bwd_attention)


def test_no_copy_without_grouped_query_attention():
    mha = load_model("llama2-7b")  # 32 heads, 32 K/V heads
    args = (mha, 1, 4096, 1, 1, False, "flash", "causal", H100, CAL, "bf16", 2)
    assert layer_op_times(*args, "compiled") == layer_op_times(*args, "fused")
