"""The software stack (``kernels``, ``compile_loss``) out to each engine and back.

torchtitan (JobConfig v0.2.2, ``[compile]``): compiled → ``enable`` with ``components`` model and
loss, or model alone when the loss runs eager; eager → compile off; fused (Megatron-Core /
Transformer Engine) has no torchtitan equivalent: exported as compiled blocks and loss, warned.
Megatron-LM and nanotron run fused stacks, DeepSpeed the eager module it is given: other stacks warn.
"""

from __future__ import annotations

import json
import tomllib

import pytest

from meshplan.catalog import load_model
from meshplan.errors import InputError
from meshplan.interop import canonical, export, parse_text
from meshplan.interop.common import arg_tokens
from meshplan.specs.plan import TrainingPlan

from test_bad_input import run_cli

MODEL = load_model("llama3-8b")
BASE = TrainingPlan(tp=2, dp=4, zero=3, global_batch=32, seq_len=4096)
FUSED_WARNING = ("kernels: torchtitan has no Megatron-Core/Transformer Engine fused kernels nor fused vocab-parallel "
                 "cross-entropy; exported as torch.compile of the blocks and the loss (kernels compiled), its nearest stack")


def plan(**kw) -> TrainingPlan:
    return BASE.replace(**kw)


def kernel_warnings(result) -> list[str]:
    return [w for w in result.warnings if w.startswith(("kernels", "compile_loss", "tp_comm_overlap"))]


def tt_toml(p: TrainingPlan) -> dict:
    return tomllib.loads(export("torchtitan-toml", MODEL, p).text)


# ---- torchtitan export ------------------------------------------------------------------------------


@pytest.mark.parametrize(("kernels", "compile_loss", "section"), [
    ("compiled", True, {"enable": True, "components": ["model", "loss"]}),
    ("compiled", False, {"enable": True, "components": ["model"]}),
    ("eager", True, None),
    ("eager", False, None),  # compile_loss means nothing without compiled blocks
    ("fused", True, {"enable": True, "components": ["model", "loss"]}),
])
def test_torchtitan_compile_section(kernels, compile_loss, section):
    p = plan(kernels=kernels, compile_loss=compile_loss)
    assert tt_toml(p).get("compile") == section
    flags = arg_tokens(export("torchtitan@0.2", MODEL, p).text)
    if section is None:
        assert not any(t.startswith("--compile.") for t in flags)
    else:
        assert "--compile.enable" in flags
        i = flags.index("--compile.components")
        assert flags[i + 1] == ",".join(section["components"])
    # torchtitan 0.3 (the default) always writes compile on or off: its 405B config turns it on
    now = arg_tokens(export("torchtitan", MODEL, p).text)
    assert ("--compile.enable" if section else "--compile.no-enable") in now
    warned = kernel_warnings(export("torchtitan@0.2", MODEL, p))
    assert warned == ([FUSED_WARNING] if kernels == "fused" else [])


def test_torchtitan_async_tp_needs_compiled_blocks():
    eager = export("torchtitan@0.2", MODEL, plan(kernels="eager", tp_comm_overlap=True, tp_overlap_kind="micro-pipeline"))
    assert kernel_warnings(eager) == [
        "tp_comm_overlap: torchtitan's async TP needs the blocks compiled (compile.enable with \"model\" in compile.components) "
        "and refuses to start with eager ones; exported with it (give --set kernels=compiled)"]
    assert "--parallelism.enable_async_tensor_parallel" in eager.text
    # torchtitan 0.3 moved the switch under compile
    assert "--compile.enable_async_tensor_parallel" in export("torchtitan", MODEL, plan(
        kernels="eager", tp_comm_overlap=True, tp_overlap_kind="micro-pipeline")).text
    compiled = export("torchtitan", MODEL, plan(kernels="compiled", tp_comm_overlap=True, tp_overlap_kind="micro-pipeline"))
    assert kernel_warnings(compiled) == [] and "--compile.enable" in compiled.text


# ---- torchtitan import ------------------------------------------------------------------------------

TOML = """[parallelism]
tensor_parallel_degree = 2
data_parallel_shard_degree = 4
[training]
global_batch_size = 32
seq_len = 4096
"""


def read(extra: str, toml: bool = True):
    parsed = parse_text(TOML + extra if toml else extra, "torchtitan-toml" if toml else "torchtitan")
    kernel_notes = [n for n in parsed.notes if n.startswith("kernels")]
    assert len(kernel_notes) == 1, parsed.notes  # one note says how the stack was read
    return parsed.plan.get("kernels"), parsed.plan.get("compile_loss"), kernel_notes[0]


def test_torchtitan_import_compile_v02():
    assert read('[compile]\nenable = true\ncomponents = ["model", "loss"]\n') == (
        "compiled", True, "kernels: compile.enable = true, components model,loss read as compiled (torch.compile'd blocks), the loss compiled with them")
    assert read('[compile]\nenable = true\ncomponents = ["model"]\n') == (
        "compiled", False, "kernels: compile.enable = true, components model read as compiled (torch.compile'd blocks), the loss eager beside them")
    # components default to model and loss (JobConfig v0.2.2's Compile)
    assert read("[compile]\nenable = true\n")[:2] == ("compiled", True)
    assert read('[compile]\nenable = false\ncomponents = ["model", "loss"]\n')[:2] == ("eager", None)
    kernels, loss, note = read('[compile]\nenable = true\ncomponents = ["loss"]\n')
    assert (kernels, loss) == ("eager", None) and note.endswith("the loss alone compiled is not modelled (read as eager)")


def test_torchtitan_import_compile_flags_and_v01():
    flags = "--parallelism.tensor_parallel_degree 2 --training.global_batch_size 32 --training.seq_len 4096 "
    assert read(flags + "--compile.enable --compile.components model", toml=False)[:2] == ("compiled", False)
    assert read(flags + "--compile.no-enable", toml=False)[:2] == ("eager", None)
    kernels, loss, note = read(flags + "--training.compile", toml=False)  # JobConfig before v0.2 (0.1.0)
    assert (kernels, loss) == ("compiled", True)
    assert "training.compile = true (JobConfig before v0.2" in note and "give --set compile_loss=false" in note
    kernels, loss, note = read("")
    assert (kernels, loss) == ("eager", None)
    assert note == "kernels: no compile setting (torchtitan's default: off) read as eager (PyTorch eager blocks, torch's cross-entropy)"


def test_torchtitan_import_notes_async_tp_without_compile():
    text = TOML.replace("data_parallel_shard_degree = 4", "data_parallel_shard_degree = 4\nenable_async_tensor_parallel = true")
    parsed = parse_text(text, "torchtitan-toml")
    assert parsed.plan["tp_comm_overlap"] and parsed.plan["kernels"] == "eager"
    assert [n for n in parsed.notes if n.startswith("tp_comm_overlap")] == [
        "tp_comm_overlap: torchtitan refuses async TP without the blocks compiled (compile.enable, \"model\" in compile.components)"]
    parsed = parse_text(text + "[compile]\nenable = true\n", "torchtitan-toml")
    assert parsed.plan["kernels"] == "compiled" and not any(n.startswith("tp_comm_overlap") for n in parsed.notes)


@pytest.mark.parametrize(("extra", "rule"), [
    ('[compile]\nenable = true\ncomponents = ["model", "optimizer"]\n', "unsupported value 'optimizer' (one of model, loss)"),
    ("[compile]\nenable = true\ncomponents = 3\n", "must be a list of model and loss (got 3)"),
    ('[compile]\nenable = "sometimes"\n', "must be true or false"),
])
def test_torchtitan_import_refuses_bad_compile(extra, rule):
    with pytest.raises(InputError) as err:
        parse_text(TOML + extra, "torchtitan-toml")
    assert err.value.field in ("compile.components", "compile.enable") and rule in err.value.rule


@pytest.mark.parametrize(("kernels", "compile_loss"), [("compiled", True), ("compiled", False), ("eager", True)])
def test_torchtitan_round_trip_of_the_stack(kernels, compile_loss):
    p = plan(kernels=kernels, compile_loss=compile_loss)
    for engine in ("torchtitan", "torchtitan-toml"):
        back = parse_text(export(engine, MODEL, p).text).plan
        assert back["kernels"] == kernels and back.get("compile_loss", True) == compile_loss


# ---- Megatron-LM, DeepSpeed, nanotron ----------------------------------------------------------------


@pytest.mark.parametrize(("engine", "runs", "warning"), [
    ("megatron", "fused", "kernels: Megatron-LM runs Megatron-Core/Transformer Engine fused kernels and its fused vocab-parallel "
                          "cross-entropy, not {k} ones; exported as fused"),
    ("nanotron", "fused", "kernels: nanotron's Llama runs its own fused kernels (Triton RMSNorm, flash-attn rotary) and a "
                          "Megatron-style vocab-parallel cross-entropy (sharded_cross_entropy), not {k} ones; exported as fused"),
])
def test_fused_engines_warn_other_stacks(engine, runs, warning):
    for k in ("fused", "compiled", "eager"):
        result = export(engine, MODEL, plan(kernels=k, zero=1))
        assert kernel_warnings(result) == ([] if k == runs else [warning.format(k=k)])
        assert parse_text(result.text).plan["kernels"] == "fused"


def test_deepspeed_runs_the_module_eager():
    warned = {k: kernel_warnings(export("deepspeed", MODEL, plan(kernels=k))) for k in ("fused", "compiled", "eager")}
    assert warned["eager"] == []
    assert warned["compiled"] == ["kernels: DeepSpeed's config does not compile the module: call engine.compile() after "
                                  "deepspeed.initialize (the loss compiles with it only when the module's forward computes it); exported as eager"]
    assert warned["fused"] == ["kernels: DeepSpeed runs the PyTorch module it is given: Megatron-Core/Transformer Engine fused "
                               "kernels and a fused vocab-parallel cross-entropy are model code (Megatron-DeepSpeed), not DeepSpeed config; exported as eager"]
    cfg = json.loads(export("deepspeed", MODEL, plan(kernels="compiled")).text)
    assert "compile" not in cfg  # DeepSpeed's compile section holds DeepCompile settings, not an on switch
    parsed = parse_text(json.dumps(cfg))
    assert parsed.plan["kernels"] == "eager"
    assert any(n.startswith("kernels: DeepSpeed runs the module it is given, read as eager") for n in parsed.notes)


def test_canonical_ignores_compile_loss_without_compiled_blocks():
    for k in ("fused", "eager"):
        assert canonical(plan(kernels=k, compile_loss=False)) == canonical(plan(kernels=k))
    assert canonical(plan(kernels="compiled", compile_loss=False)) != canonical(plan(kernels="compiled"))


# ---- meshplan import / estimate --plan -----------------------------------------------------------------


def test_import_prints_the_stack_as_estimate_flags(tmp_path):
    path = tmp_path / "tt.toml"
    toml = TOML.replace("tensor_parallel_degree = 2", "tensor_parallel_degree = 1").replace("shard_degree = 4", "shard_degree = 8")
    path.write_text("[model]\nname = \"llama3\"\nflavor = \"8B\"\n" + toml.replace("[training]", "[training]\nlocal_batch_size = 1")
                    + '[activation_checkpoint]\nmode = "none"\n[compile]\nenable = true\ncomponents = ["model"]\n')
    code, out, err = run_cli("import", str(path))
    assert code == 0, err
    assert "--set kernels=compiled" in out and "--set compile_loss=false" in out
    assert "note: kernels: compile.enable = true, components model read as compiled" in err
    code, out, _ = run_cli("import", str(path), "--json")
    assert json.loads(out)["options"]["kernels"] == "compiled" and json.loads(out)["options"]["compile_loss"] is False
    # estimate --plan estimates the stack the file runs: the same as the flags
    code, from_file, err = run_cli("estimate", "--plan", str(path), "--json")
    assert code == 0, err
    code, from_flags, err = run_cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--zero", "3", "--global-batch", "32",
                                    "--seq-len", "4096", "--recompute", "none", "--set", "kernels=compiled", "--set", "compile_loss=false", "--json")
    assert code == 0, err
    a, b = json.loads(from_file), json.loads(from_flags)
    assert a["plan"]["stack"]["kernels"] == "compiled" and a["plan"]["stack"]["compile_loss"] is False
    assert a == b
    # and the stack read changes the estimate (without TP): the eager loss keeps fp32 logits, the compiled one e-byte ones
    code, compiled_loss, err = run_cli("estimate", "--plan", str(path), "--set", "compile_loss=true", "--json")
    assert code == 0, err
    assert json.loads(compiled_loss)["memory"]["peak_bytes"] < a["memory"]["peak_bytes"]


def test_import_of_megatron_prints_fused(tmp_path):
    path = tmp_path / "args.sh"
    code, _, err = run_cli("export", "--to", "megatron", "--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--seq-len", "4096",
                           "--global-batch", "32", "--set", "kernels=eager", "--out", str(path))
    assert code == 0 and "warning: kernels: Megatron-LM runs" in err
    code, out, err = run_cli("import", str(path))
    # fused is the default stack's (megatron-core): nothing to set
    assert code == 0 and "--set kernels" not in out and "compile_loss" not in out
