"""The figures of docs/gpu_measurements.md, drawn from the recorded results and the current model.

* ``gpu-attention.svg`` — FlashAttention-2's forward and backward TFLOP/s against the keys per
  call (log axis), measured (``sweep.json``) beside the model's η(L)·P, and cuDNN's backend;
* ``gpu-layer-split.svg`` — torchtitan's 8B block in steady state (``profile.json``): GEMMs,
  attention and the rest, measured beside the layer model, per stack.

Plain SVG, no plotting library; runs anywhere (no GPU): ``python benchmarks/gpu_figures.py``
(``--results DIR``, ``--out DIR``, defaults the 2026-11-28 H200 results and docs/img).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from meshplan.catalog import load_gpu, load_model  # noqa: E402
from meshplan.cost.attention import flash_attention_efficiency  # noqa: E402
from meshplan.cost.calibration import calibration_for  # noqa: E402
from meshplan.cost.compute import layer_op_times  # noqa: E402

FONT = 'font-family="sans-serif"'
COLOURS = {"gemm": "#4C78A8", "attention": "#F58518", "other": "#54A24B", "fwd": "#4C78A8", "bwd": "#E45756",
           "cudnn": "#9D9D9D"}
LABELS = {"gemm": "GEMMs", "attention": "FlashAttention", "other": "element-wise and the rest"}


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" {FONT}>',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2:.0f}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{title}</text>',
        *body, "</svg>", ""])


def attention_figure(sweep: dict) -> str:
    """Measured FA2 (dots) and cuDNN (grey) TFLOP/s against keys, the model's curves (lines)."""
    gpu = load_gpu("h200-sxm-141gb")
    cal = calibration_for(gpu)
    peak = gpu.peak("bf16") / 1e12
    rows = [r for r in sweep["attention"] if r.get("causal") and "error" not in r]
    W, H, left, right, top, bottom = 720, 420, 70, 170, 40, 60
    lo, hi = math.log2(1024), math.log2(131072)
    y_max = 700.0

    def px(L: float) -> float:
        return left + (math.log2(L) - lo) / (hi - lo) * (W - left - right)

    def py(t: float) -> float:
        return H - bottom - t / y_max * (H - top - bottom)

    body = []
    for t in range(0, 701, 100):
        body.append(f'<line x1="{left}" y1="{py(t):.1f}" x2="{W - right}" y2="{py(t):.1f}" stroke="#e6e6e6"/>')
        body.append(f'<text x="{left - 8}" y="{py(t) + 4:.1f}" text-anchor="end" font-size="11">{t}</text>')
    for k in range(10, 18):
        L = 2 ** k
        body.append(f'<text x="{px(L):.1f}" y="{H - bottom + 16}" text-anchor="middle" font-size="11">{L // 1024}K</text>')
    body.append(f'<text x="{(left + W - right) / 2:.0f}" y="{H - 18}" text-anchor="middle" font-size="12">keys per call (causal, head dim 128)</text>')
    body.append(f'<text x="18" y="{(top + H - bottom) / 2:.0f}" text-anchor="middle" font-size="12" '
                f'transform="rotate(-90 18 {(top + H - bottom) / 2:.0f})">TFLOP/s</text>')
    for direction, eta, l0 in (("fwd", cal.attention_fwd_efficiency, cal.attention_fwd_l0),
                               ("bwd", cal.attention_bwd_efficiency, cal.attention_bwd_l0)):
        pts = [(L, peak * flash_attention_efficiency(L, eta, l0)) for L in (2 ** (k / 8) for k in range(80, 137))]
        body.append('<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
            COLOURS[direction], " ".join(f"{px(L):.1f},{py(t):.1f}" for L, t in pts)))
        for r in rows:
            colour = COLOURS[direction] if r["backend"] == "flash" else COLOURS["cudnn"] if r["backend"] == "cudnn" else None
            if colour:
                shape = "circle" if direction == "fwd" else "rect"
                x, y = px(r["L"]), py(r[f"{direction}_flops"] / 1e12)
                body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{colour}"/>' if shape == "circle" else
                            f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{colour}"/>')
    legend = [("line", COLOURS["fwd"], "model, forward"), ("line", COLOURS["bwd"], "model, backward"),
              ("circle", COLOURS["fwd"], "FA2 forward"), ("rect", COLOURS["bwd"], "FA2 backward"),
              ("circle", COLOURS["cudnn"], "cuDNN forward"), ("rect", COLOURS["cudnn"], "cuDNN backward")]
    for i, (kind, colour, label) in enumerate(legend):
        x, y = W - right + 18, top + 20 + 22 * i
        body.append(f'<line x1="{x}" y1="{y}" x2="{x + 22}" y2="{y}" stroke="{colour}" stroke-width="2"/>' if kind == "line" else
                    f'<circle cx="{x + 11}" cy="{y}" r="4.5" fill="{colour}"/>' if kind == "circle" else
                    f'<rect x="{x + 7}" y="{y - 4}" width="8" height="8" fill="{colour}"/>')
        body.append(f'<text x="{x + 30}" y="{y + 4}" font-size="11">{label}</text>')
    return _svg(W, H, body, f"SDPA attention on one {sweep['device']} ({sweep['date']}) against meshplan's model")


def layer_split_figure(profile: dict) -> str:
    """Per block, two stacked bars (measured, model) of GEMM, attention and other milliseconds."""
    gpu = load_gpu("h200-sxm-141gb")
    cal = calibration_for(gpu)
    model = load_model("llama3-8b")
    cases = (("eager 2x8192", 2, 8192, "eager"), ("compiled 2x8192", 2, 8192, "compiled"), ("compiled 1x32768", 1, 32768, "compiled"))
    bars = []
    for name, b, s, kernels in cases:
        g = profile["cases"][name]["groups_us"]
        measured = {"gemm": g["gemm"] / 1e3, "attention": (g["attention_fwd"] + g["attention_bwd"]) / 1e3, "other": g["other"] / 1e3}
        ops = layer_op_times(model, b, s, 1, 1, False, "flash", "causal", gpu, cal, "bf16", 2, kernels=kernels)
        predicted = {"gemm": 1e3 * (ops.fwd_gemm + ops.bwd_gemm), "attention": 1e3 * (ops.fwd_attention + ops.bwd_attention),
                     "other": 1e3 * (ops.fwd_memory + ops.bwd_memory)}
        bars += [(f"{name}, measured", measured), (f"{name}, model", predicted)]
    W, H, left, right, top = 760, 60 + 34 * len(bars) + 70, 190, 40, 44
    x_max = max(sum(v.values()) for _, v in bars) * 1.08

    def px(ms: float) -> float:
        return left + ms / x_max * (W - left - right)

    body = []
    step = 25 if x_max > 100 else 10
    for t in range(0, int(x_max) + 1, step):
        body.append(f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{top + 34 * len(bars)}" stroke="#e6e6e6"/>')
        body.append(f'<text x="{px(t):.1f}" y="{top + 34 * len(bars) + 16}" text-anchor="middle" font-size="11">{t}</text>')
    body.append(f'<text x="{(left + W - right) / 2:.0f}" y="{top + 34 * len(bars) + 36}" text-anchor="middle" font-size="12">'
                f'milliseconds, forward + backward of one layer</text>')
    for i, (label, parts) in enumerate(bars):
        y = top + 34 * i + 5
        body.append(f'<text x="{left - 8}" y="{y + 16}" text-anchor="end" font-size="12">{label}</text>')
        x = 0.0
        opacity = "" if label.endswith("measured") else ' fill-opacity="0.55"'
        for part in ("gemm", "attention", "other"):
            body.append(f'<rect x="{px(x):.1f}" y="{y}" width="{px(x + parts[part]) - px(x):.1f}" height="22" '
                        f'fill="{COLOURS[part]}"{opacity}/>')
            x += parts[part]
        body.append(f'<text x="{px(x) + 5:.1f}" y="{y + 16}" font-size="11">{x:.1f}</text>')
    for i, part in enumerate(("gemm", "attention", "other")):
        x = left + 140 * i
        y = H - 14
        body.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{COLOURS[part]}"/>')
        body.append(f'<text x="{x + 18}" y="{y}" font-size="12">{LABELS[part]}</text>')
    return _svg(W, H, body, f"torchtitan's Llama 3 8B block in steady state, {profile['device']}: measured and modelled")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "h200-2026-11-28")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sweep = json.loads((args.results / "sweep.json").read_text())
    profile = json.loads((args.results / "profile.json").read_text())
    for name, text in (("gpu-attention.svg", attention_figure(sweep)), ("gpu-layer-split.svg", layer_split_figure(profile))):
        (args.out / name).write_text(text)
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
