"""How each micro-batch's weight gradients join the step's: the stack's ``grad_accumulation``.

A step of m micro-batches produces m gradients of every weight, and the optimizer needs their sum.
Where the sum is made decides whether it costs a pass over the gradients of its own:

==========  ===============================================  ======================  ===========
kind        where the sum is made                             bytes per parameter     share of
                                                              per pass                micro-batches
==========  ===============================================  ======================  ===========
fused       in the weight-gradient GEMM's epilogue, into the  0                       —
            fp32 buffer (C = A·B + C)
buffer      a hook adds the fresh gradient into the           w + 2·g                 1
            contiguous ``main_grad`` buffer, then frees it
autograd    ``AccumulateGrad`` adds each later gradient into  3·w                     (m − 1)/m
            ``.grad`` in place (the first one becomes it)
fsdp2       FSDP2 adds each later gradient into its           w + 2·g                 (m − 1 + φ)/m
            unsharded accumulator in the reduce dtype; the    (the first: w + g)      φ = (w + g)/(w + 2·g)
            first is copied up into it
==========  ===============================================  ======================  ===========

w: bytes of a weight as the GEMMs use it (the gradient autograd produces has its dtype); g: bytes
of the gradient buffer (the recipe's gradient dtype). A pass reads the fresh gradient and the
accumulator and writes the accumulator, one memory-bound kernel per parameter tensor
(:func:`meshplan.cost.kernel_time.memory_time` over the layer's parameters on a rank), on the
compute stream inside the backward, so each micro-batch's backward is longer by share × pass.

Sources, per kind:

* ``fused``: Megatron-LM's ``gradient_accumulation_fusion`` (83b1e42, 2022-02-13; on unless
  ``--no-gradient-accumulation-fusion``): ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32``
  accumulates into ``main_grad``; Megatron-Core and Transformer Engine's ``fuse_wgrad_accumulation``
  alike. The epilogue's read of the fp32 accumulator is left inside the GEMM's time.
* ``buffer``: Megatron-LM v2.x's local ``DistributedDataParallel`` with contiguous buffers (its
  default, ``--no-contiguous-buffers-in-local-ddp`` to turn off): ``_make_param_hook`` runs
  ``param.main_grad.add_(param.grad.data)`` and ``param.grad = None`` after each parameter's
  gradient of every micro-batch (``megatron/model/distributed.py@v2.6``).
* ``autograd``: torch's ``AccumulateGrad`` node: the first gradient is stolen into ``.grad``, each
  later one added in place (``torch/csrc/autograd/functions/accumulate_grad.h``, ``variable_grad
  += new_grad``). DeepSpeed's pipeline engine runs ``torch.autograd.backward`` per micro-batch and
  its fp16/ZeRO-1 optimizers read ``.grad`` after the last; torch's DDP under ``no_sync`` and
  torch.distributed.pipelining alike.

* ``fsdp2``: not a value of the field but what torch's FSDP2 runs where it keeps the gradients
  unsharded through the step (``fsdp_accumulate_unsharded``: torch.distributed.pipelining with
  FSDP2, which turns the gradient sync off until the last micro-batch). After each micro-batch's
  backward, ``FSDPParamGroup.post_backward`` calls ``accumulate_unsharded_grad_if_needed``
  (``unsharded_accumulated_grad += unsharded_param.grad``, then the gradient freed) and
  ``to_accumulated_grad_if_needed``, which on the first micro-batch copies the w-byte gradient up
  into a g-byte accumulator when the reduce dtype differs (``unsharded_grad.to(self.reduce_dtype)``:
  torchtitan's ``mixed_precision_reduce = "float32"`` under bf16 parameters)
  (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``, ``_fsdp_param_group.py``). With the
  reduce dtype the parameters' own, it returns early and autograd accumulates in ``.grad``: the
  ``autograd`` kind (:func:`accumulation_kind`).

The stack's rule applies ``grad_accumulation`` where the gradients are held whole through the step
(ZeRO 0 or 1, or a shard group of one); ZeRO-2 and FSDP reduce-scatter each micro-batch's
gradients and accumulate a 1/d shard, not charged, except FSDP2 holding them unsharded (above).
"""

from __future__ import annotations

from typing import Any

#: the kinds of ``Stack.grad_accumulation``
GRAD_ACCUMULATION_KINDS = ("fused", "buffer", "autograd")


#: the kinds whose passes per micro-batch depend on the step's micro-batches m
BATCH_DEPENDENT_KINDS = ("autograd", "fsdp2")

#: φ: the first micro-batch's fraction of a pass (module table); FSDP2's is (w + g)/(w + 2·g)
_FIRST_PASS = {"buffer": 1.0, "autograd": 0.0}


def accumulation_kind(stack: Any, weight_bytes: int, grad_bytes: int) -> str:
    """The accumulation a plan's step runs: torch's FSDP2's own where it holds the gradients
    unsharded through the step (``fsdp_accumulate_unsharded`` on the compiled or eager kernels,
    as the stack applies to the plan), ``fsdp2`` into a wider reduce dtype, ``autograd`` into the
    parameters' own; else the stack's ``grad_accumulation``."""
    if stack.fsdp_accumulate_unsharded and stack.kernels != "fused":
        return "fsdp2" if grad_bytes != weight_bytes else "autograd"
    return stack.grad_accumulation


def grad_accumulation_bytes(kind: str, weight_bytes: int, grad_bytes: int) -> int:
    """HBM bytes per parameter of one accumulation pass of ``kind`` (module table): 0 fused,
    w + 2·g for Megatron-LM v2.x's ``main_grad`` buffer and FSDP2's accumulator, 3·w for
    autograd's in-place add."""
    if kind not in GRAD_ACCUMULATION_KINDS + ("fsdp2",):
        raise ValueError(f"grad_accumulation must be one of {', '.join(GRAD_ACCUMULATION_KINDS)}, not {kind!r}")
    return {"fused": 0, "buffer": weight_bytes + 2 * grad_bytes, "fsdp2": weight_bytes + 2 * grad_bytes,
            "autograd": 3 * weight_bytes}[kind]


def grad_accumulation_share(kind: str, microbatches: Any, weight_bytes: int, grad_bytes: int) -> Any:
    """The passes per micro-batch of a step's ``microbatches`` (m; a number or an array over plans):
    (m − 1 + φ)/m, φ the first micro-batch's fraction of a pass: 1 for the buffer (every one), 0
    for autograd (all but the first), (w + g)/(w + 2·g) for FSDP2's first copy up into its
    accumulator (``weight_bytes`` w, ``grad_bytes`` g); none when fused."""
    if kind == "fused":
        return 0 * microbatches
    if kind == "fsdp2":
        first = (weight_bytes + grad_bytes) / (weight_bytes + 2 * grad_bytes)
    elif kind in _FIRST_PASS:
        first = _FIRST_PASS[kind]
    else:
        raise ValueError(f"no accumulation kind {kind!r} (fused, buffer, autograd, fsdp2)")
    return (microbatches - 1 + first) / microbatches
