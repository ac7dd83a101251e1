"""Interop with the engines that run a plan: torchtitan, Megatron-LM, DeepSpeed and nanotron.

``export(engine, model, plan)`` writes the engine's config (an :class:`ExportResult`: text, warnings
for plan fields the engine cannot express, notes for settings it takes in code);
``parse_text`` / ``load_plan_file`` read a config back (format detected) into plan fields and, where
the config carries it, the model. ``docs/interop.md`` has the mapping table of every engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
import re
from typing import Any, Callable, Optional

from meshplan.bounded_parse import check_file_size
from meshplan.catalog import stack_names, stack_overrides
from meshplan.errors import InputError
from meshplan.interop import deepspeed, megatron, meshplan_json, nanotron, torchtitan, torchtitan03
from meshplan.interop.common import ExportResult, ParseResult, canonical, plan_fields, to_plan
from meshplan.interop.detect import FORMATS, detect
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import BEHAVIOUR_FIELDS, Stack

__all__ = [
    "ENGINES", "ExportResult", "ImportedPlan", "ParseResult", "canonical", "detect", "export",
    "load_plan_file", "options_of", "parse_text", "plan_fields", "to_plan",
]

#: engine name (``meshplan export --to``) → exporter; ``NAME@VERSION`` names a release line, the
#: bare name the current release (torchtitan 0.3; its TOML exists only up to 0.2), for nanotron the
#: newest on PyPI that imports (0.2), ``nanotron@main`` its main branch
ENGINES: dict[str, Callable[..., ExportResult]] = {
    "torchtitan": torchtitan03.export,
    "torchtitan@0.3": torchtitan03.export,
    "torchtitan@0.2": torchtitan.export,
    "torchtitan-toml": torchtitan.export_toml,
    "megatron": megatron.export,
    "deepspeed": deepspeed.export,
    "nanotron": partial(nanotron.export, release=nanotron.DEFAULT),
    **{f"nanotron@{r}": partial(nanotron.export, release=r) for r in nanotron.RELEASES},
}

PARSERS: dict[str, Callable[[str], ParseResult]] = {
    "torchtitan": torchtitan.parse,
    "torchtitan-toml": lambda text: torchtitan.parse(text, toml=True),
    "megatron": megatron.parse,
    "deepspeed": deepspeed.parse,
    "nanotron": nanotron.parse,
    "meshplan": meshplan_json.parse,
}
assert {e.split("@")[0] for e in ENGINES} | {"meshplan"} == set(PARSERS) == set(FORMATS)


def export(engine: str, model: ModelSpec, plan: TrainingPlan, gpus_per_node: int = 8) -> ExportResult:
    if engine not in ENGINES:
        raise InputError("to", f"unknown engine '{engine}' ({', '.join(ENGINES)})")
    return ENGINES[engine](model, plan, gpus_per_node=gpus_per_node)


def parse_text(text: str, fmt: Optional[str] = None) -> ParseResult:
    """Parse a config; ``fmt`` (one of :data:`FORMATS`) or detected."""
    return PARSERS[fmt or detect(text)](text)


def read_config(path: str, where: str = "plan") -> str:
    """The text of the config file ``path``; InputError ``where`` when the path is empty, names a
    directory or nothing, or the file is not UTF-8 text."""
    if not path.strip():
        raise InputError(where, "must name a config file (got an empty value)")
    p = Path(path).expanduser()
    try:
        is_file, is_dir = p.is_file(), p.is_dir()
    except (OSError, ValueError):
        is_file = is_dir = False
    if is_dir:
        raise InputError(where, f"{path} is a directory, not a config file")
    if not is_file:
        raise InputError(where, f"no such file: {path}")
    check_file_size(p, where)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(where, f"{path} is not UTF-8 text: a config is TOML, JSON, YAML or an argument list") from None
    except OSError as exc:
        raise InputError(where, f"cannot read {path}: {exc.strerror or exc.__class__.__name__}") from None


#: plan fields with a ``meshplan estimate`` option of the same name
OPTION_FIELDS = ("tp", "cp", "pp", "ep", "dp", "vpp", "schedule", "micro_batch", "global_batch", "seq_len",
                 "recompute", "recompute_layers", "sequence_parallel", "dp_shard", "attention")


def options_of(parsed: ParseResult) -> dict[str, Any]:
    """Plan fields as the values of ``meshplan estimate``'s options (PlanArgs names and types)."""
    return options_of_fields(parsed.plan)


def options_of_fields(f: dict[str, Any]) -> dict[str, Any]:
    """A plan's fields (``TrainingPlan`` keyword arguments, the precision as a dict) as the values
    of ``meshplan estimate``'s options (PlanArgs names and types)."""
    out: dict[str, Any] = {k: f[k] for k in OPTION_FIELDS if f.get(k) is not None}
    out.update(stack_values(f))
    if f.get("zero") is not None:
        out["zero"] = str(f["zero"])
    if f.get("layer_split") is not None:
        out["layer_split"] = ",".join(str(n) for n in f["layer_split"])
    if f.get("rank_order") is not None:
        out["rank_order"] = ",".join(f["rank_order"])
    for k, v in (f.get("precision") or {}).items():
        if k != "optimizer":
            out[k] = v
    if "dp" in out:
        out["gpus"] = out["dp"] * f.get("tp", 1) * f.get("cp", 1) * f.get("pp", 1)
    return out


@dataclass(frozen=True)
class ImportedPlan:
    """A config read for ``--plan FILE``: option values that seed the plan (flags override them),
    the model when the file carries one, and plan fields no option sets."""

    parsed: ParseResult
    options: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def apply_extra(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Add the fields no option sets to the plan's keyword arguments, where they still apply."""
        return apply_extra_fields(fields, self.extra)

    def model_gap(self) -> Optional[str]:
        """Why the file gives no model meshplan knows (its own note, or that it says none), or None
        when it carries one: ``--plan`` then needs ``--model``, never a silent default."""
        if self.parsed.model is not None or "model" in self.options:
            return None
        said = [re.sub(r"\s*(\(give --model\)|: give --model)$", "", n.split(": ", 1)[1])
                for n in self.parsed.notes if n.startswith("model: ")]
        return said[0] if said else f"the {self.parsed.format} config does not say the model"


def stack_values(f: dict[str, Any]) -> dict[str, Any]:
    """The stack of plan fields ``f`` as option values: ``stack`` (the profile's name) and the
    stack's fields where they differ from it. ``f`` gives the stack nested (``stack``: a Stack or
    its fields, ``TrainingPlan.model_dump()``) or flat (an engine config's reading), or both."""
    nested = f.get("stack")
    out: dict[str, Any] = {}
    if nested is not None:
        stack = nested if isinstance(nested, Stack) else Stack(**nested)
        out["stack"] = stack.name
        if stack.name in stack_names():  # against the profile as it applies to the plan, where f makes one
            try:
                plan = TrainingPlan(**{k: v for k, v in f.items() if k in TrainingPlan.model_fields})
                out.update(stack_overrides(stack, plan))
            except (InputError, ValueError):
                out.update(stack_overrides(stack))
        else:
            out.update(stack.behaviour())
    out.update({k: f[k] for k in BEHAVIOUR_FIELDS if f.get(k) is not None})
    return out


def extra_fields_of(f: dict[str, Any]) -> dict[str, Any]:
    """The plan fields of ``f`` (``TrainingPlan`` keyword arguments, the precision as a dict) that
    no option sets: the optimizer, where ``f`` gives it."""
    extra: dict[str, Any] = {}
    opt = (f.get("precision") or {}).get("optimizer")
    if opt is not None:
        extra["optimizer"] = opt
    return extra


def apply_extra_fields(fields: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``fields`` (a plan's keyword arguments, the precision a ``PrecisionRecipe``) with the plan
    fields no option sets (the optimizer) added."""
    out = dict(fields)
    for k, v in extra.items():
        if k == "optimizer":
            out["precision"] = out["precision"].model_copy(update={"optimizer": v})
            continue
        out[k] = v
    return out


def load_plan_file(path: str, where: str = "plan") -> ImportedPlan:
    text = read_config(path, where)
    try:
        parsed = parse_text(text, detect(text, where))
    except InputError as err:  # name the file's format in errors about the whole file
        raise (InputError(where, err.rule) if err.field == "plan" else err) from None
    options = {**options_of(parsed), **parsed.options}
    if parsed.model is not None:
        options["model"] = parsed.model
    return ImportedPlan(parsed, options, extra_fields_of(parsed.plan))
