"""Per-kernel times of torchtitan's Llama block in steady state, eager and compiled (torch.profiler).

After ``--settle`` seconds of back-to-back forward + backward (so that the SM clock has settled at
the power cap, as in a training step), ``--iters`` iterations are traced with torch.profiler and
each GPU kernel's count and total time read from the Chrome trace (events of category
``kernel``). The kernels are then grouped as meshplan's layer model groups its time
(:class:`meshplan.cost.compute.OpTimes`): GEMMs, FlashAttention and everything else (element-wise,
reductions, copies: the memory-bound kernels).

``--regroup FILE`` re-reads a saved result and groups its kernels again (the grouping of the
2026-11-28 run, taken before FlashAttention was matched first, is refreshed this way).

Run on the GPU machine with ``PYTHONPATH=src``:
``python3 benchmarks/gpu_profile.py --out profile.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_sustained import block_step  # noqa: E402

#: Kernel-name patterns of each group, the first match wins: FlashAttention-2 in aten
#: (``pytorch_flash::flash_fwd_*``/``flash_bwd_*``, whose template arguments name ``cutlass`` types,
#: so it is matched first), then cuBLAS/cuBLASLt's Hopper GEMMs (``nvjet_*``, ``sm90_xmma_gemm_*``).
GROUPS = (("attention_fwd", re.compile(r"flash_fwd", re.I)),
          ("attention_bwd", re.compile(r"flash_bwd", re.I)),
          ("gemm", re.compile(r"nvjet|gemm|cutlass|xmma|cublas", re.I)))


def group_of(name: str) -> str:
    for group, pattern in GROUPS:
        if pattern.search(name):
            return group
    return "other"


def grouped(kernels: dict[str, dict]) -> dict:
    """``{"groups_us", "total_us", "kernels"}`` of a per-kernel table (name -> calls, us), each
    kernel tagged with its group (:func:`group_of`)."""
    table = {name: {**row, "group": group_of(name)} for name, row in kernels.items()}
    groups: dict[str, float] = {}
    for row in table.values():
        groups[row["group"]] = groups.get(row["group"], 0.0) + row["us"]
    return {"groups_us": groups, "total_us": sum(groups.values()), "kernels": table}


def kernel_table(trace_path: str, iters: int) -> dict:
    """Per kernel name of a Chrome trace: calls and microseconds per iteration, grouped."""
    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    kernels: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "kernel" and "dur" in e:
            k = kernels.setdefault(e["name"], [0, 0.0])
            k[0] += 1
            k[1] += float(e["dur"])
    return grouped({name: {"calls": c / iters, "us": us / iters} for name, (c, us) in kernels.items()})


def profile(step, settle: float, iters: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < settle:
        step()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        e0.record()
        for _ in range(iters):
            step()
        e1.record()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        out = kernel_table(f.name, iters)
    out["wall_us_per_iter"] = e0.elapsed_time(e1) * 1e3 / iters
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--settle", type=float, default=4.0)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--regroup", action="store_true", help="group the kernels of --out again, on any machine")
    args = ap.parse_args()
    if args.regroup:
        saved = json.loads(Path(args.out).read_text())
        for name, case in saved["cases"].items():
            if "kernels" in case:
                saved["cases"][name] = {**case, **grouped({k: {"calls": r["calls"], "us": r["us"]} for k, r in case["kernels"].items()})}
        Path(args.out).write_text(json.dumps(saved, indent=1))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_profile: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "cases": {}}
    for name, b, s, compiled in (("eager 2x8192", 2, 8192, False), ("compiled 2x8192", 2, 8192, True),
                                 ("compiled 1x32768", 1, 32768, True)):
        try:
            r = profile(block_step(b, s, compiled), args.settle, args.iters)
        except Exception as exc:  # noqa: BLE001 - keep the other cases
            result["cases"][name] = {"error": str(exc).splitlines()[0][:200]}
            print(f"{name}: error {result['cases'][name]['error']}", flush=True)
            continue
        result["cases"][name] = r
        Path(args.out).write_text(json.dumps(result, indent=1))
        g = r["groups_us"]
        print(f"{name:<18} wall {r['wall_us_per_iter'] / 1e3:7.2f} ms  kernels {r['total_us'] / 1e3:7.2f} ms  "
              + "  ".join(f"{k} {v / 1e3:.2f}" for k, v in sorted(g.items())), flush=True)
        top = sorted(r["kernels"].items(), key=lambda kv: -kv[1]["us"])[:12]
        for kname, row in top:
            print(f"   {row['us'] / 1e3:7.3f} ms  x{row['calls']:<5g} {row['group']:<9} {kname[:90]}", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
