"""A GPU outside the catalog, from a YAML file (``--gpu FILE.yaml``), and a board power cap.

The file holds the keys of one ``catalog/data/gpus.yaml`` entry, with the same units:

=================  ==============================================================  ============
key                meaning                                                         unit
=================  ==============================================================  ============
name               what the output calls the GPU (default: the file's stem)        --
base               a catalog GPU whose values fill every key the file leaves out   --
vendor             nvidia or amd                                                   --
generation         keys the efficiency constants (cost/calibration.py): ampere,    --
                   hopper, blackwell, cdna3
peak_tflops        dense peak per dtype: fp32, bf16, fp16 (required), tf32, fp8    TFLOP/s
                   (null: not supported)
hbm_gib            HBM capacity                                                    GiB (2^30 B)
hbm_gbps           HBM bandwidth                                                   GB/s
sm_count           streaming multiprocessors (compute units on AMD)                --
scale_up_size      GPUs per NVLink / Infinity Fabric domain                        --
scale_up_gbps      scale-up bandwidth per GPU per direction                        GB/s
nic_gbps           scale-out (NIC) bandwidth per GPU per direction                 GB/s
tdp_watts          board power the peaks are quoted at                             W
power_watts        optional board power cap, below tdp_watts (see below)           W
sources            optional mapping of key -> where the value comes from           --
=================  ==============================================================  ============

Without ``base`` every key but ``name``, ``power_watts`` and ``sources`` is required. Every bad
key is reported, one line each (``gpu.KEY: rule``), in one :class:`~meshplan.errors.InputErrors`.

A power cap P (``power_watts``, or ``--gpu-power`` on the command line) scales every dense peak by
the sustained-clock ratio of :func:`meshplan.cost.calibration.power_capped`,
((P − P_static) / (P_TDP − P_static))^(1/3), and leaves HBM bandwidth (its own clock) alone. Meta's
Grand Teton H100 behind Llama 3 and torchtitan (500 W, 96 GB HBM2e at 2.4 TB/s; Liang et al. 2024,
arXiv 2410.06511, Sec. 4) is ``base: h100-sxm-80gb``, ``hbm_gib: 96``, ``hbm_gbps: 2400``,
``power_watts: 500`` (meshplan.accuracy.meta.h100_96gb builds the same GPU).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from meshplan.bounded_parse import brief, check_file_size, load_yaml
from meshplan.errors import InputError, InputErrors

#: key -> (check, required without base); a check returns the rule broken, or None.
_Check = Callable[[Any], Optional[str]]


def _positive_number(value: Any) -> Optional[str]:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= 1e9
    return None if ok else f"must be a positive number (got {brief(value)})"


def _positive_int(value: Any) -> Optional[str]:
    ok = not isinstance(value, bool) and isinstance(value, int) and 0 < value <= 1_000_000
    return None if ok else f"must be a positive integer (got {brief(value)})"


def _one_of(*choices: str) -> _Check:
    def check(value: Any) -> Optional[str]:
        return None if value in choices else f"must be one of {', '.join(choices)} (got {brief(value)})"

    return check


def _text(value: Any) -> Optional[str]:
    return None if isinstance(value, str) and 0 < len(value) <= 200 else f"must be a short string (got {brief(value)})"


def _sources(value: Any) -> Optional[str]:
    ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    return None if ok else "must be a mapping of key: text"


def _generations() -> tuple[str, ...]:
    from meshplan.cost.calibration import CALIBRATIONS

    return tuple(sorted(CALIBRATIONS))


#: dtype -> required (fp32, bf16 and fp16 every training GPU has; tf32 and fp8 may be null)
_DTYPES = {"fp32": True, "tf32": False, "bf16": True, "fp16": True, "fp8": False}

_KEYS: dict[str, tuple[_Check, bool]] = {
    "name": (_text, False),
    "base": (_text, False),
    "vendor": (_one_of("nvidia", "amd"), True),
    "generation": (lambda v: _one_of(*_generations())(v), True),
    "peak_tflops": (lambda v: None, True),  # checked per dtype by _peak_errors
    "hbm_gib": (_positive_number, True),
    "hbm_gbps": (_positive_number, True),
    "sm_count": (_positive_int, True),
    "scale_up_size": (_positive_int, True),
    "scale_up_gbps": (_positive_number, True),
    "nic_gbps": (_positive_number, True),
    "tdp_watts": (_positive_number, True),
    "power_watts": (_positive_number, False),
    "sources": (_sources, False),
}


def _peak_errors(value: Any, partial: bool = False) -> list[InputError]:
    """The bad dtypes and values of a ``peak_tflops`` mapping; ``partial``: only the dtypes it
    gives (the others kept from a GPU)."""
    if not isinstance(value, dict):
        return [InputError("gpu.peak_tflops", f"must be a mapping of dtype: TFLOP/s ({', '.join(_DTYPES)})")]
    errors = [InputError(f"gpu.peak_tflops.{k}", f"unknown dtype (dtypes: {', '.join(_DTYPES)})") for k in value if k not in _DTYPES]
    for dtype, required in _DTYPES.items():
        v = value.get(dtype)
        if v is None and (not required or partial):
            continue
        rule = "is required" if v is None else _positive_number(v)
        if rule:
            errors.append(InputError(f"gpu.peak_tflops.{dtype}", rule))
    return errors


def _field_errors(data: dict[str, Any], has_base: bool, some_peaks: bool = False) -> list[InputError]:
    """Every bad key of ``data``, one InputError each (``some_peaks``: ``peak_tflops`` may give some
    dtypes only)."""
    errors = [InputError(f"gpu.{k}", f"unknown key (keys: {', '.join(_KEYS)})") for k in data if k not in _KEYS]
    for key, (check, required) in _KEYS.items():
        if key not in data:
            if required and not has_base:
                errors.append(InputError(f"gpu.{key}", "is required (or give base: a catalog GPU to start from)"))
            continue
        if key == "peak_tflops":
            errors += _peak_errors(data[key], partial=some_peaks)
            continue
        rule = check(data[key])
        if rule:
            errors.append(InputError(f"gpu.{key}", rule))
    return errors


def gpu_from_file_data(data: Any, default_name: str):
    """A :class:`~meshplan.specs.hardware.GPUSpec` from a GPU file's mapping (module docstring);
    raises :class:`~meshplan.errors.InputErrors` naming every bad key."""
    from meshplan.catalog import gpu_entry, gpu_from_entry

    if not isinstance(data, dict):
        raise InputError("gpu", "a GPU file must be a mapping of GPU keys (see docs/hardware.md)")
    base: dict[str, Any] = {}
    if isinstance(data.get("base"), str):
        try:
            base = gpu_entry(data["base"])
        except InputError as err:
            raise InputError("gpu.base", err.rule) from None
    errors = _field_errors(data, has_base=bool(base))
    if errors:
        raise InputErrors(errors)
    entry = {**base, **{k: v for k, v in data.items() if k not in ("name", "base", "power_watts")}}
    if base:  # the file's peaks and sources over the base's; the base is named as a source
        entry["peak_tflops"] = {**base["peak_tflops"], **data.get("peak_tflops", {})}
        entry["sources"] = {**base.get("sources", {}), **data.get("sources", {}), "base": f"catalog {base['name']} for the keys the file leaves out"}
    gpu = gpu_from_entry(data.get("name") or default_name, entry, where="gpu")
    if "power_watts" in data:
        gpu = with_power_cap(gpu, data["power_watts"], "gpu.power_watts", name=gpu.name)
    return gpu


#: the keys :func:`gpu_with_keys` takes: those of a GPU's figures (not its name, base, power cap or sources)
FIGURE_KEYS: tuple[str, ...] = tuple(k for k in _KEYS if k not in ("name", "base", "power_watts", "sources"))


def gpu_with_keys(gpu, data: dict[str, Any]):
    """``gpu`` with the figures ``data`` gives in a GPU file's keys and units (module docstring;
    :data:`FIGURE_KEYS`, ``peak_tflops`` any of its dtypes), the others kept as they are; every bad
    key reported as a GPU file's are, one :class:`~meshplan.errors.InputError` each."""
    from pydantic import ValidationError

    from meshplan.catalog import spec_fields
    from meshplan.specs.base import input_error_from

    errors = [InputError(f"gpu.{k}", f"not a GPU figure (keys: {', '.join(FIGURE_KEYS)})") for k in data if k not in FIGURE_KEYS]
    errors += _field_errors({k: v for k, v in data.items() if k in FIGURE_KEYS}, has_base=True, some_peaks=True)
    if errors:
        raise InputErrors(errors)
    fields = spec_fields(data)
    if "peak_flops" in fields:
        fields["peak_flops"] = type(gpu.peak_flops)(**{**gpu.peak_flops.model_dump(), **fields["peak_flops"]})
    try:
        return type(gpu)(**{**dict(gpu), **fields})
    except ValidationError as exc:
        raise input_error_from(exc, "gpu") from None


def with_power_cap(gpu, watts: Any, field: str, name: Optional[str] = None):
    """``gpu`` under a board power cap of ``watts`` (:func:`meshplan.cost.calibration.power_capped`),
    a refusal naming ``field`` when the cap is not above the static power and up to the TDP."""
    from meshplan.cost.calibration import power_capped

    rule = _positive_number(watts)
    if rule:
        raise InputError(field, rule)
    try:
        return power_capped(gpu, float(watts), name=name)
    except InputError as err:
        raise InputError(field, err.rule) from None


def load_gpu_file(path: Path):
    """Read a GPU YAML file (module docstring); bad files raise InputError(s) naming the key."""
    try:
        is_file = path.is_file()
    except (OSError, ValueError):
        is_file = False
    if not is_file:
        raise InputError("gpu", f"no such file: {path}")
    check_file_size(path, "gpu")
    try:
        data = load_yaml(path.read_text(), "gpu")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("gpu", f"cannot read {path}: {exc.__class__.__name__}") from None
    except yaml.YAMLError:
        raise InputError("gpu", f"{path.name} is not valid YAML") from None
    return gpu_from_file_data(data, default_name=path.stem)
