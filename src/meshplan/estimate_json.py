"""The JSON of an estimate: the schema of ``meshplan estimate --json`` (docs/schema.md), one
object with the sections ``model``, ``cluster``, ``plan``, ``flops``, ``memory``, ``time``,
``throughput`` and ``run``. The object is itself a plan file (:mod:`meshplan.interop.meshplan_json`).
"""

from __future__ import annotations

from typing import Any

from meshplan.catalog import stack_overrides
from meshplan.cost.fsdp_copies import runs_fsdp2
from meshplan.cost.memory import state_bytes_per_param

SCHEMA_VERSION = 1


def estimate_json(est) -> dict[str, Any]:
    """``est`` (an :class:`~meshplan.estimate.Estimate`) as the object ``meshplan estimate --json``
    prints (docs/schema.md)."""
    p, m = est.plan, est.model
    stages = []
    for s in est.stages:
        stages.append(
            {
                "rank": s.rank,
                "layers": s.layers,
                "params": s.params,
                "weights": s.weights,
                "gradients": s.gradients,
                "optimizer": s.optimizer,
                "activations": s.activations,
                "other": s.other,
                "total": s.total,
                "peak_inflight_microbatches": s.peak_inflight,
                "activations_detail": dict(s.activation_items),
                "other_detail": dict(s.other_items),
            }
        )
    t = est.time
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {
            "name": m.name,
            "params_total": est.params.total,
            "params_matmul": est.params.matmul,
            "params_per_layer": est.params.layer.total,
            "params_embedding": est.params.embedding + est.params.position_embedding,
            "params_lm_head": est.params.lm_head,
            "n_layers": m.n_layers,
            **({"params_active": est.params.active, "params_active_matmul": est.params.active_matmul,
                "params_per_moe_layer": est.params.moe_layer.total, "n_moe_layers": est.params.n_moe_layers}
               if est.params.moe_layer else {}),
        },
        "cluster": {
            "gpu": est.cluster.gpu.name,
            "num_gpus": est.cluster.num_gpus,
            "gpus_per_node": est.cluster.gpus_per_node,
            "scale_up_bandwidth": est.cluster.scale_up.bandwidth,
            "scale_out_bandwidth": est.cluster.scale_out.bandwidth,
            "pod_size": est.cluster.pod_size,
            "oversubscription": est.cluster.oversubscription,
        },
        "plan": {
            "tp": p.tp,
            "cp": p.cp,
            "pp": p.pp,
            "dp": p.dp,
            "ep": p.ep,
            "vpp": p.vpp,
            "dp_shard": p.dp_shard or p.dp,
            "schedule": p.schedule,
            "micro_batch": p.micro_batch,
            "grad_accum": p.grad_accum,
            "global_batch": p.global_batch,
            "global_batch_tokens": p.tokens_per_step,
            "seq_len": p.seq_len,
            "recompute": p.recompute,
            "recompute_layers": p.recompute_layers,
            "sequence_parallel": p.sequence_parallel,
            "zero": p.zero,
            "precision": p.precision.precision,
            "grad_dtype": p.precision.grad_dtype,
            "master_weights": p.precision.master_weights,
            "grad_fp32_copy": p.precision.grad_fp32_copy,
            "optimizer": p.precision.optimizer,
            "fp8_scaling": p.precision.fp8_scaling,
            "bytes_per_param": sum(state_bytes_per_param(p.precision, runs_fsdp2(p.zero, p.stack.kernels))),
            "attention": p.attention,
            "attention_flops": p.attention_flops,
            "stack": {**p.stack.model_dump(), "overrides": stack_overrides(p.stack, p)},
            "layer_split": list(est.split),
            "rank_order": list(p.rank_order),
        },
        "flops": {
            "model_per_step": est.flops.model,
            "hardware_per_step": est.flops.hardware,
            "breakdown": {
                "dense": est.flops.dense,
                "attention": est.flops.attention,
                "recompute": est.flops.recompute,
            },
        },
        "memory": {
            "peak_bytes": est.peak_bytes,
            "capacity_bytes": est.capacity_bytes,
            "fits": est.fits,
            "headroom_bytes": est.capacity_bytes - est.peak_bytes,
            "worst_stage": max(range(len(est.stages)), key=lambda i: est.stages[i].total),
            "stages": stages,
        },
        "time": {
            "step_s": t.step_s,
            "critical_rank": t.critical_rank,
            "makespan_s": t.makespan_s,
            "bubble_fraction": t.bubble_fraction,
            "bubble_overhead": t.bubble_overhead,
            "breakdown": t.breakdown(),
            "hidden_comm": dict(t.hidden_comm),
            "contention": dict(t.contention),
        },
        "throughput": {
            "tokens_per_s": est.tokens_per_s,
            "tokens_per_s_per_gpu": est.tokens_per_s / p.num_gpus,
            "model_tflops_per_gpu": est.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": est.hardware_tflops_per_gpu,
            "mfu": est.mfu,
            "hfu": est.hfu,
        },
        "run": est.run_cost(),
    }
