"""``/api/calc/<calculator>``: the ``meshplan calc`` commands over HTTP.

A request runs the CLI's own command (``meshplan calc collective --size 2GB --n 8 --json
--explain``), so the options, their defaults, the validation and the JSON are exactly the CLI's:
query parameter ``size`` is ``--size``, ``simulate=true`` is ``--simulate``, a repeated parameter
is a repeated option. ``GET /api/calc`` lists every calculator with its options (name, type,
default, help), from the same declarations; the Calculators view builds its forms from it.

Bounded work: besides the library's own caps, a web request may ask for at most the values of
:data:`WEB_CAPS` (Monte Carlo runs, simulated steps and elements), checked in the server. A
calculator runs in one of the server's heavy slots, in its worker process
(:mod:`meshplan.web.heavy`), and hands its JSON back through
:data:`~meshplan.cli.calc_cmd.json_sink`, not stdout.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Optional

import typer
from fastapi import APIRouter, Request

from meshplan.cli.calc_cmd import calc_app, json_sink
from meshplan.cli.options import PLAN_OPTIONS
from meshplan.errors import InputError
from meshplan.web.heavy import HeavySlots

#: (calculator, option) -> the most a web request may ask for.
WEB_CAPS: dict[tuple[str, str], int] = {
    ("failures", "runs"): 20_000,
    ("loss-scale", "steps"): 200_000,
    ("loss-scale", "per_step"): 10_000,
    ("collective", "elements"): 65_536,
}
#: Options the web does not offer: pictures are drawn by the page, output is always JSON.
_HIDDEN = {"out", "json_out", "explain", "progress", "help"}

#: the plan options a calculator's form offers: a preset, or a model on GPUs, and the recipe
PLAN_LISTED = {"preset", "model", "gpu", "gpus", "tokens", "price", "precision", "grad_dtype", "master_weights"}


@lru_cache(maxsize=1)
def _commands() -> dict[str, Any]:
    return dict(typer.main.get_command(calc_app).commands)


def _option(p: Any) -> dict[str, Any]:
    kind = p.bare_type()
    flag = p.opts[0] if p.opts and p.opts[0].startswith("--") else None
    return {
        "name": p.name,
        "key": flag.lstrip("-").replace("-", "_") if flag else p.name,  # the query parameter
        "flag": p.opts[0] if p.opts and p.opts[0].startswith("-") else None,
        "type": kind,
        "default": p.default,
        "required": bool(p.required),
        "multiple": bool(p.multiple) or getattr(p, "nargs", 1) == -1,
        "argument": p.param_type_name == "argument",
        "help": p.help or "",
    }


def _listed(cmd: Any, p: Any) -> bool:
    """Whether option ``p`` is in the form: not hidden, and of a calculator that takes a plan
    (``checkpoint``, ``failures``: :mod:`meshplan.cli.calc_plan`) only the plan options of
    :data:`PLAN_LISTED` (the others are accepted as query parameters all the same)."""
    takes_plan = any(q.name == "plan_file" for q in cmd.params)
    return p.name not in _HIDDEN and not (takes_plan and p.name in PLAN_OPTIONS and p.name not in PLAN_LISTED)


def calculators() -> list[dict[str, Any]]:
    """Every calculator with its options, in the CLI's order."""
    out = []
    for name, cmd in _commands().items():
        doc = (cmd.help or "").strip().split("\n")[0]
        out.append({"name": name, "help": doc, "options": [_option(p) for p in cmd.params if _listed(cmd, p)]})
    return out


def _truthy(field: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "on", "yes"):
        return True
    if low in ("0", "false", "off", "no", ""):
        return False
    raise InputError(field, f"must be true or false (got {text!r})")


def argv_of(name: str, items: list[tuple[str, str]]) -> list[str]:
    """The command line for calculator ``name`` from query pairs (option name, value)."""
    cmd = _commands().get(name)
    if cmd is None:
        raise InputError("calculator", f"unknown calculator '{name}' (calculators: {', '.join(_commands())})")
    params = {p.name: p for p in cmd.params if p.name not in _HIDDEN}
    by_flag = {p.opts[0].lstrip("-").replace("-", "_"): p for p in params.values() if p.opts and p.opts[0].startswith("--")}
    args: list[str] = []
    positional: list[str] = []
    for key, value in items:
        p = params.get(key) or by_flag.get(key)
        if p is None:
            raise InputError(key, f"unknown option of the {name} calculator")
        cap = WEB_CAPS.get((name, p.name))
        if cap is not None:
            try:
                asked = float(value)
            except ValueError:
                asked = 0.0  # not a number: the command says so
            if asked > cap:
                raise InputError(key, f"must be at most {cap:,} in the web explorer (got {value})")
        if p.param_type_name == "argument":
            positional.extend(v for v in value.split(",") if v.strip())
        elif getattr(p, "is_flag", False):
            on = _truthy(p.name, value)
            if on:
                args.append(p.opts[0])
            elif p.secondary_opts:
                args.append(p.secondary_opts[0])
        else:
            args += [p.opts[0], value]
    if "progress" in {p.name for p in cmd.params}:
        args.append("--no-progress")
    return args + ["--json", "--explain"] + (["--"] + positional if positional else [])


def calc_json(name: str, args: list[str]) -> dict[str, Any]:
    """The JSON of ``meshplan calc NAME ARGS`` (``args`` from :func:`argv_of`), or its bad input
    raised (InputError, pydantic's ValidationError); run in a worker process."""
    cmd = _commands()[name]
    sink: list[str] = []
    token = json_sink.set(sink)
    try:
        cmd.main(args=args, prog_name=f"meshplan calc {name}", standalone_mode=False)
    except typer.TyperException as exc:  # click's own checks: a missing option, a bad number
        param = getattr(exc, "param", None)
        field = param.name if param is not None else "input"
        raise InputError(field, " ".join(exc.format_message().split())) from None
    finally:
        json_sink.reset(token)
    if len(sink) != 1:
        raise InputError("calculator", f"the {name} calculator gave no JSON")
    return json.loads(sink[0])


def run_calculator(name: str, items: list[tuple[str, str]], slots: Optional[HeavySlots] = None) -> dict[str, Any]:
    """Run ``meshplan calc NAME ... --json --explain`` (in one of ``slots``' worker processes when
    given, else here); its JSON, or its bad input raised. The options and their web caps are
    checked here, before any work."""
    args = argv_of(name, items)
    return slots.run(calc_json, name, args) if slots is not None else calc_json(name, args)


router = APIRouter(prefix="/api")


@router.get("/calc", tags=["calc"], summary="The calculators and their options (those of `meshplan calc`)")
def api_calculators() -> list[dict[str, Any]]:
    return calculators()


@router.get("/calc/{name}", tags=["calc"],
            summary="Run one calculator: query parameters are its options (GET /api/calc); the JSON of `meshplan calc NAME --json --explain`")
def api_calc(name: str, request: Request) -> dict[str, Any]:
    return run_calculator(name, list(request.query_params.multi_items()), request.app.state.heavy)
