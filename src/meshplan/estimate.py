"""Estimate one training plan: memory per pipeline stage, FLOPs, step time and its breakdown,
throughput, MFU, and the cost of a token budget.

This is the one place where the cost modules are composed; the CLI, JSON output and tests read
the :class:`Estimate` it returns (``to_dict`` gives the documented JSON schema).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from meshplan.cost.activations import LayerActivations, freed_logits_block_bytes, loss_grad_bytes
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.compose import (
    LayerTimes,
    StageTimes,
    after_pipeline,
    at_peak,
    hidden_comm,
    kept_outputs_bytes,
    layer_times,
    merged_outputs_items,
    pp_buffer_messages,
    prefetched_unit,
    rank_other_items,
    stage_activations,
    stage_times,
    total_of,
)
from meshplan.cost.compute import OpTimes, optimizer_step_time
from meshplan.cost.contention import NCCL_CTAS, contention_time, sm_share, tp_hidden_ctas
from meshplan.cost.flops import StepFlops, step_flops
from meshplan.cost.fsdp_copies import runs_fsdp2
from meshplan.cost.memory import ModelState, StageMemory, model_state_bytes
from meshplan.cost.moe import add_moe_layers, expert_shard_degree, moe_layers_per_stage, rank_expert_params
from meshplan.cost.layer_mix import add_layer_mix, mixed_stage_activations
from meshplan.cost.partial_recompute import recomputed_fraction, recomputed_per_stage
from meshplan.cost.params import (
    ParamCounts,
    count_params,
    embedding_params_per_rank,
    head_params_per_rank,
    largest_layer_params,
    rank_params,
)
from meshplan.cost.terms import (
    KernelTerms, MicroBatchComm, Terms, UnitComm, grad_accumulate_per_micro_batch, layer_time_args, moe_layer_time_args,
)
from meshplan.derivations import derivations, grad_accumulation_rows
from meshplan.derivations_comm import collective_derivations
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
    calibration: Calibration  # the GPU generation's (one GPU; the compute of N GPUs waits for the slowest: cost.variability)
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
    torch's memory trackers count (``meshplan verify memory``).

    The per-layer and per-micro-batch terms come from :class:`meshplan.cost.terms.Terms`, the code
    the search's engine gathers per distinct row of its tables; then the schedule is simulated,
    each pipeline rank's memory and synchronization composed, and the step timed on the critical
    rank."""
    check_plan(model, cluster, plan)
    budget = budget or Budget()
    split = layer_split(model.n_layers, plan.pp, plan.vpp, plan.layer_split)
    layers = _layer_terms(model, cluster, plan, split)
    ranks = compile_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.vpp)
    sim = simulate(ranks, plan.pp * plan.vpp, layers.st.fwd, layers.st.bwd, transfer=layers.cm.p2p, act_bytes=layers.stage_act,
                   keep_timeline=keep_timeline, wgt=layers.st.wgt, runtime=plan.stack.pipeline_runtime)
    per_rank = _RankShared.of(model, plan, layers)
    stages, syncs = [], []
    for r in range(plan.pp):
        mine = stages_of_rank(r, plan.pp, plan.vpp, stage_style(plan.schedule))
        stage, sync = _rank(model, cluster, plan, layers, per_rank, sim, split, r, mine, stream_pools)
        stages.append(stage)
        syncs.append(sync)
    time = _step_time(model, plan, layers, sim, split, syncs)
    counts = count_params(model)
    flops = step_flops(model, plan.seq_len, plan.global_batch, plan.recompute, plan.attention_flops,
                       recomputed_fraction(split, plan.recompute_layers))
    derivs: list[Derivation] = []
    est = Estimate(model, cluster, plan, budget, calibration_for(cluster.gpu), counts, flops, stages, split, time, sim, derivs)
    u = layers.u
    fsdp_terms = (u.all_gather, u.reduce_scatter, tuple(u)[6:]) if layers.fsdp_per_layer else None
    derivs.extend(derivations(est, layers.ops, layers.la, layers.cm.tp_one, layers.cm.p2p, layers.lt,
                              (layers.cm.cp_kv, layers.cm.cp_dkv), fsdp_terms))
    derivs.extend(grad_accumulation_rows(est, layers.terms))
    derivs.extend(collective_derivations(est, layers))
    return est


@dataclass
class _Layers:
    """One plan's per-layer and per-micro-batch terms (a one-row run of what the search's engine
    gathers per distinct row), its stage times and the activations of its virtual stages."""

    terms: Terms
    ops: OpTimes
    la: LayerActivations
    k: KernelTerms
    cm: MicroBatchComm
    u: UnitComm
    lt: LayerTimes
    st: StageTimes
    once_per_step: bool  # ZeRO-3 keeping weights gathered and gradients unsharded through the step
    fsdp_per_layer: bool  # ZeRO-3 gathering each layer's weights per micro-batch
    layer_saving: float  # the bytes FSDP2's FP8 all-gather saves on one gathered layer
    nccl_share: float
    tp_share: float
    stage_act: list[float]
    working: float  # the backward working set of the layer that sets it
    backward_grads: float
    layer_stored: float
    lt_moe: Optional[LayerTimes] = None
    moe_ops: Optional[OpTimes] = None
    moe_stage: Optional[list[int]] = None
    ep_comm: Any = None


def _layer_terms(model: ModelSpec, cluster: ClusterSpec, plan: TrainingPlan, split: tuple[int, ...]) -> _Layers:
    """The per-layer and per-micro-batch terms of ``plan`` (MoE layers their own op times, ZeRO-3
    collectives and all-to-alls), its stage times and its virtual stages' activations."""
    stack, t, c, pp, b = plan.stack, plan.tp, plan.cp, plan.pp, plan.micro_batch
    terms = Terms(model, cluster, plan, stack)
    sp = plan.sequence_parallel and t > 1
    d, ds = plan.dp, plan.dp_shard or plan.dp
    sharded = plan.zero == 3 and plan.shard_degree > 1
    # FSDP2's FP8 all-gather: the blocks' Float8Linear weights gathered, held and used as FP8
    fp8_gather = stack.fsdp_fp8_all_gather and sharded
    # ZeRO-3 that keeps weights gathered and gradients unsharded through the step communicates like
    # ZeRO-1/2 (one reduce-scatter after the last backward, one all-gather before the first
    # forward) and holds what they hold, on top of its shards
    once_per_step = plan.zero == 3 and stack.fsdp_accumulate_unsharded
    fsdp_per_layer = sharded and not once_per_step
    # recompute of some layers per stage (recompute_layers): the stages are built from layers
    # without recompute, the recomputed ones added (meshplan.cost.partial_recompute)
    partial = plan.recompute == "full" and plan.recompute_layers is not None and plan.recompute_layers < max(split)
    mode = "none" if partial else plan.recompute
    k, cm = terms.kernel(t, c, b, sp, mode, fp8_gather), terms.comm(t, c, pp, d, b, sp)
    u = terms.units(t, c, pp, d, ds if fsdp_per_layer else 0)
    gpu = cluster.gpu
    shares = dict(nccl_share=sm_share(NCCL_CTAS, gpu.sm_count),
                  tp_share=sm_share(tp_hidden_ctas(stack.tp_comm_overlap, stack.tp_overlap_kind), gpu.sm_count))
    acc = grad_accumulate_per_micro_batch(terms, t, pp, plan.ep, plan.num_microbatches)
    lt_args = layer_time_args(
        stack, k._asdict(), cm._asdict(), u._asdict(), full_recompute=mode == "full", sp=sp,
        tp_comm_overlap=stack.tp_comm_overlap, cp=c, fsdp_per_layer=fsdp_per_layer,
        embedding_kept=(model.tied_embeddings or stack.fsdp_head_in_root) and pp == 1, **shares,
        grad_accumulate=(acc[0], acc[2], acc[3]),
    )
    lt = layer_times(**lt_args)
    st = stage_times(split, lt)
    la = terms.activations(t, c, b, sp, mode)
    # torch.distributed.pipelining keeps each stage's output until its backward (pp_buffers): the
    # message sent on, and on the last stage the logits
    stage_act = stage_activations(split, la.stored, k.emb_act, k.head_act, k.kept_output, k.held_logits)
    layers = _Layers(terms, terms.ops(t, c, b, sp, fp8_gather), la, k, cm, u, lt, st, once_per_step, fsdp_per_layer,
                     terms.fp8_saving(t, sharded), **shares, stage_act=stage_act, working=la.working,
                     backward_grads=la.gradients, layer_stored=la.stored)
    if partial:
        _add_recomputed_layers(plan, layers, lt_args, split, sp, fp8_gather)
    if model.is_moe:
        _add_moe_layers(model, plan, layers, lt_args, split, sp)
    return layers


def _add_recomputed_layers(plan: TrainingPlan, layers: _Layers, lt_args: dict, split: tuple[int, ...], sp: bool,
                           fp8_gather: bool) -> None:
    """``layers``, built without recompute, with each stage's first ``recompute_layers`` layers
    recomputed in full, in place (:mod:`meshplan.cost.partial_recompute`): their times and stored
    activations, and the larger backward working set of the two kinds."""
    terms, t, c, b = layers.terms, plan.tp, plan.cp, plan.micro_batch
    k_full, la_full = terms.kernel(t, c, b, sp, "full", fp8_gather), terms.activations(t, c, b, sp, "full")
    lt_full = layer_times(**(lt_args | {"full_recompute": True, "recompute": k_full.recompute}))
    recomputed = recomputed_per_stage(split, plan.recompute_layers)
    add_layer_mix(layers.st, recomputed, layers.lt, lt_full)
    layers.stage_act = mixed_stage_activations(layers.stage_act, recomputed, layers.la.stored, la_full.stored)
    if any(recomputed) and la_full.working > layers.working:
        layers.working, layers.backward_grads, layers.layer_stored = la_full.working, la_full.gradients, la_full.stored


def _add_moe_layers(model: ModelSpec, plan: TrainingPlan, layers: _Layers, lt_args: dict, split: tuple[int, ...], sp: bool) -> None:
    """``layers`` with its mixture-of-experts layers' own op times, ZeRO-3 collectives,
    all-to-alls and activations, in place (:func:`meshplan.cost.moe.add_moe_layers`)."""
    terms, t, c, pp, b, ep = layers.terms, plan.tp, plan.cp, plan.pp, plan.micro_batch, plan.ep
    layers.moe_ops = terms.moe_ops(t, c, b, sp, ep)
    km = terms.moe_kernel(t, c, b, sp, plan.recompute, ep)
    moe_units = terms.moe_units(t, c, pp, plan.dp, plan.dp_shard or plan.dp, ep, plan.zero)
    acc = grad_accumulate_per_micro_batch(terms, t, pp, ep, plan.num_microbatches)[1]
    layers.lt_moe = layer_times(**moe_layer_time_args(lt_args, km._asdict(), moe_units, layers.cm.expert_tp, acc))
    layers.moe_stage = moe_layers_per_stage(model, split)
    a2a = terms.a2a(t, c, pp, plan.dp, ep, b, sp, plan.recompute == "full")
    layers.ep_comm = add_moe_layers(layers.st, layers.moe_stage, layers.lt, layers.lt_moe, a2a)
    la, la_moe = layers.la, terms.moe_activations(t, c, b, sp, plan.recompute)
    layers.stage_act = mixed_stage_activations(layers.stage_act, layers.moe_stage, la.stored, la_moe.stored)
    if la_moe.working > la.working:
        layers.working, layers.backward_grads, layers.layer_stored = la_moe.working, la_moe.gradients, la_moe.stored


@dataclass(frozen=True)
class _RankShared:
    """The terms every pipeline rank of a plan shares: the LM head's loss buffers and parameters,
    the outputs torch's pipelining keeps, the largest layer's parameters and the embedding's."""

    torch_pp: bool  # torch.distributed.pipelining's per-micro-batch buffers on pp > 1
    returns: bool  # its last stage returns every micro-batch's outputs
    logits_grad: float
    logits_block: float
    head_params: int
    kept_outputs: float
    layer_params: int
    down_params: int
    kept_embedding: int
    root_embedding: int
    regathered_embedding: int  # gathered again for its backward: prefetched by a first stage of one layer

    @classmethod
    def of(cls, model: ModelSpec, plan: TrainingPlan, layers: _Layers) -> "_RankShared":
        stack, b, s, t, c, e = plan.stack, plan.micro_batch, plan.seq_len, plan.tp, plan.cp, plan.precision.activation_bytes
        pp, v, m = plan.pp, plan.vpp, plan.num_microbatches
        torch_pp = stack.pp_buffers == "per-micro-batch" and pp > 1
        # torch's pipelining returning outputs: the last stage keeps each micro-batch's logits to the
        # step's end, (m − L)·O beyond the L in flight at its peak
        returns = stack.pp_return_outputs and pp > 1
        live = int(last_stage_live_peaks(state_rows(plan.schedule, pp, m, v)[None], plan.schedule, pp, v)[0]) if returns else 0
        layer_params, down_params = largest_layer_params(model, t, plan.ep)  # ZeRO-3 buffers hold the largest layer
        embedding = embedding_params_per_rank(model, t)
        return cls(
            torch_pp, returns, loss_grad_bytes(model, b, s, t, c, stack.loss_kernels, e),
            # under torch's pipelining the schedule holds the logits through the loss (counted as the
            # last stage's output): no freed block
            0.0 if torch_pp else freed_logits_block_bytes(model, b, s, t, c, stack.loss_kernels, e),
            head_params_per_rank(model, t, pp), kept_outputs_bytes(m, live, layers.k.head_output) if returns else 0.0,
            layer_params, down_params,
            # a tied embedding shares its weight with the LM head on one stage: gathered until its backward
            embedding if model.tied_embeddings and pp == 1 else 0,
            # torchtitan's 2024 FSDP2 units: an untied embedding in the root unit, gathered through the step
            embedding if stack.fsdp_head_in_root and not model.tied_embeddings else 0,
            0 if (model.tied_embeddings and pp == 1) or stack.fsdp_head_in_root else embedding,
        )


@dataclass(frozen=True)
class _RankSync:
    """A pipeline rank's exposed work after its pipeline (s): DP gradient sync, optimizer step,
    weight all-gather, and the (gradient, all-gather) seconds hidden behind its compute."""

    after: float
    optimizer: float
    param_gather: float
    hidden: tuple[float, float]


def _rank(model: ModelSpec, cluster: ClusterSpec, plan: TrainingPlan, layers: _Layers, shared: _RankShared, sim: SimResult,
          split: tuple[int, ...], r: int, mine: list[int], stream_pools: bool) -> tuple[StageMemory, _RankSync]:
    """Pipeline rank ``r`` (holding the virtual stages ``mine``): its peak memory and its work after
    the pipeline."""
    stack, t, pp, rec = plan.stack, plan.tp, plan.pp, plan.precision
    last = pp * plan.vpp - 1
    n_layers = sum(split[k] for k in mine)
    n_moe = sum(layers.moe_stage[k] for k in mine) if model.is_moe else 0
    params = rank_params(model, t, pp, n_layers, 0 in mine, last in mine, n_moe, plan.ep)
    experts = rank_expert_params(model, t, plan.ep, n_moe)
    shard, expert_shard = plan.shard_degree, expert_shard_degree(plan)
    fsdp2 = runs_fsdp2(plan.zero, stack.kernels)
    state = model_state_bytes(params - experts, rec, plan.zero, shard, fsdp2)
    if experts:  # expert weights: E/ep per GPU, ZeRO-sharded over the expert data-parallel group
        ex = model_state_bytes(experts, rec, plan.zero, expert_shard, fsdp2)
        state = ModelState(state.weights + ex.weights, state.gradients + ex.gradients, state.optimizer + ex.optimizer)
    # FSDP2's all-gather buffers, in the pool of its copy-in stream
    pool = layers.terms.pool(t, pp, tuple((split[k], k == 0, k == last) for k in mine), rec.weight_bytes, stack.fsdp_head_in_root,
                             plan.ep, stack.fsdp_fp8_all_gather and plan.zero == 3 and shard > 1) if fsdp2 and stream_pools else 0.0
    mem = _rank_memory(plan, layers, shared, sim, split, r, mine, n_layers, params, state, pool)
    sync = _rank_sync(plan, layers, mine, n_layers, params, experts, fsdp2)
    return mem, sync


def _rank_memory(plan: TrainingPlan, layers: _Layers, shared: _RankShared, sim: SimResult, split: tuple[int, ...], r: int, mine: list[int],
                 n_layers: int, params: int, state: ModelState, pool: float) -> StageMemory:
    """Rank ``r``'s peak: its model state, the activations of the simulated schedule at its peak and
    the other items (:func:`meshplan.cost.compose.rank_other_items`); where its last stage returns
    the step's outputs, the larger of that and the step's end, the kept outputs merged."""
    stack, pp, m, rec, cal = plan.stack, plan.pp, plan.num_microbatches, plan.precision, layers.terms.cal
    last = pp * plan.vpp - 1
    act_items = {
        "stored": sim.peak_activation[r],
        "backward_working_set": layers.working - layers.backward_grads,
        "backward_gradients": layers.backward_grads,
    }
    messages = pp_buffer_messages(stack.pp_buffers, m, sum(k != 0 for k in mine), sum(k != last for k in mine))
    act_msg, p2p_bytes = layers.cm.act_msg, layers.cm.p2p_bytes
    other = rank_other_items(
        reserve=cal.runtime_reserve, holds_head=last in mine, logits_grad=shared.logits_grad, head_act=layers.k.head_act,
        zero=plan.zero, shard=plan.shard_degree, params=params, layer_params=shared.layer_params, head_params=shared.head_params,
        kept_embedding_params=shared.kept_embedding, weight_bytes=rec.weight_bytes,
        grad_bytes=rec.grad_bytes, reshard_after_forward=stack.reshard_after_forward,
        once_per_step=layers.once_per_step, tp=plan.tp, act_msg=act_msg, pp=pp, p2p_bytes=p2p_bytes, pp_messages=messages,
        working=layers.working, root_embedding_params=shared.root_embedding, head_in_root=stack.fsdp_head_in_root,
        down_params=shared.down_params, layer_stored=layers.layer_stored, logits_block=shared.logits_block,
        kept_outputs=shared.kept_outputs, gather_pool=pool, layer_saving=layers.layer_saving,
        stage_saving=n_layers * layers.layer_saving,
        prefetch=prefetched_unit([(split[k], k == 0) for k in mine], shared.layer_params, shared.regathered_embedding),
    )
    rank_mem = dict(rank=r, layers=n_layers, params=params, weights=state.weights, gradients=state.gradients,
                    optimizer=state.optimizer, peak_inflight=sim.peak_inflight[r])
    live, buffers = at_peak(act_items, other)  # what the moment freed or has not built counts with the activations
    mem = StageMemory(**rank_mem, activations=total_of(live), other=total_of(buffers),
                      activation_items=live, other_items=buffers)
    step_outputs = m * layers.k.head_output if shared.returns and last in mine else 0.0
    if step_outputs:  # the step's end, the kept outputs merged: no activations left
        merged = merged_outputs_items(reserve=cal.runtime_reserve, tp=plan.tp, act_msg=act_msg, pp=pp, p2p_bytes=p2p_bytes,
                                      pp_messages=messages, step_outputs=step_outputs,
                                      gather_pool=pool if plan.zero == 3 and plan.shard_degree > 1 else 0.0)
        at_end = StageMemory(**{**rank_mem, "peak_inflight": 0}, activations=0.0, other=total_of(merged),
                             activation_items={k: 0.0 for k in act_items}, other_items=merged)
        mem = at_end if at_end.total > mem.total else mem
    return mem


def _rank_sync(plan: TrainingPlan, layers: _Layers, mine: list[int], n_layers: int, params: int, experts: int,
               fsdp2: bool) -> _RankSync:
    """A rank's DP gradient sync and weight all-gather (:meth:`meshplan.cost.terms.Terms.dp`),
    exposed after and before its pipeline work (:func:`meshplan.cost.compose.after_pipeline`),
    FSDP2's copies of a step's one reduce-scatter and all-gather, and its optimizer step."""
    terms, st, stack, shard = layers.terms, layers.st, plan.stack, plan.shard_degree
    grad_comm, pg = terms.dp(plan.tp, plan.cp, plan.pp, plan.dp, plan.dp_shard or plan.dp, plan.ep, plan.zero, params, experts,
                             n_layers)
    dp_args = dict(
        grad_comm=grad_comm, param_gather=pg, last_bwd=sum(st.bwd[k] for k in mine),
        first_fwd=sum(st.fwd[k] for k in mine), n_layers=n_layers,
        overlap_grad_reduce=stack.overlap_grad_reduce, overlap_param_gather=stack.overlap_param_gather,
    )
    a, g = after_pipeline(**dp_args, nccl_share=layers.nccl_share)
    if layers.once_per_step and fsdp2 and shard > 1:  # FSDP2's copies of the step's one reduce-scatter and all-gather
        units_here = n_layers + (0 in mine) + (plan.pp * plan.vpp - 1 in mine)
        copy_in, copy_out = terms.step_copies(plan.tp, params, units_here, n_layers)
        a, g = a + copy_in, g + copy_out
    a0, g0 = after_pipeline(**dp_args)  # without contention: what stays hidden
    local = params / (shard if plan.zero >= 1 else 1)
    if experts and plan.zero >= 1:
        local = (params - experts) / shard + experts / expert_shard_degree(plan)
    opt = optimizer_step_time(local, plan.precision, terms.cluster.gpu, terms.cal, stack.kernels)
    return _RankSync(a, opt, g, (hidden_comm(grad_comm, a0), hidden_comm(pg, g0)))


def _step_time(model: ModelSpec, plan: TrainingPlan, layers: _Layers, sim: SimResult, split: tuple[int, ...],
               syncs: list[_RankSync]) -> StepTime:
    """The step on the critical rank (the last to finish its pipeline work and gradient sync) and
    where it goes; the optimizer step and weight gather of the slowest rank at them."""
    pp, m, st = plan.pp, plan.num_microbatches, layers.st
    ends = [sim.finish[r] + syncs[r].after for r in range(pp)]
    crit = max(range(pp), key=lambda r: ends[r])
    mine = stages_of_rank(crit, pp, plan.vpp, stage_style(plan.schedule))
    per_mb = lambda xs: m * sum(xs[k] for k in mine)  # noqa: E731
    slowest = max(range(pp), key=lambda r: syncs[r].optimizer + syncs[r].param_gather)
    opt_s, pg_s = syncs[slowest].optimizer, syncs[slowest].param_gather
    # Megatron-Core's FP8 weight casts, once per step: the first micro-batch's forward crosses
    # every layer before the steady state (fp8_weight_cast_per_step)
    n_moe = sum(layers.moe_stage) if model.is_moe else 0
    cast_s = (model.n_layers - n_moe) * layers.ops.weight_cast + (n_moe * layers.moe_ops.weight_cast if n_moe else 0.0)
    hidden = _hidden_per_step(split, mine, m, layers.lt, layers.lt_moe if model.is_moe else layers.lt,
                              layers.moe_stage if model.is_moe else None, syncs[crit].hidden, syncs[slowest].hidden[1])
    ep_comm = layers.ep_comm
    return StepTime(
        step_s=ends[crit] + opt_s + pg_s + cast_s,
        critical_rank=crit,
        compute_s=per_mb(st.comp_fwd) + per_mb(st.comp_bwd),
        recompute_s=per_mb(st.recompute),
        tp_comm_s=per_mb(st.tp_fwd) + per_mb(st.tp_bwd),
        cp_comm_s=per_mb(st.cp_fwd) + per_mb(st.cp_bwd),
        fsdp_comm_s=per_mb(st.fsdp_fwd) + per_mb(st.fsdp_bwd),
        pipeline_bubble_s=sim.finish[crit] - sim.busy[crit],
        dp_comm_s=syncs[crit].after,
        optimizer_s=opt_s,
        param_gather_s=pg_s,
        makespan_s=sim.makespan,
        bubble_fraction=sim.bubble_fraction,
        bubble_overhead=sim.bubble_overhead,
        per_rank_finish_s=sim.finish,
        ep_comm_s=per_mb(ep_comm.fwd) + per_mb(ep_comm.bwd) if ep_comm else None,
        fp8_weight_cast_s=cast_s if cast_s else None,
        hidden_comm=hidden,
        contention=_contention_per_step(hidden, layers.nccl_share, layers.tp_share),
    )


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
