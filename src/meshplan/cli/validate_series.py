"""The scaling series of ``meshplan validate`` (:mod:`meshplan.accuracy.series`): one layout
published at several GPU counts, as a rich table, as Markdown, in one line, and as a picture
(``--series-out``): each series' signed step error against its GPU count, one line a series.

A series whose line falls from left to right is one meshplan scales better than was measured:
the error that grows with the GPU count, seen where nothing else changes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional
from xml.sax.saxutils import escape, quoteattr

from rich import box
from rich.table import Table

from meshplan.accuracy.series import SeriesSummary
from meshplan.accuracy.validate import ValidationReport
from meshplan.cli.fit import FitTable
from meshplan.cli.validate_bias import pct
from meshplan.errors import InputError
from meshplan.outfile import out_path, write_text

TITLE = "Scaling series: one layout at several GPU counts"
HEADER = ["series", "GPUs", "runs", "batch", "efficiency published", "efficiency predicted",
          "error at fewest → most GPUs", "drift per doubling"]
EXPLAIN = ("efficiency = throughput per GPU at the most GPUs over that at the fewest; drift = least-squares "
           "slope of the signed error over log2 GPUs (negative: meshplan scales the series better than measured)")


def points(x: Optional[float]) -> str:
    """An error per doubling in percentage points, signed: ``-0.5 pt``."""
    return "—" if x is None else f"{100 * x:+.1f} pt"


def _cells(s: SeriesSummary) -> list[str]:
    return [s.label, f"{s.gpus[0]:,}–{s.gpus[-1]:,}", str(len(s.gpus)), s.kind, f"{s.published_efficiency:.3f}",
            f"{s.predicted_efficiency:.3f}", f"{pct(s.errors[0])} → {pct(s.errors[-1])}", points(s.drift_per_doubling)]


def drift_line(report: ValidationReport) -> str:
    """The drifts of the report's series in one line ('' when it has none)."""
    d = report.drift()
    if not d.series:
        return ""
    return (f"drift of the error per doubling of the GPU count over {d.series} series: mean {points(d.mean)}, "
            f"median {points(d.median)}; {d.fast} of {d.series} drift to the fast side")


def series_table(report: ValidationReport) -> Optional[Table]:
    """The series as a rich table (None when the report has none)."""
    if not report.series:
        return None
    t = FitTable(title=f"{TITLE}\n{EXPLAIN}", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column(HEADER[0], ratio=1)
    for col in HEADER[1:]:
        t.add_column(col, justify="right", no_wrap=col not in ("efficiency published", "efficiency predicted"))
    for s in report.series.values():
        t.add_row(*_cells(s))
    return t


def series_markdown(report: ValidationReport, md_table) -> list[str]:
    """The series as a Markdown section (``md_table(header, rows, right)`` draws a table)."""
    if not report.series:
        return []
    rows = [_cells(s) for s in report.series.values()]
    return (["", f"### {TITLE}", "", EXPLAIN[0].upper() + EXPLAIN[1:] + ".", ""]
            + md_table(HEADER, rows, set(range(1, len(HEADER)))) + ["", drift_line(report) + "."])


# ---- the picture --------------------------------------------------------------------------------


def series_out_path(value: Optional[str]) -> Optional[Path]:
    """``--series-out``: a new .svg file in an existing directory, checked before any work."""
    if value is None:
        return None
    try:
        return out_path(value, (".svg",))
    except InputError as err:
        raise InputError("series-out", err.rule) from None


def _error_range(series: list[SeriesSummary]) -> tuple[float, float]:
    """The y range in whole tens of per cent holding every error and ±10 %."""
    errs = [e for s in series for e in s.errors] + [-0.1, 0.1]
    return math.floor(min(errs) * 10 + 1e-9) / 10, math.ceil(max(errs) * 10 - 1e-9) / 10


def svg_series(report: ValidationReport, palette: tuple[str, ...]) -> str:
    """Each series' signed step error against its GPU count (log₂ axis) as a standalone SVG, one
    polyline a series coloured by its source (the sources drawn take ``palette``'s colours in
    order, dashed once it is used up), a marker per run with its figures as a tooltip, the zero
    line and a ±10 % band."""
    series = list(report.series.values())
    if not series:
        raise InputError("series-out", "no scaling series (one layout at two GPU counts or more) in the selected runs")
    groups = list(dict.fromkeys(s.group for s in series))
    colors = {g: palette[i % len(palette)] for i, g in enumerate(groups)}
    dashes = {g: "" if i < len(palette) else ' stroke-dasharray="6,3"' for i, g in enumerate(groups)}
    k0 = math.floor(math.log2(min(s.gpus[0] for s in series)))
    k1 = max(math.ceil(math.log2(max(s.gpus[-1] for s in series))), k0 + 1)
    e0, e1 = _error_range(series)
    L, T, PW, PH = 80.0, 86.0, 620.0, 420.0
    W, H = L + PW + 290.0, T + PH + 64.0

    def px(n: float) -> float:
        return L + (math.log2(n) - k0) / (k1 - k0) * PW

    def py(e: float) -> float:
        return T + (e1 - e) / (e1 - e0) * PH

    subtitle = f"{report.drift().series} series (one layout, more GPUs); a falling line: meshplan scales it better than measured"
    o = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W:.0f}" height="{H:.0f}" viewBox="0 0 {W:.0f} {H:.0f}" '
        'font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f"<title>{escape(TITLE)}</title>",
        f'<rect x="0" y="0" width="{W:.0f}" height="{H:.0f}" fill="white"/>',
        f'<text x="{L}" y="26" font-size="16" font-weight="bold">meshplan: step-time error along each scaling series</text>',
        f'<text x="{L}" y="46" fill="#444">{escape(subtitle)}</text>',
        f'<text class="drift" x="{L}" y="62" fill="#444">{escape(drift_line(report))}</text>',
        f'<rect class="band" x="{L}" y="{py(0.1):.2f}" width="{PW}" height="{py(-0.1) - py(0.1):.2f}" fill="#999" '
        'fill-opacity="0.2"><title>±10% of the published step time</title></rect>',
    ]
    for k in range(k0, k1 + 1):
        x = px(2 ** k)
        o.append(f'<line class="grid" x1="{x:.2f}" y1="{T}" x2="{x:.2f}" y2="{T + PH}" stroke="#e3e3e3"/>')
        o.append(f'<text x="{x:.2f}" y="{T + PH + 18}" text-anchor="middle">{2 ** k:,}</text>')
    for j in range(round(e0 * 20), round(e1 * 20) + 1):  # every 5 %
        e = j / 20
        y = py(e)
        stroke = "#333" if j == 0 else "#e3e3e3"
        o.append(f'<line class="grid" x1="{L}" y1="{y:.2f}" x2="{L + PW}" y2="{y:.2f}" stroke="{stroke}"/>')
        o.append(f'<text x="{L - 8}" y="{y + 4:.2f}" text-anchor="end">{100 * e:+.0f}%</text>')
    o.append(f'<rect x="{L}" y="{T}" width="{PW}" height="{PH}" fill="none" stroke="#333"/>')
    o.append(f'<text x="{L + PW / 2}" y="{T + PH + 42}" text-anchor="middle">GPUs (log scale)</text>')
    o.append(f'<text x="{L - 52}" y="{T + PH / 2}" text-anchor="middle" transform="rotate(-90 {L - 52} {T + PH / 2})">'
             "step error, (predicted − published) / published</text>")
    for s in series:
        color = colors[s.group]
        pts = " ".join(f"{px(n):.2f},{py(e):.2f}" for n, e in zip(s.gpus, s.errors))
        tip = f"{s.label}: drift {points(s.drift_per_doubling)} per doubling"
        o.append(f'<polyline class="series" data-series={quoteattr(s.label)} points="{pts}" fill="none" '
                 f'stroke="{color}" stroke-width="1.6" stroke-opacity="0.85"{dashes[s.group]}>'
                 f"<title>{escape(tip)}</title></polyline>")
        for run, n, e in zip(s.rows, s.gpus, s.errors):
            o.append(f'<circle class="point" data-run={quoteattr(run)} cx="{px(n):.2f}" cy="{py(e):.2f}" r="3.2" '
                     f'fill="{color}" stroke="#222" stroke-width="0.5"><title>{escape(f"{run}: {n:,} GPUs, error {pct(e)}")}'
                     "</title></circle>")
    lx, ly = L + PW + 24, T + 10
    o.append(f'<text x="{lx}" y="{ly}" font-weight="bold">source (series)</text>')
    for i, g in enumerate(groups):
        y = ly + 22 * (i + 1)
        o.append(f'<line x1="{lx}" y1="{y - 4}" x2="{lx + 14}" y2="{y - 4}" stroke="{colors[g]}" stroke-width="2.5"{dashes[g]}/>')
        o.append(f'<text x="{lx + 20}" y="{y}">{escape(f"{g} ({sum(s.group == g for s in series)})")}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def write_series_plot(report: ValidationReport, path: Path, palette: tuple[str, ...]) -> None:
    write_text(path, svg_series(report, palette))


__all__ = ["drift_line", "series_markdown", "series_out_path", "series_table", "svg_series", "write_series_plot"]
