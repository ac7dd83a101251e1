"""Engines' own example configs read as the engines run them: DeepSpeed JSONs with the Hugging Face
Trainer's ``"auto"`` values and ZeRO-Offload. Each config is written here field for field as the
published examples have it (Hugging Face ``transformers`` docs, "DeepSpeed" page, ZeRO-2/ZeRO-3
examples; DeepSpeed's ``docs/_pages/config-json.md``), not downloaded."""

from __future__ import annotations

import json

import pytest

from meshplan.errors import InputError
from meshplan.interop import deepspeed
from test_interop_cli import one_error
from test_bad_input import run_cli

# The Hugging Face Trainer's ZeRO-2 example config (transformers docs, "ZeRO-2 example"), bf16 variant.
HF_ZERO2 = {
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                          "reduce_scatter": True, "reduce_bucket_size": 2e8, "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def test_bf16_auto_is_read_as_bf16_with_a_note():
    """``"auto"`` is filled from the Trainer's --bf16 flag; read as fp32 it made a 1.5 s step 11.4 s."""
    r = deepspeed.parse_config(HF_ZERO2)
    assert r.plan["precision"]["precision"] == "bf16"
    assert any("bf16.enabled is \"auto\"" in n and "read as bf16" in n for n in r.notes)


def test_fp16_and_bf16_auto_both_read_as_bf16_and_explicit_values_win():
    both = HF_ZERO2 | {"fp16": {"enabled": "auto", "loss_scale": 0}}
    assert deepspeed.parse_config(both).plan["precision"]["precision"] == "bf16"
    fp16_only = {k: v for k, v in both.items() if k != "bf16"}
    assert deepspeed.parse_config(fp16_only).plan["precision"]["precision"] == "fp16"
    explicit = both | {"fp16": {"enabled": True}}
    r = deepspeed.parse_config(explicit)
    assert r.plan["precision"]["precision"] == "fp16" and not any("auto" in n for n in r.notes if n.startswith("precision"))
    assert deepspeed.parse_config(HF_ZERO2 | {"bf16": {"enabled": False}}).plan["precision"]["precision"] == "fp32"


@pytest.mark.parametrize(("zero", "field"), [
    ({"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}, "zero_optimization.offload_optimizer"),
    ({"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}, "zero_optimization.offload_param"),
    ({"stage": 2, "cpu_offload": True}, "zero_optimization.cpu_offload"),  # the pre-0.5 spelling
])
def test_zero_offload_is_refused_by_name(zero, field):
    with pytest.raises(InputError) as e:
        deepspeed.parse_config(HF_ZERO2 | {"zero_optimization": zero})
    assert e.value.field == field and "not modelled" in str(e.value)


def test_offload_to_none_is_no_offload():
    cfg = HF_ZERO2 | {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none"}, "offload_param": {"device": "none"},
                                            "cpu_offload": False}}
    assert deepspeed.parse_config(cfg).plan["zero"] == 3


def test_estimate_plan_refuses_an_offload_config_in_one_line(tmp_path):
    path = tmp_path / "ds_offload.json"
    path.write_text(json.dumps(HF_ZERO2 | {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}))
    one_error(*run_cli("estimate", "--plan", str(path), "--model", "llama3-8b", "--gpus", "8", "--seq-len", "4096",
                       "--global-batch", "8"), "zero_optimization.offload_optimizer", "not modelled")


# ---- a model meshplan does not know is an error naming --model, never llama3-8b -----------------

QWEN3_TOML = """[job]
dump_folder = "./outputs"

[model]
name = "qwen3"
flavor = "32B"

[parallelism]
data_parallel_shard_degree = -1
tensor_parallel_degree = 8

[training]
local_batch_size = 1
seq_len = 4096
"""


@pytest.mark.parametrize(("name", "text", "said"), [
    ("qwen3.toml", QWEN3_TOML, "torchtitan model qwen3 flavor 32B is not in meshplan's catalog"),
    ("ds.json", json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}),
     "a DeepSpeed config does not carry the model"),
])
def test_plan_file_without_a_known_model_needs_model(name, text, said, tmp_path):
    path = tmp_path / name
    path.write_text(text)
    err = one_error(*run_cli("estimate", "--plan", str(path), "--gpus", "64"), "error: model:", said, "give --model")
    assert "(give --model); give" not in err
    code, out, err = run_cli("estimate", "--plan", str(path), "--gpus", "64", "--model", "llama3-70b", "--seq-len", "4096", "--json")
    assert code == 0, err
    assert json.loads(out)["model"]["name"] == "llama3-70b"


def test_a_non_llama_torchtitan_export_reads_back_as_an_error_not_llama3_8b(tmp_path):
    """torchtitan 0.3 has registry functions for Llama 3 only: a Mixtral export carries no model,
    and reading it back must not become llama3-8b."""
    path = tmp_path / "tt.sh"
    code, _, err = run_cli("export", "--to", "torchtitan", "--model", "mixtral-8x7b", "--gpus", "8", "--out", str(path))
    assert code == 0 and "warning: model" in err, err
    one_error(*run_cli("estimate", "--plan", str(path)), "error: model:", "give --model")


# ---- torchtitan's own llama3 TOMLs: no global batch, the shard degree -1 ------------------------

#: torchtitan's train_configs/llama3_405b.toml ("a preset for 128 H100 GPUs"), its training and
#: parallelism sections field for field (0.1 calls the local batch ``batch_size``).
TT_405B = """[model]
name = "llama3"
flavor = "405B"
converters = "float8"

[training]
batch_size = 2
seq_len = 8192
max_norm = 1.0
steps = 3000
compile = true

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
enable_async_tensor_parallel = true
pipeline_parallel_degree = 1
context_parallel_degree = 1

[activation_checkpoint]
mode = 'full'

[float8]
enable_fsdp_float8_all_gather = true
precompute_float8_dynamic_scale_for_fsdp = true
filter_fqns = "output"
"""


def test_torchtitan_405b_toml_on_128_gpus_runs_its_32_sequences(tmp_path):
    """global_batch_size = -1 is local x dp: 2 sequences x 16 data-parallel ranks (128 / TP 8) = 32,
    where meshplan used to plan its own default of about 4M tokens (512 sequences)."""
    path = tmp_path / "llama3_405b.toml"
    path.write_text(TT_405B)
    code, out, err = run_cli("estimate", "--plan", str(path), "--gpus", "128", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["tp"], plan["dp"], plan["micro_batch"], plan["global_batch"], plan["seq_len"]) == (8, 16, 2, 32, 8192)
    code, out, err = run_cli("estimate", "--plan", str(path), "--gpus", "256", "--json")
    assert json.loads(out)["plan"]["global_batch"] == 64  # the batch follows the ranks, as in torchtitan
    code, out, err = run_cli("estimate", "--plan", str(path), "--gpus", "128", "--global-batch", "64", "--json")
    assert json.loads(out)["plan"]["global_batch"] == 64  # a flag still wins


def test_torchtitan_local_batch_is_split_into_pipeline_micro_batches(tmp_path):
    text = TT_405B.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 4\npipeline_parallel_microbatch_size = 1"
                           ).replace("batch_size = 2", "local_batch_size = 8")
    path = tmp_path / "pp.toml"
    path.write_text(text)
    code, out, err = run_cli("estimate", "--plan", str(path), "--gpus", "128", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["pp"], plan["dp"], plan["micro_batch"], plan["global_batch"]) == (4, 4, 1, 32)  # 8 per rank x dp 4
