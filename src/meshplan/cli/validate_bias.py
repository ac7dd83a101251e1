"""The signed-bias tables of ``meshplan validate``: step-time bias and MAPE per scale bucket, GPU
generation and stack profile (:data:`meshplan.accuracy.validate.BREAKDOWNS`), as rich tables, as
Markdown and as a line for the plot; and the prediction interval's coverage
(:mod:`meshplan.accuracy.interval`).

bias = mean of (predicted − published) / published over a group's predicted rows: negative means
meshplan predicts faster steps than were measured there.
"""

from __future__ import annotations

from typing import Optional

from rich import box
from rich.table import Table

from meshplan.accuracy.validate import GroupSummary, ValidationReport
from meshplan.cli.fit import FitTable

#: report field → (table title, first column's header)
TITLES = {
    "buckets": ("Bias by GPU count (scale bucket)", "GPUs"),
    "generations": ("Bias by GPU generation", "GPU"),
    "stacks": ("Bias by stack profile (plan.stack.name)", "stack"),
}
HEADER = ["predicted", "step MAPE", "bias", "max |error|"]


def pct(x: Optional[float], signed: bool = True) -> str:
    """A fraction as a percentage with one decimal (signed unless ``signed`` is False); — for None."""
    if x is None:
        return "—"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def cells(g: GroupSummary) -> list[str]:
    """A group's cells under :data:`HEADER`."""
    return [str(g.supported), pct(g.mape, False), pct(g.bias), pct(g.max_abs_error, False)]


def breakdown_tables(report: ValidationReport) -> list[Table]:
    """One rich table per breakdown of :data:`TITLES` (those with a row)."""
    tables = []
    for name, (title, first) in TITLES.items():
        groups = getattr(report, name)
        if not groups:
            continue
        t = FitTable(title=f"{title}: bias = mean signed error", box=box.SIMPLE_HEAD, title_justify="left")
        t.add_column(first)
        for col in HEADER:
            t.add_column(col, justify="right")
        for label, g in groups.items():
            t.add_row(label, *cells(g))
        tables.append(t)
    return tables


def breakdown_markdown(report: ValidationReport, md_table) -> list[str]:
    """The breakdowns as Markdown sections (``md_table(header, rows, right)`` draws a table)."""
    lines: list[str] = []
    for name, (title, first) in TITLES.items():
        groups = getattr(report, name)
        if groups:
            rows = [[label, *cells(g)] for label, g in groups.items()]
            lines += ["", f"### {title}", ""] + md_table([first] + [h.replace("|", "\\|") for h in HEADER], rows, {1, 2, 3, 4})
    return lines


def bucket_line(report: ValidationReport) -> str:
    """The bias per scale bucket in one line (the plot's caption)."""
    return "bias by GPU count: " + ", ".join(f"{label} {pct(g.bias)} ({g.supported})" for label, g in report.buckets.items())


def coverage_lines(cov: dict) -> list[str]:
    """What :func:`meshplan.accuracy.interval.coverage` measured, in words."""
    level = f"{100 * cov['level']:g}%"
    out = [f"Prediction interval ({level}, split-conformal on measured/predicted ratios; `estimate --interval`):"]
    for m in cov["methods"]:
        out.append(f"  {m['name']}: {m['covered']} of {m['runs']} {m['rows']} runs inside ({pct(m['coverage'], False)}); "
                   f"median width {pct(m['median_width'], False)} of the step — {m['how']}")
    return out


__all__ = ["breakdown_markdown", "breakdown_tables", "bucket_line", "coverage_lines", "pct"]
