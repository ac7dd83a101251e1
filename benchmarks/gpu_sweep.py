"""The GPU's ceilings, sustained GEMM throughput and FlashAttention's length curve, on one CUDA GPU.

Companion of ``meshplan verify kernels`` (which times one plan's layer): the figures the
calibration's Hopper row rests on, measured the way the catalog constants are defined.

* **ceilings** — a 1 GiB device-to-device copy (bytes read + written over the time) and an
  8192³ bf16 ``torch.mm`` in a burst (median of 20 after 5 warm-ups), random normal data;
* **sustained GEMM** — the 8B layer's gate GEMM (16384 × 14336 × 4096, bf16) back to back for
  ``--sustain`` seconds, throughput per 1 s window, with the board's power draw and SM clock
  sampled by NVML: what a training step's GEMMs see once the clock has settled under the power
  cap, against the burst figure above;
* **attention** — SDPA forward and backward (backward = (fwd + bwd) − fwd) at head dim 128,
  causal (and not, to 32K: context parallelism's off-diagonal blocks), 64K query tokens a call
  (batch · L), 16 heads, keys L from 1K to 128K, per backend (FlashAttention, cuDNN, and
  memory-efficient to 16K); TFLOP/s with the causal
  FLOPs of :func:`meshplan.cost.attention.causal_attention_flops` (non-causal: 4·b·h·L²·d).

Prints a table and writes ``--out`` (JSON). Run on the GPU machine with ``PYTHONPATH=src``:
``python3 benchmarks/gpu_sweep.py --out sweep.json``. On the CPU it refuses (exit 2): the
figures only mean something on a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from meshplan.cost.attention import causal_attention_flops  # noqa: E402
from meshplan.verify.kernels import median_seconds  # noqa: E402


def events_median(fn, warmup: int = 3, reps: int = 10) -> float:
    """Median seconds of ``reps`` calls after ``warmup``, by CUDA events
    (:func:`meshplan.verify.kernels.median_seconds` on the GPU)."""
    return median_seconds(fn, "cuda", warmup, reps)


class PowerSampler:
    """NVML power (W) and SM clock (MHz) every 100 ms in a thread; empty where NVML is missing."""

    def __init__(self):
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - NVML is optional
            self._nvml = None

    def info(self) -> dict:
        if not self._nvml:
            return {}
        n, h = self._nvml, self._h
        out = {}
        for key, call in (("power_limit_w", lambda: n.nvmlDeviceGetPowerManagementLimit(h) / 1e3),
                          ("max_sm_clock_mhz", lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)),
                          ("max_mem_clock_mhz", lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM)),
                          ("driver", lambda: n.nvmlSystemGetDriverVersion()),
                          ("temperature_c", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))):
            try:
                v = call()
                out[key] = v.decode() if isinstance(v, bytes) else v
            except Exception:  # noqa: BLE001
                pass
        return out

    def _run(self):
        n, h = self._nvml, self._h
        t0 = time.perf_counter()
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter() - t0, n.nvmlDeviceGetPowerUsage(h) / 1e3,
                                     n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)))
            except Exception:  # noqa: BLE001
                break
            time.sleep(0.1)

    def __enter__(self):
        if self._nvml:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._nvml:
            self._thread.join()


def ceilings() -> dict:
    import torch

    x = torch.randn(256 * 1024 * 1024, device="cuda", dtype=torch.float32)  # 1 GiB
    y = torch.empty_like(x)
    t = events_median(lambda: y.copy_(x), 3, 20)
    copy_bw = 2 * x.numel() * 4 / t
    del x, y
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = events_median(lambda: torch.mm(a, b), 5, 20)
    return {"copy_bytes_per_s": copy_bw, "gemm_8192_bf16_flops": 2 * 8192 ** 3 / t}


def sustain(fn, seconds: float, sampler: PowerSampler | None = None) -> dict:
    """``fn`` back to back for ``seconds``: seconds per call in ~1 s windows (CUDA events), with
    the board power and SM clock NVML samples meanwhile: the first window is the burst, the
    median of the last half the sustained figure."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    sampler = sampler or PowerSampler()
    windows = []
    start = time.perf_counter()
    with sampler:
        while time.perf_counter() - start < seconds:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            calls, w0 = 0, time.perf_counter()
            while time.perf_counter() - w0 < 1.0:
                fn()
                calls += 1
                if calls % 4 == 0:
                    torch.cuda.synchronize()
            e1.record()
            torch.cuda.synchronize()
            windows.append(e0.elapsed_time(e1) / 1e3 / calls)
    late = [s for s in sampler.samples if s[0] > seconds / 2]
    early = [s for s in sampler.samples if s[0] <= 1.0]
    return {
        "window_seconds_per_call": windows,
        "burst_s": windows[0],
        "sustained_s": statistics.median(windows[len(windows) // 2:]),
        "power_w_first_s": statistics.median([s[1] for s in early]) if early else None,
        "sm_mhz_first_s": statistics.median([s[2] for s in early]) if early else None,
        "power_w_sustained": statistics.median([s[1] for s in late]) if late else None,
        "sm_mhz_sustained": statistics.median([s[2] for s in late]) if late else None,
        "samples": sampler.samples[::5],
    }


def sustained_gemm(seconds: float, sampler: PowerSampler) -> dict:
    """The 8B gate GEMM (bf16) back to back (:func:`sustain`), as FLOP/s per window."""
    import torch

    m, n, k = 16384, 14336, 4096
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    flops = 2.0 * m * n * k
    r = sustain(lambda: torch.mm(a, b), seconds, sampler)
    return {
        "shape": [m, n, k],
        "window_flops": [flops / t for t in r["window_seconds_per_call"]],
        "first_window_flops": flops / r["burst_s"],
        "last_half_median_flops": flops / r["sustained_s"],
        "power_w_last_half_median": r["power_w_sustained"],
        "sm_clock_mhz_last_half_median": r["sm_mhz_sustained"],
        "samples": r["samples"],
    }


def attention_sweep(lengths: list[int], tokens: int, heads: int, d: int = 128, noncausal_max: int = 32768,
                    efficient_max: int = 16384) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    rows = []
    for L in lengths:
        batch = max(1, tokens // L)
        q, k, v = (torch.randn(batch, heads, L, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn(batch, heads, L, d, device="cuda", dtype=torch.bfloat16)
        for causal in (True, False) if L <= noncausal_max else (True,):
            f = causal_attention_flops(batch * heads, d, L, L) if causal else 4.0 * batch * heads * L * L * d
            for name, backend in backends:
                if name == "efficient" and L > efficient_max:
                    continue

                def fwd():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def both():
                    torch.autograd.grad(fwd(), (q, k, v), g)
                try:
                    with sdpa_kernel([backend]):
                        tf = events_median(fwd, 2, 5)
                        tfb = events_median(both, 2, 5)
                except Exception as exc:  # noqa: BLE001 - a backend may not take the shape
                    rows.append({"L": L, "causal": causal, "backend": name, "error": str(exc).splitlines()[0][:160]})
                    continue
                tb = max(tfb - tf, 1e-12)
                rows.append({"L": L, "batch": batch, "heads": heads, "d": d, "causal": causal, "backend": name,
                             "fwd_s": tf, "bwd_s": tb, "fwd_flops": f / tf, "bwd_flops": 2.5 * f / tb})
        del q, k, v, g
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sustain", type=float, default=20.0, help="seconds of back-to-back GEMMs")
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768,65536,131072")
    ap.add_argument("--tokens", type=int, default=65536, help="query tokens per call, batch · L")
    ap.add_argument("--heads", type=int, default=16)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_sweep: --device: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    sampler = PowerSampler()
    result = {"device": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
              "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "nvml": sampler.info()}
    out = Path(args.out)

    def save():
        out.write_text(json.dumps(result, indent=1))

    result["ceilings"] = ceilings()
    save()
    print(f"copy {result['ceilings']['copy_bytes_per_s'] / 1e12:.2f} TB/s; 8192^3 bf16 "
          f"{result['ceilings']['gemm_8192_bf16_flops'] / 1e12:.0f} TFLOP/s (burst)", flush=True)
    result["sustained"] = sustained_gemm(args.sustain, sampler)
    save()
    s = result["sustained"]
    print(f"sustained 16384x14336x4096: first {s['first_window_flops'] / 1e12:.0f}, last half "
          f"{s['last_half_median_flops'] / 1e12:.0f} TFLOP/s; power {s['power_w_last_half_median']} W, "
          f"SM {s['sm_clock_mhz_last_half_median']} MHz", flush=True)
    result["attention"] = attention_sweep([int(x) for x in args.lengths.split(",")], args.tokens, args.heads)
    save()
    print(f"{'L':>7} {'causal':>6} {'backend':>9} {'fwd TF/s':>9} {'bwd TF/s':>9}")
    for r in result["attention"]:
        if "error" in r:
            print(f"{r['L']:>7} {str(r['causal']):>6} {r['backend']:>9}  {r['error'][:60]}")
        else:
            print(f"{r['L']:>7} {str(r['causal']):>6} {r['backend']:>9} {r['fwd_flops'] / 1e12:9.0f} {r['bwd_flops'] / 1e12:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
