"""Reading the calculators' inputs: sizes (``2GB``, ``1GiB``, ``750MB``, bytes when bare),
durations (``5us``, ``1.5ms``, ``98s``, ``68min``, ``24h``, ``54d``, ``1y``; seconds when bare),
counts (``7B``, ``15.6T``, ``4096``: powers of 1000, :func:`meshplan.units.parse_count`) and the
checks every calculator shares. Every failure is an :class:`~meshplan.errors.InputError` naming the
field and the rule."""

from __future__ import annotations

import math
import re

from meshplan.errors import InputError
from meshplan.units import parse_count

_SIZE_UNITS = {
    "": 1.0, "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15,
    "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40, "pib": 2.0**50,
}
_TIME_UNITS = {
    "": 1.0, "s": 1.0, "sec": 1.0, "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "m": 60.0, "min": 60.0,
    "h": 3600.0, "hr": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0, "w": 604800.0,
    "y": 365.0 * 86400.0, "yr": 365.0 * 86400.0,
}
_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([a-zA-Zµ]*)\s*$")


def _split(field: str, text: str | float, units: dict[str, float], example: str) -> float:
    if isinstance(text, (int, float)):
        return float(text)
    hit = _NUMBER.match(str(text).replace("_", "").replace(",", ""))
    unit = hit.group(2).lower() if hit else None
    if not hit or unit not in units:
        raise InputError(field, f"'{text}' is not a {example}")
    return float(hit.group(1)) * units[unit]


def parse_size(field: str, text: str | float) -> float:
    """Bytes from ``2GB`` (1e9), ``1GiB`` (2^30), ``750MB``, ``4096`` (bytes)."""
    return _split(field, text, _SIZE_UNITS, "size such as 2GB, 1GiB, 750MB or a number of bytes")


def parse_duration(field: str, text: str | float) -> float:
    """Seconds from ``5us``, ``1.5ms``, ``98s``, ``68min`` (or ``68m``), ``24h``, ``54d``, ``1y``."""
    return _split(field, text, _TIME_UNITS, "duration such as 5us, 1.5ms, 98s, 68min, 24h or 54d")


def parse_number(field: str, text: str | float) -> float:
    """A count with an optional power-of-1000 suffix: ``7B``, ``15.6T``, ``2M``, ``1e12``."""
    try:
        return parse_count(text)
    except (TypeError, ValueError):
        raise InputError(field, f"'{text}' is not a number (suffixes k, M, B/G, T, P allowed)") from None


def positive(field: str, x: float, allow_zero: bool = False) -> float:
    """``x`` if finite and > 0 (≥ 0 with ``allow_zero``)."""
    if x is None or not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        rule = "a non-negative" if allow_zero else "a positive"
        raise InputError(field, f"must be {rule} finite number (got {x:g})" if x is not None else f"must be {rule} finite number")
    return float(x)


def fraction(field: str, x: float, allow_zero: bool = False, allow_one: bool = True) -> float:
    """``x`` in (0, 1] (or [0, 1], or (0, 1))."""
    positive(field, x, allow_zero)
    if x > 1 or (x == 1 and not allow_one):
        raise InputError(field, f"must be at most 1{'' if allow_one else ' (exclusive)'} (got {x:g})")
    return float(x)


def seed(field: str, x: float) -> int:
    """A random seed: a whole number in [0, 2^63) (what numpy's generators take)."""
    return count(field, x, 0, 2**63 - 1)


def count(field: str, x: float, minimum: int = 1, maximum: int | None = None) -> int:
    """``x`` as a whole number in [minimum, maximum]."""
    if x is None or not math.isfinite(x) or x != int(x):
        raise InputError(field, f"must be a whole number (got {x:g})" if x is not None else "must be a whole number")
    if x < minimum:
        rule = "a positive integer" if minimum == 1 else f"at least {minimum}"
        raise InputError(field, f"must be {rule} (got {int(x)})")
    if maximum is not None and x > maximum:
        raise InputError(field, f"must be at most {maximum:,} (got {int(x):,})")
    return int(x)


def choice(field: str, value: str, options: dict[str, str] | tuple[str, ...]) -> str:
    """The canonical name of ``value`` among ``options`` (a tuple of names, or aliases → names);
    case, '-' and '_' are ignored."""
    key = str(value).strip().lower().replace("-", "_")
    table = options if isinstance(options, dict) else {o: o for o in options}
    for alias, name in table.items():
        if alias.lower().replace("-", "_") == key:
            return name
    names = sorted(set(table.values()))
    raise InputError(field, f"unknown {field} '{value}' (one of: {', '.join(n.replace('_', '-') for n in names)})")
