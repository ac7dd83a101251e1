"""Units. Internally meshplan uses SI base units only (bytes, seconds, FLOP, bytes/s, FLOP/s);
conversions happen at the edges, through the constants and formatters here.

Memory is shown in GiB (2**30 bytes, as torch and nvidia-smi report) unless GB (1e9) is asked
for; bandwidth in GB/s (1e9 bytes/s); compute in TFLOP/s (1e12 FLOP/s).
"""

from __future__ import annotations

KiB = 2**10
MiB = 2**20
GiB = 2**30
KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
GBPS = 1e9  # bytes per second
GBIT_PER_S = 1e9 / 8  # bytes per second in one Gb/s
TFLOPS = 1e12
PFLOPS = 1e15
US = 1e-6
MS = 1e-3
HOUR = 3600.0
DAY = 86400.0

_SIZE_SUFFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12, "p": 1e15}


def parse_count(text: str | int | float) -> float:
    """Parse a count such as ``16M``, ``15.6T``, ``2e12`` or ``4096`` (suffixes k, M, G/B, T, P are
    powers of 1000). Raises ``ValueError`` on anything else."""
    if isinstance(text, (int, float)):
        return float(text)
    s = str(text).strip().replace("_", "").replace(",", "")
    if not s:
        raise ValueError("empty number")
    suffix = s[-1].lower()
    if suffix in _SIZE_SUFFIXES and suffix != "" and not suffix.isdigit():
        return float(s[:-1]) * _SIZE_SUFFIXES[suffix]
    return float(s)


def fmt_bytes(n: float, unit: str = "GiB", digits: int = 2) -> str:
    """Format bytes as GiB (default) or GB, with the unit label."""
    scale = {"GiB": GiB, "GB": GB, "MiB": MiB, "MB": MB, "TB": TB}[unit]
    return f"{n / scale:.{digits}f} {unit}"


def fmt_seconds(t: float) -> str:
    """Format a duration with a unit that keeps it readable (µs, ms, s, h, days)."""
    a = abs(t)
    if a < 1e-3:
        return f"{t / US:.1f} µs"
    if a < 1.0:
        return f"{t / MS:.2f} ms"
    if a < 2 * HOUR:
        return f"{t:.3f} s"
    if a < 2 * DAY:
        return f"{t / HOUR:.2f} h"
    return f"{t / DAY:.2f} days"
