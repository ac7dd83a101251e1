"""Estimate one training plan: memory per pipeline stage, FLOPs, step time and its breakdown,
throughput, MFU, and the cost of a token budget.

This is the one place where the cost modules are composed; the CLI, JSON output and tests read
the :class:`Estimate` it returns (``to_dict`` gives the documented JSON schema).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from meshplan.catalog import stack_overrides
from meshplan.cost import collectives as coll
from meshplan.cost.activations import (
    embedding_activation_bytes,
    freed_logits_block_bytes,
    head_activation_bytes,
    held_logits_bytes,
    layer_activations,
    logits_output_bytes,
    loss_grad_bytes,
    saved_gemm_input_bytes,
)
from meshplan.cost.async_tp import micro_pipeline_tp_times
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.contention import NCCL_CTAS, contention_time, sm_share, tp_overlap_ctas
from meshplan.cost.fsdp_copies import fp8_gather_saving, fsdp2_step_copy_times, fsdp2_unit_copy_times, gather_pool_bytes, runs_fsdp2
from meshplan.cost.comm import dp_sync_times, fsdp_unit_times, plan_placements, tp_collective_time
from meshplan.cost.cp_exchange import cp_exchange_collectives
from meshplan.cost.compose import (
    after_pipeline,
    hidden_comm,
    kept_outputs_bytes,
    layer_times,
    merged_outputs_items,
    pp_buffer_messages,
    rank_other_items,
    stage_activations,
    stage_times,
    total_of,
)
from meshplan.cost.compute import (
    ATTENTION_KERNEL_NAMES,
    OpTimes,
    attention_kernel_of,
    attention_rates,
    embedding_op_times,
    head_op_times,
    layer_op_times,
    optimizer_step_time,
    recompute_time,
)
from meshplan.cost.flops import StepFlops, step_flops
from meshplan.cost.memory import ModelState, StageMemory, model_state_bytes, state_bytes_per_param
from meshplan.cost.moe import (
    add_moe_layers,
    alltoall_times,
    expert_dp_placements,
    expert_placements,
    expert_shard_degree,
    expert_tp_time,
    moe_fsdp_layer_times,
    moe_layers_per_stage,
    rank_expert_params,
)
from meshplan.cost.params import (
    ParamCounts,
    count_params,
    embedding_params_per_rank,
    head_params_per_rank,
    largest_layer_params,
    layer_params_per_rank,
    rank_params,
)
from meshplan.explain import Derivation
from meshplan.pipeline.inflight import last_stage_live_peaks, state_rows
from meshplan.pipeline.lockstep import runs_lockstep, runtime_words
from meshplan.pipeline.schedules import compile_schedule, stage_style
from meshplan.pipeline.simulate import SimResult, simulate
from meshplan.pipeline.stages import layer_split, stages_of_rank
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.validate import check_plan
from meshplan.units import DAY, HOUR, TFLOPS, fmt_bytes, fmt_seconds

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Budget:
    """What a whole run costs: ``tokens`` to train on, ``price_per_gpu_hour`` in dollars, and the
    data-centre ``pue`` applied to GPU board power (1.0 = GPUs only)."""

    tokens: Optional[float] = None
    price_per_gpu_hour: Optional[float] = None
    pue: float = 1.0

    def __post_init__(self) -> None:
        import math

        from meshplan.errors import InputError

        def bad(x) -> bool:
            return isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)

        if self.tokens is not None and (bad(self.tokens) or self.tokens < 0):
            raise InputError("tokens", f"must be a finite number of tokens >= 0 (got {self.tokens!r})")
        if self.price_per_gpu_hour is not None and (bad(self.price_per_gpu_hour) or self.price_per_gpu_hour < 0):
            raise InputError("price", f"must be a finite price >= 0 per GPU-hour (got {self.price_per_gpu_hour!r})")
        if bad(self.pue) or not 1.0 <= self.pue <= 10.0:
            raise InputError("pue", f"must be a finite number between 1 and 10 (got {self.pue!r})")


@dataclass
class StepTime:
    """Step time of the critical pipeline rank and where it goes (seconds; the parts add up)."""

    step_s: float
    critical_rank: int
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    fsdp_comm_s: float
    pipeline_bubble_s: float
    dp_comm_s: float
    optimizer_s: float
    param_gather_s: float
    makespan_s: float
    bubble_fraction: float
    bubble_overhead: float
    per_rank_finish_s: tuple[float, ...]
    ep_comm_s: Optional[float] = None  # MoE models: exposed expert-parallel all-to-all
    # FP8 on Megatron-Core: the weights' casts on the step's first micro-batch, all L layers'
    # (meshplan.cost.compute.fp8_weight_cast_per_step)
    fp8_weight_cast_s: Optional[float] = None
    # communication that runs concurrently with compute on the critical rank, seconds per step by
    # kind (tp, cp, fsdp, dp_grad, param_gather): not part of the step, which it overlaps
    hidden_comm: dict[str, float] = field(default_factory=dict)
    # compute slowed by those collectives' SMs (meshplan.cost.contention), seconds per step on the
    # critical rank by the same kinds: tp, cp and fsdp inside compute_s; dp_grad inside dp_comm_s
    # and param_gather inside param_gather_s (the pipeline's clock ends before them)
    contention: dict[str, float] = field(default_factory=dict)

    @property
    def contention_s(self) -> float:
        return sum(self.contention.values())

    def breakdown(self) -> dict[str, float]:
        out = {
            "compute": self.compute_s - self.recompute_s,
            "recompute": self.recompute_s,
            "tp_comm": self.tp_comm_s,
            "cp_comm": self.cp_comm_s,
            "fsdp_comm": self.fsdp_comm_s,
            "pipeline_bubble": self.pipeline_bubble_s,
            "dp_comm": self.dp_comm_s,
            "optimizer": self.optimizer_s,
            "param_gather": self.param_gather_s,
        }
        if self.ep_comm_s is not None:
            out["ep_comm"] = self.ep_comm_s
        if self.fp8_weight_cast_s is not None:
            out["fp8_weight_cast"] = self.fp8_weight_cast_s
        return out


@dataclass
class Estimate:
    model: ModelSpec
    cluster: ClusterSpec
    plan: TrainingPlan
    budget: Budget
    calibration: Calibration
    params: ParamCounts
    flops: StepFlops
    stages: list[StageMemory]
    split: tuple[int, ...]
    time: StepTime
    sim: SimResult
    derivations: list[Derivation] = field(default_factory=list)

    # ---- headline figures ------------------------------------------------------------------
    @property
    def peak_bytes(self) -> float:
        return max(s.total for s in self.stages)

    @property
    def capacity_bytes(self) -> float:
        return self.cluster.gpu.hbm_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    @property
    def tokens_per_s(self) -> float:
        return self.plan.tokens_per_step / self.time.step_s

    @property
    def mfu_peak(self) -> float:
        """Dense peak used for MFU: the compute dtype's, with FP8 runs measured against BF16
        (the convention of Llama 3 and torchtitan)."""
        dtype = self.plan.precision.compute_dtype
        return self.cluster.gpu.peak("bf16" if dtype == "fp8" else dtype)

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.flops.model / (self.time.step_s * self.plan.num_gpus) / TFLOPS

    @property
    def hardware_tflops_per_gpu(self) -> float:
        return self.flops.hardware / (self.time.step_s * self.plan.num_gpus) / TFLOPS

    @property
    def mfu(self) -> float:
        return self.model_tflops_per_gpu * TFLOPS / self.mfu_peak

    @property
    def hfu(self) -> float:
        return self.hardware_tflops_per_gpu * TFLOPS / self.mfu_peak

    def run_cost(self) -> Optional[dict[str, float]]:
        """Days, GPU-hours, dollars and energy for the budget's tokens (None without tokens)."""
        if not self.budget.tokens:
            return None
        steps = self.budget.tokens / self.plan.tokens_per_step
        seconds = steps * self.time.step_s
        gpu_hours = seconds / HOUR * self.plan.num_gpus
        energy_kwh = gpu_hours * self.cluster.gpu.tdp_watts / 1000.0 * self.budget.pue
        out = {
            "tokens": float(self.budget.tokens),
            "steps": steps,
            "seconds": seconds,
            "days": seconds / DAY,
            "gpu_hours": gpu_hours,
            "energy_mwh": energy_kwh / 1000.0,
            "pue": self.budget.pue,
        }
        if self.budget.price_per_gpu_hour is not None:
            out["price_per_gpu_hour"] = self.budget.price_per_gpu_hour
            out["dollars"] = gpu_hours * self.budget.price_per_gpu_hour
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON schema of ``meshplan estimate --json`` (docs/schema.md)."""
        p, m = self.plan, self.model
        stages = []
        for s in self.stages:
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
        t = self.time
        return {
            "schema_version": SCHEMA_VERSION,
            "model": {
                "name": m.name,
                "params_total": self.params.total,
                "params_matmul": self.params.matmul,
                "params_per_layer": self.params.layer.total,
                "params_embedding": self.params.embedding + self.params.position_embedding,
                "params_lm_head": self.params.lm_head,
                "n_layers": m.n_layers,
                **({"params_active": self.params.active, "params_active_matmul": self.params.active_matmul,
                    "params_per_moe_layer": self.params.moe_layer.total, "n_moe_layers": self.params.n_moe_layers}
                   if self.params.moe_layer else {}),
            },
            "cluster": {
                "gpu": self.cluster.gpu.name,
                "num_gpus": self.cluster.num_gpus,
                "gpus_per_node": self.cluster.gpus_per_node,
                "scale_up_bandwidth": self.cluster.scale_up.bandwidth,
                "scale_out_bandwidth": self.cluster.scale_out.bandwidth,
                "pod_size": self.cluster.pod_size,
                "oversubscription": self.cluster.oversubscription,
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
                "sequence_parallel": p.sequence_parallel,
                "zero": p.zero,
                "precision": p.precision.precision,
                "grad_dtype": p.precision.grad_dtype,
                "master_weights": p.precision.master_weights,
                "grad_fp32_copy": p.precision.grad_fp32_copy,
                "optimizer": p.precision.optimizer,
                "bytes_per_param": sum(state_bytes_per_param(p.precision, runs_fsdp2(p.zero, p.stack.kernels))),
                "attention": p.attention,
                "attention_flops": p.attention_flops,
                "stack": {**p.stack.model_dump(), "overrides": stack_overrides(p.stack, p)},
                "layer_split": list(self.split),
                "rank_order": list(p.rank_order),
            },
            "flops": {
                "model_per_step": self.flops.model,
                "hardware_per_step": self.flops.hardware,
                "breakdown": {
                    "dense": self.flops.dense,
                    "attention": self.flops.attention,
                    "recompute": self.flops.recompute,
                },
            },
            "memory": {
                "peak_bytes": self.peak_bytes,
                "capacity_bytes": self.capacity_bytes,
                "fits": self.fits,
                "headroom_bytes": self.capacity_bytes - self.peak_bytes,
                "worst_stage": max(range(len(self.stages)), key=lambda i: self.stages[i].total),
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
                "tokens_per_s": self.tokens_per_s,
                "tokens_per_s_per_gpu": self.tokens_per_s / p.num_gpus,
                "model_tflops_per_gpu": self.model_tflops_per_gpu,
                "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
                "mfu": self.mfu,
                "hfu": self.hfu,
            },
            "run": self.run_cost(),
        }


# ---- the composition -------------------------------------------------------------------------


def estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: TrainingPlan,
    budget: Budget | None = None,
    *,
    keep_timeline: bool = False,
    stream_pools: bool = True,
) -> Estimate:
    """Estimate ``plan`` for ``model`` on ``cluster`` (see the module docstring). ``stream_pools``
    off leaves out the pool FSDP2's all-gather buffers reserve on their own stream (item
    ``all_gather_pool``): the peak is then the allocated bytes the compute stream holds, what
    torch's memory trackers count (``meshplan verify memory``)."""
    check_plan(model, cluster, plan)
    budget = budget or Budget()
    gpu = cluster.gpu
    cal = calibration_for(gpu)
    rec = plan.precision
    e = rec.activation_bytes
    t, c, pp, v = plan.tp, plan.cp, plan.pp, plan.vpp
    b, s = plan.micro_batch, plan.seq_len
    sp = plan.sequence_parallel and t > 1
    m = plan.num_microbatches
    n_stages = pp * v
    last = n_stages - 1
    split = layer_split(model.n_layers, pp, v, plan.layer_split)
    derivs: list[Derivation] = []

    counts = count_params(model)
    flops = step_flops(model, s, plan.global_batch, plan.recompute, plan.attention_flops)

    # ---- per-layer compute and communication (one micro-batch, one GPU) ----------------------
    shard = plan.shard_degree
    # FSDP2's FP8 all-gather: the blocks' Float8Linear weights gathered, held and used as FP8
    fp8_gather = plan.stack.fsdp_fp8_all_gather and plan.zero == 3 and shard > 1
    layer_saving = fp8_gather_saving(model, t, rec.weight_bytes, fp8_gather)
    ops = layer_op_times(model, b, s, t, c, sp, plan.attention, plan.attention_flops, gpu, cal, rec.compute_dtype, e, plan.stack.kernels,
                         weights_in_fp8=fp8_gather, fp8_linears=plan.stack.fp8_linears, attention_kernel=plan.stack.attention_kernel)
    emb_ops = embedding_op_times(model, b, s, t, c, gpu, cal, e)
    head_ops = head_op_times(model, b, s, t, c, gpu, cal, rec.compute_dtype, e, plan.stack.loss_kernels)
    recompute_layer = recompute_time(ops, plan.recompute)
    pl = plan_placements(cluster, plan)
    tokens = b * s / c
    act_msg = tokens * model.hidden * e  # one activation tensor n·h·e
    tp_one = tp_collective_time(act_msg, sp, pl.tp, cluster, cal)
    cp_comm = cp_exchange_collectives(model, tokens, t, e, plan.stack.kernels, c, pl.cp, cluster, cal)
    layer_params = layer_params_per_rank(model, t)
    # ZeRO-3 that keeps weights gathered and gradients unsharded through the step communicates like
    # ZeRO-1/2 (one reduce-scatter after the last backward, one all-gather before the first
    # forward) and holds what they hold, on top of its shards
    once_per_step = plan.zero == 3 and plan.stack.fsdp_accumulate_unsharded
    fsdp_per_layer = plan.zero == 3 and shard > 1 and not once_per_step
    units = fsdp_unit_times(model, t, pp, rec, pl.shard, cluster, cal, fp8_gather) if fsdp_per_layer else (0.0,) * 6
    ag, rs = units[0], units[1]
    fsdp2 = runs_fsdp2(plan.zero, plan.stack.kernels)
    copies = fsdp2_unit_copy_times(model, t, pp, rec, gpu, cal, fp8_gather=fp8_gather) if fsdp_per_layer and fsdp2 else (0.0,) * 6
    lt_args = dict(
        full_recompute=plan.recompute == "full",
        emb=(emb_ops.fwd, emb_ops.bwd, emb_ops.bwd_weight), head=(head_ops.fwd, head_ops.bwd, head_ops.bwd_weight),
        tp_one=tp_one, sp=sp, tp_comm_overlap=plan.stack.tp_comm_overlap, cp=c, cp_comm=cp_comm, kernels=plan.stack.kernels,
        fsdp_per_layer=fsdp_per_layer, all_gather=ag, reduce_scatter=rs,
        reshard_after_forward=plan.stack.reshard_after_forward, fsdp_units=units[2:], fsdp_copies=copies,
        embedding_kept=(model.tied_embeddings or plan.stack.fsdp_head_in_root) and pp == 1,
        nccl_share=sm_share(NCCL_CTAS, gpu.sm_count), tp_share=sm_share(tp_overlap_ctas(plan.stack.tp_overlap_kind), gpu.sm_count),
    )
    if plan.stack.tp_overlap_kind == "micro-pipeline":
        lt_args["tp_overlapped"] = micro_pipeline_tp_times(model, tokens, t, sp, pl.tp, cluster, cal, rec.compute_dtype, e, plan.stack.kernels)
    lt = layer_times(**lt_args, **_op_args(ops, recompute_layer))
    st = stage_times(split, lt)
    ep_comm = None
    if model.is_moe:  # MoE layers: their own op times, ZeRO-3 collectives and all-to-alls
        moe_ops = layer_op_times(
            model, b, s, t, c, sp, plan.attention, plan.attention_flops, gpu, cal, rec.compute_dtype, e, plan.stack.kernels,
            moe=True, ep=plan.ep, fp8_linears=plan.stack.fp8_linears, attention_kernel=plan.stack.attention_kernel,
        )
        ep_group, edp = expert_placements(cluster, plan)
        moe_units = moe_fsdp_layer_times(model, t, plan.ep, rec, pl.shard, edp, cluster, cal) if fsdp_per_layer else (0.0, 0.0)
        moe_copies = fsdp2_unit_copy_times(model, t, pp, rec, gpu, cal, moe=True, ep=plan.ep)[:2] if fsdp_per_layer and fsdp2 else (0.0, 0.0)
        lt_moe = layer_times(
            **(lt_args | {"all_gather": moe_units[0], "reduce_scatter": moe_units[1], "fsdp_copies": (*moe_copies, *copies[2:]),
                          "expert_tp": expert_tp_time(model, tokens, pl.tp, e, cluster, cal)}),
            **_op_args(moe_ops, recompute_time(moe_ops, plan.recompute)),
        )
        moe_stage = moe_layers_per_stage(model, split)
        a2a = alltoall_times(model, tokens, t, sp, e, plan.recompute == "full", ep_group, cluster, cal)
        ep_comm = add_moe_layers(st, moe_stage, lt, lt_moe, a2a)
    fwd, bwd = st.fwd, st.bwd

    # ---- activations per virtual stage, then the schedule ------------------------------------
    gi = saved_gemm_input_bytes(rec.compute_dtype, plan.stack.kernels, e, plan.stack.fp8_linears)
    la = layer_activations(model, b, s, t, c, sp, plan.recompute, plan.attention, e, gemm_input_bytes=gi, kernels=plan.stack.kernels)
    emb_act = embedding_activation_bytes(model, b, s, t, c, sp)
    head_act = head_activation_bytes(model, b, s, t, c, sp, e, plan.stack.loss_kernels, plan.stack.kernels)
    p2p_bytes = act_msg / (t if sp else 1)
    # torch.distributed.pipelining keeps each stage's output until its backward (pp_buffers): the
    # message sent on, and on the last stage the logits
    torch_pp = plan.stack.pp_buffers == "per-micro-batch" and pp > 1
    kept_output = p2p_bytes if plan.stack.pp_buffers == "per-micro-batch" else 0.0
    head_output = logits_output_bytes(model, b, s, t, c, e) if torch_pp else 0.0
    held = held_logits_bytes(model, b, s, t, c, e, plan.stack.loss_kernels) if torch_pp else 0.0
    stage_act = stage_activations(split, la.stored, emb_act, head_act, kept_output, held)
    working, backward_grads, layer_stored = la.working, la.gradients, la.stored
    if model.is_moe:
        la_moe = layer_activations(
            model, b, s, t, c, sp, plan.recompute, plan.attention, e, moe=True, gemm_input_bytes=gi, kernels=plan.stack.kernels
        )
        stage_act = [a + n_m * (la_moe.stored - la.stored) for a, n_m in zip(stage_act, moe_stage)]
        if la_moe.working > la.working:
            working, backward_grads, layer_stored = la_moe.working, la_moe.gradients, la_moe.stored
    p2p = coll.collective_time("send_recv", p2p_bytes, pl.pp, cluster, cal) if pp > 1 else 0.0
    ranks = compile_schedule(plan.schedule, pp, m, v)
    sim = simulate(ranks, n_stages, fwd, bwd, transfer=p2p, act_bytes=stage_act, keep_timeline=keep_timeline, wgt=st.wgt,
                   runtime=plan.stack.pipeline_runtime)
    style = stage_style(plan.schedule)

    # ---- memory and after-pipeline communication per rank ------------------------------------
    stages: list[StageMemory] = []
    after = []
    opt_times = []
    pg_times = []
    dp_hidden = []
    logits_grad = loss_grad_bytes(model, b, s, t, c, plan.stack.loss_kernels, e)
    # under torch's pipelining the schedule holds the logits through the loss (counted as the last
    # stage's output): no freed block
    logits_block = 0.0 if torch_pp else freed_logits_block_bytes(model, b, s, t, c, plan.stack.loss_kernels, e)
    head_params = head_params_per_rank(model, t, pp)
    # torch's pipelining returning outputs: the last stage keeps each micro-batch's logits to the step's end,
    # (m − L)·O beyond the L in flight at its peak
    returns = plan.stack.pp_return_outputs and pp > 1
    kept_outputs = kept_outputs_bytes(m, int(last_stage_live_peaks(state_rows(plan.schedule, pp, m, v)[None], plan.schedule, pp, v)[0]),
                                      head_output) if returns else 0.0
    layer_params, down_params = largest_layer_params(model, t, plan.ep)  # ZeRO-3 buffers hold the largest layer
    if model.is_moe:
        expert_shard = expert_shard_degree(plan)
        pl_experts = expert_dp_placements(pl, edp)
    # a tied embedding shares its weight with the LM head on one stage: gathered until its backward
    kept_embedding = embedding_params_per_rank(model, t) if model.tied_embeddings and pp == 1 else 0
    # torchtitan's 2024 FSDP2 units: an untied embedding in the root unit, gathered through the step
    root_embedding = embedding_params_per_rank(model, t) if plan.stack.fsdp_head_in_root and not model.tied_embeddings else 0
    for r in range(pp):
        mine = stages_of_rank(r, pp, v, style)
        n_layers = sum(split[k] for k in mine)
        n_moe = sum(moe_stage[k] for k in mine) if model.is_moe else 0
        params = rank_params(model, t, pp, n_layers, 0 in mine, last in mine, n_moe, plan.ep)
        experts = rank_expert_params(model, t, plan.ep, n_moe)
        state = model_state_bytes(params - experts, rec, plan.zero, shard, fsdp2)
        if experts:  # expert weights: E/ep per GPU, ZeRO-sharded over the expert data-parallel group
            ex = model_state_bytes(experts, rec, plan.zero, expert_shard, fsdp2)
            state = ModelState(state.weights + ex.weights, state.gradients + ex.gradients, state.optimizer + ex.optimizer)
        act_items = {
            "stored": sim.peak_activation[r],
            "backward_working_set": working - backward_grads,
            "backward_gradients": backward_grads,
        }
        messages = pp_buffer_messages(plan.stack.pp_buffers, m, sum(k != 0 for k in mine), sum(k != last for k in mine))
        # FSDP2's all-gather buffers, in the pool of its copy-in stream
        pool = gather_pool_bytes(model, t, pp, tuple((split[k], k == 0, k == last) for k in mine), rec.weight_bytes,
                                 plan.stack.fsdp_head_in_root, plan.ep, fp8_gather) if fsdp2 and stream_pools else 0.0
        step_outputs = m * head_output if returns and last in mine else 0.0
        other = rank_other_items(
            reserve=cal.runtime_reserve, holds_head=last in mine, logits_grad=logits_grad, head_act=head_act, zero=plan.zero,
            shard=shard, params=params, layer_params=layer_params, head_params=head_params,
            kept_embedding_params=kept_embedding, weight_bytes=rec.weight_bytes,
            grad_bytes=rec.grad_bytes, reshard_after_forward=plan.stack.reshard_after_forward,
            once_per_step=once_per_step, tp=t, act_msg=act_msg, pp=pp, p2p_bytes=p2p_bytes, pp_messages=messages,
            working=working, root_embedding_params=root_embedding, head_in_root=plan.stack.fsdp_head_in_root,
            down_params=down_params, layer_stored=layer_stored, logits_block=logits_block,
            kept_outputs=kept_outputs, gather_pool=pool, layer_saving=layer_saving, stage_saving=n_layers * layer_saving,
        )
        rank_mem = dict(rank=r, layers=n_layers, params=params, weights=state.weights, gradients=state.gradients,
                        optimizer=state.optimizer, peak_inflight=sim.peak_inflight[r])
        mem = StageMemory(**rank_mem, activations=total_of(act_items), other=total_of(other),
                          activation_items=act_items, other_items=other)
        if step_outputs:  # the step's end, the kept outputs merged: no activations left
            merged = merged_outputs_items(reserve=cal.runtime_reserve, tp=t, act_msg=act_msg, pp=pp, p2p_bytes=p2p_bytes,
                                          pp_messages=messages, step_outputs=step_outputs,
                                          gather_pool=pool if plan.zero == 3 and shard > 1 else 0.0)
            at_end = StageMemory(**{**rank_mem, "peak_inflight": 0}, activations=0.0, other=total_of(merged),
                                 activation_items={k: 0.0 for k in act_items}, other_items=merged)
            mem = at_end if at_end.total > mem.total else mem
        stages.append(mem)
        grad_comm, pg = dp_sync_times(params - experts, plan.zero, once_per_step, shard, rec, pl, cluster, cal, n_layers * layer_saving)
        if experts:
            ex_comm, ex_pg = dp_sync_times(experts, plan.zero, once_per_step, expert_shard, rec, pl_experts, cluster, cal)
            grad_comm, pg = grad_comm + ex_comm, pg + ex_pg
        dp_args = dict(
            grad_comm=grad_comm, param_gather=pg, last_bwd=sum(bwd[k] for k in mine),
            first_fwd=sum(fwd[k] for k in mine), n_layers=n_layers,
            overlap_grad_reduce=plan.stack.overlap_grad_reduce, overlap_param_gather=plan.stack.overlap_param_gather,
        )
        a, g = after_pipeline(**dp_args, nccl_share=lt_args["nccl_share"])
        if once_per_step and fsdp2 and shard > 1:  # FSDP2's copies of the step's one reduce-scatter and all-gather
            units_here = n_layers + (0 in mine) + (last in mine)
            copy_in, copy_out = fsdp2_step_copy_times(params, units_here, rec, gpu, cal, n_layers * layer_saving)
            a, g = a + copy_in, g + copy_out
        after.append(a)
        pg_times.append(g)
        a0, g0 = after_pipeline(**dp_args)  # without contention: what stays hidden
        dp_hidden.append((hidden_comm(grad_comm, a0), hidden_comm(pg, g0)))
        local = params / (shard if plan.zero >= 1 else 1)
        if experts and plan.zero >= 1:
            local = (params - experts) / shard + experts / expert_shard
        opt_times.append(optimizer_step_time(local, rec, gpu, cal, plan.stack.kernels))

    # ---- step time and its breakdown on the critical rank ------------------------------------
    ends = [sim.finish[r] + after[r] for r in range(pp)]
    crit = max(range(pp), key=lambda r: ends[r])
    mine = stages_of_rank(crit, pp, v, style)
    per_mb = lambda xs: m * sum(xs[k] for k in mine)  # noqa: E731
    compute_s = per_mb(st.comp_fwd) + per_mb(st.comp_bwd)
    busy = sim.busy[crit]
    slowest = max(range(pp), key=lambda r: opt_times[r] + pg_times[r])
    opt_s, pg_s = opt_times[slowest], pg_times[slowest]
    # Megatron-Core's FP8 weight casts, once per step: the first micro-batch's forward crosses
    # every layer before the steady state (fp8_weight_cast_per_step)
    n_moe = sum(moe_stage) if model.is_moe else 0
    cast_s = (model.n_layers - n_moe) * ops.weight_cast + (n_moe * moe_ops.weight_cast if n_moe else 0.0)
    step_s = ends[crit] + opt_s + pg_s + cast_s
    hidden = _hidden_per_step(split, mine, m, lt, lt_moe if model.is_moe else lt,
                              moe_stage if model.is_moe else None, dp_hidden[crit], dp_hidden[slowest][1])
    time = StepTime(
        step_s=step_s,
        critical_rank=crit,
        compute_s=compute_s,
        recompute_s=per_mb(st.recompute),
        tp_comm_s=per_mb(st.tp_fwd) + per_mb(st.tp_bwd),
        cp_comm_s=per_mb(st.cp_fwd) + per_mb(st.cp_bwd),
        fsdp_comm_s=per_mb(st.fsdp_fwd) + per_mb(st.fsdp_bwd),
        pipeline_bubble_s=sim.finish[crit] - busy,
        dp_comm_s=after[crit],
        optimizer_s=opt_s,
        param_gather_s=pg_s,
        makespan_s=sim.makespan,
        bubble_fraction=sim.bubble_fraction,
        bubble_overhead=sim.bubble_overhead,
        per_rank_finish_s=sim.finish,
        ep_comm_s=per_mb(ep_comm.fwd) + per_mb(ep_comm.bwd) if ep_comm else None,
        fp8_weight_cast_s=cast_s if cast_s else None,
        hidden_comm=hidden,
        contention=_contention_per_step(hidden, lt_args["nccl_share"], lt_args["tp_share"]),
    )
    est = Estimate(model, cluster, plan, budget, cal, counts, flops, stages, split, time, sim, derivs)
    derivs.extend(_derivations(est, ops, la, tp_one, p2p, lt, cp_comm, (ag, rs, copies) if fsdp_per_layer else None))
    return est


def _hidden_per_step(split, mine, m: int, lt, lt_moe, moe_stage, dp: tuple[float, float], pg: float) -> dict[str, float]:
    """Seconds per step of communication hidden behind compute on the critical rank, by kind:
    m micro-batches × Σ over its stages of n_k × the layer's hidden TP, CP and FSDP time (MoE
    layers their own), the FSDP embedding and head units on the first and last stage, plus the
    hidden part of the DP gradient synchronization (``dp``) and of the weight all-gather (``pg``,
    from the rank that sets the step's all-gather)."""
    last = len(split) - 1
    out = {"tp": 0.0, "cp": 0.0, "fsdp": 0.0}
    for k in mine:
        n_moe = moe_stage[k] if moe_stage is not None else 0
        for x, n in ((lt, split[k] - n_moe), (lt_moe, n_moe)):
            out["tp"] += m * n * (x.hidden_tp_fwd + x.hidden_tp_bwd)
            out["cp"] += m * n * (x.hidden_cp_fwd + x.hidden_cp_bwd)
            out["fsdp"] += m * n * (x.hidden_fsdp_fwd + x.hidden_fsdp_bwd)
        if k == 0:
            out["fsdp"] += m * (lt.hidden_fsdp_emb_fwd + lt.hidden_fsdp_emb_bwd)
        if k == last:
            out["fsdp"] += m * (lt.hidden_fsdp_head_fwd + lt.hidden_fsdp_head_bwd)
    out["dp_grad"] = dp[0]
    out["param_gather"] = pg
    return out


def _contention_per_step(hidden: dict[str, float], nccl_share: float, tp_share: float) -> dict[str, float]:
    """Δ = T_h · n_c/n_SM (:mod:`meshplan.cost.contention`) per kind of ``hidden``: what the hidden
    collectives add to the critical rank's step (TP at ``tp_share``, the NCCL collectives at
    ``nccl_share``)."""
    return {k: contention_time(v, tp_share if k == "tp" else nccl_share) for k, v in hidden.items()}


def _op_args(ops: OpTimes, recompute: float) -> dict[str, float]:
    """The op-time arguments of :func:`~meshplan.cost.compose.layer_times`."""
    return dict(
        fwd=ops.fwd, bwd=ops.bwd, wgt=ops.bwd_weight, fwd_gemm=ops.fwd_gemm, bwd_gemm=ops.bwd_gemm,
        fwd_attention=ops.fwd_attention, bwd_attention=ops.bwd_attention, recompute=recompute,
    )


def _tp_overlap_words(p: TrainingPlan) -> str:
    """How a layer's TP collectives overlap, as the ``time.layer`` derivation names it."""
    if not p.stack.tp_comm_overlap or p.tp == 1:
        return "not overlapped"
    if p.stack.tp_overlap_kind == "micro-pipeline":
        return "micro-pipelined, torch AsyncTP: fused all-gather/reduce-scatter matmuls in t chunks"
    return "userbuffers: behind the layer's GEMMs"


def _cp_rows(p: TrainingPlan, cp_comm: tuple[float, float], lt) -> tuple[tuple[str, str], ...]:
    """The ``time.layer`` rows of context parallelism's K/V exchange
    (:mod:`meshplan.cost.cp_exchange`): its two collectives before overlap and what stays exposed,
    as the plan's software stack runs it; none at c = 1."""
    if p.cp == 1:
        return ()
    kv, dkv = cp_comm
    recompute = ", recompute repeats the forward" if p.recompute == "full" else ""
    if p.stack.kernels == "fused":
        return (
            ("CP comm", f"{fmt_seconds(kv)} K|V send/recv, {fmt_seconds(dkv)} backward (K|V and dK|dV) per ring step"),
            ("CP exposed", f"{fmt_seconds(lt.cp_fwd)} / {fmt_seconds(lt.cp_bwd)} (Transformer Engine's ring: "
                           f"c − 1 = {p.cp - 1} step{'s' if p.cp > 2 else ''}, each behind 1/c of the attention{recompute})"),
        )
    return (
        ("CP comm", f"{fmt_seconds(kv)} K|V all-gather, {fmt_seconds(dkv)} fp32 dK|dV send/recv per ring step"),
        ("CP exposed", f"{fmt_seconds(lt.cp_fwd)} / {fmt_seconds(lt.cp_bwd)} (torch's ring: the all-gather behind "
                       f"the step-0 call forward and backward, c = {p.cp} dK|dV transfers, the last one exposed{recompute})"),
    )


def _fsdp_rows(est: Estimate, lt, fsdp_terms: tuple | None) -> list[Derivation]:
    """The ``time.fsdp`` derivation of per-layer ZeRO-3: a layer's all-gather and reduce-scatter
    before overlap, FSDP2's copies on the torch stacks (:mod:`meshplan.cost.fsdp_copies`) and what
    is exposed; none when weights are not sharded per layer (``fsdp_terms`` None)."""
    if fsdp_terms is None:
        return []
    p = est.plan
    ag, rs, copies = fsdp_terms
    again = " (and again backward)" if p.stack.reshard_after_forward else ""
    symbols = [("P", f"{layer_params_per_rank(est.model, p.tp):,} parameters per layer and GPU (TP {p.tp})")]
    gathered = "P·w"
    if p.stack.fsdp_fp8_all_gather:
        gathered = "P·w − S"
        saving = fp8_gather_saving(est.model, p.tp, p.precision.weight_bytes, True)
        symbols.append(("S", f"{saving:,} bytes: the Float8Linear weights gathered as FP8, P_lin·(w − 1) (FSDP2's FP8 all-gather)"))
    symbols.append(("AG, RS", f"{fmt_seconds(ag)} all-gather of {gathered}{again}, {fmt_seconds(rs)} reduce-scatter of P·γ, "
                              f"over N = {p.shard_degree}"))
    ag_bwd = "AG + RS" if p.stack.reshard_after_forward else "RS"
    formula = f"max(AG − forward, 0) forward, max({ag_bwd} − backward, 0) backward: a layer's collectives behind a layer's compute"
    if runs_fsdp2(p.zero, p.stack.kernels):
        symbols.append(("copies", f"{fmt_seconds(copies[0])} copy-out (2·({gathered})) per all-gather, {fmt_seconds(copies[1])} "
                                  "copy-in (P·(w + γ)) per reduce-scatter, on the compute stream"))
        formula += " + FSDP2's copies"
    symbols.append(("per layer", f"{fmt_seconds(lt.fsdp_fwd)} / {fmt_seconds(lt.fsdp_bwd)} forward / backward"))
    return [Derivation(
        "time.fsdp", "ZeRO-3 / FSDP time per layer and micro-batch", formula, tuple(symbols),
        f"{fmt_seconds(est.time.fsdp_comm_s)} per step on the critical rank (the embedding and head units included)",
        "Rajbhandari et al. 2020 Sec. 7.2.2" + ("; torch FSDP2's foreach_all_gather_copy_out and foreach_reduce_scatter_copy_in "
                                                 "(meshplan.cost.fsdp_copies)" if runs_fsdp2(p.zero, p.stack.kernels) else ""))]


def _attention_kernel_rows(p: TrainingPlan, cal: Calibration) -> tuple[tuple[str, str], ...]:
    """The flash attention's kernel and its rates, η(L) = η∞·L/(L + L₀) forward / backward."""
    if p.attention != "flash":
        return ()
    kernel = attention_kernel_of(p.stack.kernels, p.stack.attention_kernel, cal)
    fe, fl, be, bl = attention_rates(cal, kernel)
    return (("η_attn", f"{ATTENTION_KERNEL_NAMES[kernel]}: η∞ {fe:g} / {be:g}, L₀ {fl:g} / {bl:g} keys"),)


def _derivations(est: Estimate, ops: OpTimes, la, tp_one: float, p2p: float, lt,
                 cp_comm: tuple[float, float], fsdp_terms: tuple | None) -> list[Derivation]:
    """Formula, symbols and values of the headline figures (what ``meshplan explain`` shows);
    ``fsdp_terms``: a layer's ZeRO-3 (all-gather, reduce-scatter, FSDP2 copies) when weights are
    sharded per layer, else None."""
    m, p, pc, f = est.model, est.plan, est.params, est.flops
    tok = p.tokens_per_step
    worst = max(est.stages, key=lambda st: st.total)
    rec = p.precision
    shard = p.shard_degree
    d: list[Derivation] = []
    if pc.moe_layer is None:
        d.append(Derivation(
            "model.params_total", "Parameters",
            "L·(attention + MLP + norms) + V·h (embedding) + final norm + V·h (LM head unless tied)",
            (("L", f"{m.n_layers} layers"), ("per layer", f"{pc.layer.total:,}"), ("V·h", f"{pc.embedding:,}"),
             ("LM head", f"{pc.lm_head:,}")),
            f"{pc.total:,}", "meshplan.cost.params; exact against published totals"))
    else:
        d.append(Derivation(
            "model.params_total", "Parameters (mixture of experts)",
            "L_d·(dense layer) + L_m·(attention + router + E experts + shared expert + norms) + V·h + final norm + V·h",
            (("L_d, L_m", f"{m.n_layers - pc.n_moe_layers} dense, {pc.n_moe_layers} MoE layers"),
             ("per layer", f"{pc.layer.total:,} dense, {pc.moe_layer.total:,} MoE"),
             ("E, k", f"{m.n_experts} experts, {m.experts_per_token} per token"), ("V·h", f"{pc.embedding:,}"),
             ("LM head", f"{pc.lm_head:,}")),
            f"{pc.total:,} ({pc.active:,} active per token)",
            "meshplan.cost.params; exact against transformers; Fedus et al. 2022 Sec. 2"))
    d.append(Derivation(
        "flops.breakdown.dense", "Dense FLOPs per step", "6 · N_mm · T",
        (("N_mm", f"{pc.active_matmul:,} matmul parameters (LM head included"
                  + (f"; the router, shared expert and {m.experts_per_token} of {m.n_experts} experts)" if m.is_moe else ")")),
         ("T", f"{tok:,} tokens per step")),
        f"{f.dense:.4e} FLOP", "Kaplan et al. 2020 Sec. 2.1; Narayanan et al. 2021 Eq. 3"
        + ("; Fedus et al. 2022 (active experts only)" if m.is_moe else "")))
    per = 6 if p.attention_flops == "causal" else 12
    d.append(Derivation(
        "flops.breakdown.attention", "Attention FLOPs per step (QKᵀ and A·V)", f"{per} · L · a · d · s² · B  ({p.attention_flops})",
        (("L", str(m.n_layers)), ("a·d", str(m.q_dim) if not m.is_mla else f"{m.n_heads} x ({m.head_dim} + {m.value_head_dim}) / 2 (MLA: QKᵀ over d, A·V over d_v)"), ("s", str(p.seq_len)), ("B", f"{p.global_batch} sequences")),
        f"{f.attention:.4e} FLOP", "forward 4·s²·a·d per layer per sequence (half when causal), backward 2x forward"))
    d.append(Derivation(
        "flops.hardware_per_step", "Hardware FLOPs per step", "model FLOPs + recompute FLOPs",
        (("model", f"{f.model:.4e}"), ("recompute", f"{f.recompute:.4e} ({p.recompute})")),
        f"{f.hardware:.4e} FLOP", "HFU basis; " + {
            "none": "no recompute",
            "selective": "one extra attention-core forward (Korthikanti et al. 2022 Sec. 5)",
            "op": "every second layer matmul repeated (torchtitan's op-level checkpointing)",
            "full": "the layers' whole forward repeated (Narayanan et al. 2021 Eq. 3)",
        }[p.recompute]))
    d.append(Derivation(
        f"memory.stages[{worst.rank}].weights", "Weights per GPU (worst stage)",
        "P · w" + (" / N" if p.zero >= 3 else ""),
        (("P", f"{worst.params:,} parameters on rank {worst.rank} ({worst.layers} layers, TP {p.tp})"),
         ("w", f"{rec.weight_bytes} bytes ({rec.precision})"), ("N", f"{shard} (ZeRO shard degree = dp_shard x cp)")),
        fmt_bytes(worst.weights), "Rajbhandari et al. 2020 Sec. 5"))
    d.append(Derivation(
        f"memory.stages[{worst.rank}].gradients", "Gradients per GPU", "P · γ" + (" / N" if p.zero >= 2 else ""),
        (("P", f"{worst.params:,}"), ("γ", f"{rec.grad_bytes} bytes ({rec.grad_dtype})"), ("N", str(shard))),
        fmt_bytes(worst.gradients), "Rajbhandari et al. 2020 Sec. 5"))
    d.append(Derivation(
        f"memory.stages[{worst.rank}].optimizer", "Optimizer state per GPU", "P · ω" + (" / N" if p.zero >= 1 else ""),
        (("P", f"{worst.params:,}"), ("ω", f"{rec.optimizer_bytes} bytes (master {rec.master_bytes} + fp32 grad copy {rec.grad_copy_bytes} + moments {rec.state_bytes})"),
         ("N", str(shard))),
        fmt_bytes(worst.optimizer), "Rajbhandari et al. 2020; Megatron-LM distributed optimizer"))
    d.append(Derivation(
        f"memory.stages[{worst.rank}].activations", "Activations per GPU (worst stage)",
        "Σ over in-flight micro-batches of (layers of the stage × per-layer bytes) + backward working set "
        "(what recompute rebuilds; torch's context-parallel ring buffers) + the MLP backward's gradients",
        (("per layer", f"{fmt_bytes(la.stored)} per micro-batch ({p.recompute} recompute, "
                       f"{'SP' if p.sequence_parallel and p.tp > 1 else 'no SP'}, {p.attention} attention)"),
         ("in flight", f"{worst.peak_inflight} micro-batch chunks at peak ({p.schedule})"),
         ("working", fmt_bytes(worst.activation_items.get('backward_working_set', 0.0))),
         ("gradients", fmt_bytes(worst.activation_items.get('backward_gradients', 0.0)))),
        fmt_bytes(worst.activations), "Korthikanti et al. 2022 Table 2, derived from the layer's tensor list"))
    at_end = "merged_outputs" in worst.other_items
    d.append(Derivation(
        f"memory.stages[{worst.rank}].other", "Buffers and reserves per GPU (worst stage)",
        "Σ of the items live at the peak's moment: " + (
            "the step's end, the last stage's kept outputs and their concatenation" if at_end else
            "the larger of the loss's backward and the top layer's (negative items: what that moment has freed or not yet built)"),
        tuple((name, fmt_bytes(v)) for name, v in worst.other_items.items() if v) or (("items", "none"),),
        fmt_bytes(worst.other),
        "meshplan.cost.compose.rank_other_items" + ("; merged_outputs_items" if at_end else "")
        + ("; reserved pools: meshplan.cost.allocator" if "all_gather_pool" in worst.other_items else "")))
    d.append(Derivation(
        "memory.peak_bytes", "Peak memory per GPU", "max over pipeline ranks of weights + gradients + optimizer + activations + other",
        tuple((f"rank {st.rank}", fmt_bytes(st.total)) for st in est.stages[:4]) + ((("...", f"{len(est.stages)} ranks"),) if len(est.stages) > 4 else ()),
        f"{fmt_bytes(est.peak_bytes)} of {fmt_bytes(est.capacity_bytes)} ({'fits' if est.fits else 'does not fit'})"))
    d.append(Derivation(
        "time.layer", "One layer, one micro-batch (forward / backward)",
        "Σ GEMM max(2mnk/(F·η), bytes/W) + attention FLOPs/(F·η_attn) + memory-bound bytes/W",
        (("GEMMs", f"{fmt_seconds(ops.fwd_gemm)} / {fmt_seconds(ops.bwd_gemm)}"),
         ("attention", f"{fmt_seconds(ops.fwd_attention)} / {fmt_seconds(ops.bwd_attention)}"),
         ("memory-bound", f"{fmt_seconds(ops.fwd_memory)} / {fmt_seconds(ops.bwd_memory)}"),)
        + _attention_kernel_rows(p, est.calibration)
        + (("TP comm", f"{fmt_seconds(2 * tp_one)} per direction ({'AG+RS' if p.sequence_parallel else 'all-reduce'} x 2)"),
         ("TP exposed", f"{fmt_seconds(lt.tp_fwd)} / {fmt_seconds(lt.tp_bwd)} "
                        f"({_tp_overlap_words(p)}{', recompute repeats the forward' if p.recompute == 'full' else ''})"))
        + _cp_rows(p, cp_comm, lt),
        f"{fmt_seconds(ops.fwd)} / {fmt_seconds(ops.bwd)}",
        "meshplan.cost.compute" + ("; meshplan.cost.cp_exchange" if p.cp > 1 else "")))
    d.extend(_fsdp_rows(est, lt, fsdp_terms))
    t = est.time
    gpu = est.cluster.gpu
    ctas = tp_overlap_ctas(p.stack.tp_overlap_kind)
    kinds = {"tp": "TP", "cp": "CP", "fsdp": "FSDP", "dp_grad": "DP grad", "param_gather": "weight AG"}
    d.append(Derivation(
        "time.contention", "Compute slowed by the communication it hides",
        "Σ over hidden collectives of T_h · n_c / n_SM",
        (("n_SM", f"{gpu.sm_count} SMs ({gpu.name})"),
         ("n_c", f"{NCCL_CTAS} NCCL CTAs (FSDP, CP, DP)" + (
             f"; TP {ctas:g} ({'copy engines' if p.stack.tp_overlap_kind == 'micro-pipeline' else 'userbuffers: all-gather 1, reduce-scatter 16'})"
             if p.stack.tp_comm_overlap and p.tp > 1 else "")),)
        + tuple((f"T_h {kinds[k]}", f"{fmt_seconds(v)} hidden → +{fmt_seconds(t.contention[k])}")
                for k, v in t.hidden_comm.items() if v > 0),
        f"{fmt_seconds(t.contention_s)} per step (the layers' in compute, the DP synchronization's in DP comm and weight all-gather)",
        "meshplan.cost.contention; NCCL channels (one CTA each), Transformer Engine userbuffers' num_sm"))
    d.append(Derivation(
        "time.step_s", "Step time", "pipeline makespan (critical rank) + exposed DP comm + optimizer + exposed weight all-gather"
        + (" + FP8 weight casts (first micro-batch)" if t.fp8_weight_cast_s else ""),
        (("makespan", f"{fmt_seconds(est.sim.finish[t.critical_rank])} on rank {t.critical_rank} ({p.schedule}, p={p.pp}, m={p.grad_accum}, v={p.vpp}, "
                      f"{runtime_words(p.schedule, p.pp, p.grad_accum, p.vpp, p.stack.pipeline_runtime)})"),
         ("p2p", f"{fmt_seconds(p2p)} per stage boundary"),
         ("bubble", f"{fmt_seconds(t.pipeline_bubble_s)} idle; fraction {t.bubble_fraction:.3f}, overhead {t.bubble_overhead:.3f}"),
         ("dp comm", fmt_seconds(t.dp_comm_s)), ("optimizer", fmt_seconds(t.optimizer_s)),
         ("param gather", fmt_seconds(t.param_gather_s)))
        + ((("FP8 casts", f"{fmt_seconds(t.fp8_weight_cast_s)}: the {est.model.n_layers} layers' weights cast and transposed "
                          "once per step (Megatron-Core's is_first_microbatch)"),) if t.fp8_weight_cast_s else ()),
        fmt_seconds(t.step_s), "event simulation of the schedule (meshplan.pipeline.simulate"
        + ("; lockstep over torch's grid: meshplan.pipeline.lockstep)" if runs_lockstep(p.schedule, p.pp, p.stack.pipeline_runtime) else ")")))
    d.append(Derivation(
        "throughput.mfu", "Model FLOPs utilization", "model FLOPs per step / (GPUs × dense peak × step time)",
        (("model FLOPs", f"{f.model:.4e}"), ("GPUs", str(p.num_gpus)), ("peak", f"{est.mfu_peak / TFLOPS:.1f} TFLOP/s"),
         ("step", fmt_seconds(t.step_s))),
        f"{est.mfu:.4f} ({est.model_tflops_per_gpu:.1f} TFLOP/s per GPU)", "Chowdhery et al. 2022 (PaLM) App. B"))
    run = est.run_cost()
    if run:
        d.append(Derivation(
            "run.days", "Days for the token budget", "tokens / tokens per step × step time / 86400",
            (("tokens", f"{run['tokens']:.4e}"), ("per step", f"{tok:,}"), ("step", fmt_seconds(t.step_s))),
            f"{run['days']:.2f} days; {run['gpu_hours']:.4e} GPU-hours", ""))
    return d
