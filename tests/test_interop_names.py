"""Golden checks: every flag or key meshplan writes is one the engine defines, as published in its
source (named per engine below), and the settings a plan uses are written where they apply.

Where the engine's own package installs here, ``test_interop_engines.py`` also parses the exports
with the engine's parser; these checks need nothing installed.
"""

from __future__ import annotations

import json
import tomllib

import pytest
import yaml

from meshplan.catalog import load_model
from meshplan.interop import export
from meshplan.interop.common import arg_tokens
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan

from test_interop_roundtrip import GRID, MODELS

# Megatron-LM, megatron/training/arguments.py (NVIDIA/Megatron-LM, main, 2025), functions
# _add_network_size_args, _add_regularization_args, _add_training_args, _add_mixed_precision_args,
# _add_distributed_args, _add_tokenizer_args, _add_data_args, _add_moe_args,
# _add_transformer_engine_args; and torch.distributed.run (torchrun) for --nnodes / --nproc-per-node.
MEGATRON = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
    "--group-query-attention", "--num-query-groups", "--max-position-embeddings", "--position-embedding-type",
    "--normalization", "--swiglu", "--squared-relu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--add-qkv-bias", "--attention-dropout", "--hidden-dropout", "--vocab-size", "--seq-length",
    "--micro-batch-size", "--global-batch-size", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--tp-comm-overlap", "--sequence-parallel", "--optimizer", "--attention-backend",
    "--bf16", "--fp16", "--accumulate-allreduce-grads-in-fp32", "--no-gradient-accumulation-fusion", "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--pipeline-model-parallel-layout", "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank", "--overlap-grad-reduce", "--overlap-param-gather",
    "--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
    "--num-distributed-optimizer-instances", "--context-parallel-size", "--use-tp-pp-dp-mapping",
    "--expert-model-parallel-size", "--fp8-format", "--ckpt-format",
    "--moe-token-dispatcher-type", "--moe-grouped-gemm",  # TransformerConfig's fields, as arguments since 2025
    "--nnodes", "--nproc-per-node",
}
# torchtitan, torchtitan/config/job_config.py (pytorch/torchtitan, JobConfig of v0.2.2): sections
# Model, Training, Parallelism, ActivationCheckpoint, Compile, Quantize (its linear.float8: Float8Linear).
TORCHTITAN = {
    "quantize.linear.float8.enable_fsdp_float8_all_gather", "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
    "quantize.linear.float8.recipe_name",
    "compile.enable", "compile.components",
    "model.name", "model.flavor", "model.converters",
    "training.local_batch_size", "training.global_batch_size", "training.seq_len",
    "training.mixed_precision_param", "training.mixed_precision_reduce",
    "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
    "parallelism.fsdp_reshard_after_forward", "parallelism.tensor_parallel_degree",
    "parallelism.enable_async_tensor_parallel", "parallelism.pipeline_parallel_degree",
    "parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_microbatch_size",
    "parallelism.pipeline_parallel_layers_per_stage", "parallelism.pipeline_parallel_first_stage_less_layers",
    "parallelism.pipeline_parallel_last_stage_less_layers", "parallelism.context_parallel_degree",
    "parallelism.expert_parallel_degree", "parallelism.expert_tensor_parallel_degree",
    "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option",
}
# torchtitan 0.3, torchtitan/config/manager.py (ConfigManager: --module, --config, tyro overrides of
# Trainer.Config; configs.py CompileConfig.enable_async_tensor_parallel, TrainingConfig.disable_cuda_graphs),
# the recompute as the activation-checkpoint:MODE subcommand (not a --name)
TORCHTITAN03 = {n for n in TORCHTITAN if n.split(".")[0] in ("training", "parallelism", "compile")} - {
    "parallelism.enable_async_tensor_parallel", "parallelism.expert_tensor_parallel_degree"} | {
    "module", "config", "training.disable_cuda_graphs", "compile.no-enable", "compile.enable_async_tensor_parallel",
    "compile.no-enable_async_tensor_parallel"}
# torch.distributed.pipelining.schedules.get_schedule_class (torch 2.13): the names torchtitan accepts.
TORCH_SCHEDULES = {"1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}
# DeepSpeed, deepspeed/runtime/config.py and constants.py (train_batch_size,
# train_micro_batch_size_per_gpu, gradient_accumulation_steps, bf16, fp16, data_types.grad_accum_dtype,
# pipeline: get_pipeline_config's stages, activation_checkpoint_interval, pipe_partitioned and
# grad_partitioned, sequence_parallel_size), deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig: stage,
# overlap_comm, stage3_prefetch_bucket_size), deepspeed/runtime/tensor_parallel/config.py
# (TPTrainingConfig: autotp_size, tp_overlap_comm), DeepSpeed 0.19.8.
DEEPSPEED = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16.enabled",
    "fp16.enabled", "data_types.grad_accum_dtype", "zero_optimization.stage", "zero_optimization.overlap_comm",
    "zero_optimization.stage3_prefetch_bucket_size", "tensor_parallel.autotp_size", "tensor_parallel.tp_overlap_comm",
    "pipeline.stages", "pipeline.activation_checkpoint_interval", "pipeline.pipe_partitioned", "pipeline.grad_partitioned",
    "sequence_parallel_size",
}
# nanotron, src/nanotron/config/parallelism_config.py (ParallelismArgs: dp, tp, pp, pp_engine, tp_mode,
# tp_linear_async_communication, recompute_layer; context_parallel_size is never written: the exported
# Llama has no ring attention; nor expert_parallel_size: main cannot start it),
# config.py (TokensArgs, OptimizerArgs: zero_stage, accumulate_grad_in_fp32, optimizer_factory;
# ModelArgs: dtype, model_config), models_config.py (LlamaConfig), huggingface/nanotron main.
NANOTRON = {
    "parallelism.dp", "parallelism.tp", "parallelism.pp", "parallelism.pp_engine", "parallelism.tp_mode",
    "parallelism.tp_linear_async_communication", "parallelism.recompute_layer", "tokens.sequence_length", "tokens.micro_batch_size",
    "tokens.batch_accumulation_per_replica", "optimizer.zero_stage", "optimizer.accumulate_grad_in_fp32",
    "optimizer.optimizer_factory.name", "model.dtype",
    *(f"model.model_config.{k}" for k in (
        "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "max_position_embeddings", "tie_word_embeddings", "hidden_act", "is_llama_config")),
}


# nanotron 0.2 (tag v0.2): ParallelismArgs has expert_parallel_size and recompute_granularity (FLOPs
# logging only, never written), no recompute_layer; OptimizerArgs is AdamW's, no optimizer_factory.
NANOTRON02 = NANOTRON - {"parallelism.recompute_layer", "optimizer.optimizer_factory.name"} | {"parallelism.expert_parallel_size"}


def _paths(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _paths(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def names(engine: str, text: str) -> set[str]:
    if engine == "megatron":
        return {t for t in arg_tokens(text) if t.startswith("--")}
    if engine.startswith("torchtitan") and "toml" not in engine:
        return {t[2:] for t in arg_tokens(text) if t.startswith("--")}
    if engine == "torchtitan-toml":
        return set(_paths(tomllib.loads(text)))
    if engine == "deepspeed":
        return set(_paths(json.loads(text)))
    return set(_paths(yaml.safe_load(text)))


VOCAB = {"megatron": MEGATRON, "torchtitan": TORCHTITAN03, "torchtitan@0.2": TORCHTITAN, "torchtitan-toml": TORCHTITAN,
         "deepspeed": DEEPSPEED, "nanotron": NANOTRON02, "nanotron@0.2": NANOTRON02, "nanotron@main": NANOTRON}


@pytest.mark.parametrize("engine", sorted(VOCAB))
def test_every_written_name_is_the_engines(engine):
    written = set()
    for rows in GRID.values():  # all grids' plans, lossy ones included
        for model_name, p in rows:
            written |= names(engine, export(engine, MODELS[model_name], p).text)
    assert written <= VOCAB[engine], sorted(written - VOCAB[engine])
    assert len(written) >= 0.6 * len(VOCAB[engine])  # and the vocabulary is really used


def test_torchtitan_schedule_names_are_torchs():
    seen = set()
    for model_name, p in GRID["torchtitan"]:
        for t in tomllib.loads(export("torchtitan-toml", MODELS[model_name], p).text).get("parallelism", {}).items():
            if t[0] == "pipeline_parallel_schedule":
                seen.add(t[1])
    assert seen <= TORCH_SCHEDULES and {"1F1B", "Interleaved1F1B", "ZBVZeroBubble", "InterleavedZeroBubble", "GPipe"} <= seen


# a plan that uses every setting the exports write
BIG = TrainingPlan(tp=8, pp=4, dp=4, vpp=2, schedule="interleaved", micro_batch=1, global_batch=256,
                   seq_len=8192, recompute="full", zero=1, precision=PrecisionRecipe(precision="bf16"))


def test_megatron_names_of_the_issue():
    text = export("megatron", load_model("llama3-70b"), BIG).text
    for flag in ("--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 4",
                 "--num-layers-per-virtual-pipeline-stage 10", "--context-parallel-size 1", "--sequence-parallel",
                 "--micro-batch-size 1", "--global-batch-size 256", "--recompute-granularity full",
                 "--recompute-method uniform", "--use-distributed-optimizer", "--num-layers 80", "--hidden-size 8192",
                 "--ffn-hidden-size 28672", "--num-attention-heads 64", "--num-query-groups 8", "--seq-length 8192",
                 "torchrun --nnodes 16 --nproc-per-node 8"):
        assert flag in text, flag


def test_torchtitan_names_of_the_issue():
    text = export("torchtitan", load_model("llama3-70b"), BIG.replace(**{"zero": 3, "fsdp_accumulate_unsharded": True})).text
    for flag in ("--parallelism.tensor_parallel_degree 8", "--parallelism.pipeline_parallel_degree 4",
                 "--parallelism.pipeline_parallel_schedule Interleaved1F1B", "--parallelism.data_parallel_shard_degree 4",
                 "--training.local_batch_size 64", "--training.global_batch_size 256", "--training.seq_len 8192",
                 "activation-checkpoint:full", "--module llama3", "--config llama3_70b", "--training.disable_cuda_graphs"):
        assert flag in text, flag
    text = export("torchtitan@0.2", load_model("llama3-70b"), BIG.replace(**{"zero": 3, "fsdp_accumulate_unsharded": True})).text
    assert "--activation_checkpoint.mode full" in text and "--model.flavor 70B" in text


def test_deepspeed_and_nanotron_names_of_the_issue():
    result = export("deepspeed", load_model("llama3-70b"), BIG)
    ds = json.loads(result.text)
    # with AutoTP, DeepSpeed's batch check counts the TP ranks as data-parallel: the total is left to it
    assert "train_batch_size" not in ds and ds["train_micro_batch_size_per_gpu"] == 1
    assert any("1 x 64 x dp 4 = 256 sequences" in n for n in result.notes)
    assert ds["gradient_accumulation_steps"] == 64 and ds["zero_optimization"]["stage"] == 1
    assert ds["bf16"] == {"enabled": True} and ds["pipeline"]["stages"] == 4 and ds["tensor_parallel"]["autotp_size"] == 8
    nt = yaml.safe_load(export("nanotron@main", load_model("llama3-70b"), BIG).text)
    assert nt["parallelism"]["dp"] == 4 and nt["parallelism"]["tp"] == 8 and nt["parallelism"]["pp"] == 4
    assert nt["parallelism"]["pp_engine"] == "1f1b" and nt["parallelism"]["tp_mode"] == "REDUCE_SCATTER"
    assert nt["tokens"] == {"sequence_length": 8192, "micro_batch_size": 1, "batch_accumulation_per_replica": 64}
    assert nt["optimizer"]["zero_stage"] == 1 and nt["parallelism"]["recompute_layer"] is True
