"""Catalogs shipped in the package (models, GPUs) and loaders for user files.

``load_model`` accepts a catalog name (``llama3-405b``), a Hugging Face ``config.json`` or a
meshplan model YAML; ``load_gpu`` a catalog name, ``resolve_gpu`` a catalog name or a GPU YAML
file (:mod:`meshplan.catalog.gpu_file`). Unknown names and malformed files raise
:class:`~meshplan.errors.InputError` naming the field and the rule.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from meshplan.bounded_parse import check_file_size, load_json, load_yaml
from meshplan.errors import InputError
from meshplan.specs.base import input_error_from
from meshplan.specs.hardware import GPUSpec, PeakFlops
from meshplan.specs.model import ModelSpec
from meshplan.specs.stack import BEHAVIOUR_FIELDS, RULES, Stack, applied
from meshplan.units import GBPS, GiB, TFLOPS

from pydantic import ValidationError


def read_data_file(name: str) -> Any:
    """A YAML file of the package's own data (``catalog/data/NAME``), read with libyaml's safe
    loader where PyYAML has it (about 10x the pure-Python one: a command's start-up reads these)
    and the pure-Python safe loader otherwise; never for a user's file (:mod:`meshplan.bounded_parse`)."""
    text = resources.files("meshplan.catalog").joinpath("data", name).read_text()
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@lru_cache(maxsize=None)
def _data(name: str) -> dict[str, Any]:
    return read_data_file(name)


def model_names() -> list[str]:
    return list(_data("models.yaml"))


def gpu_names() -> list[str]:
    return list(_data("gpus.yaml"))


def model_from_mapping(fields: dict[str, Any], name: str, where: str = "model") -> ModelSpec:
    """A ModelSpec from meshplan's YAML fields (``head_dim`` defaults to hidden / n_heads,
    ``n_kv_heads`` to n_heads)."""
    if not isinstance(fields, dict):
        raise InputError(where, "must be a mapping of model fields")
    f = dict(fields)
    f.setdefault("name", name)
    try:
        if "head_dim" not in f and "hidden" in f and "n_heads" in f:
            hidden, heads = int(f["hidden"]), int(f["n_heads"])
            if hidden < 1 or heads < 1:
                raise ValueError("not positive")
            if hidden % heads:
                raise InputError(f"{where}.head_dim", "give head_dim: hidden is not a multiple of n_heads")
            f["head_dim"] = hidden // heads
        f.setdefault("n_kv_heads", f.get("n_heads"))
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{where}.n_heads", "hidden and n_heads must be positive integers") from None
    return ModelSpec.build(where=where, **f)


@lru_cache(maxsize=64)
def _catalog_model(name: str) -> ModelSpec:
    return model_from_mapping(_data("models.yaml")[name], name, where=f"model {name}")


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a model from a Hugging Face ``config.json`` / meshplan YAML."""
    key = str(name_or_path).strip()
    if key.lower() in _data("models.yaml"):
        return _catalog_model(key.lower())
    path = Path(key)
    try:
        is_path = path.suffix.lower() in (".json", ".yaml", ".yml") or path.exists()
    except (OSError, ValueError):  # a name too long for a path, or with a NUL byte
        is_path = False
    if is_path:
        return load_model_file(path)
    raise InputError(
        "model", f"unknown model '{key}' (catalog: {', '.join(model_names())}; or a config.json / .yaml path)"
    )


def load_model_file(path: Path) -> ModelSpec:
    """Read a model from a file: JSON is taken as a Hugging Face config, YAML as meshplan's own."""
    try:
        is_file = path.is_file()
    except (OSError, ValueError):  # a name too long for a path, or with a NUL byte
        is_file = False
    if not is_file:
        raise InputError("model", f"no such file: {path}")
    check_file_size(path, "model")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("model", f"cannot read {path}: {exc.__class__.__name__}") from None
    if path.suffix.lower() == ".json":
        try:
            config = load_json(text, "model")
        except json.JSONDecodeError as exc:
            raise InputError("model", f"{path.name} is not valid JSON (line {exc.lineno})") from None
        from meshplan.catalog.hf_config import model_from_hf_config

        return model_from_hf_config(config, name=path.parent.name or path.stem)
    try:
        data = load_yaml(text, "model")
    except yaml.YAMLError:
        raise InputError("model", f"{path.name} is not valid YAML") from None
    if isinstance(data, dict) and "model_type" in data:
        from meshplan.catalog.hf_config import model_from_hf_config

        return model_from_hf_config(data, name=path.stem)
    return model_from_mapping(data, name=(data or {}).get("name", path.stem) if isinstance(data, dict) else path.stem)


@lru_cache(maxsize=64)
def gpu_entry(name: str) -> dict[str, Any]:
    """The catalog entry (``gpus.yaml``) of GPU ``name``, aliases such as ``h100`` resolving uniquely,
    with its resolved name under ``name``."""
    key = str(name).strip().lower()
    table = _data("gpus.yaml")
    if key not in table:
        matches = [n for n in table if n.startswith(key)]
        if len(matches) != 1:
            raise InputError("gpu", f"unknown GPU '{name}' (catalog: {', '.join(table)}; or a GPU .yaml file)")
        key = matches[0]
    return {"name": key, **table[key]}


#: ``gpus.yaml`` key -> (GPUSpec field, conversion from the unit the key is written in)
ENTRY_FIELDS: dict[str, tuple[str, Any]] = {
    "vendor": ("vendor", lambda x: x),
    "generation": ("generation", lambda x: x),
    "hbm_gib": ("hbm_bytes", lambda x: float(x) * GiB),
    "hbm_gbps": ("hbm_bandwidth", lambda x: float(x) * GBPS),
    "sm_count": ("sm_count", int),
    "scale_up_size": ("scale_up_size", int),
    "scale_up_gbps": ("scale_up_bandwidth", lambda x: float(x) * GBPS),
    "nic_gbps": ("nic_bandwidth", lambda x: float(x) * GBPS),
    "tdp_watts": ("tdp_watts", float),
}


def spec_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The GPUSpec fields of the ``gpus.yaml`` keys ``d`` holds, in the spec's units (bytes, bytes/s,
    FLOP/s); ``peak_tflops`` becomes ``peak_flops``, a mapping of dtype to FLOP/s."""
    out = {field: convert(d[key]) for key, (field, convert) in ENTRY_FIELDS.items() if key in d}
    if "peak_tflops" in d:
        out["peak_flops"] = {k: (None if v is None else float(v) * TFLOPS) for k, v in d["peak_tflops"].items()}
    return out


def gpu_from_entry(name: str, d: dict[str, Any], where: str) -> GPUSpec:
    """A GPUSpec from a ``gpus.yaml``-style entry (TFLOP/s, GiB, GB/s: converted here)."""
    try:
        fields = spec_fields(d)
        peak = PeakFlops(**fields.pop("peak_flops"))
        return GPUSpec(name=name, peak_flops=peak, **fields, sources=dict(d.get("sources", {})))
    except ValidationError as exc:  # a broken catalog entry is a packaging bug, but say where
        raise input_error_from(exc, where) from None


def load_gpu(name: str) -> GPUSpec:
    """A catalog GPU by name (``h100-sxm-80gb``); aliases such as ``h100`` resolve uniquely."""
    d = gpu_entry(name)
    return gpu_from_entry(d["name"], d, where=f"gpu {d['name']}")


def resolve_gpu(name_or_path: str) -> GPUSpec:
    """A catalog GPU by name, or a GPU YAML file (a path ending in .yaml / .yml, or one that exists:
    :mod:`meshplan.catalog.gpu_file`)."""
    key = str(name_or_path).strip()
    path = Path(key)
    try:
        is_path = path.suffix.lower() in (".yaml", ".yml") or (key.lower() not in _data("gpus.yaml") and path.exists())
    except (OSError, ValueError):
        is_path = False
    if is_path:
        from meshplan.catalog.gpu_file import load_gpu_file

        return load_gpu_file(path)
    return load_gpu(key)


# ---- stacks ---------------------------------------------------------------------------------------


def stack_names() -> list[str]:
    """The stack profiles of ``catalog/data/stacks.yaml``, in file order."""
    return list(_data("stacks.yaml"))


def stack_profile(name: str) -> dict[str, Any]:
    """A profile's entry: ``title``, ``release``, ``summary`` and ``fields`` (each field's
    ``value``, ``source`` and ``why``)."""
    key = str(name).strip().lower()
    table = _data("stacks.yaml")
    if key not in table:
        raise InputError("stack", f"unknown stack '{name}' (profiles: {', '.join(table)})")
    return table[key]


def stack_schedules(name: str) -> tuple[str, ...]:
    """The pipeline schedules profile ``name`` can run (empty: no pipeline parallelism)."""
    return tuple(stack_profile(name)["schedules"]["runs"])


def stack_recompute(name: str) -> tuple[str, ...]:
    """The activation recompute modes profile ``name`` can run (meshplan's names: none,
    selective, op, full)."""
    return tuple(stack_profile(name)["recompute"]["runs"])


@lru_cache(maxsize=None)
def load_stack(name: str) -> Stack:
    """The :class:`~meshplan.specs.stack.Stack` of profile ``name`` (``torchtitan``,
    ``megatron-core``, ...); an unknown name names the profiles."""
    entry = stack_profile(name)
    key = str(name).strip().lower()
    fields = {k: v["value"] for k, v in entry["fields"].items()}
    missing = [k for k in BEHAVIOUR_FIELDS if k not in fields]
    if missing:  # every profile states every field: a packaging bug, but say where
        raise InputError(f"stack {key}", f"the profile does not give {', '.join(missing)}")
    try:
        return Stack(name=key, **fields)
    except ValidationError as exc:
        raise input_error_from(exc, f"stack {key}") from None


def requested_stack(plan: Any) -> Stack:
    """The stack ``plan`` was asked to run, as far as the plan tells: its profile with the fields
    that differ from the profile as it applies to the plan (:func:`stack_overrides`). A field the
    plan set aside comes back at the profile's value, so that a plan of another layout (the
    search's) applies the profile afresh. A stack named after no profile is returned as it is."""
    if plan.stack.name not in stack_names():
        return plan.stack
    return load_stack(plan.stack.name).model_copy(update=stack_overrides(plan.stack, plan))


def stack_overrides(stack: Stack, plan: Any = None) -> dict[str, Any]:
    """The fields where ``stack`` differs from its named profile — as the profile applies to
    ``plan`` when one is given (:func:`meshplan.specs.stack.applied`), so that a field the plan
    ignores is no difference. Empty for a profile as it is, and for a name that is no profile."""
    if stack.name not in stack_names():
        return {}
    profile = load_stack(stack.name)
    set_aside: set[str] = set()
    if plan is not None:
        profile = applied(profile, plan)
        # a field at its neutral value by a rule that leaves it to the plan's other fields (TP
        # overlap on sets the backward's own TP overlap aside) was not set: no difference
        set_aside = {r.field for r in RULES if not r.applies(stack, plan) and getattr(stack, r.field) == r.neutral}
    return {k: v for k, v in stack.behaviour().items() if getattr(profile, k) != v and k not in set_aside}
