"""``meshplan search --gpus-range``: the GPUs-vs-days front as a table, JSON and a picture."""

from __future__ import annotations

from typing import Any

from rich import box

from meshplan.cli import render
from meshplan.cli.fit import FitTable
from meshplan.cli.search_report import add_plan_columns, impossible_line, plan_cells, plan_row, save_plot
from meshplan.estimate import Budget
from meshplan.pyplot import pyplot
from meshplan.search.fleet import FleetPoint


def print_fleet(points: list[FleetPoint], budget: Budget) -> None:
    """The front as a table: per GPU count its best plan by time-to-train, * on the front."""
    con = render.console()
    priced = budget.price_per_gpu_hour is not None
    t = FitTable(title=f"Best plan per GPU count for {budget.tokens:.3g} tokens (time-to-train)", box=box.SIMPLE_HEAD,
                 title_justify="left", keys=2, breaks=(6,))
    t.add_column("GPUs", justify="right", no_wrap=True)
    t.add_column("front")
    add_plan_columns(t)
    for col in ["peak GiB", "step (s)", "MFU", "days", "GPU-hours"] + (["$M"] if priced else []):
        t.add_column(col, justify="right")
    seconds = 0.0
    for pt in points:
        seconds += pt.result.seconds
        if pt.best is None:
            # the reason in the wrapping column: the layout's is kept on one line
            t.add_row(f"{pt.num_gpus:,}", "", "nothing fits", "", "", impossible_line(pt.result, pt.num_gpus), *[""] * (len(t.columns) - 6))
            continue
        est = pt.best.estimate
        row, run = plan_row(est), est.run_cost()
        cells = [f"{pt.num_gpus:,}", "*" if pt.on_front else "", *plan_cells(row), f"{row['peak']:.1f}", f"{row['step']:.3f}",
                 f"{row['mfu']:.1%}", f"{run['days']:.1f}", f"{run['gpu_hours']:,.0f}"]
        if priced:
            cells.append(f"{run['dollars'] / 1e6:.2f}")
        t.add_row(*cells)
    con.print(t)
    front = [pt for pt in points if pt.on_front]
    con.print(f"GPUs vs days front (*): {len(front)} of {len(points)} GPU counts; a count is on it when no smaller count "
              f"trains as fast; {sum(pt.result.evaluated for pt in points):,} plans evaluated in {seconds:.1f} s")


def fleet_json(points: list[FleetPoint]) -> dict[str, Any]:
    """``{"gpu_front": [...]}``: per GPU count the search's counts, and its best estimate or why none fits."""
    out = []
    for pt in points:
        item: dict[str, Any] = {"num_gpus": pt.num_gpus, "on_front": pt.on_front, "evaluated": pt.result.evaluated,
                                "feasible": pt.result.feasible, "seconds": pt.result.seconds}
        if pt.best is None:
            item["message"] = impossible_line(pt.result, pt.num_gpus)
        else:
            est = pt.best.estimate
            item["days"] = pt.days
            item["gpu_hours"] = est.run_cost()["gpu_hours"]
            item["best"] = est.to_dict()
        out.append(item)
    return {"gpu_front": out}


def write_fleet(points: list[FleetPoint], out: str) -> None:
    """Days against GPUs (log2 axis), the front as a line and the counts off it as crosses."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    have = [pt for pt in points if pt.best is not None]
    front = [pt for pt in have if pt.on_front]
    ax.plot([pt.num_gpus for pt in front], [pt.days for pt in front], color="#1f77b4", marker="o", label="GPUs vs days front")
    off = [pt for pt in have if not pt.on_front]
    if off:
        ax.scatter([pt.num_gpus for pt in off], [pt.days for pt in off], color="#999999", marker="x", label="no faster than a smaller count")
    for pt in have:
        p = pt.best.estimate.plan
        ax.annotate(f"TP{p.tp} CP{p.cp} PP{p.pp} DP{p.dp}", (pt.num_gpus, pt.days), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_xticks([pt.num_gpus for pt in points], [f"{pt.num_gpus:,}" for pt in points])
    ax.minorticks_off()
    ax.margins(x=0.12, y=0.1)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("days for the token budget")
    ax.legend(loc="upper right", fontsize=8)
    save_plot(plt, fig, ax, out)
