"""``meshplan export`` / ``meshplan import`` / ``meshplan estimate --plan FILE``: output streams,
files (never overwritten without --force), and bad input refused in one line with status 2."""

from __future__ import annotations

import json

import pytest

from test_bad_input import run_cli


def one_error(code: int, out: str, err: str, *parts: str) -> str:
    assert code == 2, (code, out, err)
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("error: "), err
    for part in parts:
        assert part in err, (part, err)
    return err


PLAN = ["--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--vpp", "2", "--seq-len", "8192",
        "--global-batch", "64", "--recompute", "full", "--zero", "1"]


@pytest.mark.parametrize("engine", ["torchtitan", "torchtitan-toml", "megatron", "deepspeed", "nanotron"])
def test_export_prints_config_on_stdout_and_warnings_on_stderr(engine, tmp_path):
    code, out, err = run_cli("export", "--to", engine, *PLAN)
    assert code == 0, err
    assert out.strip() and "warning" not in out
    for line in err.splitlines():
        assert line.startswith(("warning: ", "note: ")), line
    if engine == "megatron":
        assert err == ""  # Megatron expresses this plan entirely
    if engine == "torchtitan":  # ZeRO-1 and the FSDP behaviour under PP are named
        assert "warning: zero: torchtitan has no ZeRO-1" in err


def test_export_out_never_overwrites_without_force(tmp_path):
    path = tmp_path / "args.sh"
    code, out, err = run_cli("export", "--to", "megatron", *PLAN, "--out", str(path))
    assert code == 0 and out == "" and path.read_text().startswith("# Megatron-LM")
    path.write_text("mine")
    one_error(*run_cli("export", "--to", "megatron", *PLAN, "--out", str(path)), "error: out:", "exists", "--force")
    assert path.read_text() == "mine"
    code, out, err = run_cli("export", "--to", "megatron", *PLAN, "--out", str(path), "--force")
    assert code == 0 and "--tensor-model-parallel-size 8" in path.read_text()


def test_export_bad_out_and_engine(tmp_path):
    one_error(*run_cli("export", "--to", "megatron", *PLAN, "--out", str(tmp_path)), "error: out:", "directory")
    one_error(*run_cli("export", "--to", "megatron", *PLAN, "--out", str(tmp_path / "no" / "x.sh")), "error: out:", "does not exist")
    one_error(*run_cli("export", "--to", "jax", *PLAN), "error:", "jax")
    one_error(*run_cli("export", *PLAN), "error:", "--to")
    one_error(*run_cli("export", "--to", "megatron", "--tp", "3"), "error: tp:")  # plan errors as in estimate


def _export(tmp_path, engine: str, *extra: str):
    path = tmp_path / {"deepspeed": "ds.json", "nanotron": "nt.yaml", "torchtitan-toml": "tt.toml"}.get(engine.split("@")[0], f"{engine}.sh")
    code, _, err = run_cli("export", "--to", engine, *PLAN, *extra, "--out", str(path))
    assert code == 0, err
    return path


#: flags that make PLAN expressible in each engine: FSDP without PP for torchtitan (its FSDP under PP
#: keeps weights gathered across micro-batches, a setting no flag has) and a stack it runs (compiled
#: blocks with the loss compiled or eager: it has no fused one), 1F1B and ZeRO-0 for nanotron, no
#: recompute for nanotron 0.2 (its Llama has none) and its fp32 gradient accumulator (a pass of its
#: own, ZeRO-0); torch's and nanotron's TP backward, each collective where autograd meets it
TORCH_TP = ["--set", "tp_backward_overlap=false"]
NANOTRON_GRADS = ["--set", "grad_accumulation=buffer"]
EXPRESSIBLE = {"torchtitan": ["--zero", "3", "--pp", "1", "--vpp", "1", "--set", "kernels=compiled", *TORCH_TP],
               "torchtitan-toml": ["--zero", "3", "--pp", "1", "--vpp", "1", "--set", "kernels=compiled", "--set", "compile_loss=false",
                                   *TORCH_TP],
               "megatron": [], "nanotron@main": ["--vpp", "1", "--schedule", "1f1b", "--zero", "0", *TORCH_TP, *NANOTRON_GRADS],
               "nanotron": ["--vpp", "1", "--schedule", "1f1b", "--zero", "0", "--recompute", "none", *TORCH_TP, *NANOTRON_GRADS]}


@pytest.mark.parametrize("engine", sorted(EXPRESSIBLE))
def test_estimate_plan_file_equals_the_flags(engine, tmp_path):
    path = _export(tmp_path, engine, *EXPRESSIBLE[engine])
    code, want, err = run_cli("estimate", *PLAN, *EXPRESSIBLE[engine], "--json")
    assert code == 0, err
    code, got, err = run_cli("estimate", "--plan", str(path), "--json")
    assert code == 0, err
    assert json.loads(got) == json.loads(want)


def test_estimate_plan_file_flags_override(tmp_path):
    path = _export(tmp_path, "megatron")
    code, out, err = run_cli("estimate", "--plan", str(path), "--tp", "4", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert plan["tp"] == 4 and plan["pp"] == 2 and plan["dp"] == 64 // (4 * 2)  # the file's 64 GPUs kept
    assert plan["recompute"] == "full" and plan["vpp"] == 2


def test_estimate_plan_file_without_model_or_seq_len(tmp_path):
    path = _export(tmp_path, "deepspeed", "--pp", "1", "--vpp", "1", "--tp", "1")
    code, out, err = run_cli("estimate", "--plan", str(path), "--model", "llama3-70b", "--seq-len", "8192", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["dp"], plan["global_batch"], plan["zero"], plan["seq_len"]) == (64, 64, 1, 8192)


def test_import_prints_flags_and_json(tmp_path):
    path = _export(tmp_path, "megatron")
    code, out, err = run_cli("import", str(path))
    assert code == 0 and err == ""
    assert out.startswith(f"# megatron config {path}, model llama3-70b")
    for flag in ("--model llama3-70b", "--gpus 64", "--tp 8", "--pp 2", "--vpp 2", "--recompute full", "--zero 1"):
        assert flag in out, flag
    code, out, err = run_cli("import", str(path), "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["format"] == "megatron" and data["model"]["catalog"] == "llama3-70b"
    assert data["plan"]["tp"] == 8 and data["options"]["gpus"] == 64


def test_import_notes_what_the_file_does_not_say(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "train_batch_size": "auto", "zero_optimization": {"stage": 3}}))
    code, out, err = run_cli("import", str(path))
    assert code == 0
    assert "note: dp:" in err and "note: seq_len:" in err and "--zero 3" in out and "--micro-batch 2" in out


BAD = [
    ("missing", None, "error: file: no such file"),
    ("empty.txt", "", "error: file: the file is empty"),
    ("notes.txt", "just some words\n", "error: file: cannot tell the format"),
    ("hf.json", json.dumps({"model_type": "llama"}), "error: file: this is a Hugging Face model config"),
    ("bad.json", "{\"train_batch_size\": ", "error: file: looks like JSON but does not parse"),
    ("twice.sh", "--tensor-model-parallel-size 8 --tensor-model-parallel-size 4\n", "error: tensor-model-parallel-size: given twice"),
    ("both.sh", "--micro-batch-size 1 --bf16 --fp16\n", "error: bf16: --bf16 and --fp16 contradict"),
    ("tp.sh", "--tensor-model-parallel-size eight\n", "error: tensor-model-parallel-size: must be an integer"),
    ("ds.json", json.dumps({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}), "error: train_batch_size:"),
    ("ds2.json", json.dumps({"zero_optimization": {"stage": 5}}), "error: zero_optimization.stage:"),
    ("ds3.json", json.dumps({"train_batch_size": 8, "bf16": {"enabled": True}, "fp16": {"enabled": True}}), "error: bf16.enabled:"),
    ("tt.toml", "[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = \"Fancy\"\n", "error: parallelism.pipeline_parallel_schedule: unsupported value"),
    ("tt.sh", "--parallelism.tensor_parallel_degree 2 --parallelism.tensor_parallel_degree 4\n", "error: parallelism.tensor_parallel_degree: given twice"),
    ("nt.yaml", "parallelism: {dp: 2, tp: 1}\n", "error: parallelism.pp: is required"),
    ("nt2.yaml", "parallelism: {dp: 2, tp: 1, pp: 1}\noptimizer: {zero_stage: 3}\n", "error: optimizer.zero_stage:"),
    ("layout.sh", "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et|tm|L'\n", "error: pipeline-model-parallel-layout:"),
    ("acts.sh", "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --swiglu --squared-relu\n",
     "error: swiglu: and --squared-relu are exclusive"),
    ("geglu.sh", "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 --quick-geglu\n",
     "error: quick-geglu: is not modelled"),
]


@pytest.mark.parametrize(("name", "text", "expect"), BAD, ids=[b[0] for b in BAD])
def test_import_refuses_bad_input_in_one_line(name, text, expect, tmp_path):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    one_error(*run_cli("import", str(path)), expect)
    one_error(*run_cli("estimate", "--plan", str(path)), "error:")


def test_import_refuses_a_directory_a_binary_file_and_an_empty_path(tmp_path):
    one_error(*run_cli("import", str(tmp_path)), f"error: file: {tmp_path} is a directory")
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes([0x80, 0xFF, 0x00, 0xFE]))
    one_error(*run_cli("import", str(binary)), f"error: file: {binary} is not UTF-8 text")
    one_error(*run_cli("estimate", "--plan", str(binary)), "error: plan:", "is not UTF-8 text")
    one_error(*run_cli("import", ""), "error: file: must name a config file")


def test_export_out_must_name_a_file(tmp_path):
    one_error(*run_cli("export", *PLAN, "--to", "megatron", "--out", ""), "error: out: must name a file")
    one_error(*run_cli("export", *PLAN, "--to", "megatron", "--out", str(tmp_path)), "error: out:", "is a directory")


def test_estimate_plan_missing_file_names_the_option(tmp_path):
    one_error(*run_cli("estimate", "--plan", str(tmp_path / "nope.toml")), "error: plan: no such file")


@pytest.mark.parametrize(("engine", "kind"), [("torchtitan-toml", "micro-pipeline"), ("megatron", "userbuffers")])
def test_import_command_keeps_the_tp_overlap_kind(engine, kind, tmp_path):
    """The flags `import` prints estimate what `estimate --plan FILE` does, the TP overlap kind
    included (torchtitan's async TP is the micro-pipeline kind, Megatron's userbuffers)."""
    extra = [*EXPRESSIBLE[engine], "--tp-comm-overlap", "--set", f"tp_overlap_kind={kind}"]
    path = _export(tmp_path, engine, *extra)
    code, out, err = run_cli("import", str(path))
    assert code == 0, err
    command = out.split("\n", 1)[1].split("\n#", 1)[0].strip()
    flags = [w for line in command.replace(" \\\n", "\n").splitlines()[1:] for w in line.split()]
    code, want, err = run_cli("estimate", *flags, "--json")
    assert code == 0, err
    code, got, err = run_cli("estimate", "--plan", str(path), "--json")
    assert code == 0, err
    assert json.loads(want)["plan"]["stack"]["tp_overlap_kind"] == kind
    assert json.loads(want)["time"] == json.loads(got)["time"]
