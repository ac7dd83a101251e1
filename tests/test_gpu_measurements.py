"""meshplan's compute model against the GPU measurements recorded in the repository.

``benchmarks/results/h200-2026-11-28/`` holds what ``benchmarks/gpu_measure.sh``,
``gpu_sustained.py``, ``gpu_profile.py`` and ``gpu_idle_power.py`` measured on one NVIDIA H200
SXM (700 W, torch 2.11, CUDA 13.0; docs/gpu_measurements.md). These tests need no GPU: they read
the recorded figures and set the current model's predictions for the same shapes on the catalog
H200 beside them, so that a change to the compute model or the Hopper calibration that drifts
away from measured execution fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.attention import causal_attention_flops, flash_attention_efficiency
from meshplan.cost.calibration import STATIC_POWER_FRACTION, calibration_for
from meshplan.cost.compute import layer_op_times
from meshplan.cost.kernel_time import gemm_time

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h200-2026-11-28"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


@pytest.fixture(scope="module")
def h200():
    gpu = load_gpu("h200-sxm-141gb")
    return gpu, calibration_for(gpu)


def test_recorded_results_are_from_one_h200():
    for name in ("sweep.json", "sustained.json", "profile.json", "idle_power.json", "sustained_sac.json",
                 "sustained_fp8.json", "step_parts.json"):
        assert _load(name)["device"] == "NVIDIA H200"
    for name in ("k8b.json", "k8b32k.json", "k70b.json", "k8bfp8.json", "k405b.json"):
        setup = _load(name)["setup"]
        assert (setup["device_name"], setup["gpu"], setup["device"]) == ("NVIDIA H200", "h200-sxm-141gb", "cuda")


@pytest.mark.parametrize("case, micro_batch, seq_len, kernels", [
    ("block eager 2x8192", 2, 8192, "eager"),
    ("block compiled 2x8192", 2, 8192, "compiled"),
    ("block compiled 1x32768", 1, 32768, "compiled"),
])
def test_layer_model_within_6_percent_of_torchtitans_block_in_steady_state(h200, case, micro_batch, seq_len, kernels):
    """One Llama 3 8B layer, forward + backward, back to back at the power cap (the median of the
    last half of 12 s; 688 W at 1665 MHz for the 8K block): the layer model's fwd + bwd for the
    same stack. Recorded: eager +1.5 %, compiled +4.3 % (8K) and +4.0 % (32K), all slower than
    measured."""
    gpu, cal = h200
    measured = _load("sustained.json")["cases"][case]["sustained_s"]
    ops = layer_op_times(load_model("llama3-8b"), micro_batch, seq_len, 1, 1, False, "flash", "causal", gpu, cal,
                         "bf16", 2, kernels=kernels)
    assert ops.fwd + ops.bwd == pytest.approx(measured, rel=0.06)
    # the profiled iterations agree with the sustained loop (the profiler adds no idle gaps)
    profiled = _load("profile.json")["cases"][case.removeprefix("block ")]["wall_us_per_iter"] * 1e-6
    assert profiled == pytest.approx(measured, rel=0.03)


def test_gemm_efficiency_is_what_a_large_gemm_sustains_at_the_power_cap(h200):
    """The 8B gate GEMM (16384 × 14336 × 4096) back to back for 15 s settles at 671 TFLOP/s, 692 W,
    1440-1500 MHz: the time the model gives it implies η_max = 0.704, the calibration's 0.70
    within 3 %. A burst of the same GEMM (``verify kernels``: 7 calls) runs 15 % faster, before the
    clock comes down: the calibration is the sustained figure."""
    gpu, cal = h200
    m, n, k = _load("sweep.json")["sustained"]["shape"]
    sustained = _load("sweep.json")["sustained"]["last_half_median_flops"]
    measured = 2.0 * m * n * k / sustained
    predicted = float(gemm_time(m, n, k, gpu, cal, gpu.peak("bf16")))
    implied = cal.gemm_efficiency * (predicted - cal.kernel_overhead) / (measured - cal.kernel_overhead)
    assert implied == pytest.approx(cal.gemm_efficiency, rel=0.03)
    burst = next(r for r in _load("k8b.json")["rows"] if r["name"] == "gemm gate fwd")["measured"]
    assert measured / burst > 1.10


def test_fp8_gemm_efficiency_is_what_an_fp8_gemm_sustains_at_the_power_cap(h200):
    """The same GEMM as FP8 ``torch._scaled_mm`` (E4M3) back to back for 10 s: 1.631 ms, 1180
    TFLOP/s of 1979 at 1350 MHz and 692 W; the time the model gives it under FP8
    (:func:`~meshplan.cost.calibration.gemm_calibration`) implies η_max = 0.620, the calibration's
    ``gemm_fp8_efficiency`` within 3 %. The bf16 GEMM of the same run sustains 0.695 (0.70)."""
    from meshplan.cost.calibration import gemm_calibration

    gpu, cal = h200
    cases = _load("sustained_fp8.json")["cases"]
    m, n, k = 16384, 14336, 4096
    for name, dtype, operand_bytes in (("gemm fp8 16384x14336x4096", "fp8", 1), ("gemm 16384x14336x4096", "bf16", 2)):
        cal_g = gemm_calibration(cal, dtype)
        measured = cases[name]["sustained_s"]
        predicted = float(gemm_time(m, n, k, gpu, cal_g, gpu.peak(dtype), operand_bytes, 2))
        implied = cal_g.gemm_efficiency * (predicted - cal.kernel_overhead) / (measured - cal.kernel_overhead)
        assert implied == pytest.approx(cal_g.gemm_efficiency, rel=0.03), name
    assert gemm_calibration(cal, "fp8").gemm_efficiency == cal.gemm_fp8_efficiency < cal.gemm_efficiency
    assert gemm_calibration(cal, "bf16") is cal


def test_hbm_efficiency_is_not_above_a_plain_copy(h200):
    """A 1 GiB device-to-device copy moves 4.13 TB/s (0.86 of 4.8): the model's η_hbm for
    element-wise kernels (0.80) stays at or under it."""
    gpu, cal = h200
    copy = _load("sweep.json")["ceilings"]["copy_bytes_per_s"] / gpu.hbm_bandwidth
    assert 0.80 < copy < 0.95
    assert cal.hbm_efficiency <= copy


@pytest.mark.parametrize("direction, min_len", [("fwd", 2048), ("bwd", 4096)])
def test_flash_attention_length_curve_within_10_percent_from_2k_or_4k_keys(h200, direction, min_len):
    """SDPA's FlashAttention-2 on the H200 (unthrottled at 1980 MHz: attention alone stays under
    the cap), causal, head dim 128: the model's η(L)·P within 10 % from 2K keys forward and 4K
    backward. Below, the backward is slower than the model (1K: 178 TFLOP/s against 234; 2K: 228
    against 262), which the published FA2 curve the constants rest on does not show."""
    gpu, cal = h200
    eta, l0 = ((cal.attention_fwd_efficiency, cal.attention_fwd_l0) if direction == "fwd"
               else (cal.attention_bwd_efficiency, cal.attention_bwd_l0))
    rows = [r for r in _load("sweep.json")["attention"]
            if r.get("backend") == "flash" and r["causal"] and "error" not in r and r["L"] >= min_len]
    assert len(rows) >= 6
    for r in rows:
        flops = causal_attention_flops(r["batch"] * r["heads"], r["d"], r["L"], r["L"]) * (2.5 if direction == "bwd" else 1.0)
        measured = flops / r[f"{direction}_s"]
        assert measured == pytest.approx(r[f"{direction}_flops"], rel=1e-9)  # the script's own figure
        predicted = gpu.peak("bf16") * flash_attention_efficiency(r["L"], eta, l0)
        assert predicted == pytest.approx(measured, rel=0.10), r["L"]


def test_static_power_is_the_measured_idle_board_power():
    idle = _load("idle_power.json")
    assert idle["nvml"]["power_limit_w"] == 700.0
    assert idle["idle_power_w_median"] == pytest.approx(STATIC_POWER_FRACTION * 700, abs=0.5)


def test_layer_with_op_level_checkpointing_within_6_percent(h200):
    """torchtitan's op-level selective checkpointing (:func:`meshplan.verify.llama_block.op_sac`)
    on the eager 8B block, sustained: 60.0 ms a forward + backward, 7.8 ms over the block without
    it. The model's fwd + bwd + op-level recompute: 59.7 ms (−0.5 %)."""
    gpu, cal = h200
    measured = _load("sustained_sac.json")["cases"]["block eager op-sac 2x8192"]["sustained_s"]
    plain = _load("sustained.json")["cases"]["block eager 2x8192"]["sustained_s"]
    ops = layer_op_times(load_model("llama3-8b"), 2, 8192, 1, 1, False, "flash", "causal", gpu, cal, "bf16", 2, kernels="eager")
    assert ops.fwd + ops.bwd + ops.fwd_op_recompute == pytest.approx(measured, rel=0.06)
    assert ops.fwd_op_recompute == pytest.approx(measured - plain, rel=0.25)


@pytest.mark.parametrize("part, loss_kernels", [("head eager loss", "eager"), ("head compiled loss", "compiled")])
def test_head_and_loss_within_6_percent(h200, part, loss_kernels):
    """Final norm, LM head (16384 × 128256 × 4096) and cross-entropy, forward + backward: measured
    102.8 ms over fp32 logits and 84.1 ms compiled; the model 102.7 (−0.1 %) and 80.8 (−3.9 %).
    With the GEMMs at the model's times, the eager loss's memory-bound passes take 26.6 ms:
    48.6 bytes a logit at η_hbm, against the (e + 20) + (24 + e) = 48 the model counts (it
    counted 32 before these measurements, 94.0 ms, −8.6 %)."""
    from meshplan.cost.compute import head_op_times

    gpu, cal = h200
    measured = _load("step_parts.json")["parts"][part]
    ops = head_op_times(load_model("llama3-8b"), 2, 8192, 1, 1, gpu, cal, "bf16", 2, loss_kernels)
    total = measured["fwd_s"] + measured["bwd_s"]
    assert ops.fwd + ops.bwd == pytest.approx(total, rel=0.06)


def test_torch_optimizer_step_within_10_percent(h200):
    """``clip_grad_norm_`` + AdamW (foreach) over one rank's FSDP2 shards of the 8B model over 8
    ranks (1.004 B fp32 parameters in 291 tensors): 26.2 ms; the model's 92 bytes a parameter at
    η_hbm: 24.0 ms (−8 %)."""
    from meshplan.accuracy import map_runs
    from meshplan.cost.optimizer_step import optimizer_step_time

    gpu, cal = h200
    measured = _load("step_parts.json")["parts"]["optimizer 1/8"]
    recipe = next(r for r in map_runs() if r.id == "torchtitan_8b_8gpu_fsdp").plan.precision
    predicted = optimizer_step_time(measured["params"], recipe, gpu, cal, "eager")
    assert predicted == pytest.approx(measured["clip_and_step_s"], rel=0.10)


def test_embedding_backward_counts_the_zero_filled_table_and_stays_under_the_measurement(h200):
    """aten's embedding backward zero-fills the whole V × h gradient (128,256 × 4,096 bf16: 1.05 GB)
    before it scatters the micro-batch's rows: 0.49 ms of bytes on the H200, against 1.50 ms
    measured (the index sort's small kernels are not counted); the forward's gather 0.07 against
    0.10."""
    from meshplan.cost.compute import embedding_op_times
    from meshplan.cost.kernel_time import memory_time

    gpu, cal = h200
    n, h, V = 2 * 8192, 4096, 128_256
    ops = embedding_op_times(load_model("llama3-8b"), 2, 8192, 1, 1, gpu, cal, 2)
    assert ops.bwd == ops.bwd_weight == memory_time(V * h * 2 + 2 * n * h * 2 + 8 * n * h, gpu, cal)
    measured = _load("step_parts.json")["parts"]["embedding"]
    assert ops.bwd < measured["bwd_s"] < 4 * ops.bwd
    assert ops.fwd < measured["fwd_s"] < 2 * ops.fwd


def test_figures_draw_from_the_recorded_results(tmp_path):
    """benchmarks/gpu_figures.py writes the two SVGs of docs/gpu_measurements.md: well-formed, with
    a point per measured FA2 and cuDNN row and a bar per block, measured and modelled."""
    import importlib.util
    import xml.dom.minidom

    spec = importlib.util.spec_from_file_location("gpu_figures", RESULTS.parents[1] / "gpu_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    assert figures.main(["--out", str(tmp_path)]) == 0
    attention = (tmp_path / "gpu-attention.svg").read_text()
    split = (tmp_path / "gpu-layer-split.svg").read_text()
    for text in (attention, split):
        xml.dom.minidom.parseString(text)
    causal = [r for r in _load("sweep.json")["attention"] if r.get("causal") and "error" not in r and r["backend"] != "efficient"]
    assert attention.count("<circle") == len(causal) + 2  # a forward point per row, two legend dots
    assert split.count("measured</text>") == split.count("model</text>") == 3
