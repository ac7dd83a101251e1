"""Evaluate many plans at once: exact memory per pipeline rank, and a lower bound on the step.

Plans are grouped by pipeline shape (pp, vpp, schedule), so that every plan of a group has the
same virtual stages and layer split; inside a group all arithmetic runs on NumPy arrays over the
plans, through the same functions :func:`meshplan.estimate.estimate` uses
(:mod:`meshplan.cost.compose`, :mod:`meshplan.cost.comm`, :func:`meshplan.cost.memory.model_state_bytes`,
:func:`meshplan.pipeline.simulate.peak_bytes`). What cannot be vectorized — the GEMM and attention
time of a layer, the placement of a group, the time of one collective — is computed once per
distinct argument and gathered. The peak memory of every plan is therefore ``estimate``'s to the
last bit (tests assert it).

The step time needs the pipeline simulation, which is sequential per plan; instead the engine
bounds it from below. For pipeline rank r with stages K_r, per-micro-batch stage durations f_k,
b_k, stage-to-stage transfer τ, m micro-batches and the exposed after-pipeline communication a_r:

* rank r cannot start before micro-batch 0 crosses stages 0 .. r − 1:
  σ_r = Σ_{k<r} (f_k + τ);
* it then works m·Σ_{k∈K_r} (f_k + b_k) at least: finish_r ≥ σ_r + busy_r;
* when its last action is the backward of its first stage for the last micro-batch (1F1B,
  GPipe, interleaved), that gradient still has to cross stages r − 1 .. 0:
  makespan ≥ σ_r + busy_r + Σ_{k<r} (b_k + τ).

step ≥ max(max_r (σ_r + busy_r + a_r), makespan bound) + optimizer + weight all-gather. For equal
stages and free transfers the 1F1B bound is the closed form (m + p − 1)(f + b) (Narayanan et al.
2021, Sec. 2.2), i.e. exact; uneven stages, waits and zero-bubble schedules leave a gap, and the
search simulates every plan whose bound could still beat the ones it keeps
(:mod:`meshplan.search.run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

import numpy as np

from meshplan.cost import collectives as coll
from meshplan.cost.activations import embedding_activation_bytes, head_activation_bytes, layer_activations
from meshplan.cost.calibration import calibration_for
from meshplan.cost.comm import cp_kv_bytes, dp_sync_times, placements, tp_collective_time
from meshplan.cost.compose import (
    after_pipeline,
    layer_times,
    pick,
    rank_other_items,
    stage_activations,
    stage_times,
    total_of,
)
from meshplan.cost.compute import embedding_op_times, head_op_times, layer_op_times, optimizer_step_time, recompute_time
from meshplan.cost.memory import model_state_bytes
from meshplan.cost.params import layer_params_per_rank, padded_vocab, rank_params
from meshplan.pipeline.schedules import compile_schedule, stage_style
from meshplan.pipeline.simulate import live_count_peaks, peak_bytes
from meshplan.pipeline.stages import layer_split, stages_of_rank
from meshplan.search.space import RECOMPUTE, SCHEDULE_NAMES, PlanTable
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan

#: Schedules whose backward is one action (B), for which the gradient-chain bound holds.
_UNSPLIT = {SCHEDULE_NAMES.index(n) for n in ("gpipe", "1f1b", "interleaved")}

_KERNEL_FIELDS = (
    "fwd", "bwd", "wgt", "fwd_gemm", "bwd_gemm", "fwd_attention", "bwd_attention", "recompute",
    "emb_fwd", "emb_bwd", "emb_wgt", "head_fwd", "head_bwd", "head_wgt",
    "act_stored", "act_working", "emb_act", "head_act",
)
_COMM_FIELDS = ("tp_one", "cp_step", "all_gather", "reduce_scatter", "act_msg", "p2p_bytes", "p2p")


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
    code = np.zeros(len(keys[0]), dtype=np.int64)
    for col in keys:  # mixed-radix code of the row's distinct values, column by column
        vals, inv = np.unique(col, return_inverse=True)
        code = code * len(vals) + inv.ravel()
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    rows = np.stack([np.asarray(k)[first] for k in keys], axis=1).tolist()
    values = np.array([fn(*row) for row in rows], dtype=float).reshape(len(rows), n_out)
    return values[inverse.ravel()]


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


class Engine:
    """Vectorized evaluation of a :class:`PlanTable` for one model, cluster and base plan (the
    fields the search does not vary: sequence length, precision, attention, rank order, overlap
    switches)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, base: TrainingPlan):
        self.model, self.cluster, self.base = model, cluster, base
        self.cal = calibration_for(cluster.gpu)
        self.rec = base.precision
        self.e = self.rec.activation_bytes
        self._ops = lru_cache(maxsize=None)(
            lambda t, c, b, sp: layer_op_times(
                model, b, base.seq_len, t, c, sp, base.attention, base.attention_flops, cluster.gpu, self.cal,
                self.rec.compute_dtype, self.e,
            )
        )
        self._kernel = lru_cache(maxsize=None)(self._kernel_terms)
        self._comm = lru_cache(maxsize=None)(self._comm_terms)
        self._dp = lru_cache(maxsize=None)(self._dp_terms)
        self._place = lru_cache(maxsize=None)(
            lambda t, c, p, d, ds: placements(cluster, t, c, p, d, ds, base.rank_order)
        )

    # ---- terms computed once per distinct argument ---------------------------------------------
    def _kernel_terms(self, t: int, c: int, b: int, sp: int, rec_code: int) -> tuple:
        m, base, gpu, cal, e = self.model, self.base, self.cluster.gpu, self.cal, self.e
        s, dtype, sp = base.seq_len, self.rec.compute_dtype, bool(sp)
        ops = self._ops(t, c, b, sp)
        emb = embedding_op_times(m, b, s, t, c, gpu, cal, e)
        head = head_op_times(m, b, s, t, c, gpu, cal, dtype, e)
        mode = RECOMPUTE[rec_code]
        la = layer_activations(m, b, s, t, c, sp, mode, base.attention, e)
        return (
            ops.fwd, ops.bwd, ops.bwd_weight, ops.fwd_gemm, ops.bwd_gemm, ops.fwd_attention, ops.bwd_attention,
            recompute_time(ops, mode), emb.fwd, emb.bwd, emb.bwd_weight, head.fwd, head.bwd, head.bwd_weight,
            la.stored, la.working, embedding_activation_bytes(m, b, s, t, c, sp), head_activation_bytes(m, b, s, t, c, sp, e),
        )

    def _comm_terms(self, t: int, c: int, p: int, d: int, ds: int, b: int, sp: int, zero: int) -> tuple:
        m, cluster, cal, e, rec = self.model, self.cluster, self.cal, self.e, self.rec
        pl = self._place(t, c, p, d, ds)
        tokens = b * self.base.seq_len / c
        act_msg = tokens * m.hidden * e
        tp_one = tp_collective_time(act_msg, bool(sp), pl.tp, cluster, cal)
        cp_step = coll.collective_time("send_recv", cp_kv_bytes(m, tokens, t, e), pl.cp, cluster, cal)
        per_layer = zero == 3 and ds * c > 1
        lp = layer_params_per_rank(m, t)
        ag = coll.collective_time("all_gather", lp * rec.weight_bytes, pl.shard, cluster, cal) if per_layer else 0.0
        rs = coll.collective_time("reduce_scatter", lp * rec.grad_bytes, pl.shard, cluster, cal) if per_layer else 0.0
        p2p_bytes = act_msg / (t if sp else 1)
        p2p = coll.collective_time("send_recv", p2p_bytes, pl.pp, cluster, cal) if p > 1 else 0.0
        return tp_one, cp_step, ag, rs, act_msg, p2p_bytes, p2p

    def _dp_terms(self, t: int, c: int, p: int, d: int, ds: int, zero: int, params: int) -> tuple:
        pl = self._place(t, c, p, d, ds)
        return dp_sync_times(params, zero, False, ds * c, self.rec, pl, self.cluster, self.cal)

    # ---- one pipeline shape -------------------------------------------------------------------
    def _group(self, pp: int, v: int, code: int, T: PlanTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        model, base, rec = self.model, self.base, self.rec
        t, c, d, ds, b = T.tp, T.cp, T.dp, T.dp_shard, T.micro_batch
        sp, zero, rc = T.sp.astype(np.int64), T.zero, T.recompute
        m = T.num_microbatches
        G = len(T)
        k = dict(zip(_KERNEL_FIELDS, _gather(self._kernel, [t, c, b, sp, rc], len(_KERNEL_FIELDS)).T))
        pp_col = np.full(G, pp, dtype=np.int64)
        cm = dict(zip(_COMM_FIELDS, _gather(self._comm, [t, c, pp_col, d, ds, b, sp, zero], len(_COMM_FIELDS)).T))
        shard = ds * c
        spb = sp.astype(bool)
        lt = layer_times(
            fwd=k["fwd"], bwd=k["bwd"], wgt=k["wgt"], fwd_gemm=k["fwd_gemm"], bwd_gemm=k["bwd_gemm"],
            fwd_attention=k["fwd_attention"], bwd_attention=k["bwd_attention"], recompute=k["recompute"],
            full_recompute=rc == RECOMPUTE.index("full"),
            emb=(k["emb_fwd"], k["emb_bwd"], k["emb_wgt"]), head=(k["head_fwd"], k["head_bwd"], k["head_wgt"]),
            tp_one=cm["tp_one"], sp=spb, tp_comm_overlap=base.tp_comm_overlap, cp=c, cp_step=cm["cp_step"],
            fsdp_per_layer=(zero == 3) & (shard > 1), all_gather=cm["all_gather"], reduce_scatter=cm["reduce_scatter"],
            reshard_after_forward=base.reshard_after_forward,
        )
        split = layer_split(model.n_layers, pp, v)
        st = stage_times(split, lt)
        act = stage_activations(split, k["act_stored"], k["emb_act"], k["head_act"])
        n_stages = pp * v
        last = n_stages - 1
        style = stage_style(SCHEDULE_NAMES[code])
        tau = cm["p2p"]
        working = pick(rc != RECOMPUTE.index("none"), k["act_working"], 0.0)
        t_vals, t_inv = np.unique(t, return_inverse=True)
        t_inv = t_inv.ravel()
        by_tp = lambda fn: np.array([fn(int(x)) for x in t_vals], dtype=np.int64)[t_inv]  # noqa: E731
        logits_grad = 4 * (b * base.seq_len / c) * by_tp(lambda x: padded_vocab(model, x) // x)
        layer_params = by_tp(lambda x: layer_params_per_rank(model, x))
        mesh, mesh_inv = np.unique(np.stack([t, c, d, ds, zero], axis=1), axis=0, return_inverse=True)
        mesh_inv = mesh_inv.ravel()
        mesh_rows = mesh.tolist()

        # peak activations: the schedule's live counts, per number of micro-batches
        stored = np.zeros((G, pp))
        tail_ok = np.zeros((G, pp), dtype=bool)
        act_mat = np.stack(act, axis=1)  # (plans, stages)
        m_eff = _memory_microbatches(SCHEDULE_NAMES[code], pp, m)
        for mm in np.unique(m_eff).tolist():
            sel = np.flatnonzero(m_eff == mm)
            sched = compile_schedule(SCHEDULE_NAMES[code], pp, mm, v)
            peaks = live_count_peaks(sched, n_stages)
            for r in range(pp):
                chunks, rows, _ = peaks[r]
                stored[sel, r] = peak_bytes(rows, act_mat[np.ix_(sel, chunks)])
                if code in _UNSPLIT and sched.kind[r].size:
                    kind, stage, mb = sched.kind[r][-1], sched.stage[r][-1], sched.mb[r][-1]
                    tail_ok[sel, r] = kind == 1 and stage == r and mb == mm - 1

        totals = np.empty((G, pp))
        lb_finish = np.empty((G, pp))
        lb_span = np.zeros(G)
        slow = np.full(G, -np.inf)
        opt_pg = np.zeros(G)
        start = np.zeros(G)
        chain_b = np.zeros(G)
        for r in range(pp):
            mine = stages_of_rank(r, pp, v, style)
            n_layers = sum(split[j] for j in mine)
            first, holds_head = 0 in mine, last in mine
            params = by_tp(lambda x: rank_params(model, x, pp, n_layers, first, holds_head))  # int64
            state = model_state_bytes(params, rec, zero, shard)
            other = rank_other_items(
                reserve=self.cal.runtime_reserve, holds_head=holds_head, logits_grad=logits_grad, zero=zero,
                shard=shard, params=params, layer_params=layer_params, weight_bytes=rec.weight_bytes,
                grad_bytes=rec.grad_bytes, reshard_after_forward=base.reshard_after_forward,
                once_per_step=False, tp=t, act_msg=cm["act_msg"], pp=pp, p2p_bytes=cm["p2p_bytes"],
            )
            activations = stored[:, r] + working
            totals[:, r] = state.weights + state.gradients + state.optimizer + activations + total_of(other)
            p_of = {x: rank_params(model, x, pp, n_layers, first, holds_head) for x in t_vals.tolist()}
            sync = np.array(
                [self._dp(tt, cc, pp, dd, ss, zz, p_of[tt]) for tt, cc, dd, ss, zz in mesh_rows]
            ).reshape(len(mesh_rows), 2)[mesh_inv]
            last_bwd = sum(st.bwd[j] for j in mine)
            first_fwd = sum(st.fwd[j] for j in mine)
            after, pg = after_pipeline(
                grad_comm=sync[:, 0], param_gather=sync[:, 1], last_bwd=last_bwd, first_fwd=first_fwd,
                n_layers=n_layers, overlap_grad_reduce=base.overlap_grad_reduce,
                overlap_param_gather=base.overlap_param_gather,
            )
            local = params / pick(zero >= 1, shard, 1)
            opt = optimizer_step_time(local, rec, self.cluster.gpu, self.cal)
            better = opt + pg > slow  # first rank with the largest optimizer + gather, as estimate picks it
            slow = np.where(better, opt + pg, slow)
            opt_pg = np.where(better, opt + pg, opt_pg)
            busy = m * (last_bwd + first_fwd)
            lb_finish[:, r] = start + busy + after
            lb_span = np.maximum(lb_span, start + busy + np.where(tail_ok[:, r], chain_b, 0.0))
            start = start + st.fwd[r] + tau
            chain_b = chain_b + st.bwd[r] + tau
        lb = np.maximum(lb_finish.max(axis=1), lb_span) + opt_pg
        worst = totals.argmax(axis=1)
        return totals[np.arange(G), worst], worst, lb * (1 - 1e-12)

    def evaluate(self, T: PlanTable, progress: Optional[Callable[[int], None]] = None) -> Screen:
        """Peak memory, worst rank and step lower bound of every plan of ``T``; ``progress`` is
        called with the number of plans done after each pipeline shape."""
        n = len(T)
        peak, worst, lb = np.empty(n), np.empty(n, dtype=np.int64), np.empty(n)
        key = (T.pp * 64 + T.vpp) * 16 + T.schedule
        order = np.argsort(key, kind="stable")
        bounds = np.flatnonzero(np.diff(key[order])) + 1
        for idx in np.split(order, bounds) if n else []:
            i0 = idx[0]
            g = self._group(int(T.pp[i0]), int(T.vpp[i0]), int(T.schedule[i0]), T.take(idx))
            peak[idx], worst[idx], lb[idx] = g
            if progress:
                progress(len(idx))
        return Screen(peak, worst, lb)

