"""FSDP2's copies on the compute stream: the all-gather copy-out and the reduce-scatter copy-in.

torch's FSDP2 (``fully_shard``), which the torch stacks (``kernels`` compiled or eager) run for
ZeRO-3, all-gathers a unit's shards into one flat buffer and does not compute on it: before the
unit runs it copies the buffer out into each parameter's unsharded tensor
(``FSDPParamGroup.wait_for_unshard`` → ``foreach_all_gather_copy_out``, one
``torch.ops.fsdp.split_with_sizes_copy`` on the current stream). After the unit's backward it
copies the unsharded gradients into one flat reduce-scatter input in the reduce dtype
(``foreach_reduce`` → ``foreach_reduce_scatter_copy_in``, one ``torch.ops.fsdp.chunk_cat``): on
the current stream since pytorch/pytorch#129721 (2024-06), which also moved the reduce-scatter
input into the compute stream's pool (where meshplan's ``grad_reduce_buckets`` count it; the
reduce-scatter stream's pool keeps only the sharded outputs, the gradients meshplan counts as
state), and before it on the reduce-scatter stream with the current stream waiting for it at once
("Only after the copy-in finishes can we free the gradients"). Either way both copies stand on the
compute stream's path, where no collective hides them. Megatron's and DeepSpeed's ZeRO-3 gather
into buffers their parameters are views of, and are not charged.

Per unit of P parameters on a rank (after TP), w weight bytes as gathered, γ gradient bytes as
reduced, each copy reading and writing (bytes moved):

=====================  =================  ==============================================
copy                   bytes              when
=====================  =================  ==============================================
copy-out               2·P·w              after every all-gather of the unit
copy-in, per layer     P·(w + γ)          every reduce-scatter: gradients in the
                                          parameters' dtype (w) into the reduce dtype (γ)
copy-in, once a step   2·P·γ              gradients accumulated unsharded in the reduce
                                          dtype (``fsdp_accumulate_unsharded``)
=====================  =================  ==============================================

each a memory-bound kernel (:func:`meshplan.cost.kernel_time.memory_time`). ``meshplan verify comm``
counts both ops of a real FSDP2 step on gloo and matches these bytes exactly
(``tests/test_verify_comm.py``).

**FP8 all-gather** (``fsdp_fp8_all_gather``; torchao's ``enable_fsdp_float8_all_gather``, which
torchtitan's ``float8`` section sets): the shards of a block's Float8Linear weights
(``WeightWithDynamicFloat8CastTensor``) are cast to FP8 before the all-gather
(``fsdp_pre_all_gather``, on FSDP2's all-gather copy-in stream, from the scale
``precompute_float8_dynamic_scale_for_fsdp`` computes once a step) and gathered as 1-byte
elements, and ``fsdp_post_all_gather`` wraps the gathered bytes as the Float8Tensor the forward
GEMM takes. So a layer unit gathers, copies out and holds

    P_l·w − P_lin·(w − 1)  bytes

(P_lin = :func:`meshplan.cost.params.linear_weights_per_rank`: the linear weights; norms and
biases stay w-byte), :func:`fp8_gather_saving` less than P_l·w. The embedding and the final norm +
LM head units are not Float8Linear (torchtitan filters ``output``) and gather w-byte. Gradients
are reduced as before.
"""

from __future__ import annotations

from meshplan.cost.allocator import all_gather_pool_bytes
from meshplan.cost.calibration import Calibration
from meshplan.cost.kernel_time import memory_time
from meshplan.cost.params import (
    embedding_params_per_rank, head_params_per_rank, largest_layer_params, layer_params_per_rank, linear_weights_per_rank,
)
from meshplan.specs.hardware import GPUSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import PrecisionRecipe


def runs_fsdp2(zero: int, kernels: str) -> bool:
    """Whether a plan's ZeRO-3 is torch's FSDP2: ZeRO-3 on a torch stack (``kernels`` compiled or
    eager); the fused (Megatron/Transformer Engine) stack's is not."""
    return zero == 3 and kernels != "fused"


def root_unit_applies(head_in_root, zero, pp):
    """Whether a plan of a search whose base sets ``fsdp_head_in_root`` runs FSDP2's 2024 root
    unit: those with ZeRO-3 and no pipeline (the rule :class:`meshplan.specs.plan.TrainingPlan`
    checks); elementwise over arrays of ``zero`` and ``pp``."""
    return head_in_root & (zero == 3) & (pp == 1)


def fp8_gather_saving(model: ModelSpec, tp: int, weight_bytes: int, fp8_gather: bool) -> int:
    """P_lin·(w − 1): the bytes one gathered dense layer saves when FSDP2 all-gathers its
    Float8Linear weights in FP8 (module docstring); 0 without ``fp8_gather``."""
    return linear_weights_per_rank(model, tp) * (weight_bytes - 1) if fp8_gather else 0


def copy_out_bytes(params: float, rec: PrecisionRecipe, saving: float = 0) -> float:
    """2·(P·w − S): the gathered buffer read and the unsharded parameters written (S: what FP8
    all-gather saves on these parameters, :func:`fp8_gather_saving` per layer)."""
    return 2 * (params * rec.weight_bytes - saving)


def copy_in_bytes(params: float, rec: PrecisionRecipe, accumulated: bool = False) -> float:
    """P·(w + γ) per micro-batch (gradients in the parameters' dtype, written in the reduce
    dtype), or 2·P·γ from gradients accumulated unsharded in the reduce dtype."""
    return params * (2 * rec.grad_bytes if accumulated else rec.weight_bytes + rec.grad_bytes)


def fsdp2_unit_copy_times(
    model: ModelSpec, tp: int, pp: int, rec: PrecisionRecipe, gpu: GPUSpec, cal: Calibration, moe: bool = False, ep: int = 1,
    fp8_gather: bool = False,
) -> tuple[float, float, float, float, float, float]:
    """Seconds of one copy-out and one copy-in per micro-batch of each FSDP unit, in the order of
    :func:`meshplan.cost.comm.fsdp_unit_times`: (layer copy-out, layer copy-in, embedding
    copy-out, embedding copy-in, head copy-out, head copy-in); with ``moe`` the layer is a
    mixture-of-experts layer holding E/ep experts (one copy each way for the whole layer); with
    ``fp8_gather`` a (dense) layer's Float8Linear weights are copied out as FP8 bytes."""
    layer = layer_params_per_rank(model, tp, moe=moe, ep=ep)
    saving = fp8_gather_saving(model, tp, rec.weight_bytes, fp8_gather)
    out: list[float] = []
    for p, s in ((layer, saving), (embedding_params_per_rank(model, tp), 0), (head_params_per_rank(model, tp, pp), 0)):
        out.append(memory_time(copy_out_bytes(p, rec, s), gpu, cal))
        out.append(memory_time(copy_in_bytes(p, rec), gpu, cal))
    return tuple(out)  # type: ignore[return-value]


def fsdp2_step_copy_times(params: float, units: int, rec: PrecisionRecipe, gpu: GPUSpec, cal: Calibration,
                          saving: float = 0) -> tuple[float, float]:
    """(copy-in, copy-out) seconds of a rank whose FSDP2 units (``units`` of them, ``params`` in
    all) keep weights gathered and gradients unsharded through the step: each unit copied out once
    before its first forward and its accumulated gradients copied in once after its last backward
    (``saving``: what FP8 all-gather saves on the rank's layers, :func:`fp8_gather_saving` each)."""
    overheads = (units - 1) * cal.kernel_overhead  # memory_time charges one kernel
    return (memory_time(copy_in_bytes(params, rec, accumulated=True), gpu, cal) + overheads,
            memory_time(copy_out_bytes(params, rec, saving), gpu, cal) + overheads)


def gather_pool_bytes(model: ModelSpec, tp: int, pp: int, stages: tuple[tuple[int, bool, bool], ...], weight_bytes: int,
                      head_in_root: bool = False, ep: int = 1, fp8_gather: bool = False) -> float:
    """The reserved pool of FSDP2's all-gather copy-in stream on one pipeline rank
    (:func:`meshplan.cost.allocator.all_gather_pool_bytes`) over its units in forward order:
    per stage it runs (``stages``: its layer count, whether it holds the embedding, whether the
    LM head), the embedding unit, one unit per layer, the final norm + LM head unit; with
    ``head_in_root`` (torchtitan's 2024 units) the root holding both, gathered first. Each unit is
    P_u·w bytes (``weight_bytes``: FSDP2 gathers in the compute dtype); a layer is the model's
    largest (the dense and mixture-of-experts layers of an MoE model alike, an upper bound), less
    :func:`fp8_gather_saving` with ``fp8_gather`` (dense models)."""
    layer = largest_layer_params(model, tp, ep)[0] * weight_bytes - fp8_gather_saving(model, tp, weight_bytes, fp8_gather)
    emb, head = embedding_params_per_rank(model, tp) * weight_bytes, head_params_per_rank(model, tp, pp) * weight_bytes
    units: list[float] = []
    for n_layers, first, last in stages:
        if head_in_root:
            units += [(emb if first else 0) + (head if last else 0)] + [layer] * n_layers
        else:
            units += ([emb] if first else []) + [layer] * n_layers + ([head] if last else [])
    return all_gather_pool_bytes(units)
