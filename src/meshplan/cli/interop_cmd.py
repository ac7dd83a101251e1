"""``meshplan export`` (a plan → an engine's config) and ``meshplan import`` (an engine's config →
the meshplan plan). The mapping lives in :mod:`meshplan.interop`; this module only reads options,
writes files and prints.

A lossy export prints one ``warning: <field>: <what happens>`` line per plan field the engine
cannot express, and settings the engine takes in code as ``note:`` lines, all on stderr; the config
itself goes to stdout or ``--out`` (an existing file is kept unless ``--force``).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import replace
from typing import Annotated, Any, Literal, Optional

import typer

from meshplan import interop
from meshplan.catalog import load_stack
from meshplan.cli.options import PlanArgs, plan_options, resolve
from meshplan.cli.search_options import SearchArgs, search_options
from meshplan.errors import InputError
from meshplan.interop.common import catalog_match
from meshplan.outfile import out_path, write_text
from meshplan.specs.stack import BEHAVIOUR_FIELDS, DEFAULT_STACK, applied, field_text

Engine = Literal["torchtitan", "torchtitan@0.3", "torchtitan@0.2", "torchtitan-toml", "megatron", "deepspeed", "nanotron", "nanotron@0.2", "nanotron@main"]
#: the stack profile each export target runs (catalog/data/stacks.yaml)
ENGINE_STACK = {"torchtitan": "torchtitan", "torchtitan-toml": "torchtitan", "megatron": "megatron-core",
                "deepspeed": "deepspeed", "nanotron": "nanotron"}


def stack_difference(plan, engine: str) -> Optional[str]:
    """One line when the plan's stack is not the engine's profile: the fields, as they apply to
    the plan, where the two differ (the plan's value first); None when they agree."""
    name = ENGINE_STACK[engine.split("@")[0]]
    theirs = applied(load_stack(name), plan)
    diff = [f"{k} {field_text(getattr(plan.stack, k))} (there {field_text(getattr(theirs, k))})"
            for k in BEHAVIOUR_FIELDS if getattr(plan.stack, k) != getattr(theirs, k)]
    if not diff:
        return None
    return (f"stack: the plan was estimated on the {plan.stack.name} stack; {engine} runs the {name} profile, "
            f"which differs in {', '.join(diff)}: `meshplan estimate --stack {name}` estimates it as the engine runs it")


@plan_options
@search_options(omit=("top",))
def export(
    plan: PlanArgs,
    to: Annotated[Engine, typer.Option("--to", help="Engine: torchtitan (its current release, 0.3: --module/--config and --section.key flags; torchtitan@0.2 for the 0.2 line), torchtitan-toml (sectioned TOML, 0.2), megatron (torchrun + Megatron-LM arguments), deepspeed (JSON), nanotron (YAML sections for its newest release on PyPI, 0.2; nanotron@main for its main branch).")],
    out: Annotated[Optional[str], typer.Option("--out", help="Write the config to this file instead of stdout.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out if it exists.")] = False,
    from_search: Annotated[bool, typer.Option("--from-search", help="Export the best plan of `meshplan search` for these flags (layout flags fix axes, as in search); the search options below apply.")] = False,
    search: SearchArgs = SearchArgs(),
) -> None:
    """Write the plan as an engine's config; settings the engine cannot express are named on stderr (warning: ...), never dropped silently. With --from-search, the best plan of a search."""
    path = out_path(out, force=force) if out is not None else None
    if from_search:
        model, best, gpus_per_node = _best_of_search(plan, search)
    else:
        given = search.given()
        if given:
            raise InputError(given[0][2:].replace("-", "_"), f"{given[0]} is a search option: it needs --from-search")
        setup = resolve(plan)
        model, best, gpus_per_node = setup.model, setup.plan, setup.cluster.gpus_per_node
    result = interop.export(to, model, best, gpus_per_node=gpus_per_node)
    if path is not None:
        write_text(path, result.text, out, replace=force)
    for line in result.warnings:
        print(f"warning: {line}", file=sys.stderr)
    for line in result.notes:
        print(f"note: {line}", file=sys.stderr)
    differs = stack_difference(best, to)
    if differs:
        print(f"note: {differs}", file=sys.stderr)
    if path is None:
        typer.echo(result.text, nl=False)
    else:
        print(f"wrote {path}", file=sys.stderr)


def _best_of_search(plan: PlanArgs, search: SearchArgs):
    """(model, best plan, GPUs per node) of ``meshplan search`` with the same flags; exits 1 with
    the search's one-line reason when no plan fits."""
    from meshplan.cli.search_cmd import execute
    from meshplan.cli.search_report import impossible_line

    result, cluster, _ = execute(plan, replace(search, top=1))
    if not result.top:
        print(f"error: from-search: {impossible_line(result, cluster.num_gpus)}", file=sys.stderr)
        raise typer.Exit(1)
    est = result.top[0].estimate
    p = est.plan
    print(
        f"note: from-search: best of {result.feasible:,} feasible plans ({result.evaluated:,} evaluated) by {search.objective}: "
        f"TP{p.tp} CP{p.cp} PP{p.pp} DP{p.dp}{f' EP{p.ep}' if p.ep > 1 else ''} {p.schedule} v={p.vpp}, micro-batch {p.micro_batch}, recompute {p.recompute}, "
        f"ZeRO-{p.zero}; step {est.time.step_s:.3f} s, MFU {est.mfu:.1%}",
        file=sys.stderr,
    )
    return est.model, p, cluster.gpus_per_node


def print_plan_notes(plan_file: Optional[str]) -> None:
    """The notes ``meshplan import`` prints for a config (settings it read lossily or defaulted),
    on stderr, for ``estimate --plan FILE`` and ``explain --plan FILE``."""
    if plan_file is None:
        return
    for line in interop.load_plan_file(plan_file).parsed.notes:
        print(f"note: {line}", file=sys.stderr)


def _flag(name: str, value: Any) -> Optional[str]:
    opt = "--" + name.replace("_", "-")
    if name == "fp8_scaling" and value == "tensorwise":
        return None  # the default
    if isinstance(value, bool):
        if name in ("sequence_parallel", "master_weights", "grad_fp32_copy"):
            return opt if value else f"--no-{opt[2:]}"
        return opt if value else None  # the switches that are off unless given
    return f"{opt} {shlex.quote(str(value))}"


def import_(
    file: Annotated[str, typer.Argument(help="A torchtitan TOML or --section.key list, Megatron-LM arguments (a torchrun command), a DeepSpeed JSON or a nanotron YAML; the format is detected.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else.")] = False,
) -> None:
    """Read an engine's config and print the meshplan plan it describes, as `meshplan estimate` flags (or --json). `meshplan estimate --plan FILE` estimates it directly."""
    imported = interop.load_plan_file(file, where="file")
    parsed = imported.parsed
    model = parsed.model
    model_name = None if model is None else (catalog_match(model) or model.name)
    if json_out:
        plan = dict(parsed.plan)
        for k in ("layer_split", "rank_order"):
            if plan.get(k) is not None:
                plan[k] = list(plan[k])
        typer.echo(json.dumps({
            "format": parsed.format,
            "model": None if model is None else {"catalog": catalog_match(model), **model.model_dump()},
            "plan": plan,
            "options": {k: v for k, v in imported.options.items() if k != "model"},
            "extra": imported.extra,
            "notes": list(parsed.notes),
        }))
        return
    for line in parsed.notes:
        print(f"note: {line}", file=sys.stderr)
    words = ["meshplan estimate"]
    if model is not None and catalog_match(model):
        words.append(f"--model {catalog_match(model)}")
    opts = imported.options
    for name in ("gpu", "gpus", "gpus_per_node", "nic_gbps", "pod_size", "oversubscription",
                 "tp", "cp", "pp", "ep", "dp", "vpp", "schedule", "layer_split", "rank_order", "micro_batch",
                 "global_batch", "seq_len", "recompute", "recompute_layers", "sequence_parallel", "zero", "dp_shard", "precision",
                 "fp8_scaling", "grad_dtype", "master_weights", "grad_fp32_copy", "attention", "stack", "tokens", "price", "pue"):
        if name in opts and (flag := _flag(name, opts[name])) is not None:
            words.append(flag)
    profile = load_stack(opts.get("stack") or DEFAULT_STACK)  # the fields that differ from it are set
    words += [f"--set {name}={field_text(opts[name])}" for name in BEHAVIOUR_FIELDS
              if name in opts and opts[name] != getattr(profile, name)]
    typer.echo(f"# {parsed.format} config {file}" + (f", model {model_name}" if model_name else ""))
    typer.echo(" \\\n    ".join(words))
    rest = {k: v for k, v in imported.extra.items() if not (k == "optimizer" and v == "adam")}
    if model is not None and not catalog_match(model):
        typer.echo(f"# the model is not in the catalog: its shape is in the file ({model.n_layers} layers, hidden {model.hidden})")
    if rest or (model is not None and not catalog_match(model)):
        shown = ", ".join(f"{k} = {json.dumps(v)}" for k, v in rest.items())
        typer.echo(f"# no flag sets {shown or 'the model shape'}: `meshplan estimate --plan {shlex.quote(file)}` uses them")
