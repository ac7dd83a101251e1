"""The parts of a torchtitan training step outside the transformer blocks, timed on one GPU.

meshplan's step adds to the layers an embedding (``embedding_op_times``), a last stage of final
norm, LM head and loss (``head_op_times``) and an optimizer step (``optimizer_step_time``). This
script times each as torchtitan (Llama 3 8B, December 2024) runs it, on random data, bf16
activations:

* **embedding** — ``nn.Embedding(V, h)`` forward and backward over b·s token ids;
* **head** — torchtitan's fp32 RMSNorm, ``Linear(h, V)`` and its loss
  ``F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))``, forward and backward;
  and the same loss under ``torch.compile`` (torchtitan compiles it since 2025-04);
* **optimizer** — ``clip_grad_norm_(max_norm=1, foreach=True)`` then ``AdamW(foreach=True)`` over
  fp32 parameters, gradients and moments shaped as one rank's FSDP2 shards of the 8B model over
  ``--shards`` ranks (dim-0 slices of each parameter).

Each is the median of ``--reps`` calls after warm-ups, CUDA events; backward = (fwd + bwd) − fwd.
Run on the GPU machine with ``PYTHONPATH=src``: ``python3 benchmarks/gpu_step_parts.py --out p.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_sweep import events_median  # noqa: E402


def fwd_bwd(forward, inputs, reps: int, grad=None) -> dict:
    """Forward and backward seconds of ``forward()``, whose output is back-propagated into
    ``inputs`` with ``grad`` (none for a scalar loss): backward = (forward + backward) − forward."""
    import torch

    def both():
        torch.autograd.grad(forward(), inputs, grad)
    tf = events_median(forward, 3, reps)
    tfb = events_median(both, 3, reps)
    return {"fwd_s": tf, "bwd_s": max(tfb - tf, 0.0)}


def embedding(b: int, s: int, vocab: int, hidden: int, reps: int) -> dict:
    import torch

    emb = torch.nn.Embedding(vocab, hidden, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, vocab, (b, s), device="cuda")
    g = torch.randn(b, s, hidden, device="cuda", dtype=torch.bfloat16)
    return fwd_bwd(lambda: emb(ids), (emb.weight,), reps, g)


def head(b: int, s: int, vocab: int, hidden: int, reps: int, compiled_loss: bool) -> dict:
    import torch
    import torch.nn.functional as F

    from meshplan.verify.llama_block import RMSNorm

    norm = RMSNorm(hidden).to(device="cuda", dtype=torch.bfloat16)
    out = torch.nn.Linear(hidden, vocab, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(b, s, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (b, s), device="cuda")

    def loss_fn(pred, labels):
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
    loss = torch.compile(loss_fn) if compiled_loss else loss_fn
    params = (x, norm.weight, out.weight)
    return fwd_bwd(lambda: loss(out(norm(x)), labels), params, reps)


def optimizer(shards: int, reps: int) -> dict:
    import torch

    h, f, kv, layers, vocab = 4096, 14336, 1024, 32, 128256
    shapes = [(vocab, h), (vocab, h), (h,)]  # embedding, output, final norm
    for _ in range(layers):
        shapes += [(h, h), (kv, h), (kv, h), (h, h), (f, h), (h, f), (f, h), (h,), (h,)]
    params = []
    for shape in shapes:
        rows = -(-shape[0] // shards)  # FSDP2 pads dim 0 to a multiple of the ranks
        p = torch.nn.Parameter(torch.randn((rows, *shape[1:]), device="cuda", dtype=torch.float32) * 0.02)
        p.grad = torch.randn_like(p) * 1e-3
        params.append(p)
    n = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=8e-4, weight_decay=0.1, foreach=True, fused=False)

    def step():
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
    t = events_median(step, 3, reps)
    clip = events_median(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True), 3, reps)
    return {"params": n, "tensors": len(params), "clip_and_step_s": t, "clip_s": clip}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--shards", type=int, default=8)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_step_parts: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "model": "llama3-8b", "micro_batch": 2,
              "seq_len": 8192, "parts": {}}
    parts = (("embedding", lambda: embedding(2, 8192, 128256, 4096, args.reps)),
             ("head eager loss", lambda: head(2, 8192, 128256, 4096, args.reps, False)),
             ("head compiled loss", lambda: head(2, 8192, 128256, 4096, args.reps, True)),
             (f"optimizer 1/{args.shards}", lambda: optimizer(args.shards, args.reps)))
    for name, run in parts:
        try:
            result["parts"][name] = run()
        except Exception as exc:  # noqa: BLE001 - keep the other parts
            result["parts"][name] = {"error": str(exc).splitlines()[0][:200]}
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(name, {k: (round(v * 1e3, 3) if isinstance(v, float) else v) for k, v in result["parts"][name].items()}, flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
