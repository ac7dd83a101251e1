"""The attention kernel (``attention_kernel``): FlashAttention-2's rates, or cuDNN's fused attention,
which Transformer Engine runs on Hopper — its rates fitted to the curve recorded on an H200
(``benchmarks/results/h200-2026-11-28/sweep.json``, docs/gpu_measurements.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cli.app import main
from meshplan.cost.attention import (
    attention_kernel_of,
    causal_attention_flops,
    flash_attention_efficiency,
    flash_attention_times,
)
from meshplan.cost.calibration import AMPERE, BLACKWELL, CDNA3, HOPPER, calibration_for
from meshplan.cost.compute import layer_op_times
from meshplan.errors import InputError
from meshplan.estimate import estimate
from meshplan.interop import export, parse_text
from meshplan.interop.common import canonical, to_plan
from meshplan.specs import ClusterSpec, TrainingPlan
from meshplan.specs.stack import Stack, ignored
from meshplan.specs.validate import check_plan

SWEEP = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h200-2026-11-28" / "sweep.json"
H100 = load_gpu("h100-sxm-80gb")


def _cudnn_rows() -> list[dict]:
    rows = [r for r in json.loads(SWEEP.read_text())["attention"] if r.get("backend") == "cudnn" and r["causal"]]
    assert [r["L"] for r in rows] == [1024 * 2**k for k in range(8)]  # 1K to 128K keys
    return rows


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_cudnn_constants_are_the_least_squares_fit_of_the_recorded_curve(direction):
    """1/T = (1 + L₀/L)/T∞ fitted by least squares to the eight recorded causal points gives the
    calibration's η∞ (to 3 decimals of the 16-bit peak) and L₀ (to the key); the fitted curve is
    within 12 % (forward: the 128K point) and 6 % (backward) of every point."""
    rows = _cudnn_rows()
    L = np.array([r["L"] for r in rows], float)
    T = np.array([r[f"{direction}_flops"] for r in rows])
    A = np.vstack([np.ones_like(L), 1 / L]).T
    (c0, c1), *_ = np.linalg.lstsq(A, 1 / T, rcond=None)
    t_inf, l0 = 1 / c0, c1 / c0
    peak = load_gpu("h200-sxm-141gb").peak("bf16")
    eta, l0_cal = HOPPER.attention_cudnn[:2] if direction == "fwd" else HOPPER.attention_cudnn[2:]
    assert round(t_inf / peak, 3) == eta and round(l0) == l0_cal
    predicted = peak * flash_attention_efficiency(L, eta, l0_cal)
    assert np.max(np.abs(predicted / T - 1)) < (0.12 if direction == "fwd" else 0.06)


def test_cudnn_runs_1_6_to_1_9_times_flashattention_2_and_the_model_keeps_the_ratio():
    recorded = json.loads(SWEEP.read_text())["attention"]
    by = {(r["backend"], r["L"]): r for r in recorded if r["causal"] and "error" not in r}
    for L in (2048, 4096, 8192, 16384, 32768, 65536):
        for d in ("fwd", "bwd"):
            ratio = by[("cudnn", L)][f"{d}_flops"] / by[("flash", L)][f"{d}_flops"]
            assert 1.55 < ratio < 1.95, (L, d)
    # the model: one 8K causal call of 32 heads, cuDNN against FA2
    f2 = flash_attention_times(32, 128, 8192, 8192, 8192, H100.peak("bf16"), HOPPER, "flash2")
    cu = flash_attention_times(32, 128, 8192, 8192, 8192, H100.peak("bf16"), HOPPER, "cudnn")
    core = causal_attention_flops(32, 128, 8192, 8192)
    o = HOPPER.kernel_overhead
    assert (f2[0] - o) / (cu[0] - o) == pytest.approx(
        flash_attention_efficiency(8192, 0.626, 332) / flash_attention_efficiency(8192, 0.36, 420), rel=1e-12)
    assert cu[1] - o == pytest.approx(2.5 * core / (H100.peak("bf16") * flash_attention_efficiency(8192, 0.55, 662)), rel=1e-12)


def test_auto_is_cudnn_on_the_fused_stack_where_it_is_measured():
    assert attention_kernel_of("fused", "auto", HOPPER) == "cudnn"
    for kernels in ("compiled", "eager"):  # torch's SDPA: FlashAttention-2 first in its priority
        assert attention_kernel_of(kernels, "auto", HOPPER) == "flash2"
    for cal in (AMPERE, BLACKWELL, CDNA3):  # no cuDNN measurement: the generation's flash rates
        assert cal.attention_cudnn is None and attention_kernel_of("fused", "auto", cal) == "flash2"
    assert attention_kernel_of("eager", "cudnn", HOPPER) == "cudnn" and attention_kernel_of("fused", "flash2", HOPPER) == "flash2"


def test_only_the_attention_core_moves():
    m = load_model("llama3-70b")
    args = (m, 1, 8192, 4, 1, True, "flash", "causal", H100, HOPPER, "fp8", 2, "fused")
    fa2, cudnn, auto = (layer_op_times(*args, attention_kernel=k) for k in ("flash2", "cudnn", "auto"))
    assert auto == cudnn
    assert cudnn.fwd_attention < 0.6 * fa2.fwd_attention and cudnn.bwd_attention < 0.65 * fa2.bwd_attention
    assert (cudnn.fwd_gemm, cudnn.bwd_gemm, cudnn.bwd_weight, cudnn.fwd_memory, cudnn.bwd_memory) == (
        fa2.fwd_gemm, fa2.bwd_gemm, fa2.bwd_weight, fa2.fwd_memory, fa2.bwd_memory)


def test_estimate_memory_is_the_same_and_the_step_shorter():
    m = load_model("llama3-8b")
    cluster = ClusterSpec.of(H100, 8)
    runs = {k: estimate(m, cluster, TrainingPlan.of(dp=8, global_batch=64, seq_len=8192, attention_kernel=k))
            for k in ("flash2", "cudnn")}
    assert runs["cudnn"].peak_bytes == runs["flash2"].peak_bytes
    assert runs["cudnn"].time.step_s < runs["flash2"].time.step_s
    assert runs["cudnn"].to_dict()["plan"]["stack"]["attention_kernel"] == "cudnn"


def test_bad_requests_name_the_field():
    # a materialized attention ignores the kernel, by the stack's rule (meshplan.specs.stack.RULES)
    plan = TrainingPlan.of(global_batch=8, seq_len=2048, attention="materialized", attention_kernel="cudnn")
    assert plan.stack.attention_kernel == "auto"
    assert [f for f, _, _ in ignored(Stack(attention_kernel="cudnn"), plan)] == ["tp_backward_overlap", "attention_kernel"]  # tp 1
    a100 = ClusterSpec.of(load_gpu("a100-sxm-80gb"), 8)
    with pytest.raises(InputError, match="attention_kernel.*Hopper"):
        check_plan(load_model("llama3-8b"), a100, TrainingPlan.of(dp=8, global_batch=64, seq_len=4096, attention_kernel="cudnn"))
    assert calibration_for(a100.gpu).attention_cudnn is None


def test_cli_flag_header_and_bad_gpu(capsys):
    assert main(["estimate", "--set", "attention_kernel=flash2"]) == 0
    assert "flash attention (FlashAttention-2)" in capsys.readouterr().out
    assert main(["estimate"]) == 0  # the fused stack on an H100: cuDNN
    assert "flash attention (cuDNN fused attention)" in capsys.readouterr().out
    assert main(["explain", "--figure", "layer"]) == 0  # the derivation names the kernel and its rates
    assert "cuDNN fused attention: η∞ 0.626 / 0.55, L₀ 332 / 662 keys" in capsys.readouterr().out
    assert main(["explain", "--figure", "layer", "--set", "kernels=compiled"]) == 0
    assert "FlashAttention-2: η∞ 0.36 / 0.3, L₀ 420 / 275 keys" in capsys.readouterr().out
    assert main(["estimate", "--gpu", "a100-sxm-80gb", "--set", "attention_kernel=cudnn"]) == 2
    captured = capsys.readouterr()
    assert "attention_kernel" in captured.err and "Traceback" not in captured.err + captured.out


@pytest.mark.parametrize("kernel, flag", [("flash2", "flash"), ("cudnn", "fused"), ("auto", None)])
def test_megatron_attention_backend_round_trip(kernel, flag):
    m = load_model("llama3-8b")
    plan = TrainingPlan.of(tp=2, dp=4, global_batch=64, seq_len=4096, attention_kernel=kernel)
    text = export("megatron", m, plan).text
    assert (f"--attention-backend {flag}" in text) if flag else ("--attention-backend" not in text)
    back = to_plan(parse_text(text, "megatron").plan)
    assert back.stack.attention_kernel == kernel and canonical(back, m) == canonical(plan, m)


def test_torch_engines_warn_on_cudnn():
    m = load_model("llama3-8b")
    plan = TrainingPlan.of(dp=8, global_batch=64, seq_len=4096, kernels="compiled", attention_kernel="cudnn")
    for engine in ("torchtitan", "deepspeed", "nanotron"):
        out = export(engine, m, plan)
        assert any("attention_kernel" in w for w in out.warnings), engine
    # FlashAttention-2 named on a torch stack is what auto resolves to there: the same plan
    flash = TrainingPlan.of(dp=8, global_batch=64, seq_len=4096, kernels="compiled", attention_kernel="flash2")
    assert canonical(flash, m) == canonical(flash.replace(**{"attention_kernel": "auto"}), m)
