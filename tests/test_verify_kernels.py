"""``meshplan verify kernels``: the cases are meshplan's own kernels with its own predictions, the
implied constants invert the time model exactly, and the timing code runs (on CPU here; the
comparison means something only with --device cuda, which no test needs)."""

from __future__ import annotations

import json
import math

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.calibration import calibration_for
from meshplan.cost.compute import layer_op_times
from meshplan.cost.kernel_time import gemm_time
from meshplan.errors import InputError
from meshplan.verify import kernels as K

H100 = load_gpu("h100-sxm-80gb")
CAL = calibration_for(H100)
LLAMA8B = load_model("llama3-8b")


FUSED_GEMMS = ("qkv", "attn_out", "mlp_in", "mlp_out")
TORCH_GEMMS = ("q", "k", "v", "o", "gate", "up", "down")


def _cases(stacks=("eager", "compiled"), kernels="fused"):
    return K.kernel_cases(LLAMA8B, H100, 2, 8192, 1, "bf16", stacks, kernels=kernels)


def test_cases_are_the_layer_gemms_in_their_three_directions():
    cases = _cases()
    assert [c.name for c in cases] == [
        f"gemm {g} {d}" for g in FUSED_GEMMS for d in ("fwd", "dgrad", "wgrad")
    ] + ["attention fwd", "attention bwd", "memory copy", "layer fwd", "layer bwd", "layer fwd", "layer bwd"]
    by = {c.name: c for c in cases if c.kind == "gemm"}
    n = 2 * 8192
    # Llama 3 8B: h 4096, 32 query and 8 K/V heads of 128, MLP 14336 (gate and up fused)
    assert by["gemm qkv fwd"].shape == (n, 6144, 4096)
    assert by["gemm qkv dgrad"].shape == (n, 4096, 6144)
    assert by["gemm qkv wgrad"].shape == (4096, 6144, n)
    assert by["gemm mlp_in fwd"].shape == (n, 28672, 4096)
    assert by["gemm mlp_out wgrad"].shape == (14336, 4096, n)
    assert by["gemm attn_out fwd"].work == 2 * n * 4096 * 4096
    for c in by.values():
        assert c.predicted == float(gemm_time(*c.shape, H100, CAL, H100.peak("bf16"), 2))


def test_torch_stack_cases_are_torchtitans_separate_projections():
    """Under --set kernels=compiled or eager the GEMM rows are the seven projections torchtitan's block
    runs, in its order: q, k, v, o, gate, up, down."""
    cases = _cases((), kernels="compiled")
    assert [c.name for c in cases if c.kind == "gemm"] == [f"gemm {g} {d}" for g in TORCH_GEMMS for d in ("fwd", "dgrad", "wgrad")]
    by = {c.name: c for c in cases}
    n = 2 * 8192
    assert by["gemm q fwd"].shape == (n, 4096, 4096)
    assert by["gemm k fwd"].shape == by["gemm v fwd"].shape == (n, 1024, 4096)
    assert by["gemm k dgrad"].shape == (n, 4096, 1024)
    assert by["gemm gate fwd"].shape == by["gemm up fwd"].shape == (n, 14336, 4096)
    assert by["gemm down wgrad"].shape == (14336, 4096, n)
    # the same FLOPs as the fused GEMMs, in more, narrower calls
    fused = _cases(())
    assert sum(c.work for c in cases if c.kind == "gemm") == sum(c.work for c in fused if c.kind == "gemm")


def test_cases_add_up_to_the_layer_model():
    """Two derivations of one layer: the cases' GEMMs and attention are the layer model's."""
    cases = _cases(("eager",), kernels="eager")
    ops = layer_op_times(LLAMA8B, 2, 8192, 1, 1, False, "flash", "causal", H100, CAL, "bf16", 2, kernels="eager")
    gemm = {d: sum(c.predicted for c in cases if c.kind == "gemm" and c.name.endswith(d)) for d in ("fwd", "dgrad", "wgrad")}
    assert gemm["fwd"] == pytest.approx(ops.fwd_gemm, rel=1e-12)
    assert gemm["dgrad"] + gemm["wgrad"] == pytest.approx(ops.bwd_gemm, rel=1e-12)
    assert gemm["wgrad"] == pytest.approx(ops.bwd_weight, rel=1e-12)
    att = {c.name: c for c in cases if c.kind == "attention"}
    assert att["attention fwd"].predicted == ops.fwd_attention
    assert att["attention bwd"].predicted == ops.bwd_attention
    # causal FLOPs: 4·b·a·d·s²/2 = 4·2·32·128·8192²/2; the backward 2.5 times that
    assert att["attention fwd"].work == 4 * 2 * 32 * 128 * 8192**2 / 2 == 2 * 32 * 128 * 8192**2 * 2
    assert att["attention bwd"].work == 2.5 * att["attention fwd"].work
    layer = [c for c in cases if c.kind == "layer"]
    assert [(c.stack, c.predicted) for c in layer] == [("eager", ops.fwd), ("eager", ops.bwd)]
    copy = next(c for c in cases if c.kind == "memory")
    assert copy.work == 2 * 2 * 8192 * 14336 * 2  # read + write of one bf16 MLP-wide activation
    assert copy.predicted == pytest.approx(copy.work / (H100.hbm_bandwidth * CAL.hbm_efficiency) + CAL.kernel_overhead, rel=1e-15)


def test_tp_rank_shapes():
    cases = K.kernel_cases(LLAMA8B, H100, 1, 4096, 8, "bf16", ())
    by = {c.name: c for c in cases}
    assert by["gemm qkv fwd"].shape == (4096, (4 + 2) * 128, 4096)  # 4 query heads, 1 K/V head each way
    assert by["gemm mlp_out fwd"].shape == (4096, 4096, 1792)
    assert by["attention fwd"].shape == (4, 128, 4096, 4096)
    assert not [c for c in cases if c.kind == "layer"]


@pytest.mark.parametrize("kind", ["gemm", "attention", "memory"])
def test_implied_constant_inverts_the_prediction(kind):
    """Measured = predicted gives back meshplan's own constant; measured twice as long (beyond
    the launch cost) gives half of it."""
    for case in (c for c in _cases(()) if c.kind == kind):
        name, value, mine = K.implied_constant(case, case.predicted, H100, CAL, "bf16")
        assert mine == getattr(CAL, name)
        if value is None:  # a memory-bound GEMM implies no GEMM efficiency
            assert kind == "gemm"
            continue
        assert value == pytest.approx(mine, rel=1e-12)
        slower = 2 * (case.predicted - CAL.kernel_overhead) + CAL.kernel_overhead
        assert K.implied_constant(case, slower, H100, CAL, "bf16")[1] == pytest.approx(mine / 2, rel=1e-12)
        assert K.implied_constant(case, CAL.kernel_overhead, H100, CAL, "bf16")[1] is None


def test_memory_bound_gemm_implies_no_efficiency():
    thin = K.KernelCase("gemm x fwd", "gemm", (16384, 8, 4096), 2.0 * 16384 * 8 * 4096, 1e-3)
    assert K.implied_constant(thin, 1e-3, H100, CAL, "bf16") == ("gemm_efficiency", None, CAL.gemm_efficiency)


def test_pooled_constant_reproduces_the_total_time():
    cases = [c for c in _cases(()) if c.kind == "gemm"][:3]
    rows = []
    for c, factor in zip(cases, (1.0, 1.5, 3.0)):
        t = factor * (c.predicted - CAL.kernel_overhead) + CAL.kernel_overhead
        rows.append(K.KernelRow(c, t, *K.implied_constant(c, t, H100, CAL, "bf16")))
    value, mine = K.pooled_constants(rows, CAL)["gemm_efficiency"]
    assert mine == 0.70
    # with the pooled constant every row's compute time scales by 0.70 / value; their sum is the measured sum
    busy = [c.predicted - CAL.kernel_overhead for c in cases]
    assert sum(b * 0.70 / value for b in busy) == pytest.approx(sum(r.measured - CAL.kernel_overhead for r in rows), rel=1e-12)


def test_median_seconds_takes_the_median_of_the_timed_calls(monkeypatch):
    clock = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0])  # three timed calls: 1, 3, 2 seconds
    monkeypatch.setattr(K.time, "perf_counter", lambda: next(clock))
    calls = []
    assert K.median_seconds(lambda: calls.append(1), "cpu", warmup=2, reps=3) == 2.0
    assert len(calls) == 5
    with pytest.raises(InputError, match="^reps: needs warmup >= 0 and reps >= 1"):
        K.median_seconds(lambda: None, "cpu", reps=0)


def test_median_seconds_settles_back_to_back_before_the_warm_up(monkeypatch):
    """``settle`` seconds of untimed calls back to back come first (a GPU's clock comes down to what
    its power cap sustains), then the warm-up, then the timed calls."""
    # settle start 0; the loop checks 0.0, 0.4, 0.9 (calls), 1.2 (stops); then 2 timed calls
    clock = iter([0.0, 0.0, 0.4, 0.9, 1.2, 5.0, 6.0, 7.0, 10.0])
    monkeypatch.setattr(K.time, "perf_counter", lambda: next(clock))
    calls = []
    assert K.median_seconds(lambda: calls.append(1), "cpu", warmup=1, reps=2, settle=1.0) == 2.0
    assert len(calls) == 3 + 1 + 2
    with pytest.raises(InputError, match="^settle: must be at least 0 seconds"):
        K.median_seconds(lambda: None, "cpu", settle=-1.0)


@pytest.mark.parametrize("model,kw,field,message", [
    ("mixtral-8x7b", {}, "model", "mixture of experts"),
    ("deepseek-v3-671b", {}, "model", "mixture of experts"),
    ("llama3-8b", {"precision": "fp32"}, "precision", "bf16, fp16 and fp8 (torch._scaled_mm) GEMMs"),
    ("llama3-8b", {"cp": 2}, "cp", "--cp 1"),
    ("llama3-8b", {"attention": "materialized"}, "attention", "--attention flash"),
    ("llama3-8b", {"tp": 3}, "tp", "must divide the model's heads"),
])
def test_check_model_refuses_what_it_does_not_time(model, kw, field, message):
    args = {"tp": 1, "precision": "bf16", "cp": 1, "attention": "flash", **kw}
    spec = load_model(model)
    with pytest.raises(InputError) as err:
        K.check_model(spec, args["tp"], args["precision"], args["cp"], args["attention"])
    assert err.value.field == field and message in str(err.value)


def test_layer_rows_only_for_llama_shaped_layers():
    K.check_layer_stacks(LLAMA8B, ("eager", "compiled"))
    gemma = load_model("gemma2-9b")
    K.check_layer_stacks(gemma, ())  # no layer rows: nothing to refuse
    with pytest.raises(InputError) as err:
        K.check_layer_stacks(gemma, ("eager",))
    assert err.value.field == "layer-stacks" and "four norms a layer" in str(err.value) and "--layer-stacks none" in str(err.value)
    with pytest.raises(InputError, match="^layer-stacks: must be 'none' or a comma-separated list of eager, compiled \\(got fused\\)"):
        K.check_layer_stacks(LLAMA8B, ("eager", "fused"))
    gpt3 = load_model("gpt3-175b")
    assert K.llama_shaped(gpt3) and K.llama_shaped(LLAMA8B) == ""


torch = pytest.importorskip("torch")


def _tiny():
    from meshplan.catalog.hf_config import model_from_hf_config

    return model_from_hf_config({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128,
                                 "max_position_embeddings": 64}, "tiny")


def test_measure_runs_every_case_on_cpu():
    model = _tiny()
    cases = K.kernel_cases(model, H100, 1, 32, 1, "bf16", ("eager", "compiled"))
    seen = []
    report = K.measure(model, H100, cases, 1, "bf16", "cpu", warmup=1, reps=1, progress=seen.append)
    assert [r.case for r in report.rows] == cases
    assert all(r.measured > 0 and math.isfinite(r.ratio) for r in report.rows if not r.case.name.endswith("bwd"))
    assert all(r.measured >= 0 for r in report.rows)
    # one progress call per timing group: a backward is timed with its forward
    assert seen == [c.name + (f" ({c.stack})" if c.stack else "") for c in cases if c.kind in ("gemm", "memory") or c.name.endswith("fwd")]
    every = {"gemm_efficiency", "attention_fwd_efficiency", "attention_bwd_efficiency", "hbm_efficiency"}
    assert "attention_fwd_efficiency" in report.pooled and set(report.pooled) <= every  # a copy of 12 KB may beat t_kernel
    assert report.setup["device_name"] == "cpu" and report.setup["torch"] == torch.__version__
    d = report.to_dict()
    assert json.loads(json.dumps(d))["rows"][0]["name"] == "gemm qkv fwd"


def test_measure_needs_a_warmup_call_to_compile():
    model = _tiny()
    cases = K.kernel_cases(model, H100, 1, 32, 1, "bf16", ("compiled",))
    with pytest.raises(InputError, match="^warmup: must be at least 1 with a compiled layer"):
        K.measure(model, H100, cases, 1, "bf16", "cpu", warmup=0, reps=1)


def test_gemm_operands_are_the_linear_layers_layouts():
    """Forward x·Wᵀ with W stored (n, k); input gradient dY·W; weight gradient Xᵀ·dY = dWᵀ with
    X stored (m, k): the layouts autograd of ``F.linear`` hands the GEMM, whose products the
    last lines check on the same shapes."""
    import torch.nn.functional as F

    def case(direction, shape):
        return K.KernelCase(f"gemm x {direction}", "gemm", shape, 0.0, 1.0)

    m, n, k = 6, 5, 4  # the layer: x (m × k), W (n × k), y (m × n)
    a, b = K.gemm_operands(case("fwd", (m, n, k)), "cpu", torch.float64)
    assert a.shape == (m, k) and a.is_contiguous() and b.shape == (k, n) and b.t().is_contiguous()
    a, b = K.gemm_operands(case("dgrad", (m, k, n)), "cpu", torch.float64)
    assert a.shape == (m, n) and a.is_contiguous() and b.shape == (n, k) and b.is_contiguous()
    a, b = K.gemm_operands(case("wgrad", (k, n, m)), "cpu", torch.float64)
    assert a.shape == (k, m) and a.t().is_contiguous() and b.shape == (m, n) and b.is_contiguous()

    x = torch.randn(m, k, dtype=torch.float64, requires_grad=True)
    w = torch.randn(n, k, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(m, n, dtype=torch.float64)
    y = F.linear(x, w)
    y.backward(dy)
    assert torch.allclose(torch.mm(x, w.t()), y)
    assert torch.allclose(torch.mm(dy, w), x.grad)
    assert torch.allclose(torch.mm(x.t(), dy), w.grad.t())


CONFIG = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128, "max_position_embeddings": 64}


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


def test_cli_json_on_cpu(capsys, cfg):
    from meshplan.cli.app import main

    assert main(["verify", "kernels", "--model", cfg, "--seq-len", "32", "--layer-stacks", "eager", "--reps", "1",
                 "--warmup", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setup"]["device"] == "cpu" and out["setup"]["gpu"] == "h100-sxm-80gb"
    assert [r["name"] for r in out["rows"]][-2:] == ["layer fwd", "layer bwd"]
    expected = K.kernel_cases(load_model(cfg), H100, 1, 32, 1, "bf16", ("eager",))
    assert [r["predicted"] for r in out["rows"]] == [c.predicted for c in expected]
    # --set kernels=picks the GEMM rows' layout: torch's separate projections
    assert main(["verify", "kernels", "--model", cfg, "--seq-len", "32", "--layer-stacks", "none", "--reps", "1",
                 "--warmup", "0", "--set", "kernels=compiled", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["name"] for r in rows if r["kind"] == "gemm"][:3] == ["gemm q fwd", "gemm q dgrad", "gemm q wgrad"]


def test_cli_table_on_cpu_says_the_ratios_mean_nothing(capsys, cfg):
    from meshplan.cli.app import main

    assert main(["verify", "kernels", "--model", cfg, "--seq-len", "32", "--layer-stacks", "none", "--reps", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "gemm qkv fwd" in out and "layer fwd" not in out
    assert "CPU run: the times exercise the code only" in out
    assert "Implied calibration, pooled" in out


@pytest.mark.parametrize("flags,line", [
    (["--layer-stacks", "fused"], "error: layer-stacks: must be 'none' or a comma-separated list of eager, compiled (got fused)"),
    (["--layer-stacks", " , "], "error: layer-stacks: must be 'none' or a comma-separated list of eager, compiled (got ' , ')"),
    (["--precision", "fp32"], "error: precision: verify kernels times bf16, fp16 and fp8 (torch._scaled_mm) GEMMs: one of bf16, fp16, fp8 (got 'fp32')"),
    (["--precision", "fp8"], "error: layer-stacks: FP8 layer rows would need torchao's Float8Linear, which meshplan does not bring: "
                             "give --layer-stacks none (the FP8 GEMMs are timed)"),
    (["--precision", "fp8", "--gpu", "a100-sxm-80gb", "--layer-stacks", "none"], "error: precision: a100-sxm-80gb has no fp8 tensor-core support"),
    (["--reps", "0"], "error: reps: must be at least 1 (got 0)"),
    (["--warmup", "-1"], "error: warmup: must be at least 0 (got -1)"),
])
def test_cli_refusals_are_one_line_exit_2(capsys, cfg, flags, line):
    from meshplan.cli.app import main

    assert main(["verify", "kernels", "--model", cfg, "--seq-len", "32", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [line] and captured.out == ""


def test_fp8_cases_take_the_fp8_peak_for_gemms_only():
    """Under FP8 the GEMMs are predicted at the FP8 peak and attention at the bf16 one, as in the
    layer model; their implied constants use the same peaks."""
    cases = K.kernel_cases(LLAMA8B, H100, 2, 8192, 1, "fp8", (), kernels="compiled")
    ops = layer_op_times(LLAMA8B, 2, 8192, 1, 1, False, "flash", "causal", H100, CAL, "fp8", 2, kernels="compiled")
    assert sum(c.predicted for c in cases if c.kind == "gemm" and c.name.endswith("fwd")) == pytest.approx(ops.fwd_gemm, rel=1e-12)
    att = next(c for c in cases if c.name == "attention fwd")
    assert att.predicted == ops.fwd_attention
    for c in cases:
        if c.kind in ("gemm", "attention"):
            name, value, mine = K.implied_constant(c, c.predicted, H100, CAL, "fp8")
            assert value is None or value == pytest.approx(mine, rel=1e-12)


def test_fp8_operands_are_scaled_mm_layouts():
    """torch._scaled_mm takes A row-major and B column-major; E5M2 for the output gradient."""
    for direction, shape in (("fwd", (64, 48, 32)), ("dgrad", (64, 32, 48)), ("wgrad", (32, 48, 64))):
        a, b = K.gemm_operands(K.KernelCase(f"gemm x {direction}", "gemm", shape, 0.0, 1.0), "cpu", torch.bfloat16, fp8=True)
        m, n, k = shape
        assert a.shape == (m, k) and a.is_contiguous() and b.shape == (k, n) and b.t().is_contiguous()
        assert (str(a.dtype), str(b.dtype)) == tuple(f"torch.{t}" for t in K.FP8_OPERANDS[direction])
        one = torch.ones(())
        assert torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16).shape == (m, n)


def test_measure_fp8_gemms_on_cpu():
    model = _tiny()
    cases = K.kernel_cases(model, H100, 1, 32, 1, "fp8", ())
    report = K.measure(model, H100, cases, 1, "fp8", "cpu", warmup=0, reps=1)
    assert [r.case.name for r in report.rows][:3] == ["gemm qkv fwd", "gemm qkv dgrad", "gemm qkv wgrad"]
    assert all(r.measured > 0 for r in report.rows if r.case.kind == "gemm") and report.setup["precision"] == "fp8"
