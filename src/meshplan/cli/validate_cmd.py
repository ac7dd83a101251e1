"""``meshplan validate``: meshplan against published training runs.

Every run of the ground truth (``catalog/data/published_runs.yaml``) is mapped to a plan and
predicted with the same ``estimate``, catalog and calibration as ``meshplan estimate``
(:func:`meshplan.accuracy.validate_runs`); this module only presents the report:

* per run: id, source, GPU × count, published vs predicted step time and the signed error, and
  peak memory (published vs predicted GiB, error) where the source publishes it;
* runs meshplan cannot express, each with its reason (never skipped silently);
* MAPE of step time per source and overall, with the signed mean error (bias), and memory MAPE;
* the rows with the largest |error|, with what their mapping says is not modelled.

Errors are ``(predicted − published) / published``: negative means meshplan predicts a faster step
(or less memory) than was measured. MAPE is the mean of ``|error|``.

Outputs: rich tables (default), ``--json`` (``ValidationReport.to_dict()``, nothing else on
stdout), ``--markdown`` (tables for the docs), and ``--out`` a predicted-vs-published scatter on
log–log axes with the y = x line and a ±10 % band: ``.svg`` written here without dependencies (one
marker per run, with a ``<title>`` tooltip naming it), ``.png`` with matplotlib (the ``plot``
extra, imported only then). Beside the sources, the signed bias per scale bucket, GPU generation
and stack (:mod:`meshplan.cli.validate_bias`), and the scaling series, one layout at several GPU
counts, with ``--series-out`` their picture (:mod:`meshplan.cli.validate_series`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional
from xml.sax.saxutils import escape, quoteattr

import typer
from rich import box
from rich.table import Table

from meshplan.accuracy import RUN_SETS, published_runs, runs_of, validate_runs
from meshplan.accuracy.heldout import HELDOUT_SOURCES
from meshplan.accuracy.mapping import _mappers, group_of
from meshplan.accuracy.validate import GroupSummary, RunResult, ValidationReport
from meshplan.cli import render
from meshplan.cli.fit import FitTable
from meshplan.outfile import write_text
from meshplan.accuracy.coverage import coverage
from meshplan.accuracy.interval import LEVEL, check_level, residuals_json, residuals_of
from meshplan.cli.validate_bias import breakdown_markdown, breakdown_tables, bucket_line, coverage_lines, pct as _pct
from meshplan.cli.pipeline_cmd import _out_path
from meshplan.cli.validate_series import drift_line, series_markdown, series_out_path, series_table, write_series_plot
from meshplan.errors import InputError
from meshplan.pyplot import pyplot, save_figure

BAND = 0.10  # the shaded band around y = x in the scatter: ±10 %
#: one colour and one marker shape per source group, in the ground truth's order
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
SHAPES = ("circle", "square", "triangle", "diamond", "triangle-down", "plus", "star", "hexagon", "cross")
MPL_MARKERS = {"circle": "o", "square": "s", "triangle": "^", "diamond": "D", "triangle-down": "v",
               "plus": "P", "star": "*", "hexagon": "h", "cross": "X"}


# ---- inputs -------------------------------------------------------------------------------------


def mapped_sources() -> list[str]:
    """The source groups the accuracy mappers know, in the ground truth's order, then the
    held-out sources (cheap: no file is read, so ``--help`` can list them)."""
    return [group for _, group, _ in _mappers()] + list(HELDOUT_SOURCES)


def source_names() -> list[str]:
    """What ``--source`` accepts: the mappers' groups, then the group of any ground-truth run no
    mapper knows (``other``)."""
    names = mapped_sources()
    for raw in published_runs():
        g = group_of(raw["id"])
        if g not in names:
            names.append(g)
    return names


def parse_sources(values: Optional[list[str]]) -> Optional[list[str]]:
    """``--source`` values (repeatable, or comma lists) → group names; None when not given."""
    if not values:
        return None
    valid = source_names()
    chosen: list[str] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if not name:
                raise InputError("source", f"empty source name in '{value}' (valid: {', '.join(valid)})")
            match = next((v for v in valid if v.lower() == name.lower()), None)
            if match is None:
                raise InputError("source", f"unknown source '{name}' (valid: {', '.join(valid)})")
            if match not in chosen:
                chosen.append(match)
    return chosen


def build_report(sources: Optional[list[str]] = None, run_set: str = "visible") -> ValidationReport:
    """The validation report over the runs of ``run_set``, or of its runs from ``sources``."""
    if sources is None:
        return validate_runs(run_set=run_set)
    return validate_runs([r for r in runs_of(run_set) if r.group in sources], run_set=run_set)


# ---- formatting ---------------------------------------------------------------------------------


def _num(x: Optional[float], fmt: str = ",.3f") -> str:
    return "—" if x is None else format(x, fmt)


def _gpus(r: RunResult) -> str:
    return f"{r.gpu} × {r.gpus:,}" if r.gpus else r.gpu


def _sources(report: ValidationReport) -> dict[str, str]:
    """group → the source's name as the mapping gives it."""
    names: dict[str, str] = {}
    for r in report.rows:
        names.setdefault(r.group, r.source)
    return names


def not_modelled(r: RunResult) -> list[str]:
    """The assumptions of a row that name something meshplan does not model."""
    return [a for a in r.assumptions if "not modelled" in a or "not modeled" in a]


def _headline(report: ValidationReport) -> list[str]:
    ov = report.overall
    n_src = len(report.groups)
    return [
        f"meshplan vs published training runs ({report.run_set} set): {ov.rows} rows from {n_src} "
        f"source{'s' if n_src != 1 else ''}, {ov.supported} predicted, {ov.rows - ov.supported} unsupported",
        "error = (predicted − published) / published; negative: meshplan predicts a faster step (or less memory) "
        "than was measured. MAPE = mean |error|.",
    ]


# ---- rich tables --------------------------------------------------------------------------------


def runs_table(report: ValidationReport) -> Table:
    # narrower than the table, it prints as three: the runs' sources and GPUs, the step times, the memory
    t = FitTable(title="Step time and peak memory per run (memory in GiB, 2^30 bytes)", box=box.SIMPLE_HEAD, title_justify="left",
                 breaks=(1, 3, 6))
    t.add_column("run", no_wrap=True)
    t.add_column("source", no_wrap=True)
    t.add_column("GPU × count")
    for col in ("published\nstep (s)", "predicted\nstep (s)", "step\nerror", "published\nmemory", "predicted\nmemory", "memory\nerror"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in report.supported():
        style = "red" if r.error is not None and abs(r.error) > 0.20 else None
        mem = _num(r.predicted_mem_gib, ".1f") + ("*" if r.fits is False else "")
        t.add_row(r.id, r.group, _gpus(r), _num(r.published_step_s), _num(r.predicted_step_s), _pct(r.error),
                  _num(r.published_mem_gib, ".1f"), mem, _pct(r.mem_error), style=style)
    return t


def summary_table(report: ValidationReport) -> Table:
    names = _sources(report)
    t = FitTable(title="MAPE per source (step time over the predicted rows; bias = mean signed error)",
                 box=box.SIMPLE_HEAD, title_justify="left", breaks=(1, 2))  # the publications apart from the figures
    t.add_column("source")
    t.add_column("publication", overflow="fold")
    for col in ("rows", "predicted", "step MAPE", "bias", "max |error|", "mem rows", "mem MAPE"):
        t.add_column(col, justify="right")
    for g in list(report.groups.values()) + [report.overall]:
        bold = "bold" if g is report.overall else None
        t.add_row(g.group, "" if g is report.overall else names.get(g.group, ""), str(g.rows), str(g.supported),
                  _pct(g.mape, False), _pct(g.bias), _pct(g.max_abs_error, False), str(g.mem_rows),
                  _pct(g.mem_mape, False), style=bold)
    return t


def _precision_rows(report: ValidationReport) -> list[list[str]]:
    """The cells of the precision table: every compute precision over all rows, then each source
    that ran several (label, predicted rows, step MAPE, bias, max |error|)."""
    labelled = [(f"all {p}", g) for p, g in report.precisions.items()]
    labelled += [(key.replace("/", " "), g) for key, g in report.source_precisions.items()]
    return [[label, str(g.supported), _pct(g.mape, False), _pct(g.bias), _pct(g.max_abs_error, False)]
            for label, g in labelled]


PRECISION_TITLE = "MAPE by compute precision (all rows, then each source that ran more than one)"


def precision_table(report: ValidationReport) -> Table:
    t = FitTable(title=PRECISION_TITLE, box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("rows of")
    for col in ("predicted", "step MAPE", "bias", "max |error|"):
        t.add_column(col, justify="right")
    for cells in _precision_rows(report):
        t.add_row(*cells)
    return t


def print_human(report: ValidationReport, wrote: list[Path], cov: dict) -> None:
    out = render.console(180)
    for line in _headline(report):
        out.print(line, markup=False)
    out.print()
    if report.supported():
        out.print(runs_table(report))
        if any(r.fits is False for r in report.supported()):
            out.print("* meshplan's predicted peak exceeds the GPU's memory (its plan would not fit by meshplan's count)", markup=False)
        out.print("red: |step error| above 20%", markup=False)
        out.print()
    unsupported = report.unsupported()
    if unsupported:
        out.print(f"Unsupported runs, not predicted ({len(unsupported)}):", markup=False)
        for r in unsupported:
            out.print(f"  {r.id} ({r.group}): {r.reason}", markup=False)
        out.print()
    out.print(summary_table(report))
    if len(report.precisions) > 1:
        out.print(precision_table(report))
    for table in breakdown_tables(report):
        out.print(table)
    series = series_table(report)
    if series is not None:
        out.print(series)
        out.print(drift_line(report), markup=False)
        out.print()
    for line in coverage_lines(cov):
        out.print(line, markup=False)
    if report.worst:
        out.print()
        out.print("Largest step-time errors:", markup=False)
        for r in report.worst:
            out.print(f"  {r.id} ({r.group}): {_pct(r.error)} (published {r.published_step_s:,.3f} s, "
                      f"predicted {r.predicted_step_s:,.3f} s)", markup=False)
            for note in not_modelled(r):
                out.print(f"    - {note}", markup=False)
    if report.worst:
        out.print()
        out.print(f"One run in full, with its assumptions: meshplan estimate --preset {report.worst[0].id} "
                  "(any run id above; explain and search take it too)", markup=False)
    for path in wrote:
        out.print()
        out.print(f"wrote {path}", markup=False)


# ---- Markdown -----------------------------------------------------------------------------------


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return lines


def markdown(report: ValidationReport, cov: Optional[dict] = None) -> str:
    """The report as Markdown: per-run table, MAPE per source, largest errors, unsupported runs."""
    names = _sources(report)
    head = _headline(report)
    lines = [head[0] + ".", "", head[1], "", "### Step time and peak memory per run", ""]
    rows = []
    for r in report.supported():
        mem = _num(r.predicted_mem_gib, ".1f") + (" (does not fit)" if r.fits is False else "")
        rows.append([f"`{r.id}`", r.group, _gpus(r), _num(r.published_step_s), _num(r.predicted_step_s), _pct(r.error),
                     _num(r.published_mem_gib, ".1f"), mem, _pct(r.mem_error)])
    lines += _md_table(["run", "source", "GPU × count", "published step (s)", "predicted step (s)", "error",
                        "published memory (GiB)", "predicted memory (GiB)", "memory error"], rows, {3, 4, 5, 6, 7, 8})
    lines += ["", "### MAPE per source", "",
              "Step-time MAPE over the predicted rows of each source; bias = mean signed error; memory MAPE over the "
              "rows that publish a peak.", ""]
    rows = []
    for g in list(report.groups.values()) + [report.overall]:
        label = "**overall**" if g is report.overall else g.group
        rows.append([label, "" if g is report.overall else names.get(g.group, ""), str(g.rows), str(g.supported),
                     _pct(g.mape, False), _pct(g.bias), _pct(g.max_abs_error, False), str(g.mem_rows),
                     _pct(g.mem_mape, False)])
    lines += _md_table(["source", "publication", "rows", "predicted", "step MAPE", "bias", "max \\|error\\|",
                        "memory rows", "memory MAPE"], rows, {2, 3, 4, 5, 6, 7, 8})
    if len(report.precisions) > 1:
        lines += ["", f"### {PRECISION_TITLE}", ""]
        lines += _md_table(["rows of", "predicted", "step MAPE", "bias", "max \\|error\\|"], _precision_rows(report), {1, 2, 3, 4})
    lines += breakdown_markdown(report, _md_table)
    lines += series_markdown(report, _md_table)
    if cov is not None:
        head, *methods = coverage_lines(cov)
        lines += ["", "### Prediction interval coverage", "", _md(head), ""] + [f"- {_md(m.strip())}" for m in methods]
    if report.worst:
        lines += ["", "### Largest step-time errors", ""]
        for r in report.worst:
            notes = "; ".join(not_modelled(r))
            lines.append(f"- `{r.id}` ({r.group}): {_pct(r.error)}" + (f"; the mapping notes: {_md(notes)}" if notes else ""))
    unsupported = report.unsupported()
    lines += ["", "### Unsupported runs", ""]
    if unsupported:
        lines += [f"- `{r.id}` ({r.group}): {_md(r.reason)}" for r in unsupported]
    else:
        lines.append("None.")
    return "\n".join(lines)


# ---- scatter plot -------------------------------------------------------------------------------


def plot_points(report: ValidationReport) -> list[RunResult]:
    """The rows the scatter draws: predicted, with a published step time."""
    return [r for r in report.supported() if r.published_step_s and r.predicted_step_s]


def _styles(report: ValidationReport) -> dict[str, tuple[str, str]]:
    """group → (colour, marker shape), stable across filters (by position in the ground truth)."""
    order = source_names()
    groups = list(report.groups)
    out = {}
    for g in groups:
        i = order.index(g) if g in order else len(order) + groups.index(g)
        out[g] = (COLORS[i % len(COLORS)], SHAPES[i % len(SHAPES)])
    return out


def _decades(points: list[RunResult]) -> tuple[float, float]:
    vals = [v for r in points for v in (r.published_step_s, r.predicted_step_s)]
    lo = math.floor(math.log10(min(vals)))
    hi = math.ceil(math.log10(max(vals)))
    if hi <= lo:
        hi = lo + 1
    return 10.0 ** lo, 10.0 ** hi


def _title(report: ValidationReport, n: int) -> tuple[str, str, str]:
    """(title, subtitle, the bias per scale bucket)."""
    ov = report.overall
    return ("meshplan: predicted vs published step time",
            f"{n} runs; step MAPE {_pct(ov.mape, False)}, bias {_pct(ov.bias)}; line y = x, band ±{100 * BAND:g}%",
            bucket_line(report))


def _legend_label(g: GroupSummary) -> str:
    return f"{g.group} ({g.supported}, MAPE {_pct(g.mape, False)})"


def _marker_svg(shape: str, x: float, y: float, r: float) -> tuple[str, str]:
    """(tag, geometry attributes) of one marker centred at (x, y)."""
    if shape == "circle":
        return "circle", f'cx="{x:.2f}" cy="{y:.2f}" r="{r:.2f}"'
    if shape == "square":
        d = f"M{x - r:.2f},{y - r:.2f}h{2 * r:.2f}v{2 * r:.2f}h{-2 * r:.2f}z"
    elif shape in ("triangle", "triangle-down"):
        s = 1 if shape == "triangle" else -1
        d = f"M{x:.2f},{y - s * 1.2 * r:.2f}L{x + 1.1 * r:.2f},{y + s * 0.8 * r:.2f}L{x - 1.1 * r:.2f},{y + s * 0.8 * r:.2f}z"
    elif shape == "diamond":
        d = f"M{x:.2f},{y - 1.3 * r:.2f}L{x + r:.2f},{y:.2f}L{x:.2f},{y + 1.3 * r:.2f}L{x - r:.2f},{y:.2f}z"
    elif shape in ("plus", "cross"):
        w, a = 0.4 * r, 1.2 * r
        pts = [(-w, -a), (w, -a), (w, -w), (a, -w), (a, w), (w, w), (w, a), (-w, a), (-w, w), (-a, w), (-a, -w), (-w, -w)]
        if shape == "cross":
            c = math.sqrt(0.5)
            pts = [((px - py) * c, (px + py) * c) for px, py in pts]
        d = "M" + "L".join(f"{x + px:.2f},{y + py:.2f}" for px, py in pts) + "z"
    elif shape == "star":
        pts = [(x + (1.4 * r if k % 2 == 0 else 0.6 * r) * math.sin(k * math.pi / 5),
                y - (1.4 * r if k % 2 == 0 else 0.6 * r) * math.cos(k * math.pi / 5)) for k in range(10)]
        d = "M" + "L".join(f"{px:.2f},{py:.2f}" for px, py in pts) + "z"
    else:  # hexagon
        pts = [(x + 1.15 * r * math.sin(k * math.pi / 3), y - 1.15 * r * math.cos(k * math.pi / 3)) for k in range(6)]
        d = "M" + "L".join(f"{px:.2f},{py:.2f}" for px, py in pts) + "z"
    return "path", f'd="{d}"'


def svg_scatter(report: ValidationReport) -> str:
    """Predicted vs published step time as a standalone SVG (log–log, one marker per run)."""
    points, styles = plot_points(report), _styles(report)
    lo, hi = _decades(points)
    L, T, S = 90.0, 80.0, 520.0  # plot area: left, top, side (square, so y = x is the diagonal)
    W, H, span = L + S + 300.0, T + S + 70.0, math.log10(hi) - math.log10(lo)

    def px(v: float) -> float:
        return L + (math.log10(v) - math.log10(lo)) / span * S

    def py(v: float) -> float:
        return T + S - (math.log10(v) - math.log10(lo)) / span * S

    title, subtitle, buckets = _title(report, len(points))
    o = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W:.0f}" height="{H:.0f}" viewBox="0 0 {W:.0f} {H:.0f}" '
        'font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<defs><clipPath id="plot-area"><rect x="{L}" y="{T}" width="{S}" height="{S}"/></clipPath></defs>',
        f'<rect x="0" y="0" width="{W:.0f}" height="{H:.0f}" fill="white"/>',
        f'<text x="{L}" y="26" font-size="16" font-weight="bold">{escape(title)}</text>',
        f'<text x="{L}" y="46" fill="#444">{escape(subtitle)}</text>',
        f'<text class="bias" x="{L}" y="62" fill="#444">{escape(buckets)}</text>',
        f'<rect x="{L}" y="{T}" width="{S}" height="{S}" fill="none" stroke="#333"/>',
    ]
    # grid and ticks: a labelled line per decade, light lines at 2..9
    k0, k1 = round(math.log10(lo)), round(math.log10(hi))
    for k in range(k0, k1 + 1):
        for m in range(1, 10):
            v = m * 10.0 ** k
            if v < lo * (1 - 1e-9) or v > hi * (1 + 1e-9):
                continue
            major = m == 1
            color, width = ("#bbb", 0.8) if major else ("#e6e6e6", 0.6)
            x, y = px(v), py(v)
            o.append(f'<line class="grid" x1="{x:.2f}" y1="{T}" x2="{x:.2f}" y2="{T + S}" stroke="{color}" stroke-width="{width}"/>')
            o.append(f'<line class="grid" x1="{L}" y1="{y:.2f}" x2="{L + S}" y2="{y:.2f}" stroke="{color}" stroke-width="{width}"/>')
            if major:
                label = escape(f"{v:g}")
                o.append(f'<text x="{x:.2f}" y="{T + S + 18}" text-anchor="middle">{label}</text>')
                o.append(f'<text x="{L - 8}" y="{y + 4:.2f}" text-anchor="end">{label}</text>')
    o.append(f'<text x="{L + S / 2}" y="{T + S + 44}" text-anchor="middle">published step time (s, log scale)</text>')
    o.append(f'<text x="{L - 56}" y="{T + S / 2}" text-anchor="middle" transform="rotate(-90 {L - 56} {T + S / 2})">'
             "predicted step time (s, log scale)</text>")
    # ±10 % band and y = x, clipped to the plot area
    band = [(lo, lo * (1 - BAND)), (hi, hi * (1 - BAND)), (hi, hi * (1 + BAND)), (lo, lo * (1 + BAND))]
    d = "M" + "L".join(f"{px(a):.2f},{py(b):.2f}" for a, b in band) + "z"
    o.append(f'<path class="band" d="{d}" fill="#999" fill-opacity="0.25" stroke="none" clip-path="url(#plot-area)">'
             f"<title>±{100 * BAND:g}% of the published step time</title></path>")
    o.append(f'<line class="identity" x1="{px(lo):.2f}" y1="{py(lo):.2f}" x2="{px(hi):.2f}" y2="{py(hi):.2f}" '
             'stroke="#333" stroke-dasharray="5,4"><title>y = x (prediction equals the published step time)</title></line>')
    # one marker per run
    for r in points:
        color, shape = styles[r.group]
        tag, geom = _marker_svg(shape, px(r.published_step_s), py(r.predicted_step_s), 5.0)
        tip = (f"{r.id} ({r.group}, {_gpus(r)}): published {r.published_step_s:,.3f} s, "
               f"predicted {r.predicted_step_s:,.3f} s, error {_pct(r.error)}")
        o.append(f'<{tag} class="point" data-run={quoteattr(r.id)} data-source={quoteattr(r.group)} {geom} '
                 f'fill="{color}" fill-opacity="0.85" stroke="#222" stroke-width="0.6"><title>{escape(tip)}</title></{tag}>')
    # legend
    lx, ly = L + S + 24, T + 10
    o.append(f'<text x="{lx}" y="{ly}" font-weight="bold">source (runs, step MAPE)</text>')
    plotted = {r.group for r in points}
    for i, g in enumerate(g for g in report.groups.values() if g.group in plotted):
        color, shape = styles[g.group]
        y = ly + 22 * (i + 1)
        tag, geom = _marker_svg(shape, lx + 6, y - 4, 5.0)
        o.append(f'<{tag} class="legend-marker" {geom} fill="{color}" stroke="#222" stroke-width="0.6"/>')
        o.append(f'<text x="{lx + 18}" y="{y}">{escape(_legend_label(g))}</text>')
    y = ly + 22 * (len(plotted) + 1) + 8
    o.append(f'<line x1="{lx}" y1="{y - 4}" x2="{lx + 14}" y2="{y - 4}" stroke="#333" stroke-dasharray="5,4"/>')
    o.append(f'<text x="{lx + 18}" y="{y}">y = x</text>')
    o.append(f'<rect x="{lx}" y="{y + 12}" width="14" height="10" fill="#999" fill-opacity="0.25"/>')
    o.append(f'<text x="{lx + 18}" y="{y + 22}">±{100 * BAND:g}% band</text>')
    o.append(f'<text x="{lx}" y="{y + 50}" fill="#444">below the line: meshplan predicts</text>')
    o.append(f'<text x="{lx}" y="{y + 66}" fill="#444">a faster step than was measured</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def write_png_scatter(report: ValidationReport, path: Path, dpi: int = 150) -> None:
    """The same scatter as :func:`svg_scatter`, drawn with matplotlib and saved as PNG."""
    plt = pyplot("writing a PNG needs", " (or write .svg)")
    points = plot_points(report)
    lo, hi = _decades(points)
    styles = _styles(report)
    fig, ax = plt.subplots(figsize=(10, 7))
    try:
        ax.set_xscale("log")
        ax.set_yscale("log")
        xs = [lo * (hi / lo) ** (i / 64) for i in range(65)]
        ax.fill_between(xs, [x * (1 - BAND) for x in xs], [x * (1 + BAND) for x in xs], color="#999", alpha=0.25,
                        linewidth=0, label=f"±{100 * BAND:g}% band")
        ax.plot([lo, hi], [lo, hi], color="#333", linestyle="--", linewidth=1, label="y = x")
        for g in report.groups.values():
            rows = [r for r in points if r.group == g.group]
            if not rows:
                continue
            color, shape = styles[g.group]
            ax.scatter([r.published_step_s for r in rows], [r.predicted_step_s for r in rows], c=color,
                       marker=MPL_MARKERS[shape], s=42, edgecolors="#222", linewidths=0.6, alpha=0.9, zorder=3,
                       label=_legend_label(g))
        from matplotlib.ticker import FuncFormatter

        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        ax.grid(True, which="major", color="#bbb", linewidth=0.8)
        ax.grid(True, which="minor", color="#e6e6e6", linewidth=0.5)
        ax.set_xlabel("published step time (s, log scale)")
        ax.set_ylabel("predicted step time (s, log scale)")
        title, subtitle, buckets = _title(report, len(points))
        ax.set_title(f"{title}\n{subtitle}\n{buckets}", fontsize=10, loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=8,
                  title="source (runs, step MAPE)", title_fontsize=8)
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    save_figure(plt, fig, path, dpi=dpi, format="png")


def write_plot(report: ValidationReport, path: Path) -> None:
    if not plot_points(report):
        raise InputError("out", "no predicted run with a published step time to plot in the selected sources")
    if path.suffix.lower() == ".png":
        write_png_scatter(report, path)
        return
    write_text(path, svg_scatter(report))


# ---- the command --------------------------------------------------------------------------------


def validate(
    source: Annotated[Optional[list[str]], typer.Option("--source", help="Only these sources (repeat, or a comma list), e.g. korthikanti22,llama3. Names: "
                                                        + ", ".join(mapped_sources()) + ".", show_default=False)] = None,
    out: Annotated[Optional[str], typer.Option("--out", help="Write a predicted-vs-published scatter (log–log, y = x and ±10% band): .svg, or .png (needs matplotlib, the 'plot' extra).", show_default=False)] = None,
    series_out: Annotated[Optional[str], typer.Option("--series-out", help="Write the scaling series' picture: each series' step error against its GPU count (one layout at several counts), .svg.", show_default=False)] = None,
    markdown_out: Annotated[bool, typer.Option("--markdown", help="Print the report as Markdown tables (per run, MAPE per source, unsupported runs) and nothing else.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object (the report: rows, groups, overall, worst) and nothing else.")] = False,
    run_set: Annotated[str, typer.Option("--set", help="Which runs: visible (the ground truth the calibration was checked against), held-out (published runs no constant was set from), or all.")] = "visible",
    interval: Annotated[float, typer.Option("--interval", help="Level of the step-time prediction interval whose coverage on the held-out runs is reported.")] = LEVEL,
    write_residuals: Annotated[Optional[str], typer.Option("--write-residuals", help="Also write every validated run's predicted and published step (the residuals estimate's interval reads) to this .json file, e.g. src/meshplan/catalog/data/residuals.json.", show_default=False)] = None,
) -> None:
    """Compare meshplan with published training runs: step time and peak memory per run, MAPE per source and overall, the largest errors, and the runs meshplan cannot express (with why).

    Each run is predicted exactly as `meshplan estimate` would (same catalog, same calibration); settings a source leaves unstated take its framework's default and are recorded as assumptions (in --json). `meshplan estimate --preset <run id>` shows one run's full estimate beside its published figures, with those assumptions."""
    if json_out and markdown_out:
        raise InputError("markdown", "give either --json or --markdown, not both")
    if run_set not in RUN_SETS:
        raise InputError("set", f"must be one of {', '.join(RUN_SETS)} (got '{run_set}')")
    sources = parse_sources(source)
    if sources is not None:
        in_set = {r.group for r in runs_of(run_set)}
        missing = [g for g in sources if g not in in_set]
        if missing:
            raise InputError("source", f"{', '.join(missing)} has no run in the {run_set} set (use --set all)")
    path, level, series_path = _out_path(out), check_level(interval), series_out_path(series_out)
    residuals_path = _residuals_path(write_residuals)
    report = build_report(sources, run_set)
    rows = report.rows if run_set == "all" and sources is None else all_rows()
    cov = coverage(residuals_of(rows), level)
    if residuals_path is not None:
        write_text(residuals_path, residuals_json(rows), replace=True)
    if path is not None:
        write_plot(report, path)
    if series_path is not None:
        write_series_plot(report, series_path, COLORS)
    if json_out:
        typer.echo(json.dumps({**report.to_dict(), "interval_coverage": cov}, allow_nan=False))
        return
    if markdown_out:
        typer.echo(markdown(report, cov))
        return
    print_human(report, [p for p in (path, series_path) if p is not None], cov)
    if residuals_path is not None:
        typer.echo(f"wrote {residuals_path} ({len(residuals_of(rows))} runs)")


def all_rows() -> list[RunResult]:
    """Every validated run (``--set all``): the coverage and the residuals are over all of them,
    whatever ``--set`` and ``--source`` show."""
    return validate_runs(run_set="all").rows


def _residuals_path(value: Optional[str]) -> Optional[Path]:
    """``--write-residuals``: a .json file in an existing directory (replaced: it is generated)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.suffix.lower() != ".json" or path.is_dir():
        raise InputError("write-residuals", f"must be a .json file (got '{value}')")
    if not path.parent.is_dir():
        raise InputError("write-residuals", f"directory '{path.parent}' does not exist")
    return path


__all__ = ["validate", "build_report", "markdown", "parse_sources", "source_names", "svg_scatter", "write_png_scatter"]
