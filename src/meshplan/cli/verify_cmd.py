"""``meshplan verify {flops,memory,comm,kernels}``: meshplan's predictions against torch on CPU or CUDA.

Each subcommand takes the plan options of ``meshplan estimate``, builds the Hugging Face model of
``--model`` (a catalog name or a config.json), measures with torch (FlopCounterMode, MemTracker /
FSDPMemTracker, collectives counted on a gloo process group), runs meshplan's prediction for the same
plan and prints one row per item: torch measured, meshplan predicted, the named known difference,
the difference, the tolerance and the verdict. ``--json`` prints the same as one object. Exit status
1 when any item is beyond its tolerance, 2 for bad input or when torch is not installed.
``kernels`` is a measurement with no tolerance: one layer's kernel times on a GPU beside meshplan's
predictions and the calibration constants they imply (:mod:`meshplan.verify.kernels`); exit 0.

``--device cpu`` (the default) runs on CPU (gloo); ``--device cuda`` runs one process per GPU on NCCL
with real tensors, and exits 2 naming ``--device`` when torch sees no GPU or fewer GPUs than the
plan has ranks (:mod:`meshplan.verify.device`).

torch and transformers are imported only when a subcommand runs (the ``verify`` extra).

Defaults that differ from ``estimate``: dp = 1 (gpus = tp·pp) unless --dp or --gpus is given; the global batch is one micro-batch per DP rank (two per
pipeline stage with pp > 1, so that the schedule has work to overlap); memory and comm run the fp32
recipe (``--precision fp32``) and, with dp > 1, FSDP2 (``--zero 3``) unless told otherwise.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Literal, Optional

import typer
from rich import box

from meshplan.cli import render
from meshplan.cli.fit import FitTable
from meshplan.cli.options import PlanArgs, Setup, plan_options, resolve
from meshplan.errors import InputError

verify_app = typer.Typer(
    help="Check meshplan against real torch execution on CPU (or CUDA GPUs with --device cuda): FLOPs (FlopCounterMode), memory (MemTracker, "
    "FSDPMemTracker) and collectives (gloo process group), exit 1 when an item is beyond tolerance; kernel times on a GPU "
    "against the compute model (kernels).",
    no_args_is_help=True,
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else.")]
DeviceOption = Annotated[
    str,
    typer.Option("--device", help="cpu (default: gloo, fake tensors for flops and memory) or cuda (one process per GPU, "
                 "NCCL, real tensors; the plan's ranks must not outnumber the visible GPUs)."),
]


def _verify_module(name: str):
    """``meshplan.verify.<name>``, or one clear error line when the extra is not installed."""
    import importlib

    try:
        for dependency in ("torch", "transformers"):
            __import__(dependency)
    except ImportError as exc:
        raise InputError("verify", f"needs torch and transformers ({exc.name} is missing): install meshplan[verify]") from None
    return importlib.import_module(f"meshplan.verify.{name}")


def _setup(plan: PlanArgs, kind: str) -> Setup:
    """resolve() with verify's defaults (see the module docstring)."""
    args = dataclasses.replace(plan)
    if args.gpus is None and args.dp is None and args.preset is None:
        args.dp = 1  # one rank per tp x pp position unless told otherwise
    if kind in ("memory", "comm"):
        if args.precision is None:
            args.precision = "fp32"
        if args.zero is None:
            args.zero = "__dp__"  # decided once dp is known
    zero_auto = args.zero == "__dp__"
    if zero_auto:
        args.zero = None
    if args.global_batch is None and args.global_batch_tokens is None:
        first = resolve(args)
        p = first.plan
        args.global_batch = p.micro_batch * p.dp * (2 * p.pp if p.pp > 1 else 1)
    if zero_auto:
        dp = resolve(args).plan.dp
        args.zero = "3" if dp > 1 else "0"
    return resolve(args)


def _fmt(x: float, unit: str) -> str:
    if unit == "B" and abs(x) >= 2**20:
        return f"{x:,.0f} ({x / 2**20:,.2f} MiB)"
    return f"{x:,.0f}"


def _tol(t: float) -> str:
    return "exact" if t == 0 else f"±{100 * t:g}%"


def print_comparison(comparison) -> None:
    """The rich table of a :class:`~meshplan.verify.compare.Comparison`, then its known differences."""
    con = render.console()
    table = FitTable(title=comparison.title, box=box.SIMPLE_HEAVY, title_justify="left")
    for col, just in (("item", "left"), ("torch measured", "right"), ("meshplan predicted", "right"),
                      ("known difference", "right"), ("difference", "right"), ("tolerance", "right"), ("verdict", "left")):
        table.add_column(col, justify=just)
    for r in comparison.rows:
        known = _fmt(r.known, r.unit) if r.known else ""
        if r.notes and r.known:
            known += " [" + ", ".join(r.notes) + "]"
        rel = "" if r.expected == 0 else f" ({100 * r.relative:+.2f}%)"
        verdict = "[green]ok[/green]" if r.ok else "[bold red]BEYOND[/bold red]"
        table.add_row(r.item, _fmt(r.measured, r.unit), _fmt(r.predicted, r.unit), known,
                      f"{r.difference:+,.0f}{rel}", _tol(r.tolerance), verdict)
    con.print(table)
    if comparison.known:
        con.print("Known differences (added to meshplan's figure before judging):")
        for k in comparison.known.values():
            con.print(f"  {k.name}: {k.explanation}")
    how = comparison.setup.get("how")
    if how:
        con.print(f"Measured with: {how}")
    failures = comparison.failures
    con.print(f"{len(comparison.rows) - len(failures)} of {len(comparison.rows)} items within tolerance"
              + ("" if not failures else f"; beyond: {', '.join(r.item for r in failures)}"))


def _check_device(device: str, world: int) -> None:
    """``--device`` against the GPUs torch sees (one line naming --device when it cannot run)."""
    from meshplan.verify.device import check

    check(device, world)


def _finish(comparison, json_out: bool) -> None:
    if json_out:
        typer.echo(json.dumps(comparison.to_dict(), default=str))
    else:
        print_comparison(comparison)
    if not comparison.ok:
        raise typer.Exit(1)


@verify_app.command("flops")
@plan_options
def flops(
    plan: PlanArgs,
    json_out: JsonFlag = False,
    attn_impl: Annotated[Literal["sdpa", "eager"], typer.Option("--attn-impl", help="Hugging Face attention implementation: sdpa (CPU flash kernel) or eager (bmm).")] = "sdpa",
    device: DeviceOption = "cpu",
) -> None:
    """FLOPs of one micro-batch, forward + backward, by FlopCounterMode (fake CPU tensors, or real ones on one GPU with --device cuda), against meshplan's dense and attention FLOPs (full s² convention, as the counter counts)."""
    setup = _setup(plan, "flops")
    mod = _verify_module("flops")
    _check_device(device, 1)
    p = setup.plan
    _finish(mod.compare(setup.model, p.micro_batch, p.seq_len, attn=attn_impl, recompute=p.recompute, device=device), json_out)


@verify_app.command("memory")
@plan_options
def memory(plan: PlanArgs, json_out: JsonFlag = False, device: DeviceOption = "cpu") -> None:
    """Weights, gradients, optimizer state, activations and the peak per rank over two AdamW steps: MemTracker on one device, under TP (--tp N) or ZeRO-1 (--dp N --zero 1); FSDPMemTracker for FSDP2 (--zero 3, --zero 2 = weights kept gathered, --dp-shard for HSDP), also over TP (--tp T --dp N --zero 3); on a fake process group, or with --device cuda on one GPU per rank (NCCL) beside the CUDA allocator's peak."""
    setup = _setup(plan, "memory")
    mod = _verify_module("memory")
    mod.check_plan(setup.model, setup.plan)
    _check_device(device, setup.plan.tp * setup.plan.dp)
    _finish(mod.compare(setup.model, setup.plan, setup.cluster, device=device), json_out)


@verify_app.command("comm")
@plan_options
def comm(
    plan: PlanArgs,
    json_out: JsonFlag = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds before the workers are stopped.")] = 240.0,
    device: DeviceOption = "cpu",
) -> None:
    """Every collective of one training step, counted on tp·pp·dp CPU processes (gloo) or GPUs (NCCL, --device cuda), against meshplan's communication model: count (exact) and bytes (1%) per rank, axis, collective and phase."""
    setup = _setup(plan, "comm")
    mod = _verify_module("comm")
    predict = _verify_module("predict")
    mod.check_plan(setup.model, setup.plan)
    p = setup.plan
    _check_device(device, p.tp * p.pp * p.dp * p.cp)
    if timeout <= 0:
        raise InputError("timeout", f"must be a positive number of seconds (got {timeout})")
    results = _verify_module("launch").launch([(setup.model, setup.plan)], timeout=timeout, device=device)[0]
    _finish(predict.compare(setup.model, setup.plan, results), json_out)


def print_kernel_report(report) -> None:
    """The rich table of a :class:`~meshplan.verify.kernels.KernelReport` and its pooled constants."""
    con = render.console()
    setup = report.setup
    title = (f"Kernel times on {setup['device_name']} against meshplan's model of {setup['gpu']} "
             f"({setup['precision']}, calibration '{setup['calibration']}')")
    table = FitTable(title=title, box=box.SIMPLE_HEAVY, title_justify="left")
    for col, just in (("kernel", "left"), ("shape", "left"), ("work", "right"), ("predicted", "right"), ("measured", "right"),
                      ("measured / predicted", "right"), ("implied constant", "right"), ("meshplan's", "right")):
        table.add_column(col, justify=just, no_wrap=True)
    for r in report.rows:
        c = r.case
        shape = "×".join(f"{x:.0f}" for x in c.shape) if c.kind != "memory" else ""
        work = f"{c.work / 1e9:,.1f} GFLOP" if c.kind in ("gemm", "attention") else (f"{c.work / 2**20:,.0f} MiB" if c.kind == "memory" else "")
        name = c.name + (f" ({c.stack})" if c.stack else "")
        implied = "" if not r.constant else ("—" if r.implied is None else f"{r.implied:.3f}")
        mine = "" if r.meshplan_constant is None else f"{r.meshplan_constant:.3f}"
        table.add_row(name, shape, work, f"{1e3 * c.predicted:,.3f} ms", f"{1e3 * r.measured:,.3f} ms", f"{r.ratio:.3f}", implied, mine)
    con.print(table)
    con.print("Constants: gemm rows gemm_efficiency (η_max; gemm_fp8_efficiency under FP8), attention rows "
              "attention_fwd/bwd_efficiency (η∞), the copy hbm_efficiency; implied = the value that makes meshplan's "
              "prediction equal the measurement. The calibration's GEMM constants are what a GEMM sustains at the "
              "power cap: with --settle 0 (bursts) the GEMM rows read faster.")
    con.print("Implied calibration, pooled (the value that reproduces each constant's total time; meshplan's in brackets):")
    for name, (value, mine) in report.pooled.items():
        con.print(f"  {name}: " + ("—" if value is None else f"{value:.3f}") + f" [{mine:.3f}]")
    con.print(f"Measured with: torch {setup['torch']}, {setup['timing']}, {setup['date']}")
    if setup["device"] == "cpu":
        con.print("[yellow]CPU run: the times exercise the code only; the predictions are for the catalog GPU, "
                  "so the ratios and implied constants say nothing about it (use --device cuda).[/yellow]")


@verify_app.command("kernels")
@plan_options
def kernels(
    plan: PlanArgs,
    json_out: JsonFlag = False,
    device: DeviceOption = "cpu",
    layer_stacks: Annotated[str, typer.Option("--layer-stacks", help="Stacks of the layer rows, comma-separated: eager, compiled, "
                                              "or none (no layer rows).")] = "eager,compiled",
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed calls before timing each kernel.")] = 2,
    reps: Annotated[int, typer.Option("--reps", help="Timed calls per kernel; the median is kept.")] = 5,
    settle: Annotated[Optional[float], typer.Option("--settle", help="Seconds each kernel runs back to back before it is "
                                                    "timed, so that the GPU's clock has come down to what its power cap "
                                                    "sustains (0: a burst, which reads GEMMs 13-17 % fast). "
                                                    "(default: 1 on cuda, 0 on cpu)")] = None,
) -> None:
    """Kernel times of one layer on one GPU (--device cuda) against meshplan's compute model: each GEMM forward and backward (as the stack's kernels launch them, --set kernels=...: fused QKV and gate|up, or torch's separate projections), FlashAttention forward and backward, an HBM copy and torchtitan's Llama block eager and compiled, with the calibration constant each measurement implies."""
    setup = _setup(plan, "kernels")
    mod = _verify_module("kernels")
    p = setup.plan
    mod.check_model(setup.model, p.tp, p.precision.precision, p.cp, p.attention)
    stacks = tuple(x.strip() for x in layer_stacks.split(",") if x.strip())
    if not stacks:
        raise InputError("layer-stacks", f"must be 'none' or a comma-separated list of {', '.join(mod.LAYER_STACKS)} (got {layer_stacks!r})")
    if stacks == ("none",):
        stacks = ()
    mod.check_layer_stacks(setup.model, stacks, p.precision.precision)
    for name, value, least in (("warmup", warmup, 0), ("reps", reps, 1), ("settle", settle, 0)):
        if value is not None and value < least:
            raise InputError(name, f"must be at least {least} (got {value})")
    _check_device(device, 1)
    gpu = setup.cluster.gpu
    cases = mod.kernel_cases(setup.model, gpu, p.micro_batch, p.seq_len, p.tp, p.precision.precision, stacks,
                             kernels=p.stack.kernels)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    groups = sum(1 for c in cases if c.kind in ("gemm", "memory") or c.name.endswith("fwd"))  # a backward is timed with its forward
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=json_out or not err.is_terminal) as bar:
        task = bar.add_task("timing", total=groups)

        def step(name: str) -> None:
            bar.update(task, advance=1, description=f"timing {name}")

        report = mod.measure(setup.model, gpu, cases, p.tp, p.precision.precision, device, warmup, reps, progress=step,
                             settle=settle)
    if json_out:
        typer.echo(json.dumps(report.to_dict(), default=str))
    else:
        print_kernel_report(report)
