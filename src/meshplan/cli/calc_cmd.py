"""``meshplan calc …``: the source documents' calculators (library: :mod:`meshplan.calc`).

Subcommands: collective, overlap, checkpoint, zero, failures, batch, lr, formats, loss-scale,
roofline, cost. Each prints its figures as a table; ``--explain`` shows every figure's formula,
symbols with their values, result and source; ``--json`` prints one JSON object (SI units) and
nothing else. Sizes take units (``2GB``, ``1GiB``, ``750MB``), durations too (``5us``, ``1.5ms``,
``98s``, ``68min``, ``24h``, ``54d``), counts power-of-1000 suffixes (``7B``, ``15.6T``); bandwidths
are GB/s (1e9 bytes/s) per GPU per direction. Bad input: one line ``error: <field>: <rule>`` on
stderr, exit status 2.
"""

from __future__ import annotations

import functools
import json
import math
from contextvars import ContextVar
from typing import Annotated, Any, Callable, Optional

import typer
from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

from meshplan.calc import batch as batch_mod
from meshplan.calc import checkpoint as ckpt_mod
from meshplan.calc import collective as coll_mod
from meshplan.calc import cost as cost_mod
from meshplan.calc import failures as fail_mod
from meshplan.calc import formats as fmt_mod
from meshplan.calc import loss_scale as ls_mod
from meshplan.calc import lr as lr_mod
from meshplan.calc import overlap as ov_mod
from meshplan.calc import roofline as roof_mod
from meshplan.calc.inputs import choice, count, parse_duration, parse_number, parse_size, positive
from meshplan.calc.result import CalcResult, num, secs, size
from meshplan.cli import calc_plan, render
from meshplan.cli.fit import FitTable
from meshplan.cli.options import PlanArgs, plan_options
from meshplan.cli.pipeline_cmd import _out_path
from meshplan.errors import InputError
from meshplan.explain import render as render_derivations
from meshplan.specs.base import input_error_from
from meshplan.specs.plan import PrecisionRecipe
from meshplan.units import DAY, GBPS, HOUR

calc_app = typer.Typer(
    name="calc",
    help="The calculators: collectives, overlap, checkpointing and failures, batch and LR schedules, number formats, loss scaling, roofline, cost. Each with --explain and --json.",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

Json = Annotated[bool, typer.Option("--json", help="Print one JSON object (SI units) and nothing else.")]
Explain = Annotated[bool, typer.Option("--explain", help="Show each figure's formula, symbols with their values, result and source.")]
Gpu = Annotated[str, typer.Option("--gpu", help="Catalog GPU (see `meshplan gpus`).")]
Out = Annotated[Optional[str], typer.Option("--out", help="Write the picture to this .svg or .png (needs matplotlib: the 'plot' extra).", show_default=False)]


#: Where :func:`emit` hands its JSON text instead of printing it, and where bad input is raised
#: instead of printed (the web API, :mod:`meshplan.web.calc_api`): one list per request, so that
#: requests in several threads never share stdout; None (the CLI): print.
json_sink: ContextVar[Optional[list]] = ContextVar("calc_json_sink", default=None)


def _command(name: str):
    """Register a subcommand whose bad input (InputError, pydantic error) becomes one line on
    stderr and exit status 2, also when the sub-app runs on its own (e.g. under CliRunner)."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> None:
            try:
                fn(*args, **kwargs)
            except (InputError, ValidationError) as err:
                if json_sink.get() is not None:
                    raise
                text = str(input_error_from(err) if isinstance(err, ValidationError) else err)
                typer.echo("error: " + " ".join(text.split()), err=True)
                raise typer.Exit(2) from None
        return calc_app.command(name)(run)
    return wrap


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def emit(result: CalcResult, json_out: bool, explain: bool, extra: Callable[[Console], None] | None = None,
         notes: tuple[str, ...] = ()) -> None:
    """JSON, the derivations, or the table of figures (then ``extra`` and the notes)."""
    notes = result.notes + tuple(notes)
    if json_out:
        d = result.to_dict(explain)
        if notes:
            d["notes"] = list(notes)
        text = json.dumps(_jsonable(d), allow_nan=False)
        sink = json_sink.get()
        if sink is not None:
            sink.append(text)
        else:
            typer.echo(text)
        return
    out = render.console()
    if explain:
        out.print(render_derivations(list(result.derivations)).rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
    else:
        t = FitTable(box=box.SIMPLE_HEAD, title=f"meshplan calc {result.kind}", title_justify="left")
        t.add_column("figure")
        t.add_column("value")
        for d in result.derivations:
            t.add_row(d.title, d.value)
        out.print(t)
    if extra is not None:
        extra(out)
    for note in notes:
        out.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)


def _bw(field: str, gbps: Optional[float]) -> Optional[float]:
    return None if gbps is None else positive(field, gbps) * GBPS


def _dur(field: str, text: Optional[str]) -> Optional[float]:
    return None if text is None else parse_duration(field, text)


def _recipe(precision: str, grad_dtype: str, master: bool, optimizer: str) -> PrecisionRecipe:
    return PrecisionRecipe.build(where="precision", precision=precision, grad_dtype=grad_dtype, master_weights=master, optimizer=optimizer)


Precision = Annotated[str, typer.Option("--precision", help="Weights for compute: fp32, bf16, fp16, fp8 (fp8 keeps bf16 weights).")]
GradDtype = Annotated[str, typer.Option("--grad-dtype", help="Gradient dtype: fp32, bf16, fp16.")]
Master = Annotated[bool, typer.Option("--master-weights/--no-master-weights", help="fp32 master copy of 16-bit weights.")]
Optimizer = Annotated[str, typer.Option("--optimizer", help="adam (two fp32 moments) or sgd (momentum).")]
Params = Annotated[str, typer.Option("--params", help="Parameters, e.g. 70B.")]
Mtbf = Annotated[Optional[str], typer.Option("--mtbf", help="Cluster mean time between failures, e.g. 24h (default: from the GPU count, --gpus or a plan's, at Llama 3's 419 interruptions in 54 days on 16,384 GPUs).", show_default=False)]
Components = Annotated[Optional[list[str]], typer.Option("--component", help="name:count:mtbf per component (repeatable), e.g. gpu:16384:50000h; cluster MTBF = 1/Σ(count/mtbf).", show_default=False)]


# ---- collective --------------------------------------------------------------------------------


@_command("collective")
def collective(
    op: Annotated[str, typer.Option("--op", help="all-reduce, all-gather, reduce-scatter, all-to-all, broadcast, reduce, send-recv.")] = "all-reduce",
    size_: Annotated[str, typer.Option("--size", help="Buffer size (nccl-tests' size: the all-reduce buffer, the all-gather output), e.g. 1GB, 256MiB.")] = "1GB",
    n: Annotated[int, typer.Option("--n", help="GPUs in the group (≥ 2).")] = 8,
    algorithm: Annotated[str, typer.Option("--algorithm", help="auto (the faster of ring and tree), ring, tree.")] = "auto",
    gpu: Gpu = "h100-sxm-80gb",
    bw: Annotated[Optional[float], typer.Option("--bw", help="GB/s per GPU per direction inside a scale-up domain (default: the GPU's, H100 450).", show_default=False)] = None,
    latency: Annotated[Optional[str], typer.Option("--latency", help="Per-step latency inside a domain (default: NCCL's 3.4us).", show_default=False)] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per scale-up domain; fewer than --n makes the collective hierarchical (default: all n in one domain).", show_default=False)] = None,
    inter_bw: Annotated[Optional[float], typer.Option("--inter-bw", help="GB/s per GPU per direction across domains (default: the GPU's NIC, H100 50).", show_default=False)] = None,
    inter_latency: Annotated[Optional[str], typer.Option("--inter-latency", help="Per-step latency across domains (default: NCCL's 14us).", show_default=False)] = None,
    base_latency: Annotated[Optional[str], typer.Option("--base-latency", help="Fixed latency per call (default: NCCL's 8.4us; 0us for the textbook α–β model).", show_default=False)] = None,
    efficiency: Annotated[float, typer.Option("--efficiency", help="Achieved / line-rate bandwidth (1 = ideal, as the sources; meshplan estimate uses 0.82 NVLink, 0.92 NIC on Hopper).")] = 1.0,
    simulate: Annotated[bool, typer.Option("--simulate", help="Also run a ring all-reduce step by step on numpy arrays of --elements float32 values per rank.")] = False,
    elements: Annotated[Optional[int], typer.Option("--elements", help="Values per rank in the simulation (default: 4·n).", show_default=False)] = None,
    trace: Annotated[bool, typer.Option("--trace", help="Show which chunk moves where at each step of the simulated ring (implies --simulate).")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the simulated arrays.")] = 0,
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """One collective: steps, bytes each GPU sends, time (latency + bandwidth), algbw and busbw as nccl-tests reports them, the ring/tree crossover; hierarchical when the group spans domains."""
    net = coll_mod.network_for_gpu(gpu, bw=_bw("bw", bw), latency=_dur("latency", latency), gpus_per_node=gpus_per_node,
                                   inter_bw=_bw("inter_bw", inter_bw), inter_latency=_dur("inter_latency", inter_latency),
                                   base_latency=_dur("base_latency", base_latency), efficiency=efficiency)
    res = coll_mod.collective(op, parse_size("size", size_), n, net, algorithm)
    sim = None
    if simulate or trace:
        if res.data["op"] != "all_reduce":
            raise InputError("simulate", "the step-by-step simulation runs a ring all-reduce (--op all-reduce)")
        sim = coll_mod.simulate_ring_all_reduce(n, elements if elements is not None else 4 * n, seed)
        res.data["simulation"] = coll_mod.ring_sim_result(sim)
        if trace:
            res.data["simulation"]["trace"] = [list(t) for t in sim.trace]

    def extra(out: Console) -> None:
        if sim is None:
            return
        s = res.data["simulation"]
        ok = "equals the element-wise sum on every rank" if s["correct"] else f"WRONG (max error {s['max_abs_error']})"
        out.print(f"simulated ring all-reduce, {sim.n} ranks x {sim.elements:,} float32 values ({s['size_bytes']:,} bytes): "
                  f"{s['steps']} steps (model {s['model_steps']}), result {ok}", markup=False, soft_wrap=True)
        out.print(f"bytes sent per rank: {', '.join(f'{b:,}' for b in s['sent_bytes'])} (model 2(n−1)/n·S = {s['model_sent_bytes']:,.1f})", markup=False, soft_wrap=True)
        if trace:
            for line in coll_mod.format_trace(sim):
                out.print("  " + line, markup=False, highlight=False, soft_wrap=True)

    notes = () if efficiency < 1 else ("ideal links (efficiency 1); bandwidths are per GPU per direction (H100 NVLink 450 GB/s: '900 GB/s' counts both directions)",)
    emit(res, json_out, explain, extra, notes)


# ---- overlap -------------------------------------------------------------------------------


@_command("overlap")
def overlap(
    compute: Annotated[str, typer.Option("--compute", help="Compute the communication can hide behind: the backward (ddp) or the forward (fsdp), e.g. 200ms.")],
    comm: Annotated[Optional[str], typer.Option("--comm", help="All of that communication, e.g. 60ms; or give --grad-bytes.", show_default=False)] = None,
    buckets: Annotated[int, typer.Option("--buckets", help="Equal gradient buckets (ddp) or layers (fsdp). 1: nothing overlaps.")] = 1,
    mode: Annotated[str, typer.Option("--mode", help="ddp: all-reduce after each bucket's backward; fsdp: all-gather before each layer, prefetched.")] = "ddp",
    grad_bytes: Annotated[Optional[str], typer.Option("--grad-bytes", help="Bytes to all-reduce (ddp) or all-gather (fsdp) in total, costed as a flat ring with --n, --bw, --latency.", show_default=False)] = None,
    n: Annotated[int, typer.Option("--n", help="Data-parallel GPUs (with --grad-bytes).")] = 8,
    bw: Annotated[float, typer.Option("--bw", help="GB/s per GPU per direction (with --grad-bytes).")] = 50.0,
    latency: Annotated[str, typer.Option("--latency", help="Per-step latency (with --grad-bytes).")] = "0s",
    prefetch: Annotated[int, typer.Option("--prefetch", help="fsdp: all-gathers issued ahead of the layer computing.")] = 1,
    mfu: Annotated[Optional[float], typer.Option("--mfu", help="MFU without communication; shows it with the exposed part added.", show_default=False)] = None,
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """Communication hidden behind compute: bucketed gradient all-reduce (exposed = last bucket when it keeps up), FSDP prefetch, communication/compute ratio, MFU with the exposed part."""
    pieces = count("buckets", buckets, 1, ov_mod.MAX_PIECES)
    if (comm is None) == (grad_bytes is None):
        raise InputError("comm", "give the communication time (--comm) or the bytes to move (--grad-bytes)")
    if comm is not None:
        total = parse_duration("comm", comm)
    else:
        op = "all_reduce" if choice("mode", mode, ov_mod.MODES) == "ddp" else "all_gather"
        net = coll_mod.Network(bw=positive("bw", bw) * GBPS, latency=parse_duration("latency", latency))
        piece = coll_mod.collective(op, parse_size("grad_bytes", grad_bytes) / pieces, n, net, "ring")
        total = pieces * piece.data["time_s"]
    emit(ov_mod.overlap(parse_duration("compute", compute), total, pieces, mode, mfu, prefetch), json_out, explain)


# ---- checkpoint and zero -----------------------------------------------------------------------




@_command("checkpoint")
@plan_options
def checkpoint(
    plan: PlanArgs,
    params: Annotated[Optional[str], typer.Option("--params", help="Parameters, e.g. 70B; or give a plan (--preset, --plan, estimate flags).", show_default=False)] = None,
    write_bw: Annotated[Optional[float], typer.Option("--write-bw", help="GB/s one writer sustains to the filesystem. (default: 10 with --params, 1 per GPU with a plan)", show_default=False)] = None,
    writers: Annotated[Optional[int], typer.Option("--writers", help="Writers in parallel (1: one process writes all; N: each rank its shard). (default: 1 with --params, every GPU with a plan)", show_default=False)] = None,
    fs_bw: Annotated[Optional[float], typer.Option("--fs-bw", help="GB/s the filesystem accepts in total (caps writers × write-bw; 0: none). (default: none with --params, 2000 with a plan)", show_default=False)] = None,
    mtbf: Mtbf = None,
    component: Components = None,
    recovery: Annotated[str, typer.Option("--recovery", help="Restart time after a failure: detect, reschedule, reload; 'read-back': the write time.")] = "5min",
    interval: Annotated[Optional[str], typer.Option("--interval", help="Checkpoint interval (default: Young's optimum).", show_default=False)] = None,
    step_time: Annotated[Optional[str], typer.Option("--step-time", help="Optimizer step time, to state the interval in steps (default: the plan's).", show_default=False)] = None,
    run: Annotated[Optional[str], typer.Option("--run", help="Length of the run, e.g. 30d: crashes and their total cost (default: the plan's with --tokens).", show_default=False)] = None,
    optimizer: Optimizer = "adam",
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """Checkpoint size per precision recipe, write time (serial or sharded), optimal interval (Young, Daly), expected waste and goodput, cost per crash; of --params or of a plan."""
    notes: list[str] = []
    x = calc_plan.checkpoint_inputs(plan, params, write_bw, writers, fs_bw, optimizer, notes)
    M = calc_plan.mtbf_of(mtbf, component, x["gpus"], notes)
    if M is None:
        notes.append("no MTBF: give --mtbf, --component, --gpus or a plan for the interval, waste and cost per crash")
    res = ckpt_mod.checkpoint(x["params"], x["recipe"], x["writer_bw"], x["writers"], x["fs_bw"], M,
                              calc_plan.recovery_of(recovery), _dur("interval", interval),
                              _dur("step_time", step_time) or x["step_time"], x["gpus"], x["price"], _dur("run", run) or x["run_time"])
    emit(res, json_out, explain, notes=tuple(notes))


@_command("zero")
def zero(
    params: Params,
    stage: Annotated[int, typer.Option("--zero", help="ZeRO stage 0-3.")] = 1,
    dp: Annotated[int, typer.Option("--dp", help="Ranks sharing the model state.")] = 8,
    bw: Annotated[Optional[float], typer.Option("--bw", help="GB/s per GPU, to time the per-step communication.", show_default=False)] = None,
    precision: Precision = "bf16", grad_dtype: GradDtype = "bf16", master: Master = True, optimizer: Optimizer = "adam",
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """Model state per GPU under ZeRO 0-3 (weights, gradients, optimizer) and the bytes each GPU sends per step for them. Default recipe: the ZeRO paper's 2 + 2 + 12 bytes per parameter."""
    emit(ckpt_mod.zero_state(parse_number("params", params), _recipe(precision, grad_dtype, master, optimizer), stage, dp, _bw("bw", bw)),
         json_out, explain)


# ---- failures -----------------------------------------------------------------------------------


@_command("failures")
@plan_options
def failures(
    plan: PlanArgs,
    work: Annotated[Optional[str], typer.Option("--work", help="Failure-free compute time of the run, e.g. 54d (default: a plan's with --tokens).", show_default=False)] = None,
    checkpoint_time: Annotated[Optional[str], typer.Option("--checkpoint-time", help="Time to write one checkpoint (to disk), e.g. 98s (default: a plan's, as estimate --tokens writes it).", show_default=False)] = None,
    recovery: Annotated[str, typer.Option("--recovery", help="Restart after a failure: detect, replace, reload, e.g. 5min.")] = "5min",
    mtbf: Mtbf = None,
    component: Components = None,
    interval: Annotated[Optional[str], typer.Option("--interval", help="Checkpoint interval (default: Daly's optimum).", show_default=False)] = None,
    memory_checkpoint_time: Annotated[Optional[str], typer.Option("--in-memory-checkpoint-time", help="Also simulate in-memory replicated checkpoints taking this long, e.g. 2s.", show_default=False)] = None,
    memory_recovery: Annotated[str, typer.Option("--in-memory-recovery", help="Restart from the in-memory copy.")] = "30s",
    runs: Annotated[int, typer.Option("--runs", help="Monte Carlo runs (0: analytic only).")] = 1000,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the Monte Carlo.")] = 0,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar on a terminal.")] = True,
    out: Out = None,
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """A run under random failures: Daly's expected wall-clock time and goodput, and a Monte Carlo of whole runs (failures, checkpoint writes, lost work, restarts) with percentiles and a timeline picture; disk vs in-memory checkpoints; of given times or of a plan."""
    notes: list[str] = []
    x = calc_plan.failures_inputs(plan, work, checkpoint_time, notes)
    M = calc_plan.mtbf_of(mtbf, component, x["gpus"], notes)
    if M is None:
        raise InputError("mtbf", "give the cluster's --mtbf (e.g. 2.4h), --component rates, or --gpus or a plan to derive it")
    path = _out_path(out)
    if path is not None and runs == 0:
        raise InputError("out", "the timeline comes from the Monte Carlo: give --runs ≥ 2")
    scenarios = [fail_mod.Scenario("disk", x["checkpoint"], parse_duration("recovery", recovery), _dur("interval", interval))]
    if memory_checkpoint_time is not None:
        scenarios.append(fail_mod.Scenario("in-memory", parse_duration("in_memory_checkpoint_time", memory_checkpoint_time),
                                           parse_duration("in_memory_recovery", memory_recovery)))
    W = x["work"]
    err = Console(stderr=True)
    show = progress and runs > 0 and err.is_terminal
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeRemainingColumn(),
                  console=err, transient=True, disable=not show) as bar:
        tasks = {sc.name: bar.add_task(f"Monte Carlo ({sc.name})", total=1.0) for sc in scenarios}
        res = fail_mod.failures(W, M, scenarios, runs, seed, lambda name, f: bar.update(tasks[name], completed=f), timeline=path is not None)
    if path is not None:
        from meshplan.calc.plots import plot_timelines

        unit, unit_name = (DAY, "days") if W >= 2 * DAY else (HOUR, "hours")
        plot_timelines(res.extra["timelines"], path, f"one simulated run: {secs(W)} of work, MTBF {secs(M)} (seed {seed})", unit, unit_name)

    def extra(o: Console) -> None:
        if runs:
            t = FitTable(box=box.SIMPLE_HEAD, title=f"Monte Carlo, {runs:,} runs (percentiles)", title_justify="left")
            for col in ("scenario", "figure", "p5", "p25", "p50", "p75", "p95", "mean ± s.e."):
                t.add_column(col, justify="left" if col in ("scenario", "figure") else "right")
            for sc in res.data["scenarios"]:
                mc = sc["monte_carlo"]
                for key, label, f in (("total_s", "wall-clock (days)", lambda x: f"{x / DAY:.3f}"), ("failures", "failures", lambda x: f"{x:,.1f}"),
                                      ("lost_s", "lost work (h)", lambda x: f"{x / HOUR:,.1f}"), ("goodput", "goodput", lambda x: f"{100 * x:.2f}%")):
                    st = mc[key]
                    t.add_row(sc["name"], label, *(f(st[f"p{p}"]) for p in fail_mod.PERCENTILES), f"{f(st['mean'])} ± {f(st['stderr'])}")
            o.print(t)
        if path is not None:
            o.print(f"wrote {path}", markup=False, soft_wrap=True)

    emit(res, json_out, explain, extra, tuple(notes))


# ---- batch and lr -------------------------------------------------------------------------------


@_command("batch")
def batch(
    target: Annotated[str, typer.Option("--target", help="Target global batch (sequences), e.g. 2048.")],
    micro: Annotated[int, typer.Option("--micro", "--micro-batch", help="Micro-batch per GPU (sequences).")] = 1,
    dp: Annotated[int, typer.Option("--dp", help="Data-parallel degree.")] = 1,
    micro_time: Annotated[Optional[str], typer.Option("--micro-time", help="Forward + backward of one micro-batch, e.g. 120ms.", show_default=False)] = None,
    allreduce_time: Annotated[Optional[str], typer.Option("--allreduce-time", help="Gradient all-reduce per optimizer step, e.g. 50ms.", show_default=False)] = None,
    critical: Annotated[Optional[str], typer.Option("--critical-batch", help="Critical batch B_crit in the unit of --target: step and compute efficiency (McCandlish 2018).", show_default=False)] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Tokens per sequence (reports tokens per step).", show_default=False)] = None,
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """Gradient accumulation for a target batch, the step time and throughput it gives, the all-reduce share with and without accumulation, and critical-batch efficiency."""
    res = batch_mod.batch(parse_number("target", target), micro, dp, _dur("micro_time", micro_time), _dur("allreduce_time", allreduce_time),
                          None if critical is None else parse_number("critical_batch", critical), seq_len)
    emit(res, json_out, explain)


@_command("lr")
def lr(
    base_lr: Annotated[Optional[float], typer.Option("--base-lr", help="LR tuned at --base-batch.", show_default=False)] = None,
    base_batch: Annotated[Optional[str], typer.Option("--base-batch", help="Batch the base LR was tuned at.", show_default=False)] = None,
    batch: Annotated[Optional[str], typer.Option("--batch", help="New batch: linear and square-root scaled LR, warmup.", show_default=False)] = None,
    base_warmup: Annotated[int, typer.Option("--base-warmup", help="Warmup steps at the base batch (heuristic: scaled by B/B₀).")] = 1000,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps of the run (the schedule's end T).", show_default=False)] = None,
    peak: Annotated[Optional[float], typer.Option("--peak", help="Peak LR of a schedule.", show_default=False)] = None,
    warmup: Annotated[Optional[int], typer.Option("--warmup", help="Linear warmup steps of the schedule.", show_default=False)] = None,
    floor: Annotated[float, typer.Option("--floor", help="LR at the end of the decay.")] = 0.0,
    schedule: Annotated[str, typer.Option("--schedule", help="Decay after warmup: cosine, linear, constant.")] = "cosine",
    preset: Annotated[Optional[str], typer.Option("--preset", help="A published schedule: llama3-405b (batch ramp 4M→8M→16M tokens, 8,000 warmup steps, cosine to 8e-7).", show_default=False)] = None,
    at: Annotated[Optional[list[int]], typer.Option("--at", help="Also give the LR at this step (repeatable).", show_default=False)] = None,
    out: Out = None,
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """LR scaling with batch size (linear, square root), the warmup heuristic, and warmup + cosine schedules with a batch ramp (the Llama 3 405B preset), with a picture of LR and batch over tokens."""
    parts = []
    if base_lr is not None or base_batch is not None or batch is not None:
        if base_lr is None or base_batch is None or batch is None:
            raise InputError("base_lr", "LR scaling needs --base-lr, --base-batch and --batch")
        parts.append(lr_mod.scaling(base_lr, parse_number("base_batch", base_batch), parse_number("batch", batch), base_warmup, steps))
    if preset is not None or peak is not None:
        parts.append(lr_mod.schedule(peak, warmup, steps, floor, schedule, preset, at))
    if not parts:
        raise InputError("peak", "give --base-lr/--base-batch/--batch (scaling), --peak/--steps (a schedule) or --preset")
    path = _out_path(out)
    sched = parts[-1]
    if path is not None:
        if sched.data.get("kind") is None:
            raise InputError("out", "the picture shows a schedule: give --peak/--steps or --preset")
        from meshplan.calc.plots import plot_schedule

        if preset is not None:
            s, ramp, end = lr_mod.PRESETS[preset.strip().lower()]
        else:
            s, ramp, end = lr_mod.Schedule(sched.data["peak"], sched.data["warmup_steps"], sched.data["total_steps"], sched.data["floor"], sched.data["kind"]), None, None
        plot_schedule(s, ramp, end, path, f"LR schedule{' ' + preset if preset else ''}: peak {s.peak:g}, warmup {s.warmup:,}, {s.kind} to {s.floor:g} at step {s.total:,}")
    res = parts[0] if len(parts) == 1 else CalcResult("lr", {"scaling": parts[0].data, "schedule": parts[1].data}, parts[0].derivations + parts[1].derivations)

    def extra(o: Console) -> None:
        rows = sched.data.get("milestones")
        if rows:
            t = FitTable(box=box.SIMPLE_HEAD, title="schedule landmarks", title_justify="left")
            t.add_column("step", justify="right")
            t.add_column("LR", justify="right")
            ramp = "tokens_seen" in rows[0]
            if ramp:
                t.add_column("tokens seen", justify="right")
                t.add_column("batch (tokens)", justify="right")
            for r in rows:
                t.add_row(f"{r['step']:,}", f"{r['lr']:.4g}", *((f"{r['tokens_seen']:.4g}", f"{r['batch_tokens']:,.0f}") if ramp else ()))
            o.print(t)
        for r in sched.data.get("at", []):
            o.print(f"LR at step {r['step']:,}: {r['lr']:.6g}", markup=False, soft_wrap=True)
        if path is not None:
            o.print(f"wrote {path}", markup=False, soft_wrap=True)

    emit(res, json_out, explain, extra)


# ---- numerics -----------------------------------------------------------------------------------


@_command("formats")
def formats(
    names: Annotated[Optional[list[str]], typer.Argument(help="Formats: fp32, tf32, bf16, fp16, fp8-e4m3, fp8-e5m2 (default: all).", show_default=False)] = None,
    elements: Annotated[Optional[str], typer.Option("--elements", help="A tensor of this many elements (a product like 2x4x4096x8192x80): its bytes in each format.", show_default=False)] = None,
    value: Annotated[Optional[float], typer.Option("--value", help="Round this number to each format (nearest, ties to even).", show_default=False)] = None,
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """Floating-point formats from their bit layout: exponent and mantissa bits, bias, max, smallest normal and subnormal, epsilon, decimal digits; tensor sizes; rounding."""
    res = fmt_mod.formats(names, None if elements is None else fmt_mod.parse_elements(elements), value)

    def extra(o: Console) -> None:
        t = FitTable(box=box.SIMPLE_HEAD, title="formats", title_justify="left")
        cols = ["format", "bits", "exp", "mant", "bias", "max", "min normal", "min subnormal", "eps", "digits"]
        cols += ["tensor"] if elements is not None else []
        cols += ["rounded"] if value is not None else []
        for c in cols:
            t.add_column(c, justify="left" if c == "format" else "right")
        for r in res.data["formats"]:
            row = [r["format"], str(r["bits"]), str(r["exponent_bits"]), str(r["mantissa_bits"]), str(r["bias"]), f"{r['max']:.6g}",
                   f"{r['min_normal']:.4g}", f"{r['min_subnormal']:.4g}", f"{r['eps']:.4g}", f"{r['decimal_digits']:.2f}"]
            row += [size(r["tensor_bytes"])] if elements is not None else []
            row += [f"{r['rounded']:.8g}"] if value is not None else []
            t.add_row(*row)
        o.print(t)

    if json_out or explain:
        emit(res, json_out, explain)
    else:
        extra(render.console())


@_command("loss-scale")
def loss_scale(
    overflow: Annotated[Optional[str], typer.Option("--overflow", help="Overflow flag per step, e.g. 0010011, or steps=N:i,j (overflows at steps i, j of N).", show_default=False)] = None,
    synthetic: Annotated[bool, typer.Option("--synthetic", help="Draw gradients instead: log-normal magnitudes with rare spikes.")] = False,
    steps: Annotated[int, typer.Option("--steps", help="Steps (--synthetic).")] = 5000,
    per_step: Annotated[int, typer.Option("--per-step", help="Gradient values drawn per step (--synthetic).")] = 1000,
    grad_median: Annotated[float, typer.Option("--grad-median", help="Median gradient magnitude (--synthetic).")] = 1e-5,
    grad_sigma: Annotated[float, typer.Option("--grad-sigma", help="Spread of log magnitudes, natural log (--synthetic).")] = 2.0,
    spike_prob: Annotated[float, typer.Option("--spike-prob", help="Probability of a loss spike per step (--synthetic).")] = 0.001,
    spike_factor: Annotated[float, typer.Option("--spike-factor", help="How much a spike multiplies the gradients (--synthetic).")] = 1e4,
    fmt: Annotated[str, typer.Option("--format", help="Gradient format (--synthetic).")] = "fp16",
    seed: Annotated[int, typer.Option("--seed", help="Seed (--synthetic).")] = 0,
    init_scale: Annotated[float, typer.Option("--init-scale", help="GradScaler init_scale.")] = 65536.0,
    growth_factor: Annotated[float, typer.Option("--growth-factor", help="GradScaler growth_factor.")] = 2.0,
    backoff_factor: Annotated[float, typer.Option("--backoff-factor", help="GradScaler backoff_factor.")] = 0.5,
    growth_interval: Annotated[int, typer.Option("--growth-interval", help="GradScaler growth_interval.")] = 2000,
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """Dynamic loss scaling with GradScaler's rules (backoff on overflow, growth after an interval of good steps) over given overflow flags or synthetic gradients."""
    cfg = ls_mod.ScalerConfig(init_scale, growth_factor, backoff_factor, growth_interval)
    if synthetic and overflow is not None:
        raise InputError("overflow", "give --overflow flags or --synthetic, not both")
    if synthetic:
        args = dict(steps=steps, per_step=per_step, median=grad_median, sigma=grad_sigma, spike_prob=spike_prob,
                    spike_factor=spike_factor, fmt=fmt, seed=seed)
        res = ls_mod.loss_scale(None, cfg, args)
    else:
        if overflow is None:
            raise InputError("overflow", "give --overflow flags (e.g. 0010011 or steps=100:10,50) or --synthetic")
        res = ls_mod.loss_scale(ls_mod.parse_flags(overflow), cfg)

    def extra(o: Console) -> None:
        changes = res.data["scale_changes"]
        shown = ", ".join(f"step {c['step']:,}: {num(c['scale'])}" for c in changes[:12])
        o.print(f"scale changes: {shown}{' …' if len(changes) > 12 else ''}", markup=False, soft_wrap=True)

    emit(res, json_out, explain, extra)


# ---- roofline and cost --------------------------------------------------------------------------


@_command("roofline")
def roofline(
    gemm: Annotated[Optional[str], typer.Option("--gemm", help="GEMM shape MxNxK, e.g. 4096x4096x4096.", show_default=False)] = None,
    elementwise: Annotated[Optional[str], typer.Option("--elementwise", help="Element-wise op over this many elements, e.g. 16M.", show_default=False)] = None,
    flops_per_element: Annotated[float, typer.Option("--flops-per-element", help="Element-wise FLOPs per element.")] = 1.0,
    reads: Annotated[int, typer.Option("--reads", help="Element-wise tensors read.")] = 1,
    writes: Annotated[int, typer.Option("--writes", help="Element-wise tensors written.")] = 1,
    output: Annotated[bool, typer.Option("--output/--no-output", help="GEMM: count writing the result (--no-output: operand reads only).")] = True,
    gpu: Gpu = "h100-sxm-80gb",
    dtype: Annotated[str, typer.Option("--dtype", help="fp32, tf32, bf16, fp16, fp8-e4m3, fp8-e5m2.")] = "bf16",
    out: Out = None,
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """Arithmetic intensity of a GEMM or element-wise op, the GPU's ridge point for the dtype, compute- or memory-bound, attainable FLOP/s; a roofline picture."""
    if (gemm is None) == (elementwise is None):
        raise InputError("gemm", "give --gemm MxNxK or --elementwise N")
    path = _out_path(out)
    if gemm is not None:
        res = roof_mod.gemm_roofline(gemm, gpu, dtype, output)
    else:
        res = roof_mod.elementwise_roofline(parse_number("elementwise", elementwise), gpu, dtype, flops_per_element, reads, writes)
    if path is not None:
        from meshplan.calc.plots import plot_roofline

        plot_roofline(res.data, path)
    emit(res, json_out, explain, (lambda o: o.print(f"wrote {path}", markup=False, soft_wrap=True)) if path is not None else None)


@_command("cost")
def cost(
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs of the run.")],
    days: Annotated[Optional[float], typer.Option("--days", help="Length of the run in days.", show_default=False)] = None,
    hours: Annotated[Optional[float], typer.Option("--hours", help="Length of the run in hours.", show_default=False)] = None,
    params: Annotated[Optional[str], typer.Option("--params", help="Parameters (token budget: 6·N·D FLOPs), e.g. 405B.", show_default=False)] = None,
    tokens: Annotated[Optional[str], typer.Option("--tokens", help="Tokens, e.g. 15.6T.", show_default=False)] = None,
    mfu: Annotated[Optional[float], typer.Option("--mfu", help="Model FLOP utilization for a token budget, e.g. 0.4.", show_default=False)] = None,
    gpu: Gpu = "h100-sxm-80gb",
    dtype: Annotated[str, typer.Option("--dtype", help="Peak FLOP/s of this dtype (dense).")] = "bf16",
    price: Annotated[Optional[float], typer.Option("--price", help="$ per GPU-hour.", show_default=False)] = None,
    watts: Annotated[Optional[float], typer.Option("--watts", help="Power per GPU (default: the catalog's board power).", show_default=False)] = None,
    pue: Annotated[float, typer.Option("--pue", help="Data-centre PUE (total / IT power).")] = 1.0,
    kwh_price: Annotated[Optional[float], typer.Option("--kwh-price", help="$ per kWh.", show_default=False)] = None,
    json_out: Json = False,
    explain: Explain = False,
) -> None:
    """GPU-hours, dollars and energy (kWh with PUE, electricity cost) for a run's length, or for a token budget at an MFU; with both, the implied MFU."""
    if days is not None and hours is not None:
        raise InputError("days", "give --days or --hours, not both")
    seconds = days * DAY if days is not None else (hours * HOUR if hours is not None else None)
    if seconds is not None:
        positive("days" if days is not None else "hours", seconds)
    res = cost_mod.cost(gpus, gpu, dtype, seconds, None if params is None else parse_number("params", params),
                        None if tokens is None else parse_number("tokens", tokens), mfu, price, watts, pue, kwh_price)
    emit(res, json_out, explain)


__all__ = ["calc_app"]
