"""Estimate one training plan: memory per pipeline stage, FLOPs, step time and its breakdown,
throughput, MFU, and the cost of a token budget.

This is the one place where the cost modules are composed; the CLI, JSON output and tests read
the :class:`Estimate` it returns (``to_dict`` gives the documented JSON schema).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

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
    OpTimes,
    embedding_op_times,
    head_op_times,
    layer_op_times,
    optimizer_step_time,
    recompute_time,
)
from meshplan.cost.flops import StepFlops, step_flops
from meshplan.cost.memory import ModelState, StageMemory, model_state_bytes
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
from meshplan.derivations import derivations
from meshplan.estimate_json import estimate_json
from meshplan.explain import Derivation
from meshplan.pipeline.inflight import last_stage_live_peaks, state_rows
from meshplan.pipeline.schedules import compile_schedule, stage_style
from meshplan.pipeline.simulate import SimResult, simulate
from meshplan.pipeline.stages import layer_split, stages_of_rank
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.validate import check_plan
from meshplan.units import DAY, HOUR, TFLOPS



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
        """The JSON schema of ``meshplan estimate --json`` (:func:`meshplan.estimate_json.estimate_json`)."""
        return estimate_json(self)


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
    derivs.extend(derivations(est, ops, la, tp_one, p2p, lt, cp_comm, (ag, rs, copies) if fsdp_per_layer else None))
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
