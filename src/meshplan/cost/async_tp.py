"""torch's micro-pipelined tensor parallelism ("AsyncTP"): which TP collectives of a layer it
hides, and what the hiding costs.

meshplan has two kinds of TP communication overlap (``TrainingPlan.tp_overlap_kind``):

* ``userbuffers`` — Megatron-LM ``--tp-comm-overlap`` / Transformer Engine userbuffers: every
  all-gather and reduce-scatter of the layer, forward and backward, runs behind the GEMMs
  (:func:`meshplan.cost.compose.layer_times`);
* ``micro-pipeline`` — torch's 2024 AsyncTP (torchtitan ``enable_async_tensor_parallel``): an
  Inductor pass (``torch/_inductor/fx_passes/micro_pipeline_tp.py``) rewrites two graph
  patterns into ops of ``torch/distributed/_symmetric_memory/__init__.py``, and only those.

What the pass fuses in a Llama block with sequence parallelism (torchtitan's plan: the attention
and MLP inputs all-gathered by ``PrepareModuleInput``, wq/wk/wv and w1/w3 column-parallel, wo and
w2 row-parallel with a reduce-scatter output), per compiled block graph:

* all-gather → matmuls that take the gathered tensor as their A operand
  (``fuse_all_gather_matmul``): forward, the attention input with wq, wk, wv and the MLP input
  with w1, w3; backward, the gathered output gradients of wo and w2 with their input-gradient
  GEMMs (the weight-gradient GEMMs take the transpose, not a consumer matmul);
* matmul → reduce-scatter when the matmul result has that single user
  (``fuse_matmul_reduce_scatter``: "if len(input_node.users) != 1: return"): forward, wo and w2;
* not fused: the backward reduce-scatters of the attention and MLP input gradients, whose input
  is the sum of the q, k, v (or w1, w3) input-gradient GEMMs, an ``add``, not a matmul
  (``_find_producer_matmul`` returns None);
* full activation checkpointing recomputes the forward inside the backward graph, where the same
  patterns fuse again;
* torchtitan does not set Inductor's ``reorder_for_compute_comm_overlap``, so the pass's
  exclusion of collectives "hidden by simple overlapping" does not apply.

Cost of a fused op over t ranks (``_pipelined_all_gather_and_consume``,
``_pipelined_produce_and_all2all``): the GEMM runs as t GEMMs of m/t rows on two alternating
streams while the shards move peer to peer. With C the collective's time and G the t chunk
GEMMs (``t · gemm(m/t, n, k)``), chunk k's GEMM waits for chunk k's transfer, and the local
chunk (computed first for an all-gather, last for a reduce-scatter) covers one transfer, so the
op ends after max(t·G/t, (t − 1)·C/(t − 1) + G/t): exposed = max(C − (t − 1)/t · G, 0). The
decomposition itself costs ``t · gemm(m/t, n, k) − gemm(m, n, k)`` (smaller tiles, t kernel
launches), and a fused reduce-scatter ends with a memory-bound sum of the t partial chunks it
received (``reduce_fn(stacked_partials)``: read n·h·e, write n·h·e/t), after the pipeline.
Unfused collectives are exposed whole. Without sequence parallelism the layer's TP traffic is
all-reduces, which the pass does not touch.
"""

from __future__ import annotations

from meshplan.cost import collectives as coll
from meshplan.cost.calibration import Calibration
from meshplan.cost.collectives import GroupPlacement
from meshplan.cost.comm import tp_collective_time
from meshplan.cost.compute import dense_gemm_shapes, gemm_time, memory_time
from meshplan.cost.step import exposed
from meshplan.specs.hardware import ClusterSpec, GPUSpec
from meshplan.specs.model import ModelSpec


def fused_exposed(comm: float, gemm_m: float, gemm_n: float, gemm_k: float, tp: int, gpu: GPUSpec, cal: Calibration,
                  peak: float, e: int) -> float:
    """Seconds a fused collective + GEMM adds to the step beyond the unsplit GEMM (module
    docstring): max(C − (t − 1)/t · G_t, 0) + (G_t − G_1), with G_t = t · gemm(m/t, n, k) and
    G_1 = gemm(m, n, k) (:func:`meshplan.cost.compute.gemm_time`)."""
    whole = float(gemm_time(gemm_m, gemm_n, gemm_k, gpu, cal, peak, e))
    chunks = tp * float(gemm_time(gemm_m / tp, gemm_n, gemm_k, gpu, cal, peak, e))
    return exposed(comm, chunks * (tp - 1) / tp) + (chunks - whole)


def micro_pipeline_tp_times(
    model: ModelSpec,
    tokens: float,
    tp: int,
    sp: bool,
    pl_tp: GroupPlacement,
    cluster: ClusterSpec,
    cal: Calibration,
    compute_dtype: str,
    e: int,
) -> tuple[float, float]:
    """Exposed TP seconds of one layer and micro-batch under torch's micro-pipelined TP:
    (forward, backward without the recompute), n = ``tokens`` per GPU, over the TP group
    ``pl_tp``.

    With sequence parallelism (module docstring), AG and RS one all-gather and one reduce-scatter
    of the n·h·e activation, F(C, m, n, k) = :func:`fused_exposed` and R = (1 + 1/t)·n·h·e /
    (W·η_hbm) the partial-sum reduction:

    * forward = F(AG, QKV) + F(RS, wo) + R + F(AG, MLP in) + F(RS, MLP out) + R;
    * backward = F(AG, wo input gradient) + F(AG, MLP-out input gradient) + 2·RS (unfused).

    Without it the two all-reduces each way stay exposed: 2·AR forward and backward
    (:func:`meshplan.cost.comm.tp_collective_time`).

    The patterns are those of a Llama block; meshplan does not claim them for other blocks, whose
    collectives it leaves exposed whole (AG + RS each way): the attention half of an MLA layer
    (DeepSeek's low-rank Q/KV projections and their norms sit between the gather and the matmuls)
    and the MLP half of every layer of an MoE model (routing, permutation and the expert
    all-to-all sit between them)."""
    if pl_tp.size <= 1:
        return 0.0, 0.0
    if not sp:
        one = tp_collective_time(tokens * model.hidden * e, False, pl_tp, cluster, cal)
        return 2 * one, 2 * one
    gpu = cluster.gpu
    msg = tokens * model.hidden * e
    all_gather = coll.collective_time("all_gather", msg, pl_tp, cluster, cal)
    reduce_scatter = coll.collective_time("reduce_scatter", msg, pl_tp, cluster, cal)
    peak = gpu.peak(compute_dtype)
    qkv, out, mlp_in, mlp_out = dense_gemm_shapes(model, tokens, tp)
    reduce = memory_time((1 + 1 / tp) * msg, gpu, cal)

    def fused(comm: float, shape: tuple[float, float, float]) -> float:
        return fused_exposed(comm, *shape, tp, gpu, cal, peak, e)

    unfused = all_gather + reduce_scatter
    # input-gradient GEMMs (m, k, n) of the row-parallel projections consume the gathered gradient
    if model.is_mla:
        fwd_attn = bwd_attn = unfused
    else:
        fwd_attn = fused(all_gather, qkv) + fused(reduce_scatter, out) + reduce
        bwd_attn = fused(all_gather, (out[0], out[2], out[1])) + reduce_scatter
    if model.is_moe:
        fwd_mlp = bwd_mlp = unfused
    else:
        fwd_mlp = fused(all_gather, mlp_in) + fused(reduce_scatter, mlp_out) + reduce
        bwd_mlp = fused(all_gather, (mlp_out[0], mlp_out[2], mlp_out[1])) + reduce_scatter
    return fwd_attn + fwd_mlp, bwd_attn + bwd_mlp
