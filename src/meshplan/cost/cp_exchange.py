"""How context parallelism exchanges K and V, per software stack, and how much of it is exposed.

Two exchanges are modelled, chosen by :attr:`meshplan.specs.plan.TrainingPlan.kernels`:

* ``fused`` (Megatron with Transformer Engine): a ring of c − 1 point-to-point steps, each
  passing the local K and V over the K/V heads of this TP rank (Liu et al. 2023, "Ring Attention
  with Blockwise Transformers", Sec. 3; Transformer Engine's ``AttnFuncWithCPAndKVP2P``).
* ``compiled`` / ``eager`` (torch's ``context_parallel``, as torchtitan runs it): K and V are
  already repeated to the query heads (torchtitan's ``repeat_kv`` before SDPA), and
  ``_ContextParallelOptions.rotate_method = ALL_GATHER`` (torchtitan's
  ``--experimental.context_parallel_rotate_method`` default ``allgather``) gathers every rank's
  K|V in one all-gather started at step 0 and waited at step 1; the backward gathers K|V again
  the same way and passes the fp32 dK|dV one ring step at a time (``dkv_rotater``,
  ``ft_c.permute_tensor``), each transfer waited one step later and the last after the loop
  (``_templated_ring_attention`` and ``_templated_ring_attention_backward`` in
  ``torch/distributed/tensor/experimental/_attention.py``).

Symbols (one GPU, one layer, one micro-batch): n = b·s/c local tokens, c the CP degree, g the
K/V heads this TP rank sends (g_r = max(1, g/t) for the fused ring, a/t after ``repeat_kv`` for
torch, the K/V heads themselves for MLA), d and d_v the key and value head dims, e bytes per
activation element, A_f and A_b the forward and backward attention time of the layer.
"""

from __future__ import annotations

from typing import Union

import numpy as np

from meshplan.cost import collectives as coll
from meshplan.cost.calibration import Calibration
from meshplan.cost.collectives import GroupPlacement
from meshplan.cost.params import kv_heads_per_rank
from meshplan.cost.step import exposed
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec

Num = Union[float, int, np.ndarray]

#: bytes per element of the dK|dV buffers torch's ring passes (``convert_to_f32 = True``)
GRAD_ACCUM_BYTES = 4


def sdpa_kv_heads(model: ModelSpec, tp: int, kernels: str) -> int:
    """K/V heads one TP rank's attention kernel sees: g_r = max(1, g/t) for Transformer Engine's
    fused kernels (grouped-query attention inside the kernel), a/t for the torch stacks, whose
    SDPA gets K and V repeated to the query heads (torchtitan's ``repeat_kv``); MLA's K/V are
    per query head already (g = a, so both give a/t)."""
    return kv_heads_per_rank(model, tp) if kernels == "fused" else model.n_heads // tp


def cp_exchange_bytes(model: ModelSpec, tokens: float, tp: int, act_bytes: int, kernels: str) -> tuple[float, float]:
    """(K|V bytes one rank contributes, dK|dV bytes one backward transfer passes):

        B_kv  = n·g·(d + d_v)·e
        B_dkv = n·g·(d + d_v)·4   (torch's fp32 dK|dV; the fused ring passes K|V twice instead)

    with g = :func:`sdpa_kv_heads`. For the fused ring g = g_r and B_dkv = 2·B_kv, the backward's
    K|V and dK|dV per step (Liu et al. 2023); without MLA (d_v = d) B_kv is
    :func:`meshplan.cost.comm.cp_kv_bytes`, 2·n·g_r·d·e, bit for bit, while MLA's values are d_v
    wide, not d (DeepSeek-V3: d = 192, d_v = 128)."""
    d_v = model.value_head_dim if model.is_mla else model.head_dim
    elems = tokens * sdpa_kv_heads(model, tp, kernels) * (model.head_dim + d_v)
    if kernels == "fused":
        return elems * act_bytes, 2 * elems * act_bytes
    return elems * act_bytes, elems * GRAD_ACCUM_BYTES


def ring_backward_buffer_bytes(model: ModelSpec, tokens: float, tp: int, act_bytes: int, kernels: str, cp: int) -> float:
    """Bytes torch's ring attention backward holds at its peak beyond a plain SDPA backward, per
    GPU, for one layer and micro-batch (0 for the ``fused`` stack, whose ring is not modelled here,
    and at c = 1). With N_q = n·a_r·d query elements and N_kv = n·a_r·(d + d_v) K|V elements
    (a_r = :func:`sdpa_kv_heads`, the repeated heads torch's SDPA gets):

        B_ring = (c + 1/2)·e·N_kv + 4·N_q + 16·N_kv

    read from ``_templated_ring_attention_backward`` (``rotate_method = ALL_GATHER``,
    ``convert_to_f32 = True``, round-robin load balance) at its peak on ranks 1…c − 1, a step
    i ≤ rank after the dK|dV exchange is posted:

    * the K|V all-gathered from every rank, kept through the loop, c·e·N_kv, and this step's
      ``torch.cat`` of K|V, e·N_kv;
    * the fp32 dQ accumulator, 4·N_q, and dK, dV rebuilt by ``_partial_update``'s ``torch.cat``,
      4·N_kv;
    * the fp32 dK|dV concatenated to send, 4·N_kv, and two ``permute_tensor`` (all-to-all)
      outputs, the one received and the one posted, 8·N_kv;
    * the step's kernel outputs over half the keys, e·(N_q + N_kv/2), where a plain backward's
      outputs, e·(N_q + N_kv), are its gradients: the difference is subtracted.

    For 16-bit activations (e = 2, d_v = d) that is (c + 9.5)·B_kv with B_kv = e·N_kv the K|V of
    one rank (:func:`cp_exchange_bytes`): measured exactly by torch 2.13 on CPU ranks over gloo,
    the CPU flash kernels in place of the CUDA ones (:func:`meshplan.verify.ring.torch_ring_backward_rank`;
    ``tests/test_cp_ring_memory.py`` at c = 2 and 4, the same function at c = 8; with fp32
    activations the peak falls at another step, within 0.5·B_kv of this). The forward's ring
    (all-gathered K|V, the fp32 merged output) peaks lower, about (c + 4.5)·B_kv with its output,
    measured the same way, and is not added."""
    if kernels == "fused" or cp <= 1:
        return 0.0
    a_r = sdpa_kv_heads(model, tp, kernels)
    d_v = model.value_head_dim if model.is_mla else model.head_dim
    n_q = tokens * a_r * model.head_dim
    n_kv = tokens * a_r * (model.head_dim + d_v)
    g = GRAD_ACCUM_BYTES
    return (cp + 0.5) * act_bytes * n_kv + g * n_q + 4 * g * n_kv


def cp_exchange_collectives(
    model: ModelSpec, tokens: float, tp: int, act_bytes: int, kernels: str, cp: int,
    pl_cp: GroupPlacement, cluster: ClusterSpec, cal: Calibration,
) -> tuple[float, float]:
    """Seconds of one (K|V exchange, backward transfer) before overlap, over the CP group:

    * fused: a send/recv of B_kv per ring step, and of 2·B_kv per backward step;
    * torch: an all-gather of the c ranks' K|V (c·B_kv gathered, ``collective_time``'s size is
      the gathered tensor), and a send/recv of the fp32 dK|dV, B_dkv."""
    kv, dkv = cp_exchange_bytes(model, tokens, tp, act_bytes, kernels)
    step = coll.collective_time("send_recv", kv, pl_cp, cluster, cal)
    if kernels == "fused":
        return step, 2 * step
    gather = coll.collective_time("all_gather", cp * kv, pl_cp, cluster, cal)
    return gather, coll.collective_time("send_recv", dkv, pl_cp, cluster, cal)


def cp_exposed_times(kernels: str, cp: Num, kv: Num, dkv: Num, fwd_attention: Num, bwd_attention: Num) -> tuple[Num, Num]:
    """Exposed (forward, backward) seconds of the CP exchange of one layer and micro-batch, from
    :func:`cp_exchange_collectives`' (``kv``, ``dkv``) = (T_kv, T_dkv); each of the c ring steps
    runs 1/c of the attention. With x⁺ = max(x, 0) (:func:`meshplan.cost.step.exposed`):

    * fused ring (Liu et al. 2023, Sec. 3): every step's transfer hides behind one step's call,

          t_fwd = (c − 1)·(T_kv − A_f/c)⁺        t_bwd = (c − 1)·(T_dkv − A_b/c)⁺

    * torch (``rotate_method = ALL_GATHER``): the all-gather hides only behind the causal step-0
      call, forward and again backward; each of the c fp32 dK|dV transfers hides behind the next
      step's backward call, the last (waited after the loop) behind none:

          t_fwd = (T_kv − A_f/c)⁺
          t_bwd = (T_kv − A_b/c)⁺ + (c − 1)·(T_dkv − A_b/c)⁺ + T_dkv

    Numbers or NumPy arrays (the same expression, bit for bit); 0 at c = 1 (both collectives
    are 0 over one rank)."""
    if kernels == "fused":
        return (cp - 1) * exposed(kv, fwd_attention / cp), (cp - 1) * exposed(dkv, bwd_attention / cp)
    return (
        exposed(kv, fwd_attention / cp),
        exposed(kv, bwd_attention / cp) + (cp - 1) * exposed(dkv, bwd_attention / cp) + dkv,
    )


def cp_raw_times(kernels: str, cp: Num, kv: Num, dkv: Num) -> tuple[Num, Num]:
    """(forward, backward) seconds of one layer's CP exchange before overlap, the collectives
    :func:`cp_exposed_times` overlaps: fused, (c − 1)·T_kv and (c − 1)·T_dkv; torch, T_kv and
    T_kv + c·T_dkv. 0 at c = 1."""
    if kernels == "fused":
        return (cp - 1) * kv, (cp - 1) * dkv
    return kv, kv + cp * dkv
