"""Seconds of the attention core as one FlashAttention (or cuDNN fused attention) call: its
matmul FLOPs, the efficiency that grows with the keys each call sees, and the kernel a plan runs
with its measured rates. Its backward does 2.5× the forward's matmul FLOPs (it recomputes QKᵀ;
Dao 2023).
"""

from __future__ import annotations

from meshplan.cost.calibration import Calibration
from meshplan.errors import InputError


def flash_attention_efficiency(keys, eta_inf: float, l0: float):
    """Fraction of peak a FlashAttention call reaches when each query block visits ``keys`` keys:

        η(L) = η∞ · L / (L + L₀)

    A thread block owns B_r queries and streams the L keys through in tiles; its matmul work is
    ∝ B_r·L·d, while loading Q, the epilogue (rescaling by the softmax sum) and writing O and the
    log-sum-exp are a fixed cost per block, worth L₀ keys of streaming. The block takes
    t ∝ (L + L₀) for work ∝ L, so η = η∞·L/(L + L₀), with η∞ the long-sequence efficiency and L₀
    the length at which half of it is reached (Dao 2023, "FlashAttention-2", Algorithm 1 and
    Sec. 3.1; L₀ fitted to the FA2 kernel benchmarks of Shah et al. 2024, ``cost/calibration.py``).
    L is the sequence length s for a plain call and s/c for each ring step of context parallelism
    over c ranks (torch's round-robin ring: :func:`meshplan.cost.ring_attention.torch_ring_keys`). Scalars or numpy arrays."""
    return eta_inf * keys / (keys + l0)


def causal_attention_flops(heads: float, d: float, q_len: float, kv_len: float) -> float:
    """Matmul FLOPs of one causal FlashAttention forward over ``heads`` = b·a heads of dimension d:

        F = 4 · heads · d · q · L · ½

    (QKᵀ and A·V, 2·q·L·d each, over the q queries and L keys; the masked half skipped, as the
    kernel skips fully masked blocks). The backward does 2.5·F (it recomputes QKᵀ; Dao 2023)."""
    return 4.0 * heads * d * q_len * kv_len * 0.5


#: the attention kernels by name, as reports print them
ATTENTION_KERNEL_NAMES = {"flash2": "FlashAttention-2", "cudnn": "cuDNN fused attention"}


def attention_kernel_of(kernels: str, attention_kernel: str, cal: Calibration) -> str:
    """The attention kernel a plan runs: ``attention_kernel`` when given, else (``auto``) ``cudnn``
    on the fused stack where ``cal`` has cuDNN's rates — Transformer Engine's choice on Hopper
    ("Disabling FlashAttention to give FusedAttention preference on Hopper+ for performance
    reasons", ``get_attention_backend``) — and ``flash2`` otherwise: torch's SDPA as the published
    torch runs had it (FlashAttention-2 first; cuDNN opt-in since pytorch/pytorch#138522, 2024-10),
    the flash-attn package, and the calibration's flash rates on GPUs without a cuDNN measurement.
    torch 2.11 and later, whose bundled cuDNN passes ``check_prefer_cudnn_attention`` (cuDNN > 9.15
    on sm90/sm100), prefer cuDNN again on Hopper: plans for such a stack give ``cudnn``."""
    if attention_kernel != "auto":
        return attention_kernel
    return "cudnn" if kernels == "fused" and cal.attention_cudnn is not None else "flash2"


def attention_rates(cal: Calibration, kernel: str) -> tuple[float, float, float, float]:
    """(η∞ forward, L₀ forward, η∞ backward, L₀ backward) of the attention ``kernel`` under ``cal``:
    cuDNN's fused attention's (``cal.attention_cudnn``) or FlashAttention-2's."""
    if kernel == "cudnn":
        if cal.attention_cudnn is None:
            raise InputError("attention_kernel", f"cudnn has no measured rates on {cal.generation} GPUs (Hopper only): "
                                                 "give flash2 or auto")
        return cal.attention_cudnn
    return cal.attention_fwd_efficiency, cal.attention_fwd_l0, cal.attention_bwd_efficiency, cal.attention_bwd_l0


def flash_attention_times(heads: float, d: float, q_len: float, kv_len: float, keys: float, peak: float,
                          cal: Calibration, kernel: str = "flash2") -> tuple[float, float]:
    """Seconds of one causal FlashAttention call, forward and backward:

        t_fwd = F / (P · η_fwd(L)) + t_kernel,   t_bwd = 2.5·F / (P · η_bwd(L)) + t_kernel

    with F = :func:`causal_attention_flops`, P the 16-bit dense peak, η(L) of
    :func:`flash_attention_efficiency` at ``keys`` keys per kernel call (the sequence, or one ring
    step's block) and t_kernel the calibration's launch cost. ``kernel`` (:func:`attention_kernel_of`)
    picks the rates: FlashAttention-2's (η∞ and L₀ of ``cal``) or cuDNN's fused attention's
    (``cal.attention_cudnn``)."""
    core = causal_attention_flops(heads, d, q_len, kv_len)
    fwd_eta, fwd_l0, bwd_eta, bwd_l0 = attention_rates(cal, kernel)
    eta_f = flash_attention_efficiency(keys, fwd_eta, fwd_l0)
    eta_b = flash_attention_efficiency(keys, bwd_eta, bwd_l0)
    return core / (peak * eta_f) + cal.kernel_overhead, 2.5 * core / (peak * eta_b) + cal.kernel_overhead
