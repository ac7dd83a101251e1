"""The loss's memory and HBM traffic by the stack it runs on: fp32 logits for Megatron's fused
cross-entropy and torch's eager one, e-byte logits for a torch.compile'd one (torchtitan since
2025) — meshplan's formulas with real values, and torch's own compiled and eager cross-entropy
measured on the CPU (saved tensors, exact; peak resident memory of the backward)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.activations import compiled_loss, head_activation_bytes, loss_grad_bytes
from meshplan.cost.calibration import calibration_for
from meshplan.cost.compute import head_op_times
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.estimate import estimate

LLAMA8B = load_model("llama3-8b")  # V = 128,256, h = 4,096
N = 2 * 8192  # tokens of one micro-batch (b = 2, s = 8,192)
NV = N * 128_256


def test_loss_kernels_follow_the_blocks_unless_the_loss_stays_eager():
    base = dict(global_batch=8, seq_len=8192, dp=8)
    assert TrainingPlan.of(kernels="compiled", **base).stack.loss_kernels == "compiled"
    assert TrainingPlan.of(kernels="compiled", compile_loss=False, **base).stack.loss_kernels == "eager"
    assert TrainingPlan.of(kernels="eager", **base).stack.loss_kernels == "eager"
    assert TrainingPlan.of(kernels="fused", compile_loss=False, **base).stack.loss_kernels == "fused"
    assert compiled_loss("compiled", 1) and not compiled_loss("compiled", 2) and not compiled_loss("eager", 1)


def test_head_activations_keep_fp32_logits_or_the_compiled_losss_bf16_logits():
    """2·n·h·e (final-norm and LM-head inputs) + 4·n·V eager or fused, + e·n·V compiled."""
    inputs = 2 * N * 4096 * 2
    assert head_activation_bytes(LLAMA8B, 2, 8192, 1, 1, False, 2, "eager") == inputs + 4 * NV == 8_673_820_672
    assert head_activation_bytes(LLAMA8B, 2, 8192, 1, 1, False, 2, "fused") == inputs + 4 * NV
    assert head_activation_bytes(LLAMA8B, 2, 8192, 1, 1, False, 2, "compiled") == inputs + 2 * NV == 4_471_128_064
    # under TP the loss runs in loss_parallel's handlers: their eager figures, V/t per GPU
    assert head_activation_bytes(LLAMA8B, 2, 8192, 8, 1, True, 2, "compiled") == inputs / 8 + 4 * N * (128_256 // 8)


def test_loss_backward_buffers():
    """Backward transients beside what the loss keeps: fused 4·n·V, eager 8·n·V, loss_parallel
    12·n·V/t, compiled e·n·V (the e-byte gradient, nothing in fp32)."""
    assert loss_grad_bytes(LLAMA8B, 2, 8192, 1, 1, "fused") == 4 * NV
    assert loss_grad_bytes(LLAMA8B, 2, 8192, 1, 1, "eager") == 8 * NV
    assert loss_grad_bytes(LLAMA8B, 2, 8192, 8, 1, "compiled") == 12 * N * (128_256 // 8)
    assert loss_grad_bytes(LLAMA8B, 2, 8192, 1, 1, "compiled", 2) == 2 * NV == 4_202_692_608


def test_compiled_loss_traffic():
    """The compiled loss moves 2e bytes per logit forward and backward; torch's eager loss over
    fp32 logits e + 20 and 24 + e (the cast, the softmax's three reads and a write, nll_loss's
    zero-filled gradient, the cast back); Megatron's fused one e + 16 and 12 + e: the differences
    are exactly that traffic at the calibrated HBM rate, W·η_hbm (the per-kernel overhead is in
    each)."""
    gpu = load_gpu("h100-sxm-80gb")
    cal = calibration_for(gpu)
    eager, comp, fused = (head_op_times(LLAMA8B, 2, 8192, 1, 1, gpu, cal, "bf16", 2, k) for k in ("eager", "compiled", "fused"))
    assert comp.fwd_gemm == eager.fwd_gemm == fused.fwd_gemm and comp.bwd_weight == eager.bwd_weight
    rate = gpu.hbm_bandwidth * cal.hbm_efficiency
    assert eager.fwd - comp.fwd == pytest.approx(NV * (22 - 4) / rate, rel=1e-9)
    assert eager.bwd - comp.bwd == pytest.approx(NV * (26 - 4) / rate, rel=1e-9)
    assert fused.fwd - comp.fwd == pytest.approx(NV * (18 - 4) / rate, rel=1e-9)
    assert fused.bwd - comp.bwd == pytest.approx(NV * (14 - 4) / rate, rel=1e-9)


def test_estimate_peak_drops_by_the_losss_fp32_buffers():
    """One GPU's peak, compiled loss vs eager loss beside compiled blocks, Llama 3 8B, FSDP over
    32 H200, b = 2: the difference is (4 + 8 − 2 − 2)·n·V = 8·n·V when the peak is at the start
    of the backward (the last stage holds every layer's activations and the loss's buffers), and
    the bf16 logits' block the caching allocator keeps reserved beside the eager loss's fp32
    tensors, 2·n·V (tests/test_allocator.py): 10·n·V."""
    cluster = ClusterSpec.of(load_gpu("h200-sxm-141gb"), 32)
    plan = dict(dp=32, micro_batch=2, global_batch=64, seq_len=8192, recompute="op", zero=3, sequence_parallel=False, kernels="compiled")
    eager = estimate(LLAMA8B, cluster, TrainingPlan.of(compile_loss=False, **plan))
    comp = estimate(LLAMA8B, cluster, TrainingPlan.of(**plan))
    assert eager.peak_bytes - comp.peak_bytes == 8 * NV + 2 * NV
    assert comp.time.step_s < eager.time.step_s


MEASURE = textwrap.dedent('''
    import gc, json, sys
    import torch
    mode, n, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    def ce(pred, labels):
        return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
    fn = torch.compile(ce) if mode == "compiled" else ce
    labels = torch.randint(0, V, (1, n))
    pred = torch.randn(1, n, V, dtype=torch.bfloat16, requires_grad=True)
    fn(pred, labels).backward()  # compile and warm the allocator
    pred.grad = None
    gc.collect()
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
    def hwm():  # the kernel's own high-water mark of the resident set (no sampling to miss a peak)
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
    saved = {}
    def pack(t):
        if t.numel() >= n * V:  # logits-sized tensors only (not labels or per-token statistics)
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set (Linux >= 4.0)
    base = rss()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(pred, labels)
    loss.backward()
    print(json.dumps({"saved": sum(saved.values()), "peak": hwm() - base}))
''')


def _measure(mode: str, n: int, V: int) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, mode, str(n), str(V)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="torch.compile on CPU needs a C++ compiler")
def test_torch_cross_entropy_compiled_and_eager_measured():
    """torch 2.13 on the CPU, bf16 logits of n = 4,096 tokens × V = 16,000: the eager loss saves
    its fp32 log-softmax (4·n·V bytes, meshplan's kept fp32 logits) and its backward peaks
    ~12·n·V above the start (4 kept + 8 transient, meshplan's eager figures); the compiled loss
    saves only the bf16 logits (2·n·V) and its backward adds only their bf16 gradient (~2·n·V)."""
    pytest.importorskip("torch")
    n, V = 4096, 16000
    nv = n * V
    eager, comp = _measure("eager", n, V), _measure("compiled", n, V)
    assert eager["saved"] == 4 * nv
    assert comp["saved"] == 2 * nv
    assert 11 * nv <= eager["peak"] <= 13 * nv
    assert 1.5 * nv <= comp["peak"] <= 3 * nv


def test_search_screen_counts_the_loss_as_estimate_does():
    """The search's screen (numpy over plans) and estimate agree to the byte on every plan's peak,
    with the loss compiled or eager beside compiled blocks; the compiled loss lowers the peak of
    the plans whose peak is at the start of the backward on the last stage."""
    from meshplan.search.engine import Engine
    from meshplan.search.space import SearchLimits, enumerate_plans

    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 8)
    lim = SearchLimits(pp=1, cp=1, recompute=("op", "full"), zero=(1, 3), sequence_parallel=(True,), tp_comm_overlap=(False,))
    table = enumerate_plans(LLAMA8B, 8, 8, 8192, (32,), lim)
    assert len(table) >= 8
    peaks = {}
    for flag in (True, False):
        base = TrainingPlan.of(global_batch=32, seq_len=8192, kernels="compiled", compile_loss=flag)
        screen = Engine(LLAMA8B, cluster, base).evaluate(table)
        for i in range(len(table)):
            est = estimate(LLAMA8B, cluster, TrainingPlan.of(**{**base.model_dump(), **table.row(i)}))
            assert screen.peak_bytes[i] == est.peak_bytes
            assert screen.step_lower_bound[i] <= est.time.step_s
        peaks[flag] = screen.peak_bytes
    assert (peaks[True] <= peaks[False]).all() and (peaks[True] < peaks[False]).any()
