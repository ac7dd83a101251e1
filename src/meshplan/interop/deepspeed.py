"""DeepSpeed: the JSON config (``deepspeed/runtime/config.py``, ``zero/config.py``), and the
settings DeepSpeed takes in code, stated as notes.

Mapping (warnings for what cannot be expressed):

* global_batch, micro_batch, grad_accum → ``train_batch_size``, ``train_micro_batch_size_per_gpu``,
  ``gradient_accumulation_steps`` (DeepSpeed checks train = micro × accumulation × data-parallel
  ranks, so dp is read back from them).
* zero → ``zero_optimization.stage``; overlap_grad_reduce → ``zero_optimization.overlap_comm``;
  ZeRO-3 overlap_param_gather → ``stage3_prefetch_bucket_size`` (0 turns prefetching off). ZeRO-1/2
  gather updated weights after the step, unoverlapped. dp_shard (HSDP; MiCS was removed in 0.19),
  reshard_after_forward = false and fsdp_accumulate_unsharded cannot be expressed.
* precision: ``bf16.enabled`` / ``fp16.enabled``; grad_dtype → ``data_types.grad_accum_dtype``;
  fp8 (Transformer Engine, in code) cannot be expressed.
* tp → ``tensor_parallel.autotp_size`` (AutoTP training), tp_comm_overlap →
  ``tensor_parallel.tp_overlap_comm``; pp → ``pipeline.stages`` — the engine takes the stage count
  from ``PipelineModule(num_stages=…)`` in code, stated in a note; full recompute with pp > 1 →
  ``pipeline.activation_checkpoint_interval = 1``; cp → ``sequence_parallel_size`` (DeepSpeed-Ulysses,
  all-to-all; meshplan models context parallelism as ring attention).
* kernels: DeepSpeed runs the PyTorch module it is given, eager (meshplan's ``eager``, read back
  so); ``torch.compile`` is ``engine.compile()`` in code (the JSON's ``compile`` section holds
  DeepCompile's settings, not an on switch) and Megatron-Core/Transformer Engine fused kernels are
  model code (Megatron-DeepSpeed): compiled and fused warn.
* Cannot be expressed: schedules other than 1F1B (DeepSpeed's pipeline engine runs 1F1B on one
  chunk per rank), a layer split (``PipelineModule(partition_method=…)`` in code), recompute other
  than full under a pipeline, Megatron sequence parallelism, expert parallelism (``MoE(ep_size=…)``
  in code), a rank order other than tp,cp,dp,pp, materialized attention, and the model.
"""

from __future__ import annotations

import json
from typing import Any

from meshplan.bounded_parse import load_json
from meshplan.errors import InputError
from meshplan.interop.common import (
    DEFAULT_RANK_ORDER, Ledger, ParseResult, as_bool, as_int, attention_kernel, choice, dependency_pipeline, fp8_all_gather, fsdp_root_unit,
    grad_accumulation, stage_buffers, tp_backward,
)
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import field_applies

SOURCE = "deepspeedai/DeepSpeed deepspeed/runtime/config.py, deepspeed/runtime/zero/config.py"
DTYPES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def config(model: ModelSpec, plan: TrainingPlan) -> tuple[dict[str, Any], Ledger]:
    led = Ledger()
    p, r = plan, plan.precision
    cfg: dict[str, Any] = {
        "train_batch_size": p.global_batch,
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": p.grad_accum,
    }
    if p.tp > 1 or p.cp > 1:
        # DeepSpeedConfig asserts train_batch_size == micro x accumulation x its world size, which is
        # every rank without an mpu (AutoTP's tutorial path) or the ranks over sequence_parallel_size
        # (Ulysses): the TP ranks count as data-parallel there. Left out, DeepSpeed derives it.
        del cfg["train_batch_size"]
        led.note(f"train_batch_size: left for DeepSpeed to derive (micro x accumulation x its world size, in which "
                 f"{'AutoTP ranks count' if p.tp > 1 else 'the ranks over sequence_parallel_size count'}); the plan's global "
                 f"batch is {p.micro_batch} x {p.grad_accum} x dp {p.dp} = {p.global_batch} sequences")
    if r.precision in ("bf16", "fp8"):
        cfg["bf16"] = {"enabled": True}
        if r.precision == "fp8":
            led.lose("precision.precision", "DeepSpeed's config has no FP8 training (Transformer Engine in code); exported as bf16")
    elif r.precision == "fp16":
        cfg["fp16"] = {"enabled": True}
    cfg["data_types"] = {"grad_accum_dtype": r.grad_dtype}
    if r.precision != "fp32" and not r.master_weights:
        led.lose("precision.master_weights", "DeepSpeed keeps fp32 master weights for bf16/fp16; exported so")
    if r.grad_fp32_copy:
        led.lose("precision.grad_fp32_copy", "DeepSpeed keeps no fp32 copy of low-precision gradients besides grad_accum_dtype")
    if r.optimizer != "adam":
        led.lose("precision.optimizer", "the optimizer is built in code or in the config's optimizer section with a learning rate; not exported")

    zero: dict[str, Any] = {"stage": p.zero}
    if p.zero > 0:
        zero["overlap_comm"] = p.stack.overlap_grad_reduce
    if p.zero == 3 and not p.stack.overlap_param_gather:
        zero["stage3_prefetch_bucket_size"] = 0
    if p.zero in (1, 2) and p.stack.overlap_param_gather and p.dp * p.cp > 1:
        led.lose("overlap_param_gather", f"DeepSpeed ZeRO-{p.zero} all-gathers the updated weights after the optimizer step, not overlapped")
    if p.zero == 0 and not p.stack.overlap_grad_reduce and p.dp * p.cp > 1:
        led.lose("overlap_grad_reduce", "DeepSpeed's ZeRO-0 all-reduce overlap is not a config switch")
    if p.dp_shard is not None and p.dp_shard != p.dp and p.zero > 0:
        led.lose("dp_shard", "DeepSpeed has no hybrid sharding in its config (MiCS was removed in 0.19; ZeRO++ hpZ keeps a second copy instead)")
    if p.zero == 3 and not p.stack.reshard_after_forward:
        led.lose("reshard_after_forward", "DeepSpeed ZeRO-3 releases gathered weights after use; exported so")
    fsdp_root_unit(p, led, "DeepSpeed")
    fp8_all_gather(p, led, "DeepSpeed")
    attention_kernel(p, led, "DeepSpeed (torch's SDPA or flash-attn in the model code)")
    tp_backward(p, led, "DeepSpeed's AutoTP without tp_overlap_comm", native=False)
    grad_accumulation(p, led, "DeepSpeed", native="autograd")
    if p.stack.fsdp_accumulate_unsharded:
        led.lose("fsdp_accumulate_unsharded", "DeepSpeed ZeRO-3 reduce-scatters gradients every micro-batch")
    cfg["zero_optimization"] = zero

    if p.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": p.tp}
        if p.stack.tp_comm_overlap:
            cfg["tensor_parallel"]["tp_overlap_comm"] = True
            if p.stack.tp_overlap_kind != "userbuffers":
                led.lose("tp_overlap_kind", "DeepSpeed has no micro-pipelined TP; exported as its tp_overlap_comm")
        led.note(f"tensor parallelism: tensor_parallel.autotp_size = {p.tp} is DeepSpeed's AutoTP; with Megatron-DeepSpeed set --tensor-model-parallel-size {p.tp} and pass its mpu to deepspeed.initialize")
        if p.sequence_parallel:
            led.lose("sequence_parallel", "DeepSpeed's config has no Megatron sequence parallelism (Megatron-DeepSpeed: --sequence-parallel)")
    if p.pp > 1:
        pipe: dict[str, Any] = {"stages": p.pp}
        if p.recompute == "full":
            pipe["activation_checkpoint_interval"] = 1
        if field_applies("pp_scatter_gather", p.stack, p) and not p.stack.pp_scatter_gather:
            pipe["pipe_partitioned"] = pipe["grad_partitioned"] = False  # whole messages (both default to true)
        cfg["pipeline"] = pipe
        led.note(f"pipeline: build the model as deepspeed.pipe.PipelineModule(layers=..., num_stages={p.pp}) and train with engine.train_batch(); pipeline.stages is stated for reference")
        if p.schedule != "1f1b":
            led.lose("schedule", f"DeepSpeed's pipeline engine runs 1F1B with one chunk per rank; {p.schedule} exported as 1F1B")
        dependency_pipeline(p, led, "DeepSpeed's pipeline engine")
        stage_buffers(p, led, "DeepSpeed", "in-flight")
        if p.layer_split is not None:
            led.lose("layer_split", "the split is PipelineModule(partition_method=...) in code")
    if p.recompute != "none" and not (p.recompute == "full" and p.pp > 1):
        led.lose("recompute", f"DeepSpeed's config switches recompute only for pipelines (pipeline.activation_checkpoint_interval); {p.recompute} recompute is code (deepspeed.checkpointing.checkpoint)")
    if p.cp > 1:
        cfg["sequence_parallel_size"] = p.cp
        led.note(f"context parallelism: sequence_parallel_size = {p.cp} is DeepSpeed-Ulysses (all-to-all of heads); meshplan models ring attention")
    if p.ep > 1:
        led.lose("ep", f"expert parallelism is deepspeed.moe.layer.MoE(ep_size={p.ep}) in code")
    if tuple(p.rank_order) != DEFAULT_RANK_ORDER:
        led.lose("rank_order", "DeepSpeed's topology (pipe, data, model outermost first) is built in code")
    if p.attention != "flash":
        led.lose("attention", "the attention kernel is model code, not DeepSpeed config")
    if p.stack.kernels == "compiled":
        led.lose("kernels", "DeepSpeed's config does not compile the module: call engine.compile() after deepspeed.initialize "
                            "(the loss compiles with it only when the module's forward computes it); exported as eager")
    elif p.stack.kernels == "fused":
        led.lose("kernels", "DeepSpeed runs the PyTorch module it is given: Megatron-Core/Transformer Engine fused kernels and "
                            "a fused vocab-parallel cross-entropy are model code (Megatron-DeepSpeed), not DeepSpeed config; exported as eager")
    led.note(f"model: DeepSpeed's config does not carry the model ({model.name}); it is the module passed to deepspeed.initialize")
    return cfg, led


def export(model: ModelSpec, plan: TrainingPlan, gpus_per_node: int = 8) -> Any:
    cfg, led = config(model, plan)
    led.note(f"launch on {plan.num_gpus:,} GPUs (dp = {plan.dp}): deepspeed --num_gpus {min(gpus_per_node, plan.num_gpus)} --num_nodes {max(1, plan.num_gpus // gpus_per_node)} train.py --deepspeed_config ds_config.json")
    return led.result(json.dumps(cfg, indent=2) + "\n")


def parse_config(cfg: dict[str, Any]) -> ParseResult:
    notes: list[str] = []
    f: dict[str, Any] = {}
    for key in ("tensor_parallel", "pipeline", "zero_optimization", "bf16", "fp16", "data_types"):
        if key in cfg and not isinstance(cfg[key], dict):
            raise InputError(key, "must be a JSON object")
    tp = as_int("tensor_parallel.autotp_size", cfg.get("tensor_parallel", {}).get("autotp_size", 1) or 1)
    stages = cfg.get("pipeline", {}).get("stages", 1)
    pp = 1 if stages == "auto" else as_int("pipeline.stages", stages)
    cp = as_int("sequence_parallel_size", cfg.get("sequence_parallel_size", 1))
    f.update(tp=tp, pp=pp, cp=cp)

    def batch(key: str):
        value = cfg.get(key)
        if value is None or value == "auto":
            return None
        return as_int(key, value)

    train, micro, gas = batch("train_batch_size"), batch("train_micro_batch_size_per_gpu"), batch("gradient_accumulation_steps")
    if micro is not None:
        f["micro_batch"] = micro
    if train is not None:
        f["global_batch"] = train
    options: dict[str, Any] = {}
    if train is None and micro is not None and gas is not None:
        options["micro_batches"] = gas  # DeepSpeed's batch is then micro x accumulation x the data-parallel ranks
    if train is not None and micro is not None and gas is not None:
        if train % (micro * gas):
            raise InputError("train_batch_size", f"{train} is not train_micro_batch_size_per_gpu x gradient_accumulation_steps ({micro} x {gas}) x data-parallel ranks")
        f["dp"] = train // (micro * gas)
    else:
        notes.append("dp: the data-parallel size follows from train_batch_size = micro x accumulation x dp only when all three are numbers (give --gpus or --dp)")

    zero = cfg.get("zero_optimization", {})
    stage = as_int("zero_optimization.stage", zero.get("stage", 0), lo=0)
    if stage > 3:
        raise InputError("zero_optimization.stage", f"must be 0, 1, 2 or 3 (got {stage})")
    f["zero"] = stage
    overlap = zero.get("overlap_comm", stage == 3)  # DeepSpeed's default: on for ZeRO-3
    f["overlap_grad_reduce"] = as_bool("zero_optimization.overlap_comm", overlap) if stage > 0 else True
    prefetch = zero.get("stage3_prefetch_bucket_size", 1)
    f["overlap_param_gather"] = stage == 0 or (stage == 3 and prefetch not in (0, "0"))
    for gone in ("mics_shard_size", "zero_hpz_partition_size"):
        if zero.get(gone, 1) not in (1, -1, None):
            notes.append(f"dp_shard: zero_optimization.{gone} is not read (meshplan's HSDP differs)")

    _refuse_offload(zero)
    prec = _precision(cfg, notes)
    default_grad = "fp32" if prec != "fp16" else "fp16"
    grad = choice("data_types.grad_accum_dtype", cfg.get("data_types", {}).get("grad_accum_dtype") or default_grad, DTYPES)
    f["precision"] = {"precision": prec, "grad_dtype": grad}

    tpc = cfg.get("tensor_parallel", {})
    f["tp_comm_overlap"] = tp > 1 and as_bool("tensor_parallel.tp_overlap_comm", tpc.get("tp_overlap_comm", False))
    f["tp_backward_overlap"] = False  # AutoTP meets each TP collective where autograd does
    pipe_cfg = cfg.get("pipeline", {})
    split = [as_bool(f"pipeline.{k}", pipe_cfg.get(k, True)) for k in ("pipe_partitioned", "grad_partitioned")]
    if split[0] != split[1]:
        notes.append("pp_scatter_gather: pipe_partitioned and grad_partitioned differ; read as "
                     + ("split" if split[0] else "whole") + " messages (the activations')")
    f["pp_scatter_gather"] = split[0]
    f["grad_accumulation"] = "autograd"  # the engine's backward per micro-batch: .grad accumulates by autograd
    f["sequence_parallel"] = tp == 1
    interval = as_int("pipeline.activation_checkpoint_interval", cfg.get("pipeline", {}).get("activation_checkpoint_interval", 0), lo=0)
    f["recompute"] = "full" if (pp > 1 and interval > 0) else "none"
    if interval > 1:
        notes.append(f"recompute: a checkpoint every {interval} layers read as full recompute")
    f.update(schedule="1f1b", vpp=1, ep=1, rank_order=DEFAULT_RANK_ORDER, kernels="eager")
    notes.append("kernels: DeepSpeed runs the module it is given, read as eager (PyTorch eager); give --set kernels=compiled "
                 "after engine.compile(), --set kernels=fused for a Megatron-DeepSpeed model")
    notes.append("seq_len: a DeepSpeed config does not carry the sequence length (give --seq-len)")
    notes.append("model: a DeepSpeed config does not carry the model (give --model)")
    if not any(k in cfg for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization")):
        raise InputError("plan", "no DeepSpeed batch or zero_optimization settings in the JSON")
    return ParseResult("deepspeed", f, None, tuple(notes), options)


#: ZeRO-Offload's keys: the optimizer state (and with ZeRO-3 the parameters) in CPU or NVMe memory,
#: and the Adam step on the CPU (Ren et al. 2021); ``cpu_offload`` is the pre-0.5 spelling.
OFFLOAD_KEYS = ("offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_params")


def _refuse_offload(zero: dict[str, Any]) -> None:
    """One line naming the field when the config offloads to the CPU or NVMe: meshplan prices every
    state in GPU memory and every step on the GPU, so an estimate of the same plan without the
    offload would be a different job (less CPU traffic, more GPU memory), never a silent one."""
    for key in OFFLOAD_KEYS:
        value = zero.get(key)
        device = value.get("device", "none") if isinstance(value, dict) else value
        if device not in (None, False, "none", "None"):
            raise InputError(f"zero_optimization.{key}", "ZeRO-Offload (optimizer state or parameters in CPU/NVMe memory, the "
                             "optimizer step on the CPU) is not modelled; remove it (or set its device to \"none\") to "
                             "estimate the plan with everything on the GPU")


def _precision(cfg: dict[str, Any], notes: list[str]) -> str:
    """The compute precision from ``bf16.enabled`` / ``fp16.enabled``. ``"auto"`` is the Hugging Face
    Trainer's placeholder, filled from its ``--bf16``/``--fp16`` flags when it starts DeepSpeed: read
    as the precision it stands for (bf16 when both are ``"auto"``), with a note, never as fp32."""
    raw = {k: cfg.get(k, {}).get("enabled", False) for k in ("bf16", "fp16")}
    auto = [k for k, v in raw.items() if v == "auto"]
    on = {k: as_bool(f"{k}.enabled", v) for k, v in raw.items() if v != "auto"}
    if on.get("bf16") and on.get("fp16"):
        raise InputError("bf16.enabled", "bf16 and fp16 cannot both be enabled")
    if on.get("bf16") or on.get("fp16"):
        return "bf16" if on.get("bf16") else "fp16"
    if auto:
        prec = "bf16" if "bf16" in auto else "fp16"
        notes.append(f"precision: {prec}.enabled is \"auto\" (the Hugging Face Trainer fills it from --bf16/--fp16); "
                     f"read as {prec} (give --precision to change it)")
        return prec
    return "fp32"


def parse(text: str) -> ParseResult:
    try:
        cfg = load_json(text, "plan")
    except json.JSONDecodeError as exc:
        raise InputError("plan", f"not valid JSON (line {exc.lineno})") from None
    if not isinstance(cfg, dict):
        raise InputError("plan", "a DeepSpeed config must be a JSON object")
    return parse_config(cfg)
