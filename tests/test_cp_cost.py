"""Ring attention's per-step work: extra kernels and the merges of partial results."""

from __future__ import annotations

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.calibration import calibration_for
from meshplan.cost.compute import layer_op_times, memory_time, ring_attention_merge_times

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
    one = layer_op_times(model, 1, 8192, 1, 1, False, "flash", "causal", H100, CAL, "bf16", 2)
    two = layer_op_times(model, 2, 8192, 1, 2, False, "flash", "causal", H100, CAL, "bf16", 2)
    fwd, bwd = ring_attention_merge_times(8192, 32, 8, 128, 128, 2, 2, H100, CAL)
    # attention time is core/η∞ · (L + L₀)/L, so the shorter kernels cost core/η∞ · (L₀/4096 − L₀/8192)
    core = 4.0 * 32 * 128 * 8192 * 8192 * 0.5 / H100.peak("bf16")  # seconds at 100 % of peak
    slow_f = core / CAL.attention_fwd_efficiency * CAL.attention_fwd_l0 / 8192
    slow_b = 2.5 * core / CAL.attention_bwd_efficiency * CAL.attention_bwd_l0 / 8192
    assert two.fwd_gemm == one.fwd_gemm and two.fwd_memory == one.fwd_memory
    assert two.fwd_attention - one.fwd_attention == pytest.approx(fwd + slow_f, rel=1e-9)
    assert two.bwd_attention - one.bwd_attention == pytest.approx(bwd + slow_b, rel=1e-9)
    assert two.fwd > one.fwd and two.bwd > one.bwd
