"""``meshplan pipeline``: what every pipeline rank does when, for p stages and m micro-batches.

The schedule's action lists (:func:`~meshplan.pipeline.schedules.build_schedule`) are run by the
event simulation (:func:`~meshplan.pipeline.simulate.simulate`) and shown as a coloured terminal
Gantt, a table per rank (busy, idle, idle share, peak in-flight micro-batches) and the totals:

* makespan T: when the last action ends;
* bubble fraction = Σ idle / (p·T): the idle share of the step;
* bubble overhead = Σ idle / Σ busy: idle time relative to the ideal compute time.

Times. ``--fwd`` and ``--bwd`` are one pipeline rank's forward and backward time per micro-batch
for its whole share of the model; with v virtual stages per rank each virtual stage (chunk) gets
1/v of them, so an interleaved schedule is compared with 1F1B on the same model. ``--stage-times``
instead gives every virtual stage its own ``forward:backward`` (or ``forward:backward:W``) times,
in pipeline order (p·v pairs), e.g. to see an uneven split. ``--wgrad`` is the weight-gradient
part of the backward: schedules that split the backward run it as W and the rest, backward − W,
as I (input gradient); it is passed to the simulation when that takes one (``wgt``; its default
is half the backward). ``--transfer`` is the point-to-point time between consecutive stages.

When the stages are equal and transfers free, the closed form is shown next to the simulation
(:func:`~meshplan.pipeline.simulate.uniform_makespan`): (m + p − 1)·(f + b) for GPipe and 1F1B, and
(m·v + p − 1)·(f + b)/v for interleaved, with bubble fraction (p − 1)/(m·v + p − 1) and bubble
overhead (p − 1)/(m·v) (v = 1 for GPipe and 1F1B).

Runtime. ``--pipeline-runtime lockstep`` runs torch's multi-stage schedules slot by slot over
torch's grid (:mod:`meshplan.pipeline.lockstep`; which schedules, and ``--actions-file``:
:mod:`meshplan.cli.pipeline_runtime`); the same actions are also run dependency-driven, and the
output gives the lockstep makespan, what it adds to the dependency-driven one, and the closed form
checked against the dependency-driven run (the closed forms assume it).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from meshplan.catalog import load_stack
from meshplan.cli import render
from meshplan.cli.fit import FitTable
from meshplan.cli.pipeline_runtime import RUNTIME_HELP, check_runtime, lockstep_cost, resolve_runtime
from meshplan.errors import InputError
from meshplan.outfile import out_path, write_text
from meshplan.pipeline import schedules as sched
from meshplan.pipeline.gantt import KIND_NAMES, fmt_time, rich_gantt, round_columns, svg_gantt, text_axis
from meshplan.pipeline.simulate import SimResult, simulate, uniform_makespan, zbh1_makespan

CLOSED_FORMS = ("gpipe", "1f1b", "interleaved")
#: Most micro-batch stages p·v·m a run simulates (its actions: 2 or 3 per stage): about 5 s and
#: 350 MB with --json at the bound, for the costliest schedule and runtime.
MAX_STAGES = 131_072
MAX_PP, MAX_VPP, MAX_M, MAX_ACTIONS = 1024, 64, 100_000, 3 * MAX_STAGES
#: Times (any unit) a simulation takes: each positive time within [TIME_MIN, TIME_MAX], and the
#: largest at most TIME_RANGE times the smallest, so that sums over a step keep the shortest
#: action's time to about 1e-9 of itself (float64 holds 16 digits).
TIME_MIN, TIME_MAX, TIME_RANGE = 1e-9, 1e12, 1e6


def schedule_names() -> tuple[str, ...]:
    """The schedules ``build_schedule`` knows, for the help: its module's registry when there is one,
    else the ``{...}`` list of its docstring. ``build_schedule`` itself refuses unknown names."""
    for attr in ("SCHEDULES", "SCHEDULE_NAMES"):
        names = getattr(sched, attr, None)
        if names:
            return tuple(names)
    hit = re.search(r"\{([^}]*)\}", sched.build_schedule.__doc__ or "")
    return tuple(n.strip() for n in hit.group(1).split(",")) if hit else CLOSED_FORMS


def _count(field: str, value: int, cap: int) -> int:
    if value < 1:
        raise InputError(field, f"must be a positive integer (got {value})")
    if value > cap:
        raise InputError(field, f"must be at most {cap:,} (got {value:,})")
    return value


def _time(field: str, value: float, positive: bool = True) -> float:
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        rule = "a positive" if positive else "a non-negative"
        raise InputError(field, f"must be {rule} finite number (got {value:g})")
    return float(value)


def check_time_range(times: list[tuple[str, list[float]]]) -> None:
    """Refuse times (by field) the simulation cannot add up faithfully: a positive time outside
    [:data:`TIME_MIN`, :data:`TIME_MAX`], or a largest over a smallest beyond :data:`TIME_RANGE`.
    ``times``: (field, its times) pairs."""
    positive = [(field, x) for field, xs in times for x in xs if x > 0]
    for field, x in positive:
        if not TIME_MIN <= x <= TIME_MAX:
            raise InputError(field, f"must be between {TIME_MIN:g} and {TIME_MAX:g} (got {x:g}); give the times in another unit")
    lo, hi = min(positive, key=lambda p: p[1]), max(positive, key=lambda p: p[1])
    if hi[1] > TIME_RANGE * lo[1]:
        raise InputError(hi[0], f"{hi[1]:g} is more than {TIME_RANGE:g} times the shortest time ({lo[1]:g}, {lo[0]}): "
                         "the simulation could not add both up faithfully")


def parse_stage_times(text: str, n_stages: int) -> tuple[list[float], list[float], list[float] | None]:
    """``"f0:b0,f1:b1,..."`` (optionally ``f:b:w``) → forward, backward and W times per virtual stage."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != n_stages:
        raise InputError("stage_times", f"needs one forward:backward pair per virtual stage, p·v = {n_stages}, got {len(parts)}")
    fwd, bwd, wgt = [], [], []
    for k, part in enumerate(parts):
        pieces = part.split(":")
        if len(pieces) not in (2, 3):
            raise InputError("stage_times", f"entry {k} ('{part}') must be forward:backward, e.g. 1:2")
        try:
            vals = [float(x) for x in pieces]
        except ValueError:
            raise InputError("stage_times", f"entry {k} ('{part}') must hold numbers, e.g. 1:2") from None
        for i, (name, x) in enumerate(zip(("forward", "backward", "W"), vals)):
            if not math.isfinite(x) or x < 0 or (x == 0 and i < 2):
                rule = "a non-negative" if i == 2 else "a positive"
                raise InputError("stage_times", f"entry {k}: {name} time must be {rule} finite number (got {x:g})")
        if len(vals) == 3 and vals[2] > vals[1]:
            raise InputError("stage_times", f"entry {k}: W time ({vals[2]:g}) must not exceed the backward ({vals[1]:g})")
        fwd.append(vals[0])
        bwd.append(vals[1])
        wgt.append(vals[2] if len(vals) == 3 else None)
    if any(w is None for w in wgt) and any(w is not None for w in wgt):
        raise InputError("stage_times", "give a W time (f:b:w) for every stage or for none")
    return fwd, bwd, (None if wgt[0] is None else [float(w) for w in wgt])


def read_actions_file(path: str) -> tuple[tuple, ...]:
    """One rank per non-empty line, actions in torch's notation (what torch's schedules print or
    write as CSV); '#' starts a comment."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError("actions_file", f"no such file: {path}")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError("actions_file", f"cannot read {path}: {err.__class__.__name__}") from None
    rows = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    rows = [row for row in rows if row]
    if not rows:
        raise InputError("actions_file", f"{path} has no actions (one rank per line, e.g. 0F0,0F1,0B0,0B1)")
    ranks = sched.parse_actions(rows)
    if sum(len(acts) for acts in ranks) > MAX_ACTIONS:
        raise InputError("actions_file", f"more than {MAX_ACTIONS:,} actions to draw")
    return ranks


def run_pipeline(schedule: Optional[str], pp: int, m: int, vpp: Optional[int], fwd: Optional[float],
                 bwd: Optional[float], wgrad: Optional[float], transfer: float, stage_times: Optional[str],
                 actions_file: Optional[str] = None, runtime: Optional[str] = None) -> dict:
    """Check the inputs, build and simulate the schedule; everything the outputs need, in one dict.
    With ``actions_file`` the schedule is read from it (torch's notation) instead of built.
    ``runtime`` (dependency, the default, or lockstep) is how the ranks advance
    (:mod:`meshplan.cli.pipeline_runtime`); a lockstep run is also simulated dependency-driven,
    to show what lockstep costs."""
    asked = check_runtime(runtime)
    if actions_file is not None:
        given = read_actions_file(actions_file)
        pp = len(given)
        m = 1 + max((a.microbatch for acts in given for a in acts), default=0)
        schedule = "from-file"
    _count("pp", pp, MAX_PP)
    _count("microbatches", m, MAX_M)
    if vpp is not None:
        _count("vpp", vpp, MAX_VPP)
    name = (schedule or ("interleaved" if vpp and vpp > 1 else "1f1b")).strip()
    v_asked = vpp if vpp is not None else (2 if name in ("interleaved", "interleaved-zb", "zbv") else 1)
    if actions_file is not None:
        v_asked = max(1, math.ceil((1 + max((a.stage for acts in given for a in acts), default=0)) / pp))
    if pp * v_asked * m > MAX_STAGES:
        raise InputError("microbatches", f"p·v·m = {pp * v_asked * m:,} micro-batch stages is more than the {MAX_STAGES:,} a run simulates")
    transfer = _time("transfer", transfer, positive=False)
    if stage_times is not None and (fwd is not None or bwd is not None or wgrad is not None):
        raise InputError("stage_times", "give either --stage-times (f:b or f:b:w per stage) or --fwd/--bwd/--wgrad, not both")
    f_rank = _time("fwd", 1.0 if fwd is None else fwd)
    b_rank = _time("bwd", 2.0 if bwd is None else bwd)
    w_rank = None if wgrad is None else _time("wgrad", wgrad, positive=False)
    if w_rank is not None and w_rank > b_rank:
        raise InputError("wgrad", f"must not exceed the backward time {b_rank:g}: W is the weight-gradient part of it")

    ranks = given if actions_file is not None else sched.build_schedule(name, pp, m, v_asked)
    n_stages = 1 + max(a.stage for acts in ranks for a in acts)
    v = max(1, math.ceil(n_stages / pp))
    if vpp is not None and v != vpp:
        raise InputError("vpp", f"the {name} schedule runs {v} virtual stage(s) per rank, not {vpp}")
    if stage_times is not None:
        f_st, b_st, w_st = parse_stage_times(stage_times, n_stages)
    else:
        f_st, b_st = [f_rank / v] * n_stages, [b_rank / v] * n_stages
        w_st = None if w_rank is None else [w_rank / v] * n_stages
    given = "stage_times" if stage_times is not None else None
    check_time_range([(given or "fwd", f_st), (given or "bwd", b_st), (given or "wgrad", w_st or []), ("transfer", [transfer])])
    kinds = {a.kind for acts in ranks for a in acts}
    ran, grid, words = resolve_runtime(asked, name, pp, m, v, ranks, actions_file is not None)
    try:
        dependency = simulate(ranks, n_stages, f_st, b_st, transfer=transfer, keep_timeline=True, wgt=w_st)
    except RuntimeError as err:  # a deadlocked schedule: say which, on one line
        raise InputError("schedule", f"{name} with p = {pp}, m = {m}, v = {v}: {err}") from None
    result = dependency
    if grid is not None:
        result = simulate(sched.compile_schedule(grid, pp, m, v), n_stages, f_st, b_st, transfer=transfer,
                          keep_timeline=True, wgt=w_st, runtime=ran)
    closed = None
    uniform = transfer == 0.0 and len(set(f_st)) == 1 and len(set(b_st)) == 1
    if name in CLOSED_FORMS and kinds <= {"F", "B"} and uniform:
        closed = uniform_makespan(name, pp, m, v, f_st[0], b_st[0])
    elif name == "zbh1" and uniform:
        w_one = w_st[0] if w_st is not None and len(set(w_st)) == 1 else (b_st[0] / 2 if w_st is None else None)
        if w_one is not None:
            closed = zbh1_makespan(pp, m, f_st[0], b_st[0], w_one)
    return {"schedule": name, "pp": pp, "m": m, "v": v, "n_stages": n_stages, "ranks": ranks, "result": result,
            "dependency": dependency, "runtime": ran, "runtime_asked": asked, "runtime_words": words, "fwd": f_st, "bwd": b_st, "wgt": w_st,
            "split": bool(kinds & {"I", "W"}), "transfer": transfer, "per_stage_given": stage_times is not None, "closed": closed}


def to_json(run: dict) -> dict:
    """The run as ``meshplan pipeline --json`` gives it. The runtime fields (``pipeline_runtime``
    that ran, ``pipeline_runtime_requested``, ``runtime_note``, ``dependency_makespan``) come with
    a run of :func:`run_pipeline`; a run dict without them (a plan's timeline) leaves them out."""
    res: SimResult = run["result"]
    ranks = []
    for r, acts in enumerate(run["ranks"]):
        ranks.append({
            "rank": r, "busy": res.busy[r], "idle": res.idle[r], "peak_inflight": res.peak_inflight[r],
            "actions": [str(a) for a in acts],
            "timeline": [[str(a), max(0.0, s), e] for a, s, e in res.timeline[r]],  # no −1e-12 of rounding
        })
    runtime = {} if "runtime" not in run else {
        "pipeline_runtime": run["runtime"], "pipeline_runtime_requested": run["runtime_asked"],
        "runtime_note": run["runtime_words"], "dependency_makespan": run["dependency"].makespan}
    return {"schedule": run["schedule"], "pp": run["pp"], "microbatches": run["m"], "vpp": run["v"], **runtime,
            "makespan": res.makespan, "bubble_fraction": res.bubble_fraction,
            "bubble_overhead": res.bubble_overhead, "ranks": ranks}


def _times_lines(run: dict, unit: str) -> list[str]:
    f, b, w, v = run["fwd"], run["bwd"], run["wgt"], run["v"]
    if run["per_stage_given"]:
        pairs = ", ".join(f"{fmt_time(x)}:{fmt_time(y)}" + (f":{fmt_time(w[k])}" if w else "")
                          for k, (x, y) in enumerate(zip(f, b)))
        text = f"times per virtual stage (forward:backward{':W' if w else ''}, {unit}): {pairs}"
    else:
        text = f"times per rank: forward {fmt_time(f[0] * v)} {unit}, backward {fmt_time(b[0] * v)} {unit}"
        if w or run["split"]:
            part = f"{fmt_time(w[0] * v)} {unit}" if w else "half of it (default)"
            text += f", of which W (weight gradient) {part}"
        if v > 1:
            text += f" (each of the {v} chunks gets 1/{v}: {fmt_time(f[0])} and {fmt_time(b[0])} {unit})"
    lines = [text + f"; transfer {fmt_time(run['transfer'])} {unit}"]
    if w and not run["split"]:
        lines.append(f"note: the W time is unused: the {run['schedule']} schedule does not split the backward")
    return lines


def rank_table(run: dict, unit: str) -> Table:
    res: SimResult = run["result"]
    pp, v = run["pp"], run["v"]
    t = FitTable(title=f"Per rank (times in {unit})", box=box.SIMPLE_HEAD, title_justify="left")
    peak = "peak in flight (micro-batch chunks)" if v > 1 else "peak in-flight micro-batches"
    for col in ("rank", "virtual stages" if v > 1 else "stage", "busy", "idle", "idle % of step", peak):
        t.add_column(col, justify="right")
    stages = [sorted({a.stage for a in acts}) for acts in run["ranks"]]
    for r in range(pp):
        idle = res.idle[r]
        t.add_row(str(r), ", ".join(map(str, stages[r])) if v > 1 else str(stages[r][0]),
                  f"{res.busy[r]:.4g}", f"{idle:.4g}", f"{100 * idle / res.makespan:.1f}%", str(res.peak_inflight[r]))
    return t


def closed_form_lines(run: dict, unit: str) -> list[str]:
    """The closed form next to the simulation it must equal: the dependency-driven run (the closed
    forms assume an action waits only for its rank and its input; a lockstep run is longer)."""
    closed = run["closed"]
    if closed is None:
        return ["closed form: not shown (it needs gpipe, 1f1b, interleaved, or zbh1 with m ≥ p and W ≤ I; "
                "equal stages and zero transfer)"]
    res: SimResult = run["dependency"]
    sim = "the dependency-driven simulation" if run["runtime"] != "dependency" else "the simulation"
    p, m, v, f, b = run["pp"], run["m"], run["v"], run["fwd"][0], run["bwd"][0]
    if run["schedule"] == "zbh1":
        w = run["wgt"][0] if run["wgt"] is not None else b / 2
        idle = (p - 1) * (f + b - 2 * w)
        agree = math.isclose(closed, res.makespan, rel_tol=1e-9)
        return [
            f"closed form (ZB-H1, equal stages, free transfers): makespan m·(f + b) + (p − 1)·(f + i − w) = "
            f"{m}·({fmt_time(f)} + {fmt_time(b)}) + ({p} − 1)·({fmt_time(f)} + {fmt_time(b - w)} − {fmt_time(w)}) = {fmt_time(closed)} {unit}",
            f"  bubble fraction {idle / closed:.3f}; bubble overhead {idle / (m * (f + b)):.3f}",
            f"  {sim} agrees with the closed form" if agree else
            f"  {sim} does NOT agree with the closed form ({fmt_time(res.makespan)} vs {fmt_time(closed)} {unit})",
        ]
    if v == 1:
        expr = f"(m + p − 1)·(f + b) = ({m} + {p} − 1)·({fmt_time(f)} + {fmt_time(b)})"
    else:
        expr = f"(m·v + p − 1)·(f + b)/v = ({m}·{v} + {p} − 1)·({fmt_time(f * v)} + {fmt_time(b * v)})/{v}"
    frac, over = (p - 1) / (m * v + p - 1), (p - 1) / (m * v)
    agree = math.isclose(closed, res.makespan, rel_tol=1e-9) and math.isclose(frac, res.bubble_fraction, rel_tol=1e-9, abs_tol=1e-12)
    mv = "m" if v == 1 else "m·v"
    return [
        f"closed form (equal stages, free transfers): makespan {expr} = {fmt_time(closed)} {unit}",
        f"  bubble fraction (p − 1)/({mv} + p − 1) = {frac:.3f}; bubble overhead (p − 1)/{mv if v == 1 else '(m·v)'} = {over:.3f}",
        f"  {sim} agrees with the closed form" if agree else
        f"  {sim} does NOT agree with the closed form ({fmt_time(res.makespan)} vs {fmt_time(closed)} {unit})",
    ]


def print_human(run: dict, unit: str, width: Optional[int], show_actions: bool, wrote: Optional[Path]) -> None:
    out = render.console()
    res: SimResult = run["result"]
    p, m, v = run["pp"], run["m"], run["v"]
    out.print(f"[bold]{run['schedule']}[/bold] pipeline schedule: p = {p} ranks, m = {m} micro-batches, "
              f"v = {v} virtual stage{'s' if v > 1 else ''} per rank ({run['n_stages']} stages)")
    for line in _times_lines(run, unit):
        out.print(line, markup=False)
    out.print(f"pipeline runtime: {run['runtime_words']}", markup=False)
    out.print()
    pad = len(f"rank {p - 1} ")
    cols, span = (width, res.makespan) if width else round_columns(res.makespan, max(20, min(120, out.width - pad - 4)))
    kinds = sorted({a.kind for acts in run["ranks"] for a in acts}, key=lambda k: ("FBIW".find(k) % 5, k))
    legend = ", ".join(f"{k} {KIND_NAMES.get(k, k).split(' (')[0]}" for k in kinds)
    runtime = f" ({run['runtime']} runtime)" if run["runtime"] != "dependency" else ""
    out.print(Text(f"Gantt{runtime}: one column = {fmt_time(span / cols)} {unit}; {legend}, number = micro-batch, "
                   f"· idle" + ("; lighter = later chunk" if v > 1 else "")))
    for r, row in enumerate(rich_gantt(res, cols, span)):
        out.print(Text(f"rank {r}".ljust(pad)) + row, no_wrap=True, crop=False)
    out.print(text_axis(span, cols, pad, unit), no_wrap=True, crop=False, markup=False)
    if show_actions:
        out.print()
        out.print("actions per rank (torch notation: stage, kind, micro-batch):")
        for r, line in enumerate(sched.format_actions(run["ranks"])):
            out.print(f"rank {r}: {line}", markup=False, soft_wrap=True)
    out.print()
    out.print(rank_table(run, unit))
    out.print(f"makespan {fmt_time(res.makespan)} {unit}" + (f" ({run['runtime']})" if run["runtime"] != "dependency" else ""), markup=False)
    if run["runtime"] != "dependency":
        dep: SimResult = run["dependency"]
        extra, share = lockstep_cost(res.makespan, dep.makespan)
        name = {"lockstep": "lockstep", "deepspeed": "DeepSpeed's blocking exchange", "blocking": "Megatron-LM's blocking exchange"}[run["runtime"]]
        if share > 1e-12:
            out.print(f"{name} costs +{fmt_time(extra)} {unit} (+{100 * share:.1f}%) over the dependency-driven makespan "
                      f"{fmt_time(dep.makespan)} {unit} (bubble fraction {dep.bubble_fraction:.3f} dependency-driven)", markup=False)
        else:
            out.print(f"{name} costs nothing here: the dependency-driven makespan is the same, {fmt_time(dep.makespan)} {unit} "
                      "(no rank waits for an exchange it does not need yet)", markup=False)
    out.print(f"bubble fraction {res.bubble_fraction:.3f} (idle share of the step: Σ idle / (p·makespan))", markup=False)
    out.print(f"bubble overhead {res.bubble_overhead:.3f} (idle relative to busy time: Σ idle / Σ busy)", markup=False)
    for line in closed_form_lines(run, unit):
        out.print(line, markup=False)
    if wrote is not None:
        out.print(f"wrote {wrote}", markup=False)


def _out_path(out: Optional[str]) -> Optional[Path]:
    """The picture file ``--out`` names, checked before any work: an .svg or .png in an existing
    directory, and not an existing file (meshplan never overwrites what the user wrote)."""
    return None if out is None else out_path(out, (".svg", ".png"))


def pipeline(
    pp: Annotated[int, typer.Option("--pp", help="Pipeline ranks p.")] = 4,
    microbatches: Annotated[int, typer.Option("--microbatches", "-m", help="Micro-batches m per step.")] = 8,
    vpp: Annotated[Optional[int], typer.Option("--vpp", help="Virtual stages (chunks) per rank; > 1 selects interleaved. (default: 1, or 2 with --schedule interleaved)", show_default=False)] = None,
    schedule: Annotated[Optional[str], typer.Option("--schedule", help=f"Pipeline schedule: {', '.join(schedule_names())}. (default: 1f1b, or interleaved when --vpp > 1)", show_default=False)] = None,
    fwd: Annotated[Optional[float], typer.Option("--fwd", "--f", help="Forward time per micro-batch of one rank's whole share; each of v chunks gets 1/v. (default: 1)", show_default=False)] = None,
    bwd: Annotated[Optional[float], typer.Option("--bwd", "--b", help="Backward time per micro-batch of one rank's whole share; each chunk gets 1/v. (default: 2)", show_default=False)] = None,
    wgrad: Annotated[Optional[float], typer.Option("--wgrad", "--w", help="Weight-gradient part of --bwd, run as W by schedules that split the backward (the rest is I). (default: half of --bwd)", show_default=False)] = None,
    transfer: Annotated[float, typer.Option("--transfer", "--p2p", help="Point-to-point time between consecutive stages.")] = 0.0,
    actions_file: Annotated[Optional[str], typer.Option("--actions-file", help="Simulate the schedule in this file instead: one rank per line in torch's action notation (0F0,0F1,0B0,...; comm actions skipped).", show_default=False)] = None,
    pipeline_runtime: Annotated[Optional[Literal["dependency", "lockstep", "deepspeed", "blocking"]], typer.Option("--pipeline-runtime", help=RUNTIME_HELP, show_default=False)] = None,
    stack: Annotated[Optional[str], typer.Option("--stack", help="A stack profile (meshplan stacks) whose pipeline runtime runs the schedule unless --pipeline-runtime is given, e.g. torchtitan-2024 (lockstep).", show_default=False)] = None,
    stage_times: Annotated[Optional[str], typer.Option("--stage-times", help="Per virtual stage 'f0:b0,f1:b1,...' in pipeline order (p·v pairs), instead of --fwd/--bwd.", show_default=False)] = None,
    unit: Annotated[str, typer.Option("--unit", help="Label of the time unit the numbers are in.")] = "ms",
    out: Annotated[Optional[str], typer.Option("--out", help="Write the Gantt picture to this path: .svg, or .png (needs matplotlib, the 'plot' extra).", show_default=False)] = None,
    actions: Annotated[bool, typer.Option("--actions", help="Also print each rank's action list in torch notation (0F0,0F1,0B0,...).")] = False,
    width: Annotated[Optional[int], typer.Option("--width", help="Columns of the terminal Gantt. (default: fit the terminal, at most 120)", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else.")] = False,
) -> None:
    """Show what every pipeline rank does when: Gantt, per-rank busy/idle and peak in-flight micro-batches, makespan, bubble fraction and overhead.

    --fwd/--bwd are per pipeline rank (its whole share of the model); with v virtual stages each chunk gets 1/v of them, so schedules compare on the same model."""
    unit = unit.strip()
    if not unit or len(unit) > 16 or not unit.isprintable():
        raise InputError("unit", "must be a short printable label such as ms or s (1 to 16 characters)")
    if width is not None:
        _count("width", width, 1000)
    path = _out_path(out)
    if pipeline_runtime is None and stack is not None:
        pipeline_runtime = load_stack(stack).pipeline_runtime
    run = run_pipeline(schedule, pp, microbatches, vpp, fwd, bwd, wgrad, transfer, stage_times, actions_file, pipeline_runtime)
    if path is not None:
        title = f"{run['schedule']} pipeline: p = {run['pp']}, m = {run['m']}, v = {run['v']}"
        if run["runtime"] != "dependency":
            extra, share = lockstep_cost(run["result"].makespan, run["dependency"].makespan)
            title += (f", {run['runtime']} runtime (+{fmt_time(extra)} {unit}, +{100 * share:.1f}% over dependency-driven)"
                      if share > 1e-12 else f", {run['runtime']} runtime (as long as dependency-driven)")
        if path.suffix.lower() == ".png":
            from meshplan.pipeline.gantt_png import write_png_gantt

            write_png_gantt(run["result"], title, path, unit)
        else:
            write_text(path, svg_gantt(run["result"], title, unit), out)
    if json_out:
        typer.echo(json.dumps(to_json(run), allow_nan=False))
        return
    print_human(run, unit, width, actions, path)


__all__ = ["pipeline", "run_pipeline", "to_json", "parse_stage_times", "schedule_names"]
