"""``meshplan``: the command line.

Commands: ``estimate`` (memory, step time, throughput, cost of one plan), ``explain`` (the
derivation of each figure), ``pipeline`` (what every pipeline rank does when: Gantt, bubble),
``validate`` (meshplan against published training runs), ``search`` (the best layouts among all), ``models`` and ``gpus`` (the catalogs).

Bad input of any kind (an :class:`~meshplan.errors.InputError`, a pydantic validation error, an
unknown option or an invalid value for one) prints one line, ``error: <field>: <rule>``, on
stderr and exits with status 2; nothing is printed on stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Literal, Optional, Sequence

import typer
from pydantic import ValidationError

from meshplan.catalog import gpu_names, load_gpu, load_model, model_names
from meshplan.cli import render
from meshplan.accuracy.interval import LEVEL, check_level, estimate_interval
from meshplan.cli.options import IntervalOpt, PlanArgs, failure_model, plan_options, resolve
from meshplan.cli.fit import keep_flags_whole
from meshplan.cli.pipeline_cmd import pipeline as pipeline_command
from meshplan.cli.stacks_cmd import stacks as stacks_command
from meshplan.cli.search_cmd import search as search_command
from meshplan.cli.validate_cmd import validate as validate_command
from meshplan.cli.whatif import add_json, alternatives, print_what_if, run_what_if, tornado_path
from meshplan.cli.verify_cmd import verify_app
from meshplan.cli.calc_cmd import calc_app
from meshplan.cli.interop_cmd import export as export_command, import_ as import_command, print_plan_notes
from meshplan.cli.learn_cmd import learn as learn_command
from meshplan.cli.serve_cmd import serve as serve_command
from meshplan.cost.params import count_params
from meshplan.errors import InputError, InputErrors, RunFailed
from meshplan.estimate import estimate as run_estimate
from meshplan.estimate_report import extras, report_json
from meshplan.explain import render as render_derivations
from meshplan.specs.base import input_error_from

keep_flags_whole()  # help screens: every flag whole at any terminal width
app = typer.Typer(
    name="meshplan",
    help="Plan distributed training of large language models: layout, memory, step time, MFU, cost, "
    "with the derivation of every figure.",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else.")]


def _run_opt(decl: str, help: str) -> typer.models.OptionInfo:
    return typer.Option(decl, help=help, rich_help_panel="Run with failures (with --tokens)", show_default=False)


@app.command()
@plan_options
def estimate(
    plan: PlanArgs,
    json_out: JsonFlag = False,
    unit: Annotated[Literal["GiB", "GB"], typer.Option("--unit", help="Memory unit for display: GiB (2^30 bytes) or GB (1e9).")] = "GiB",
    failure_rate: Annotated[Optional[float], _run_opt("--failure-rate", "Failures per GPU-hour; MTBF = 1/(GPUs x rate). (default: 1.973e-5, Llama 3's rate)")] = None,
    mtbf: Annotated[Optional[str], _run_opt("--mtbf", "The cluster's mean time between failures instead, e.g. 3h.")] = None,
    ckpt_write_bw: Annotated[Optional[float], _run_opt("--ckpt-write-bw", "GB/s each GPU writes its checkpoint shard at. (default: 1)")] = None,
    ckpt_fs_bw: Annotated[Optional[float], _run_opt("--ckpt-fs-bw", "GB/s the filesystem takes in all; 0: no cap. (default: 2000)")] = None,
    restart: Annotated[Optional[str], _run_opt("--restart", "Restart after a failure. (default: 5min)")] = None,
    no_advice: Annotated[bool, typer.Option("--no-advice", help="Leave out the advice (changes that fit or run faster).")] = False,
    interval: IntervalOpt = LEVEL,
    vs: Annotated[Optional[list[str]], typer.Option("--vs", metavar="F=V", help="What if FIELD=VALUE[,...]: beside the baseline (repeatable).", show_default=False)] = None,
    sensitivity: Annotated[bool, typer.Option("--sensitivity", help="Elasticity of the step to each hardware figure.")] = False,
    out: Annotated[Optional[str], typer.Option("--out", help="With --sensitivity: its tornado chart, .svg.", show_default=False)] = None,
) -> None:
    """Estimate one plan: memory per pipeline rank, step time and where it goes, throughput, MFU, FLOPs per step, and the cost of a token budget (--tokens).

    Defaults: llama3-8b on 8 h100-sxm-80gb, dp = gpus / (tp·cp·pp), sequences of 4,096 tokens, and a global batch of about 4M tokens (micro_batch·dp·m sequences with m = round(4,194,304 / (seq_len·micro_batch·dp)) micro-batches per DP rank, between 1 and 1,024, a multiple of pp when interleaved)."""
    level = check_level(interval)
    picture = tornado_path(out, sensitivity)
    setup = resolve(plan)
    alts = alternatives(plan, vs)
    print_plan_notes(plan.plan_file)
    fm = failure_model(failure_rate, mtbf, ckpt_write_bw, ckpt_fs_bw, restart)
    est = run_estimate(setup.model, setup.cluster, setup.plan, setup.budget)
    what_if = run_what_if(est, alts, sensitivity, level, picture, out) if alts or sensitivity else None
    if what_if is not None and not json_out:  # the comparison and the sensitivity, not the full report
        print_what_if(est, what_if, level, render.header(est, setup.preset, setup.stack), unit)
        return
    failures, tips = extras(est, fm, not no_advice, "--global-batch-tokens" if plan.global_batch_tokens else "--global-batch")
    if json_out:
        d = report_json(est, failures, tips, level)
        if what_if is not None:
            add_json(d, what_if)
        typer.echo(json.dumps(d, allow_nan=False))
        return
    render.print_estimate(est, setup.preset, unit, setup.stack, failures, tips, estimate_interval(est, level))


@app.command()
@plan_options
def explain(
    plan: PlanArgs,
    figure: Annotated[Optional[str], typer.Option("--figure", help="Only derivations whose key or title contains this text, e.g. memory, mfu, step.")] = None,
) -> None:
    """Show how each figure of the estimate is derived: formula, symbols with their values, result, source."""
    setup = resolve(plan)
    print_plan_notes(plan.plan_file)
    est = run_estimate(setup.model, setup.cluster, setup.plan, setup.budget)
    text = render_derivations(est.derivations, figure)
    if not text.strip():
        keys = ", ".join(d.key for d in est.derivations)
        raise InputError("figure", f"no derivation matches '{figure}' (keys: {keys})")
    typer.echo(text.rstrip("\n"))


app.command("pipeline")(pipeline_command)
app.command("validate")(validate_command)
app.add_typer(verify_app, name="verify")
app.command("search")(search_command)
app.add_typer(calc_app, name="calc")
app.command("export")(export_command)
app.command("import")(import_command)
app.command("learn")(learn_command)
app.command("stacks")(stacks_command)
app.command("serve")(serve_command)


@app.command()
def models(json_out: JsonFlag = False) -> None:
    """The model catalog, with exact parameter counts."""
    rows = []
    for name in model_names():
        m = load_model(name)
        rows.append({
            "name": name, "n_layers": m.n_layers, "hidden": m.hidden, "n_heads": m.n_heads,
            "n_kv_heads": m.n_kv_heads, "head_dim": m.head_dim, "ffn_hidden": m.ffn_hidden,
            "vocab_size": m.vocab_size, "mlp": m.mlp, "tied_embeddings": m.tied_embeddings,
            "params_total": count_params(m).total, "source": m.source,
        })
    if json_out:
        typer.echo(json.dumps(rows))
        return
    render.console().print(render.models_table(rows))


@app.command()
def gpus(json_out: JsonFlag = False) -> None:
    """The GPU catalog: dense peak FLOP/s, HBM, scale-up and scale-out bandwidth, power."""
    rows = [render.gpu_row(load_gpu(name)) for name in gpu_names()]
    if json_out:
        typer.echo(json.dumps(rows))
        return
    render.console().print(render.gpus_table(rows))


def _fail(message: str) -> int:
    line = " ".join(str(message).replace("Value error, ", "").split())  # one line, whatever the message held
    print(f"error: {line}", file=sys.stderr)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        args = ["--help"]
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="meshplan", standalone_mode=False)
    except InputErrors as err:  # several bad fields: one line each
        for one in err.errors[:-1]:
            _fail(str(one))
        return _fail(str(err.errors[-1]))
    except InputError as err:
        return _fail(str(err))
    except ValidationError as err:
        return _fail(str(input_error_from(err)))
    except typer.TyperException as err:  # click usage errors: unknown option, bad value, ...
        return _fail(err.format_message())
    except typer.Abort:
        return _fail("aborted")
    except RunFailed as err:  # not the input's fault: what failed, with the worker's traceback
        print(f"error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `meshplan models | head`
        sys.stderr.close()
        return 0
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
