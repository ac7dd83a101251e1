"""The sources' own FLOP formulas, and the published step time each implies.

Many sources publish "TFLOP/s per GPU" rather than a step time, each counted with its own
formula (some count the recompute forward, some count attention non-causally, some leave it
out). meshplan compares step times, so a published TFLOP/s figure ``X`` is turned back into the
step time the authors measured with the authors' formula:

    step = FLOPs per step (source's formula) / (GPUs × X × 10¹²)

All arithmetic is exact (``fractions.Fraction``) until the final conversion to seconds, so a
derived step equals the hand-computed value exactly.

Formulas (B global batch in sequences, s sequence length, L layers, h hidden size, a query heads,
g key/value heads, d head dimension, f MLP hidden size, V (padded) vocabulary, N parameters):

* Narayanan et al. 2021, Eq. 3 (full recompute: the forward counted twice; non-causal attention;
  logits): ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))``. GPT-NeoX's and Megatron-DeepSpeed's
  throughput loggers use the same expression (``24·4·B·s·L·h²·(…)`` with checkpointing on).
* Megatron-LM ``num_floating_point_operations`` as of Megatron-Core r0.8 (2024-07), attention
  counted non-causally (the halving for causal masks came in 2025):
  ``12·B·s·L·h²·((1 + g/a + s/h)·(a·d/h) + (f/h)·(3/2 if gated) + V/(2·L·h))``.
* Llama 3 "model FLOPs": ``(6·N + 12·L·h·s)`` per token (non-causal attention term), the
  convention the ground-truth notes derive the paper's TFLOP/s from (the paper does not print
  its formula).
* Throughput sources (torchtitan): ``step = B·s / (tokens/s per GPU × GPUs)``.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Union

Number = Union[int, float, str, Fraction]


def _q(x: Number) -> Fraction:
    """An exact rational from a published number (floats through their decimal text)."""
    if isinstance(x, Fraction):
        return x
    if isinstance(x, float):
        return Fraction(repr(x))
    return Fraction(x)


def narayanan21_eq3(B: int, s: int, L: int, h: int, V: int) -> Fraction:
    """Narayanan et al. 2021 Eq. 3: ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))`` FLOPs per step."""
    return Fraction(96 * B * s * L * h * h) * (1 + Fraction(s, 6 * h) + Fraction(V, 16 * L * h))


def megatron_r08_flops(B: int, s: int, L: int, h: int, a: int, g: int, d: int, f: int, V: int, gated: bool = False,
                       causal: bool = False) -> Fraction:
    """Megatron-LM ``num_floating_point_operations``: FLOPs per step,
    ``12·B·s·L·h²·((1 + g/a + s/h)·a·d/h + (f/h)·(3/2 if gated) + V/(2·L·h))``, logits included,
    ``V`` the padded vocabulary. Megatron-Core r0.8 (2024-07) counts the whole s × s attention
    matrix; later releases (2025, the Megatron-Bridge tables) count the causal half
    (``causal``: the term s/h becomes s/(2h), "only half of the attention matrix is non-zero")."""
    attention = (1 + Fraction(g, a) + Fraction(s, 2 * h if causal else h)) * Fraction(a * d, h)
    mlp = Fraction(f, h) * (Fraction(3, 2) if gated else 1)
    logits = Fraction(V, 2 * L * h)
    return Fraction(12 * B * s * L * h * h) * (attention + mlp + logits)


def llama3_model_flops(tokens: int, N: int, L: int, h: int, s: int) -> Fraction:
    """Llama 3 model FLOPs per step: ``tokens × (6·N + 12·L·h·s)``."""
    return Fraction(tokens) * (6 * N + 12 * L * h * s)


def step_from_tflops(flops_per_step: Fraction, gpus: int, tflops_per_gpu: Number) -> float:
    """Seconds per step implied by ``tflops_per_gpu`` (TFLOP/s per GPU) under a FLOP formula."""
    return float(Fraction(flops_per_step) / (gpus * _q(tflops_per_gpu) * 10**12))


def step_from_tokens_per_gpu(tokens_per_step: int, gpus: int, tokens_per_s_per_gpu: Number) -> float:
    """Seconds per step implied by a throughput in tokens/s per GPU."""
    return float(Fraction(tokens_per_step) / (gpus * _q(tokens_per_s_per_gpu)))
