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
      fp32 parameter, w_p bytes (the master copy, or the weights when there is none), each
      moment, w_s bytes, and the gradient, γ bytes (``torch/optim/adam.py``,
      ``_multi_tensor_adam``, decoupled weight decay): ``mul_`` of the parameter by 1 − lr·λ
      (2w_p), ``lerp_`` of the first moment to the gradient (2w_s + γ), ``mul_`` of the second by
      β₂ (2w_s), ``addcmul_`` of the gradient's square into it (2w_s + γ), ``sqrt`` of it into a
      new denominator (2w_s), ``div_`` and ``add_`` of that (2w_s each), ``addcdiv_`` of their
      ratio into the parameter (2w_p + 2w_s): 4w_p + 14w_s + 2γ; SGD with momentum
      (``_multi_tensor_sgd``: ``mul_`` and ``add_`` of the buffer, ``add_`` into the parameter)
      2w_p + 5w_s + γ.
      Before it ``clip_grad_norm_`` (torchtitan's ``max_norm``, foreach): the gradients' norms
      read and the gradients scaled in place, 3γ. torchtitan's recipe (fp32 parameters, moments
      and gradients): 16 + 56 + 8 + 12 = 92 bytes.
    """
    if kernels == "fused":
        return recipe.optimizer_step_bytes
    w_p = recipe.master_bytes or recipe.weight_bytes
    g = recipe.grad_bytes + recipe.grad_copy_bytes
    if recipe.optimizer == "adam":
        w_s = recipe.state_bytes // 2
        step = 4 * w_p + 14 * w_s + 2 * g
    else:
        step = 2 * w_p + 5 * recipe.state_bytes + g
    return step + 3 * g


def optimizer_step_time(local_params: float, recipe, gpu: GPUSpec, cal: Calibration, kernels: str = "fused") -> float:
    """The optimizer step over the parameters this GPU owns: memory-bound,
    ``params × optimizer_step_bytes(recipe, kernels) / (W·η_hbm)``."""
    return local_params * optimizer_step_bytes(recipe, kernels) / (gpu.hbm_bandwidth * cal.hbm_efficiency)
