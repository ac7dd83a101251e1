"""Time of the optimizer step: the bytes it moves per parameter a GPU owns, on the fused stack
(one fused kernel) or torch's multi-tensor step, over the HBM bandwidth.
"""

from __future__ import annotations

from meshplan.cost.calibration import Calibration
from meshplan.specs.hardware import GPUSpec


def optimizer_step_bytes(recipe, kernels: str = "fused") -> int:
    """Bytes one optimizer step moves per parameter it owns, on the plan's software stack.

    * ``fused`` (Megatron, Transformer Engine): one fused kernel,
      ``recipe.optimizer_step_bytes`` (30 for bf16 weights, fp32 gradients, master and Adam).
    * ``compiled``/``eager`` (torch; torchtitan builds AdamW with ``foreach = not fused`` and
      ``fused`` off by default): torch's multi-tensor step, one pass per ``_foreach`` op over the
      fp32 parameter p (the master copy, or the weights when there is none), each moment s and
      the gradient γ (``torch/optim/adam.py``, ``_multi_tensor_adam``, decoupled weight decay):
      ``mul_`` of p by 1 − lr·λ (2p), ``lerp_`` of m to g (2s + γ), ``mul_`` of v by β₂ (2s),
      ``addcmul_`` of g·g into v (2s + γ), ``sqrt`` of v into a new d (2s), ``div_`` and ``add_``
      of d (2s each), ``addcdiv_`` of m/d into p (2p + 2s): 4p + 14s + 2γ; SGD with momentum
      (``_multi_tensor_sgd``: ``mul_`` and ``add_`` of the buffer, ``add_`` into p) 2p + 5s + γ.
      Before it ``clip_grad_norm_`` (torchtitan's ``max_norm``, foreach): the gradients' norms
      read and the gradients scaled in place, 3γ. torchtitan's recipe (fp32 parameters, moments
      and gradients): 16 + 56 + 8 + 12 = 92 bytes.
    """
    if kernels == "fused":
        return recipe.optimizer_step_bytes
    p = recipe.master_bytes or recipe.weight_bytes
    g = recipe.grad_bytes + recipe.grad_copy_bytes
    if recipe.optimizer == "adam":
        s = recipe.state_bytes // 2
        step = 4 * p + 14 * s + 2 * g
    else:
        step = 2 * p + 5 * recipe.state_bytes + g
    return step + 3 * g


def optimizer_step_time(local_params: float, recipe, gpu: GPUSpec, cal: Calibration, kernels: str = "fused") -> float:
    """The optimizer step over the parameters this GPU owns: memory-bound,
    ``params × optimizer_step_bytes(recipe, kernels) / (W·η_hbm)``."""
    return local_params * optimizer_step_bytes(recipe, kernels) / (gpu.hbm_bandwidth * cal.hbm_efficiency)
