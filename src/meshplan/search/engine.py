"""Evaluate many plans at once: exact memory per pipeline rank, and a lower bound on the step.

Plans are sorted by pipeline shape (pp, vpp, stage placement: the schedules that place stages
alike, GPipe, 1F1B and ZB-H1, or interleaved 1F1B and interleaved zero bubble, share one), so that
every shape is a slice of the table with the same virtual stages and layer split; all arithmetic
runs on NumPy arrays over the plans, through the same functions :func:`meshplan.estimate.estimate`
uses (:mod:`meshplan.cost.compose`, :mod:`meshplan.cost.comm`,
:func:`meshplan.cost.memory.model_state_bytes`, :func:`meshplan.pipeline.simulate.peak_bytes`). What
cannot be vectorized — the GEMM and attention time of a layer, the placement of a group, the time
of one collective — is computed once per distinct argument over the whole table
(:func:`meshplan.search.table_terms.table_terms`). Every other term is computed once per distinct row of what it depends on
and gathered (the same expression on the same operands: the same bits), with rows numbered pp
first so that a shape's rows are the slice of its pp:

* layer times: (pp, tp, cp, micro-batch, SP, recompute, per-layer shard group, TP overlap[, ep]),
  a layer-time row (18,144 for the 584,016 plans of the GPT-3 benchmark's whole space), and a
  shape's stage times on its pp's rows;
* a rank class's model state and optimizer step: the mesh row (tp, cp, dp, shard group, ep, ZeRO
  stage); its buffers: the mesh row and the kernel row without the recompute mode
  (:meth:`Engine._rank_other`); its activations and peak: the mesh row, kernel row and micro-batch
  count, i.e. (mesh row, kernel row[, global batch]) within one schedule.

Per shape (its plans sorted by schedule): each schedule's live micro-batch counts for all its
micro-batch counts and ranks at once (:func:`meshplan.pipeline.inflight.state_rows_many`, closed
forms; repeated rows dropped where many plans share them,
:func:`~meshplan.pipeline.inflight.distinct_state_rows`) and the activation peak of every rank per
distinct (micro-batch count, kernel terms) pair (:func:`meshplan.pipeline.simulate.padded_peak_bytes`).
Ranks that hold the same stages (all interior ranks; the ranks with the embedding or the LM head
differ) form a class with the same model state, buffers, stage times and optimizer step: a shape's
classes are evaluated together as (classes × rows) arrays. A rank's total grows with its
activations, so each class's largest total is that of its largest activations: the peak and the
worst rank come from the classes' maxima per (micro-batch count, kernel row) pair
(:func:`peak_rank`), not from (plans × ranks) arrays. Every operation is elementwise and in
``estimate``'s order, so the peak memory of every plan is ``estimate``'s to the last bit (tests
assert it).

The step time needs the pipeline simulation, which is sequential per plan; instead the engine
bounds it from below. For pipeline rank r with stages K_r, per-micro-batch stage durations f_k,
b_k, stage-to-stage transfer τ, m micro-batches and the exposed after-pipeline communication a_r:

* rank r cannot start before micro-batch 0 crosses stages 0 .. r − 1:
  σ_r = Σ_{k<r} (f_k + τ);
* it then works m·Σ_{k∈K_r} (f_k + b_k) at least: finish_r ≥ σ_r + busy_r;
* when its last action is the backward of its first stage for the last micro-batch (1F1B,
  GPipe, interleaved), that gradient still has to cross stages r − 1 .. 0:
  makespan ≥ σ_r + busy_r + Σ_{k<r} (b_k + τ).

step ≥ max(max_r (σ_r + busy_r + a_r), makespan bound) + optimizer + weight all-gather (the
FP8 weight casts Megatron-Core's step adds once, ``fp8_weight_cast_s``, are left out: a lower
bound still, short by one micro-batch's weight casts of the L layers). σ_r and
the gradient chain never decrease with r and ranks of a class share busy_r and a_r, so both maxima
are taken over each class's last rank only (rounded sums are monotone: the same bits). For equal
stages and free transfers the 1F1B bound is the closed form (m + p − 1)(f + b) (Narayanan et al.
2021, Sec. 2.2), i.e. exact; uneven stages, waits and zero-bubble schedules leave a gap, and the
search simulates every plan whose bound could still beat the ones it keeps
(:mod:`meshplan.search.run`).
"""

from __future__ import annotations

from dataclasses import dataclass
import itertools
from typing import Callable, Optional

import numpy as np

from meshplan.cost.compose import (
    LayerTimes,
    StageTimes,
    after_pipeline,
    kept_outputs_bytes,
    merged_outputs_items,
    pick,
    pp_buffer_messages,
    prefetched_unit,
    rank_other_items,
    stage_activation_table,
    stage_times,
    total_of,
)
from meshplan.cost.compute import optimizer_step_time
from meshplan.cost.contention import NCCL_CTAS, sm_share, tp_hidden_ctas
from meshplan.cost.fsdp_copies import runs_fsdp2
from meshplan.cost.memory import ModelState, model_state_bytes
from meshplan.cost.moe import add_moe_layers, moe_layers_per_stage
from meshplan.cost.terms import Terms
from meshplan.pipeline.inflight import last_stage_live_peaks, state_rows_many
from meshplan.pipeline.schedules import stage_style
from meshplan.pipeline.stages import layer_split, stages_of_rank
from meshplan.search.peaks import memory_microbatches, pair_peaks, peak_rank
from meshplan.search.rows import distinct, distinct_rows, slices_by
from meshplan.search.space import SCHEDULE_NAMES, PlanTable
from meshplan.search.table_terms import KERNEL_FIELDS, MB_FIELDS, MOE_FIELDS, TableTerms, table_terms
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import BEHAVIOUR_FIELDS, Stack

#: Schedules whose backward is one action (B), for which the gradient-chain bound holds.
_UNSPLIT_MASK = np.isin(np.arange(len(SCHEDULE_NAMES)), [SCHEDULE_NAMES.index(n) for n in ("gpipe", "1f1b", "interleaved")])



@dataclass
class Screen:
    """Per plan: peak memory per GPU (bytes) and the rank that has it, and the step lower bound
    (seconds)."""

    peak_bytes: np.ndarray
    worst_rank: np.ndarray
    step_lower_bound: np.ndarray


def _shared_stage_times(split: tuple[int, ...], lt) -> StageTimes:
    """:func:`stage_times` of ``split``, each distinct stage computed once: inner stages with
    the same number of layers get the same arrays (the same expression, so the same bits)."""
    if len(split) <= 3:
        return stage_times(split, lt)
    inner = sorted(set(split[1:-1]))
    reduced = stage_times((split[0], *inner, split[-1]), lt)
    at = [0] + [1 + inner.index(n) for n in split[1:-1]] + [len(inner) + 1]
    return StageTimes(*([part[i] for i in at] for part in vars(reduced).values()))


#: the stack fields the engine applies plan by plan itself, whose rules do not split a table
#: (:meth:`Engine._parts`): TP overlap and its kind by the plan's overlap column (no overlap, no
#: hidden TP; the backward's own TP overlap only where TP overlap is off, nothing at tp 1), the
#: pipeline's buffers and kept outputs by pp > 1, its messages split over TP by tp > 1 without
#: sequence parallelism (:meth:`meshplan.cost.terms.Terms.p2p_time`), FSDP2's root unit by
#: :func:`meshplan.cost.fsdp_copies.root_unit_applies`; the pipeline runtime is the simulation's
_PER_ROW = frozenset({"tp_comm_overlap", "tp_overlap_kind", "tp_backward_overlap", "pp_buffers", "pp_return_outputs",
                      "pp_scatter_gather", "fsdp_head_in_root", "pipeline_runtime"})



#: (classes × buffer rows) whose buffers are computed in one call (:meth:`Engine._buffers`)
_RUN = 8192


# Gathers along the plans of a (classes × plans) array use ``np.take(x, i, axis=1)``: ``x[:, i]``
# returns a Fortran-ordered array, on which every later reduction over the classes runs about 30×
# slower, and is itself about twice as slow.


def _take(lt: LayerTimes, rows) -> LayerTimes:
    """The entries ``rows`` (a slice: views) of layer times over many rows (scalars kept as they are)."""
    return LayerTimes(**{f: x[rows] if isinstance(x, np.ndarray) and x.ndim else x for f, x in vars(lt).items()})


@dataclass
class _Shape:
    """The plans of one pipeline shape (the slice ``idx`` of a table sorted by shape) and what they
    share (:meth:`Engine._shape`): per plan its micro-batch count ``m``, schedule, kernel row
    ``kid``, layer-time row ``lt_inv`` (within ``lt_rows``, its pp's) and mesh row ``mesh_inv``
    (within ``mesh_s``); per layer-time row the stage times ``st``; per kernel row the stage
    activations ``act_mat``; the state rows (distinct mesh row, kernel row[, global batch])."""

    pp: int
    v: int
    style: str
    idx: slice
    m: np.ndarray
    schedule: np.ndarray
    kid: np.ndarray
    lt_rows: slice
    lt_inv: np.ndarray
    split: tuple[int, ...]
    st: StageTimes
    act_mat: np.ndarray
    moe_stage: Optional[list[int]]
    mesh_s: slice
    mesh_inv: np.ndarray
    mesh_rows: list
    batch: Optional[tuple]  # each plan's global batch as a digit, and its radix (None: one batch)
    state_where: np.ndarray = None
    state_inv: np.ndarray = None
    state_mesh: np.ndarray = None

    @property
    def last(self) -> int:
        """The last virtual stage."""
        return self.pp * self.v - 1

    def with_batch(self, code: np.ndarray, rows=slice(None)) -> np.ndarray:
        """``code`` with the plans' (``rows``') global batch as a last digit, when they differ."""
        return code if self.batch is None else code * self.batch[1] + self.batch[0][rows]


@dataclass
class _Classes:
    """A shape's classes of ranks (:meth:`Engine._classes`): per rank its class ``of``; per class
    its first and last rank, whether it holds the LM head, its stages other than the pipeline's
    first and other than its last, its layers; (classes × plans) busy time, exposed DP
    synchronization ``after`` and weight all-gather ``pg``; (classes × mesh rows) parameters, of
    them routed experts, and FSDP2's all-gather pool."""

    of: np.ndarray
    first: list[int]
    last: np.ndarray
    busy: np.ndarray
    after: np.ndarray
    pg: np.ndarray
    params: np.ndarray
    experts: np.ndarray
    pool: np.ndarray
    head: np.ndarray
    not_first: np.ndarray
    not_last: np.ndarray
    stages: list  # per class, (layers, whether the pipeline's first) of each of its stages


class Engine:
    """Vectorized evaluation of a :class:`PlanTable` for one model, cluster and base plan (the
    fields the search does not vary: sequence length, precision, attention, rank order, overlap
    switches)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, base: TrainingPlan, stack: Optional[Stack] = None):
        self.model, self.cluster, self.base = model, cluster, base
        # the stack as requested, not as it applies to the base plan: its rules apply per plan
        self.stack = base.stack if stack is None else stack
        self.rec = base.precision
        # the SM shares of hidden collectives (meshplan.cost.contention), as estimate takes them
        self.nccl_share = sm_share(NCCL_CTAS, cluster.gpu.sm_count)
        # the hidden TP's per plan, by its TP overlap column: (without, with)
        self.tp_share = tuple(sm_share(tp_hidden_ctas(on, self.stack.tp_overlap_kind), cluster.gpu.sm_count) for on in (False, True))
        # the per-argument terms, through the code estimate uses
        self.terms = Terms(model, cluster, base, self.stack)
        self.cal = self.terms.cal

    # ---- one pipeline shape -------------------------------------------------------------------
    def _group(self, pp: int, v: int, style: str, table: PlanTable, pre: TableTerms, idx: slice) -> tuple:
        """The plans ``idx`` (a slice of ``table``, sorted by shape) of one pipeline shape: its stage
        times and activations (:meth:`_shape`), its classes of ranks (:meth:`_classes`), their
        model state, optimizer step and buffers, then each plan's peak and worst rank
        (:meth:`_peaks`) and its step lower bound (:meth:`_lower_bound`)."""
        g = self._shape(pp, v, style, table, pre, idx)
        cls = self._classes(g, pre)
        # the classes' model state and optimizer step per mesh row, over (classes × mesh rows)
        fixed, opt = self._model_state(table, pre.mesh_where[g.mesh_s], cls.params, cls.experts)
        buffers = self._buffers(g, cls, table, pre)
        peak, worst = self._peaks(g, cls, pre, fixed, buffers)
        opt_pg = np.take(opt, g.mesh_inv, axis=1) + cls.pg  # the optimizer step + the exposed weight gather
        return peak, worst, self._lower_bound(g, cls, pre, opt_pg)

    def _shape(self, pp: int, v: int, style: str, table: PlanTable, pre: TableTerms, idx: slice) -> "_Shape":
        """What the plans ``idx`` of one pipeline shape share: stage times per layer-time row of
        their pp, stage activations per kernel row (MoE layers' own added per stage, as
        ``estimate`` does), their mesh rows and state rows."""
        model = self.model
        lt_rows = pre.lt_pp[pp]
        split = layer_split(model.n_layers, pp, v)
        # the stage times depend on the plan's layer-time row only: once per row of the shape's pp
        st = _shared_stage_times(split, _take(pre.layer, lt_rows))
        # stage activations depend on the kernel row only: once per distinct row
        ku = dict(zip(KERNEL_FIELDS, pre.kernel.T))
        # torch's pipelining keeps each stage's output to its backward, the last stage's logits too
        held = ku["held_logits"] if pp > 1 else 0.0
        act_mat = stage_activation_table(split, ku["act_stored"], ku["emb_act"], ku["head_act"], ku["kept_output"], held)  # (kernel rows, stages)
        moe_stage = None
        if model.is_moe:
            # the MoE layer's activations do not depend on ep: those of ep = 1, on the rows of ``kernel``
            kmu = dict(zip(MOE_FIELDS, pre.moe_kernel_ep1.T))
            moe_stage = moe_layers_per_stage(model, split)
            a2a = pre.a2a[lt_rows]
            add_moe_layers(st, moe_stage, _take(pre.layer, lt_rows), _take(pre.layer_moe, lt_rows), (a2a[:, 0], a2a[:, 1]))
            act_mat = act_mat + np.asarray(moe_stage) * (kmu["act_stored"] - ku["act_stored"])[:, None]
        mesh_s = pre.mesh_pp[pp]  # the mesh rows of the shape's pp (a slice of them)
        g = _Shape(pp=pp, v=v, style=style, idx=idx, m=table.global_batch[idx] // (table.micro_batch[idx] * table.dp[idx]),
                   schedule=table.schedule[idx], kid=pre.kid[idx], lt_rows=lt_rows, lt_inv=pre.lt_inv[idx] - lt_rows.start,
                   split=split, st=st, act_mat=act_mat, moe_stage=moe_stage, mesh_s=mesh_s,
                   mesh_inv=pre.mesh_inv[idx] - mesh_s.start, mesh_rows=pre.mesh_rows[mesh_s].tolist(),
                   batch=None if pre.batch is None else (pre.batch[0][idx], pre.batch[1]))
        # a class's model state and optimizer step depend on the plan's mesh row only, its buffers
        # and activations on the mesh row, kernel row and micro-batch count only (not on its schedule
        # within the shape or on TP overlap): once per distinct mesh row and per distinct (mesh row,
        # kernel row[, global batch]), a state row (the batch fixes the count with the two others)
        g.state_where, g.state_inv = distinct(g.with_batch(g.mesh_inv * len(pre.kernel) + g.kid))
        g.state_mesh = g.mesh_inv[g.state_where]
        return g

    def _classes(self, g: "_Shape", pre: TableTerms) -> "_Classes":
        """The shape's classes of ranks: ranks holding the same stages (layer counts, embedding,
        head, MoE layers, in the same order) have the same model state, buffers and stage times to
        the bit, so each class's terms are computed once, on its first rank."""
        model, pp, split, last = self.model, g.pp, g.split, g.last
        classes: dict[tuple, int] = {}
        cls_of = np.empty(pp, dtype=np.int64)
        cls_first: list[int] = []  # per class, its first rank
        cls_last = np.zeros(pp, dtype=np.int64)  # per class, its last rank
        for r in range(pp):
            mine = stages_of_rank(r, pp, g.v, g.style)
            key = tuple((split[j], j == 0, j == last, g.moe_stage[j] if model.is_moe else 0) for j in mine)
            cls_of[r] = classes.setdefault(key, len(classes))
            cls_last[cls_of[r]] = r
            if cls_of[r] == len(cls_first):
                cls_first.append(r)
        n_cls, G, n_mesh = len(classes), g.idx.stop - g.idx.start, len(g.mesh_rows)
        # per-class arrays are (classes × plans): a class's entries are contiguous, and the maxima
        # over classes run down short columns elementwise
        cls = _Classes(
            of=cls_of, first=cls_first, last=cls_last[:n_cls], busy=np.empty((n_cls, G)), after=np.empty((n_cls, G)),
            pg=np.empty((n_cls, G)), params=np.empty((n_cls, n_mesh), dtype=np.int64), experts=np.zeros((n_cls, n_mesh), dtype=np.int64),
            pool=np.zeros((n_cls, n_mesh)), head=np.zeros(n_cls, dtype=bool), not_first=np.zeros(n_cls, dtype=np.int64),
            not_last=np.zeros(n_cls, dtype=np.int64), stages=[],
        )
        for ci, r in enumerate(cls_first):
            self._class_terms(g, pre, cls, ci, stages_of_rank(r, pp, g.v, g.style))
        return cls

    def _class_terms(self, g: "_Shape", pre: TableTerms, cls: "_Classes", ci: int, mine: list[int]) -> None:
        """Class ``ci``'s terms, its ranks holding the stages ``mine``, into ``cls``: parameters and
        FSDP2's all-gather pool per mesh row; busy time, exposed DP synchronization and weight
        all-gather per plan, as ``estimate``'s ranks have them."""
        model, pp, split, last, st = self.model, g.pp, g.split, g.last, g.st
        te_of_mesh, te_vals = pre.te_of_mesh[g.mesh_s], pre.te_vals
        by_tp_ep = lambda fn: np.array([fn(x, y) for x, y in te_vals], dtype=np.int64)[te_of_mesh]  # noqa: E731
        cls.not_first[ci], cls.not_last[ci] = sum(j != 0 for j in mine), sum(j != last for j in mine)
        n_layers = sum(split[j] for j in mine)
        cls.stages.append([(split[j], j == 0) for j in mine])
        first_, holds_head = 0 in mine, last in mine
        n_moe = sum(g.moe_stage[j] for j in mine) if model.is_moe else 0
        p_of = {(x, y): (self.terms.rank_params(x, pp, n_layers, first_, holds_head, n_moe, y),
                         self.terms.expert_params(x, y, n_moe)) for x, y in te_vals}
        cls.params[ci] = by_tp_ep(lambda x, y: p_of[x, y][0])
        if runs_fsdp2(3, self.stack.kernels):  # FSDP2's all-gather pool (ZeRO-3 plans on a torch stack use it)
            units = tuple((split[j], j == 0, j == last) for j in mine)
            root = self.stack.fsdp_head_in_root and pp == 1
            cls.pool[ci] = np.array([self.terms.pool(x, pp, units, self.rec.weight_bytes, root, y, self.stack.fsdp_fp8_all_gather)
                                     for x, y in te_vals])[te_of_mesh]
        if model.is_moe:
            cls.experts[ci] = by_tp_ep(lambda x, y: p_of[x, y][1])
        # (gradient sync, weight gather) per mesh row, each gathered per plan as a contiguous array
        sync = np.fromiter(
            itertools.chain.from_iterable(self.terms.dp(tt, cc, pp, dd, ss, ee, zz, *p_of[tt, ee], n_layers)
                                          for tt, cc, dd, ss, ee, zz in g.mesh_rows),
            dtype=float, count=2 * len(g.mesh_rows),
        ).reshape(len(g.mesh_rows), 2).T.copy()
        last_bwd = sum(st.bwd[j] for j in mine).take(g.lt_inv)
        first_fwd = sum(st.fwd[j] for j in mine).take(g.lt_inv)
        after, pg = after_pipeline(
            grad_comm=sync[0].take(g.mesh_inv), param_gather=sync[1].take(g.mesh_inv), last_bwd=last_bwd, first_fwd=first_fwd,
            n_layers=n_layers, overlap_grad_reduce=self.stack.overlap_grad_reduce,
            overlap_param_gather=self.stack.overlap_param_gather, nccl_share=self.nccl_share,
        )
        # ZeRO-3 keeping weights gathered and gradients unsharded through the step (the stack as it
        # applies to this engine's plans, :meth:`_parts`)
        if self.stack.fsdp_accumulate_unsharded and runs_fsdp2(3, self.stack.kernels):  # FSDP2's copies of the step's one reduce-scatter and all-gather
            after, pg = self._step_copies(after, pg, g.mesh_rows, g.mesh_inv, cls.params[ci], n_layers + first_ + holds_head, n_layers)
        cls.busy[ci] = g.m * (last_bwd + first_fwd)
        cls.after[ci], cls.pg[ci], cls.head[ci] = after, pg, holds_head

    def _buffers(self, g: "_Shape", cls: "_Classes", table: PlanTable, pre: TableTerms) -> tuple:
        """The classes' other items (buffers): once per buffer row, a distinct (mesh row, kernel row:
        the backward working set, which decides the peak's moment, depends on the recompute mode
        too), in one call over (classes × buffer rows), or for many rows one for the classes
        without the LM head and one for those with it. Returns (their totals, those of the step's
        end where the pipeline returns its outputs (else None), per state row its buffer row)."""
        kernel, kid, pp, m = pre.kernel, g.kid, g.pp, g.m
        n_cls = len(cls.first)
        buf_where, buf_of_state = distinct(g.with_batch(g.state_mesh * len(kernel) + kid[g.state_where], g.state_where))
        buf_mesh, buf_plans = g.state_mesh[buf_where], g.state_where[buf_where]
        returns = self.stack.pp_return_outputs and pp > 1  # the step's end is a moment of its own
        other_buf = np.empty((n_cls, len(buf_where)))
        merged_buf = np.empty((n_cls, len(buf_where))) if returns else None
        # the stage-to-stage messages each class holds buffers for (m·(not first + not last) per micro-batch, or 2)
        messages = pp_buffer_messages(self.stack.pp_buffers, m[buf_plans][None, :], cls.not_first[:, None], cls.not_last[:, None])
        at = np.arange(g.idx.start, g.idx.stop)[buf_plans]
        k_at = {"head_act": kernel[kid[buf_plans], KERNEL_FIELDS.index("head_act")], "working": pre.working[pre.lt_inv[at]],
                "layer_stored": pre.layer_stored[pre.lt_inv[at]], "head_output": kernel[kid[buf_plans], KERNEL_FIELDS.index("head_output")]}
        mb_at = pre.mb[pre.mb_of_lt[pre.lt_inv[at]]]
        cm_at = {name: mb_at[:, MB_FIELDS.index(name)] for name in ("act_msg", "p2p_bytes")}
        params_b, pool_b = np.take(cls.params, buf_mesh, axis=1), np.take(cls.pool, buf_mesh, axis=1)
        te = pre.te_of_mesh[g.mesh_s][buf_mesh]
        for rows_ in [np.arange(n_cls)] if len(buf_where) * n_cls <= _RUN else [np.flatnonzero(~cls.head), np.flatnonzero(cls.head)]:
            if len(rows_):
                other_buf[rows_], merged = self._rank_other(
                    table, pre, at, te, k_at, cm_at, pp, cls.head[rows_], params_b[rows_],
                    messages[rows_] if isinstance(messages, np.ndarray) else messages, m[buf_plans], pool_b[rows_], [cls.stages[i] for i in rows_])
                if returns:
                    merged_buf[rows_] = merged
        return other_buf, merged_buf, buf_of_state

    def _peaks(self, g: "_Shape", cls: "_Classes", pre: TableTerms, fixed: np.ndarray, buffers: tuple) -> tuple[np.ndarray, np.ndarray]:
        """Each plan's peak memory and worst rank: each schedule's live counts, once per distinct
        (micro-batch count, kernel row), as the stage activations depend on nothing else within a
        pipeline shape (:func:`meshplan.search.peaks.peak_rank`)."""
        other_buf, merged_buf, buf_of_state = buffers
        pp, v, m, kid, n_kernel = g.pp, g.v, g.m, g.kid, len(pre.kernel)
        returns = merged_buf is not None
        head_output = pre.kernel[:, KERNEL_FIELDS.index("head_output")]
        chunks = np.array([sorted(stages_of_rank(r, pp, v, g.style)) for r in range(pp)], dtype=np.int64)
        cls_ranks = [np.flatnonzero(cls.of == ci) for ci in range(len(cls.first))]
        working = pre.working[g.lt_rows]  # per layer-time row of the shape's pp
        G = g.idx.stop - g.idx.start
        peak, worst = np.empty(G), np.empty(G, dtype=np.int64)
        for code, sub in slices_by(g.schedule).items():  # the plans are sorted by schedule
            name = SCHEDULE_NAMES[code]
            m_eff = memory_microbatches(name, pp, m[sub])
            # within one schedule a plan's memory depends on its state row only: once per distinct row
            mem_where, mem_inv = distinct(g.state_inv[sub])
            mem_rows, mem_kid = g.state_inv[sub][mem_where], kid[sub][mem_where]
            m_eff = m_eff[mem_where]
            first, pair_inv = distinct(m_eff * n_kernel + mem_kid)  # the distinct (m, kernel row) pairs
            m_where, m_inv = distinct(m_eff[first])  # the live counts of every micro-batch count at once
            rows = state_rows_many(name, pp, m_eff[first][m_where], v)
            kept = None
            if returns:  # the outputs the last stage keeps beyond those in flight
                live = last_stage_live_peaks(rows, name, pp, v)[m_inv][pair_inv]
                per_row = kept_outputs_bytes(m[sub][mem_where], live, head_output[mem_kid])
                kept = np.where(cls.head[:, None], per_row[None, :], 0.0)
            stored_u = pair_peaks(rows, m_inv, np.take(g.act_mat[mem_kid[first]], chunks, axis=1), pp, v)
            peak_u, worst_u = peak_rank(
                stored_u, pair_inv, cls.of, cls_ranks, np.take(fixed, g.state_mesh[mem_rows], axis=1),
                working.take(g.lt_inv[sub][mem_where]), np.take(other_buf, buf_of_state[mem_rows], axis=1),
                None if merged_buf is None else np.take(merged_buf, buf_of_state[mem_rows], axis=1), kept,
            )
            peak[sub], worst[sub] = peak_u.take(mem_inv), worst_u.take(mem_inv)
        return peak, worst

    def _lower_bound(self, g: "_Shape", cls: "_Classes", pre: TableTerms, opt_pg: np.ndarray) -> np.ndarray:
        """Each plan's step lower bound (the module docstring). σ_r and the gradient chain
        Σ_{k<r} (b_k + τ) are summed rank by rank as the bound states. Both never decrease with r
        (sums of durations ≥ 0), and ranks of one class have the same busy time and exposed
        communication, so (σ_r + busy) + a and (σ_r + busy) + chain_r, rounded sums monotone in σ_r
        and chain_r, are largest on the class's last rank: the bound's maxima over ranks are those
        over the classes' last ranks, to the bit. Both depend on the layer-time row only: summed
        per row, gathered per plan."""
        st, tau = g.st, pre.tau[g.lt_rows]
        n_cls, n_lt = len(cls.first), g.lt_rows.stop - g.lt_rows.start
        # under GPipe, 1F1B and interleaved 1F1B every rank ends with the backward of its first
        # stage for the last micro-batch (the gradient chain of the module docstring)
        chain = _UNSPLIT_MASK[g.schedule]
        start, chain_b = np.empty((n_cls, n_lt)), np.empty((n_cls, n_lt))
        run_f, run_b = np.zeros(n_lt), np.zeros(n_lt)
        at_rank = {r: np.flatnonzero(cls.last == r) for r in set(cls.last.tolist())}
        for r in range(int(cls.last.max()) + 1):
            if r in at_rank:
                start[at_rank[r]], chain_b[at_rank[r]] = run_f, run_b
            run_f = run_f + st.fwd[r] + tau
            run_b = run_b + st.bwd[r] + tau
        start, chain_b = np.take(start, g.lt_inv, axis=1), np.take(chain_b, g.lt_inv, axis=1)
        reach = start + cls.busy
        lb_finish = reach + cls.after
        lb_span = np.max(np.where(chain, reach + chain_b, reach), axis=0, initial=0.0)
        lb_pipe = np.maximum(lb_finish.max(axis=0), lb_span)
        # the slowest rank's optimizer step + weight gather
        return (lb_pipe + opt_pg.max(axis=0)) * (1 - 1e-12)

    def _step_copies(self, after: np.ndarray, pg: np.ndarray, mesh_rows: list, mesh_inv: np.ndarray, params: np.ndarray,
                     units: int, n_layers: int) -> tuple[np.ndarray, np.ndarray]:
        """``after`` and ``pg`` (per plan) with the copy-in and copy-out of FSDP2 units that keep
        weights gathered and gradients unsharded through the step
        (:meth:`meshplan.cost.terms.Terms.step_copies`) added where the weights are sharded, for one
        class of ranks holding ``params`` (per mesh row) in ``units`` units and ``n_layers``
        layers, as ``estimate`` adds them."""
        copies = np.array([self.terms.step_copies(tt, int(n), units, n_layers)
                           for n, (tt, cc, dd, ss, ee, zz) in zip(params.tolist(), mesh_rows)]).reshape(-1, 2)
        sharded = np.array([zz == 3 and ss * cc > 1 for tt, cc, dd, ss, ee, zz in mesh_rows])[mesh_inv]
        return (np.where(sharded, after + copies[mesh_inv, 0], after), np.where(sharded, pg + copies[mesh_inv, 1], pg))

    def _model_state(self, table: PlanTable, at: np.ndarray, params: np.ndarray, experts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the plans ``at`` (indices into ``table``) and the classes of ranks holding ``params``
        parameters, of which ``experts`` routed-expert ones ((classes × plans)): the model state
        w + g + o and the optimizer step, through the functions ``estimate`` uses, elementwise."""
        model, rec = self.model, self.rec
        row = lambda x: x[at][None, :]  # noqa: E731
        zero, shard, c = row(table.zero), row(table.dp_shard) * row(table.cp), row(table.cp)
        fsdp2 = (zero == 3) & runs_fsdp2(3, self.stack.kernels)  # FSDP2's fp32 shards are the master copy
        if model.is_moe:  # as estimate: expert weights E/ep per GPU, their state sharded over N_e
            expert_shard = row(table.dp) // row(table.ep) * c  # N_e = dp·cp/ep (:func:`meshplan.cost.moe.expert_shard_degree`)
            state = model_state_bytes(params - experts, rec, zero, shard, fsdp2)
            ex = model_state_bytes(experts, rec, zero, expert_shard, fsdp2)
            state = ModelState(state.weights + ex.weights, state.gradients + ex.gradients, state.optimizer + ex.optimizer)
        else:
            state = model_state_bytes(params, rec, zero, shard, fsdp2)
        local = params / pick(zero >= 1, shard, 1)
        if model.is_moe:  # sharded state: the dense part over N, the experts over N_e
            local = pick((zero >= 1) & (experts > 0), (params - experts) / shard + experts / expert_shard, local)
        # the per-rank total is ((weights + gradients + optimizer) + activations) + other items
        return state.weights + state.gradients + state.optimizer, optimizer_step_time(local, rec, self.cluster.gpu, self.cal, self.stack.kernels)

    def _rank_other(self, table: PlanTable, pre: TableTerms, at: np.ndarray, te: np.ndarray, k: dict, cm: dict, pp: int,
                    head: np.ndarray, params: np.ndarray, pp_messages, m: np.ndarray, pool: np.ndarray,
                    stages: list) -> tuple[np.ndarray, np.ndarray]:
        """For the plans ``at`` (indices into ``table``) of one shape, with their (tp, ep) rows ``te``
        of ``pre.te_vals``, their kernel and collective
        columns ``k`` and ``cm`` (``head_act``, ``working``, ``layer_stored``, ``head_output``, ``act_msg``, ``p2p_bytes``), and its classes of
        ranks, ``head`` (classes) saying which hold the LM head, with ``params`` and
        ``pp_messages`` (:func:`pp_buffer_messages`) and ``pool`` (FSDP2's all-gather pool,
        :func:`meshplan.cost.fsdp_copies.gather_pool_bytes`) as (classes × plans) and ``stages`` per class (:func:`prefetched_unit`): the total of the other
        items (:func:`rank_other_items`), as ``estimate`` adds them. Per-plan terms are rows
        broadcast over the classes: elementwise, so every entry is the one-plan value. With classes
        of both kinds the buffers are those of a rank with the LM head, whose head terms (loss
        gradient, head activations and parameters) are 0 on the classes without it: each such
        item is then ±0, as the rank without the head lists, and adds nothing to the positive
        total. Second, the total of the step's-end items (:func:`merged_outputs_items`) where the
        plan returns outputs and the class holds the LM head (``m`` micro-batches per plan), −inf
        on the other classes, None when the plans do not return outputs: a rank's peak is the
        larger of its backward and that moment."""
        model, base, rec = self.model, self.base, self.rec
        row = lambda x: x[at][None, :]  # noqa: E731
        zero, shard, t, c = row(table.zero), row(table.dp_shard) * row(table.cp), row(table.tp), row(table.cp)
        per_tp = np.array([self.terms.per_tp(x, y, pp) for x, y in pre.te_vals], dtype=np.int64).reshape(-1, 7).T.take(te, axis=1)
        tokens = row(table.micro_batch) * base.seq_len / c
        logits_grad, logits_block = tokens * per_tp[:1], tokens * per_tp[5:6]
        head_act, head_params = k["head_act"][None, :], per_tp[2:3]
        if self.stack.pp_buffers == "per-micro-batch" and pp > 1:  # torch's schedule holds the logits: no freed block
            logits_block = 0.0 * logits_block
        returns = self.stack.pp_return_outputs and pp > 1  # the last stage keeps its outputs to the step's end
        step_outputs = m[None, :] * k["head_output"][None, :] if returns else 0.0
        root = self.stack.fsdp_head_in_root and pp == 1  # torch's FSDP2 root unit (pp = 1 plans; ZeRO-3 below)
        holds_head, head_rows = bool(head.all()), head
        if head.any() and not holds_head:
            head = head[:, None]
            holds_head, logits_grad, logits_block = True, np.where(head, logits_grad, 0.0), np.where(head, logits_block, 0.0)
            head_act, head_params = np.where(head, head_act, 0.0), np.where(head, head_params, 0)
            if returns:
                step_outputs = np.where(head, step_outputs, 0.0)
        layers, regathered = np.array([sum(n for n, _ in st) for st in stages]), 0 if (model.tied_embeddings and pp == 1) or root else 1
        other = rank_other_items(
            reserve=self.cal.runtime_reserve, holds_head=holds_head, logits_grad=logits_grad,
            head_act=head_act, zero=zero, shard=shard, params=params,
            layer_params=per_tp[1:2], head_params=head_params,
            kept_embedding_params=per_tp[3:4] if model.tied_embeddings and pp == 1 else 0,
            weight_bytes=rec.weight_bytes, grad_bytes=rec.grad_bytes, reshard_after_forward=self.stack.reshard_after_forward,
            once_per_step=self.stack.fsdp_accumulate_unsharded, tp=t, act_msg=cm["act_msg"][None, :], pp=pp, p2p_bytes=cm["p2p_bytes"][None, :],
            pp_messages=pp_messages, working=k["working"][None, :],
            root_embedding_params=per_tp[3:4] if root and not model.tied_embeddings else 0,
            head_in_root=root, down_params=per_tp[4:5], layer_stored=k["layer_stored"][None, :], logits_block=logits_block,
            gather_pool=pool, layer_saving=per_tp[6:7], stage_saving=layers[:, None] * per_tp[6:7],
            prefetch=tuple(np.concatenate(x) for x in zip(*(prefetched_unit(st, per_tp[1:2], per_tp[3:4] * regathered) for st in stages))),
        )
        shape, merged = (len(head_rows), len(at)), None
        if returns:
            merged = np.full(shape, -np.inf)
            if holds_head:
                end = total_of(merged_outputs_items(
                    reserve=self.cal.runtime_reserve, tp=t, act_msg=cm["act_msg"][None, :], pp=pp,
                    p2p_bytes=cm["p2p_bytes"][None, :], pp_messages=pp_messages, step_outputs=step_outputs,
                    gather_pool=np.where((zero == 3) & (shard > 1), pool, 0.0)))
                merged = np.where(head_rows[:, None], np.broadcast_to(end, shape), -np.inf)
        return np.broadcast_to(total_of(other), shape), merged

    def evaluate(self, table: PlanTable, progress: Optional[Callable[[int], None]] = None) -> Screen:
        """Peak memory, worst rank and step lower bound of every plan of ``table``; ``progress`` is
        called with the number of plans done after each pipeline shape. Plans are evaluated in
        groups that share the stack as it applies to them (:meth:`_parts`)."""
        parts = self._parts(table)
        if len(parts) == 1:
            return parts[0][1]._evaluate(table, progress)
        screen = Screen(np.empty(len(table)), np.empty(len(table), dtype=np.int64), np.empty(len(table)))
        for rows, engine in parts:
            part = engine._evaluate(table.take(rows), progress)
            screen.peak_bytes[rows], screen.worst_rank[rows], screen.step_lower_bound[rows] = (
                part.peak_bytes, part.worst_rank, part.step_lower_bound)
        return screen

    def _parts(self, table: PlanTable) -> list[tuple[np.ndarray, "Engine"]]:
        """The plans of ``table`` grouped by the stack as it applies to them
        (:func:`meshplan.specs.stack.applied`, its rules read a plan's ZeRO stage, pp, tp, schedule,
        TP overlap and whether ZeRO shards over more than one rank among the searched fields), less
        the fields the engine applies plan by plan itself (:data:`_PER_ROW`), which keep the
        requested values: per group, its plans and an engine of that stack."""
        sharded = (table.dp_shard * table.cp > 1).astype(np.int64)
        where, inverse = distinct_rows([table.zero, table.pp, table.tp, table.schedule, table.tpo.astype(np.int64), sharded])
        keys: dict[tuple, int] = {}
        part_of = np.empty(len(where), dtype=np.int64)
        for j, i in enumerate(where.tolist()):
            stack = TrainingPlan.of(**{**self.base.model_dump(), "stack": self.stack, **table.row(i)}).stack
            aside = tuple((f, getattr(stack, f)) for f in BEHAVIOUR_FIELDS
                          if f not in _PER_ROW and getattr(stack, f) != getattr(self.stack, f))
            part_of[j] = keys.setdefault(aside, len(keys))
        engines = [Engine(self.model, self.cluster, self.base, self.stack.model_copy(update=dict(aside))) if aside else self
                   for aside in keys]
        if len(engines) == 1:
            return [(np.arange(len(table)), engines[0])]
        plan_part = part_of[inverse]
        return [(np.flatnonzero(plan_part == k), engine) for k, engine in enumerate(engines)]

    def _evaluate(self, table: PlanTable, progress: Optional[Callable[[int], None]] = None) -> Screen:
        """:meth:`evaluate` of plans that share one stack."""
        n = len(table)
        peak, worst, lb = np.empty(n), np.empty(n, dtype=np.int64), np.empty(n)
        # one shape per (pp, vpp, stage placement): the schedules that place stages alike share it
        v_style = np.array([stage_style(name) == "v" for name in SCHEDULE_NAMES], dtype=np.int64)
        key = (table.pp * 64 + table.vpp) * 2 + v_style[table.schedule]
        # within a shape by schedule: each schedule's plans are a slice of the shape's
        order = np.argsort(key * len(SCHEDULE_NAMES) + table.schedule, kind="stable")
        if not n:
            return Screen(peak, worst, lb)
        S = table.take(order)  # sorted by shape: each shape's plans are a slice
        pre = table_terms(S, self.terms, (self.nccl_share, self.tp_share))
        for sub in slices_by(key.take(order)).values():
            style = stage_style(SCHEDULE_NAMES[int(S.schedule[sub.start])])
            mine = order[sub]
            peak[mine], worst[mine], lb[mine] = self._group(int(S.pp[sub.start]), int(S.vpp[sub.start]), style, S, pre, sub)
            if progress:
                progress(sub.stop - sub.start)
        return Screen(peak, worst, lb)

