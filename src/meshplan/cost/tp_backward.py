"""A layer's backward TP collectives run behind the GEMMs of its column-parallel linears
(``tp_backward_overlap``).

Megatron-LM since 2021-09 (``LinearWithGradAccumulationAndAsyncCommunication``,
``megatron/mpu/layers.py``; in Megatron-Core ``megatron/core/tensor_parallel/layers.py``, where
``--no-async-tensor-model-parallel-allreduce`` is ignored) and Transformer Engine (``Linear`` and
``LayerNormLinear``: "Overlap input AG with dgrad", "Overlap dgrad-RS/AR with wgrad") run the
backward of a column-parallel linear, Y = X·Wᵀ with W split by output rows over the t TP ranks, as:

* without sequence parallelism: dX = dY·W; the all-reduce of dX launched asynchronously; then
  dW = dYᵀ·X; then wait. Exposed: max(0, T_AR − T_w).
* with sequence parallelism the linear saves only its input's shard (n/t × h): its all-gather is
  launched; dX = dY·W; wait; the reduce-scatter of dX launched; dW = dYᵀ·X; wait. Exposed:
  max(0, T_AG − T_x) + max(0, T_RS − T_w).

A row-parallel linear's backward has no collective of its own; with sequence parallelism its
output gradient is first all-gathered (the conjugate of the forward's reduce-scatter,
``_ReduceScatterToSequenceParallelRegion``), exposed. So a block (attention, MLP) whose input
projections' input-gradient and weight-gradient GEMMs take T_x and T_w exposes

    sequence parallel:  T_AG + max(0, T_AG − T_x) + max(0, T_RS − T_w)   of 2·T_AG + T_RS moved
    otherwise:          max(0, T_AR − T_w)                               of T_AR moved

where the stacks without the overlap expose T_AG + T_RS (sequence parallel) or T_AR: they keep
the gathered input for the backward, or meet each collective where autograd does.

Measured: Korthikanti et al. 2022 (arXiv 2205.05198), Table 4 and Sec. 6.2, one layer of their 22B
model at TP 8 on A100: backward 11.9 ms against a forward of 7.7 ms without recompute, and full
recompute's 39 % overhead "as opposed to the expected 33 %" is "due to an optimization in the
backward pass where we overlap all-reduce communication with the linear weight's gradient
computation". Symbols: T_AR, T_AG, T_RS one all-reduce, all-gather, reduce-scatter of an n·h·e
activation over the TP group (:func:`meshplan.cost.comm.tp_collective_time`); T_x, T_w
(:func:`meshplan.cost.compute.input_projection_backward`).
"""

from __future__ import annotations


def block_backward_tp(sp: bool, all_gather: float, reduce_scatter: float, all_reduce: float, dgrad: float,
                      wgrad: float) -> tuple[float, float]:
    """(exposed, moved) seconds of one block's backward TP collectives under the overlapped
    backward (module docstring): ``sp`` sequence parallelism; one all-gather, reduce-scatter and
    all-reduce of the block's n·h·e activation; ``dgrad``, ``wgrad`` the block's input
    projections' input-gradient and weight-gradient GEMMs."""
    if sp:
        exposed = all_gather + max(0.0, all_gather - dgrad) + max(0.0, reduce_scatter - wgrad)
        return exposed, 2 * all_gather + reduce_scatter
    return max(0.0, all_reduce - wgrad), all_reduce
