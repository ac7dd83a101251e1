"""The per-argument terms of a whole plan table, each computed once per distinct row of what it
depends on (:mod:`meshplan.search.rows`) through :class:`meshplan.cost.terms.Terms`, the code
``estimate`` uses for its one plan, and gathered per plan; the layer times once per layer-time row
(:func:`meshplan.cost.compose.layer_times` over arrays)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from meshplan.cost.compose import LayerTimes, layer_times
from meshplan.cost.fsdp_copies import root_unit_applies
from meshplan.cost.grad_accumulation import BATCH_DEPENDENT_KINDS
from meshplan.cost.terms import KernelTerms, MicroBatchComm, MoeKernelTerms, Terms, UnitComm, layer_time_args, moe_layer_time_args
from meshplan.search.rows import Digits, code_rows, digit, distinct_rows, gather, gather_distinct, slices_by
from meshplan.search.space import RECOMPUTE, PlanTable
from meshplan.specs.model import ModelSpec
from meshplan.specs.stack import Stack

KERNEL_FIELDS = KernelTerms._fields
MB_FIELDS = MicroBatchComm._fields
UNIT_FIELDS = UnitComm._fields
MOE_FIELDS = MoeKernelTerms._fields


@dataclass
class TableTerms:
    """Per-argument terms of a whole plan table: distinct rows and, per plan, the index of its row.

    The layer times depend on a plan's kernel row, micro-batch collectives, ZeRO-3 unit
    collectives and TP overlap (and, with MoE layers, its expert-parallel size) only: they are
    computed once per distinct combination, a layer-time row (``lt_inv``), with the
    stage-to-stage transfer ``tau`` and the working activations ``working`` of the row. The rows
    are sorted by pp first: the rows of one pp are the slice ``lt_pp[pp]``."""

    kernel: np.ndarray  # (kernel rows, KERNEL_FIELDS)
    kid: np.ndarray
    mb: np.ndarray  # (micro-batch collective rows, MB_FIELDS)
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


def table_terms(table: PlanTable, terms: Terms, shares: tuple[float, tuple[float, float]]) -> TableTerms:
    """The per-argument terms of every plan of ``table`` (:class:`meshplan.cost.terms.Terms` of one
    model, cluster, base plan and stack), each computed once per distinct argument over the whole
    table (not per pipeline shape), and the layer times once per layer-time row; ``shares``: the
    SM shares of hidden NCCL collectives and of hidden TP ones without and with TP overlap
    (:func:`meshplan.cost.contention.tp_hidden_ctas`)."""
    model, stack = terms.model, terms.stack
    # the recompute mode as its code in the table
    kernel_of = lambda t, c, b, sp, rc, g8: terms.kernel(t, c, b, sp, RECOMPUTE[rc], g8)  # noqa: E731
    moe_kernel_of = lambda t, c, b, sp, rc, ep: terms.moe_kernel(t, c, b, sp, RECOMPUTE[rc], ep)  # noqa: E731
    t, c, p, d, ds, b, ep = table.tp, table.cp, table.pp, table.dp, table.dp_shard, table.micro_batch, table.ep
    sp, zero, rc = table.sp.astype(np.int64), table.zero, table.recompute
    # the shard group of per-layer ZeRO-3 (dp_shard; 0 where weights are not sharded per layer)
    sharded = (zero == 3) & (ds * c > 1)
    fsdp = np.where(sharded & (not stack.fsdp_accumulate_unsharded), ds, 0)
    # where FSDP2 all-gathers the Float8Linear weights in FP8 (a base setting, on the sharded ZeRO-3 plans)
    g8 = (sharded & stack.fsdp_fp8_all_gather).astype(np.int64)
    D = Digits(dict(t=t, c=c, p=p, d=d, ds=ds, b=b, ep=ep, sp=sp, zero=zero, rc=rc, fsdp=fsdp, tpo=table.tpo.astype(np.int64),
                    gb=table.global_batch))
    # the mesh rows: the distinct (tp, cp, dp, shard group, ep, ZeRO stage), pp first, so that a
    # pp's rows are a slice ((t, c, p) fix d)
    mesh_where, mesh_inv = D.rows("p t c ds ep zero")
    mesh = np.stack([x[mesh_where] for x in (t, c, d, ds, ep, zero)], axis=1)
    # the layer-time rows: the distinct (pp, tp, cp, per-layer shard group[, ep], micro-batch, SP,
    # recompute, TP overlap). The first four (five with ep) are a function of the mesh row: their rank
    # among the mesh rows' is one digit (pp first: a pp's rows are a slice). The kernel rows,
    # micro-batch collectives and ZeRO-3 unit collectives depend on parts of these only, so
    # their keys are taken over the layer-time rows
    outer = [p[mesh_where], mesh[:, 0], mesh[:, 1], fsdp[mesh_where]] + ([mesh[:, 4]] if model.is_moe else [])
    _, outer_of_mesh = distinct_rows(outer)
    # (autograd's and FSDP2's gradient accumulation cost (m − 1 + φ)/m of a pass a micro-batch,
    # φ < 1: m, so the global batch, splits their rows)
    by_batch = [D.digit("gb")] if terms.accumulation in BATCH_DEPENDENT_KINDS else []
    at, lt_inv = code_rows([(outer_of_mesh.take(mesh_inv), int(outer_of_mesh.max()) + 1), D.digit("b"), D.digit("sp"), D.digit("rc"),
                            D.digit("tpo"), *by_batch])
    row = {name: x[at] for name, x in dict(t=t, c=c, p=p, d=d, ds=ds, b=b, ep=ep, sp=sp, zero=zero, rc=rc, fsdp=fsdp, g8=g8).items()}
    cols = lambda names: [row[name] for name in names.split()]  # noqa: E731
    kernel_rows = distinct_rows(cols("t c b sp rc g8"))
    kernel, kernel_of_lt = gather_distinct(kernel_of, cols("t c b sp rc g8"), len(KERNEL_FIELDS), kernel_rows)
    # tp·cp·pp·dp is the GPU count, so (t, c, p) fix d: the keys leave it out
    mb, mb_of_lt = gather_distinct(terms.comm, cols("t c p d b sp"), len(MB_FIELDS), distinct_rows(cols("t c p b sp")))
    units, units_of_lt = gather_distinct(terms.units, cols("t c p d fsdp"), len(UNIT_FIELDS), distinct_rows(cols("t c p fsdp")))
    te_where, te_of_mesh = distinct_rows([mesh[:, 0], mesh[:, 4]])  # (t, ep) of the mesh rows
    lt_pp = slices_by(row["p"])
    # one contiguous array per field
    k = dict(zip(KERNEL_FIELDS, np.ascontiguousarray(kernel[kernel_of_lt].T)))
    cm = (dict(zip(MB_FIELDS, np.ascontiguousarray(mb[mb_of_lt].T)))
          | dict(zip(UNIT_FIELDS, np.ascontiguousarray(units[units_of_lt].T))))
    working, layer_stored = k["act_working"], k["act_stored"]
    moe = {}
    if model.is_moe:
        # the MoE layer's activations do not depend on ep: those of ep = 1, on the rows of ``kernel``
        ones = np.ones(len(kernel), dtype=np.int64)
        moe["ep1"] = gather(moe_kernel_of, [x[kernel_rows[0]] for x in cols("t c b sp rc")] + [ones], len(MOE_FIELDS))
        row["full"] = (row["rc"] == RECOMPUTE.index("full")).astype(np.int64)
        moe["kernel"] = gather(moe_kernel_of, cols("t c b sp rc ep"), len(MOE_FIELDS))
        moe["comm"] = gather(terms.moe_units, cols("t c p d ds ep zero"), 4)
        moe["a2a"] = gather(terms.a2a, cols("t c p d ep b sp full"), 2)
        moe_working = moe["kernel"][:, MOE_FIELDS.index("act_working")]
        # the layer whose backward working set is larger, as estimate takes it, and its stored bytes
        layer_stored = np.where(moe_working > working, moe["kernel"][:, MOE_FIELDS.index("act_stored")], layer_stored)
        working = np.maximum(working, moe_working)
    passes = gather(terms.grad_accumulation_passes, cols("t p ep"), 4)
    acc = passes * terms.accumulation_share(table.num_microbatches[at])[:, None]
    lt, lt_moe = _layer_times(table, at, stack, model, row["fsdp"] > 0, k, cm, moe, shares, acc.T)
    return TableTerms(
        kernel=kernel, kid=kernel_of_lt.take(lt_inv), mb=mb, mb_of_lt=mb_of_lt,
        te_vals=mesh[te_where][:, [0, 4]].tolist(), te_of_mesh=te_of_mesh, mesh_rows=mesh, mesh_where=mesh_where,
        mesh_inv=mesh_inv, mesh_pp=slices_by(p[mesh_where]),
        batch=digit(table.global_batch) if table.global_batch.min(initial=0) != table.global_batch.max(initial=0) else None,
        layer=lt, layer_moe=lt_moe, tau=cm["p2p"], lt_inv=lt_inv, lt_pp=lt_pp,
        working=working, layer_stored=layer_stored,
        a2a=moe.get("a2a"), moe_kernel_ep1=moe.get("ep1"),
    )

def _layer_times(table: PlanTable, at: np.ndarray, stack: Stack, model: ModelSpec, per_layer: np.ndarray, k: dict, cm: dict, moe: dict,
                 shares: tuple[float, tuple[float, float]], acc: np.ndarray) -> tuple:
    """:func:`layer_times` of the plans ``at`` (indices into ``table``), whose weights are sharded
    per layer where ``per_layer``, and of their MoE layers (None for a dense model), from their
    kernel and collective columns ``k``, ``cm``, the MoE layer's kernel terms and ZeRO-3
    collectives ``moe`` (``kernel``, ``comm``) and their gradients' accumulation per micro-batch
    ``acc`` (:func:`meshplan.cost.terms.grad_accumulate_per_micro_batch`, one row per part)."""
    lt_args = layer_time_args(
        stack, k, cm, cm, full_recompute=table.recompute[at] == RECOMPUTE.index("full"), sp=table.sp[at],
        tp_comm_overlap=table.tpo[at], cp=table.cp[at], fsdp_per_layer=per_layer,
        embedding_kept=(model.tied_embeddings & (table.pp[at] == 1)) | root_unit_applies(stack.fsdp_head_in_root, table.zero[at], table.pp[at]),
        nccl_share=shares[0], tp_share=np.where(table.tpo[at], shares[1][1], shares[1][0]), grad_accumulate=(acc[0], acc[2], acc[3]),
    )
    lt = layer_times(**lt_args)
    if not model.is_moe:
        return lt, None
    mc = moe["comm"]
    km = dict(zip(MOE_FIELDS, moe["kernel"].T))
    return lt, layer_times(**moe_layer_time_args(lt_args, km, (mc[:, 0], mc[:, 1], mc[:, 2], mc[:, 3]), cm["expert_tp"], acc[1]))
