"""``meshplan search``: the best layouts for a model, a GPU count and a batch, and why the others lose.

Layout flags given on the command line (``--tp 8``, ``--schedule interleaved``, ``--zero 1`` …)
fix that axis; the others are searched within the ``--max-*`` limits. The output ranks the top
plans by the objective (:mod:`meshplan.cli.search_table`: plans that differ only in vpp as one
row unless ``--all-variants``), places a baseline plan (``--baseline``) among them, and counts
the rejected plans by reason.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from typing import Annotated, Any, Callable, Optional

import typer
from rich import box
from rich.table import Table

from meshplan.accuracy.interval import LEVEL, check_level
from meshplan.catalog import stack_names, stack_recompute, stack_schedules
from meshplan.cli import render
from meshplan.cli.fit import FitTable
from meshplan.cli.options import IntervalOpt, PlanArgs, plan_options, resolve
from meshplan.cli.pipeline_cmd import _out_path
from meshplan.cli.search_front import fleet_json, print_fleet, write_fleet
from meshplan.cli.search_options import SearchArgs, search_options
from meshplan.cli.search_report import (
    add_plan_columns, impossible_line, overlaps, plan_cells, plan_row, save_plot, search_stack_line, top_intervals, variant_groups,
    vs_search_entry, vs_search_line,
)
from meshplan.cli.search_table import legend, top_rows, top_table
from meshplan.cli.whatif import Alternative, alternatives
from meshplan.errors import InputError
from meshplan.pyplot import pyplot
from meshplan.estimate import Budget, Estimate
from meshplan.estimate_report import add_interval
from meshplan.search.fleet import FleetPoint, gpu_front, parse_gpu_counts
from meshplan.search.run import SearchResult, describe_rejections, search as run_search
from meshplan.search.space import SCHEDULE_NAMES, SearchLimits
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import Stack
from meshplan.units import GiB as GIB

_LAYOUT_KEYS = {"tp", "cp", "pp", "dp", "ep", "vpp", "schedule", "micro_batch", "recompute", "zero", "sequence_parallel",
                "tp_comm_overlap", "dp_shard"}


def parse_baseline(text: str, base: TrainingPlan, num_gpus: int, stack: Optional[Stack] = None) -> TrainingPlan:
    """``"tp=8,pp=16,cp=1,vpp=2,schedule=interleaved"`` over the search's base plan, run by
    ``stack`` as requested (default: the base's; its rules apply to the baseline's own layout, not
    to the base's, whose tp 1 sets the TP fields aside); dp is the rest of the GPUs unless given."""
    fields: dict[str, Any] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise InputError("baseline", f"expected key=value pairs such as tp=8,pp=16 (got '{part.strip()}')")
        key, value = (x.strip() for x in part.split("=", 1))
        key = key.replace("-", "_")
        if key == "mb":
            key = "micro_batch"
        if key == "sp":
            key = "sequence_parallel"
        if key == "tpo":
            key = "tp_comm_overlap"
        if key not in _LAYOUT_KEYS:
            raise InputError("baseline", f"unknown key '{key}' (use {', '.join(sorted(_LAYOUT_KEYS))})")
        if key in ("schedule", "recompute"):
            fields[key] = value
        elif key in ("sequence_parallel", "tp_comm_overlap"):
            if value.lower() not in ("true", "false", "1", "0", "on", "off"):
                raise InputError("baseline", f"{key} must be on or off (got '{value}')")
            fields[key] = value.lower() in ("true", "1", "on")
        else:
            try:
                fields[key] = int(value)
            except ValueError:
                raise InputError("baseline", f"{key} must be a whole number (got '{value}')") from None
            least = 0 if key == "zero" else 1
            if fields[key] < least:
                raise InputError("baseline", f"{key} must be at least {least} (got {fields[key]})")
    if fields.get("vpp", 1) > 1 and "schedule" not in fields:
        fields["schedule"] = "interleaved"
    if fields.get("schedule") in ("interleaved", "interleaved-zb", "zbv") and "vpp" not in fields:
        fields["vpp"] = 2
    inner = fields.get("tp", 1) * fields.get("cp", 1) * fields.get("pp", 1)
    if "dp" not in fields:
        if num_gpus % inner:
            raise InputError("baseline", f"tp x cp x pp = {inner} does not divide the {num_gpus:,} GPUs")
        fields["dp"] = num_gpus // inner
    merged = {**base.model_dump(), "stack": base.stack if stack is None else stack, "tp": 1, "cp": 1, "pp": 1, "vpp": 1,
              "schedule": "1f1b", **fields}
    try:
        return TrainingPlan.of(**merged)
    except Exception as err:  # pydantic: one line naming the rule
        raise InputError("baseline", str(err).splitlines()[-1].strip()) from None


class _Progress:
    """A progress bar on stderr (a terminal only), started once the search has run a second."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.bar = None
        self.tasks: dict[str, Any] = {}
        self.t0 = time.perf_counter()

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled or time.perf_counter() - self.t0 < 1.0:
            return
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=Console(stderr=True), transient=True)
            self.bar.start()
        if phase not in self.tasks:
            label = "screening plans" if phase == "screen" else "simulating contenders"
            self.tasks[phase] = self.bar.add_task(label, total=total or None)
        self.bar.update(self.tasks[phase], completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _why(best: Estimate, other: Estimate) -> list[str]:
    """Where the step time of ``other`` differs from ``best``'s, largest first."""
    a, b = best.time.breakdown(), other.time.breakdown()
    names = {"compute": "compute", "recompute": "recompute", "tp_comm": "TP communication", "cp_comm": "CP communication",
             "fsdp_comm": "FSDP communication", "pipeline_bubble": "pipeline bubble", "dp_comm": "DP gradient sync",
             "optimizer": "optimizer step", "param_gather": "weight all-gather", "ep_comm": "expert all-to-all",
             "fp8_weight_cast": "FP8 weight casts"}
    diffs = sorted(((b.get(k, 0.0) - a.get(k, 0.0), k) for k in {**a, **b}), key=lambda x: -abs(x[0]))
    return [f"{names[k]} {d:+.3f} s" for d, k in diffs if abs(d) >= 0.005 * best.time.step_s][:4]


def _print(result: SearchResult, budget_tokens: bool, priced: bool, num_gpus: int, level: float = LEVEL,
           all_variants: bool = False) -> None:
    """The search as text: its counts, the top plans (:mod:`meshplan.cli.search_table`; plans that
    differ only in vpp as one row unless ``all_variants``), what separates the next rows from #1,
    the rejected plans by rule, the baseline's place and the front."""
    con = render.console()
    if not result.top:
        con.print(impossible_line(result, num_gpus))
        if result.closest:
            con.print(_closest_table(result))
    rej = sum(result.rejected.values())
    if result.stack is not None:
        con.print(search_stack_line(result.stack))
    con.print(
        f"Searched {result.evaluated + sum(v for k, v in result.rejected.items() if k != 'memory'):,} plans: "
        f"{result.evaluated:,} evaluated, {result.feasible:,} fit in {result.usable_bytes / GIB:.1f} GiB, "
        f"{rej:,} rejected; {result.simulated:,} simulated exactly; {result.seconds:.2f} s"
    )
    if result.top:
        ivs = top_intervals(result, level)
        rows = top_rows(result, all_variants)
        con.print(top_table(result, rows, ivs, budget_tokens, priced))
        for line in legend(result, rows, ivs):
            con.print(line, markup=False, highlight=False)
        best = result.top[0].estimate
        for i in [ranks[0] for ranks in rows[1:4]]:
            why = _why(best, result.top[i - 1].estimate)
            if why:
                con.print(f"  #{i} vs #1: " + ", ".join(why))
    if result.rejected:
        t = FitTable(title="Rejected", box=box.SIMPLE_HEAD, title_justify="left")
        t.add_column("plans", justify="right")
        t.add_column("rule")
        for _, count, rule in describe_rejections(result.rejected):
            t.add_row(f"{count:,}", rule)
        con.print(t)
    if result.baseline is not None:
        bp = result.baseline
        row = plan_row(bp.estimate)
        faster = bp.faster_exact if bp.faster_exact is not None else bp.faster_at_most
        exactness = "" if bp.faster_exact is not None else "at most "
        con.print(
            f"Baseline {row['layout']} {row['pipeline']} b x m {row['batch']} ({row['memory']}): step {row['step']:.3f} s, "
            f"MFU {row['mfu']:.1%}, peak {row['peak']:.1f} GiB ({'fits' if bp.fits else 'does not fit'}); "
            f"{exactness}{faster:,} of {bp.feasible:,} feasible plans are faster (top {bp.percentile:.2%})"
        )
        if result.top:
            why = _why(result.top[0].estimate, bp.estimate)
            if why:
                con.print("  baseline vs #1: " + ", ".join(why))
    if result.pareto:
        con.print(f"Memory vs throughput front: {len(result.pareto)} plans, "
                  f"{result.pareto[0].estimate.peak_bytes / GIB:.1f} to {result.pareto[-1].estimate.peak_bytes / GIB:.1f} GiB")


def _json(result: SearchResult, num_gpus: int, level: float = LEVEL) -> dict[str, Any]:
    out: dict[str, Any] = {
        "evaluated": result.evaluated,
        "feasible": result.feasible,
        "rejected": dict(result.rejected),
        "seconds": result.seconds,
        "simulated": result.simulated,
        "objective": result.objective,
        "stack": None if result.stack is None else result.stack.model_dump(),
        "top": [{"rank": i, "score": r.score, **r.estimate.to_dict()} for i, r in enumerate(result.top, 1)],
        "interval_level": level,
    }
    ivs = top_intervals(result, level)
    for entry, iv, near, group in zip(out["top"], ivs, overlaps(ivs), variant_groups(result)):
        add_interval(entry, iv)
        entry["interval_overlaps"] = near
        entry["group"] = group
    if not result.top:
        out["message"] = impossible_line(result, num_gpus)
    if result.closest:
        out["closest"] = [{"over_bytes": over, **est.to_dict()} for est, over in result.closest]
    if result.baseline is not None:
        bp = result.baseline
        out["baseline"] = {"fits": bp.fits, "faster_at_most": bp.faster_at_most, "faster": bp.faster_exact,
                           "feasible": bp.feasible, "percentile": bp.percentile, **bp.estimate.to_dict()}
    if result.stopped is not None:
        out["stopped"] = {"reason": result.stopped, "in": result.stopped_in}
    if result.pareto:
        out["pareto"] = [{"peak_bytes": r.estimate.peak_bytes, "score": r.score, **r.estimate.to_dict()["plan"]} for r in result.pareto]
    return out


def _write_front(result: SearchResult, out: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    front = result.pareto or result.top
    xs = [r.estimate.peak_bytes / GIB for r in front]
    ys = [r.estimate.tokens_per_s / r.estimate.plan.num_gpus for r in front]
    ax.step(xs, ys, where="post", color="#1f77b4", label="memory vs throughput front" if result.pareto else "top plans")
    ax.scatter(xs, ys, color="#1f77b4", zorder=3)
    for r, x, y in zip(front, xs, ys):
        p = r.estimate.plan
        ax.annotate(f"TP{p.tp} CP{p.cp} PP{p.pp}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if result.baseline is not None:
        e = result.baseline.estimate
        ax.scatter([e.peak_bytes / GIB], [e.tokens_per_s / e.plan.num_gpus], marker="*", s=160, color="#d62728", label="baseline", zorder=4)
    ax.axvline(result.usable_bytes / GIB, color="grey", linestyle="--", linewidth=1, label="usable HBM")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens/s per GPU")
    ax.legend(loc="lower right", fontsize=8)
    save_plot(plt, fig, ax, out)


def _setup(plan: PlanArgs, search: SearchArgs, baseline: Optional[str]) -> tuple:
    """Check the search's options and resolve the plan flags: (model, cluster, base plan, limits,
    budget, baseline plan or None)."""
    search.check()
    if plan.recompute_layers is not None:
        raise InputError("recompute_layers", "the search recomputes every layer or none of a mode; estimate a plan "
                                             "with --recompute-layers instead")
    preset_setup = resolve(plan) if plan.preset is not None else None
    fixed = plan if plan.preset is None else replace(plan, **{k: None for k in ("tp", "cp", "pp", "dp", "ep", "vpp", "schedule", "micro_batch", "recompute", "zero", "sequence_parallel", "dp_shard", "layer_split")})
    limits = search.limits(fixed)
    # the base plan's own layout is neutral; the stack is searched as requested, its rules applied
    # to each plan (meshplan.specs.stack), not to the base
    neutral = dict(tp=1, cp=1, pp=1, ep=1, vpp=None, schedule=None, micro_batch=1, dp_shard=None, layer_split=None, recompute=None,
                   zero=None)
    one = resolve(replace(plan, **neutral, dp=1, gpus=None))  # base plan fields, model, budget
    gpus = preset_setup.cluster.num_gpus if preset_setup else (plan.gpus if plan.gpus is not None else (plan.dp * (plan.tp or 1) * (plan.cp or 1) * (plan.pp or 1) if plan.dp else 8))
    whole = resolve(replace(plan, **neutral, dp=None, gpus=gpus, global_batch=gpus, global_batch_tokens=None))
    # the searched plans vary ZeRO: a preset's or --plan file's unsharded accumulation (ZeRO-3 with
    # torch's pipeline schedules), which the search's screen does not model, stays with the baseline
    cluster, budget, base = whole.cluster, one.budget, one.plan
    stack = one.stack.model_copy(update={"fsdp_accumulate_unsharded": False})
    limits = stack_limits(limits, stack, search.schedules is not None or plan.schedule is not None, plan.recompute is not None)
    if search.objective != "throughput" and not budget.tokens:
        raise InputError("tokens", f"the {search.objective} objective needs --tokens")
    if search.objective == "cost" and budget.price_per_gpu_hour is None:
        raise InputError("price", "the cost objective needs --price")
    base_plan = base.replace(**{"rank_order": preset_setup.plan.rank_order}) if preset_setup else base
    if preset_setup is not None:
        base_plan = base_plan.replace(**{"global_batch": preset_setup.plan.global_batch, "seq_len": preset_setup.plan.seq_len})
    bl = None
    if baseline is not None:
        bl = parse_baseline(baseline, base_plan, cluster.num_gpus, one.stack)
    elif preset_setup is not None:
        bl = preset_setup.plan
    return one.model, cluster, base_plan, limits, budget, bl, stack


def stack_limits(limits: SearchLimits, stack: Stack, asked: bool, asked_recompute: bool = False) -> SearchLimits:
    """The search space narrowed to what ``stack`` runs: the pipeline schedules of its profile
    (none: no pipeline parallelism) unless schedules were ``asked`` for (``--schedules``,
    ``--schedule``: a what-if the output's stack line marks), its recompute modes unless
    ``--recompute`` fixes one, and TP overlap as the stack does it (``--tp-comm-overlap`` or
    ``--set tp_comm_overlap`` change it)."""
    profile = stack.name in stack_names()
    runs = stack_schedules(stack.name) if profile else SCHEDULE_NAMES
    kept = limits.schedules if asked else tuple(s for s in limits.schedules if s in runs)
    modes = stack_recompute(stack.name) if profile and not asked_recompute else limits.recompute
    recompute = tuple(r for r in limits.recompute if r in modes)
    return replace(limits, schedules=kept, recompute=recompute, tp_comm_overlap=(stack.tp_comm_overlap,))


def execute(
    plan: PlanArgs, search: SearchArgs = SearchArgs(), *, baseline: Optional[str] = None, pareto: bool = False,
    progress: Optional[Callable[[str, int, int], None]] = None, max_plans: Optional[int] = None,
    on_top: Optional[Callable[[SearchResult], None]] = None,
) -> tuple[SearchResult, ClusterSpec, Budget]:
    """Check the search's options, resolve the plan flags as ``meshplan search`` does and run the
    search; ``progress(phase, done, total)`` and ``on_top(result)`` as
    :func:`meshplan.search.run.search`, ``max_plans`` a smaller bound on the space than
    :data:`meshplan.search.space.MAX_PLANS`. Returns the result with the cluster and the budget it
    was run for."""
    model, cluster, base_plan, limits, budget, bl, stack = _setup(plan, search, baseline)
    if max_plans is not None:
        limits = replace(limits, max_plans=min(max_plans, limits.max_plans))
    result = run_search(
        model, cluster, base_plan, limits, global_batches=search.global_batches(base_plan.seq_len),
        objective=search.objective, budget=budget, top_k=search.top, headroom=search.headroom, baseline=bl, pareto=pareto,
        progress=progress, stack=stack, on_top=on_top,
    )
    return result, cluster, budget


def execute_fleet(
    plan: PlanArgs, gpus_range: str, search: SearchArgs = SearchArgs(), *,
    progress: Optional[Callable[[str, int, int], None]] = None,
) -> tuple[list[FleetPoint], Budget]:
    """The GPUs-vs-days front over the counts of ``gpus_range`` (:mod:`meshplan.search.fleet`);
    the objective is time-to-train and ``search.top`` is not used."""
    model, cluster, base_plan, limits, budget, _, stack = _setup(plan, replace(search, objective="throughput", top=1), None)
    counts = parse_gpu_counts(gpus_range, cluster.scale_up.size)
    points = gpu_front(
        model, cluster, base_plan, limits, counts, budget, headroom=search.headroom,
        global_batches=search.global_batches(base_plan.seq_len), progress=progress, stack=stack,
    )
    return points, budget


@plan_options
@search_options()
def search(
    plan: PlanArgs,
    search: SearchArgs,
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="Place this plan in the ranking, e.g. 'tp=8,pp=16,cp=1,vpp=2,schedule=interleaved'. (default: the --preset's plan)", show_default=False)] = None,
    pareto: Annotated[bool, typer.Option("--pareto", help="Also find the memory vs throughput front.")] = False,
    gpus_range: Annotated[Optional[str], typer.Option("--gpus-range", help="GPUs vs days front: the best plan by time-to-train (needs --tokens) for each GPU count, MIN:MAX (doubling) or a list such as 4096,8192,16384; --out draws it.", show_default=False)] = None,
    out: Annotated[Optional[str], typer.Option("--out", help="Write the front (or the top plans) as a picture: .svg or .png.", show_default=False)] = None,
    stacks: Annotated[Optional[str], typer.Option("--stacks", help="Compare stacks: search for each of these profiles (comma-separated, e.g. megatron-core,torchtitan) and print the best plan of each.", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else.")] = False,
    interval: IntervalOpt = LEVEL,
    vs: Annotated[Optional[list[str]], typer.Option("--vs", metavar="F=V", help="What if FIELD=VALUE[,...] (as estimate's --vs): search again with it; does the best plan change? (repeatable)", show_default=False)] = None,
    all_variants: Annotated[bool, typer.Option("--all-variants", help="One row per plan: do not group plans that differ only in virtual stages (vpp).")] = False,
) -> None:
    """Find the best layouts: every tp x cp x pp x dp factorization of the GPUs (and ep for mixture-of-experts models) with every schedule, virtual stages, micro-batch, recompute mode, sequence parallelism, TP communication overlap and ZeRO stage; memory checked per pipeline rank, the best plans simulated exactly.

    Layout flags (--tp, --pp, --schedule, --zero, ...) fix that axis. With --preset the preset's model, GPUs, batch and network are used and its plan is the baseline."""
    _out_path(out)  # checked before any work: a new .svg or .png file
    level = check_level(interval)
    progress = _Progress(not json_out)
    alts = alternatives(plan, vs)
    if alts and (stacks is not None or gpus_range is not None):
        raise InputError("--vs", "searches one plan space again: not with --stacks or --gpus-range")
    if stacks is not None:
        _compare_stacks(plan, search, stacks, json_out, progress, level)
        return
    if gpus_range is not None:
        try:
            points, budget = execute_fleet(plan, gpus_range, search, progress=progress)
        finally:
            progress.close()
        if out is not None:
            write_fleet(points, out)
        if json_out:
            typer.echo(json.dumps(fleet_json(points), allow_nan=False))
        else:
            print_fleet(points, budget)
        if not any(pt.best for pt in points):
            raise typer.Exit(1)
        return
    try:
        result, cluster, budget = execute(plan, search, baseline=baseline, pareto=pareto or out is not None, progress=progress)
        entries = [vs_search_entry(a.text, a.fields, list(a.flags), result, _search_alternative(a, search, baseline, progress))
                   for a in alts]
    finally:
        progress.close()
    if out is not None:
        _write_front(result, out)
    if json_out:
        d = _json(result, cluster.num_gpus, level)
        if alts:
            d["vs"] = entries
        typer.echo(json.dumps(d, allow_nan=False))
    else:
        _print(result, bool(budget.tokens), budget.price_per_gpu_hour is not None, cluster.num_gpus, level, all_variants)
        for entry in entries:
            render.console().print(vs_search_line(entry), markup=False, highlight=False, soft_wrap=True)
    if not result.top:
        raise typer.Exit(1)


def _search_alternative(alt: Alternative, search: SearchArgs, baseline: Optional[str], progress) -> SearchResult:
    """The same search with one ``--vs``'s options; its refusals are ``--vs``'s."""
    try:
        return execute(alt.args, search, baseline=baseline, progress=progress)[0]
    except InputError as err:
        raise InputError("--vs", f"{alt.text!r}: {err}") from None


def _compare_stacks(plan: PlanArgs, search: SearchArgs, names: str, json_out: bool, progress, level: float = LEVEL) -> None:
    """``--stacks a,b``: the same search for each stack, and the best plan of each side by side."""
    wanted = [n.strip().lower() for n in names.split(",") if n.strip()]
    if not wanted:
        raise InputError("stacks", "give one or more stack profiles, comma-separated")
    for n in wanted:
        if n not in stack_names():
            raise InputError("stacks", f"unknown stack '{n}' (profiles: {', '.join(stack_names())})")
    results = []
    try:
        for n in wanted:
            results.append((n, *execute(replace(plan, stack=n), search, progress=progress)))
    finally:
        progress.close()
    if json_out:
        typer.echo(json.dumps({"stacks": [_json(r, c.num_gpus, level) for _, r, c, _ in results]}, allow_nan=False))
    else:
        t = FitTable(title="Best plan for each stack", box=box.SIMPLE_HEAD, title_justify="left", breaks=(5,))
        t.add_column("stack", no_wrap=True)
        add_plan_columns(t)
        for col in ("peak GiB", "step (s)", "MFU", "tok/s/GPU", "fit"):
            t.add_column(col, justify="right")
        for n, r, _, _ in results:
            if not r.top:
                t.add_row(n, "nothing fits", *[""] * 7, "0")
                continue
            row = plan_row(r.top[0].estimate)
            t.add_row(n, *plan_cells(row), f"{row['peak']:.1f}", f"{row['step']:.3f}", f"{100 * row['mfu']:.1f}%",
                      f"{row['tok']:,.0f}", f"{r.feasible:,}")
        render.console().print(t)
    if not any(r.top for _, r, _, _ in results):
        raise typer.Exit(1)


def _closest_table(result: SearchResult) -> Table:
    t = FitTable(title="Closest plans (least memory over the limit)", box=box.SIMPLE_HEAD, title_justify="left", breaks=(4,))
    add_plan_columns(t)
    for col in ("peak GiB", "over by", "worst rank"):
        t.add_column(col, justify="right")
    for est, over in result.closest:
        row = plan_row(est)
        worst = max(range(len(est.stages)), key=lambda i: est.stages[i].total)
        t.add_row(*plan_cells(row), f"{row['peak']:.1f}", f"{over / GIB:.1f} GiB", str(worst))
    return t
