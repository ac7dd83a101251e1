"""Bad input: one line on stderr, ``error: <field>: <rule>``, exit status 2, nothing on stdout, no
traceback; and the same discipline for the library API (an InputError or a pydantic
ValidationError, never another exception), checked on random input with hypothesis.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from meshplan.catalog import load_gpu, load_model
from meshplan.cli.app import main
from meshplan.errors import InputError
from meshplan.estimate import Budget, estimate
from meshplan.specs import ClusterSpec, TrainingPlan

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def assert_one_error_line(code: int, out: str, err: str, *names: str) -> str:
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


# (arguments, text the error line must contain: the field, and where useful the rule)
BAD = [
    (["--gpus", "0"], "error: gpus: must be a positive integer"),
    (["--gpus", "-8"], "error: gpus:"),
    (["--gpus", "10000000000"], "error: gpus: must be at most"),
    (["--tp", "-1"], "error: tp: must be a positive integer"),
    (["--tp", "0"], "error: tp:"),
    (["--pp", "0"], "error: pp:"),
    (["--cp", "-2"], "error: cp:"),
    (["--dp", "0"], "error: dp:"),
    (["--vpp", "0"], "error: vpp:"),
    (["--micro-batch", "0"], "error: micro_batch:"),
    (["--global-batch", "0"], "error: global_batch:"),
    (["--seq-len", "0"], "error: seq_len: must be a positive integer"),
    (["--seq-len", "1000000000"], "error: seq_len:"),
    (["--tp", "2000000000"], "error: tp: must be at most"),
    (["--price", "-1"], "error: price:"),
    (["--price", "nan"], "error: price: must be a finite number"),
    (["--price", "inf"], "error: price:"),
    (["--tokens", "-5"], "error: tokens:"),
    (["--tokens", "0"], "error: tokens:"),
    (["--tokens", "abc"], "error: tokens:"),
    (["--tokens", "inf"], "error: tokens:"),
    (["--pue", "0.5"], "error: pue:"),
    (["--nic-gbps", "0"], "error: nic_gbps:"),
    (["--nic-gbps", "5e-324", "--gpus", "16", "--json"], "error: nic_gbps: must be at least 0.001"),  # an infinite step otherwise
    (["--oversubscription", "0.5"], "error: oversubscription:"),
    (["--global-batch-tokens", "12345"], "error: global_batch_tokens: 12,345 tokens is not a multiple of seq_len (4,096)"),
    (["--global-batch-tokens", "-4M"], "error: global_batch_tokens:"),
    (["--global-batch-tokens", "lots"], "error: global_batch_tokens:"),
    (["--global-batch", "1024", "--global-batch-tokens", "4M"], "error: global_batch_tokens: give --global-batch or"),
    (["--global-batch", "12"], "error: global_batch: 12 sequences must be a multiple of micro_batch x dp"),
    (["--global-batch", "2000000", "--dp", "1"], "error: global_batch:"),  # two million micro-batches per step
    (["--tp", "3"], "error: tp: tp (3) must divide the number of attention heads (32)"),
    (["--tp", "3", "--gpus", "24"], "error: tp: tp (3) must divide the number of attention heads (32)"),
    (["--pp", "100"], "error: pp: pp x vpp (100) must not exceed the number of layers + 2 (34: only the first and last stages, with the embedding and the LM head, may hold no layer)"),
    (["--pp", "100", "--gpus", "800"], "error: pp: pp x vpp (100) must not exceed the number of layers + 2 (34: "),
    (["--pp", "35", "--gpus", "280"], "error: pp: pp x vpp (35) must not exceed the number of layers + 2"),
    (["--gpus", "16", "--dp", "4"], "error: dp: tp x cp x pp x dp = 1 x 1 x 1 x 4 = 4 must equal --gpus (16)"),
    (["--tp", "16"], "error: gpus: 8 GPUs (the default; give --gpus or --dp) is not a multiple of tp x cp x pp"),
    (["--gpus", "12"], "error: gpus: 12 GPUs is not a multiple of the 8 GPUs per node"),
    (["--pod-size", "12"], "error: pod_size:"),
    (["--ep", "2"], "error: ep:"),
    (["--dp-shard", "3"], "error: dp_shard:"),
    (["--vpp", "2", "--schedule", "1f1b"], "error: vpp:"),
    # 9 micro-batches per pipeline do not split into ⌊9/4⌋ = 2 equal rounds (interleaved)
    (["--pp", "4", "--gpus", "32", "--vpp", "2", "--global-batch", "72"], "error: global_batch:"),
    (["--layer-split", "1,2"], "error: layer_split:"),
    (["--layer-split", "7,x"], "error: layer_split:"),
    (["--layer-split", "10,0,22", "--pp", "3", "--gpus", "24"], "error: layer_split: every inner virtual stage needs at least one layer"),
    (["--layer-split", "-1,33", "--pp", "2", "--gpus", "16"], "error: layer_split: layer counts must not be negative"),
    (["--pp", "2", "--gpus", "16", "--layer-split", "10,20"], "error: layer_split: entries must add up to the 32 layers"),
    (["--rank-order", "tp,dp"], "error: rank_order:"),
    (["--rank-order", "tp,cp,dp,dp"], "error: rank_order:"),
    (["--cp", "2", "--seq-len", "4098", "--gpus", "16"], "error: seq_len:"),
    (["--precision", "fp8", "--gpu", "a100-sxm-80gb"], "error: precision: a100-sxm-80gb has no fp8"),
    (["--model", "llama9-1t"], "error: model: unknown model 'llama9-1t'"),
    (["--model", ""], "error: model:"),
    (["--model", "x" * 5000], "error: model:"),
    (["--model", "no/such/config.json"], "error: model: no such file"),
    (["--gpu", "tpu-v5"], "error: gpu: unknown GPU 'tpu-v5'"),
    (["--gpu", "a100"], "error: gpu:"),  # ambiguous: a100-sxm-40gb or a100-sxm-80gb
    (["--preset", "gpt5"], "error: preset: unknown preset 'gpt5'"),
    # click usage errors name the option
    (["--tp", "x"], "error: Invalid value for '--tp'"),
    (["--gpus", "1.5"], "error: Invalid value for '--gpus'"),
    (["--schedule", "zb-v"], "error: Invalid value for '--schedule'"),
    (["--zero", "4"], "error: Invalid value for '--zero'"),
    (["--stack", "nosuch"], "error: stack: unknown stack 'nosuch' (profiles: megatron-core,"),
    (["--set", "kernels"], "error: set: must be FIELD=VALUE"),
    (["--set", "zero=3"], "error: set: unknown stack field 'zero'"),
    (["--set", "kernels=triton"], "error: stack.kernels: Input should be 'fused', 'compiled' or 'eager'"),
    (["--set", "fsdp_head_in_root=maybe"], "error: set.fsdp_head_in_root: must be true or false"),
    (["--set", "fp8_linears=torchao"], "error: set: fp8_linears torchao needs the compiled or eager kernels"),
    (["--model", "mixtral-8x7b", "--zero", "3", "--precision", "fp8", "--set", "kernels=compiled", "--set", "fsdp_fp8_all_gather=true"],
     "error: fsdp_fp8_all_gather: FP8 all-gather is modelled for dense models"),
    (["--precision", "int4"], "error: Invalid value for '--precision'"),
    (["--recompute", "some"], "error: Invalid value for '--recompute'"),
    (["--unit", "MB"], "error: Invalid value for '--unit'"),
    (["--price", "cheap"], "error: Invalid value for '--price'"),
    (["--frobnicate"], "error: No such option: --frobnicate"),
    (["--tp"], "error: Option '--tp' requires an argument"),
]


@pytest.mark.parametrize("args, expected", BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_estimate_input(args, expected):
    line = assert_one_error_line(*run_cli("estimate", *args))
    assert expected in line


@pytest.mark.parametrize("command", ["estimate", "explain"])
def test_both_plan_commands_refuse_the_same_way(command):
    line = assert_one_error_line(*run_cli(command, "--tp", "3"))
    assert line == "error: tp: tp (3) must divide the number of attention heads (32)"


def test_other_usage_errors():
    assert_one_error_line(*run_cli("plan-it"), "No such command")
    assert_one_error_line(*run_cli("models", "--tp", "2"), "--tp")
    assert_one_error_line(*run_cli("explain", "--figure", "nonesuch"), "error: figure:", "nonesuch")


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("config.json", "{not json", "is not valid JSON"),
        ("config.json", json.dumps({"model_type": "t5", "d_model": 512}), "t5"),
        ("config.json", json.dumps({"model_type": "llama", "hidden_size": 4096}), "error: "),
        ("config.json", "[1, 2, 3]", "error: "),
        ("model.yaml", "n_layers: [unclosed", "is not valid YAML"),
        ("model.yaml", "n_layers: 2\nhidden: 64\n", "error: model"),
        ("model.yaml", "n_layers: -2\nhidden: 64\nn_heads: 4\nffn_hidden: 128\nvocab_size: 100\n", "n_layers"),
        ("model.yaml", "n_layers: 2\nhidden: 64\nn_heads: 4\nffn_hidden: 128\nvocab_size: 100\nwings: 2\n", "wings"),
        ("model.txt", "\x00\x01 binary", "error: model"),
    ],
)
def test_malformed_or_unsupported_model_file(tmp_path, name, text, expected):
    path = _write(tmp_path, name, text)
    before = Path(path).read_bytes()
    line = assert_one_error_line(*run_cli("estimate", "--model", path))
    assert expected in line
    assert Path(path).read_bytes() == before  # nothing the user wrote is modified


def test_a_directory_is_not_a_model(tmp_path):
    assert_one_error_line(*run_cli("estimate", "--model", str(tmp_path)), "error: model:")


# ---- property tests: the CLI ---------------------------------------------------------------------


def mostly(good, bad, one_in: int = 15):
    """``good`` values, and ``bad`` ones about once in ``one_in`` draws."""
    return st.integers(1, one_in).flatmap(lambda k: bad if k == 1 else good)


BAD_INTS = st.one_of(st.integers(-3, 0), st.sampled_from([3, 7, 100, 2**31, 10**12, 10**30]))
GOOD_INTS = {
    "--gpus": st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
    "--tp": st.sampled_from([1, 2, 4, 8]),
    "--pp": st.sampled_from([1, 2, 4]),
    "--cp": st.sampled_from([1, 2]),
    "--dp": st.sampled_from([1, 2, 4, 8]),
    "--vpp": st.sampled_from([1, 2]),
    "--micro-batch": st.sampled_from([1, 2, 4]),
    "--seq-len": st.sampled_from([512, 2048, 4096, 8192]),
    "--global-batch": st.sampled_from([8, 16, 64, 256]),
}
NAMES = {
    "--model": ["llama3-8b", "llama2-7b", "gpt3-175b", "llama3-70b"],
    "--gpu": ["h100-sxm-80gb", "a100-sxm-40gb", "mi300x", "h100"],
    "--schedule": ["1f1b", "interleaved", "gpipe"],
    "--precision": ["bf16", "fp32", "fp16", "fp8"],
    "--recompute": ["none", "selective", "full"],
    "--zero": ["0", "1", "2", "3"],
}
FLOATS = {
    "--price": st.sampled_from(["2", "0", "3.5"]),
    "--tokens": st.sampled_from(["15.6T", "2e12", "1T", "1e9"]),
    "--pue": st.sampled_from(["1", "1.2", "1.5"]),
    "--oversubscription": st.sampled_from(["1", "3", "7"]),
    "--nic-gbps": st.sampled_from(["25", "50", "100"]),
}
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)


def _float_text(x: float) -> str:
    return repr(x) if math.isfinite(x) else str(x)


BAD_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(_float_text),
                       st.sampled_from(["-5", "0", "1e400", "-1T"]), TEXT)


@st.composite
def cli_args(draw) -> list[str]:
    args: list[str] = [draw(st.sampled_from(["estimate", "explain"]))]
    for flag in draw(st.lists(st.sampled_from(list(GOOD_INTS)), unique=True, max_size=5)):
        args += [flag, str(draw(mostly(GOOD_INTS[flag], BAD_INTS)))]
    for flag, choices in NAMES.items():
        if draw(st.integers(0, 3)) == 0:
            args += [flag, draw(mostly(st.sampled_from(choices), TEXT))]
    for flag in draw(st.lists(st.sampled_from(list(FLOATS)), unique=True, max_size=3)):
        args += [flag, draw(mostly(FLOATS[flag], BAD_FLOATS))]
    if draw(st.integers(0, 5)) == 0:
        args += ["--global-batch-tokens", draw(st.one_of(st.sampled_from(["4M", "16M", "12345", "0", "-1M"]), TEXT))]
    if draw(st.integers(0, 5)) == 0:
        args += ["--preset", draw(mostly(st.just("llama3-405b-16k"), TEXT))]
    if args[0] == "estimate" and draw(st.booleans()):
        args.append("--json")
    return args


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(cli_args())
def test_cli_exits_0_or_2_with_one_error_line(args):
    code, out, err = run_cli(*args)
    assert code in (0, 2), (args, code, err)
    if code == 2:
        assert_one_error_line(code, out, err)
    else:
        assert err == "" and out
        if "--json" in args:
            json.loads(out)  # one valid JSON object (no NaN), nothing else


# ---- property tests: the library API ------------------------------------------------------------

AXIS = mostly(st.sampled_from([1, 1, 2, 4, 8]), st.sampled_from([0, -1, 3, 16, 10**9]))


@st.composite
def api_inputs(draw):
    tp, cp, pp, dp, b = draw(AXIS), draw(AXIS), draw(AXIS), draw(AXIS), draw(AXIS)
    schedule = draw(mostly(st.sampled_from(["1f1b", "interleaved", "gpipe"]), st.sampled_from(["zb-h1", ""])))
    vpp = draw(mostly(st.just(2 if schedule == "interleaved" else 1), st.sampled_from([0, -1, 1, 2, 3])))
    m = draw(mostly(st.integers(1, 8).map(lambda k: k * max(pp, 1)), st.integers(-2, 3)))
    plan = {
        "tp": tp, "cp": cp, "pp": pp, "dp": dp, "vpp": vpp, "schedule": schedule, "micro_batch": b,
        "global_batch": draw(mostly(st.just(b * dp * m), st.sampled_from([0, -4, 10**10, 7]))),
        "seq_len": draw(mostly(st.sampled_from([128, 1024, 4096, 8192]), st.sampled_from([-2, 0, 1, 4097, 10**9]))),
        "recompute": draw(mostly(st.sampled_from(["none", "selective", "full"]), st.just("half"))),
        "zero": draw(mostly(st.sampled_from([0, 1, 2, 3]), st.sampled_from([4, -1]))),
        "sequence_parallel": draw(st.booleans()),
        "attention": draw(mostly(st.sampled_from(["flash", "materialized"]), st.just("sparse"))),
    }
    if draw(st.integers(0, 3)) == 0:
        plan["dp_shard"] = draw(AXIS)
    if draw(st.booleans()):
        plan["precision"] = {"precision": draw(mostly(st.sampled_from(["bf16", "fp32", "fp16", "fp8"]), st.just("int8")))}
    gpus = draw(mostly(st.none(), st.integers(-2, 300)))
    model = draw(mostly(st.sampled_from(["llama3-8b", "llama2-7b", "gpt3-175b", "llama3-70b"]), st.just("nope")))
    gpu = draw(mostly(st.sampled_from(["h100-sxm-80gb", "a100-sxm-80gb", "mi300x", "b200"]), st.just("tpu")))
    floats = st.floats(allow_nan=True, allow_infinity=True)
    budget = {
        "tokens": draw(mostly(st.one_of(st.none(), st.floats(1e9, 1e14)), floats)),
        "price_per_gpu_hour": draw(mostly(st.one_of(st.none(), st.floats(0, 10)), floats)),
        "pue": draw(mostly(st.floats(1, 2), floats)),
    }
    cluster_kw = {
        "pod_size": draw(mostly(st.none(), st.sampled_from([0, 8, 12, 64]))),
        "oversubscription": draw(mostly(st.just(1.0), floats)),
    }
    return plan, gpus, model, gpu, budget, cluster_kw


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(api_inputs())
def test_library_raises_only_input_errors(inputs):
    plan_kw, gpus, model_name, gpu_name, budget_kw, cluster_kw = inputs
    try:
        model = load_model(model_name)
        gpu = load_gpu(gpu_name)
        plan = TrainingPlan.of(**plan_kw)
        cluster = ClusterSpec.of(gpu, plan.num_gpus if gpus is None else gpus, **cluster_kw)
        est = estimate(model, cluster, plan, Budget(**budget_kw))
    except (InputError, ValidationError):
        return
    # a plan that was accepted gives finite, positive, consistent figures
    d = est.to_dict()
    json.dumps(d, allow_nan=False)
    assert est.time.step_s > 0 and math.isfinite(est.time.step_s)
    assert all(s.total > 0 and math.isfinite(s.total) for s in est.stages)
    assert 0 < est.mfu <= est.hfu
    # no faster than the compute dtype's dense peak (FP8 runs quote MFU against BF16, so it may pass 1)
    assert est.hardware_tflops_per_gpu * 1e12 <= gpu.peak(plan.precision.compute_dtype)
    assert sum(d["time"]["breakdown"].values()) == pytest.approx(est.time.step_s, rel=1e-9)
