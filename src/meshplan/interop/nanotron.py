"""nanotron: the ``parallelism``, ``tokens`` and ``optimizer`` sections of its YAML config, and the
model shape under ``model.model_config`` (``src/nanotron/config/parallelism_config.py``,
``config.py``, ``models_config.py``). Merge them into a full config (``general``, ``model.init_method``,
the optimizer's learning rate and the data stages are the user's).

Two release lines read different keys (:data:`RELEASES`): nanotron 0.2, the newest release on PyPI
that imports (0.4's package fails on a circular import in ``nanotron.config``) and the bare
``--to nanotron``, and the main branch (``--to nanotron@main``). nanotron's config reader is strict
(dacite, ``strict=True``): a key of the other line stops it.

Mapping (warnings for what cannot be expressed):

* dp, tp, pp → ``parallelism.dp / tp / pp``.
* ep: meshplan's EP ranks lie inside DP; nanotron's ``expert_parallel_size`` is an axis of its
  own. 0.2 → ``dp: dp / ep`` and ``expert_parallel_size: ep`` (the same GPUs and batch split),
  warned: it averages gradients over its dp ranks only, not across the expert-parallel ones. Main
  cannot start expert_parallel_size > 1: written without it, warned (see :func:`_expert_axis`).
* cp: never written. 0.2 has no context parallelism; main's Llama has no ring attention (only its
  Qwen model has), so main would run ``context_parallel_size`` as attention within slices of each
  sequence. The CP ranks are exported as data-parallel ones (dp × cp, the per-replica batch
  divided by cp: same GPUs, same global batch), warned; refused when the batch does not split so.
* schedule: 1f1b → ``pp_engine: 1f1b``, gpipe → ``afab`` (all forward, all backward); no interleaving
  or zero-bubble schedules, no layer split.
* sequence_parallel → ``tp_mode: REDUCE_SCATTER`` (else ``ALL_REDUCE``); tp_comm_overlap →
  ``tp_linear_async_communication``.
* recompute full → main's ``recompute_layer: true`` (``models/llama.py`` checkpoints each decoder
  layer); 0.2's Llama recomputes nothing (its ``recompute_granularity`` only feeds the FLOPs it
  logs), so there full recompute cannot be expressed; selective and op cannot be expressed.
* micro_batch, grad_accum, seq_len → ``tokens.micro_batch_size``, ``batch_accumulation_per_replica``,
  ``sequence_length`` (``train_steps`` is the user's); zero → ``optimizer.zero_stage`` (0 or 1);
  grad_dtype fp32 → ``optimizer.accumulate_grad_in_fp32``; precision → ``model.dtype``; SGD → main's
  ``optimizer.optimizer_factory.name`` (0.2's ``OptimizerArgs`` is AdamW's).
* kernels: nanotron's Llama (``src/nanotron/models/llama.py``) runs Triton RMSNorm, flash-attn's
  rotary and attention kernels and a Megatron-style vocab-parallel cross-entropy
  (``sharded_cross_entropy``), nearest to meshplan's ``fused`` (read back so); compiled and eager
  warn and export as fused.
* Model (Llama family): ``num_hidden_layers, hidden_size, intermediate_size,
  num_attention_heads, num_key_value_heads, vocab_size, max_position_embeddings,
  tie_word_embeddings, hidden_act``; biases, LayerNorm, learned positions and dropout cannot be
  expressed in nanotron's LlamaConfig.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml

from meshplan.bounded_parse import brief, load_yaml
from meshplan.errors import InputError
from meshplan.interop.common import (
    DEFAULT_RANK_ORDER, ExportResult, Ledger, ParseResult, as_bool, as_int, attention_kernel, catalog_match, choice,
    dependency_pipeline, fp8_all_gather, fsdp_root_unit, grad_accumulation, pipeline_messages, stage_buffers, tp_backward,
)
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan

DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
ACT = {"silu": "swiglu", "gelu": "geglu"}


@dataclass(frozen=True)
class Release:
    """What one nanotron line's config dataclasses read and its trainer runs."""

    name: str
    source: str  # where the keys come from, for the export's header
    recompute_layer: bool  # ParallelismArgs.recompute_layer (main) checkpoints each decoder layer; 0.2 has no recompute
    optimizer_factory: bool  # OptimizerArgs.optimizer_factory (main: AdamW or SGD); 0.2's OptimizerArgs is AdamW's
    no_cp: str  # why the exported Llama cannot run context parallelism
    expert_axis: bool  # expert_parallel_size starts as an axis of its own (0.2); main's ParallelContext cannot build it


#: main's Llama has no ring attention (only its Qwen model has, ``models/qwen.py``)
LLAMA_NO_RING = ("nanotron's Llama has no ring attention (src/nanotron/models/llama.py; its Qwen model has one): under "
                 "context_parallel_size its collator gives each CP rank a slice of every sequence (data/clm_collator.py) "
                 "and the Llama attends within that slice")
RELEASES = {
    "0.2": Release("0.2", "huggingface/nanotron v0.2 src/nanotron/config/{parallelism_config,config,models_config}.py",
                   recompute_layer=False, optimizer_factory=False, expert_axis=True,
                   no_cp="nanotron 0.2 has no context parallelism (its ParallelismArgs has no context_parallel_size)"),
    "main": Release("main", "huggingface/nanotron main src/nanotron/config/{parallelism_config,config,models_config}.py",
                    recompute_layer=True, optimizer_factory=True, expert_axis=False, no_cp=LLAMA_NO_RING),
}
#: ``--to nanotron``: the newest release on PyPI that imports (0.4's ``nanotron.config`` does not)
DEFAULT = "0.2"


def sections(model: ModelSpec, plan: TrainingPlan, release: str = DEFAULT) -> tuple[dict[str, Any], Ledger]:
    """The config sections of ``plan`` for nanotron ``release`` (a key of :data:`RELEASES`) and
    what they could not express."""
    led, rel = Ledger(), RELEASES[release]
    dp, micro, accum = _cp_as_dp(plan, rel, led)
    par = {"dp": dp, **_parallelism(plan, rel, led), **_expert_axis(plan, rel, led, dp)}
    tokens = {"sequence_length": plan.seq_len, "micro_batch_size": micro, "batch_accumulation_per_replica": accum}
    return {"model": _model_section(model, plan, led), "parallelism": par, "tokens": tokens,
            "optimizer": _optimizer(plan, rel, led)}, led


def _cp_as_dp(p: TrainingPlan, rel: Release, led: Ledger) -> tuple[int, int, int]:
    """``(dp, micro_batch_size, batch_accumulation_per_replica)``: the plan's own, or with its CP
    ranks as data-parallel ones, which the exported Llama runs as the same job (same GPUs, same
    global batch, whole sequences on each rank): written with context_parallel_size it would
    attend within slices of the sequences. Refused when the global batch does not split over
    dp x cp replicas."""
    if p.cp == 1:
        return p.dp, p.micro_batch, p.grad_accum
    per_replica, left = divmod(p.micro_batch * p.grad_accum, p.cp)
    if left:
        raise InputError("cp", f"{rel.no_cp}; the CP ranks cannot run as data-parallel ones either: the global batch "
                               f"({p.global_batch}) is not a multiple of dp x cp ({p.dp * p.cp}); plan with cp 1 for nanotron")
    micro = math.gcd(p.micro_batch, per_replica)
    led.lose("cp", f"{rel.no_cp}; exported with the {p.cp} CP ranks as data-parallel ones (dp {p.dp * p.cp}, micro_batch_size "
                   f"{micro}, batch_accumulation_per_replica {per_replica // micro}): the same GPUs and global batch, whole "
                   "sequences on each rank")
    return p.dp * p.cp, micro, per_replica // micro


def _expert_axis(p: TrainingPlan, rel: Release, led: Ledger, dp: int) -> dict[str, Any]:
    """``dp`` and ``expert_parallel_size`` for the plan's ``dp`` data-parallel ranks (its CP ranks
    among them), ep of which split the experts. meshplan's EP groups lie inside DP; nanotron's
    expert_parallel_size is an axis of its own: 0.2's ParallelContext takes dp x tp x pp x
    expert_parallel_size ranks (``src/nanotron/parallel/context.py``) and its dataloader splits the
    batch over dp x expert_parallel_size of them (``src/nanotron/dataloader.py``), so dp / ep and
    ep are the same GPUs and batch split; its gradients are averaged over dp_pg only
    (``trainer.py``'s DistributedDataParallel and ZeRO), never across the EP ranks, which is warned.
    Main asserts tp x pp x cp x dp = world size while its rank grid has the expert axis too, so
    ep > 1 cannot start there: written without it."""
    if p.ep == 1:
        return {}
    if not rel.expert_axis:
        led.lose("ep", f"nanotron {rel.name}'s ParallelContext asserts tp x pp x cp x dp = world size yet lays the ranks out "
                       "on an expert axis too (src/nanotron/parallel/context.py): expert_parallel_size > 1 cannot start; "
                       "exported without expert parallelism")
        return {}
    led.lose("ep", f"nanotron {rel.name} runs expert_parallel_size as an axis of its own, outermost (src/nanotron/parallel/"
                   f"context.py: dp x tp x pp x expert_parallel_size ranks), and splits the batch over dp x expert_parallel_size "
                   f"ranks (dataloader.py): written as dp {dp // p.ep} with expert_parallel_size {p.ep}, the same GPUs and "
                   "batch split, but it averages gradients over dp_pg only (trainer.py), not across the expert-parallel "
                   "ranks: the weights outside the experts are not averaged over all data-parallel ranks")
    return {"dp": dp // p.ep, "expert_parallel_size": p.ep}


def _parallelism(p: TrainingPlan, rel: Release, led: Ledger) -> dict[str, Any]:
    """``parallelism`` but ``dp``: the other axes, the pipeline engine, the TP mode and the recompute."""
    par: dict[str, Any] = {"tp": p.tp, "pp": p.pp}
    if p.schedule == "gpipe":
        par["pp_engine"] = "afab"
    else:
        par["pp_engine"] = "1f1b"
        if p.schedule != "1f1b":
            led.lose("schedule", f"nanotron runs 1f1b or afab (GPipe) on one chunk per rank; {p.schedule} exported as 1f1b")
    dependency_pipeline(p, led, "nanotron")
    fsdp_root_unit(p, led, "nanotron")
    fp8_all_gather(p, led, "nanotron")
    attention_kernel(p, led, "nanotron")
    tp_backward(p, led, "nanotron without tp_linear_async_communication", native=False)
    pipeline_messages(p, led, "nanotron", native=False)
    # accumulate_grad_in_fp32 (the fp32 gradients') adds each micro-batch's gradients into an fp32 buffer
    grad_accumulation(p, led, "nanotron", native="buffer" if p.precision.grad_dtype == "fp32" else "autograd")
    stage_buffers(p, led, "nanotron", "in-flight")
    if p.layer_split is not None:
        led.lose("layer_split", "nanotron splits layers by its own cost estimate; not exported")
    par["tp_mode"] = "REDUCE_SCATTER" if (p.sequence_parallel and p.tp > 1) else "ALL_REDUCE"
    par["tp_linear_async_communication"] = bool(p.stack.tp_comm_overlap and p.tp > 1)
    if p.stack.tp_comm_overlap and p.tp > 1 and p.stack.tp_overlap_kind != "userbuffers":
        led.lose("tp_overlap_kind", "nanotron has no micro-pipelined TP; exported as tp_linear_async_communication")
    if p.recompute == "full" and rel.recompute_layer:
        par["recompute_layer"] = True
    elif p.recompute != "none" and rel.recompute_layer:
        led.lose("recompute", f"nanotron recomputes whole layers (recompute_layer) or nothing; {p.recompute} exported as none")
    elif p.recompute != "none":
        led.lose("recompute", f"nanotron {rel.name}'s Llama recomputes nothing (its recompute_granularity only changes the FLOPs "
                              f"it logs, models/llama.py get_flops; recompute_layer is main's); {p.recompute} exported as none")
    if tuple(p.rank_order) != DEFAULT_RANK_ORDER:
        led.lose("rank_order", "nanotron's ParallelContext orders ranks tp, cp, dp, pp (innermost first)")
    return par


def _optimizer(p: TrainingPlan, rel: Release, led: Ledger) -> dict[str, Any]:
    """``optimizer``: ZeRO stage, gradient accumulation dtype and (main) the optimizer; the
    precision settings nanotron has no key for are warned here."""
    r = p.precision
    opt: dict[str, Any] = {"zero_stage": min(p.zero, 1), "accumulate_grad_in_fp32": r.grad_dtype == "fp32"}
    if p.zero > 1:
        led.lose("zero", f"nanotron has ZeRO-0 and ZeRO-1 only; ZeRO-{p.zero} exported as 1")
    if p.dp_shard is not None and p.dp_shard != p.dp and p.zero > 0:
        led.lose("dp_shard", "nanotron shards optimizer state over all DP ranks")
    if r.optimizer == "sgd" and rel.optimizer_factory:
        opt["optimizer_factory"] = {"name": "sgd"}
    elif r.optimizer == "sgd":
        led.lose("precision.optimizer", f"nanotron {rel.name}'s OptimizerArgs is AdamW's (optimizer_factory is main's); exported as AdamW")
    if r.precision == "fp8":
        led.lose("precision.precision", "nanotron's FP8 path is experimental and not in these sections; exported as bfloat16")
    if r.grad_dtype not in ("fp32", "bf16" if r.precision != "fp16" else "fp16"):
        led.lose("precision.grad_dtype", "nanotron accumulates gradients in fp32 or in the model dtype")
    if r.grad_fp32_copy:
        led.lose("precision.grad_fp32_copy", "nanotron keeps no separate fp32 gradient copy")
    if not r.master_weights and r.precision != "fp32":
        led.lose("precision.master_weights", "nanotron's optimizer keeps fp32 master weights for bf16 models")
    if p.dp * p.cp > 1 and not p.stack.overlap_grad_reduce:
        led.lose("overlap_grad_reduce", "nanotron overlaps the gradient all-reduce with the backward (DDP buckets)")
    if p.zero == 1 and p.dp * p.cp > 1 and p.stack.overlap_param_gather:
        led.lose("overlap_param_gather", "nanotron's ZeRO-1 all-gathers the updated weights after the optimizer step, not overlapped")
    if p.zero == 3 and not p.stack.reshard_after_forward or p.stack.fsdp_accumulate_unsharded:
        led.lose("reshard_after_forward", "nanotron has no ZeRO-3")
    return opt


def _model_section(model: ModelSpec, p: TrainingPlan, led: Ledger) -> dict[str, Any]:
    """``model``: the dtype and nanotron's LlamaConfig of ``model``; the attention and kernels the
    Llama runs are warned here."""
    if p.attention != "flash":
        led.lose("attention", "nanotron's Llama runs flash attention")
    if p.stack.kernels != "fused":
        led.lose("kernels", "nanotron's Llama runs its own fused kernels (Triton RMSNorm, flash-attn rotary) and a Megatron-style "
                            f"vocab-parallel cross-entropy (sharded_cross_entropy), not {p.stack.kernels} ones; exported as fused")
    mc = {
        "num_hidden_layers": model.n_layers, "hidden_size": model.hidden, "intermediate_size": model.ffn_hidden,
        "num_attention_heads": model.n_heads, "num_key_value_heads": model.n_kv_heads,
        "vocab_size": model.vocab_size, "max_position_embeddings": model.max_position,
        "tie_word_embeddings": model.tied_embeddings, "hidden_act": "silu",
        "is_llama_config": True,
    }
    if model.mlp != "swiglu":
        led.lose("model.mlp", f"nanotron's LlamaConfig has gated MLPs with SiLU; {model.mlp} exported as SwiGLU")
    for name, ok in (("norm", model.norm == "rmsnorm"), ("position", model.position == "rope"),
                     ("qkv_bias", not model.qkv_bias), ("linear_bias", not model.linear_bias),
                     ("parallel_residual", not model.parallel_residual), ("dropout", not model.dropout)):
        if not ok:
            led.lose(f"model.{name}", "nanotron's LlamaConfig cannot express it (RMSNorm, RoPE, no biases, no dropout)")
    if model.head_dim * model.n_heads != model.hidden:
        led.lose("model.head_dim", "nanotron's LlamaConfig has head_dim = hidden_size / num_attention_heads")
    for name, ok, what in (
        ("n_experts", not model.is_moe, "experts (a mixture-of-experts MLP); the dense MLP of intermediate_size is exported"),
        ("kv_lora_rank", not model.is_mla, "multi-latent attention; exported as multi-head attention"),
        ("qk_norm", not model.qk_norm, "query/key norms; exported without them"),
        ("norms_per_layer", model.norms_per_layer == 2, "post-attention / post-MLP norms; exported without them"),
    ):
        if not ok:
            led.lose(f"model.{name}", f"nanotron's LlamaConfig has no {what}")
    return {"dtype": {"fp32": "float32", "fp16": "float16"}.get(p.precision.precision, "bfloat16"), "model_config": mc}


def export(model: ModelSpec, plan: TrainingPlan, gpus_per_node: int = 8, release: str = DEFAULT) -> ExportResult:
    """The YAML sections of ``plan`` for nanotron ``release``, to merge into a full config."""
    secs, led = sections(model, plan, release)
    head = (f"# nanotron {release} config sections ({RELEASES[release].source}), written by meshplan for {model.name} "
            f"on {plan.num_gpus:,} GPUs.\n"
            "# Merge into a full config: general, model.init_method, optimizer learning rate and data stages, tokens.train_steps.\n")
    return led.result(head + yaml.safe_dump(secs, sort_keys=False))


def parse_sections(d: dict[str, Any]) -> ParseResult:
    notes: list[str] = []
    par, tok, opt, mdl = (d.get(k) or {} for k in ("parallelism", "tokens", "optimizer", "model"))
    for name, sec in (("parallelism", par), ("tokens", tok), ("optimizer", opt), ("model", mdl)):
        if not isinstance(sec, dict):
            raise InputError(name, "must be a mapping")
    if not par:
        raise InputError("parallelism", "a nanotron config needs its parallelism section (dp, tp, pp)")
    f = _axes(par, mdl.get("model_config"), notes)
    tp = f["tp"]
    engine = str(par.get("pp_engine") or "afab")
    f["schedule"] = choice("parallelism.pp_engine", engine, {"1f1b": "1f1b", "afab": "gpipe"})
    f["vpp"] = 1
    mode = str(par.get("tp_mode") or "ALL_REDUCE")
    f["sequence_parallel"] = choice("parallelism.tp_mode", mode, {"ALL_REDUCE": False, "REDUCE_SCATTER": True}) or tp == 1
    f["tp_comm_overlap"] = tp > 1 and as_bool("parallelism.tp_linear_async_communication", par.get("tp_linear_async_communication") or False)
    f["tp_backward_overlap"] = False  # without the async linears, each TP collective where autograd meets it
    f["pp_scatter_gather"] = False  # P2P.send_tensors: whole tensors
    f["recompute"] = _recompute(par, notes)

    if tok:
        if "sequence_length" in tok:
            f["seq_len"] = as_int("tokens.sequence_length", tok["sequence_length"])
        b = as_int("tokens.micro_batch_size", tok.get("micro_batch_size", 1))
        m = as_int("tokens.batch_accumulation_per_replica", tok.get("batch_accumulation_per_replica", 1))
        f["micro_batch"] = b
        f["global_batch"] = b * m * f["dp"]
    zero = as_int("optimizer.zero_stage", opt.get("zero_stage", 0), lo=0)
    if zero > 1:
        raise InputError("optimizer.zero_stage", f"nanotron has ZeRO-0 and ZeRO-1 (got {zero})")
    f["zero"] = zero
    dtype = DTYPES.get(str(mdl.get("dtype", "bfloat16")).replace("torch.", ""))
    if dtype is None:
        raise InputError("model.dtype", f"unsupported value {brief(mdl.get('dtype'))} (one of {', '.join(DTYPES)})")
    fp32_grads = as_bool("optimizer.accumulate_grad_in_fp32", opt.get("accumulate_grad_in_fp32", True))
    prec: dict[str, Any] = {"precision": dtype, "grad_dtype": "fp32" if (fp32_grads or dtype == "fp32") else dtype}
    factory = opt.get("optimizer_factory")
    if isinstance(factory, dict) and factory.get("name") is not None:
        prec["optimizer"] = choice("optimizer.optimizer_factory.name", factory["name"], {"adamW": "adam", "adam": "adam", "sgd": "sgd"})
    f["precision"] = prec
    f["grad_accumulation"] = "buffer" if prec["grad_dtype"] == "fp32" else "autograd"  # FP32GradientAccumulator or .grad
    f.update(rank_order=DEFAULT_RANK_ORDER, overlap_grad_reduce=True, overlap_param_gather=zero == 0, kernels="fused")
    model = _model(mdl.get("model_config")) if mdl.get("model_config") else None
    return ParseResult("nanotron", f, model, tuple(notes))


def _recompute(par: dict[str, Any], notes: list[str]) -> str:
    """The recompute a ``parallelism`` section runs: main's ``recompute_layer`` checkpoints each
    decoder layer (full); 0.2's ``recompute_granularity`` is passed only to ``get_flops``
    (``src/nanotron/models/llama.py``, the FLOPs it logs) and its Llama recomputes nothing: none,
    noted. A section with both keys is no release's (each strict reader refuses the other's)."""
    full = as_bool("parallelism.recompute_layer", par.get("recompute_layer", False))
    gran = par.get("recompute_granularity")
    if gran is None:
        return "full" if full else "none"
    if "recompute_layer" in par:
        raise InputError("parallelism.recompute_granularity", "is nanotron 0.2's key and recompute_layer main's: "
                                                              "no release reads both")
    choice("parallelism.recompute_granularity", gran, {"full": "full", "selective": "selective"})
    notes.append(f"parallelism.recompute_granularity: nanotron 0.2 passes it only to the FLOPs it logs (get_flops, "
                 f"src/nanotron/models/llama.py) and its Llama recomputes nothing: {gran} read as recompute none")
    return "none"


#: keys of main's ParallelismArgs that 0.2's lacks
MAIN_KEYS = ("recompute_layer", "tp_recompute_allgather", "context_parallel_size")


def _axes(par: dict[str, Any], mc: Any, notes: list[str]) -> dict[str, Any]:
    """dp, tp, pp, cp and ep of a ``parallelism`` section as meshplan's plan has them: nanotron's
    expert_parallel_size ranks are an axis of their own (``src/nanotron/parallel/context.py``: dp x
    tp x pp x expert_parallel_size GPUs), meshplan's EP groups lie inside DP, so dp x ep data-parallel
    ranks with ep inside (nanotron 0.2's dataloader splits the batch over them all)."""
    f: dict[str, Any] = {}
    for k in ("dp", "tp", "pp"):
        if k not in par:
            raise InputError(f"parallelism.{k}", "is required")
        f[k] = as_int(f"parallelism.{k}", par[k])
    f["cp"] = as_int("parallelism.context_parallel_size", par.get("context_parallel_size", 1))
    if f["cp"] > 1 and not (isinstance(mc, dict) and mc.get("is_qwen2_config")):
        notes.append(f"parallelism.context_parallel_size: {LLAMA_NO_RING}; read as cp {f['cp']}, which meshplan prices as "
                     "ring attention over whole sequences")
    f["ep"] = ep = as_int("parallelism.expert_parallel_size", par.get("expert_parallel_size", 1))
    if ep > 1:
        main = any(k in par for k in MAIN_KEYS)
        notes.append(f"parallelism.expert_parallel_size: nanotron runs it as an axis of its own, on dp x tp x pp x "
                     f"expert_parallel_size GPUs (src/nanotron/parallel/context.py); read as dp {f['dp'] * ep} with ep {ep} "
                     f"inside it, the batch split over all {f['dp'] * ep} as nanotron 0.2's dataloader does (0.3 to 0.5 give "
                     "the expert-parallel ranks of a data-parallel rank the same micro-batches); nanotron averages gradients "
                     "over its dp ranks only, not across the expert-parallel ones"
                     + ("; nanotron main cannot start it (its ParallelContext asserts tp x pp x cp x dp = world size)" if main else ""))
        f["dp"] *= ep
    return f


def _model(mc: Any) -> ModelSpec:
    if not isinstance(mc, dict):
        raise InputError("model.model_config", "must be a mapping")
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    for k in need:
        if k not in mc:
            raise InputError(f"model.model_config.{k}", "is required")
    h, a = as_int("model.model_config.hidden_size", mc["hidden_size"]), as_int("model.model_config.num_attention_heads", mc["num_attention_heads"])
    if h % a:
        raise InputError("model.model_config.hidden_size", f"{h} is not a multiple of {a} heads")
    shape: dict[str, Any] = dict(
        n_layers=as_int("model.model_config.num_hidden_layers", mc["num_hidden_layers"]), hidden=h, n_heads=a,
        n_kv_heads=as_int("model.model_config.num_key_value_heads", mc.get("num_key_value_heads") or a), head_dim=h // a,
        ffn_hidden=as_int("model.model_config.intermediate_size", mc["intermediate_size"]),
        vocab_size=as_int("model.model_config.vocab_size", mc["vocab_size"]),
        max_position=as_int("model.model_config.max_position_embeddings", mc.get("max_position_embeddings", 2048)),
        mlp=choice("model.model_config.hidden_act", str(mc.get("hidden_act", "silu")), ACT), norm="rmsnorm", position="rope",
        tied_embeddings=as_bool("model.model_config.tie_word_embeddings", mc.get("tie_word_embeddings", False)),
        source="nanotron model_config",
    )
    spec = ModelSpec.build(where="model.model_config", name="nanotron-model", **{**shape, **_experts(mc)})
    name = catalog_match(spec)
    return spec.model_copy(update={"name": name}) if name else spec


def _experts(mc: dict[str, Any]) -> dict[str, Any]:
    """The expert fields of a LlaMoEConfig (nanotron's ``examples/moe/config_llamoe.py``:
    ``moe_num_experts``, ``num_experts_per_tok``), none for a LlamaConfig. Its experts
    (``examples/moe/moe.py``) are MLPs of intermediate_size with a tanh GELU and no gate, whatever
    hidden_act says."""
    if "moe_num_experts" not in mc:
        return {}
    return {"n_experts": as_int("model.model_config.moe_num_experts", mc["moe_num_experts"]),
            "experts_per_token": as_int("model.model_config.num_experts_per_tok", mc.get("num_experts_per_tok", 1)),
            "expert_ffn_hidden": as_int("model.model_config.intermediate_size", mc["intermediate_size"]),
            "mlp": "gelu", "source": "nanotron LlaMoEConfig (examples/moe)"}


def parse(text: str) -> ParseResult:
    try:
        data = load_yaml(text, "plan")
    except yaml.YAMLError:
        raise InputError("plan", "not valid YAML") from None
    if not isinstance(data, dict):
        raise InputError("plan", "a nanotron config must be a YAML mapping")
    return parse_sections(data)
