"""A Llama transformer block written as torchtitan writes it (9dec370, December 2024): RMSNorm with
an fp32 upcast, complex RoPE in fp32, ``repeat_kv`` before SDPA, separate q/k/v and gate/up
projections, SwiGLU as ``w2(silu(w1 x) * w3 x)``.

Used to count the tensors such a block saves for its backward (tests/test_eager_activations.py)
and to time it on a GPU against meshplan's layer model (:mod:`meshplan.verify.kernels`). With
``heads``, ``kv_heads`` and ``ffn`` of one tensor-parallel rank (a/t, g/t, f/t) and the model's
head dimension it is that rank's compute without the collectives.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """y = x / √(mean(x²) + ε) · w, computed in fp32 and cast back (torchtitan's ``RMSNorm``)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 500000.0):
    """The rotary phases e^{i·t·θ^(−2j/d)} for positions t < ``end`` (complex64)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, xk, freqs_cis):
    """RoPE as a complex product in fp32 (torchtitan's ``apply_rotary_emb``)."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    fc = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * fc).flatten(3).type_as(xq), torch.view_as_real(xk_ * fc).flatten(3).type_as(xk)


def repeat_kv(x, n_rep: int):
    """K or V expanded from g to g·n_rep heads, materialized (torchtitan's ``repeat_kv``)."""
    bs, slen, n_kv, hd = x.shape
    if n_rep == 1:
        return x
    return torch.unsqueeze(x, dim=3).expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


class Block(nn.Module):
    """One pre-norm Llama block: h + attention(norm(h)), then + SwiGLU MLP(norm(·)). ``a`` query
    heads and ``g`` K/V heads of dimension ``d`` (h // a unless given), MLP width ``f``."""

    def __init__(self, h: int, a: int, g: int, f: int, d: int | None = None):
        super().__init__()
        self.a, self.g, self.d = a, g, d if d is not None else h // a
        self.wq = nn.Linear(h, a * self.d, bias=False)
        self.wk = nn.Linear(h, g * self.d, bias=False)
        self.wv = nn.Linear(h, g * self.d, bias=False)
        self.wo = nn.Linear(a * self.d, h, bias=False)
        self.w1 = nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)
        self.w3 = nn.Linear(h, f, bias=False)
        self.attention_norm = RMSNorm(h)
        self.ffn_norm = RMSNorm(h)

    def attention(self, x, fc):
        bs, s, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bs, s, -1, self.d)
        xk = xk.view(bs, s, -1, self.d)
        xv = xv.view(bs, s, -1, self.d)
        xq, xk = apply_rotary_emb(xq, xk, fc)
        keys, values = repeat_kv(xk, self.a // self.g), repeat_kv(xv, self.a // self.g)
        o = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(bs, s, -1))

    def forward(self, x, fc):
        h = x + self.attention(self.attention_norm(x), fc)
        y = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))


def op_sac_policy():
    """torchtitan's op-level selective activation checkpointing policy (9dec370,
    ``_apply_ac_to_transformer_block``, ``ac_mode = "selective"``, ``selective_ac_option = "op"``):
    save the outputs of ``aten.mm`` — all but every second one, counted apart in the forward and
    in the recomputation — of SDPA (the CUDA flash and memory-efficient kernels, and the CPU one
    standing in for them) and of ``aten.max``; recompute the rest. A fresh policy per forward (its
    mm counter restarts), as torchtitan's ``selective_checkpointing_context_fn`` makes one."""
    from collections import defaultdict

    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default, aten.max.default}
    meta: dict[str, int] = defaultdict(int)

    def decide(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == aten.mm.default:
            meta[key] += 1
        keep = func in save and not (func == aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return decide


def op_sac(block: nn.Module):
    """``block`` under :func:`op_sac_policy`: a callable ``(x, freqs_cis) -> output`` that runs it
    through ``torch.utils.checkpoint`` (non-reentrant, no RNG state kept, as torchtitan wraps it)."""
    from functools import partial

    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    def run(x, fc):  # a partial, not a closure, as context_fn: what torch.compile traces
        return checkpoint(block, x, fc, use_reentrant=False, preserve_rng_state=False,
                          context_fn=partial(create_selective_checkpoint_contexts, op_sac_policy()))
    return run
