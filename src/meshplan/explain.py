"""Derivations: each reported figure with its formula, its symbols' values and its source.

The estimate records a :class:`Derivation` for each figure at the point where it computes it, so
the formula shown is the one that produced the number. ``render`` turns them into text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Derivation:
    key: str  # stable key of the figure in the result, e.g. "memory.stages[0].activations"
    title: str
    formula: str
    symbols: tuple[tuple[str, str], ...]  # (symbol, value with unit and meaning)
    value: str  # the result with its unit
    source: str = ""


def render(derivations: list[Derivation], match: str | None = None) -> str:
    """Plain-text rendering; ``match`` keeps derivations whose key or title contains it."""
    out = []
    for d in derivations:
        if match and match.lower() not in d.key.lower() and match.lower() not in d.title.lower():
            continue
        out.append(f"{d.title}  [{d.key}]")
        out.append(f"  = {d.formula}")
        for sym, val in d.symbols:
            out.append(f"    {sym:<10} {val}")
        out.append(f"  = {d.value}")
        if d.source:
            out.append(f"  source: {d.source}")
        out.append("")
    return "\n".join(out)
