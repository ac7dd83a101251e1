"""A tornado chart of a sensitivity (:mod:`meshplan.sensitivity`) as a standalone SVG.

One row per parameter, the largest elasticity on top: a horizontal bar from the baseline step
time to the step at the parameter's lower value (x·(1 − δ), or the fewer GPUs) and one to the step
at its higher value, on a common time axis with the baseline as a vertical line; the elasticity
is written at the right of each row. Written without dependencies (``--out FILE.svg`` through
:func:`meshplan.outfile.write_text`).
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from meshplan.pipeline.gantt import fmt_time, nice_step
from meshplan.sensitivity import DELTA, Elasticity, e_words

LOWER, HIGHER = "#4c78a8", "#f58518"


def _bounds(rows: list[Elasticity], step_s: float) -> tuple[float, float]:
    """The time axis: every step of the chart and the baseline, with a little room each side."""
    ts = [step_s] + [t for r in rows for t in (r.step_s_minus, r.step_s_plus) if t is not None]
    lo, hi = min(ts), max(ts)
    pad = 0.05 * (hi - lo) or 0.05 * step_s
    return lo - pad, hi + pad


def _side_words(r: Elasticity, lower: bool) -> str:
    if r.parameter == "gpus":
        n = r.gpus_minus if lower else r.gpus_plus
        return "no valid count" if n is None else f"{n:,} GPUs"
    return f"x{r.factor_minus if lower else r.factor_plus:g}"


def svg_tornado(rows: list[Elasticity], step_s: float, title: str, delta: float = DELTA, plot_width: int = 560) -> str:
    """The chart of ``rows`` (as :func:`meshplan.sensitivity.sensitivity` orders them) around the
    baseline step ``step_s`` (module docstring)."""
    left, right, row_h, y0 = 250, 260, 30, 76
    lo, hi = _bounds(rows, step_s)
    px = lambda t: left + (t - lo) / (hi - lo) * plot_width  # noqa: E731
    out: list[str] = []
    add = out.append

    def txt(x: float, y: float, s: str, size: int = 12, anchor: str = "start", extra: str = "") -> None:
        add(f'<text x="{x:.2f}" y="{y:.2f}" font-size="{size}" text-anchor="{anchor}"{extra}>{escape(s)}</text>')

    txt(20, 24, title, 15, extra=' font-weight="bold"')
    txt(20, 42, f"bars: the step at the lower and the higher value of each parameter, from the baseline's "
                f"{fmt_time(round(step_s, 4))} s", 11, extra=' fill="#333333"')
    txt(20, 56, f"e = d ln(step) / d ln(x), central difference at x·(1 ± {delta:g}); GPU count: the nearest valid counts, "
                "same global batch", 11, extra=' fill="#333333"')
    for i, r in enumerate(rows):
        y = y0 + i * row_h
        txt(left - 10, y + row_h / 2 + 4, r.label, anchor="end")
        for t, color, lower in ((r.step_s_minus, LOWER, True), (r.step_s_plus, HIGHER, False)):
            if t is None:
                continue
            x0, x1 = sorted((px(step_s), px(t)))
            tip = f"{r.label} at {_side_words(r, lower)}: step {t:.4f} s ({100 * (t / step_s - 1):+.2f} %)"
            add(f'<rect class="bar" x="{x0:.2f}" y="{y + 5}" width="{max(x1 - x0, 0.5):.2f}" height="{row_h - 10}" '
                f'fill="{color}"><title>{escape(tip)}</title></rect>')
        e = "no valid change" if r.elasticity is None else f"e = {e_words(r.elasticity)}"
        if r.parameter == "gpus":  # its points are not x·(1 ± δ): say which counts they are
            e += f" ({_side_words(r, True)} / {_side_words(r, False)})"
        txt(left + plot_width + 10, y + row_h / 2 + 4, e)
    ya = y0 + len(rows) * row_h + 6
    add(f'<line x1="{px(step_s):.2f}" y1="{y0 - 4}" x2="{px(step_s):.2f}" y2="{ya}" stroke="#222222" stroke-dasharray="4 3"/>')
    add(f'<line x1="{left}" y1="{ya}" x2="{left + plot_width}" y2="{ya}" stroke="#333333"/>')
    tick = nice_step(hi - lo, 8)
    k = int(lo // tick) + 1
    while k * tick <= hi:
        x = px(k * tick)
        add(f'<line x1="{x:.2f}" y1="{ya}" x2="{x:.2f}" y2="{ya + 5}" stroke="#333333"/>')
        txt(x, ya + 18, fmt_time(k * tick), 11, "middle")
        k += 1
    txt(left + plot_width / 2, ya + 36, "step time (s); dashed: the baseline", 12, "middle")
    yl = ya + 52
    for j, (color, words) in enumerate(((LOWER, f"parameter x{1 - delta:g} (GPU count: fewer)"),
                                        (HIGHER, f"parameter x{1 + delta:g} (GPU count: more)"))):
        add(f'<rect class="swatch" x="{left + j * 260}" y="{yl}" width="14" height="14" fill="{color}"/>')
        txt(left + j * 260 + 20, yl + 11, words)
    width, height = left + plot_width + right, yl + 30
    head = (f'<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif">\n'
            f'<title>{escape(title)}</title>\n<rect width="{width}" height="{height}" fill="#ffffff"/>')
    return "\n".join([head, *out, "</svg>"]) + "\n"


__all__ = ["svg_tornado"]
