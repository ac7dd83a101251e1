"""Burst against sustained: a layer's and attention's time once the GPU has settled at its power cap.

``meshplan verify kernels`` times each kernel in a burst (a median of 5 after 2 warm-ups), where
the SM clock can still be above the one a training step settles at under the board's power cap.
This script runs each workload back to back for ``--seconds`` and reports, per ~1 s window, the
time of one call (CUDA events) with the board power and SM clock (NVML): the first window is the
burst, the median of the last half the sustained figure.

Workloads (random normal data, bf16, SDPA restricted to FlashAttention):

* torchtitan's Llama 3 8B block (:mod:`meshplan.verify.llama_block`), ``torch.compile``'d and
  eager, forward + backward at micro-batch 2 × 8192, and compiled at 1 × 32768; with ``--cases``,
  also under torchtitan's op-level selective checkpointing (``block eager op-sac 2x8192``,
  ``block compiled op-sac 2x8192``);
* FlashAttention alone, causal, forward + backward, 64 heads of 128 over 8192 (the 8B layer's
  attention at micro-batch 2);
* the 8B gate GEMM alone (16384 × 14336 × 4096), for the GEMM's own sustained rate; with
  ``--cases``, also as an FP8 ``torch._scaled_mm`` (``gemm fp8 16384x14336x4096``).

Run on the GPU machine with ``PYTHONPATH=src``: ``python3 benchmarks/gpu_sustained.py --out s.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_sweep import sustain  # noqa: E402


def block_step(b: int, s: int, compiled: bool, sac: bool = False):
    """One forward + backward of the 8B block; ``sac``: under torchtitan's op-level selective
    activation checkpointing (:func:`meshplan.verify.llama_block.op_sac`)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from meshplan.verify.llama_block import Block, op_sac, precompute_freqs_cis

    torch.manual_seed(0)
    block = Block(4096, 32, 8, 14336, 128).to(device="cuda", dtype=torch.bfloat16)
    freqs = precompute_freqs_cis(128, s).to("cuda")
    fn = op_sac(block) if sac else block
    fn = torch.compile(fn, fullgraph=True) if compiled else fn
    x = torch.randn(b, s, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)
    params = tuple(block.parameters())

    def step():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            torch.autograd.grad(fn(x, freqs), (x, *params), g)
    return step


def attention_step(heads: int, s: int):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(1, heads, s, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(1, heads, s, 128, device="cuda", dtype=torch.bfloat16)

    def step():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), g)
    return step


def gemm_step(fp8: bool = False):
    """The 8B gate GEMM (16384 × 14336 × 4096): bf16 ``torch.mm``, or FP8 ``torch._scaled_mm`` of
    E4M3 operands (B column-major, unit tensorwise scales, bf16 out: torchao's forward)."""
    import torch

    a = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16)
    if not fp8:
        return lambda: torch.mm(a, w.t())
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda", dtype=torch.float32)
    return lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all but the op-SAC ones)")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_sustained: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    cases = [("block compiled 2x8192", lambda: block_step(2, 8192, True)),
             ("attention 64x8192 fwd+bwd", lambda: attention_step(64, 8192)),
             ("gemm 16384x14336x4096", gemm_step),
             ("gemm fp8 16384x14336x4096", lambda: gemm_step(True)),
             ("block eager 2x8192", lambda: block_step(2, 8192, False)),
             ("block compiled 1x32768", lambda: block_step(1, 32768, True)),
             ("block eager op-sac 2x8192", lambda: block_step(2, 8192, False, True)),
             ("block compiled op-sac 2x8192", lambda: block_step(2, 8192, True, True))]
    chosen = [c for c in args.cases.split(",") if c]
    cases = [c for c in cases if c[0] in chosen] if chosen else [c for c in cases if "op-sac" not in c[0] and "fp8" not in c[0]]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "seconds": args.seconds, "cases": {}}
    out = Path(args.out)
    print(f"{'case':<28} {'burst ms':>9} {'sust. ms':>9} {'ratio':>6} {'W first':>8} {'W sust':>7} {'MHz first':>9} {'MHz sust':>8}")
    for name, make in cases:
        try:
            r = sustain(make(), args.seconds)
        except Exception as exc:  # noqa: BLE001 - keep the other cases
            result["cases"][name] = {"error": " ".join(str(exc).split())[:400]}
            out.write_text(json.dumps(result, indent=1))
            print(f"{name:<28} error: {result['cases'][name]['error']}", flush=True)
            continue
        result["cases"][name] = r
        out.write_text(json.dumps(result, indent=1))
        print(f"{name:<28} {r['burst_s'] * 1e3:9.3f} {r['sustained_s'] * 1e3:9.3f} {r['sustained_s'] / r['burst_s']:6.3f} "
              f"{r['power_w_first_s'] or 0:8.0f} {r['power_w_sustained'] or 0:7.0f} {r['sm_mhz_first_s'] or 0:9.0f} "
              f"{r['sm_mhz_sustained'] or 0:8.0f}", flush=True)
        torch.cuda.empty_cache()
        time.sleep(3)  # let the clock recover, so that each case's first window is a burst
    return 0


if __name__ == "__main__":
    sys.exit(main())
