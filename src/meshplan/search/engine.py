"""Evaluate many plans at once: exact memory per pipeline rank, and a lower bound on the step.

Plans are sorted by pipeline shape (pp, vpp, stage placement: the schedules that place stages
alike, GPipe, 1F1B and ZB-H1, or interleaved 1F1B and interleaved zero bubble, share one), so that
every shape is a slice of the table with the same virtual stages and layer split; all arithmetic
runs on NumPy arrays over the plans, through the same functions :func:`meshplan.estimate.estimate`
uses (:mod:`meshplan.cost.compose`, :mod:`meshplan.cost.comm`,
:func:`meshplan.cost.memory.model_state_bytes`, :func:`meshplan.pipeline.simulate.peak_bytes`). What
cannot be vectorized — the GEMM and attention time of a layer, the placement of a group, the time
of one collective — is computed once per distinct argument over the whole table
(:meth:`Engine._terms`). Every other term is computed once per distinct row of what it depends on
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
(:func:`_peak_rank`), not from (plans × ranks) arrays. Every operation is elementwise and in
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

from meshplan.cost.calibration import calibration_for
from meshplan.cost.compose import (
    LayerTimes,
    StageTimes,
    after_pipeline,
    kept_outputs_bytes,
    layer_times,
    merged_outputs_items,
    pick,
    pp_buffer_messages,
    rank_other_items,
    stage_activation_table,
    stage_times,
    total_of,
)
from meshplan.cost.compute import optimizer_step_time
from meshplan.cost.contention import NCCL_CTAS, sm_share, tp_overlap_ctas
from meshplan.cost.fsdp_copies import root_unit_applies, runs_fsdp2
from meshplan.cost.memory import ModelState, model_state_bytes
from meshplan.cost.moe import add_moe_layers, moe_layers_per_stage
from meshplan.cost.terms import KernelTerms, MicroBatchComm, MoeKernelTerms, Terms, UnitComm, layer_time_args, moe_layer_time_args
from meshplan.pipeline.inflight import distinct_state_rows, last_stage_live_peaks, state_rows_many
from meshplan.pipeline.schedules import stage_style
from meshplan.pipeline.simulate import padded_peak_bytes
from meshplan.pipeline.stages import layer_split, stages_of_rank
from meshplan.search.space import RECOMPUTE, SCHEDULE_NAMES, PlanTable
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import BEHAVIOUR_FIELDS, Stack

#: Schedules whose backward is one action (B), for which the gradient-chain bound holds.
_UNSPLIT_MASK = np.isin(np.arange(len(SCHEDULE_NAMES)), [SCHEDULE_NAMES.index(n) for n in ("gpipe", "1f1b", "interleaved")])

_KERNEL_FIELDS = KernelTerms._fields
_MB_FIELDS = MicroBatchComm._fields
_UNIT_FIELDS = UnitComm._fields
_MOE_FIELDS = MoeKernelTerms._fields


@dataclass
class Screen:
    """Per plan: peak memory per GPU (bytes) and the rank that has it, and the step lower bound
    (seconds)."""

    peak_bytes: np.ndarray
    worst_rank: np.ndarray
    step_lower_bound: np.ndarray


def _gather(fn: Callable[..., tuple], keys: list[np.ndarray], n_out: int) -> np.ndarray:
    """fn(*key) for every row of the stacked ``keys``, computed once per distinct row:
    an array (rows, n_out)."""
    values, inverse = _gather_distinct(fn, keys, n_out)
    return values[inverse]


def _ranks(code: np.ndarray) -> tuple[np.ndarray, int]:
    """Per entry of a non-negative integer code, the number of its value among the distinct values
    in increasing order, and how many there are. A table over 0 .. max(code) when that is no
    longer than a few times the entries (the codes of a plan table are small), else a sort."""
    n = len(code)
    top = int(code.max(initial=-1)) + 1
    if top > 4 * n + 65536:
        values, inverse = np.unique(code, return_inverse=True)
        return inverse.ravel(), len(values)
    present = np.zeros(top, dtype=bool)
    present[code] = True
    number = np.cumsum(present, dtype=np.int64)
    return (number - 1).take(code), int(number[-1]) if top else 0


def _distinct(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of a non-negative integer code, in increasing order: one index holding
    each, and per entry the number of its value (:func:`_ranks`)."""
    inverse, count = _ranks(code)
    where = np.empty(count, dtype=np.int64)
    where[inverse] = np.arange(len(code))  # any entry of a value holds it
    return where, inverse


def _digit(col: np.ndarray) -> tuple[np.ndarray, int]:
    """A column's digit in a mixed-radix code, and its radix: the value less the column's minimum
    when the values span at most 64, else the rank of the value among the column's distinct values
    (both keep the order)."""
    col = np.asarray(col, dtype=np.int64)
    low = int(col.min(initial=0))
    span = int(col.max(initial=0)) - low + 1
    if span <= 64:
        return (col - low if low else col), span
    return _ranks(col - low if low else col)


def _code_rows(digits: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_distinct` of the rows of stacked columns given by their :func:`_digit` values (or
    any codes 0 .. radix − 1 that keep the order), through their mixed-radix code, renumbered
    whenever it would outgrow :func:`_distinct`'s table (renumbering keeps the order: the same
    rows, in the same order)."""
    code = np.zeros(len(digits[0][0]), dtype=np.int64)
    radix = 1
    table = 4 * len(code) + 65536
    for digit, size in digits:
        if radix > 1 and radix * size > table:  # renumber the codes so far: a table pass, not a sort
            code, radix = _ranks(code)
        if radix > 1:
            code *= size  # in place: code is this function's own array
            code += digit
        else:
            code = digit.astype(np.int64, copy=True)
        radix *= size
    return _distinct(code)


def _distinct_rows(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_distinct` of the rows of the stacked integer columns ``keys``."""
    return _code_rows([_digit(col) for col in keys])


class _Digits:
    """The :func:`_digit` of each named column of a table, computed once and shared by every key
    built from the columns."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.columns, self._digits = columns, {}

    def digit(self, name: str) -> tuple[np.ndarray, int]:
        """The column's :func:`_digit`."""
        if name not in self._digits:
            self._digits[name] = _digit(self.columns[name])
        return self._digits[name]

    def rows(self, names: str) -> tuple[np.ndarray, np.ndarray]:
        """:func:`_distinct_rows` of the columns ``names`` (space-separated)."""
        return _code_rows([self.digit(name) for name in names.split()])


def _gather_distinct(fn: Callable[..., tuple], keys: list[np.ndarray], n_out: int,
                     rows: Optional[tuple[np.ndarray, np.ndarray]] = None) -> tuple[np.ndarray, np.ndarray]:
    """fn(*key) once per distinct row of the stacked ``keys``: the values (distinct rows, n_out)
    and, per row, the index of its distinct row (``rows``: the keys' :func:`_distinct_rows` when
    known)."""
    where, inverse = _distinct_rows(keys) if rows is None else rows
    args = np.stack([np.asarray(k)[where] for k in keys], axis=1).tolist()
    values = np.array([fn(*row) for row in args], dtype=float).reshape(len(args), n_out)
    return values, inverse


def _peak_rank(stored: np.ndarray, pair_inv: np.ndarray, cls_of: np.ndarray, cls_ranks: list[np.ndarray],
               fixed: np.ndarray, working: np.ndarray, other: np.ndarray,
               merged: Optional[np.ndarray] = None, kept: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """Per plan: the largest rank total ((w + g + o) + (activations + working)) + other items and
    the first rank that has it, as ``estimate``'s maximum over ranks; ``stored`` (pairs × ranks)
    holds the activation peaks, ``pair_inv`` each plan's pair, ``cls_of`` each rank's class,
    ``cls_ranks`` each class's ranks, ``fixed`` and ``other`` the classes' terms (classes ×
    plans) and ``working`` each plan's. ``kept`` (classes × plans): the last stage's kept
    outputs beyond those in flight (:func:`meshplan.cost.compose.kept_outputs_bytes`), the other
    items' last, added to them. ``merged`` (classes × plans, −inf where it does not apply): the other items of a second moment without activations, the step's end of a
    pipeline that returns its outputs (:func:`meshplan.cost.compose.merged_outputs_items`); a
    rank's total is the larger of the two, and where the second wins, every rank of the class
    has it and the class's first rank is the first to.

    Rounding to nearest is monotone, so a rank's total never decreases with its activations s:
    within a class, whose ranks share the other terms, the largest total is that of the largest
    activations M_c, first reached on the first rank holding M_c, and the plan's worst rank is the
    first such rank among the classes that reach the peak. A rank with s < M_c ties only if
    rounding closes the gap: each of the three roundings moves a difference by at most two ulps of
    the largest intermediate magnitude u (one ulp per operand, two across a binade edge), so a gap
    M_c − s above 6 ulp(u) keeps the totals apart. Plans where some class's gap is within 8 ulp(u)
    are taken rank by rank (tests/test_search_screen.py drives both ways)."""
    S = stored.T  # (ranks, pairs)
    top, first = np.empty((len(cls_ranks), S.shape[1])), np.empty((len(cls_ranks), S.shape[1]), dtype=np.int64)
    gap = np.full(S.shape[1], np.inf)  # per pair: the smallest gap below a class's largest activations
    for ci, ranks in enumerate(cls_ranks):
        part = S[ranks]
        top[ci] = part.max(axis=0)
        if len(ranks) > 1:
            first[ci] = ranks[(part == top[ci]).argmax(axis=0)]
            gap = np.minimum(gap, top[ci] - np.where(part < top[ci], part, -np.inf).max(axis=0))
        else:
            first[ci] = ranks[0]
    inner = fixed + (np.take(top, pair_inv, axis=1) + working)
    if kept is not None:
        other = other + kept
    totals = inner + other
    first = np.take(first, pair_inv, axis=1)
    if merged is not None:
        at_end = fixed + merged
        end_wins = at_end > totals
        totals = np.where(end_wins, at_end, totals)
        first = np.where(end_wins, np.array([r.min() for r in cls_ranks])[:, None], first)
    peak = totals.max(axis=0)
    worst = np.where(totals == peak, first, len(cls_of)).min(axis=0)
    # inner sums non-negative terms: its largest entry is the largest intermediate magnitude
    close = np.flatnonzero(gap[pair_inv] <= 8 * np.spacing(np.maximum(peak, inner.max(axis=0))))
    if len(close):
        by_rank = (fixed[cls_of][:, close] + (stored[pair_inv[close]].T + working[close])) + other[cls_of][:, close]
        if merged is not None:
            by_rank = np.maximum(by_rank, fixed[cls_of][:, close] + merged[cls_of][:, close])
        worst[close] = by_rank.argmax(axis=0)
    return peak, worst


def _memory_microbatches(schedule: str, pp: int, m: np.ndarray) -> np.ndarray:
    """Micro-batch counts with the same live-count structure as ``m``: the schedule's steady state
    repeats, so every m ≥ 2p (for the interleaved schedules: every multiple of p from 2p on, whose
    rounds are p long) holds the same undominated live counts, peak and last action per rank as
    m = 2p (asserted over a grid in tests/test_search.py). GPipe holds all m micro-batches: kept."""
    if schedule == "gpipe":
        return m
    same = m >= 2 * pp
    if schedule in ("interleaved", "interleaved-zb"):
        same &= m % pp == 0
    return np.where(same, 2 * pp, m)


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
#: hidden TP), the pipeline's buffers and kept outputs by pp > 1, FSDP2's root unit by
#: :func:`meshplan.cost.fsdp_copies.root_unit_applies`; the pipeline runtime is the simulation's
_PER_ROW = frozenset({"tp_comm_overlap", "tp_overlap_kind", "pp_buffers", "pp_return_outputs", "fsdp_head_in_root", "pipeline_runtime"})

#: padded live-count products (pairs × ranks × rows × chunks) small enough for one call
_ONE_CALL = 1 << 16



#: (classes × buffer rows) whose buffers are computed in one call (:meth:`Engine._group`)
_RUN = 8192


# Gathers along the plans of a (classes × plans) array use ``np.take(x, i, axis=1)``: ``x[:, i]``
# returns a Fortran-ordered array, on which every later reduction over the classes runs about 30×
# slower, and is itself about twice as slow.


def _slices_by(values: np.ndarray) -> dict:
    """Per value of the sorted ``values``, the slice of its entries."""
    cuts = (np.flatnonzero(np.diff(values)) + 1).tolist()
    return {int(values[lo]): slice(lo, hi) for lo, hi in zip([0, *cuts], [*cuts, len(values)])}


def _take(lt: LayerTimes, rows) -> LayerTimes:
    """The entries ``rows`` (a slice: views) of layer times over many rows (scalars kept as they are)."""
    return LayerTimes(**{f: x[rows] if isinstance(x, np.ndarray) and x.ndim else x for f, x in vars(lt).items()})


@dataclass
class _Terms:
    """Per-argument terms of a whole plan table: distinct rows and, per plan, the index of its row.

    The layer times depend on a plan's kernel row, micro-batch collectives, ZeRO-3 unit
    collectives and TP overlap (and, with MoE layers, its expert-parallel size) only: they are
    computed once per distinct combination, a layer-time row (``lt_inv``), with the
    stage-to-stage transfer ``tau`` and the working activations ``working`` of the row. The rows
    are sorted by pp first: the rows of one pp are the slice ``lt_pp[pp]``."""

    kernel: np.ndarray  # (kernel rows, _KERNEL_FIELDS)
    kid: np.ndarray
    mb: np.ndarray  # (micro-batch collective rows, _MB_FIELDS)
    mb_of_lt: np.ndarray  # per layer-time row, its row of ``mb``
    te_vals: list
    te_of_mesh: np.ndarray  # per mesh row, its (tp, ep) row of ``te_vals``
    mesh_rows: np.ndarray  # (tp, cp, dp, dp_shard, ep, zero), sorted by pp first
    mesh_where: np.ndarray  # per mesh row, a plan holding it
    mesh_inv: np.ndarray
    mesh_pp: dict  # pp → the slice of its mesh rows
    batch: Optional[tuple]  # each plan's global batch as a digit, and its radix (None: one batch)
    layer: LayerTimes  # over the layer-time rows
    layer_moe: Optional[LayerTimes]  # an MoE layer's (None for a dense model)
    tau: np.ndarray
    working: np.ndarray
    layer_stored: np.ndarray  # the stored bytes of the layer whose working set ``working`` is
    lt_inv: np.ndarray
    lt_pp: dict
    a2a: Optional[np.ndarray] = None  # (layer-time rows, 2): exposed expert all-to-all forward, backward
    moe_kernel_ep1: Optional[np.ndarray] = None  # the MoE layer's terms with ep = 1 on the kernel rows


class Engine:
    """Vectorized evaluation of a :class:`PlanTable` for one model, cluster and base plan (the
    fields the search does not vary: sequence length, precision, attention, rank order, overlap
    switches)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, base: TrainingPlan, stack: Optional[Stack] = None):
        self.model, self.cluster, self.base = model, cluster, base
        # the stack as requested, not as it applies to the base plan: its rules apply per plan
        self.stack = base.stack if stack is None else stack
        # ZeRO-3 that keeps weights gathered and gradients unsharded through the step (a stack
        # that applies to the engine's plans, :meth:`_parts`)
        self.once_per_step = self.stack.fsdp_accumulate_unsharded
        self.cal = calibration_for(cluster.gpu)
        self.rec = base.precision
        self.e = self.rec.activation_bytes
        # the SM shares of hidden collectives (meshplan.cost.contention), as estimate takes them
        self.nccl_share = sm_share(NCCL_CTAS, cluster.gpu.sm_count)
        self.tp_share = sm_share(tp_overlap_ctas(self.stack.tp_overlap_kind), cluster.gpu.sm_count)
        # the per-argument terms, through the code estimate uses; the recompute mode as its code
        self.terms = terms = Terms(model, cluster, base, self.stack)
        self._kernel = lambda t, c, b, sp, rc, g8: terms.kernel(t, c, b, sp, RECOMPUTE[rc], g8)
        self._moe_kernel = lambda t, c, b, sp, rc, ep: terms.moe_kernel(t, c, b, sp, RECOMPUTE[rc], ep)

    # ---- all plans at once ---------------------------------------------------------------------
    def _terms(self, T: PlanTable) -> "_Terms":
        """The per-argument terms of every plan of ``T``, each computed once per distinct argument
        over the whole table (not per pipeline shape), and the layer times once per layer-time row."""
        t, c, p, d, ds, b, ep = T.tp, T.cp, T.pp, T.dp, T.dp_shard, T.micro_batch, T.ep
        sp, zero, rc = T.sp.astype(np.int64), T.zero, T.recompute
        # the shard group of per-layer ZeRO-3 (dp_shard; 0 where weights are not sharded per layer)
        sharded = (zero == 3) & (ds * c > 1)
        fsdp = np.where(sharded & (not self.once_per_step), ds, 0)
        # where FSDP2 all-gathers the Float8Linear weights in FP8 (a base setting, on the sharded ZeRO-3 plans)
        g8 = (sharded & self.stack.fsdp_fp8_all_gather).astype(np.int64)
        D = _Digits(dict(t=t, c=c, p=p, d=d, ds=ds, b=b, ep=ep, sp=sp, zero=zero, rc=rc, fsdp=fsdp, tpo=T.tpo.astype(np.int64)))
        # the mesh rows: the distinct (tp, cp, dp, shard group, ep, ZeRO stage), pp first, so that a
        # pp's rows are a slice ((t, c, p) fix d)
        mesh_where, mesh_inv = D.rows("p t c ds ep zero")
        mesh = np.stack([x[mesh_where] for x in (t, c, d, ds, ep, zero)], axis=1)
        # the layer-time rows: the distinct (pp, tp, cp, per-layer shard group[, ep], micro-batch, SP,
        # recompute, TP overlap). The first four (five with ep) are a function of the mesh row: their rank
        # among the mesh rows' is one digit (pp first: a pp's rows are a slice). The kernel rows,
        # micro-batch collectives and ZeRO-3 unit collectives depend on parts of these only, so
        # their keys are taken over the layer-time rows
        outer = [p[mesh_where], mesh[:, 0], mesh[:, 1], fsdp[mesh_where]] + ([mesh[:, 4]] if self.model.is_moe else [])
        _, outer_of_mesh = _distinct_rows(outer)
        at, lt_inv = _code_rows([(outer_of_mesh.take(mesh_inv), int(outer_of_mesh.max()) + 1), D.digit("b"), D.digit("sp"), D.digit("rc"), D.digit("tpo")])
        row = {name: x[at] for name, x in dict(t=t, c=c, p=p, d=d, ds=ds, b=b, ep=ep, sp=sp, zero=zero, rc=rc, fsdp=fsdp, g8=g8).items()}
        cols = lambda names: [row[name] for name in names.split()]  # noqa: E731
        kernel_rows = _distinct_rows(cols("t c b sp rc g8"))
        kernel, kernel_of_lt = _gather_distinct(self._kernel, cols("t c b sp rc g8"), len(_KERNEL_FIELDS), kernel_rows)
        # tp·cp·pp·dp is the GPU count, so (t, c, p) fix d: the keys leave it out
        mb, mb_of_lt = _gather_distinct(self.terms.comm, cols("t c p d b sp"), len(_MB_FIELDS), _distinct_rows(cols("t c p b sp")))
        units, units_of_lt = _gather_distinct(self.terms.units, cols("t c p d fsdp"), len(_UNIT_FIELDS), _distinct_rows(cols("t c p fsdp")))
        te_where, te_of_mesh = _distinct_rows([mesh[:, 0], mesh[:, 4]])  # (t, ep) of the mesh rows
        lt_pp = _slices_by(row["p"])
        # one contiguous array per field
        k = dict(zip(_KERNEL_FIELDS, np.ascontiguousarray(kernel[kernel_of_lt].T)))
        cm = (dict(zip(_MB_FIELDS, np.ascontiguousarray(mb[mb_of_lt].T)))
              | dict(zip(_UNIT_FIELDS, np.ascontiguousarray(units[units_of_lt].T))))
        working, layer_stored = k["act_working"], k["act_stored"]
        moe = {}
        if self.model.is_moe:
            # the MoE layer's activations do not depend on ep: those of ep = 1, on the rows of ``kernel``
            ones = np.ones(len(kernel), dtype=np.int64)
            moe["ep1"] = _gather(self._moe_kernel, [x[kernel_rows[0]] for x in cols("t c b sp rc")] + [ones], len(_MOE_FIELDS))
            row["full"] = (row["rc"] == RECOMPUTE.index("full")).astype(np.int64)
            moe["kernel"] = _gather(self._moe_kernel, cols("t c b sp rc ep"), len(_MOE_FIELDS))
            moe["comm"] = _gather(self.terms.moe_units, cols("t c p d ds ep zero"), 4)
            moe["a2a"] = _gather(self.terms.a2a, cols("t c p d ep b sp full"), 2)
            moe_working = moe["kernel"][:, _MOE_FIELDS.index("act_working")]
            # the layer whose backward working set is larger, as estimate takes it, and its stored bytes
            layer_stored = np.where(moe_working > working, moe["kernel"][:, _MOE_FIELDS.index("act_stored")], layer_stored)
            working = np.maximum(working, moe_working)
        lt, lt_moe = self._layer_times(T, at, row["fsdp"] > 0, k, cm, moe)
        return _Terms(
            kernel=kernel, kid=kernel_of_lt.take(lt_inv), mb=mb, mb_of_lt=mb_of_lt,
            te_vals=mesh[te_where][:, [0, 4]].tolist(), te_of_mesh=te_of_mesh, mesh_rows=mesh, mesh_where=mesh_where,
            mesh_inv=mesh_inv, mesh_pp=_slices_by(p[mesh_where]),
            batch=_digit(T.global_batch) if T.global_batch.min(initial=0) != T.global_batch.max(initial=0) else None,
            layer=lt, layer_moe=lt_moe, tau=cm["p2p"], lt_inv=lt_inv, lt_pp=lt_pp,
            working=working, layer_stored=layer_stored,
            a2a=moe.get("a2a"), moe_kernel_ep1=moe.get("ep1"),
        )

    def _layer_times(self, T: PlanTable, at: np.ndarray, per_layer: np.ndarray, k: dict, cm: dict, moe: dict) -> tuple:
        """:func:`layer_times` of the plans ``at`` (indices into ``T``), whose weights are sharded
        per layer where ``per_layer``, and of their MoE layers (None for a dense model), from their
        kernel and collective columns ``k``, ``cm`` and the MoE layer's kernel terms and ZeRO-3
        collectives ``moe`` (``kernel``, ``comm``)."""
        model = self.model
        lt_args = layer_time_args(
            self.stack, k, cm, cm, full_recompute=T.recompute[at] == RECOMPUTE.index("full"), sp=T.sp[at],
            tp_comm_overlap=T.tpo[at], cp=T.cp[at], fsdp_per_layer=per_layer,
            embedding_kept=(model.tied_embeddings & (T.pp[at] == 1)) | root_unit_applies(self.stack.fsdp_head_in_root, T.zero[at], T.pp[at]),
            nccl_share=self.nccl_share, tp_share=self.tp_share,
        )
        lt = layer_times(**lt_args)
        if not model.is_moe:
            return lt, None
        mc = moe["comm"]
        km = dict(zip(_MOE_FIELDS, moe["kernel"].T))
        return lt, layer_times(**moe_layer_time_args(lt_args, km, (mc[:, 0], mc[:, 1], mc[:, 2], mc[:, 3]), cm["expert_tp"]))

    # ---- one pipeline shape -------------------------------------------------------------------
    def _group(self, pp: int, v: int, style: str, T: PlanTable, pre: "_Terms", idx: slice) -> tuple:
        """The plans ``idx`` (a slice of ``T``, sorted by shape) of one pipeline shape."""
        model = self.model
        G = idx.stop - idx.start
        m, schedule = T.global_batch[idx] // (T.micro_batch[idx] * T.dp[idx]), T.schedule[idx]
        kernel, kid = pre.kernel, pre.kid[idx]
        # the stage times depend on the plan's layer-time row only: once per row of the shape's pp
        lt_rows = pre.lt_pp[pp]
        lt_inv = pre.lt_inv[idx] - lt_rows.start
        n_lt = lt_rows.stop - lt_rows.start
        split = layer_split(model.n_layers, pp, v)
        st = _shared_stage_times(split, _take(pre.layer, lt_rows))
        # stage activations depend on the kernel row only: once per distinct row
        ku = dict(zip(_KERNEL_FIELDS, kernel.T))
        # torch's pipelining keeps each stage's output to its backward, the last stage's logits too
        held = ku["held_logits"] if pp > 1 else 0.0
        act_mat = stage_activation_table(split, ku["act_stored"], ku["emb_act"], ku["head_act"], ku["kept_output"], held)  # (kernel rows, stages)
        if model.is_moe:  # as estimate does: MoE layers' own times and activations, added per stage
            # the MoE layer's activations do not depend on ep: those of ep = 1, on the rows of ``kernel``
            kmu = dict(zip(_MOE_FIELDS, pre.moe_kernel_ep1.T))
            moe_stage = moe_layers_per_stage(model, split)
            a2a = pre.a2a[lt_rows]
            add_moe_layers(st, moe_stage, _take(pre.layer, lt_rows), _take(pre.layer_moe, lt_rows), (a2a[:, 0], a2a[:, 1]))
            act_mat = act_mat + np.asarray(moe_stage) * (kmu["act_stored"] - ku["act_stored"])[:, None]
        n_stages = pp * v
        last = n_stages - 1
        tau = pre.tau[lt_rows]
        # the mesh rows of the shape's pp (a slice of them)
        mesh_s = pre.mesh_pp[pp]
        mesh_inv = pre.mesh_inv[idx] - mesh_s.start
        mesh_rows = pre.mesh_rows[mesh_s].tolist()
        te_of_mesh, te_vals = pre.te_of_mesh[mesh_s], pre.te_vals
        by_tp_ep = lambda fn: np.array([fn(x, y) for x, y in te_vals], dtype=np.int64)[te_of_mesh]  # noqa: E731
        # a class's model state and optimizer step depend on the plan's mesh row only, its buffers
        # and activations on the mesh row, kernel row and micro-batch count only (not on its schedule
        # within the shape or on TP overlap): once per distinct mesh row and per distinct (mesh row,
        # kernel row[, global batch]), a state row (the batch fixes the count with the two others)
        batch = None if pre.batch is None else (pre.batch[0][idx], pre.batch[1])

        def with_batch(code: np.ndarray, rows=slice(None)) -> np.ndarray:
            """``code`` with the plans' (``rows``') global batch as a last digit, when they differ."""
            return code if batch is None else code * batch[1] + batch[0][rows]

        state_where, state_inv = _distinct(with_batch(mesh_inv * len(kernel) + kid))
        state_mesh = mesh_inv[state_where]

        # ranks holding the same stages (layer counts, embedding, head, MoE layers, in the same
        # order) have the same model state, buffers and stage times to the bit: once per class
        classes: dict[tuple, int] = {}
        cls_of = np.empty(pp, dtype=np.int64)
        cls_first: list[int] = []  # per class, its first rank
        cls_last = np.zeros(pp, dtype=np.int64)  # per class, its last rank
        for r in range(pp):
            mine = stages_of_rank(r, pp, v, style)
            key = tuple((split[j], j == 0, j == last, moe_stage[j] if model.is_moe else 0) for j in mine)
            cls_of[r] = classes.setdefault(key, len(classes))
            cls_last[cls_of[r]] = r
            if cls_of[r] == len(cls_first):
                cls_first.append(r)
        n_cls = len(classes)
        cls_last = cls_last[:n_cls]
        # per-class arrays are (classes × plans): a class's entries are contiguous, and the maxima
        # over classes run down short columns elementwise
        busy_c, after_c = np.empty((n_cls, G)), np.empty((n_cls, G))
        params_c, experts_c = np.empty((n_cls, len(mesh_rows)), dtype=np.int64), np.zeros((n_cls, len(mesh_rows)), dtype=np.int64)
        pg_c, head_c = np.empty((n_cls, G)), np.zeros(n_cls, dtype=bool)
        # FSDP2's all-gather pool per class and mesh row (ZeRO-3 plans on a torch stack use it)
        pool_c = np.zeros((n_cls, len(mesh_rows)))
        root = self.stack.fsdp_head_in_root and pp == 1
        # per class: its stages other than the pipeline's first, and other than its last
        not_first, not_last = np.zeros(n_cls, dtype=np.int64), np.zeros(n_cls, dtype=np.int64)
        layers_c = np.zeros(n_cls, dtype=np.int64)  # per class, its layers
        for ci, r in enumerate(cls_first):
            mine = stages_of_rank(r, pp, v, style)
            not_first[ci], not_last[ci] = sum(j != 0 for j in mine), sum(j != last for j in mine)
            n_layers = sum(split[j] for j in mine)
            layers_c[ci] = n_layers
            first_, holds_head = 0 in mine, last in mine
            n_moe = sum(moe_stage[j] for j in mine) if model.is_moe else 0
            p_of = {(x, y): (self.terms.rank_params(x, pp, n_layers, first_, holds_head, n_moe, y),
                             self.terms.expert_params(x, y, n_moe)) for x, y in te_vals}
            params_c[ci] = by_tp_ep(lambda x, y: p_of[x, y][0])
            if runs_fsdp2(3, self.stack.kernels):
                units = tuple((split[j], j == 0, j == last) for j in mine)
                pool_c[ci] = np.array([self.terms.pool(x, pp, units, self.rec.weight_bytes, root, y, self.stack.fsdp_fp8_all_gather)
                                       for x, y in te_vals])[te_of_mesh]
            if model.is_moe:
                experts_c[ci] = by_tp_ep(lambda x, y: p_of[x, y][1])
            # (gradient sync, weight gather) per mesh row, each gathered per plan as a contiguous array
            sync = np.fromiter(
                itertools.chain.from_iterable(self.terms.dp(tt, cc, pp, dd, ss, ee, zz, *p_of[tt, ee], n_layers)
                                              for tt, cc, dd, ss, ee, zz in mesh_rows),
                dtype=float, count=2 * len(mesh_rows),
            ).reshape(len(mesh_rows), 2).T.copy()
            last_bwd = sum(st.bwd[j] for j in mine).take(lt_inv)
            first_fwd = sum(st.fwd[j] for j in mine).take(lt_inv)
            after, pg = after_pipeline(
                grad_comm=sync[0].take(mesh_inv), param_gather=sync[1].take(mesh_inv), last_bwd=last_bwd, first_fwd=first_fwd,
                n_layers=n_layers, overlap_grad_reduce=self.stack.overlap_grad_reduce,
                overlap_param_gather=self.stack.overlap_param_gather, nccl_share=self.nccl_share,
            )
            if self.once_per_step and runs_fsdp2(3, self.stack.kernels):  # FSDP2's copies of the step's one reduce-scatter and all-gather
                after, pg = self._step_copies(after, pg, mesh_rows, mesh_inv, params_c[ci], n_layers + first_ + holds_head, n_layers)
            busy_c[ci] = m * (last_bwd + first_fwd)
            after_c[ci], pg_c[ci], head_c[ci] = after, pg, holds_head
        # the classes' model state and optimizer step per mesh row, over (classes × mesh rows)
        fixed, opt = self._model_state(T, pre.mesh_where[mesh_s], params_c, experts_c)
        # their other items (buffers): once per buffer row, a distinct (mesh row, kernel row: the
        # backward working set, which decides the peak's moment, depends on the recompute mode too),
        # in one call over (classes × buffer rows), or for many rows one for the classes without the
        # LM head and one for those with it
        buf_where, buf_of_state = _distinct(with_batch(state_mesh * len(kernel) + kid[state_where], state_where))
        buf_mesh, buf_plans = state_mesh[buf_where], state_where[buf_where]
        returns = self.stack.pp_return_outputs and pp > 1  # the step's end is a moment of its own
        other_buf = np.empty((n_cls, len(buf_where)))
        merged_buf = np.empty((n_cls, len(buf_where))) if returns else None
        # the stage-to-stage messages each class holds buffers for (m·(not first + not last) per micro-batch, or 2)
        messages = pp_buffer_messages(self.stack.pp_buffers, m[buf_plans][None, :], not_first[:, None], not_last[:, None])
        at = np.arange(idx.start, idx.stop)[buf_plans]
        k_at = {"head_act": kernel[kid[buf_plans], _KERNEL_FIELDS.index("head_act")], "working": pre.working[pre.lt_inv[at]],
                "layer_stored": pre.layer_stored[pre.lt_inv[at]], "head_output": kernel[kid[buf_plans], _KERNEL_FIELDS.index("head_output")]}
        mb_at = pre.mb[pre.mb_of_lt[pre.lt_inv[at]]]
        cm_at = {name: mb_at[:, _MB_FIELDS.index(name)] for name in ("act_msg", "p2p_bytes")}
        params_b, pool_b = np.take(params_c, buf_mesh, axis=1), np.take(pool_c, buf_mesh, axis=1)
        for rows_ in [np.arange(n_cls)] if len(buf_where) * n_cls <= _RUN else [np.flatnonzero(~head_c), np.flatnonzero(head_c)]:
            if len(rows_):
                other_buf[rows_], merged = self._rank_other(
                    T, pre, at, te_of_mesh[buf_mesh], k_at, cm_at, pp, head_c[rows_], params_b[rows_],
                    messages[rows_] if isinstance(messages, np.ndarray) else messages, m[buf_plans], pool_b[rows_], layers_c[rows_])
                if returns:
                    merged_buf[rows_] = merged
        opt_pg = np.take(opt, mesh_inv, axis=1) + pg_c  # the optimizer step + the exposed weight gather

        # peak activations: each schedule's live counts, once per distinct (micro-batch count,
        # kernel row): the stage activations depend on nothing else within a pipeline shape
        chunks = np.array([sorted(stages_of_rank(r, pp, v, style)) for r in range(pp)], dtype=np.int64)
        cls_ranks = [np.flatnonzero(cls_of == ci) for ci in range(n_cls)]
        working = pre.working[lt_rows]  # per layer-time row of the shape's pp
        peak, worst = np.empty(G), np.empty(G, dtype=np.int64)
        for code, sub in _slices_by(schedule).items():  # the plans are sorted by schedule
            m_eff = _memory_microbatches(SCHEDULE_NAMES[code], pp, m[sub])
            # within one schedule a plan's memory depends on its state row only: once per distinct row
            mem_where, mem_inv = _distinct(state_inv[sub])
            mem_rows, mem_kid = state_inv[sub][mem_where], kid[sub][mem_where]
            m_eff = m_eff[mem_where]
            first, pair_inv = _distinct(m_eff * len(kernel) + mem_kid)  # the distinct (m, kernel row) pairs
            m_where, m_inv = _distinct(m_eff[first])  # the live counts of every micro-batch count at once
            rows = state_rows_many(SCHEDULE_NAMES[code], pp, m_eff[first][m_where], v)
            kept = None
            if returns:  # the outputs the last stage keeps beyond those in flight
                live = last_stage_live_peaks(rows, SCHEDULE_NAMES[code], pp, v)[m_inv][pair_inv]
                per_row = kept_outputs_bytes(m[sub][mem_where], live, ku["head_output"][mem_kid])
                kept = np.where(head_c[:, None], per_row[None, :], 0.0)
            act_pairs = np.take(act_mat[mem_kid[first]], chunks, axis=1)
            # the counts as doubles (exact: small integers) before they are gathered per pair, so that
            # the products do not convert them again
            if rows.shape[2] * len(first) * pp * v <= _ONE_CALL:  # small: every pair at once
                stored_u = padded_peak_bytes(rows.astype(float)[m_inv], act_pairs)
            else:  # per count, its distinct rows only (repeats and padding dropped)
                if rows.shape[2] > 8 and len(first) > 8 * len(m_where):  # worth dropping the repeats
                    rows = distinct_state_rows(rows)
                held = rows.any(axis=(1, 3))  # (counts, n): the rows some rank holds
                n_held = held.shape[1] - np.argmax(held[:, ::-1], axis=1)
                rows = rows.astype(float)
                stored_u = np.empty((len(first), pp))
                for i in range(len(m_where)):
                    sel = np.flatnonzero(m_inv == i) if len(m_where) > 1 else slice(None)
                    stored_u[sel] = padded_peak_bytes(rows[i, :, : n_held[i]], act_pairs[sel])
            peak_u, worst_u = _peak_rank(
                stored_u, pair_inv, cls_of, cls_ranks, np.take(fixed, state_mesh[mem_rows], axis=1), working.take(lt_inv[sub][mem_where]),
                np.take(other_buf, buf_of_state[mem_rows], axis=1),
                None if merged_buf is None else np.take(merged_buf, buf_of_state[mem_rows], axis=1), kept,
            )
            peak[sub], worst[sub] = peak_u.take(mem_inv), worst_u.take(mem_inv)
        # under GPipe, 1F1B and interleaved 1F1B every rank ends with the backward of its first
        # stage for the last micro-batch (the gradient chain of the module docstring)
        chain = _UNSPLIT_MASK[schedule]

        # σ_r and the gradient chain Σ_{k<r} (b_k + τ), summed rank by rank as the bound states.
        # Both never decrease with r (sums of durations ≥ 0), and ranks of one class have the same
        # busy time and exposed communication, so (σ_r + busy) + a and (σ_r + busy) + chain_r,
        # rounded sums monotone in σ_r and chain_r, are largest on the class's last rank: the
        # bound's maxima over ranks are those over the classes' last ranks, to the bit.
        # Both depend on the layer-time row only: summed per row, gathered per plan.
        start, chain_b = np.empty((n_cls, n_lt)), np.empty((n_cls, n_lt))
        run_f, run_b = np.zeros(n_lt), np.zeros(n_lt)
        at_rank = {r: np.flatnonzero(cls_last == r) for r in set(cls_last.tolist())}
        for r in range(int(cls_last.max()) + 1):
            if r in at_rank:
                start[at_rank[r]], chain_b[at_rank[r]] = run_f, run_b
            run_f = run_f + st.fwd[r] + tau
            run_b = run_b + st.bwd[r] + tau
        start, chain_b = np.take(start, lt_inv, axis=1), np.take(chain_b, lt_inv, axis=1)
        reach = start + busy_c
        lb_finish = reach + after_c
        lb_span = np.max(np.where(chain, reach + chain_b, reach), axis=0, initial=0.0)
        lb_pipe = np.maximum(lb_finish.max(axis=0), lb_span)
        # the slowest rank's optimizer step + weight gather
        return peak, worst, (lb_pipe + opt_pg.max(axis=0)) * (1 - 1e-12)

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

    def _model_state(self, T: PlanTable, at: np.ndarray, params: np.ndarray, experts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the plans ``at`` (indices into ``T``) and the classes of ranks holding ``params``
        parameters, of which ``experts`` routed-expert ones ((classes × plans)): the model state
        w + g + o and the optimizer step, through the functions ``estimate`` uses, elementwise."""
        model, rec = self.model, self.rec
        row = lambda x: x[at][None, :]  # noqa: E731
        zero, shard, c = row(T.zero), row(T.dp_shard) * row(T.cp), row(T.cp)
        fsdp2 = (zero == 3) & runs_fsdp2(3, self.stack.kernels)  # FSDP2's fp32 shards are the master copy
        if model.is_moe:  # as estimate: expert weights E/ep per GPU, their state sharded over N_e
            expert_shard = row(T.dp) // row(T.ep) * c  # N_e = dp·cp/ep (:func:`meshplan.cost.moe.expert_shard_degree`)
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

    def _rank_other(self, T: PlanTable, pre: "_Terms", at: np.ndarray, te: np.ndarray, k: dict, cm: dict, pp: int,
                    head: np.ndarray, params: np.ndarray, pp_messages, m: np.ndarray, pool: np.ndarray,
                    layers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the plans ``at`` (indices into ``T``) of one shape, with their (tp, ep) rows ``te``
        of ``pre.te_vals``, their kernel and collective
        columns ``k`` and ``cm`` (``head_act``, ``working``, ``layer_stored``, ``head_output``, ``act_msg``, ``p2p_bytes``), and its classes of
        ranks, ``head`` (classes) saying which hold the LM head, with ``params`` and
        ``pp_messages`` (:func:`pp_buffer_messages`) and ``pool`` (FSDP2's all-gather pool,
        :func:`meshplan.cost.fsdp_copies.gather_pool_bytes`) as (classes × plans) and ``layers`` per class: the total of the other
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
        zero, shard, t, c = row(T.zero), row(T.dp_shard) * row(T.cp), row(T.tp), row(T.cp)
        per_tp = np.array([self.terms.per_tp(x, y, pp) for x, y in pre.te_vals], dtype=np.int64).reshape(-1, 7).T.take(te, axis=1)
        tokens = row(T.micro_batch) * base.seq_len / c
        logits_grad, logits_block = tokens * per_tp[:1], tokens * per_tp[5:6]
        head_act, head_params = k["head_act"][None, :], per_tp[2:3]
        if self.stack.pp_buffers == "per-micro-batch" and pp > 1:  # torch's schedule holds the logits: no freed block
            logits_block = 0.0 * logits_block
        returns = self.stack.pp_return_outputs and pp > 1  # the last stage keeps its outputs to the step's end
        step_outputs = m[None, :] * k["head_output"][None, :] if returns else 0.0
        root = self.stack.fsdp_head_in_root and pp == 1  # torch's FSDP2 root unit (pp = 1 plans; ZeRO-3 below)
        holds_head = bool(head.all())
        head_rows = head
        if head.any() and not holds_head:
            head = head[:, None]
            holds_head, logits_grad, logits_block = True, np.where(head, logits_grad, 0.0), np.where(head, logits_block, 0.0)
            head_act, head_params = np.where(head, head_act, 0.0), np.where(head, head_params, 0)
            if returns:
                step_outputs = np.where(head, step_outputs, 0.0)
        other = rank_other_items(
            reserve=self.cal.runtime_reserve, holds_head=holds_head, logits_grad=logits_grad,
            head_act=head_act, zero=zero, shard=shard, params=params,
            layer_params=per_tp[1:2], head_params=head_params,
            kept_embedding_params=per_tp[3:4] if model.tied_embeddings and pp == 1 else 0,
            weight_bytes=rec.weight_bytes, grad_bytes=rec.grad_bytes, reshard_after_forward=self.stack.reshard_after_forward,
            once_per_step=self.once_per_step, tp=t, act_msg=cm["act_msg"][None, :], pp=pp, p2p_bytes=cm["p2p_bytes"][None, :],
            pp_messages=pp_messages, working=k["working"][None, :],
            root_embedding_params=per_tp[3:4] if root and not model.tied_embeddings else 0,
            head_in_root=root, down_params=per_tp[4:5], layer_stored=k["layer_stored"][None, :], logits_block=logits_block,
            gather_pool=pool, layer_saving=per_tp[6:7], stage_saving=layers[:, None] * per_tp[6:7],
        )
        shape = (len(head_rows), len(at))
        merged = None
        if returns:
            merged = np.full(shape, -np.inf)
            if holds_head:
                end = total_of(merged_outputs_items(
                    reserve=self.cal.runtime_reserve, tp=t, act_msg=cm["act_msg"][None, :], pp=pp,
                    p2p_bytes=cm["p2p_bytes"][None, :], pp_messages=pp_messages, step_outputs=step_outputs,
                    gather_pool=np.where((zero == 3) & (shard > 1), pool, 0.0)))
                merged = np.where(head_rows[:, None], np.broadcast_to(end, shape), -np.inf)
        return np.broadcast_to(total_of(other), shape), merged

    def evaluate(self, T: PlanTable, progress: Optional[Callable[[int], None]] = None) -> Screen:
        """Peak memory, worst rank and step lower bound of every plan of ``T``; ``progress`` is
        called with the number of plans done after each pipeline shape. Plans are evaluated in
        groups that share the stack as it applies to them (:meth:`_parts`)."""
        parts = self._parts(T)
        if len(parts) == 1:
            return parts[0][1]._evaluate(T, progress)
        screen = Screen(np.empty(len(T)), np.empty(len(T), dtype=np.int64), np.empty(len(T)))
        for rows, engine in parts:
            part = engine._evaluate(T.take(rows), progress)
            screen.peak_bytes[rows], screen.worst_rank[rows], screen.step_lower_bound[rows] = (
                part.peak_bytes, part.worst_rank, part.step_lower_bound)
        return screen

    def _parts(self, T: PlanTable) -> list[tuple[np.ndarray, "Engine"]]:
        """The plans of ``T`` grouped by the stack as it applies to them
        (:func:`meshplan.specs.stack.applied`, its rules read a plan's ZeRO stage, pp, tp, schedule
        and TP overlap among the searched fields), less the fields the engine applies plan by plan
        itself (:data:`_PER_ROW`), which keep the requested values: per group, its plans and an
        engine of that stack."""
        where, inverse = _distinct_rows([T.zero, T.pp, T.tp, T.schedule, T.tpo.astype(np.int64)])
        keys: dict[tuple, int] = {}
        part_of = np.empty(len(where), dtype=np.int64)
        for j, i in enumerate(where.tolist()):
            stack = TrainingPlan.of(**{**self.base.model_dump(), "stack": self.stack, **T.row(i)}).stack
            aside = tuple((f, getattr(stack, f)) for f in BEHAVIOUR_FIELDS
                          if f not in _PER_ROW and getattr(stack, f) != getattr(self.stack, f))
            part_of[j] = keys.setdefault(aside, len(keys))
        engines = [Engine(self.model, self.cluster, self.base, self.stack.model_copy(update=dict(aside))) if aside else self
                   for aside in keys]
        if len(engines) == 1:
            return [(np.arange(len(T)), engines[0])]
        plan_part = part_of[inverse]
        return [(np.flatnonzero(plan_part == k), engine) for k, engine in enumerate(engines)]

    def _evaluate(self, T: PlanTable, progress: Optional[Callable[[int], None]] = None) -> Screen:
        """:meth:`evaluate` of plans that share one stack."""
        n = len(T)
        peak, worst, lb = np.empty(n), np.empty(n, dtype=np.int64), np.empty(n)
        # one shape per (pp, vpp, stage placement): the schedules that place stages alike share it
        v_style = np.array([stage_style(name) == "v" for name in SCHEDULE_NAMES], dtype=np.int64)
        key = (T.pp * 64 + T.vpp) * 2 + v_style[T.schedule]
        # within a shape by schedule: each schedule's plans are a slice of the shape's
        order = np.argsort(key * len(SCHEDULE_NAMES) + T.schedule, kind="stable")
        if not n:
            return Screen(peak, worst, lb)
        S = T.take(order)  # sorted by shape: each shape's plans are a slice
        pre = self._terms(S)
        for sub in _slices_by(key.take(order)).values():
            style = stage_style(SCHEDULE_NAMES[int(S.schedule[sub.start])])
            mine = order[sub]
            peak[mine], worst[mine], lb[mine] = self._group(int(S.pp[sub.start]), int(S.vpp[sub.start]), style, S, pre, sub)
            if progress:
                progress(sub.stop - sub.start)
        return Screen(peak, worst, lb)

