"""Compute slowed by the communication it hides: the SMs an overlapped collective occupies.

A collective that runs concurrently with compute is not free. NCCL runs each collective as one
CUDA block (CTA) per channel, each holding one SM for the collective's whole duration; Transformer
Engine's userbuffers overlap reserves ``num_sm`` SMs for its communication kernels. While a
collective of hidden duration T_h runs, the compute kernels beside it have n_c of the GPU's n_SM
SMs fewer, so compute-bound kernels progress at (1 − n_c/n_SM) of their rate and finish

    Δ = T_h · n_c / n_SM                                                        (1)

later (the work left after the collective ends runs at full rate). Symbols: T_h the seconds the
collective runs concurrently with compute (:func:`meshplan.cost.compose.hidden_comm`: its time
before overlap less its exposed part), n_c the SMs (CTAs) it holds, n_SM the GPU's SM count
(``GPUSpec.sm_count``). Sources for n_c:

* NCCL (FSDP all-gathers and reduce-scatters, DP gradient synchronization and weight all-gather,
  context parallelism's K/V exchange): :data:`NCCL_CTAS` = 16, NCCL's default channel count for
  NVLink SHARP collectives on H100 (``NCCL_PARAM(NvlsChannels, "NVLS_NCHANNELS", 16)`` in
  NCCL 2.x's ``src/transport/nvls.cc``; later versions set it per architecture) and the ring channel count NCCL's topology search gives an
  8-GPU H800 node (``16 coll channels`` in its init log, NVIDIA/nccl#892). Ring searches on
  fuller NVLink topologies go up to NCCL's ``MAXCHANNELS`` = 32, so 16 is the low end.
* Transformer Engine's userbuffers (Megatron ``--tp-comm-overlap``): :data:`USERBUFFERS_CTAS` =
  (16 + 1)/2. TE's default overlap configuration (``initialize_ub``, ``get_default_config``)
  gives the reduce-scatter overlaps (``pipeline`` and ``bulk`` methods) ``num_sm = 16`` and the
  all-gather overlaps (``ring_exchange``) ``num_sm = 1`` with ``use_ce = True`` (copy engines);
  a TP collective pair is one all-gather and one reduce-scatter of equal time.
* torch's micro-pipelined TP (AsyncTP): :data:`MICRO_PIPELINE_CTAS` = 0. Its chunks move by
  ``copy_`` between symmetric-memory buffers of peer GPUs, which the copy engines run.

Not modelled: the collective's HBM traffic (each byte received is stored and read back, about 2–3×
the link rate in HBM bytes, NCCL maintainers in NVIDIA/nccl#1428), which slows memory-bound
kernels beside NVLink collectives. Equation (1) is therefore a lower bound of the slowdown: the
measured average, 18.9 % of the overlapped compute over GPT and Llama training kernels on A100
and H100 (Lee et al. 2025, arXiv 2507.03114, abstract), is above NCCL's 16/132 = 12.1 % SM share.
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np

Num = Union[float, int, np.ndarray]

#: SMs one NCCL collective holds: one CTA per channel, 16 channels (module docstring).
NCCL_CTAS = 16
#: SMs Transformer Engine's userbuffers hold, averaged over a TP all-gather (1 SM, copy engines)
#: and a reduce-scatter (16 SMs) of equal time (module docstring).
USERBUFFERS_CTAS = (16 + 1) / 2
#: SMs torch's micro-pipelined TP holds: none, its transfers run on the copy engines.
MICRO_PIPELINE_CTAS = 0


def sm_share(ctas: Num, sm_count: int) -> Num:
    """Fraction of the GPU's SMs a collective of ``ctas`` CTAs holds, n_c / n_SM."""
    return ctas / sm_count


def tp_overlap_ctas(tp_overlap_kind: str) -> float:
    """SMs an overlapped TP collective holds for the plan's ``tp_overlap_kind``: Transformer
    Engine's userbuffers (``userbuffers``) or torch's micro-pipelined TP (``micro-pipeline``)."""
    return MICRO_PIPELINE_CTAS if tp_overlap_kind == "micro-pipeline" else USERBUFFERS_CTAS


def tp_hidden_ctas(tp_comm_overlap: Any, tp_overlap_kind: str) -> Any:
    """SMs the TP collectives hidden behind compute hold: the TP overlap's
    (:func:`tp_overlap_ctas`) where ``tp_comm_overlap`` (a switch, or an array of them), else
    NCCL's own kernels (:data:`NCCL_CTAS`), which run the backward's own overlap
    (:mod:`meshplan.cost.tp_backward`)."""
    if isinstance(tp_comm_overlap, np.ndarray):
        return np.where(tp_comm_overlap, tp_overlap_ctas(tp_overlap_kind), NCCL_CTAS)
    return tp_overlap_ctas(tp_overlap_kind) if tp_comm_overlap else NCCL_CTAS


def contention_time(hidden: Num, share: Num) -> Num:
    """Δ = T_h · n_c / n_SM (Eq. 1 of the module docstring): the seconds by which compute beside
    a collective hidden for ``hidden`` seconds finishes later, ``share`` = n_c / n_SM."""
    return hidden * share
