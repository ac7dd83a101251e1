"""``calc formats``: floating-point formats from their bit layout.

A binary float with ``e`` exponent bits and ``m`` mantissa (fraction) bits, bias
``β = 2^(e−1) − 1`` (IEEE 754-2019, Sec. 3.3-3.4; the FP8 formats of Micikevicius et al. 2022,
"FP8 Formats for Deep Learning", Table 1, and the OCP 8-bit floating point spec v1.0):

* normal numbers ``(−1)^s · 2^(E−β) · (1 + F/2^m)`` for exponent field ``1 ≤ E ≤ E_max``;
  subnormals ``(−1)^s · 2^(1−β) · F/2^m`` for ``E = 0``;
* IEEE-style formats (fp32, tf32, bf16, fp16, e5m2) reserve ``E = 2^e − 1`` for ∞ and NaN:
  ``max = (2 − 2^−m)·2^(2^e − 2 − β)``; e4m3 ("fn": finite) keeps that exponent for numbers and
  only ``S.1111.111`` is NaN: ``max = (2 − 2^(1−m))·2^(2^e − 1 − β) = 448``;
* smallest normal ``2^(1−β)``, smallest subnormal ``2^(1−β−m)``, machine epsilon (gap above 1)
  ``2^−m``, unit roundoff ``2^−(m+1)``, decimal digits ``(m + 1)·log₁₀ 2``, dynamic range
  ``log₁₀(max / smallest subnormal)`` decades.

:func:`decode` turns a bit pattern into its value from the same layout and :func:`round_to`
rounds a real number to the nearest representable value (ties to even), so tests can compare all
three with numpy, torch and ml_dtypes. :func:`tensor_bytes` sizes a tensor in each format (the
FP8 activation-memory saving of source 001).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.calc.inputs import choice, positive
from meshplan.calc.result import CalcResult, derive, num, size

IEEE = "IEEE 754-2019 Sec. 3.3-3.4"
FP8 = "Micikevicius et al. 2022, FP8 Formats for Deep Learning, Table 1; OCP 8-bit Floating Point Specification (OFP8) v1.0"


@dataclass(frozen=True)
class FloatFormat:
    name: str
    exp_bits: int
    man_bits: int
    finite_only: bool = False  # e4m3fn: no infinities, only all-ones is NaN
    storage_bits: int | None = None  # tf32 is stored in 32 bits
    source: str = IEEE

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def emax(self) -> int:
        """Largest unbiased exponent of a finite number."""
        top = 2**self.exp_bits - 1
        return (top if self.finite_only else top - 1) - self.bias

    @property
    def max(self) -> float:
        frac = 2 - 2.0 ** (1 - self.man_bits) if self.finite_only else 2 - 2.0**-self.man_bits
        return frac * 2.0**self.emax

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.man_bits)

    @property
    def eps(self) -> float:
        return 2.0**-self.man_bits

    @property
    def decimal_digits(self) -> float:
        return (self.man_bits + 1) * math.log10(2)

    @property
    def decades(self) -> float:
        return math.log10(self.max / self.min_subnormal)

    @property
    def has_inf(self) -> bool:
        return not self.finite_only

    @property
    def storage_bytes(self) -> int:
        return (self.storage_bits or self.bits) // 8


FORMATS: dict[str, FloatFormat] = {
    "fp32": FloatFormat("fp32", 8, 23),
    "tf32": FloatFormat("tf32", 8, 10, storage_bits=32, source="NVIDIA A100 whitepaper (TF32: 8-bit exponent, 10-bit mantissa)"),
    "bf16": FloatFormat("bf16", 8, 7, source="Kalamkar et al. 2019, A Study of BFLOAT16 for Deep Learning Training"),
    "fp16": FloatFormat("fp16", 5, 10),
    "fp8-e4m3": FloatFormat("fp8-e4m3", 4, 3, finite_only=True, source=FP8),
    "fp8-e5m2": FloatFormat("fp8-e5m2", 5, 2, source=FP8),
}
ALIASES = {
    "fp32": "fp32", "float32": "fp32", "single": "fp32", "tf32": "tf32", "tensorfloat32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp8_e4m3": "fp8-e4m3", "e4m3": "fp8-e4m3", "fp8e4m3": "fp8-e4m3", "e4m3fn": "fp8-e4m3", "float8_e4m3fn": "fp8-e4m3",
    "fp8_e5m2": "fp8-e5m2", "e5m2": "fp8-e5m2", "fp8e5m2": "fp8-e5m2", "float8_e5m2": "fp8-e5m2",
}


def get_format(name: str) -> FloatFormat:
    return FORMATS[choice("format", name, ALIASES)]


def decode(bits: int, fmt: FloatFormat) -> float:
    """The value of the bit pattern ``bits`` (sign, exponent field, fraction field)."""
    m, e = fmt.man_bits, fmt.exp_bits
    frac = bits & (2**m - 1)
    E = (bits >> m) & (2**e - 1)
    sign = -1.0 if (bits >> (m + e)) & 1 else 1.0
    top = 2**e - 1
    if E == top and not fmt.finite_only:
        return sign * math.inf if frac == 0 else math.nan
    if E == top and fmt.finite_only and frac == 2**m - 1:
        return math.nan
    if E == 0:
        return sign * fmt.min_normal * frac / 2**m
    return sign * 2.0 ** (E - fmt.bias) * (1 + frac / 2**m)


def round_to(x: float, fmt: FloatFormat, saturate: bool = False) -> float:
    """``x`` rounded to the nearest value of ``fmt``, ties to even; beyond the largest finite value
    (past the rounding boundary) ∞ for IEEE-style formats, NaN for e4m3 (OCP: no ∞) unless
    ``saturate`` clamps to ±max."""
    if math.isnan(x) or math.isinf(x):
        return x if fmt.has_inf or math.isnan(x) else (math.copysign(fmt.max, x) if saturate else math.nan)
    if x == 0:
        return x
    a = abs(x)
    exp = math.frexp(a)[1] - 1  # 2^exp ≤ a < 2^(exp+1), exactly
    exp = max(exp, 1 - fmt.bias)  # subnormals share the smallest normal's quantum
    quantum = 2.0 ** (exp - fmt.man_bits)
    q = a / quantum
    r = math.floor(q)
    if q - r > 0.5 or (q - r == 0.5 and r % 2 == 1):
        r += 1
    y = r * quantum
    if y > fmt.max:
        boundary = fmt.max + 2.0 ** (fmt.emax - fmt.man_bits) / 2  # halfway to the next (absent) value
        if saturate or (a < boundary):
            y = fmt.max
        else:
            return math.copysign(math.inf, x) if fmt.has_inf else math.nan
    return math.copysign(y, x)


def tensor_bytes(elements: float, fmt: FloatFormat) -> float:
    return elements * fmt.storage_bytes


def formats(names: list[str] | None = None, elements: float | None = None, value: float | None = None) -> CalcResult:
    """The table of formats; with ``elements`` the bytes of such a tensor in each, with ``value``
    its nearest representable value in each."""
    fmts = [get_format(n) for n in names] if names else list(FORMATS.values())
    rows, derivs = [], []
    for f in fmts:
        row = {"format": f.name, "bits": f.bits, "storage_bytes": f.storage_bytes, "exponent_bits": f.exp_bits,
               "mantissa_bits": f.man_bits, "bias": f.bias, "max": f.max, "min_normal": f.min_normal,
               "min_subnormal": f.min_subnormal, "eps": f.eps, "decimal_digits": f.decimal_digits,
               "decades": f.decades, "has_inf": f.has_inf}
        syms = [("e", str(f.exp_bits)), ("m", str(f.man_bits)), ("β", f"{f.bias} = 2^(e−1) − 1")]
        max_formula = "(2 − 2^(1−m))·2^(2^e − 1 − β)  (no ∞; only S.1111.111 is NaN)" if f.finite_only else "(2 − 2^−m)·2^(2^e − 2 − β)"
        derivs += [
            derive(f"formats.{f.name}.max", f"{f.name}: largest finite", max_formula, syms, num(f.max, 6), f.source),
            derive(f"formats.{f.name}.min", f"{f.name}: smallest normal / subnormal", "2^(1−β) / 2^(1−β−m)", syms,
                   f"{f.min_normal:.4g} / {f.min_subnormal:.4g}", f.source),
            derive(f"formats.{f.name}.eps", f"{f.name}: machine epsilon, decimal digits", "2^−m, (m + 1)·log₁₀ 2", syms,
                   f"{f.eps:.4g}, {f.decimal_digits:.2f} digits", f.source),
        ]
        if elements is not None:
            row["tensor_bytes"] = tensor_bytes(elements, f)
        if value is not None:
            y = round_to(value, f)
            row["rounded"] = y
            row["relative_error"] = abs(y - value) / abs(value) if value and math.isfinite(y) else None
        rows.append(row)
    data = {"formats": rows}
    if elements is not None:
        n = positive("elements", elements)
        data["elements"] = n
        base = max(fmts, key=lambda f: f.storage_bytes)
        for f in fmts:
            saving = tensor_bytes(n, base) - tensor_bytes(n, f)
            derivs.append(derive(f"formats.{f.name}.tensor", f"{f.name}: tensor of {num(n)} elements",
                                 "elements × bytes per element", [("bytes", f"{f.storage_bytes} per element")],
                                 size(tensor_bytes(n, f)) + (f", {size(saving)} less than {base.name}" if f is not base else ""),
                                 "storage bytes per element (source 001, FP8 activation memory)"))
    if value is not None:
        data["value"] = value
    return CalcResult("formats", data, tuple(derivs))


def parse_elements(text: str) -> float:
    """``2x4x4096x8192x80`` (or with ``*``) → the product; each factor may carry k/M/B/T."""
    from meshplan.calc.inputs import parse_number

    total = 1.0
    for part in str(text).replace("*", "x").replace("×", "x").split("x"):
        total *= positive("elements", parse_number("elements", part.strip()))
    return total


