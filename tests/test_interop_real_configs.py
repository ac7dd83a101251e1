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
    """torchtitan 0.3 has no registry function for Mixtral: its export carries no model, and
    reading it back must not become llama3-8b."""
    path = tmp_path / "tt.sh"
    code, _, err = run_cli("export", "--to", "torchtitan", "--model", "mixtral-8x7b", "--gpus", "8", "--out", str(path))
    assert code == 0 and "warning: model" in err, err
    one_error(*run_cli("estimate", "--plan", str(path)), "error: model:", "give --model")


@pytest.mark.parametrize(("name", "words"), [("deepseek-v3-671b", "--module deepseek_v3 \\\n--config deepseek_v3_671b"),
                                             ("qwen3-30b-a3b", "--module qwen3 \\\n--config qwen3_30b_a3b")])
def test_torchtitan_moe_registry_functions_carry_the_model(name, words, tmp_path):
    """torchtitan's own DeepSeek-V3 671B and Qwen3 30B-A3B registry functions are the catalog's
    models (their parameters counted on torchtitan 0.3.0's modules: 671,026,404,352 and
    30,532,122,624): the export names them and reads back as the same model."""
    path = tmp_path / "tt.sh"
    code, _, err = run_cli("export", "--to", "torchtitan", "--model", name, "--gpus", "64", "--ep", "8", "--zero", "3", "--out", str(path))
    assert code == 0 and "warning: model" not in err, err
    assert words in path.read_text()
    code, out, err = run_cli("estimate", "--plan", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["model"]["name"] == name and json.loads(out)["plan"]["ep"] == 8


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


# ---- Megatron-LM and Megatron-DeepSpeed launch scripts ----------------------------------------

from pathlib import Path  # noqa: E402

from meshplan.interop import megatron  # noqa: E402

ENGINE_CONFIGS = Path(__file__).parent / "data" / "engine_configs"


def _llama3_8b_args(tmp_path) -> str:
    path = tmp_path / "args.sh"
    code, _, err = run_cli("export", "--to", "megatron", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--out", str(path))
    assert code == 0, err
    text = path.read_text()
    assert megatron.parse(text).model.name == "llama3-8b"
    return text


def test_grad_reduce_in_bf16_is_bf16_gradients(tmp_path):
    text = _llama3_8b_args(tmp_path)
    assert megatron.parse(text).plan["precision"]["grad_dtype"] == "fp32"
    assert megatron.parse(text + " --grad-reduce-in-bf16\n").plan["precision"]["grad_dtype"] == "bf16"


def test_legacy_rotary_switch_and_deepspeed_kv_heads_read_llama3_8b(tmp_path):
    """Megatron's pre-2024 --use-rotary-position-embeddings is RoPE (read as learned positions, the
    8B became an unknown 8.57B model); Megatron-DeepSpeed's --num-key-value-heads is GQA."""
    text = _llama3_8b_args(tmp_path)
    legacy = text.replace("--position-embedding-type rope", "--use-rotary-position-embeddings")
    assert legacy != text and megatron.parse(legacy).model.name == "llama3-8b"
    mds = legacy.replace("--group-query-attention", "").replace("--num-query-groups 8", "--num-key-value-heads 8")
    assert "--num-query-groups" not in mds
    model = megatron.parse(mds).model
    assert (model.name, model.n_kv_heads, model.position) == ("llama3-8b", 8, "rope")


def test_megatron_gpt3_175b_example_script_reads_its_variables_and_arrays():
    """Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh (GPUS_PER_NODE=8, arrays passed as
    ${GPT_MODEL_ARGS[@]}): the 175B model, TP 8, PP 16, its batch; its one-node launcher cannot hold
    TP x PP = 128 ranks, which a note says."""
    r = megatron.parse((ENGINE_CONFIGS / "megatron_train_gpt3_175b_distributed.sh").read_text())
    assert r.model.name == "gpt3-175b"
    assert (r.plan["tp"], r.plan["pp"], r.plan["micro_batch"], r.plan["global_batch"], r.plan["seq_len"]) == (8, 16, 1, 1536, 2048)
    assert r.plan["precision"]["precision"] == "fp16" and "dp" not in r.plan
    assert any(n.startswith("dp: the launcher's world size 8") for n in r.notes)
    assert any(n.startswith("global_batch: --rampup-batch-size") for n in r.notes)
    code, out, err = run_cli("estimate", "--plan", str(ENGINE_CONFIGS / "megatron_train_gpt3_175b_distributed.sh"),
                             "--gpus", "1024", "--json")
    assert code == 0, err
    assert json.loads(out)["plan"]["dp"] == 8


def test_megatron_deepspeed_llama2_example_reads_gqa_rope_and_skips_the_untaken_branch():
    """Megatron-DeepSpeed's examples_deepspeed/pretrain_llama2_distributed.sh: TP=2 PP=2 on one
    8-GPU node, GQA with NUM_KV_HEADS=4, RoPE by the legacy switch, ZeRO stage 0 by --zero-stage;
    the recompute flags sit in an `if` branch its activation_checkpoint="false" does not take. The
    tokenizer is a SentencePiece model, so the vocabulary (32,000 for Llama 2) is added."""
    text = (ENGINE_CONFIGS / "megatron_deepspeed_pretrain_llama2_distributed.sh").read_text()
    with pytest.raises(InputError) as e:
        megatron.parse(text)
    assert e.value.field == "vocab-size"
    r = megatron.parse(text + "--vocab-size 32000\n")
    m = r.model
    assert (m.n_layers, m.hidden, m.ffn_hidden, m.n_heads, m.n_kv_heads, m.position, m.mlp, m.norm) == (
        24, 2048, 5504, 16, 4, "rope", "swiglu", "rmsnorm")
    assert not m.tied_embeddings and not m.linear_bias
    p = r.plan
    assert (p["tp"], p["pp"], p["dp"], p["micro_batch"], p["global_batch"], p["zero"], p["recompute"]) == (2, 2, 2, 4, 32, 0, "none")


def test_a_variable_the_script_does_not_set_is_named(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size $TP "
                    "--micro-batch-size 1\n")
    one_error(*run_cli("import", str(path)), "error: tensor-model-parallel-size: is $TP, a shell variable the file does not set")
    path.write_text("TP=4\n" + path.read_text())
    code, out, err = run_cli("import", str(path), "--json")
    assert code == 0 and json.loads(out)["plan"]["tp"] == 4, err


# ---- Megatron-LM exports that pass validate_args --------------------------------------------------


def _megatron_export(tmp_path, *flags: str) -> tuple[str, str]:
    path = tmp_path / "args.sh"
    code, _, err = run_cli("export", "--to", "megatron", *flags, "--out", str(path), "--force")
    assert code == 0, err
    return path.read_text(), err


def test_megatron_fsdp_export_writes_fsdp_dtensor_checkpoints_and_unsets_device_connections(tmp_path):
    """validate_args: "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format" and "FSDP
    requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset"."""
    text, err = _megatron_export(tmp_path, "--model", "llama3-8b", "--gpus", "16", "--zero", "3", "--tp", "2")
    assert "--ckpt-format fsdp_dtensor" in text and "--use-megatron-fsdp" in text
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in text and "CUDA_DEVICE_MAX_CONNECTIONS=1" not in text
    assert "note: CUDA_DEVICE_MAX_CONNECTIONS:" in err
    assert megatron.parse(text).plan["zero"] == 3


def test_megatron_tp_or_cp_export_sets_one_device_connection(tmp_path):
    """validate_args (before Blackwell): "Using tensor model parallelism or context parallelism
    require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"."""
    for flags in (("--tp", "2"), ("--cp", "2", "--seq-len", "8192")):
        text, _ = _megatron_export(tmp_path, "--model", "llama3-8b", "--gpus", "16", "--zero", "1", *flags)
        assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
        assert shell_value(text, "CUDA_DEVICE_MAX_CONNECTIONS") == "1"
    text, _ = _megatron_export(tmp_path, "--model", "llama3-8b", "--gpus", "16", "--zero", "1")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in text  # pure data parallelism: nothing asserted


def shell_value(text: str, name: str) -> str:
    from meshplan.interop import shell

    return shell.assignments(text)[name]


def test_megatron_moe_export_runs_the_all_to_all_meshplan_prices(tmp_path):
    """Megatron-Core's default dispatcher is allgather (TransformerConfig.moe_token_dispatcher_type),
    which gathers every token to every expert rank; meshplan prices the all-to-all one."""
    text, _ = _megatron_export(tmp_path, "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--pp", "4", "--ep", "8")
    assert "--moe-token-dispatcher-type alltoall" in text and "--moe-grouped-gemm" in text
    r = megatron.parse(text)
    assert r.model.name == "mixtral-8x7b" and not any(n.startswith("ep: --moe-token-dispatcher-type") for n in r.notes)
    legacy = megatron.parse(text.replace("--moe-token-dispatcher-type alltoall", ""))
    assert any(n.startswith("ep: --moe-token-dispatcher-type allgather") for n in legacy.notes)


def test_deepspeed_autotp_export_leaves_the_total_to_deepspeed_and_reads_back(tmp_path):
    """DeepSpeedConfig asserts train_batch_size == micro x accumulation x its world size, which counts
    the AutoTP ranks without an mpu (4 != 1 x 4 x 2 on 2 ranks of TP 2): the export leaves the total
    out, and reading it back takes micro x accumulation x dp once --gpus gives dp."""
    path = tmp_path / "ds.json"
    code, _, err = run_cli("export", "--to", "deepspeed", "--model", "llama3-8b", "--gpus", "16", "--tp", "4",
                           "--global-batch", "32", "--out", str(path))
    assert code == 0, err
    cfg = json.loads(path.read_text())
    assert "train_batch_size" not in cfg and (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (1, 8)
    assert "1 x 8 x dp 4 = 32 sequences" in err
    code, out, err = run_cli("estimate", "--plan", str(path), "--model", "llama3-8b", "--gpus", "16", "--tp", "4",
                             "--seq-len", "4096", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["dp"], plan["micro_batch"], plan["global_batch"]) == (4, 1, 32)
