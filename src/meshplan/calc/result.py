"""What every calculator returns: its figures as a JSON-ready dict (SI units), the derivation of
each figure (formula, symbols with their values, result, source: rendered by ``--explain`` with
:func:`meshplan.explain.render`), and notes on where a source's number differs and why.

The CLI's human output is the derivations' titles and values, so the figure shown, the figure
explained and the figure in the JSON are the same number."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from meshplan.explain import Derivation
from meshplan.units import GB, GiB, fmt_seconds


@dataclass(frozen=True)
class CalcResult:
    kind: str  # the calculator: "collective", "checkpoint", ...
    data: dict[str, Any]  # JSON-ready, SI units (bytes, seconds, FLOP, bytes/s)
    derivations: tuple[Derivation, ...] = ()
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # non-JSON payloads (timelines for pictures)

    def to_dict(self, explain: bool = False) -> dict[str, Any]:
        out = {"calculator": self.kind, **self.data}
        if self.notes:
            out["notes"] = list(self.notes)
        if explain:
            out["derivations"] = [
                {"key": d.key, "title": d.title, "formula": d.formula, "symbols": [list(s) for s in d.symbols],
                 "value": d.value, "source": d.source}
                for d in self.derivations
            ]
        return out


def derive(key: str, title: str, formula: str, symbols: Iterable[tuple[str, str]], value: str, source: str = "") -> Derivation:
    return Derivation(key, title, formula, tuple(symbols), value, source)


def num(x: float, digits: int = 4) -> str:
    """A number with ``digits`` significant digits, thousands separated, scientific when tiny or
    huge."""
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if not math.isfinite(x):
        return "∞" if x > 0 else ("-∞" if x < 0 else "NaN")
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1e15 or a < 1e-4:
        return f"{x:.{digits - 1}e}"
    if float(x).is_integer() and a < 1e15:
        return f"{int(x):,}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(a))))
    return f"{x:,.{decimals}f}"


def pct(x: float, digits: int = 2) -> str:
    return f"{100 * x:.{digits}f}%"


def size(n: float) -> str:
    """Bytes in GB (1e9) with GiB (2^30) alongside; small sizes in MB / MiB."""
    if abs(n) >= 0.1 * GB:
        return f"{n / GB:,.4g} GB ({n / GiB:,.4g} GiB)"
    return f"{n / 1e6:,.4g} MB ({n / 2**20:,.4g} MiB)"


def secs(t: float) -> str:
    """A duration in a readable unit, with the exact seconds when that unit is not seconds."""
    if t == 0:
        return "0 s"
    text = fmt_seconds(t)
    if text.endswith(" s"):
        return f"{text} ({t / 60:.2f} min)" if abs(t) >= 60 else text
    return f"{text} ({num(t)} s)"


def rate(b: float) -> str:
    return f"{b / GB:,.4g} GB/s"
