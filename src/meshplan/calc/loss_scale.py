"""``calc loss-scale``: dynamic loss scaling with ``torch.amp.GradScaler``'s semantics.

The loss is multiplied by the scale ``S`` before the backward so that small fp16 gradients do not
flush to zero; the optimizer step unscales them. After every step (``torch._amp_update_scale_``,
used by ``GradScaler.update``):

* if any gradient overflowed (inf/NaN after scaling), the step is skipped,
  ``S ← S·backoff_factor`` (0.5) and the count of good steps resets to 0;
* otherwise the count grows by one, and when it reaches ``growth_interval`` (2,000)
  ``S ← S·growth_factor`` (2) and the count resets.

Defaults are GradScaler's: ``init_scale = 2^16``, growth 2, backoff 0.5, interval 2,000
(Micikevicius et al. 2018, "Mixed Precision Training", Sec. 3.2, describes the scheme).

Overflow flags come either from a given sequence or from a synthetic gradient distribution: each
step draws ``k`` gradient magnitudes, log-normal around a median with a spread of ``σ`` (natural
log), and with probability ``p`` a spike multiplies them by a factor; the step overflows when the
largest scaled gradient exceeds the format's largest finite value, and the share of scaled
gradients below half the smallest subnormal (which round to zero) is the underflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from meshplan.calc.formats import get_format
from meshplan.calc.inputs import count, positive, seed as check_seed
from meshplan.calc.result import CalcResult, derive, num, pct
from meshplan.errors import InputError

SOURCE = "torch.amp.GradScaler (torch._amp_update_scale_); Micikevicius et al. 2018, Mixed Precision Training, Sec. 3.2"
MAX_STEPS = 10_000_000


@dataclass(frozen=True)
class ScalerConfig:
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def check(self) -> "ScalerConfig":
        positive("init_scale", self.init_scale)
        if positive("growth_factor", self.growth_factor) <= 1:
            raise InputError("growth_factor", f"must be greater than 1 (got {self.growth_factor})")
        if not 0 < positive("backoff_factor", self.backoff_factor) < 1:
            raise InputError("backoff_factor", f"must be between 0 and 1 (got {self.backoff_factor})")
        count("growth_interval", self.growth_interval, 1, MAX_STEPS)
        return self


@dataclass(frozen=True)
class Walk:
    scales: np.ndarray  # scale used at each step
    final_scale: float
    skipped: int
    growths: int
    backoffs: int
    flags: np.ndarray  # overflow at each step


def update(scale: float, good: int, overflow: bool, cfg: ScalerConfig) -> tuple[float, int, bool]:
    """One ``GradScaler.update``: (new scale, good steps in a row, whether it grew)."""
    if overflow:
        return scale * cfg.backoff_factor, 0, False
    good += 1
    if good == cfg.growth_interval:
        grown = scale * cfg.growth_factor
        return (grown, 0, True) if math.isfinite(grown) else (scale, 0, False)  # torch keeps a finite scale
    return scale, good, False


def walk(overflow, cfg: ScalerConfig = ScalerConfig(), steps: int | None = None) -> Walk:
    """The scale over a sequence of overflow flags, or over ``steps`` steps of a function
    ``overflow(step, scale)`` deciding each step's flag from the scale in use (module docstring)."""
    cfg.check()
    decide = overflow if callable(overflow) else None
    n = steps if decide is not None else len(overflow)
    flags = np.zeros(n, dtype=bool)
    scales = np.empty(n)
    s, good, growths = float(cfg.init_scale), 0, 0
    for i in range(n):
        scales[i] = s
        flags[i] = decide(i, s) if decide is not None else bool(overflow[i])
        s, good, grew = update(s, good, flags[i], cfg)
        growths += grew
    n_bad = int(flags.sum())
    return Walk(scales, s, n_bad, growths, n_bad, flags)


def synthetic_flags(steps: int, per_step: int, median: float, sigma: float, spike_prob: float, spike_factor: float,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(largest gradient magnitude per step, all draws' log-magnitudes) of the synthetic model; the
    overflow test needs the scale, so it happens in :func:`synthetic`."""
    rng = np.random.default_rng(seed)
    logs = np.log(median) + sigma * rng.standard_normal((steps, per_step))
    spikes = rng.random(steps) < spike_prob
    logs[spikes] += math.log(spike_factor)
    return np.exp(logs.max(axis=1)), logs


def synthetic(steps: int, per_step: int = 1000, median: float = 1e-5, sigma: float = 2.0, spike_prob: float = 0.001,
              spike_factor: float = 1e4, fmt: str = "fp16", cfg: ScalerConfig = ScalerConfig(), seed: int = 0) -> tuple[Walk, float, np.ndarray]:
    """Walk the scale over synthetic gradients: (walk, mean underflow share, overflow flags)."""
    cfg.check()
    steps = count("steps", steps, 1, MAX_STEPS)
    per_step = count("per_step", per_step, 1, 100_000)
    if steps * per_step > 50_000_000:
        raise InputError("steps", "steps × per-step gradients must be at most 50,000,000")
    f = get_format(fmt)
    seed = check_seed("seed", seed)
    peak, logs = synthetic_flags(steps, per_step, positive("median", median), positive("sigma", sigma, allow_zero=True),
                                 positive("spike_prob", spike_prob, allow_zero=True), positive("spike_factor", spike_factor), seed)
    under = np.zeros(steps)
    zero_below = math.log(f.min_subnormal / 2)

    def decide(i: int, scale: float) -> bool:
        under[i] = np.mean(logs[i] + math.log(scale) < zero_below)
        return bool(peak[i] * scale > f.max)

    w = walk(decide, cfg, steps)
    return w, float(under.mean()), w.flags


def loss_scale(overflow: list[bool] | None = None, cfg: ScalerConfig = ScalerConfig(), synthetic_args: dict | None = None) -> CalcResult:
    if (overflow is None) == (synthetic_args is None):
        raise InputError("overflow", "give either overflow flags or a synthetic gradient distribution")
    under = None
    if overflow is not None:
        if not len(overflow):
            raise InputError("overflow", "needs at least one step")
        w = walk(overflow, cfg)
    else:
        w, under, _ = synthetic(cfg=cfg, **synthetic_args)
    flags = w.flags
    changes = [{"step": int(i), "scale": float(w.scales[i])} for i in np.flatnonzero(np.diff(w.scales, prepend=np.nan))]
    data = {"steps": int(flags.size), "init_scale": cfg.init_scale, "growth_factor": cfg.growth_factor,
            "backoff_factor": cfg.backoff_factor, "growth_interval": cfg.growth_interval, "final_scale": w.final_scale,
            "skipped_steps": w.skipped, "growths": w.growths, "backoffs": w.backoffs, "scale_changes": changes[:1000]}
    derivs = [derive("loss_scale.final", "final loss scale",
                     "S ← S·backoff on overflow (step skipped); S ← S·growth after growth_interval good steps in a row",
                     [("S₀", f"{num(cfg.init_scale)} = 2^{math.log2(cfg.init_scale):g}"), ("overflows", str(w.skipped)),
                      ("growths", str(w.growths)), ("backoff", num(cfg.backoff_factor)), ("growth", num(cfg.growth_factor)),
                      ("interval", f"{cfg.growth_interval:,} steps")],
                     f"{num(w.final_scale)} = 2^{math.log2(w.final_scale):g}; {w.skipped} of {flags.size:,} steps skipped ({pct(w.skipped / flags.size)})",
                     SOURCE)]
    if under is not None:
        data["underflow_fraction"] = under
        derivs.append(derive("loss_scale.underflow", "gradients flushed to zero (mean per step)",
                             "share of |g|·S < min_subnormal/2", [("format", synthetic_args.get("fmt", "fp16"))], pct(under, 3),
                             "round to nearest: below half the smallest subnormal a value becomes 0 (IEEE 754-2019 Sec. 4.3)"))
    return CalcResult("loss-scale", data, tuple(derivs))


def parse_flags(text: str) -> list[bool]:
    """``0010011`` or ``0,0,1,0`` (1 / x / T = overflow) or ``steps=100:3,17`` (overflow at those
    steps of a run of that many)."""
    t = str(text).strip().replace(" ", "")
    if t.startswith("steps="):
        head, _, tail = t.partition(":")
        n = count("overflow", _int(head[6:]), 1, MAX_STEPS)
        flags = [False] * n
        for part in filter(None, tail.split(",")):
            i = _int(part)
            if not 0 <= i < n:
                raise InputError("overflow", f"step {i} is outside 0..{n - 1}")
            flags[i] = True
        return flags
    chars = t.replace(",", "")
    if not chars or any(c not in "01xXtTfF.-" for c in chars):
        raise InputError("overflow", "flags are 0/1 per step (e.g. 0010011), or steps=N:i,j for overflows at steps i, j")
    return [c in "1xXtT" for c in chars]


def _int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        raise InputError("overflow", f"'{s}' is not a whole number") from None
