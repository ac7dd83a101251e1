"""The memory passes of torchao's Float8 training beside its GEMMs (torchtitan's FP8 linears), per
micro-batch, for the ``compiled`` and ``eager`` stacks; the ``fused`` stack (Transformer Engine,
cast and transpose in one kernel) keeps :func:`meshplan.cost.compute.fp8_cast_bytes`.

torchao's recipe as torchtitan runs it (``torchao/float8/float8_linear.py`` of late 2024,
tensorwise dynamic scaling, the ``Float8LinearConfig`` defaults): ``Float8Linear.forward`` casts
the input (``cast_input_to_float8``) and the weight (``cast_weight_to_float8_t``) to Float8Tensors
and ``manual_float8_matmul_with_args_in_float8`` saves both for the backward; the output
gradient is cast in the backward (``NoopFwToFloat8E5M2BwDynamic``). Each of the three tensors of a
linear's three GEMMs is cast once, by these passes (e-byte source, 1-byte FP8):

* **amax** — ``tensor_to_amax``: ``torch.max(torch.abs(x))``, a two-stage reduction that reads
  the tensor, ``e`` bytes per element, in two kernels (the scale, ``amax_to_scale``, is computed
  in the second);
* **cast** — ``hp_tensor_and_scale_to_float8``: ``x · scale``, clamped, converted: read ``e``,
  write ``1``, one kernel;
* **column-major copy** — ``torch._scaled_mm`` on Hopper takes A row-major and B column-major
  (``torchao/float8/float8_ops.py``, ``preprocess_addmm``: ``a_data.contiguous()`` when A is not
  row-major, ``b_data.t().contiguous().t()`` when B is row-major). The forward GEMM
  ``input · weightᵀ`` needs none; the input-gradient GEMM ``grad · weight`` takes the weight as a
  row-major B, the weight-gradient GEMM ``gradᵀ · input`` the gradient as a column-major A and the
  input as a row-major B: one FP8 copy of each tensor, read ``1``, write ``1``, one kernel
  (pytorch/pytorch#130015: ``fp8.t().contiguous().t()`` "is used in every float8 linear").
  The copies serve only the backward GEMMs. Under activation checkpointing (every torchtitan
  row) the first forward of a block keeps nothing, so they are made once, from the recomputed
  forward or in the backward; meshplan charges them to the backward, and full recompute does not
  repeat them.

So each tensor costs ``2e + 3`` bytes per element and four kernels. torchao's own roofline
(``torchao/float8/roofline_utils.py``) lists the same amax and cast kernels and, as a best case,
lets the input's and the gradient's amax fuse into the kernels that produce them; in a Llama
block several producers are extern kernels Inductor cannot fuse into (SDPA's output feeds wo,
the GEMMs' input gradients feed the previous linears), and which of the others (norm, SwiGLU)
fuse was not settled from source, so meshplan charges the amax read for every tensor.
For a GEMM (M, N, K) — input M·K, weight K·N, output gradient M·N elements:

    bytes_fwd = (2e + 1)·(M·K + K·N),   bytes_bwd = (2e + 3)·M·N + 2·(M·K + K·N)

``fp8_cast_bytes``'s count plus the output gradient's column-major copy, ``2·M·N``, the pass that
model lacks.
A Llama layer's wq, wk, wv (and w1, w3) share one input: AOTAutograd de-duplicates identical
nodes of the joint graph (functorch's ``cse``), so the fused shapes of
:func:`meshplan.cost.compute.dense_gemm_shapes` count that input once and the weights and
gradients in full.

**Op-level selective checkpointing** (torchtitan's ``_save_list``: ``aten.mm`` — every second —,
the SDPA kernels, ``reduce_scatter_tensor`` and ``aten.max``, "the absolute maximum is used to
compute the scaling factor") keeps the amax but not the FP8 tensors, which are recomputed for the
backward GEMMs: the cast of every input and weight again,

    bytes_recompute = (e + 1)·(M·K + K·N)

one kernel per tensor. Full checkpointing recomputes the whole forward, casts included.

torchao's releases of 2025 on (``matmul_with_hp_or_float8_args``) save the 16-bit input and
weight instead and cast them again in the backward, with the output gradient cast once for each
backward GEMM (in eager torchao 0.18, four amax reductions per linear in the backward:
``tests/test_fsdp_fp8_gather.py``); these passes keep the late-2024 design (docs/accuracy.md,
what is not modelled).

**FP8 all-gather** (``fsdp_fp8_all_gather``, :mod:`meshplan.cost.fsdp_copies`): FSDP2 hands the
forward an already-cast weight (``cast_weight_to_float8_t`` returns a weight that
``tensor_already_casted_to_fp8``), cast on the shard before the all-gather, on FSDP2's copy-in
stream, off the compute stream. The weight's amax and cast leave the forward and the recompute; its column-major copy for
the input-gradient GEMM stays:

    bytes_fwd = (2e + 1)·M·K,   bytes_recompute = (e + 1)·M·K

with one cast (three kernels) per GEMM forward and one recomputed.

**Row-wise scaling** (``fp8_scaling``: torchao's ``rowwise`` and ``rowwise_with_gw_hp`` recipes,
``Float8LinearConfig.from_recipe_name``; torchtitan 0.3.0's ``Float8LinearConverter`` offers these
two only, ``rowwise`` by default). Each operand gets one scale per row along its GEMM's reduction axis
(``ScalingGranularity.AXISWISE``): ``torch.amax(torch.abs(x), dim)``, one read of ``e`` bytes
per element, then the cast, read ``e`` and write ``1`` — ``2e + 1`` bytes, two kernels. A scale
along one axis cannot serve the other, so ``matmul_with_hp_or_float8_args`` saves the 16-bit
input and weight and casts every operand of every GEMM from them
(``torchao/float8/float8_linear.py``):

* forward ``X·Wᵀ``: X along K, W along K;
* input gradient ``G·W``: G along N, W along N;
* weight gradient ``Gᵀ·X``: G along M, X along M;

six casts per linear, with the same three column-major copies as above
(``preprocess_addmm``). The two backward GEMMs run without fast accumulation, for which
torchao calls the tensorwise cuBLAS kernel with unit scales and multiplies the output by the
outer product of the scales afterwards ("The rowwise CUTLASS-based kernel is so slow without
fast-accum that we'd rather use the tensorwise cuBLAS-based kernel and do the scaling manually
afterwards", ``float8_ops.py``, ``addmm_float8_unwrapped``; pytorch/ao#1377): one more pass over
each output, read and write ``e`` bytes. So, eager,

    bytes_fwd = (2e + 1)·(M·K + K·N)
    bytes_bwd = (2e + 1)·(2·M·N + M·K + K·N) + 2·(M·N + M·K + K·N) + 2e·(M·K + K·N)

Compiled, Inductor folds the input gradient's scaling into the kernel that reads it next (the sum
of the q/k/v or gate/up input gradients, SwiGLU's and the norm's backward; wo's, read by the
attention backward, is the one exception, left uncharged), and the ``2e·M·K`` term goes; the
weight gradient leaves the compiled block as its output and keeps its pass.
``rowwise_with_gw_hp`` keeps the weight-gradient GEMM in 16 bits (``ScalingType.DISABLED`` for
both its operands) and casts the weight for the input gradient per tensor (three kernels):

    bytes_bwd = (2e + 1)·(M·N + K·N) + 2·K·N (+ 2e·M·K eager)

The forward GEMM with row-wise scales and fast accumulation is ``_scaled_mm``'s row-wise kernel
(CUTLASS ``f8f8bf16_rowwise``; cuBLASLt's outer-vector scaling from cuBLAS 12.9,
pytorch/pytorch#157905, which found the two "perform very closely"); measured GEMM alone at
"90-100 % of tensor-wise efficiency" for most shapes (pytorch/pytorch#147971): meshplan times it
at the tensorwise FP8 rate, and the 16-bit weight-gradient GEMM of ``rowwise_with_gw_hp`` at the
16-bit rate. Op-level checkpointing saves ``aten.max``, the tensorwise amax, not ``aten.amax``:
its recompute repeats the row-wise casts whole, ``(2e + 1)·(M·K + K·N)``. FSDP2 gathers the
weights of row-wise recipes in 16 bits (torchao's ``enable_fsdp_float8_all_gather`` "only
supports tensorwise scaling granularity"), and torchtitan's tensor parallelism gathers their
activations in 16 bits too.
"""

from __future__ import annotations

from dataclasses import dataclass

#: kernels per cast: amax in two stages, the cast (the column-major copy is one more)
CAST_KERNELS = 3
#: kernels per row-wise cast: the amax along one axis, the cast
AXISWISE_CAST_KERNELS = 2


@dataclass(frozen=True)
class Float8Passes:
    """Bytes and kernels of the scaling passes of one micro-batch through some GEMMs."""

    fwd_bytes: float
    bwd_bytes: float
    recompute_bytes: float  # what op-level checkpointing repeats in the backward
    fwd_kernels: int
    bwd_kernels: int
    recompute_kernels: int


def weight_grad_16bit(compute_dtype: str, scaling: str) -> bool:
    """Whether an FP8 layer runs its weight-gradient GEMMs in 16 bits: ``rowwise_with_gw_hp``
    (``ScalingType.DISABLED`` for both operands of that GEMM, module docstring)."""
    return compute_dtype == "fp8" and scaling == "rowwise_with_gw_hp"


def torchao_float8_passes(gemms: list[tuple[float, float, float]], e: int, weights_in_fp8: bool = False,
                          scaling: str = "tensorwise", compiled: bool = True) -> Float8Passes:
    """The passes of the module docstring for GEMMs (M, N, K) with ``e``-byte operands;
    ``weights_in_fp8``: the weights arrive cast (FSDP2's FP8 all-gather, tensorwise only);
    ``scaling``: the recipe, ``tensorwise``, ``rowwise`` or ``rowwise_with_gw_hp``; ``compiled``:
    Inductor folds the row-wise input gradients' scaling into their readers."""
    if scaling != "tensorwise":
        if weights_in_fp8:
            raise ValueError(f"FSDP2 gathers {scaling} weights in 16 bits, not in FP8")
        return _rowwise_passes(gemms, e, weight_grad_16bit("fp8", scaling), not compiled)
    cast, copy = 2 * e + 1, 2  # amax read + cast read and write; FP8 read and write
    inputs = sum(M * K for M, _, K in gemms)
    operands = sum(M * K + K * N for M, N, K in gemms)
    cast_operands = inputs if weights_in_fp8 else operands
    grads = sum(M * N for M, N, _ in gemms)
    g = len(gemms)
    casts = 1 if weights_in_fp8 else 2  # per GEMM forward: the input, and the weight unless gathered cast
    return Float8Passes(
        fwd_bytes=cast * cast_operands,
        bwd_bytes=(cast + copy) * grads + copy * operands,
        recompute_bytes=(e + 1) * cast_operands,
        fwd_kernels=casts * g * CAST_KERNELS,
        bwd_kernels=g * (CAST_KERNELS + 1) + 2 * g,  # the gradient, then three copies
        recompute_kernels=casts * g,  # the casts (amax saved)
    )


def _rowwise_passes(gemms: list[tuple[float, float, float]], e: int, weight_grad_16bit: bool,
                    input_grad_pass: bool) -> Float8Passes:
    """Row-wise scaling's passes (module docstring): six casts per GEMM, or four with the
    weight-gradient GEMM in 16 bits (``weight_grad_16bit``, ``rowwise_with_gw_hp``);
    ``input_grad_pass``: the input gradient's scaling is a pass of its own (eager)."""
    cast, copy, rescale = 2 * e + 1, 2, 2 * e  # amax + cast; FP8 copy; an output's scaling pass
    X = sum(M * K for M, _, K in gemms)
    W = sum(K * N for _, N, K in gemms)
    G = sum(M * N for M, N, _ in gemms)
    g = len(gemms)
    rescaled = X if input_grad_pass else 0.0
    if weight_grad_16bit:  # G along N, W per tensor, W's copy
        bwd_bytes = cast * (G + W) + copy * W + rescale * rescaled
        bwd_kernels = g * (AXISWISE_CAST_KERNELS + CAST_KERNELS + 1 + input_grad_pass)
    else:  # G along N and M, W along N, X along M; three copies; the weight gradient's scaling
        bwd_bytes = cast * (2 * G + W + X) + copy * (G + X + W) + rescale * (W + rescaled)
        bwd_kernels = g * (4 * AXISWISE_CAST_KERNELS + 3 + 1 + input_grad_pass)
    return Float8Passes(
        fwd_bytes=cast * (X + W),
        bwd_bytes=bwd_bytes,
        recompute_bytes=cast * (X + W),
        fwd_kernels=2 * g * AXISWISE_CAST_KERNELS,
        bwd_kernels=bwd_kernels,
        recompute_kernels=2 * g * AXISWISE_CAST_KERNELS,
    )
