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
``_pipelined_produce_and_all2all``): the GEMM runs as t GEMMs of M/t rows on two alternating
streams while the shards move peer to peer. With C the collective's time and G the t chunk
GEMMs (``t · gemm(M/t, N, K)``), chunk i's GEMM waits for chunk i's transfer, and the local
chunk (computed first for an all-gather, last for a reduce-scatter) covers one transfer, so the
op ends after max(t·G/t, (t − 1)·C/(t − 1) + G/t): exposed = max(C − (t − 1)/t · G, 0). The
decomposition itself costs ``t · gemm(M/t, N, K) − gemm(M, N, K)`` (smaller tiles, t kernel
launches), and a fused reduce-scatter ends with a memory-bound sum of the t partial chunks it
received (``reduce_fn(stacked_partials)``: read n·h·e, write n·h·e/t), after the pipeline.
Unfused collectives are exposed whole. Without sequence parallelism the layer's TP traffic is
all-reduces, which the pass does not touch.
"""

from __future__ import annotations

from meshplan.cost import collectives as coll
from meshplan.cost.calibration import Calibration, gemm_calibration
from meshplan.cost.collectives import GroupPlacement
from meshplan.cost.comm import tp_collective_time
from meshplan.cost.compute import INPUT_PROJECTIONS, MLP_GEMM_NAMES, projection_gemms
from meshplan.cost.kernel_time import gemm_operand_bytes, gemm_time, memory_time
from meshplan.cost.step import exposed
from meshplan.specs.hardware import ClusterSpec, GPUSpec
from meshplan.specs.model import ModelSpec


def fused_exposed(comm: float, gemms: list[tuple[float, float, float]], tp: int, gpu: GPUSpec, cal: Calibration,
                  peak: float, e: int, operand_bytes: int | None = None) -> float:
    """Seconds a fused collective + GEMMs adds to the step beyond the unsplit GEMMs (module
    docstring): max(C − (t − 1)/t · G_t, 0) + (G_t − G_1), with G_t = Σ t · gemm(M/t, N, K) and
    G_1 = Σ gemm(M, N, K) (:func:`meshplan.cost.kernel_time.gemm_time`) over the GEMMs (M, N, K) that
    consume the gathered tensor, or the one that produces the scattered one; every chunk of an
    all-gather feeds all its consumers (``_fused_all_gather_matmul`` takes a list of B operands).
    ``e`` is the output's bytes per element, ``operand_bytes`` the operands' (``e`` unless given)."""
    ge = e if operand_bytes is None else operand_bytes
    whole = sum(float(gemm_time(M, N, K, gpu, cal, peak, ge, e)) for M, N, K in gemms)
    chunks = sum(tp * float(gemm_time(M / tp, N, K, gpu, cal, peak, ge, e)) for M, N, K in gemms)
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
    kernels: str = "fused",
) -> tuple[float, float]:
    """Exposed TP seconds of one layer and micro-batch under torch's micro-pipelined TP:
    (forward, backward without the recompute), n = ``tokens`` per GPU, over the TP group
    ``pl_tp``.

    With sequence parallelism (module docstring), AG and RS one all-gather and one reduce-scatter
    of the n·h·e activation, F(C, GEMMs) = :func:`fused_exposed` and R = (1 + 1/t)·n·h·e /
    (W·η_hbm) the partial-sum reduction, the GEMMs as the ``kernels`` stack launches them
    (:func:`meshplan.cost.compute.projection_gemms`: QKV, or q, k and v; gate|up, or gate and up):

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
    gemms = projection_gemms(model, tokens, tp, kernels)
    # the column-parallel GEMMs that consume a gathered input, the row-parallel one that produces
    # a scattered output, of the attention (False) and of the MLP (True)
    inputs = {mlp: [g for nm, g in gemms if nm in INPUT_PROJECTIONS and (nm in MLP_GEMM_NAMES) == mlp] for mlp in (False, True)}
    outputs = {mlp: [g for nm, g in gemms if nm not in INPUT_PROJECTIONS and (nm in MLP_GEMM_NAMES) == mlp][-1:] for mlp in (False, True)}
    reduce = memory_time((1 + 1 / tp) * msg, gpu, cal)

    def fused(comm: float, shapes: list[tuple[float, float, float]]) -> float:
        return fused_exposed(comm, shapes, tp, gpu, gemm_calibration(cal, compute_dtype), peak, e, gemm_operand_bytes(compute_dtype, e))

    def half(mlp: bool) -> tuple[float, float]:
        out = outputs[mlp][0]
        # the input-gradient GEMM (M, K, N) of the row-parallel projection consumes the gathered gradient
        return (fused(all_gather, inputs[mlp]) + fused(reduce_scatter, [out]) + reduce,
                fused(all_gather, [(out[0], out[2], out[1])]) + reduce_scatter)

    unfused = all_gather + reduce_scatter
    fwd_attn, bwd_attn = (unfused, unfused) if model.is_mla else half(False)
    fwd_mlp, bwd_mlp = (unfused, unfused) if model.is_moe else half(True)
    return fwd_attn + fwd_mlp, bwd_attn + bwd_mlp
