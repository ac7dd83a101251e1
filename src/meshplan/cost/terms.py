"""The terms of a plan that depend on a few of its fields: computed by one code path for
:func:`meshplan.estimate.estimate`'s one plan and for the search's whole tables.

For one model, cluster, stack and the fields a search does not vary (sequence length s,
precision, attention, rank order), each term is a function of a handful of integers — a layer's
op times and activations of (t, c, b, SP, recompute, FP8 gather), one micro-batch's collectives
of (t, c, p, d, b, SP), ZeRO-3's unit collectives of (t, c, p, d, shard group), a rank's DP
synchronization, its parameter counts — cached, so that ``estimate`` computes its plan's terms
and the search's engine (:mod:`meshplan.search.engine`) each distinct row's through the same
expressions: the same bits.

Symbols: t, c, p, d, ep — tensor, context, pipeline, data and expert-parallel degrees; d_s the
dp indices of the ZeRO shard group (HSDP: fewer than d), the shard group d_s·c; b the
micro-batch (sequences), s the sequence length, n = b·s/c the tokens of a micro-batch on one GPU,
h the hidden size, e the bytes of an activation element.
"""

from __future__ import annotations

from functools import wraps
from typing import Any, Callable, NamedTuple

from meshplan.cost import collectives as coll
from meshplan.cost.activations import (
    LayerActivations, embedding_activation_bytes, freed_logits_block_bytes, head_activation_bytes, held_logits_bytes,
    layer_activations, logits_output_bytes, loss_grad_bytes, saved_gemm_input_bytes,
)
from meshplan.cost.async_tp import micro_pipeline_tp_times
from meshplan.cost.calibration import calibration_for, synchronized
from meshplan.cost.comm import Placements, dp_sync_times, fsdp_unit_times, placements, tp_collective_time
from meshplan.cost.compute import OpTimes, embedding_op_times, head_op_times, input_projection_backward, layer_op_times, recompute_time
from meshplan.cost.cp_exchange import cp_exchange_collectives
from meshplan.cost.fsdp_copies import fp8_gather_saving, fsdp2_step_copy_times, fsdp2_unit_copy_times, gather_pool_bytes, runs_fsdp2
from meshplan.cost.moe import (
    alltoall_times, expert_dp_placements, expert_group_placements, expert_tp_time, moe_fsdp_layer_times, rank_expert_params,
)
from meshplan.cost.grad_accumulation import accumulation_kind, grad_accumulation_bytes, grad_accumulation_share
from meshplan.cost.kernel_time import memory_time
from meshplan.cost.params import (
    embedding_params_per_rank, head_params_per_rank, largest_layer_params, layer_params_per_rank, rank_params,
)
from meshplan.cost.tp_backward import block_backward_tp
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import Stack


class KernelTerms(NamedTuple):
    """One layer's op times (s) and activations (bytes) for one micro-batch, the embedding's and
    the LM head's, and the outputs torch's pipelining keeps."""

    fwd: float
    bwd: float
    wgt: float
    fwd_gemm: float
    bwd_gemm: float
    fwd_attention: float
    bwd_attention: float
    recompute: float
    emb_fwd: float
    emb_bwd: float
    emb_wgt: float
    head_fwd: float
    head_bwd: float
    head_wgt: float
    act_stored: float
    act_working: float
    emb_act: float
    head_act: float
    kept_output: float  # a stage's output kept to its backward (per-micro-batch buffers)
    head_output: float  # the last stage's logits output (per-micro-batch buffers)
    held_logits: float  # the logits held through the loss (per-micro-batch buffers)


class MoeKernelTerms(NamedTuple):
    """A mixture-of-experts layer's op times (E/ep experts per GPU) and activations."""

    fwd: float
    bwd: float
    wgt: float
    fwd_gemm: float
    bwd_gemm: float
    fwd_attention: float
    bwd_attention: float
    recompute: float
    act_stored: float
    act_working: float


class MicroBatchComm(NamedTuple):
    """The collectives of one micro-batch, which do not depend on the ZeRO stage (s, bytes)."""

    tp_one: float  # one TP collective of an n·h·e activation
    cp_kv: float  # the CP K|V exchange
    cp_dkv: float  # its backward transfer
    act_msg: float  # one activation tensor, n·h·e bytes
    p2p_bytes: float  # one stage-to-stage message
    p2p: float  # its transfer time
    tp_micro_fwd: float  # micro-pipelined TP, forward and backward
    tp_micro_bwd: float
    expert_tp: float  # an MoE layer's expert TP exchange
    # under tp_backward_overlap (meshplan.cost.tp_backward; else 0): the backward TP each block
    # leaves exposed, attention's and a dense MLP's, and what one block's backward moves
    tp_bwd_attn: float
    tp_bwd_mlp: float
    tp_bwd_moved: float


class UnitComm(NamedTuple):
    """Per-layer ZeRO-3's unit collectives (s) and, on torch's stacks, FSDP2's copies beside them."""

    all_gather: float
    reduce_scatter: float
    emb_all_gather: float
    emb_reduce_scatter: float
    head_all_gather: float
    head_reduce_scatter: float
    copy_out: float
    copy_in: float
    emb_copy_out: float
    emb_copy_in: float
    head_copy_out: float
    head_copy_in: float


class PerTpCounts(NamedTuple):
    """Counts of one rank that depend on the TP degree (and ep) only."""

    loss_grad_per_token: float  # the loss-gradient buffer bytes per token
    layer_params: int  # the largest layer's parameters (ZeRO-3's buffers hold it)
    head_params: int
    embedding_params: int
    down_params: int  # the largest layer's down projection's
    logits_block_per_token: float  # the freed logits' block per token
    fp8_layer_saving: float  # the bytes a gathered layer saves under FSDP2's FP8 all-gather (0 without it)


def _cached(method: Callable) -> Callable:
    """``method`` of :class:`Terms` computed once per distinct positional arguments (the instance's
    own dictionary: a plan's estimate makes one instance, a search's engine one per stack)."""
    name = method.__name__

    @wraps(method)
    def cached(self, *args):
        key = (name, args)
        memo = self._memo
        if key not in memo:
            memo[key] = method(self, *args)
        return memo[key]

    return cached


class Terms:
    """The cached per-argument terms of plans of one model, cluster, stack and base plan (its
    sequence length, precision, attention, attention FLOPs and rank order); see the module
    docstring. ``stack``: as it applies to the plans evaluated (its rules applied)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, base: TrainingPlan, stack: Stack):
        self.model, self.cluster, self.base, self.stack = model, cluster, base, stack
        # compute at the pace of the slowest of the cluster's GPUs (meshplan.cost.variability)
        self.cal = synchronized(calibration_for(cluster.gpu), cluster.num_gpus)
        self.rec = base.precision
        self.e = self.rec.activation_bytes
        self._memo: dict[tuple, Any] = {}  # (method, arguments) -> value (:func:`_cached`)

    # ---- one layer, one micro-batch ------------------------------------------------------------
    @_cached
    def ops(self, t: int, c: int, b: int, sp: bool, g8: bool) -> OpTimes:
        """A dense layer's op times; ``g8``: the weights arrive cast by FSDP2's FP8 all-gather."""
        base, st = self.base, self.stack
        return layer_op_times(self.model, b, base.seq_len, t, c, bool(sp), base.attention, base.attention_flops, self.cluster.gpu,
                              self.cal, self.rec.compute_dtype, self.e, st.kernels, weights_in_fp8=bool(g8),
                              fp8_linears=st.fp8_linears, attention_kernel=st.attention_kernel,
                              fp8_scaling=self.rec.fp8_scaling)

    @_cached
    def emb_ops(self, t: int, c: int, b: int) -> OpTimes:
        """The embedding's op times."""
        return embedding_op_times(self.model, b, self.base.seq_len, t, c, self.cluster.gpu, self.cal, self.e)

    @_cached
    def head_ops(self, t: int, c: int, b: int) -> OpTimes:
        """The LM head's (and loss's) op times."""
        return head_op_times(self.model, b, self.base.seq_len, t, c, self.cluster.gpu, self.cal, self.rec.compute_dtype, self.e,
                             self.stack.loss_kernels)

    @_cached
    def activations(self, t: int, c: int, b: int, sp: bool, mode: str, moe: bool = False) -> LayerActivations:
        """A layer's activations under recompute ``mode`` (an MoE layer's with ``moe``)."""
        gi = saved_gemm_input_bytes(self.rec.compute_dtype, self.stack.kernels, self.e, self.stack.fp8_linears)
        return layer_activations(self.model, b, self.base.seq_len, t, c, bool(sp), mode, self.base.attention, self.e,
                                 moe=moe, gemm_input_bytes=gi, kernels=self.stack.kernels)

    @_cached
    def p2p_bytes(self, t: int, c: int, b: int, sp: bool) -> float:
        """Bytes of one stage-to-stage message, n·h·e (n = b·s/c tokens), over t with sequence
        parallelism."""
        act_msg = b * self.base.seq_len / c * self.model.hidden * self.e
        return act_msg / (t if sp else 1)

    @_cached
    def kernel(self, t: int, c: int, b: int, sp: bool, mode: str, g8: bool) -> KernelTerms:
        """A layer's op times and activations, the embedding's and the head's, of micro-batch b
        under recompute ``mode``; ``g8``: the weights arrive cast by FSDP2's FP8 all-gather."""
        model, s, e, st = self.model, self.base.seq_len, self.e, self.stack
        sp = bool(sp)
        ops, emb, head = self.ops(t, c, b, sp, g8), self.emb_ops(t, c, b), self.head_ops(t, c, b)
        la = self.activations(t, c, b, sp, mode)
        kept = st.pp_buffers == "per-micro-batch"
        return KernelTerms(
            ops.fwd, ops.bwd, ops.bwd_weight, ops.fwd_gemm, ops.bwd_gemm, ops.fwd_attention, ops.bwd_attention,
            recompute_time(ops, mode), emb.fwd, emb.bwd, emb.bwd_weight, head.fwd, head.bwd, head.bwd_weight,
            la.stored, la.working, embedding_activation_bytes(model, b, s, t, c, sp),
            head_activation_bytes(model, b, s, t, c, sp, e, st.loss_kernels, st.kernels),
            self.p2p_bytes(t, c, b, sp) if kept else 0.0,
            logits_output_bytes(model, b, s, t, c, e) if kept else 0.0,
            held_logits_bytes(model, b, s, t, c, e, st.loss_kernels) if kept else 0.0,
        )

    @_cached
    def moe_ops(self, t: int, c: int, b: int, sp: bool, ep: int) -> OpTimes:
        """A mixture-of-experts layer's op times, E/ep experts per GPU."""
        base, st = self.base, self.stack
        return layer_op_times(self.model, b, base.seq_len, t, c, bool(sp), base.attention, base.attention_flops, self.cluster.gpu,
                              self.cal, self.rec.compute_dtype, self.e, st.kernels, moe=True, ep=ep, fp8_linears=st.fp8_linears,
                              attention_kernel=st.attention_kernel, fp8_scaling=self.rec.fp8_scaling)

    @_cached
    def moe_activations(self, t: int, c: int, b: int, sp: bool, mode: str) -> LayerActivations:
        """A mixture-of-experts layer's activations (they do not depend on ep)."""
        return self.activations(t, c, b, sp, mode, True)

    @_cached
    def moe_kernel(self, t: int, c: int, b: int, sp: bool, mode: str, ep: int) -> MoeKernelTerms:
        """A mixture-of-experts layer's op times and activations."""
        ops, la = self.moe_ops(t, c, b, sp, ep), self.moe_activations(t, c, b, sp, mode)
        return MoeKernelTerms(ops.fwd, ops.bwd, ops.bwd_weight, ops.fwd_gemm, ops.bwd_gemm, ops.fwd_attention,
                              ops.bwd_attention, recompute_time(ops, mode), la.stored, la.working)

    @_cached
    def comm(self, t: int, c: int, p: int, d: int, b: int, sp: bool) -> MicroBatchComm:
        """The collectives of one micro-batch. They use the TP, CP and PP groups only, which sit
        where they do whatever the HSDP shard group (:func:`meshplan.cost.comm.placements`), so the
        placements of d_s = d serve."""
        model, cluster, cal, e, st = self.model, self.cluster, self.cal, self.e, self.stack
        pl = self.place(t, c, p, d, d)
        tokens = b * self.base.seq_len / c
        act_msg = tokens * model.hidden * e  # one activation tensor n·h·e
        tp_one = tp_collective_time(act_msg, bool(sp), pl.tp, cluster, cal)
        cp_kv, cp_dkv = cp_exchange_collectives(model, tokens, t, e, st.kernels, c, pl.cp, cluster, cal)
        p2p_bytes = self.p2p_bytes(t, c, b, sp)
        p2p = self.p2p_time(p2p_bytes, pl, t > 1 and not sp) if p > 1 else 0.0
        micro = (micro_pipeline_tp_times(model, tokens, t, bool(sp), pl.tp, cluster, cal, self.rec.compute_dtype, e, st.kernels)
                 if st.tp_overlap_kind == "micro-pipeline" else (0.0, 0.0))
        expert_tp = expert_tp_time(model, tokens, pl.tp, e, cluster, cal) if model.is_moe else 0.0
        return MicroBatchComm(tp_one, cp_kv, cp_dkv, act_msg, p2p_bytes, p2p, *micro, expert_tp,
                              *self.backward_tp(t, c, p, d, b, sp))

    def p2p_time(self, message: float, pl: Placements, split: bool) -> float:
        """One stage-to-stage transfer of ``message`` bytes; with the stack's ``pp_scatter_gather``
        and a ``split`` (TP without sequence parallelism) each TP rank sends 1/t of it and the
        receiving stage all-gathers it over TP (Megatron-LM's ``scatter_gather_tensors_in_pipeline``:
        ``split_tensor_into_1d_equal_chunks`` before the send, ``gather_split_1d_tensor`` after the
        receive, ``megatron/p2p_communication.py@v2.6``; DeepSpeed's ``PartitionedTensor``):
        T = T_send(m/t) + T_AG(m over t), else T_send(m)."""
        cluster, cal = self.cluster, self.cal
        if not (self.stack.pp_scatter_gather and split):
            return coll.collective_time("send_recv", message, pl.pp, cluster, cal)
        return (coll.collective_time("send_recv", message / pl.tp.size, pl.pp, cluster, cal)
                + coll.collective_time("all_gather", message, pl.tp, cluster, cal))

    @property
    def accumulation(self) -> str:
        """The plan's gradient accumulation kind (:func:`meshplan.cost.grad_accumulation.accumulation_kind`:
        the stack's ``grad_accumulation``, or FSDP2's own)."""
        return accumulation_kind(self.stack, self.rec.weight_bytes, self.rec.grad_bytes)

    def accumulation_share(self, microbatches):
        """Passes of :attr:`accumulation` per micro-batch of a step of ``microbatches`` (a number or
        an array over plans; :func:`meshplan.cost.grad_accumulation.grad_accumulation_share`)."""
        return grad_accumulation_share(self.accumulation, microbatches, self.rec.weight_bytes, self.rec.grad_bytes)

    @_cached
    def grad_accumulation_passes(self, t: int, pp: int, ep: int) -> tuple[float, float, float, float]:
        """Seconds of one pass of the plan's gradient accumulation (:attr:`accumulation`) over a
        rank's gradients: (a dense layer's, an MoE layer's, the embedding's, the final norm and LM
        head's)."""
        per = grad_accumulation_bytes(self.accumulation, self.rec.weight_bytes, self.rec.grad_bytes)
        if not per:
            return (0.0, 0.0, 0.0, 0.0)
        model, gpu, cal = self.model, self.cluster.gpu, self.cal
        counts = (layer_params_per_rank(model, t), layer_params_per_rank(model, t, True, ep) if model.is_moe else 0,
                  embedding_params_per_rank(model, t), head_params_per_rank(model, t, pp))
        return tuple(memory_time(per * n, gpu, cal) if n else 0.0 for n in counts)

    @_cached
    def backward_tp(self, t: int, c: int, p: int, d: int, b: int, sp: bool) -> tuple[float, float, float]:
        """(attention's exposed, a dense MLP's exposed, one block's moved) backward TP seconds of
        one micro-batch when the column-parallel linears run them behind their GEMMs
        (:func:`meshplan.cost.tp_backward.block_backward_tp`); zeros unless the stack does and TP
        spans more than one GPU."""
        pl = self.place(t, c, p, d, d)
        if not self.stack.tp_backward_overlap or pl.tp.size <= 1:
            return 0.0, 0.0, 0.0
        model, cluster, cal = self.model, self.cluster, self.cal
        tokens = b * self.base.seq_len / c
        act_msg = tokens * model.hidden * self.e
        ag, rs, ar = (coll.collective_time(op, act_msg, pl.tp, cluster, cal) for op in ("all_gather", "reduce_scatter", "all_reduce"))
        attn, mlp = input_projection_backward(model, tokens, t, self.stack.kernels, cluster.gpu, cal, self.rec.compute_dtype, self.e,
                                              self.rec.fp8_scaling)
        (x_attn, moved), (x_mlp, _) = (block_backward_tp(bool(sp), ag, rs, ar, *g) for g in (attn, mlp))
        return x_attn, x_mlp, moved

    @_cached
    def a2a(self, t: int, c: int, p: int, d: int, ep: int, b: int, sp: bool, full: bool) -> tuple[float, float]:
        """Exposed (forward, backward) expert all-to-all of one MoE layer and micro-batch (``full``:
        full recompute runs the forward's again)."""
        tokens = b * self.base.seq_len / c
        return alltoall_times(self.model, tokens, t, bool(sp), self.e, bool(full), self.expert_place(t, c, p, d, ep)[0],
                              self.cluster, self.cal)

    # ---- ZeRO-3 units, DP synchronization ------------------------------------------------------
    @_cached
    def units(self, t: int, c: int, p: int, d: int, fsdp: int) -> UnitComm:
        """ZeRO-3's per-layer and embedding/head unit collectives over the shard group of ``fsdp``
        dp indices, and on torch's stacks FSDP2's copies beside them (all 0 when ``fsdp`` is 0:
        weights not sharded per layer)."""
        if not fsdp:
            return UnitComm(*(0.0,) * len(UnitComm._fields))
        g8 = self.stack.fsdp_fp8_all_gather
        units = fsdp_unit_times(self.model, t, p, self.rec, self.place(t, c, p, d, fsdp).shard, self.cluster, self.cal, g8,
                                per_tensor=self.stack.zero3_blocking)
        copies = (fsdp2_unit_copy_times(self.model, t, p, self.rec, self.cluster.gpu, self.cal, fp8_gather=g8)
                  if runs_fsdp2(3, self.stack.kernels) else (0.0,) * 6)
        return UnitComm(*units, *copies)

    @_cached
    def moe_units(self, t: int, c: int, p: int, d: int, ds: int, ep: int, zero: int) -> tuple[float, float, float, float]:
        """Per-layer ZeRO-3 (all-gather, reduce-scatter) of one MoE layer: its dense part over the
        shard group, its E/ep experts over the expert data-parallel group; and on torch's stacks
        FSDP2's (copy-out, copy-in) of the layer (0 where weights are not sharded per layer)."""
        if not (zero == 3 and ds * c > 1 and not self.stack.fsdp_accumulate_unsharded):
            return 0.0, 0.0, 0.0, 0.0
        pl = self.place(t, c, p, d, ds)
        edp = self.expert_place(t, c, p, d, ep)[1]
        copies = (fsdp2_unit_copy_times(self.model, t, p, self.rec, self.cluster.gpu, self.cal, moe=True, ep=ep)[:2]
                  if runs_fsdp2(zero, self.stack.kernels) else (0.0, 0.0))
        return (*moe_fsdp_layer_times(self.model, t, ep, self.rec, pl.shard, edp, self.cluster, self.cal,
                                      per_tensor=self.stack.zero3_blocking), *copies)

    @_cached
    def fp8_saving(self, t: int, sharded: bool) -> float:
        """The bytes FSDP2's FP8 all-gather saves on one gathered layer at TP degree ``t`` (0 unless
        the stack gathers in FP8 and the weights are ZeRO-3 ``sharded``)."""
        return fp8_gather_saving(self.model, t, self.rec.weight_bytes, self.stack.fsdp_fp8_all_gather and sharded)

    @_cached
    def dp(self, t: int, c: int, p: int, d: int, ds: int, ep: int, zero: int, params: int, experts: int,
           n_layers: int) -> tuple[float, float]:
        """(gradient sync, weight all-gather) of a rank holding ``params`` parameters in
        ``n_layers`` layers, of which ``experts`` routed-expert ones are synchronized over the
        expert data-parallel group of d/ep·c GPUs."""
        pl = self.place(t, c, p, d, ds)
        once = zero == 3 and self.stack.fsdp_accumulate_unsharded
        saving = n_layers * self.fp8_saving(t, zero == 3 and ds * c > 1)
        grad_comm, pg = dp_sync_times(params - experts, zero, once, ds * c, self.rec, pl, self.cluster, self.cal, saving)
        if experts:
            pl_experts = expert_dp_placements(pl, self.expert_place(t, c, p, d, ep)[1])
            ex_comm, ex_pg = dp_sync_times(experts, zero, once, d // ep * c, self.rec, pl_experts, self.cluster, self.cal)
            grad_comm, pg = grad_comm + ex_comm, pg + ex_pg
        return grad_comm, pg

    @_cached
    def step_copies(self, t: int, params: int, units: int, n_layers: int) -> tuple[float, float]:
        """(copy-in, copy-out) of a rank's FSDP2 units that keep weights gathered and gradients
        unsharded through the step (:func:`meshplan.cost.fsdp_copies.fsdp2_step_copy_times`):
        ``units`` units holding ``params`` parameters in ``n_layers`` layers, sharded."""
        return fsdp2_step_copy_times(params, units, self.rec, self.cluster.gpu, self.cal, n_layers * self.fp8_saving(t, True))

    # ---- placements and counts -----------------------------------------------------------------
    @_cached
    def place(self, t: int, c: int, p: int, d: int, ds: int) -> Placements:
        """Where the plan's groups sit (:func:`meshplan.cost.comm.placements`)."""
        return placements(self.cluster, t, c, p, d, ds, self.base.rank_order)

    @_cached
    def expert_place(self, t: int, c: int, p: int, d: int, ep: int):
        """(ep group, expert data-parallel group) (:func:`meshplan.cost.moe.expert_group_placements`)."""
        return expert_group_placements(self.cluster, t, c, p, d, ep, self.base.rank_order)

    @_cached
    def rank_params(self, *args) -> int:
        """:func:`meshplan.cost.params.rank_params` of the model."""
        return rank_params(self.model, *args)

    @_cached
    def expert_params(self, *args) -> int:
        """:func:`meshplan.cost.moe.rank_expert_params` of the model."""
        return rank_expert_params(self.model, *args)

    @_cached
    def pool(self, *args) -> float:
        """:func:`meshplan.cost.fsdp_copies.gather_pool_bytes` of the model."""
        return gather_pool_bytes(self.model, *args)

    @_cached
    def per_tp(self, t: int, ep: int, pp: int) -> PerTpCounts:
        """The counts of a rank that depend on its TP degree (and ep) only (:class:`PerTpCounts`)."""
        model, kernels = self.model, self.stack.loss_kernels
        layer, down = largest_layer_params(model, t, ep)
        return PerTpCounts(loss_grad_bytes(model, 1, 1, t, 1, kernels, self.e), layer, head_params_per_rank(model, t, pp),
                           embedding_params_per_rank(model, t), down, freed_logits_block_bytes(model, 1, 1, t, 1, kernels, self.e),
                           fp8_gather_saving(model, t, self.rec.weight_bytes, self.stack.fsdp_fp8_all_gather))


_OP_FIELDS = ("fwd", "bwd", "wgt", "fwd_gemm", "bwd_gemm", "fwd_attention", "bwd_attention", "recompute")


def layer_time_args(stack: Stack, k, cm, u, *, full_recompute, sp, tp_comm_overlap, cp, fsdp_per_layer, embedding_kept,
                    nccl_share: float, tp_share: float, grad_accumulate: tuple = (0.0, 0.0, 0.0)) -> dict:
    """The arguments of :func:`meshplan.cost.compose.layer_times` for a dense layer, from its
    kernel terms ``k`` (:class:`KernelTerms`), micro-batch collectives ``cm``
    (:class:`MicroBatchComm`) and ZeRO-3 unit collectives ``u`` (:class:`UnitComm`), each a
    mapping of field to number (one plan) or to array (rows of plans), and the plan's switches
    (numbers or arrays alike): one builder for ``estimate`` and the search's engine.
    ``embedding_kept``: the LM head reuses a tied embedding's weight on the one stage, or FSDP2's
    root unit keeps it gathered. ``grad_accumulate``: the seconds a micro-batch's backward spends
    joining its weight gradients to the step's (the layer's, the embedding's, the head's:
    :func:`grad_accumulate_per_micro_batch`), part of the weight-gradient work."""
    acc_layer, acc_emb, acc_head = grad_accumulate
    args = dict(
        full_recompute=full_recompute,
        emb=(k["emb_fwd"], k["emb_bwd"] + acc_emb, k["emb_wgt"] + acc_emb),
        head=(k["head_fwd"], k["head_bwd"] + acc_head, k["head_wgt"] + acc_head),
        tp_one=cm["tp_one"], sp=sp, tp_comm_overlap=tp_comm_overlap, cp=cp, cp_comm=(cm["cp_kv"], cm["cp_dkv"]),
        kernels=stack.kernels, fsdp_per_layer=fsdp_per_layer, all_gather=u["all_gather"], reduce_scatter=u["reduce_scatter"],
        reshard_after_forward=stack.reshard_after_forward, zero3_blocking=stack.zero3_blocking,
        fsdp_units=(u["emb_all_gather"], u["emb_reduce_scatter"], u["head_all_gather"], u["head_reduce_scatter"]),
        fsdp_copies=tuple(u[name] for name in UnitComm._fields[6:]),
        embedding_kept=embedding_kept, nccl_share=nccl_share, tp_share=tp_share,
        own_backward_tp=(cm["tp_bwd_attn"], cm["tp_bwd_mlp"], cm["tp_bwd_moved"]) if stack.tp_backward_overlap else None,
        **{name: k[name] for name in _OP_FIELDS},
    )
    args["bwd"], args["wgt"] = args["bwd"] + acc_layer, args["wgt"] + acc_layer
    if stack.tp_overlap_kind == "micro-pipeline":
        args["tp_overlapped"] = (cm["tp_micro_fwd"], cm["tp_micro_bwd"])
    return args


def moe_layer_time_args(dense: dict, km, moe_units, expert_tp, grad_accumulate=0.0) -> dict:
    """:func:`layer_time_args` of a mixture-of-experts layer: the dense layer's ``dense`` with the
    MoE layer's kernel terms ``km`` (:class:`MoeKernelTerms`, a mapping), its ZeRO-3 collectives
    and FSDP2 copies ``moe_units`` (:meth:`Terms.moe_units`: all-gather, reduce-scatter, copy-out,
    copy-in), its expert TP exchange ``expert_tp`` and its gradients' accumulation per micro-batch
    ``grad_accumulate`` (s)."""
    all_gather, reduce_scatter, copy_out, copy_in = moe_units
    ops = {name: km[name] for name in _OP_FIELDS}
    ops["bwd"], ops["wgt"] = ops["bwd"] + grad_accumulate, ops["wgt"] + grad_accumulate
    return dense | {"all_gather": all_gather, "reduce_scatter": reduce_scatter, "expert_tp": expert_tp,
                    "fsdp_copies": (copy_out, copy_in, *dense["fsdp_copies"][2:])} | ops


def grad_accumulate_per_micro_batch(terms: "Terms", t: int, pp: int, ep: int, microbatches) -> tuple:
    """Seconds per micro-batch of the plan's gradient accumulation (:mod:`meshplan.cost.grad_accumulation`):
    one pass over a rank's gradients times the share of the step's ``microbatches`` that run it
    (a number or an array over plans): (a dense layer's, an MoE layer's, the embedding's, the head's)."""
    share = terms.accumulation_share(microbatches)
    return tuple(x * share for x in terms.grad_accumulation_passes(t, pp, ep))
