"""The search space: every layout and switch combination for one model, GPU count and batch.

A plan of the space is a choice of

=================  =============================================================================
tp, cp, pp, dp     a factorization tp·cp·pp·dp = N of the GPU count
ep                 mixture-of-experts models: every ep dividing both the expert count E and dp
                   (the ep group is carved out of the data-parallel axis, :mod:`meshplan.cost.moe`);
                   dense models: 1
schedule, vpp      pp = 1: none; pp > 1: 1f1b, gpipe, zbh1 (v = 1), zbv (v = 2), interleaved and
                   interleaved-zb (v = 2 .. max_vpp)
micro_batch b      1 .. max_micro_batch; m = B / (b·dp) micro-batches per step (B sequences)
recompute          none, selective, op, full
sequence parallel  on or off (tp > 1; off without TP)
TP comm overlap    on or off (tp > 1; off without TP)
ZeRO stage         0 .. 3; with ``hsdp`` also every shard group 1 < dp_shard < dp dividing dp
=================  =============================================================================

restricted by the user's limits and fixed axes. Structural rules reject plans before they are
evaluated, each counted under its reason (the first rule a plan breaks, in the order of
:data:`meshplan.specs.rules.REASONS`); the rest are evaluated (:mod:`meshplan.search.engine`), and those whose peak
memory exceeds the usable HBM are rejected for memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from meshplan.errors import InputError
from meshplan.pipeline.schedules import SCHEDULES
from meshplan.specs.model import ModelSpec
from meshplan.specs.rules import (
    batch_breaks, cp_breaks, ep_hsdp_breaks, ep_sp_breaks, op_recompute_breaks, pipeline_size_breaks, rounds_break,
    sp_breaks, stages_break, tp_breaks,
)

RECOMPUTE = ("none", "selective", "op", "full")
SCHEDULE_NAMES = tuple(SCHEDULES)  # index = schedule code in the plan table



#: The most plans a search evaluates at once: its table (14 columns of 8 bytes and 2 of 1 per plan)
#: and the engine's per-plan arrays peak near 400 bytes a plan (1,625,115 plans of Llama 3 405B on
#: 16,384 GPUs with HSDP and a 4M-64M batch range: 623 MB), so about 1.6 GB at the bound.
MAX_PLANS = 4_000_000


@dataclass(frozen=True)
class SearchLimits:
    """What the user allows: upper limits, fixed values (``None`` = searched) and option lists."""

    max_tp: Optional[int] = None  # default: GPUs per node
    max_cp: int = 16
    max_pp: int = 128
    max_vpp: int = 8
    max_micro_batch: int = 8
    max_ep: Optional[int] = None  # default: the expert count
    tp: Optional[int] = None
    cp: Optional[int] = None
    pp: Optional[int] = None
    dp: Optional[int] = None
    ep: Optional[int] = None
    vpp: Optional[int] = None
    micro_batch: Optional[int] = None
    schedules: tuple[str, ...] = SCHEDULE_NAMES
    recompute: tuple[str, ...] = RECOMPUTE
    zero: tuple[int, ...] = (0, 1, 2, 3)
    sequence_parallel: tuple[bool, ...] = (True, False)
    # off unless asked for, as in estimate: meshplan hides overlapped TP traffic entirely, which
    # measured AsyncTP does not reach (docs/accuracy.md), so a search does not assume it
    tp_comm_overlap: tuple[bool, ...] = (False,)
    hsdp: bool = False
    max_plans: int = MAX_PLANS  # checked on the count before the table is built (:func:`enumerate_plans`)


@dataclass
class PlanTable:
    """The evaluated plans as columns (one entry per plan) and the structural rejections."""

    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    dp_shard: np.ndarray
    ep: np.ndarray
    vpp: np.ndarray
    schedule: np.ndarray  # code: index into SCHEDULE_NAMES
    micro_batch: np.ndarray
    global_batch: np.ndarray
    recompute: np.ndarray  # code: index into RECOMPUTE
    sp: np.ndarray
    tpo: np.ndarray  # TP communication overlap
    zero: np.ndarray
    rejected: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.tp.size)

    @property
    def num_microbatches(self) -> np.ndarray:
        return self.global_batch // (self.micro_batch * self.dp)

    def take(self, idx: np.ndarray) -> "PlanTable":
        """The plans ``idx`` (indices, or a mask over the plans), in that order."""
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        cols = {name: getattr(self, name).take(idx) for name in COLUMNS}
        return PlanTable(**cols, rejected=dict(self.rejected))

    def row(self, i: int) -> dict:
        """Plan ``i`` as TrainingPlan fields."""
        return {
            "tp": int(self.tp[i]),
            "cp": int(self.cp[i]),
            "pp": int(self.pp[i]),
            "dp": int(self.dp[i]),
            "dp_shard": int(self.dp_shard[i]) if self.dp_shard[i] != self.dp[i] else None,
            "ep": int(self.ep[i]),
            "vpp": int(self.vpp[i]),
            "schedule": SCHEDULE_NAMES[int(self.schedule[i])],
            "micro_batch": int(self.micro_batch[i]),
            "global_batch": int(self.global_batch[i]),
            "recompute": RECOMPUTE[int(self.recompute[i])],
            "sequence_parallel": bool(self.sp[i]),
            "tp_comm_overlap": bool(self.tpo[i]),
            "zero": int(self.zero[i]),
        }


COLUMNS = ("tp", "cp", "pp", "dp", "dp_shard", "ep", "vpp", "schedule", "micro_batch", "global_batch", "recompute", "sp", "tpo", "zero")
_BOOL_COLUMNS = ("sp", "tpo")
#: The columns that vary inside one mesh (tp, cp, pp, dp), in the order of :func:`_inner_combos`.
_INNER = ("ep", "tpo", "recompute", "sp", "zero", "dp_shard")


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _axis_values(n: int, fixed: Optional[int], limit: int, name: str) -> list[int]:
    if fixed is not None:
        if fixed < 1 or n % fixed:
            raise InputError(name, f"--{name} {fixed} must be a positive divisor of the GPU count ({n})")
        return [fixed]
    return [d for d in divisors(n) if d <= limit]


def _schedule_options(pp: int, lim: SearchLimits) -> list[tuple[int, int]]:
    """(schedule code, vpp) pairs for pp ranks within the limits (pp = 1: 1F1B alone)."""
    if pp == 1:
        return [(SCHEDULE_NAMES.index("1f1b"), 1)]
    out = []
    for name in lim.schedules:
        rule = SCHEDULES[name][0]
        vs = [1] if rule == "1" else [2] if rule == "2" else list(range(2, lim.max_vpp + 1))
        out += [(SCHEDULE_NAMES.index(name), v) for v in vs if lim.vpp is None or v == lim.vpp]
    return out


def _ep_values(model: ModelSpec, d: int, lim: SearchLimits) -> list[int]:
    """Expert-parallel sizes for dp = d: every divisor of gcd(E, d) up to ``max_ep`` (the fixed
    ``ep`` only, when it divides d); 1 for a dense model."""
    if not model.is_moe:
        return [1]
    cap = lim.max_ep if lim.max_ep is not None else model.n_experts
    values = [e for e in divisors(math.gcd(model.n_experts, d)) if e <= cap]
    return [e for e in values if e == lim.ep] if lim.ep is not None else values


def _check_ep_limits(model: ModelSpec, lim: SearchLimits) -> None:
    if lim.max_ep is not None and lim.max_ep < 1:
        raise InputError("max_ep", f"must be at least 1 (got {lim.max_ep})")
    if lim.ep is None:
        return
    if lim.ep < 1:
        raise InputError("ep", f"must be at least 1 (got {lim.ep})")
    if lim.ep > 1 and not model.is_moe:
        raise InputError("ep", f"ep = {lim.ep} needs a mixture-of-experts model; {model.name} is dense (use ep = 1)")
    if model.is_moe and model.n_experts % lim.ep:
        raise InputError("ep", f"ep ({lim.ep}) must divide the number of experts ({model.n_experts})")


def _inner_combos(
    t: int, c: int, d: int, seq_len: int, lim: SearchLimits, eps: list[int], rec_codes: list[int],
    zero_opts: list[tuple[int, int]],
) -> tuple[dict[str, np.ndarray], dict[str, int], int]:
    """The (ep, TP overlap, recompute, SP, ZeRO, dp_shard) combinations of one mesh that pass the
    rules (as columns, :data:`_INNER`), the others counted by the first rule they break, and the
    number of combinations in all."""
    sp_opts = list(lim.sequence_parallel) if t > 1 else [False]  # no SP without TP
    tpo_opts = list(lim.tp_comm_overlap) if t > 1 else [False]  # nothing to overlap without TP
    combos = np.array([(ep, o, r, sp, z, sh) for ep in eps for o in tpo_opts for r in rec_codes for sp in sp_opts
                       for z, sh in zero_opts], dtype=np.int64).reshape(-1, len(_INNER))
    ep, sp, sh = combos[:, 0], combos[:, 3].astype(bool), combos[:, 5]
    left = np.ones(len(combos), dtype=bool)
    bad: dict[str, int] = {}
    for reason, broken in (("sp_seq", sp_breaks(seq_len, c, t, sp)), ("ep_sp", ep_sp_breaks(ep, t, sp)),
                           ("ep_hsdp", ep_hsdp_breaks(ep, sh != d))):
        hit = int(np.count_nonzero(left & broken))  # counted by the first rule they break
        if hit:
            bad[reason] = hit
        left &= ~broken
    total = len(combos)
    rows = combos[left]
    cols = {name: rows[:, j].astype(bool) if name in _BOOL_COLUMNS else rows[:, j] for j, name in enumerate(_INNER)}
    return cols, bad, total


def enumerate_plans(
    model: ModelSpec,
    num_gpus: int,
    gpus_per_node: int,
    seq_len: int,
    global_batches: tuple[int, ...],
    lim: SearchLimits,
) -> PlanTable:
    """Every plan of the space (module docstring) that passes the structural rules, as columns;
    the others counted by reason in ``rejected``. More than ``lim.max_plans`` is refused before
    the columns are built."""
    n = num_gpus
    _check_ep_limits(model, lim)
    max_tp = lim.max_tp if lim.max_tp is not None else gpus_per_node
    tps = _axis_values(n, lim.tp, max_tp, "tp")
    cps = _axis_values(n, lim.cp, lim.max_cp, "cp")
    pps = _axis_values(n, lim.pp, min(lim.max_pp, n), "pp")
    mbs = [lim.micro_batch] if lim.micro_batch is not None else list(range(1, lim.max_micro_batch + 1))
    bs = np.array(mbs, dtype=np.int64)
    gbs = np.array(global_batches, dtype=np.int64)
    reject: dict[str, int] = {}
    kept = _Kept()
    # op-level selective recompute is modelled for dense attention + MLP layers only
    modes = [r for r in lim.recompute if not op_recompute_breaks(model, r)]
    rec_codes = [RECOMPUTE.index(r) for r in modes]

    def add(reason: str, count: int) -> None:
        if count:
            reject[reason] = reject.get(reason, 0) + count

    for t in tps:
        for c in cps:
            for p in pps:
                if n % (t * c * p):
                    continue
                d = n // (t * c * p)
                if lim.dp is not None and d != lim.dp:
                    continue
                eps = _ep_values(model, d, lim)
                if not eps:  # the fixed ep does not divide this dp
                    continue
                zero_opts = [(z, d) for z in lim.zero]
                if lim.hsdp:
                    zero_opts += [(z, s) for z in lim.zero if z >= 1 for s in divisors(d) if 1 < s < d]
                inner_cols, inner_bad, inner = _inner_combos(t, c, d, seq_len, lim, eps, rec_codes, zero_opts)
                per_mesh = inner * len(mbs) * len(global_batches)
                sv = _schedule_options(p, lim)
                if tp_breaks(model, t):
                    add("tp_heads", per_mesh * len(sv))
                    continue
                if cp_breaks(seq_len, c):
                    add("cp_seq", per_mesh * len(sv))
                    continue
                add("stages_layers", per_mesh * sum(stages_break(model, p, v) for _, v in sv))
                sv = [(x, v) for x, v in sv if not stages_break(model, p, v)]
                if not sv:
                    continue
                code, v, si, gi, bi = _batch_combos(sv, gbs, bs, d, p, inner, add)
                for reason, count in inner_bad.items():
                    add(reason, count * len(si))
                if not len(inner_cols["ep"]) or not len(si):
                    continue
                outer = {"vpp": v[si], "schedule": code[si], "global_batch": gbs[gi], "micro_batch": bs[bi]}
                kept.add((t, c, p, d), outer, inner_cols)
    _check_size(sum(kept.mesh_plans), lim.max_plans)
    return PlanTable(**kept.columns(), rejected=reject)


class SpaceTooLarge(InputError):
    """A search space of more plans than its limit: ``plans`` and ``limit`` for callers that word
    the remedy their own way (the web explorer names its form's fields, not flags)."""

    def __init__(self, plans: int, limit: int):
        super().__init__("search", f"the space holds {plans:,} plans, more than the {limit:,} a search may evaluate; "
                                   "fix an axis (tp, pp, ...), narrow --batch-range or lower a --max-* limit")
        self.plans, self.limit = plans, limit


def _check_size(plans: int, limit: int) -> None:
    """Refuse a space of more than ``limit`` plans before its columns are allocated: until then
    each mesh holds only its distinct (schedule, batch, micro-batch) and inner combinations, a few
    kilobytes, and the plan count is their product summed over the meshes."""
    if plans > limit:
        raise SpaceTooLarge(plans, limit)


#: the schedule codes of the interleaved schedules, which need the micro-batches in equal rounds
_INTERLEAVED = {SCHEDULE_NAMES.index("interleaved"), SCHEDULE_NAMES.index("interleaved-zb")}


def _batch_combos(sv: list[tuple[int, int]], gbs: np.ndarray, bs: np.ndarray, d: int, p: int, inner: int, add):
    """Every (schedule and vpp of ``sv``, global batch, micro-batch) of a mesh with dp ``d`` and pp
    ``p`` at once, in the order of nested loops over them. Each rule counts (``add``, times the
    mesh's ``inner`` combinations) the combinations the earlier ones passed. Returns the schedule
    codes and vpps of ``sv`` and the indices (schedule, batch, micro-batch) of the kept ones."""
    code = np.array([x for x, _ in sv], dtype=np.int64)
    v = np.array([y for _, y in sv], dtype=np.int64)
    looped = np.array([x in _INTERLEAVED for x, _ in sv])[:, None, None]
    ok = np.broadcast_to(~batch_breaks(gbs[:, None], bs, d), (len(sv), len(gbs), len(bs)))
    m = gbs[:, None] // (bs * d)
    rounds = ~rounds_break(looped, m, p)  # equal rounds (schedules.rounds_of)
    fits = ~pipeline_size_breaks(m, p, v[:, None, None])
    add("batch_divisible", inner * int(np.count_nonzero(~ok)))
    add("interleaved_rounds", inner * int(np.count_nonzero(ok & ~rounds)))
    ok = ok & rounds
    add("pipeline_size", inner * int(np.count_nonzero(ok & ~fits)))
    si, gi, bi = np.nonzero(ok & fits)
    return code, v, si, gi, bi


@dataclass
class _Kept:
    """The plans :func:`enumerate_plans` keeps, mesh by mesh, until they become columns: per mesh
    (tp, cp, pp, dp) and its plan count; per kept (schedule, batch, micro-batch) of a mesh its vpp,
    schedule, batch and micro-batch, each repeated over the mesh's inner combinations (_INNER);
    the meshes' inner combinations stacked, and per plan the row of its combination."""

    meshes: list[tuple[int, int, int, int]] = field(default_factory=list)
    mesh_plans: list[int] = field(default_factory=list)
    outer: dict[str, list[np.ndarray]] = field(
        default_factory=lambda: {"vpp": [], "schedule": [], "global_batch": [], "micro_batch": []})
    outer_repeats: list[int] = field(default_factory=list)
    inner_parts: list[dict[str, np.ndarray]] = field(default_factory=list)
    inner_rows: list[tuple[int, int, int]] = field(default_factory=list)  # (first row, rows, outer repeats): tiled in columns()
    n_inner: int = 0

    def add(self, mesh: tuple[int, int, int, int], outer: dict[str, np.ndarray],
            inner_cols: dict[str, np.ndarray]) -> None:
        """The plans of ``mesh``: every combination of ``outer`` (columns of equal length) with every
        row of ``inner_cols``."""
        k, n_outer = len(inner_cols["ep"]), len(outer["vpp"])
        self.meshes.append(mesh)
        self.mesh_plans.append(k * n_outer)
        for name, x in outer.items():
            self.outer[name].append(x)
        self.outer_repeats.append(k)
        self.inner_parts.append(inner_cols)
        self.inner_rows.append((self.n_inner, k, n_outer))
        self.n_inner += k

    def columns(self) -> dict[str, np.ndarray]:
        """One array per column of :data:`COLUMNS`, a plan per entry."""
        empty = np.zeros(0, dtype=np.int64)
        arrays: dict[str, np.ndarray] = {}
        counts = np.array(self.mesh_plans, dtype=np.int64)
        for j, name in enumerate(("tp", "cp", "pp", "dp")):
            arrays[name] = np.repeat(np.array([mesh[j] for mesh in self.meshes], dtype=np.int64), counts)
        reps = np.repeat(np.array(self.outer_repeats, dtype=np.int64), [len(x) for x in self.outer["vpp"]])
        for name, parts in self.outer.items():
            arrays[name] = np.repeat(np.concatenate(parts), reps) if parts else empty
        rows = np.concatenate([np.tile(np.arange(a, a + k), n) for a, k, n in self.inner_rows]) if self.inner_rows else empty
        for name in _INNER:  # the inner columns keep their dtypes (SP and TP overlap are booleans)
            arrays[name] = np.concatenate([part[name] for part in self.inner_parts]).take(rows) if self.inner_parts else (
                np.zeros(0, dtype=bool) if name in _BOOL_COLUMNS else empty)
        return {name: arrays[name] for name in COLUMNS}
