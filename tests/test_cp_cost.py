"""Ring attention's per-step work: extra kernels and the merges of partial results."""

from __future__ import annotations

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.calibration import calibration_for
from meshplan.cost.compute import layer_op_times
from meshplan.cost.kernel_time import memory_time
from meshplan.cost.ring_attention import eager_ring_attention_times, ring_attention_merge_times, torch_ring_keys

H100 = load_gpu("h100-sxm-80gb")
CAL = calibration_for(H100)


def test_merge_bytes_and_steps():
    # Llama 3 8B, no TP: 32 query heads, 8 K/V heads, d = 128; CP 2 with micro-batch 2 at 8K: n = 8,192
    fwd, bwd = ring_attention_merge_times(8192, 32, 8, 128, 128, 2, 2, H100, CAL)
    k = CAL.kernel_overhead
    w = H100.hbm_bandwidth * CAL.hbm_efficiency
    assert fwd == pytest.approx(k + 10 * 8192 * 32 * 128 / w + k, rel=1e-15)  # 335,544,320 bytes
    assert bwd == pytest.approx(k + 10 * 8192 * (32 * 128 + 8 * 256) / w + k, rel=1e-15)  # 503,316,480 bytes
    fwd8, bwd8 = ring_attention_merge_times(8192, 32, 8, 128, 128, 8, 2, H100, CAL)
    assert fwd8 == pytest.approx(7 * fwd, rel=1e-12) and bwd8 == pytest.approx(7 * bwd, rel=1e-12)
    assert ring_attention_merge_times(8192, 32, 8, 128, 128, 1, 2, H100, CAL) == (0.0, 0.0)
    assert memory_time(0, H100, CAL) == k


def test_cp_is_no_longer_free_at_equal_tokens():
    # CP 2 with micro-batch 2 puts the same 8,192 tokens on a GPU as CP 1 with micro-batch 1 and the
    # same causal attention FLOPs; the ring adds its merges and runs 4,096-key kernels instead of
    # 8,192-key ones, at the lower efficiency η(L) = η∞·L/(L + L₀)
    model = load_model("llama3-8b")
    one = layer_op_times(model, 1, 8192, 1, 1, False, "flash", "causal", H100, CAL, "bf16", 2, attention_kernel="flash2")
    two = layer_op_times(model, 2, 8192, 1, 2, False, "flash", "causal", H100, CAL, "bf16", 2, attention_kernel="flash2")
    fwd, bwd = ring_attention_merge_times(8192, 32, 8, 128, 128, 2, 2, H100, CAL)
    # attention time is core/η∞ · (L + L₀)/L, so the shorter kernels cost core/η∞ · (L₀/4096 − L₀/8192)
    core = 4.0 * 32 * 128 * 8192 * 8192 * 0.5 / H100.peak("bf16")  # seconds at 100 % of peak
    slow_f = core / CAL.attention_fwd_efficiency * CAL.attention_fwd_l0 / 8192
    slow_b = 2.5 * core / CAL.attention_bwd_efficiency * CAL.attention_bwd_l0 / 8192
    assert two.fwd_gemm == one.fwd_gemm and two.fwd_memory == one.fwd_memory
    assert two.fwd_attention - one.fwd_attention == pytest.approx(fwd + slow_f, rel=1e-9)
    assert two.bwd_attention - one.bwd_attention == pytest.approx(bwd + slow_b, rel=1e-9)
    assert two.fwd > one.fwd and two.bwd > one.bwd


def test_torch_ring_key_length():
    # torch's round-robin ring at 256K over 8 ranks: step 0 one causal call over 32,768 keys, seven
    # half-block calls over 16,384 keys on rank 7; one call over 262,144/15 keys costs the same
    assert torch_ring_keys(262144, 8) == 262144 / 15
    assert torch_ring_keys(8192, 1) == 8192
    l0, w = 420.0, 1.0
    calls = [(w / 8, 32768)] + [(w / 8, 16384)] * 7
    assert sum(wi * (1 + l0 / li) for wi, li in calls) == pytest.approx(w * (1 + l0 / torch_ring_keys(262144, 8)), rel=1e-15)


def test_eager_ring_bytes_llama3_8b_cp8():
    # Llama 3.1 8B at 256K over CP 8: n = 32,768 tokens per rank, 32 heads, K/V repeated to 32 heads
    # by torchtitan's repeat_kv, d = 128, bf16. X_o = X_q = 134,217,728; X_kv = 268,435,456
    fwd, bwd = eager_ring_attention_times(32768, 32, 32, 128, 128, 8, 2, H100, CAL)
    k = CAL.kernel_overhead
    w = H100.hbm_bandwidth * CAL.hbm_efficiency
    step_f = 38 * 134_217_728 + 4 * 268_435_456  # merges (36 + e)·X_o + K/V concatenation 2e·X_kv
    assert step_f == 6_174_015_488
    call_f = 12 * 134_217_728 + 4 * 268_435_456  # (8 + 2e)·X_o + 2e·X_kv
    step_b = 25 * 268_435_456 + 10 * 134_217_728  # (20 + 2.5e)·X_kv + (8 + e)·X_q
    assert step_b == 8_053_063_680
    call_b = 20 * 134_217_728 + 32 * 268_435_456  # (16 + 2e)·X_q + (24 + 4e)·X_kv
    assert fwd == pytest.approx(7 * (12 * k + step_f / w) + 6 * k + call_f / w, rel=1e-12)
    assert bwd == pytest.approx(7 * (8 * k + step_b / w) + 11 * k + call_b / w, rel=1e-12)
    # against one fused pass per step (8 + e bytes per element), the eager ring moves 4.6x the
    # forward bytes per later step and 2x the backward's
    assert step_f / (10 * 134_217_728) == 4.6 and step_b / (10 * (134_217_728 + 268_435_456)) == 2.0
    fused_f, fused_b = ring_attention_merge_times(32768, 32, 32, 128, 128, 8, 2, H100, CAL)
    assert fwd > 4.6 * fused_f and bwd > 2.0 * fused_b
    assert eager_ring_attention_times(32768, 32, 32, 128, 128, 1, 2, H100, CAL) == (0.0, 0.0)


def test_torch_stacks_run_torchs_ring():
    # Llama 3.1 8B, 256K over CP 8 (torchtitan's Table 2 row): the torch stacks see 32 K/V heads
    # (repeat_kv) and shorter keys per call (torch_ring_keys); the fused stack keeps its model (all
    # three with FlashAttention-2's rates here: the fused stack's own cuDNN kernel is the plan's
    # attention_kernel, tests/test_attention_kernel.py)
    model = load_model("llama3-8b")
    args = (model, 1, 262144, 1, 8, False, "flash", "causal", H100, CAL, "bf16", 2)
    fused, comp, eager = (layer_op_times(*args, kernels=kk, attention_kernel="flash2") for kk in ("fused", "compiled", "eager"))
    core = 4.0 * 32 * 128 * 32768 * 262144 * 0.5 / H100.peak("bf16")
    k = CAL.kernel_overhead
    for ops, keys, g, merge in (
        (fused, 262144 / 8, 8, ring_attention_merge_times),
        (comp, 262144 / 15, 32, ring_attention_merge_times),
        (eager, 262144 / 15, 32, eager_ring_attention_times),
    ):
        rf, rb = merge(32768, 32, g, 128, 128, 8, 2, H100, CAL)
        eta_f = CAL.attention_fwd_efficiency * keys / (keys + CAL.attention_fwd_l0)
        eta_b = CAL.attention_bwd_efficiency * keys / (keys + CAL.attention_bwd_l0)
        assert ops.fwd_attention == pytest.approx(core / eta_f + k + rf, rel=1e-12)
        assert ops.bwd_attention == pytest.approx(2.5 * core / eta_b + k + rb, rel=1e-12)
    assert fused.fwd_attention < comp.fwd_attention < eager.fwd_attention
    assert fused.bwd_attention < comp.bwd_attention < eager.bwd_attention
    # without CP the three stacks run the same single call
    one = [layer_op_times(model, 1, 32768, 1, 1, False, "flash", "causal", H100, CAL, "bf16", 2, kernels=kk, attention_kernel="flash2")
           for kk in ("fused", "compiled", "eager")]
    assert one[0].fwd_attention == one[1].fwd_attention == one[2].fwd_attention
