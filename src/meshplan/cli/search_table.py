"""``meshplan search``'s table of top plans.

The top plans of a search are often one layout several times over with a different number of
virtual stages per pipeline rank (vpp), within a fraction of a percent of each other. By default
such plans (:func:`~meshplan.cli.search_report.variant_groups`) are one row: the best of them, its
pipeline cell naming the others (``interleaved v7 (v3–8: 6)``); ``--all-variants`` gives every
plan its row. A row whose step-time interval overlaps #1's is marked ``≈``: the order between
them is within the estimate's error. Legend lines under the table say what the marks mean. The
JSON keeps every plan whatever the table shows.
"""

from __future__ import annotations

from rich import box

from meshplan.cli import render
from meshplan.cli.fit import FitTable
from meshplan.cli.search_report import add_plan_columns, overlap_line, overlaps, plan_cells, plan_row, variant_groups, vpp_span
from meshplan.search.run import SearchResult

TIE = "≈"


def top_rows(result: SearchResult, all_variants: bool = False) -> list[list[int]]:
    """The table's rows as lists of ranks (from 1), best first: each top plan alone with
    ``all_variants``, else the plans that differ only in vpp together."""
    if all_variants:
        return [[rank] for rank in range(1, len(result.top) + 1)]
    rows: dict[int, list[int]] = {}
    for rank, group in enumerate(variant_groups(result), 1):
        rows.setdefault(group, []).append(rank)
    return list(rows.values())


def ties_with_first(ivs: list) -> set[int]:
    """The ranks of the top plans whose step-time interval overlaps #1's."""
    return set(overlaps(ivs)[0]) if ivs else set()


def _pipeline(result: SearchResult, ranks: list[int]) -> str:
    """The pipeline cell of a row: the best plan's, and the row's other vpp with the plan count."""
    words = plan_row(result.top[ranks[0] - 1].estimate)["pipeline"]
    if len(ranks) == 1:
        return words
    return f"{words} ({vpp_span([result.top[r - 1].estimate.plan.vpp for r in ranks])}: {len(ranks)})"


def top_table(result: SearchResult, rows: list[list[int]], ivs: list, budget_tokens: bool, priced: bool) -> FitTable:
    """The top plans, one line per row of :func:`top_rows` with the figures of its best plan: the
    plan's columns, then peak memory, step and its interval, bubble and exposed communication
    shares, MFU, tokens/s per GPU, and days and millions of dollars for a token budget. At 80
    columns it prints as two tables, the plans and their figures, both led by the rank."""
    level = f"{100 * ivs[0].level:g} %" if ivs else ""
    title = f"Top {len(result.top)} plans by {result.objective}"
    if len(rows) < len(result.top):
        title += f", in {len(rows)} row" + ("s" if len(rows) > 1 else "")
    t = FitTable(title=title, box=box.SIMPLE_HEAD,
                 title_justify="left", breaks=(5,))
    t.add_column("#", justify="right", no_wrap=True)
    add_plan_columns(t, max(len(plan_row(result.top[ranks[0] - 1].estimate)["pipeline"]) for ranks in rows))
    for col in ("peak GiB", "step (s)", f"step {level}", "bubble", "exposed comm", "MFU"):
        t.add_column(col, justify="right")
    t.add_column("tok/s/GPU", justify="right", short="tok/s\nper GPU")
    if budget_tokens:
        t.add_column("days", justify="right")
    if priced:
        t.add_column("$M", justify="right")
    near = ties_with_first(ivs)
    for ranks in rows:
        best = ranks[0]
        r, iv = result.top[best - 1], ivs[best - 1]
        row = plan_row(r.estimate)
        cells = [f"{best} {TIE}" if best in near else str(best), *plan_cells(row, _pipeline(result, ranks)), f"{row['peak']:.1f}",
                 f"{row['step']:.3f}", f"{render.secs(iv.low)}–{render.secs(iv.high)}", f"{row['bubble']:.1%}",
                 f"{row['comm']:.1%}", f"{row['mfu']:.1%}", f"{row['tok']:,.0f}"]
        run = r.estimate.run_cost()
        if budget_tokens:
            cells.append(f"{run['days']:.1f}" if run else "-")
        if priced:
            cells.append(f"{run['dollars'] / 1e6:.2f}" if run and "dollars" in run else "-")
        t.add_row(*cells)
    return t


def legend(result: SearchResult, rows: list[list[int]], ivs: list) -> list[str]:
    """The lines under the table: what ``≈`` and a grouped row's ``(v3–8: 6)`` mean, and which
    rows lie within each other's step-time interval."""
    lines = []
    shown = [ranks[0] for ranks in rows]
    if ties_with_first(ivs) & set(shown):
        lines.append(f"{TIE}: within the estimate's error of #1 (their {100 * ivs[0].level:g} % step-time intervals overlap).")
    grouped = [ranks for ranks in rows if len(ranks) > 1]
    if grouped:
        ranks = grouped[0]
        steps = [[result.top[r - 1].estimate.time.step_s for r in g] for g in grouped]
        spread = max(max(s) / min(s) - 1 for s in steps)
        vpps = vpp_span([result.top[r - 1].estimate.plan.vpp for r in ranks])
        lines.append(f"({vpps}: {len(ranks)}): the fastest of {len(ranks)} plans that differ only in virtual stages per "
                     f"rank (vpp {vpps[1:]}); a row's plans lie within {100 * spread:.1f} % of its step. "
                     "--all-variants lists each plan.")
    if len(shown) > 1 or not grouped:
        lines.append(overlap_line([ivs[r - 1] for r in shown], shown))
    return lines
