"""What the outputs of ``meshplan search`` share: a plan's row of figures and the table columns
that name it, the line saying why no plan was found, writing a figure (the top plans' front and
the GPUs-vs-days front alike), the top plans' step-time prediction intervals with which of them
overlap, and which top plans differ only in their virtual stages."""

from __future__ import annotations

import json
from typing import Any, Optional

from meshplan.accuracy.interval import estimate_interval
from meshplan.catalog import stack_names, stack_overrides, stack_recompute, stack_schedules
from meshplan.cli.fit import FitTable
from meshplan.cli.pipeline_cmd import _out_path
from meshplan.cli.render import stack_words
from meshplan.estimate import Estimate
from meshplan.pyplot import save_figure
from meshplan.search.run import SearchResult, describe_rejections
from meshplan.specs.stack import Stack
from meshplan.units import GiB as GIB


def plan_row(est: Estimate) -> dict[str, Any]:
    """One plan's figures as the tables print them: layout, pipeline, batch shape, memory settings,
    peak GiB, step seconds, bubble and exposed-communication shares, MFU, tokens/s per GPU."""
    p = est.plan
    b = est.time.breakdown()
    step = est.time.step_s
    comm = b["tp_comm"] + b["cp_comm"] + b["fsdp_comm"] + b["dp_comm"] + b["param_gather"] + b.get("ep_comm", 0.0)
    return {
        "layout": f"TP{p.tp} CP{p.cp} PP{p.pp} DP{p.dp}" + (f" EP{p.ep}" if p.ep > 1 else "")
        + (f" shard{p.dp_shard}" if p.dp_shard else ""),
        "pipeline": "-" if p.pp == 1 else f"{p.schedule}" + (f" v{p.vpp}" if p.vpp > 1 else ""),
        "batch": f"{p.micro_batch}x{p.grad_accum}",
        "memory": f"{p.recompute}, {'SP, ' if p.sequence_parallel and p.tp > 1 else ''}"
                  f"{'TP overlap, ' if p.stack.tp_comm_overlap and p.tp > 1 else ''}ZeRO-{p.zero}",
        "peak": est.peak_bytes / GIB,
        "step": step,
        "bubble": b["pipeline_bubble"] / step,
        "comm": comm / step,
        "mfu": est.mfu,
        "tok": est.tokens_per_s / p.num_gpus,
    }


def add_plan_columns(t: FitTable, pipeline_width: Optional[int] = None) -> None:
    """The columns that name a plan, as :func:`plan_row` words it: layout, pipeline and batch shape
    kept whole on one line, the memory settings wrapped where the table is narrow; with
    ``pipeline_width``, the pipeline cells wrap too, never narrower than that (the schedule and
    its vpp on the first line, what a cell adds after them below where the table is narrow)."""
    t.add_column("layout", no_wrap=True)
    t.add_column("pipeline", no_wrap=pipeline_width is None, min_width=pipeline_width)
    t.add_column("b x m", justify="right", no_wrap=True)
    t.add_column("recompute, SP, ZeRO")


def plan_cells(row: dict[str, Any], pipeline: Optional[str] = None) -> list[str]:
    """The cells of :func:`add_plan_columns` for a :func:`plan_row` (``pipeline`` in place of its own)."""
    return [row["layout"], row["pipeline"] if pipeline is None else pipeline, row["batch"], row["memory"]]


def impossible_line(result: SearchResult, num_gpus: int) -> str:
    """One line saying why no plan was found."""
    if result.evaluated == 0:
        reasons = "; ".join(f"{c:,} plans: {rule}" for _, c, rule in describe_rejections(result.rejected))
        return f"no valid layout of {num_gpus:,} GPUs within the limits" + (f" ({reasons})" if reasons else "")
    return f"no plan fits in {result.usable_bytes / GIB:.1f} GiB per GPU: all {result.evaluated:,} evaluated plans need more memory"


def save_plot(plt, fig, ax, out: str) -> None:
    """Finish the axes (grid, layout) and write the figure to ``out``; one-line error if it cannot."""
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(plt, fig, _out_path(out))


def search_stack_line(stack: Stack) -> str:
    """The line naming the stack a search ran for: the profile, the fields set over it, and the
    pipeline schedules and recompute modes it runs (the only ones searched)."""
    words = stack_words(stack, stack_overrides(stack))
    if stack.name not in stack_names():
        return words
    runs = ", ".join(stack_schedules(stack.name)) or "none (no pipeline parallelism)"
    return words + f"; pipeline schedules it runs: {runs}; recompute: {', '.join(stack_recompute(stack.name))}"


# ---- the top plans' prediction intervals ---------------------------------------------------------


def top_intervals(result: SearchResult, level: float) -> list:
    """Each top plan's step-time interval at ``level`` (:func:`meshplan.accuracy.interval.estimate_interval`)."""
    return [estimate_interval(r.estimate, level) for r in result.top]


def overlaps(ivs: list, ranks: Optional[list[int]] = None) -> list[list[int]]:
    """For each plan (rank i, from 1, or ``ranks[i - 1]``), the ranks of the other plans whose
    interval overlaps its own: [low_i, high_i] ∩ [low_j, high_j] ≠ ∅ — their measured steps could
    come in either order."""
    ranks = ranks or list(range(1, len(ivs) + 1))
    return [[rj for rj, b in zip(ranks, ivs) if rj != ri and a.low <= b.high and b.low <= a.high]
            for ri, a in zip(ranks, ivs)]


def overlap_line(ivs: list, ranks: Optional[list[int]] = None) -> str:
    """One line saying which top plans lie within each other's interval (or that none do); with
    ``ranks``, of those plans only (the rows a grouped table shows)."""
    if not ivs:
        return ""
    level = f"{100 * ivs[0].level:g} %"
    ranks = ranks or list(range(1, len(ivs) + 1))
    near = overlaps(ivs, ranks)
    if len(ivs) > 1 and all(len(js) == len(ivs) - 1 for js in near):
        plans = "top plans" if ranks == list(range(1, len(ivs) + 1)) else "plans shown"
        return (f"All {len(ivs)} {plans} lie within each other's {level} step-time interval: the ranking between them "
                "is within meshplan's error.")
    pairs = [f"#{i} with " + ", ".join(f"#{j}" for j in js if j > i)
             for i, js in zip(ranks, near) if any(j > i for j in js)]
    if not pairs:
        return f"No two top plans' {level} step-time intervals overlap: the ranking holds beyond meshplan's error."
    return (f"Within each other's {level} step-time interval (the ranking between them is within meshplan's error): "
            + "; ".join(pairs))


# ---- plans that differ only in their virtual stages ------------------------------------------------


def variant_groups(result: SearchResult) -> list[int]:
    """For each top plan, the rank of the best top plan that differs from it in nothing but its
    virtual stages per pipeline rank (vpp), its own rank when none ranks higher. Such plans are
    one pipeline layout chunked differently and often lie within a fraction of a percent of each
    other; other schedules (interleaved against interleaved zero bubble, say) stay apart, being
    different engine settings with their own bubble and memory."""
    first: dict[str, int] = {}
    out = []
    for rank, r in enumerate(result.top, 1):
        fields = r.estimate.plan.model_dump(mode="json")
        fields.pop("vpp")
        out.append(first.setdefault(json.dumps(fields, sort_keys=True), rank))
    return out


def vpp_span(vpps: list[int]) -> str:
    """``v3–8``, ``v2,4,6–8``: a set of virtual-stage counts, runs of consecutive ones as ranges."""
    runs: list[list[int]] = []
    for v in sorted(vpps):
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return "v" + ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)


# ---- what if (--vs) ------------------------------------------------------------------------------


def best_plan(result: SearchResult) -> dict[str, Any] | None:
    """The best plan of a search in words and figures: layout, pipeline, batch shape, memory
    settings, step, MFU and peak memory (None when nothing fits)."""
    if not result.top:
        return None
    est = result.top[0].estimate
    row = plan_row(est)
    return {"layout": row["layout"], "pipeline": row["pipeline"], "batch": row["batch"], "memory": row["memory"],
            "step_s": est.time.step_s, "mfu": est.mfu, "peak_bytes": est.peak_bytes, "num_gpus": est.plan.num_gpus,
            "gpu": est.cluster.gpu.name}


def _shape(best: dict[str, Any] | None) -> tuple | None:
    return None if best is None else (best["layout"], best["pipeline"], best["batch"], best["memory"])


def vs_search_entry(text: str, fields: dict[str, Any], flags: list[str], base: SearchResult, other: SearchResult) -> dict[str, Any]:
    """One ``search --vs``: its fields and flags, the best plan of the search with them, the
    baseline search's, and whether the best layout changed (``changed``)."""
    a, b = best_plan(base), best_plan(other)
    return {"vs": text, "fields": fields, "flags": flags, "best": b, "baseline_best": a, "changed": _shape(a) != _shape(b),
            "feasible": other.feasible}


def _plan_words(best: dict[str, Any]) -> str:
    pipe = "" if best["pipeline"] == "-" else f" {best['pipeline']}"
    return f"{best['layout']}{pipe}, b x m {best['batch']} ({best['memory']}), step {best['step_s']:.3f} s"


def vs_search_line(entry: dict[str, Any]) -> str:
    """``What if nic_gbps=100: the best plan stays ...`` or ``... changes from ... to ...``."""
    a, b = entry["baseline_best"], entry["best"]
    head = f"What if {entry['vs']}: "
    if a is None or b is None:
        return head + ("nothing fits either" if a is b else f"the best plan is {_plan_words(b)} (none fits without it)" if b
                       else f"nothing fits (the best without it: {_plan_words(a)})")
    change = f"{100 * (b['step_s'] / a['step_s'] - 1):+.1f}%"
    if not entry["changed"]:
        return head + f"the best plan stays {_plan_words(a)} -> {b['step_s']:.3f} s ({change})"
    return head + f"the best plan changes from {_plan_words(a)} to {_plan_words(b)} ({change})"
