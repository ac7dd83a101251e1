"""Communication on the step's critical path and its overlap with compute.

Per layer and micro-batch (n = b·s/c tokens per GPU, e bytes per activation element):

* TP, Megatron-style (Shoeybi et al. 2019; Korthikanti et al. 2022 Sec. 4.2.2): without sequence
  parallelism 2 all-reduces of n·h·e forward and 2 backward; with it, 2 all-gathers + 2
  reduce-scatters of the same size forward and backward (same bytes on the wire). On the critical
  path; with TP communication overlap (Megatron ``--tp-comm-overlap``, torchtitan async TP) only
  the part longer than the layer's GEMMs stays exposed, and without it Megatron-LM (since
  2021-09) and Transformer Engine run the backward's behind the column-parallel linears' own
  GEMMs (:mod:`meshplan.cost.tp_backward`).
* CP ring attention (Liu et al. 2023): c − 1 steps, each passing the local K and V
  (2·n·g·d·e / t bytes) forward, and K, V plus their gradients backward; each step overlaps
  with 1/c of the attention compute.
* ZeRO-3 / FSDP: per layer an all-gather of the weights before forward and before backward
  (unless kept after forward) and a reduce-scatter of the gradients after backward, prefetched
  so that only the part longer than the layer's compute is exposed.
* DP gradient synchronization (ZeRO 0: all-reduce; 1 and 2: reduce-scatter, then an all-gather
  of updated weights after the optimizer step): overlapped with the last micro-batch's backward
  (``overlap_grad_reduce``) except at least the last layer's bucket; the weight all-gather with
  the next step's first forward (``overlap_param_gather``). HSDP adds an all-reduce of the
  gradient shard across replicas.
"""

from __future__ import annotations

import numpy as np


def exposed(comm, window, tail=0.0):
    """Part of ``comm`` not hidden behind ``window`` of compute, never less than ``tail``
    (the piece that can only start after the compute ends): max(comm − window, min(tail, comm), 0).
    Numbers or NumPy arrays (elementwise, same result bit for bit)."""
    if isinstance(comm, np.ndarray) or isinstance(window, np.ndarray) or isinstance(tail, np.ndarray):
        return np.maximum(np.maximum(comm - window, np.minimum(tail, comm)), 0.0)
    return max(comm - window, min(tail, comm), 0.0)


def hidden_comm(comm, exposed_part):
    """Seconds of a collective that run concurrently with compute: its time before overlap less
    the part left exposed, max(comm − exposed, 0) (0 when nothing overlaps). Numbers or arrays."""
    if isinstance(comm, np.ndarray) or isinstance(exposed_part, np.ndarray):
        return np.maximum(comm - exposed_part, 0.0)
    return max(comm - exposed_part, 0.0)
