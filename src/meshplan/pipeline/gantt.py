"""Gantt pictures of a simulated pipeline step: what every rank does when.

Input is a :class:`~meshplan.pipeline.simulate.SimResult` run with ``keep_timeline=True``:
``timeline[r]`` lists rank r's actions with their start and end times. Three renderings:

* :func:`text_gantt`: one plain row per rank, ``width`` characters. Column c covers the time
  slice [c·T/w, (c+1)·T/w) of the makespan T and shows the action running at the slice's middle
  (so an action of duration d gets about d·w/T columns; one shorter than a column may not show;
  a ``span`` ≥ T can be given instead of T: :func:`round_columns` picks one so that a column is
  a round time). :func:`text_axis` is the ruler to print under the rows.
  A block starts with its kind letter and micro-batch id (``F3``, ``B3``, ``I3``, ``W3``), padded
  with spaces; a block too narrow for its label is filled with the kind letter. Idle is ``·``.
* :func:`rich_gantt`: the same rows as rich ``Text`` with a background colour per kind (forward
  blue, backward green, I (input gradient) teal, W (weight gradient) orange, any other kind
  purple/red/grey), lighter for later virtual-stage chunks (chunk c = stage // p holds virtual
  stage r + c·p on rank r); idle dim.
* :func:`svg_gantt`: a standalone SVG: one lane per rank (the grey lane shows through where the
  rank is idle), one rectangle per action coloured the same way, with its label inside when it
  fits (``F3``, or just the micro-batch ``3`` when narrow) and a tooltip in torch notation
  (``5F3``: stage 5, forward, micro-batch 3); a time axis with ticks in the duration unit; a
  legend; and a caption with the makespan T, the bubble fraction (idle share of the step,
  Σ idle / (p·T)) and the bubble overhead (idle relative to busy time, Σ idle / Σ busy).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from itertools import groupby
from xml.sax.saxutils import escape, quoteattr

from rich.text import Text

from meshplan.pipeline.simulate import SimResult

IDLE = "·"
KIND_NAMES = {"F": "forward", "B": "backward", "I": "input gradient (I)", "W": "weight gradient (W)"}
_BASE = {"F": "#2f6fd0", "B": "#2ca02c", "I": "#138d90", "W": "#e67e22"}
_OTHER = ("#8e5cc4", "#c4456b", "#6f6f6f")


def _timeline(result: SimResult):
    if result.timeline is None:
        raise ValueError("the Gantt needs a simulation run with keep_timeline=True")
    return result.timeline


def n_chunks(result: SimResult) -> int:
    """Virtual stages per rank (v): number of stages in the timeline / number of ranks."""
    tl = _timeline(result)
    stages = [a.stage for row in tl for a, _, _ in row]
    return max(1, math.ceil((max(stages) + 1) / len(tl))) if stages else 1


def kind_color(kind: str, chunk: int = 0, chunks: int = 1, spread: float = 0.55) -> str:
    """Hex colour of an action: the kind's base colour, mixed with white by up to ``spread`` for
    later chunks (the terminal uses 0.25, which 16-colour terminals still show in the kind's hue)."""
    base = _BASE.get(kind, _OTHER[ord(kind[0]) % len(_OTHER)] if kind else _OTHER[-1])
    t = spread * chunk / (chunks - 1) if chunks > 1 else 0.0
    rgb = [int(base[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * t):02x}" for c in rgb)


def _ink(color: str) -> str:
    """Black or white text, whichever reads better on ``color`` (relative luminance)."""
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "#000000" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.55 else "#ffffff"


def gantt_cells(result: SimResult, width: int = 100, span: float | None = None) -> list[list[int]]:
    """Per rank, per column: the index into ``timeline[rank]`` of the action at the column's middle,
    or −1. The ``width`` columns cover [0, span) (default: the makespan)."""
    if width < 1:
        raise ValueError("width must be at least 1")
    tl = _timeline(result)
    span = result.makespan if span is None else span
    rows = []
    for row in tl:
        starts = [s for _, s, _ in row]
        cells = []
        for c in range(width):
            t = (c + 0.5) * span / width
            i = bisect_right(starts, t) - 1
            cells.append(i if i >= 0 and row[i][1] <= t < row[i][2] else -1)
        rows.append(cells)
    return rows


def _runs(cells: list[int]) -> list[tuple[int, int]]:
    """(action index or −1, length) for each run of equal cells."""
    return [(cell, len(list(same))) for cell, same in groupby(cells)]


def _block(kind: str, mb: int, n: int) -> str:
    label = f"{kind}{mb}"
    return label.ljust(n) if len(label) <= n else kind[:1] * n


def text_gantt(result: SimResult, width: int = 100, span: float | None = None) -> list[str]:
    """One plain row of exactly ``width`` characters per rank (see the module docstring)."""
    tl = _timeline(result)
    out = []
    for row, cells in zip(tl, gantt_cells(result, width, span)):
        out.append("".join(IDLE * n if i < 0 else _block(row[i][0].kind, row[i][0].microbatch, n)
                           for i, n in _runs(cells)))
    return out


def rich_gantt(result: SimResult, width: int = 100, span: float | None = None) -> list[Text]:
    """The rows of :func:`text_gantt` as rich ``Text``, coloured by kind and chunk, idle dim."""
    tl, v = _timeline(result), n_chunks(result)
    p = len(tl)
    out = []
    for row, cells in zip(tl, gantt_cells(result, width, span)):
        text = Text()
        for i, n in _runs(cells):
            if i < 0:
                text.append(IDLE * n, style="dim")
                continue
            a = row[i][0]
            bg = kind_color(a.kind, a.stage // p, v, spread=0.25)
            text.append(_block(a.kind, a.microbatch, n), style=f"{_ink(bg)} on {bg}")
        out.append(text)
    return out


def nice_step(span: float, target: int = 10) -> float:
    """A tick step of 1, 2 or 5 × 10^k giving about ``target`` ticks over ``span``."""
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    return next(k * mag for k in (1, 2, 5, 10) if k * mag >= raw * (1 - 1e-9))


def fmt_time(t: float) -> str:
    return f"{round(t, 9):g}"


def round_columns(span: float, most: int) -> tuple[int, float]:
    """Default Gantt width and the time it covers: the fewest columns ≤ ``most`` whose width is a
    round time (1, 2, 2.5 or 5 × 10^k units), so blocks of round durations get whole columns."""
    k = math.floor(math.log10(span / most))
    for mag in (10.0 ** k, 10.0 ** (k + 1)):
        for step in (mag, 2 * mag, 2.5 * mag, 5 * mag):
            cols = max(1, math.ceil(span / step - 1e-9))
            if cols <= most:
                return cols, cols * step
    return most, span


def text_axis(span: float, width: int, pad: int, unit: str) -> str:
    """A ruler under the Gantt: the unit in the label column, then tick labels at 1-2-5 steps,
    placed where they do not collide and end at most 4 characters past the last column."""
    line = [" "] * (width + 4)
    step = nice_step(span, max(2, width // 12))
    k = 0
    while k * step <= span * (1 + 1e-9):
        col = min(width - 1, round(k * step / span * width))
        label = fmt_time(k * step)
        if col + len(label) <= len(line) and all(ch == " " for ch in line[max(0, col - 1):col + len(label) + 1]):
            line[col:col + len(label)] = label
        k += 1
    return (unit if len(unit) < pad else "").ljust(pad) + "".join(line).rstrip()


def caption(result: SimResult, unit: str = "ms") -> str:
    """Makespan, bubble fraction (idle share of the step) and bubble overhead (idle / busy)."""
    return (f"makespan {fmt_time(result.makespan)} {unit} · bubble fraction {result.bubble_fraction:.3f} "
            f"(idle share of the step) · bubble overhead {result.bubble_overhead:.3f} (idle / busy)")


def svg_gantt(result: SimResult, title: str, unit: str = "ms", plot_width: int = 900) -> str:
    """A standalone SVG Gantt chart of the step (see the module docstring for what is drawn)."""
    tl, v, span = _timeline(result), n_chunks(result), result.makespan
    p = len(tl)
    left, right, lane_h, gap, y0 = 70, 24, 26, 6, 64
    scale = plot_width / span if span > 0 else 0.0
    total_w = left + plot_width + right
    out: list[str] = []
    add = out.append

    def txt(x: float, y: float, s: str, **attrs: str) -> None:
        extra = "".join(f" {k.replace('_', '-')}={quoteattr(val)}" for k, val in attrs.items())
        add(f'<text x="{x:.2f}" y="{y:.2f}"{extra}>{escape(s)}</text>')

    txt(left, 22, title, font_size="15", font_weight="bold")
    txt(left, 42, caption(result, unit), font_size="12", fill="#333333")
    for r, row in enumerate(tl):
        y = y0 + r * (lane_h + gap)
        txt(left - 8, y + lane_h / 2 + 4, f"rank {r}", font_size="12", text_anchor="end")
        add(f'<rect class="lane" x="{left}" y="{y}" width="{plot_width}" height="{lane_h}" fill="#ececec"/>')
        for a, s, e in row:
            x, w = left + s * scale, (e - s) * scale
            fill = kind_color(a.kind, a.stage // p, v)
            tip = (f"{a} · stage {a.stage}, {KIND_NAMES.get(a.kind, a.kind)}, micro-batch {a.microbatch} · "
                   f"{fmt_time(s)}–{fmt_time(e)} {unit}")
            add(f'<rect class="action" x="{x:.3f}" y="{y}" width="{w:.3f}" height="{lane_h}" fill="{fill}" '
                f'stroke="#ffffff" stroke-width="0.6"><title>{escape(tip)}</title></rect>')
            label = next((t for t in (f"{a.kind}{a.microbatch}", str(a.microbatch)) if len(t) * 6.6 + 4 <= w), "")
            if label:
                txt(x + w / 2, y + lane_h / 2 + 4, label, font_size="11", text_anchor="middle", fill=_ink(fill))
    # time axis
    ya = y0 + p * (lane_h + gap)
    add(f'<line x1="{left}" y1="{ya}" x2="{left + plot_width}" y2="{ya}" stroke="#333333"/>')
    step = nice_step(span)
    for k in range(int(span / step * (1 + 1e-9)) + 1 if span > 0 else 1):
        t = k * step
        x = left + t * scale
        add(f'<line x1="{x:.2f}" y1="{ya}" x2="{x:.2f}" y2="{ya + 5}" stroke="#333333"/>')
        txt(x, ya + 18, fmt_time(t), font_size="11", text_anchor="middle")
    txt(left + plot_width / 2, ya + 36, f"time ({unit})", font_size="12", text_anchor="middle")
    # legend: one row per kind present, one swatch per chunk
    kinds = sorted({a.kind for row in tl for a, _, _ in row}, key=lambda k: ("FBIW".find(k) % 5, k))
    yl = ya + 54
    for i, kind in enumerate(kinds):
        y = yl + i * 20
        for c in range(v):
            add(f'<rect class="swatch" x="{left + c * 18}" y="{y}" width="14" height="14" '
                f'fill="{kind_color(kind, c, v)}"/>')
        name = f"{kind}: {KIND_NAMES.get(kind, kind)}"
        if v > 1:
            name += f" (chunks 0–{v - 1}, lighter = later chunk; chunk c on rank r is virtual stage r + c·p)"
        txt(left + v * 18 + 6, y + 11, name, font_size="12")
    iy = yl + len(kinds) * 20
    add(f'<rect class="swatch" x="{left}" y="{iy}" width="14" height="14" fill="#ececec"/>')
    txt(left + 24, iy + 11, "idle (bubble)", font_size="12")
    height = iy + 28
    head = (f'<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" '
            f'width="{total_w}" height="{height}" viewBox="0 0 {total_w} {height}" '
            f'font-family="Helvetica, Arial, sans-serif">\n<title>{escape(title)}</title>\n'
            f'<rect width="{total_w}" height="{height}" fill="#ffffff"/>')
    return "\n".join([head, *out, "</svg>"]) + "\n"


__all__ = [
    "text_gantt", "rich_gantt", "svg_gantt", "gantt_cells", "kind_color", "caption", "nice_step", "n_chunks",
    "round_columns", "text_axis",
]
