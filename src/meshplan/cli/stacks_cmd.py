"""``meshplan stacks [NAME]``: the stack profiles (``catalog/data/stacks.yaml``), or one profile's
fields with the value, why and source of each, and the rules by which a plan ignores a field."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer
from rich import box
from rich.table import Table

from meshplan.catalog import load_stack, stack_names, stack_profile, stack_schedules
from meshplan.cli.fit import FitTable
from meshplan.cli.render import console
from meshplan.specs.stack import RULES, field_text


def profile_row(name: str) -> dict[str, Any]:
    """One profile as JSON: name, title, release, summary, schedules it runs, and its fields."""
    entry = stack_profile(name)
    return {
        "name": name, "title": entry["title"], "release": entry["release"], "summary": entry["summary"],
        "schedules": list(stack_schedules(name)), "fields": load_stack(name).behaviour(),
        "sources": {k: {x: v[x] for x in ("source", "why", "note") if x in v} for k, v in entry["fields"].items()},
    }


def _list_table(rows: list[dict[str, Any]]) -> Table:
    t = FitTable(title="Stack profiles (meshplan stacks NAME for one, with sources)", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("name", "stack", "kernels", "pipeline", "FSDP", "overlaps", "schedules"):
        t.add_column(col, overflow="fold")
    for r in rows:
        f = r["fields"]
        pipeline = f"{f['pipeline_runtime']}, {f['pp_buffers']}" + (", kept outputs" if f["pp_return_outputs"] else "")
        fsdp = ", ".join(w for w, on in (("reshard", f["reshard_after_forward"]), ("unsharded accumulation", f["fsdp_accumulate_unsharded"]),
                                         ("head in root", f["fsdp_head_in_root"]), ("FP8 gather", f["fsdp_fp8_all_gather"])) if on)
        overlaps = ", ".join(w for w, on in (("grad reduce", f["overlap_grad_reduce"]), ("param gather", f["overlap_param_gather"]),
                                             (f"TP ({f['tp_overlap_kind']})", f["tp_comm_overlap"])) if on)
        t.add_row(r["name"], r["title"], f["kernels"] + ("" if f["kernels"] != "compiled" or f["compile_loss"] else ", eager loss"),
                  pipeline, fsdp or "-", overlaps or "-", ", ".join(r["schedules"]) or "no pipeline")
    return t


def _profile_table(row: dict[str, Any]) -> Table:
    t = FitTable(title=f"{row['name']}: {row['title']} ({row['release']})", box=box.SIMPLE_HEAD, title_justify="left", caption=row["summary"])
    for col in ("field", "value", "why", "source"):
        t.add_column(col, overflow="fold")
    for k, v in row["fields"].items():
        src = row["sources"][k]
        why = src["why"] + (f" Note: {src['note']}" if src.get("note") else "")
        t.add_row(k, field_text(v), why, src["source"])
    return t


def stacks(
    name: Annotated[Optional[str], typer.Argument(help="A profile: its fields with their sources.", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else.")] = False,
) -> None:
    """The software stacks a plan can run on (--stack NAME of estimate, explain, search, export): each profile's kernels, pipeline runtime, FSDP behaviour and overlaps, with the source of every value."""
    if name is None:
        rows = [profile_row(n) for n in stack_names()]
        if json_out:
            typer.echo(json.dumps(rows))
            return
        console().print(_list_table(rows))
        return
    row = profile_row(name.strip().lower())
    if json_out:
        typer.echo(json.dumps({**row, "rules": [{"field": r.field, "neutral": r.neutral, "rule": r.text} for r in RULES]}))
        return
    out = console()
    out.print(_profile_table(row))
    out.print(f"schedules it runs: {', '.join(row['schedules']) or 'none (no pipeline parallelism)'}")
    out.print("a plan ignores a field it cannot use (meshplan.specs.stack.RULES):")
    for r in RULES:
        out.print(f"  {r.field}: {r.text}")
