"""Reference ring attention on a gloo group: the context-parallel K/V exchange, counted.

torch 2.13's ``context_parallel`` cannot run on CPU: it rewrites only the CUDA SDPA kernels (flash,
memory-efficient, cuDNN), and the CPU kernel ``aten._scaled_dot_product_flash_attention_for_cpu``
has no DTensor sharding rule (``NotImplementedError`` on a gloo mesh). ``verify comm`` with cp > 1
therefore runs this reference ring attention (Liu et al. 2023, "Ring Attention with Blockwise
Transformers", Sec. 3), with the model's attention shapes, on the cp group, and counts its sends:

* forward: each rank holds its n = b·s/c tokens of Q, K, V (g K/V heads; keys of width d, values
  of width d_v, which is d except under MLA); in each of c − 1 steps it passes the K/V block it
  holds (K and V in one message, n·g·(d + d_v)·e bytes) to the next rank and merges the block it
  receives into its output by log-sum-exp (online softmax);
* backward: the K/V blocks travel the ring again (c − 1 messages), each with the running gradient
  of that block (dK, dV: the same bytes) collected from the ranks it visits; the owner's own share
  stays home, so the running gradient leaves its first visitor and arrives back at its owner after
  c − 1 messages.

Per layer and micro-batch, then: c − 1 sends of n·g·(d + d_v)·e forward and 2·(c − 1) backward, the
bytes meshplan's model charges for the fused ring (:func:`meshplan.cost.cp_exchange.cp_exchange_bytes`,
:func:`meshplan.cost.compose.layer_times`).
Attention here is non-causal: a causal mask changes which blocks compute, not what travels.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan


def _exchange(send: Any, group) -> Any:
    """Send ``send`` to the next rank of ``group``'s ring and receive the previous rank's."""
    import torch
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(group)
    me = ranks.index(dist.get_rank())
    recv = torch.empty_like(send)
    reqs = [dist.isend(send.contiguous(), ranks[(me + 1) % len(ranks)], group=group),
            dist.irecv(recv, ranks[(me - 1) % len(ranks)], group=group)]
    for r in reqs:
        r.wait()
    return recv


def _split(kv, d_k: int):
    """A joined K|V block back into K (the first ``d_k`` of the last axis) and V (the rest)."""
    return kv.split([d_k, kv.shape[-1] - d_k], dim=-1)


def _block(q, k, v, heads: int):
    """Scores and output of local queries against one K/V block: (log-sum-exp, output), K/V
    heads repeated to the query heads (GQA)."""
    import torch

    rep = heads // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return lse, torch.exp(s - lse) @ v


def ring_attention_function():
    """The autograd Function (built lazily: torch is an optional dependency)."""
    import torch

    class RingAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, group):
            c = torch.distributed.get_world_size(group)
            heads = q.shape[1]
            kv = torch.cat([k, v], dim=-1)
            lse, out = _block(q, k, v, heads)
            for _ in range(c - 1):
                kv = _exchange(kv, group)
                lse_b, out_b = _block(q, *_split(kv, k.shape[-1]), heads)
                new = torch.logaddexp(lse, lse_b)
                out = out * torch.exp(lse - new) + out_b * torch.exp(lse_b - new)
                lse = new
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.group = group
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, out, lse = ctx.saved_tensors
            group = ctx.group
            c = torch.distributed.get_world_size(group)
            heads, scale = q.shape[1], q.shape[-1] ** -0.5
            delta = (grad_out * out).sum(-1, keepdim=True)

            def grads(kb, vb):
                rep = heads // kb.shape[1]
                ke, ve = kb.repeat_interleave(rep, dim=1), vb.repeat_interleave(rep, dim=1)
                p = torch.exp(q @ ke.transpose(-1, -2) * scale - lse)
                ds = p * (grad_out @ ve.transpose(-1, -2) - delta)
                dq = ds @ ke * scale
                dk = (ds.transpose(-1, -2) @ q * scale).unflatten(1, (kb.shape[1], rep)).sum(2)
                dv = (p.transpose(-1, -2) @ grad_out).unflatten(1, (kb.shape[1], rep)).sum(2)
                return dq, torch.cat([dk, dv], dim=-1)

            dq, own = grads(k, v)
            kv, acc = torch.cat([k, v], dim=-1), None
            for step in range(1, c):
                kv = _exchange(kv, group)
                if acc is not None:  # the running gradient of the block just received
                    acc = _exchange(acc, group)
                dq_b, dkv_b = grads(*_split(kv, k.shape[-1]))
                dq = dq + dq_b
                acc = dkv_b if acc is None else acc + dkv_b
            if acc is not None:  # back to the block's owner, the next rank
                own = own + _exchange(acc, group)
            dk, dv = _split(own, k.shape[-1])
            return dq, dk, dv, None

    return RingAttention


def qkv_shapes(model: ModelSpec, plan: TrainingPlan) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(Q, K, V shapes) of one rank's sequence chunk: (b, a, s/c, d), (b, g, s/c, d) and
    (b, g, s/c, d_v), d_v = :attr:`ModelSpec.value_head_dim` (MLA's values are narrower than its
    keys: DeepSeek-V3 d = 192, d_v = 128)."""
    b, n = plan.micro_batch, plan.seq_len // plan.cp
    return (b, model.n_heads, n, model.head_dim), (b, model.n_kv_heads, n, model.head_dim), (b, model.n_kv_heads, n, model.value_head_dim)


def run_rank(model: ModelSpec, plan: TrainingPlan, make_counter, device: str = "cpu") -> dict[str, Any]:
    """Inside an initialised process group of cp ranks (gloo on CPU, NCCL on CUDA): one step of
    ``m`` micro-batches through L ring attentions (fp32, random Q, K, V of the model's shapes, on
    ``device``), counted; and whether this rank's output and gradients equal full attention over the
    gathered sequence (to 1e-4)."""
    import torch
    import torch.distributed as dist

    from meshplan.verify.device import here

    group = dist.new_group(list(range(dist.get_world_size())))
    counter = make_counter({tuple(range(dist.get_world_size())): "cp"})
    ring = ring_attention_function()
    shapes = qkv_shapes(model, plan)
    g = torch.Generator().manual_seed(dist.get_rank())
    agree = True
    for _ in range(plan.grad_accum):
        for _ in range(model.n_layers):
            q, k, v = (torch.randn(shape, generator=g).to(here(device)).requires_grad_() for shape in shapes)
            with counter:
                out = ring.apply(q, k, v, group)
                out.backward(torch.ones_like(out))
            agree &= _agrees_with_full_attention(q, k, v, out, group)
    return {"rank": dist.get_rank(), "pp_rank": 0, "stages": [0], "records": counter.records, "matches_full_attention": agree}


def _agrees_with_full_attention(q, k, v, out, group) -> bool:
    """Full attention over every rank's Q, K and V (gathered), forward and backward: this rank's
    slice of the output and of the Q, K, V gradients."""
    import torch
    import torch.distributed as dist

    c, me = dist.get_world_size(group), dist.get_rank(group)

    def gather(t):
        parts = [torch.empty_like(t) for _ in range(c)]
        dist.all_gather(parts, t.detach().contiguous(), group=group)
        return torch.cat(parts, dim=2).requires_grad_()

    qf, kf, vf = gather(q), gather(k), gather(v)
    rep = q.shape[1] // k.shape[1]
    ref = torch.nn.functional.scaled_dot_product_attention(qf, kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1))
    ref.backward(torch.ones_like(ref))
    n = q.shape[2]
    mine = slice(me * n, (me + 1) * n)
    pairs = [(out, ref), (q.grad, qf.grad), (k.grad, kf.grad), (v.grad, vf.grad)]
    return all(torch.allclose(a, b[:, :, mine], atol=1e-4) for a, b in pairs)


# ---- torch's own ring attention backward, its buffers measured ---------------------------------


def check_ring_memory_plan(model: ModelSpec, plan: TrainingPlan) -> None:
    """What :func:`torch_ring_backward_rank` runs: cp ranks alone, torch's stack."""
    if plan.cp < 2 or plan.tp * plan.pp * plan.dp > 1:
        raise InputError("cp", "the ring attention memory check runs cp > 1 ranks alone (tp = pp = dp = 1)")
    if plan.stack.kernels == "fused":
        raise InputError("kernels", "the ring attention memory check runs torch's ring (kernels compiled or eager)")
    if plan.seq_len % (2 * plan.cp):
        raise InputError("seq_len", f"must split into 2·cp = {2 * plan.cp} chunks for torch's round-robin load balance")


def _cpu_flash_forward(q, k, v, is_causal=False, **_):
    """torch's CPU flash kernel in the place of the CUDA one the ring calls: (out, log-sum-exp)."""
    import torch

    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal)


def _cpu_flash_backward(query, key, value, out, logsumexp, is_causal=False, grad_out=None, **_):
    """The CPU flash kernel's backward in the place of the CUDA one: (dQ, dK, dV)."""
    import torch

    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, logsumexp, 0.0, is_causal)


REPEATS = 3  # runs of each backward in torch_ring_backward_rank; the least peak counts


def torch_ring_backward_rank(model: ModelSpec, plan: TrainingPlan) -> dict[str, Any]:
    """Inside an initialised gloo group of cp ranks: torch's own ring attention
    (``_templated_ring_attention`` and ``_templated_ring_attention_backward`` of
    ``torch.distributed.tensor.experimental._context_parallel._attention``, with its defaults:
    all-gather rotation, fp32 accumulation, round-robin load balance; causal) on this rank's
    b·s/c tokens over the a/t repeated heads of the model, in the plan's 16-bit activation dtype,
    the CPU flash kernels in the place of the CUDA ones. ``MemTracker`` measures the backward's
    peak above its inputs (Q, K, V, the output, its log-sum-exp and gradient), and the same for
    a plain flash backward of the local chunk: ``ring`` and ``plain``, bytes.

    Each is the least of ``REPEATS`` runs. A buffer can outlive the program's last reference to it
    by a moment when another thread still holds it (gloo's worker keeps a finished exchange, send
    buffer included, until it lets the work go); under load one rank of four once measured 5.3 MB
    more. Such a delay can only raise a peak, so the least of the runs is the program's own."""
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

    from meshplan.cost.cp_exchange import sdpa_kv_heads

    dtype = {2: torch.bfloat16, 4: torch.float32}[plan.precision.activation_bytes]
    heads = sdpa_kv_heads(model, plan.tp, plan.stack.kernels)
    n = plan.micro_batch * plan.seq_len // plan.cp
    g = torch.Generator().manual_seed(dist.get_rank())
    q, k = (torch.randn(plan.micro_batch, heads, n, model.head_dim, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(plan.micro_batch, heads, n, model.value_head_dim, generator=g, dtype=dtype)
    group = dist.group.WORLD
    out, lse = cp_attention._templated_ring_attention(group, 2, _cpu_flash_forward, q, k, v, is_causal=True)[:2]
    dout = torch.randn(out.shape, generator=g, dtype=dtype)
    inputs = (q, k, v, out, lse, dout)

    def peak(run) -> int:
        peaks = []
        for _ in range(REPEATS):
            tracker = MemTracker()
            tracker.track_external(*inputs)
            with tracker:
                run()
            peaks.append(sum(d["Total"] for d in tracker.get_tracker_snapshot("peak").values()))
        return min(peaks) - sum(t.numel() * t.element_size() for t in inputs)

    ring = peak(lambda: cp_attention._templated_ring_attention_backward(
        group, 2, _cpu_flash_backward, dout, "grad_out", q, k, v, out, lse, True))
    plain = peak(lambda: _cpu_flash_backward(q, k, v, out, lse, True, grad_out=dout))
    return {"rank": dist.get_rank(), "ring": ring, "plain": plain}
