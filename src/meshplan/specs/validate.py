"""Checks that need the model, the cluster and the plan together. Each failure is one
:class:`~meshplan.errors.InputError` naming the field and the rule."""

from __future__ import annotations

from meshplan.cost.attention import attention_rates
from meshplan.cost.calibration import calibration_for
from meshplan.errors import InputError
from meshplan.pipeline.schedules import rounds_of
from meshplan.pipeline.stages import EMPTY_END_STAGES, layer_split, too_many_stages
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan

#: Most micro-batch chunks (micro-batches per step x pp x vpp) the pipeline event simulation is
#: asked to run: 2**20, about 2 s (benchmarks/bench_pipeline.py runs half of it, p = 64,
#: m = 1,024, v = 8, in under a second). Beyond it a plan is refused, not left to hang.
MAX_PIPELINE_CHUNKS = 1_048_576


def _check_moe(model: ModelSpec, plan: TrainingPlan) -> None:
    """Expert parallelism's rules (:mod:`meshplan.cost.moe`): ep divides E (and dp, checked by the
    plan), experts split by TP, sequence parallelism with tp > 1 (Megatron-Core requires it)."""
    t, ep = plan.tp, plan.ep
    if model.n_experts % ep:
        raise InputError("ep", f"ep ({ep}) must divide the number of experts ({model.n_experts})")
    if model.expert_ffn_hidden % t:
        raise InputError("tp", f"tp ({t}) must divide the expert MLP hidden size ({model.expert_ffn_hidden})")
    if model.shared_expert_ffn_hidden % t:
        raise InputError("tp", f"tp ({t}) must divide the shared expert's MLP hidden size ({model.shared_expert_ffn_hidden})")
    if ep > 1 and plan.dp_shard not in (None, plan.dp):  # a shard group of all dp is plain sharding
        raise InputError("dp_shard", "HSDP (dp_shard) with expert parallelism (ep > 1) is not modelled; use one or the other")
    if ep > 1 and t > 1 and not plan.sequence_parallel:
        raise InputError("sequence_parallel", "expert parallelism with tp > 1 needs sequence parallelism (as in Megatron-Core)")
    if plan.recompute == "op":
        raise InputError("recompute", "op-level selective recompute is modelled for dense layers; use selective or full with a mixture-of-experts model")
    if plan.stack.fsdp_fp8_all_gather:
        raise InputError("fsdp_fp8_all_gather", "FP8 all-gather is modelled for dense models (torchao's Float8Linear blocks); "
                                                "turn it off for a mixture-of-experts model")


def check_plan(model: ModelSpec, cluster: ClusterSpec, plan: TrainingPlan) -> None:
    """Raise on the first rule the plan breaks for this model and cluster."""
    n = plan.num_gpus
    if n != cluster.num_gpus:
        raise InputError(
            "gpus",
            f"tp x cp x pp x dp = {plan.tp} x {plan.cp} x {plan.pp} x {plan.dp} = {n} must equal the GPU count ({cluster.num_gpus})",
        )
    t = plan.tp
    if model.n_heads % t:
        raise InputError("tp", f"tp ({t}) must divide the number of attention heads ({model.n_heads})")
    g = model.n_kv_heads
    if g % t and t % g:
        raise InputError("tp", f"tp ({t}) must divide, or be a multiple of, the number of KV heads ({g})")
    if model.ffn_hidden % t:
        raise InputError("tp", f"tp ({t}) must divide the MLP hidden size ({model.ffn_hidden})")
    stages = plan.pp * plan.vpp
    if stages > model.n_layers + EMPTY_END_STAGES:
        raise too_many_stages(stages, model.n_layers)
    if plan.cp > 1 and plan.seq_len % (2 * plan.cp):
        raise InputError("seq_len", f"seq_len ({plan.seq_len}) must be divisible by 2 x cp ({2 * plan.cp}) for load-balanced causal context parallelism")
    if plan.sequence_parallel and t > 1 and (plan.seq_len // plan.cp) % t:
        raise InputError("seq_len", f"with sequence parallelism seq_len / cp must be divisible by tp ({t})")
    if plan.ep > 1 and not model.is_moe:
        raise InputError("ep", f"ep = {plan.ep} needs a mixture-of-experts model; {model.name} is dense (use ep = 1)")
    if model.is_moe:
        _check_moe(model, plan)
    if model.is_mla and plan.recompute == "op":
        raise InputError("recompute", "op-level selective recompute is modelled for standard attention; use selective or full with MLA")
    if model.position == "learned" and plan.seq_len > model.max_position:
        raise InputError("seq_len", f"seq_len ({plan.seq_len}) exceeds {model.name}'s {model.max_position} learned positions")
    if plan.schedule in ("interleaved", "interleaved-zb"):
        try:
            rounds_of(plan.pp, plan.grad_accum)
        except InputError as exc:
            raise InputError("global_batch", exc.rule) from None
    chunks = plan.grad_accum * plan.pp * plan.vpp
    if chunks > MAX_PIPELINE_CHUNKS:
        raise InputError("global_batch", f"micro-batches per step x pp x vpp = {plan.grad_accum:,} x {plan.pp} x {plan.vpp} = {chunks:,} is more than the pipeline simulation runs ({MAX_PIPELINE_CHUNKS:,}); use a larger micro-batch or a smaller global batch")
    layer_split(model.n_layers, plan.pp, plan.vpp, plan.layer_split)  # raises on a bad user split
    cluster.gpu.peak(plan.precision.compute_dtype)  # raises if the GPU lacks the dtype
    if plan.attention == "flash" and plan.stack.attention_kernel == "cudnn":
        attention_rates(calibration_for(cluster.gpu), "cudnn")  # raises where cuDNN's rates are not measured
