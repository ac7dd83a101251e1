"""How one plan's per-layer costs add up to per-stage durations and per-rank memory.

These functions are the composition step of :func:`meshplan.estimate.estimate`, written so that
every numeric argument may be a Python number (one plan) or a NumPy array (many plans at once, as
:mod:`meshplan.search` evaluates them): the arithmetic is the same expression in the same order
either way, so the search and ``estimate`` agree to the last bit. Switches that differ between
plans of one batch (ZeRO stage, sequence parallelism, recompute mode) go through :func:`pick`,
which is an ``if`` for one plan and ``numpy.where`` for many.

Symbols (per GPU, one micro-batch): n = b·s/c tokens, h hidden size, e bytes per activation
element, t/c/p TP/CP/PP degrees, N the ZeRO shard degree (dp_shard × cp); the collectives and their
overlap rules are those of :mod:`meshplan.cost.step`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from meshplan.cost.contention import contention_time
from meshplan.cost.cp_exchange import cp_exposed_times, cp_raw_times
from meshplan.cost.step import exposed, hidden_comm

Num = Union[float, int, np.ndarray]


def pick(cond: Any, a: Num, b: Num) -> Num:
    """``a if cond else b`` for one plan, elementwise for an array of conditions."""
    if isinstance(cond, np.ndarray):
        return np.where(cond, a, b)
    return a if cond else b


@dataclass
class LayerTimes:
    """Seconds per layer and micro-batch on one GPU (scalars, or arrays over plans): compute, the
    embedding and LM-head pieces of the first and last stage, and each kind of exposed
    communication."""

    fwd: Num
    bwd: Num  # backward including the recompute of the forward
    wgt: Num  # weight-gradient part of the backward (a split backward's W)
    recompute: Num
    emb_fwd: Num
    emb_bwd: Num
    emb_wgt: Num
    head_fwd: Num
    head_bwd: Num
    head_wgt: Num
    tp_fwd: Num
    tp_bwd: Num  # including the recomputed forward's collectives
    tp_emb_fwd: Num
    tp_emb_bwd: Num
    tp_head_fwd: Num
    tp_head_bwd: Num
    cp_fwd: Num
    cp_bwd: Num
    fsdp_fwd: Num  # exposed ZeRO-3 collectives, and FSDP2's copies (:mod:`meshplan.cost.fsdp_copies`)
    fsdp_bwd: Num
    fsdp_emb_fwd: Num = 0.0
    fsdp_emb_bwd: Num = 0.0
    fsdp_head_fwd: Num = 0.0
    fsdp_head_bwd: Num = 0.0
    # communication hidden behind compute (before overlap minus exposed), per kind and direction:
    # what runs concurrently with the layer's kernels (:func:`hidden_comm`)
    hidden_tp_fwd: Num = 0.0
    hidden_tp_bwd: Num = 0.0
    hidden_cp_fwd: Num = 0.0
    hidden_cp_bwd: Num = 0.0
    hidden_fsdp_fwd: Num = 0.0
    hidden_fsdp_bwd: Num = 0.0
    hidden_fsdp_emb_fwd: Num = 0.0  # embedding unit
    hidden_fsdp_emb_bwd: Num = 0.0
    hidden_fsdp_head_fwd: Num = 0.0  # final norm + LM head unit
    hidden_fsdp_head_bwd: Num = 0.0
    # compute slowed by the hidden collectives' SMs (:mod:`meshplan.cost.contention`), included
    # in fwd/bwd and in emb_*/head_*
    contention_fwd: Num = 0.0
    contention_bwd: Num = 0.0


def layer_times(
    *, fwd: Num, bwd: Num, wgt: Num, fwd_gemm: Num, bwd_gemm: Num, fwd_attention: Num, bwd_attention: Num, recompute: Num,
    full_recompute: Any, emb: tuple[Num, Num, Num], head: tuple[Num, Num, Num], tp_one: Num, sp: Any, tp_comm_overlap: Any,
    cp: Num, cp_comm: tuple[Num, Num], fsdp_per_layer: Any, all_gather: Num, reduce_scatter: Num, reshard_after_forward: bool,
    fsdp_units: tuple[Num, Num, Num, Num], embedding_kept: Any, tp_overlapped: tuple[Num, Num] | None = None,
    kernels: str = "fused", nccl_share: Num = 0.0, tp_share: Num = 0.0,
    fsdp_copies: tuple[Num, Num, Num, Num, Num, Num] = (0.0,) * 6, expert_tp: Num | None = None, zero3_blocking: bool = False,
    own_backward_tp: tuple[Num, Num, Num] | None = None,
) -> LayerTimes:
    """Per-layer times from the layer's op times and the collective times it needs (numbers, or
    arrays over rows of plans, elementwise):

    * TP, exposed or hidden behind the GEMMs (:func:`_tp_times`; ``own_backward_tp``: the
      backward's own overlap, :meth:`meshplan.cost.terms.Terms.backward_tp`); the embedding
      reduces its output forward (reduce-scatter with SP, then an all-gather of its gradient
      backward); the LM head gathers its input forward with SP and reduces its input gradient
      backward (Shoeybi et al. 2019; Korthikanti et al. 2022).
    * CP (``cp_comm``: one K|V exchange and one backward transfer,
      :func:`meshplan.cost.cp_exchange.cp_exchange_collectives`): exposed as the software stack
      ``kernels`` runs it (:func:`meshplan.cost.cp_exchange.cp_exposed_times`: Megatron/TE's ring
      of c − 1 steps, or torch's all-gather and fp32 dK|dV ring).
    * ZeRO-3 per layer and FSDP2's copies (:func:`_fsdp_times`).
    * Full recompute repeats the forward's TP and CP collectives in the backward.
    * Contention (:mod:`meshplan.cost.contention`): the compute beside each hidden collective
      takes Δ = T_h · n_c/n_SM longer, with ``tp_share`` = n_c/n_SM for the overlapped TP
      collectives and ``nccl_share`` for the CP and FSDP ones (both 0: no contention).
    """
    tp_fwd, tp_bwd, h_tp_fwd, h_tp_bwd = _tp_times(tp_one, tp_comm_overlap, tp_overlapped, expert_tp, fwd_gemm, bwd_gemm,
                                                   full_recompute, own_backward_tp)
    half = pick(sp, tp_one / 2, 0.0)
    cp_fwd, cp_bwd = cp_exposed_times(kernels, cp, cp_comm[0], cp_comm[1], fwd_attention, bwd_attention)
    raw_cp_fwd, raw_cp_bwd = cp_raw_times(kernels, cp, cp_comm[0], cp_comm[1])
    h_cp_fwd = hidden_comm(raw_cp_fwd, cp_fwd)
    h_cp_bwd = hidden_comm(raw_cp_bwd, cp_bwd) + pick(full_recompute, h_cp_fwd, 0.0)
    z = _fsdp_times(fwd, bwd, recompute, emb, head, fsdp_per_layer, all_gather, reduce_scatter, reshard_after_forward, fsdp_units,
                    embedding_kept, fsdp_copies, zero3_blocking)
    c_fwd = contention_time(h_tp_fwd, tp_share) + contention_time(h_cp_fwd + z["hidden_fsdp_fwd"], nccl_share)
    c_bwd = contention_time(h_tp_bwd, tp_share) + contention_time(h_cp_bwd + z["hidden_fsdp_bwd"], nccl_share)
    return LayerTimes(
        fwd=fwd + c_fwd,
        bwd=bwd + c_bwd,
        wgt=wgt,
        recompute=recompute,
        emb_fwd=emb[0] + contention_time(z["hidden_fsdp_emb_fwd"], nccl_share),
        emb_bwd=emb[1] + contention_time(z["hidden_fsdp_emb_bwd"], nccl_share),
        emb_wgt=emb[2],
        head_fwd=head[0] + contention_time(z["hidden_fsdp_head_fwd"], nccl_share),
        head_bwd=head[1] + contention_time(z["hidden_fsdp_head_bwd"], nccl_share),
        head_wgt=head[2],
        tp_fwd=tp_fwd,
        tp_bwd=tp_bwd + pick(full_recompute, tp_fwd, 0.0),
        tp_emb_fwd=pick(sp, half, tp_one),
        tp_emb_bwd=pick(sp, half, 0.0),
        tp_head_fwd=pick(sp, half, 0.0),
        tp_head_bwd=pick(sp, half, tp_one),
        cp_fwd=cp_fwd,
        cp_bwd=cp_bwd + pick(full_recompute, cp_fwd, 0.0),
        hidden_tp_fwd=h_tp_fwd,
        hidden_tp_bwd=h_tp_bwd,
        hidden_cp_fwd=h_cp_fwd,
        hidden_cp_bwd=h_cp_bwd,
        contention_fwd=c_fwd,
        contention_bwd=c_bwd,
        **z,
    )


def _tp_times(tp_one: Num, tp_comm_overlap: Any, tp_overlapped: tuple[Num, Num] | None, expert_tp: Num | None, fwd_gemm: Num,
              bwd_gemm: Num, full_recompute: Any, own_backward: tuple[Num, Num, Num] | None = None) -> tuple[Num, Num, Num, Num]:
    """A layer's exposed TP (forward, backward) and the TP hidden behind its GEMMs (forward,
    backward; full recompute hides the forward's again in the backward). ``tp_one``: one
    all-reduce, or with sequence parallelism one all-gather + one reduce-scatter, of n·h·e (0
    without TP): 2 per layer forward and 2 backward, hidden behind the GEMMs with TP overlap
    (Megatron's userbuffers), or, with ``tp_overlapped`` given, as exposed as that (forward,
    backward) pair says (torch's micro-pipelined TP,
    :func:`meshplan.cost.async_tp.micro_pipeline_tp_times`). An MoE layer (``expert_tp`` given:
    :func:`meshplan.cost.moe.expert_tp_time`) keeps the attention half's TP pair as above; its MLP
    half moves the dispatched tokens instead, one all-gather and one reduce-scatter of n·k·h·e
    each way, exposed (outside the TP overlap). torch's micro-pipelined times already leave an MoE
    layer's MLP pair exposed whole (``tp_one``), which the expert exchange replaces.

    Without TP overlap, ``own_backward`` (attention's exposed, a dense MLP's exposed, one block's
    moved; the stack's ``tp_backward_overlap``, :mod:`meshplan.cost.tp_backward`) replaces the
    backward's pairs: the column-parallel linears run their collectives behind their own GEMMs and
    only what outlasts them is exposed; the forward's stay exposed."""
    pairs = 2 if expert_tp is None else 1  # TP pairs that overlap can hide: attention's and a dense MLP's
    tp_fwd = tp_bwd = moved_bwd = pairs * tp_one
    if tp_overlapped is None:
        tp_fwd, tp_bwd = pick(tp_comm_overlap, exposed(tp_fwd, fwd_gemm), tp_fwd), pick(tp_comm_overlap, exposed(tp_bwd, bwd_gemm), tp_bwd)
    else:
        mlp = 0.0 if expert_tp is None else tp_one  # the MoE MLP pair its times leave exposed
        tp_fwd = pick(tp_comm_overlap, tp_overlapped[0] - mlp, tp_fwd)
        tp_bwd = pick(tp_comm_overlap, tp_overlapped[1] - mlp, tp_bwd)
    if own_backward is not None:  # where TP overlap is off (plan by plan in the search)
        tp_bwd = pick(tp_comm_overlap, tp_bwd, own_backward[0] + (own_backward[1] if expert_tp is None else 0.0))
        moved_bwd = pick(tp_comm_overlap, moved_bwd, pairs * own_backward[2])
    h_tp_fwd = hidden_comm(pairs * tp_one, tp_fwd)
    h_tp_bwd = hidden_comm(moved_bwd, tp_bwd) + pick(full_recompute, h_tp_fwd, 0.0)
    if expert_tp is not None:
        tp_fwd, tp_bwd = tp_fwd + expert_tp, tp_bwd + expert_tp
    return tp_fwd, tp_bwd, h_tp_fwd, h_tp_bwd


def _fsdp_times(fwd: Num, bwd: Num, recompute: Num, emb: tuple, head: tuple, fsdp_per_layer: Any, all_gather: Num,
                reduce_scatter: Num, reshard_after_forward: bool, fsdp_units: tuple, embedding_kept: Any, fsdp_copies: tuple,
                blocking: bool = False) -> dict:
    """A layer's, the embedding's and the LM head's exposed and hidden ZeRO-3 time, forward and
    backward (the :class:`LayerTimes` fields ``fsdp_*`` and ``hidden_fsdp_*``; 0 unless
    ``fsdp_per_layer``).

    * ZeRO-3 per layer: all-gather before forward, again before backward unless weights stay
      gathered, reduce-scatter after, prefetched behind the layer's compute. The embedding and
      the final norm + LM head are FSDP units of their own (``fsdp_units``: embedding all-gather,
      embedding reduce-scatter, head all-gather, head reduce-scatter), hidden behind their own
      compute only: the embedding gathers again before its backward when weights are resharded
      after forward, unless ``embedding_kept`` (a tied embedding whose weight the LM head uses at
      the end of the forward, or an embedding in FSDP2's root unit, ``fsdp_head_in_root``, which
      is never resharded after forward); the head unit, first in backward, stays gathered after
      forward. (The last block that torchtitan's root-unit layout also keeps gathered is charged
      its backward all-gather and copy-out like every other: one layer's, hidden but for the
      copy-out, under 0.1 % of a step.) ``blocking`` (``zero3_comm`` blocking-per-tensor: a
      device-wide synchronize before every gather): nothing hidden, every collective exposed.
    * FSDP2's copies (``fsdp_copies``: copy-out and copy-in of a layer, of the embedding and of
      the head unit, :func:`meshplan.cost.fsdp_copies.fsdp2_unit_copy_times`; zeros on other
      stacks) run on the compute stream beside the collectives they serve, one copy-out after
      every all-gather and one copy-in before every reduce-scatter, charged to the FSDP time in
      full."""
    ag_bwd = all_gather if reshard_after_forward else 0.0
    if blocking:  # no compute to hide behind: exposed(comm, 0) = comm
        fwd = bwd = recompute = 0.0
        emb, head = (0.0,) * 3, (0.0,) * 3
    fsdp_fwd = pick(fsdp_per_layer, exposed(all_gather, fwd), 0.0)
    fsdp_bwd = pick(fsdp_per_layer, exposed(ag_bwd + reduce_scatter, bwd + recompute), 0.0)
    emb_ag, emb_rs, head_ag, head_rs = fsdp_units
    emb_ag_bwd = pick(embedding_kept, 0.0, emb_ag) if reshard_after_forward else 0.0
    fsdp_emb_fwd = pick(fsdp_per_layer, exposed(emb_ag, emb[0]), 0.0)
    fsdp_emb_bwd = pick(fsdp_per_layer, exposed(emb_ag_bwd + emb_rs, emb[1]), 0.0)
    fsdp_head_fwd = pick(fsdp_per_layer, exposed(head_ag, head[0]), 0.0)
    fsdp_head_bwd = pick(fsdp_per_layer, exposed(head_rs, head[1]), 0.0)
    on = lambda x: pick(fsdp_per_layer, x, 0.0)  # noqa: E731
    out, in_, emb_out, emb_in, head_out, head_in = fsdp_copies
    emb_again = pick(embedding_kept, 0.0, emb_out) if reshard_after_forward else 0.0
    return dict(
        fsdp_fwd=fsdp_fwd + on(out),
        fsdp_bwd=fsdp_bwd + on((out if reshard_after_forward else 0.0) + in_),
        fsdp_emb_fwd=fsdp_emb_fwd + on(emb_out),
        fsdp_emb_bwd=fsdp_emb_bwd + on(emb_again + emb_in),
        fsdp_head_fwd=fsdp_head_fwd + on(head_out),
        fsdp_head_bwd=fsdp_head_bwd + on(head_in),
        hidden_fsdp_fwd=on(hidden_comm(all_gather, fsdp_fwd)),
        hidden_fsdp_bwd=on(hidden_comm(ag_bwd + reduce_scatter, fsdp_bwd)),
        hidden_fsdp_emb_fwd=on(hidden_comm(emb_ag, fsdp_emb_fwd)),
        hidden_fsdp_emb_bwd=on(hidden_comm(emb_ag_bwd + emb_rs, fsdp_emb_bwd)),
        hidden_fsdp_head_fwd=on(hidden_comm(head_ag, fsdp_head_fwd)),
        hidden_fsdp_head_bwd=on(hidden_comm(head_rs, fsdp_head_bwd)),
    )


@dataclass
class StageTimes:
    """Per virtual stage k (lists indexed by k, each entry a scalar or an array over plans): the
    durations the pipeline simulation runs (``fwd``, ``bwd``, ``wgt``) and their parts."""

    fwd: list
    bwd: list
    wgt: list
    comp_fwd: list
    comp_bwd: list
    recompute: list
    tp_fwd: list
    tp_bwd: list
    cp_fwd: list
    cp_bwd: list
    fsdp_fwd: list
    fsdp_bwd: list


def stage_times(split: tuple[int, ...], lt: LayerTimes) -> StageTimes:
    """Stage k with n_k layers: n_k × the per-layer times, plus the embedding (its compute, TP and
    FSDP collectives) on stage 0 and the LM head on the last stage (``layer_split`` decides n_k)."""
    last = len(split) - 1
    out = StageTimes(*([] for _ in range(12)))
    for k, n_l in enumerate(split):
        first_, last_ = k == 0, k == last
        cf = n_l * lt.fwd + (lt.emb_fwd if first_ else 0.0) + (lt.head_fwd if last_ else 0.0)
        rb = n_l * lt.recompute
        cb = n_l * lt.bwd + rb + (lt.emb_bwd if first_ else 0.0) + (lt.head_bwd if last_ else 0.0)
        tf = n_l * lt.tp_fwd + (lt.tp_emb_fwd if first_ else 0.0) + (lt.tp_head_fwd if last_ else 0.0)
        tb = n_l * lt.tp_bwd + (lt.tp_emb_bwd if first_ else 0.0) + (lt.tp_head_bwd if last_ else 0.0)
        out.comp_fwd.append(cf)
        out.comp_bwd.append(cb)
        out.recompute.append(rb)
        out.tp_fwd.append(tf)
        out.tp_bwd.append(tb)
        out.cp_fwd.append(n_l * lt.cp_fwd)
        out.cp_bwd.append(n_l * lt.cp_bwd)
        ff = n_l * lt.fsdp_fwd + (lt.fsdp_emb_fwd if first_ else 0.0) + (lt.fsdp_head_fwd if last_ else 0.0)
        fb = n_l * lt.fsdp_bwd + (lt.fsdp_emb_bwd if first_ else 0.0) + (lt.fsdp_head_bwd if last_ else 0.0)
        out.fsdp_fwd.append(ff)
        out.fsdp_bwd.append(fb)
        out.fwd.append(cf + tf + n_l * lt.cp_fwd + ff)
        out.wgt.append(n_l * lt.wgt + (lt.emb_wgt if first_ else 0.0) + (lt.head_wgt if last_ else 0.0))
        out.bwd.append(cb + tb + n_l * lt.cp_bwd + fb)
    return out


def stage_activations(split: tuple[int, ...], layer: Num, embedding: Num, head: Num, output: Num = 0.0,
                      last_output: Num = 0.0) -> list:
    """Activation bytes one micro-batch leaves on each virtual stage: n_k × the layer's stored
    bytes, plus what the embedding (stage 0) and the LM head (last stage) keep, plus the stage's
    output, which torch.distributed.pipelining keeps until the micro-batch's backward is done
    (``fwd_cache``; :func:`pp_buffer_messages`) and Megatron-LM frees once sent (0): ``output``
    on every stage but the last, the message sent on, and ``last_output`` on the last, the LM
    head's logits (:func:`meshplan.cost.activations.logits_output_bytes`), which the schedule
    holds through the loss and the stage's backward."""
    table = stage_activation_table(split, layer, embedding, head, output, last_output)
    if table.ndim == 1:  # one plan: numbers
        return table.tolist()
    return list(table.T)


def stage_activation_table(split: tuple[int, ...], layer: Num, embedding: Num, head: Num, output: Num = 0.0,
                           last_output: Num = 0.0) -> np.ndarray:
    """:func:`stage_activations` as one array: (stages,) for numbers, (rows, stages) for arrays
    over rows, each entry ((n_k·layer + embedding on stage 0) + head on the last stage) + output
    on the others, last_output on the last (0.0 where a term does not apply), the same sum in the
    same order."""
    k = np.arange(len(split))
    last = len(split) - 1
    col = (lambda x: x) if np.ndim(layer) == 0 else (lambda x: np.asarray(x, dtype=float)[..., None])  # noqa: E731
    return (
        (np.asarray(split) * col(layer) + np.where(k == 0, col(embedding), 0.0)) + np.where(k == last, col(head), 0.0)
    ) + np.where(k != last, col(output), col(last_output))


def pp_buffer_messages(kind: str, m: Num, not_first: Num, not_last: Num) -> Num:
    """Stage-to-stage messages a pipeline rank holds buffers for through the step, for
    ``pp_buffers`` ``kind``, m micro-batches, and ``not_first`` / ``not_last`` of the rank's
    virtual stages that are not the pipeline's first / last:

    * in-flight (Megatron-LM's p2p communication): 2, the activation and the gradient being
      received;
    * per-micro-batch (torch.distributed.pipelining, ``PipelineStage._prepare_forward_infra`` and
      ``_setup_backward_recv_info``): every stage but the first allocates a receive buffer for each
      micro-batch's input, every stage but the last one for each micro-batch's output gradient,
      all at the first step and kept: m·(not_first + not_last).

    Each message is one stage boundary tensor (``p2p_bytes``). Same-rank hand-offs of a V
    schedule replace a buffer by the previous stage's output, which the buffer then keeps until the
    next step: the same count."""
    if kind == "in-flight":
        return 2
    return m * (not_first + not_last)


def rank_other_items(
    *, reserve: float, holds_head: bool, logits_grad: Num, head_act: Num, zero: Any, shard: Num, params: Num, layer_params: Num,
    head_params: Num, kept_embedding_params: Num, weight_bytes: int, grad_bytes: int, reshard_after_forward: bool,
    once_per_step: bool, tp: Num, act_msg: Num, pp: int, p2p_bytes: Num, pp_messages: Num = 2, working: Num = 0.0,
    root_embedding_params: Num = 0.0, head_in_root: bool = False, down_params: Num, layer_stored: Num, logits_block: Num,
    kept_outputs: Num = 0.0, gather_pool: Num = 0.0, layer_saving: Num = 0.0, stage_saving: Num = 0.0, prefetch: Any = None,
) -> dict[str, Num]:
    """Transient buffers of one pipeline rank at its memory peak (bytes; :mod:`meshplan.cost.memory`).

    Always there: the runtime reserve, TP buffers (two activation messages), PP buffers
    (``pp_messages`` stage-to-stage messages of ``p2p_bytes``: :func:`pp_buffer_messages`). The
    others live at different moments of the backward of the micro-batch whose activations make
    the peak A (all its activations are still stored when its backward begins), so the peak is the
    larger of two moments, not their sum:

    * head moment (last stage, start of backward): A + G + the loss's gradient buffers
      (``logits_grad``: :func:`meshplan.cost.activations.loss_grad_bytes`, 4·n·V/t each) + the
      freed logits' block the caching allocator keeps reserved beside them (``logits_block``:
      :func:`meshplan.cost.activations.freed_logits_block_bytes`; reserved, not allocated, and
      reused by the layers' backward, so the layer moment does not count it);
    * layer moment (backward of the stage's top layer): A − A_head + G' + B + W, the LM head's
      activations A_head already freed (the ``head_activations_freed`` item, negative) and the
      layer's backward working set W (``working``: what recompute rebuilds and the ring attention's
      buffers, :func:`meshplan.cost.activations.layer_activations`) rebuilt. The caller counts W
      with the activations; at the head moment, before any layer's backward, the
      ``working_set_not_yet_built`` item takes it off (negative).

    G, G' are ZeRO-3's gathered weights (:func:`_gathered_weights`), B ZeRO-2/3's reduce-scatter
    buckets (:func:`_reduce_buckets`), ``prefetch`` the unit G' holds prefetched
    (:func:`prefetched_unit`; default: a layer). ``gather_pool`` (ZeRO-3 as torch's FSDP2; 0 otherwise): the
    reserved pool of FSDP2's all-gather copy-in stream
    (:func:`meshplan.cost.allocator.all_gather_pool_bytes`), which the compute stream cannot use,
    at both moments (item ``all_gather_pool``). G' counts the prefetched unit as unsharded; FSDP2's
    prefetch gathers it into the pool and copies it out only when its backward begins, so where
    weights are resharded after forward the layer moment holds the pool less that unit, P_l·w.
    ``kept_outputs`` (last stage, ``pp_return_outputs``): the outputs torch.distributed.pipelining
    keeps for the step's end beyond those of the micro-batches in flight (which the activations
    count: :func:`stage_activations`), the same at both moments and listed last (item
    ``kept_outputs``; :func:`kept_outputs_bytes`); the step's end is :func:`merged_outputs_items`.
    An item that does not apply is 0 (for one plan: absent)."""
    sharded = shard > 1
    z3, z2 = (zero == 3) & sharded, (zero >= 2) & sharded
    unsharded_part = 1 - 1 / shard
    head_here = head_params if holds_head else 0.0
    pre_params, pre_layer = (layer_params, True) if prefetch is None else prefetch
    g_head, g_layer = _gathered_weights(params, layer_params, head_here, kept_embedding_params, root_embedding_params, weight_bytes,
                                        unsharded_part, reshard_after_forward, once_per_step, head_in_root, layer_saving, stage_saving,
                                        (pre_params, pick(pre_layer, layer_saving, 0.0)))  # FP8 gathers save on layers only
    buckets, layer_freed = _reduce_buckets(z2, layer_params, down_params, grad_bytes, layer_stored, working)
    freed = head_act if holds_head else 0.0
    root_held = head_in_root and reshard_after_forward and not once_per_step
    held = head_here * weight_bytes if root_held else 0.0
    prefetched = pre_params * weight_bytes - pick(pre_layer, layer_saving, 0.0) if reshard_after_forward and not once_per_step else 0.0
    pooled = z3 & (gather_pool > 0)  # FSDP2 only: other ZeRO-3 gathers into its own buffers
    # (a rank without layers, an empty end stage, has no prefetched layer to take off)
    beside = np.maximum(gather_pool - prefetched, 0.0) if isinstance(gather_pool, np.ndarray) else max(gather_pool - prefetched, 0.0)
    pool_head, pool_layer = pick(pooled, gather_pool, 0.0), pick(pooled, beside, 0.0)
    at_head = (logits_grad + logits_block if holds_head else 0.0) + pick(z3, g_head, 0.0) + pool_head
    at_layer = pick(z3, g_layer + held, 0.0) + pick(z2, buckets, 0.0) + layer_freed - freed + working + pool_layer
    head_wins = at_head >= at_layer
    items = {
        "runtime_reserve": reserve,
        "logits_grad": pick(head_wins, logits_grad, 0.0) if holds_head else 0.0,
        "freed_logits_block": pick(head_wins, logits_block, 0.0) if holds_head else 0.0,
        "gathered_weights": pick(z3, pick(head_wins, g_head, g_layer), 0.0),
        "unsharded_gradients": pick(z3, params * grad_bytes * unsharded_part, 0.0) if once_per_step else 0.0,
        "root_gradients_held": pick(np.logical_and(z3, np.logical_not(head_wins)), held, 0.0),
        "grad_reduce_buckets": pick(np.logical_and(z2, np.logical_not(head_wins)), buckets, 0.0),
        "layer_activations_freed": pick(head_wins, 0.0, layer_freed),
        "head_activations_freed": pick(head_wins, 0.0, -freed) if holds_head else 0.0,
        "working_set_not_yet_built": pick(head_wins, -working, 0.0),
        "all_gather_pool": pick(head_wins, pool_head, pool_layer),
        "tp_comm_buffers": pick(tp > 1, 2 * act_msg, 0.0),
        "pp_comm_buffers": pp_messages * p2p_bytes if pp > 1 else 0.0,
        "kept_outputs": kept_outputs if holds_head else 0.0,
    }
    if not any(isinstance(x, np.ndarray) for x in (shard, zero, tp)):  # one plan: list what applies
        items = {k: v for k, v in items.items()
                 if k == "runtime_reserve" or v != 0 or _applies(k, holds_head, z3, once_per_step, zero, sharded, tp, pp, root_held)}
    return items


def _gathered_weights(params: Num, layer_params: Num, head_here: Num, kept_embedding_params: Num, root_embedding_params: Num,
                      weight_bytes: int, unsharded_part: Num, reshard_after_forward: bool, once_per_step: bool,
                      head_in_root: bool, layer_saving: Num, stage_saving: Num,
                      prefetch: tuple[Num, Num]) -> tuple[Num, Num]:
    """ZeRO-3's gathered weights at the head moment G and at the layer moment G'
    (:func:`rank_other_items`). When weights are resharded after forward, the units kept gathered
    from forward to backward: at the head moment the final norm + LM head unit (P_head·w, 0 on a
    rank without the head) and at the layer moment the layer in use and the unit prefetched for
    the next backward, (P_l + P_pre)·w (``prefetch``: P_pre and the FP8 saving on it,
    :func:`prefetched_unit`; 2·P_l·w on a stage of two layers or more, P_l·w alone on a stage of
    one whose next unit is another rank's: counting a second layer there counted the one layer
    twice), plus a tied embedding the head reuses (pp = 1). With ``head_in_root`` (torchtitan's
    FSDP2 units until pytorch/torchtitan#1094, 2025-07: the embedding, final norm and LM head left
    to the root unit, which FSDP2 never reshards after forward, and the last block kept gathered)
    the root's P_emb + P_head (the embedding's share ``root_embedding_params``) are gathered at
    both moments, the last block's P_l at the head moment, and at the layer moment the LM head's
    unsharded gradients, P_head·w, wait for the root's post-backward at the end of the backward
    (:func:`rank_other_items`' item ``root_gradients_held``; FSDP2 runs the root's post-backward
    from its final callback, as the root's inputs, token ids, take no gradient). When weights stay
    gathered, the whole stage (P·w: the gathered copy sits beside the shard, as FSDP2 keeps it),
    less the head unit at the layer moment; when gradients also stay unsharded through the step
    (``once_per_step``), P·(1 − 1/N)·w at both. ``layer_saving``, ``stage_saving`` (ZeRO-3 with
    FP8 all-gather, :func:`meshplan.cost.fsdp_copies.fp8_gather_saving`): the bytes one gathered
    layer, and all the rank's layers, hold less than P_l·w (their Float8Linear weights gathered as
    FP8), taken off every gathered layer."""
    if once_per_step:
        g = (params * weight_bytes - stage_saving) * unsharded_part
        return g, g
    if reshard_after_forward:
        root_emb, last_block, head_kept = (root_embedding_params, layer_params, head_here) if head_in_root else (0.0, 0.0, 0.0)
        g_head = (head_here + kept_embedding_params + root_emb + last_block) * weight_bytes - (layer_saving if head_in_root else 0.0)
        pre_params, pre_saving = prefetch
        g_layer = (layer_params + pre_params + kept_embedding_params + root_emb + head_kept) * weight_bytes - layer_saving - pre_saving
        return g_head, g_layer
    return params * weight_bytes - stage_saving, (params - head_here) * weight_bytes - stage_saving


def prefetched_unit(stages: list[tuple[int, bool]], layer_params: Num, embedding_params: Num) -> tuple[Num, Any]:
    """The unit ZeRO-3 prefetches while the top layer of a rank's stage runs its backward (FSDP2's
    backward prefetch gathers the unit whose backward comes next; Megatron-FSDP alike), for a
    rank holding the virtual ``stages`` ((layers, whether the pipeline's first) each): on a stage
    of two layers or more, the layer below, P_l (``layer_params``); on a stage of one, the next
    unit in backward is the embedding on the pipeline's first stage (``embedding_params``, 0
    where it stays gathered: tied to the LM head on one stage, or in FSDP2's root unit) and
    otherwise on another rank, so none. With several stages, the larger (the peak's stage is not
    tracked: an upper bound). Returns (P_pre, whether it is a layer); numbers, or arrays over
    plans elementwise."""
    layer = layer_params if any(n >= 2 for n, _ in stages) else 0 * layer_params
    emb = embedding_params if any(n == 1 and first for n, first in stages) else 0 * embedding_params
    if isinstance(layer, np.ndarray) or isinstance(emb, np.ndarray):
        return np.maximum(layer, emb), (layer >= emb) & (layer > 0)
    return max(layer, emb), layer >= emb and layer > 0


def _reduce_buckets(z2: Any, layer_params: Num, down_params: Num, grad_bytes: int, layer_stored: Num,
                    working: Num) -> tuple[Num, Num]:
    """ZeRO-2/3's reduce-scatter buckets B at the layer moment (:func:`rank_other_items`), and the
    activations freed with them (item ``layer_activations_freed``, ≤ 0). Rajbhandari et al. 2020,
    Sec. 5: the top layer's backward peaks at its MLP (the working set W, with the MLP's
    gradients), when the previous layer's gradients are being reduced and of its own only the down
    projection's exist (P_down, ``down_params``: the first weights its backward reaches),
    B = (P_l + P_down)·γ; unless, with few activations, the layer's end is larger, when all its
    gradients exist beside the previous layer's reduction but its activations, its stored
    ``layer_stored`` A_l and W, are freed: B = 2·P_l·γ, freed −(A_l + W). torch's FSDPMemTracker,
    two tiny layers without recompute and four under full recompute: 3.0 % and 1.4 % over torch's
    peak, where 2·P_l·γ beside W was 7.1 % and 4.6 % over (``meshplan verify memory``; the layer's
    own weights, resharded before its reduce-scatter, are still counted at its end)."""
    at_mlp, at_end = (layer_params + down_params) * grad_bytes, 2 * layer_params * grad_bytes
    end_wins = np.logical_and(z2, at_end - layer_stored - working > at_mlp)
    return pick(end_wins, at_end, at_mlp), pick(end_wins, -(layer_stored + working), 0.0)


def _applies(name: str, holds_head: bool, z3: bool, once: bool, zero: int, sharded: bool, tp: int, pp: int, root_held: bool) -> bool:
    """Whether ``name`` is an item of this (one) plan, so a zero-sized buffer is still listed (a
    non-zero one always is)."""
    return {
        "logits_grad": holds_head,
        "freed_logits_block": False,
        "gathered_weights": bool(z3),
        "unsharded_gradients": bool(z3) and once,
        "root_gradients_held": bool(z3) and root_held and holds_head,
        "grad_reduce_buckets": zero >= 2 and sharded,
        "layer_activations_freed": False,
        "head_activations_freed": holds_head and zero >= 2 and sharded,
        "working_set_not_yet_built": False,
        "all_gather_pool": False,
        "tp_comm_buffers": tp > 1,
        "pp_comm_buffers": pp > 1,
        "kept_outputs": False,
    }[name]


def kept_outputs_bytes(m: Num, live_peak: Num, output: Num) -> Num:
    """(m − L)·O: what torch.distributed.pipelining's last stage holds beyond its in-flight
    micro-batches when the schedule returns outputs (``pp_return_outputs``): every forward appends
    the micro-batch's output O (the logits, :func:`meshplan.cost.activations.logits_output_bytes`)
    to ``output_chunks`` and keeps it to the step's end, while the activations count the L
    micro-batches in flight at the peak (the last stage's largest live count,
    :func:`meshplan.pipeline.inflight.last_stage_live_peaks`), each with its output. Exact where
    the last stage's live count is the same at its last micro-batch as at its peak (1F1B: one
    micro-batch in flight throughout, m − 1 kept beside it; GPipe: all m in flight, none beyond);
    on a rank whose peak comes before its last forwards (interleaved schedules) an upper bound."""
    return (m - live_peak) * output


def merged_outputs_items(*, reserve: float, tp: Num, act_msg: Num, pp: int, p2p_bytes: Num, pp_messages: Num,
                         step_outputs: Num, gather_pool: Num = 0.0) -> dict[str, Num]:
    """The last pipeline rank at the end of a step that returns outputs (``pp_return_outputs``):
    torch's schedule merges the m outputs its last stage kept (``step_outputs`` = m·O, the logits
    of :func:`meshplan.cost.activations.logits_output_bytes`) into one batch
    (``_merge_outputs`` → ``merge_chunks``: ``torch.cat``) while it still holds them, 2·m·O
    (items ``step_outputs`` and ``merged_outputs``). By then every backward has run: no
    activations are stored, FSDP2 has resharded the weights and reduce-scattered the gradients it
    accumulated unsharded, so beside the model state only the buffers that are always there
    remain (:func:`rank_other_items`), and the pools other streams reserved, which are never given
    back (``gather_pool``: FSDP2's all-gather pool, for ZeRO-3 plans; item ``all_gather_pool``).
    The rank's peak is the larger of this moment and the backward's."""
    items = {
        "runtime_reserve": reserve,
        "step_outputs": step_outputs,
        "merged_outputs": step_outputs,
        "all_gather_pool": gather_pool,
        "tp_comm_buffers": pick(tp > 1, 2 * act_msg, 0.0),
        "pp_comm_buffers": pp_messages * p2p_bytes if pp > 1 else 0.0,
    }
    if not isinstance(tp, np.ndarray):  # one plan: the buffers only where they apply, as rank_other_items lists them
        items = {k: v for k, v in items.items()
                 if (k != "tp_comm_buffers" or tp > 1) and (k != "all_gather_pool" or v)}
    return items


#: The items of :func:`rank_other_items` that are activations, not buffers: what the peak's moment
#: has freed of the stored activations (the LM head's, a layer's at its end) or not yet built (the
#: backward working set at the loss's backward), each ≤ 0.
FREED_ACTIVATIONS = ("layer_activations_freed", "head_activations_freed", "working_set_not_yet_built")


def at_peak(activation_items: dict[str, Num], other_items: dict[str, Num]) -> tuple[dict[str, Num], dict[str, Num]]:
    """A rank's activation and other items as its peak's moment holds them: the activation items
    (stored A, working set W, backward gradients) followed by the :data:`FREED_ACTIVATIONS` of
    :func:`rank_other_items`, and the other items less those. The activations then total what is
    live at that moment, A + W − A_head (layer moment) or A (head moment, W not yet built), and
    the other items are buffers and reserves, each ≥ 0; the rank's total is unchanged (byte
    counts are integers below 2^53, so the sums are exact in any order, as the search's engine
    adds them: activations, then every other item)."""
    freed = {k: v for k, v in other_items.items() if k in FREED_ACTIVATIONS}
    return {**activation_items, **freed}, {k: v for k, v in other_items.items() if k not in FREED_ACTIVATIONS}


def total_of(items: dict[str, Num]) -> Num:
    """Sum of the items, left to right (the order the JSON lists them)."""
    return sum(items.values())


def after_pipeline(
    *,
    grad_comm: Num,
    param_gather: Num,
    last_bwd: Num,
    first_fwd: Num,
    n_layers: int,
    overlap_grad_reduce: bool,
    overlap_param_gather: bool,
    nccl_share: Num = 0.0,
) -> tuple[Num, Num]:
    """Exposed DP gradient synchronization after a rank's last backward, and exposed weight
    all-gather before its first forward: hidden behind that compute when overlapped, except the
    last layer's bucket (``comm / layers``), which can only start when the compute ends. Each adds
    the contention its hidden part causes in the compute it overlaps, Δ = T_h · ``nccl_share``
    (:mod:`meshplan.cost.contention`; 0: none)."""
    after = exposed(grad_comm, last_bwd, grad_comm / max(1, n_layers)) if overlap_grad_reduce else grad_comm
    pg = exposed(param_gather, first_fwd, param_gather / max(1, n_layers)) if overlap_param_gather else param_gather
    after = after + contention_time(hidden_comm(grad_comm, after), nccl_share)
    pg = pg + contention_time(hidden_comm(param_gather, pg), nccl_share)
    return after, pg
