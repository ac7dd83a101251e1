"""A prediction interval for an estimate's step time, from the residuals of validated runs.

**Residual.** For a validated run i with predicted step ŷ_i and published step y_i, the residual is
the ratio ``r_i = y_i / ŷ_i`` (scale-free: a 2 s step and a 60 s step that meshplan gets 10 % too
fast both give 1.11).

**Split-conformal interval** (Vovk, Gammerman & Shafer 2005, *Algorithmic Learning in a Random
World*; Lei, G'Sell, Rinaldo, Tibshirani & Wasserman 2018, "Distribution-free predictive inference
for regression", JASA 113(523), Sec. 2.2). With the n residuals of a calibration group sorted,
r_(1) ≤ … ≤ r_(n), and miscoverage α = 1 − level, the equal-tailed interval for a new plan with
predicted step ŷ is

    [ŷ · r_(k_lo), ŷ · r_(k_hi)],  k_lo = ⌊(n + 1) · α/2⌋,  k_hi = ⌈(n + 1) · (1 − α/2)⌉.

If the new run and the group's runs are exchangeable, each tail is missed with probability at most
α/2, so the interval holds the measured step with probability ≥ level. It exists only when
1 ≤ k_lo and k_hi ≤ n, i.e. n ≥ 2/α − 1 (:func:`min_runs`: 9 runs at 80 %, 19 at 90 %).

**Which runs.** The group of runs that resemble the plan: same stack family, GPU generation and
scale bucket (:mod:`meshplan.accuracy.groups`); where that group has fewer than :func:`min_runs`
runs, the next broader group of :data:`LEVELS` (family and GPU; family; every run), and the
interval says which it used and why. Runs of one source are not exchangeable with another
source's (they share a mapping and a software era), which is why :func:`coverage` measures the
interval on runs whose source it never saw, not by the theorem.

The residuals are not computed at estimate time: ``catalog/data/residuals.json`` holds every
validated run's predicted and published step (written by ``meshplan validate --write-residuals
FILE``; a test fails when it differs from the current predictions).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Optional

from meshplan.accuracy.groups import gpu_generation, scale_bucket, stack_family
from meshplan.errors import InputError

LEVEL = 0.8  #: the default level of an estimate's interval
RESIDUALS_FILE = "residuals.json"
WRITE_COMMAND = "meshplan validate --write-residuals src/meshplan/catalog/data/residuals.json"
#: the calibration groups, narrowest first: which of a run's keys must match
LEVELS: tuple[tuple[str, ...], ...] = (("family", "generation", "bucket"), ("family", "generation"), ("family",), ())


@dataclass(frozen=True)
class Residual:
    """One validated run's predicted and published step, with the keys it is grouped by."""

    id: str
    source: str  # the source group
    run_set: str  # visible | held-out
    gpus: int
    generation: str  # A100, H100, ...
    family: str  # the stack family: fused, compiled, eager
    stack: str  # the stack profile
    predicted_step_s: float
    published_step_s: float

    @property
    def ratio(self) -> float:
        """r = published / predicted."""
        return self.published_step_s / self.predicted_step_s

    @property
    def bucket(self) -> str:
        return scale_bucket(self.gpus)


@dataclass(frozen=True)
class StepInterval:
    """The interval [low, high] (seconds) at ``level``, from ``runs`` residuals of ``group``."""

    step_s: float
    low: float
    high: float
    level: float
    group: str  # the calibration group in words
    runs: int
    note: str = ""  # why a broader group was used, if one was

    def scaled(self, value: float) -> tuple[float, float]:
        """The interval of a figure proportional to the step time (days, GPU-hours, dollars)."""
        return value * self.low / self.step_s, value * self.high / self.step_s

    def to_dict(self) -> dict:
        return {"step_s_interval": [self.low, self.high], "interval_level": self.level,
                "interval_basis": {"group": self.group, "runs": self.runs, "note": self.note}}


def check_level(level: float) -> float:
    """``level`` if it is a probability strictly between 0 and 1, else one error line."""
    if not (isinstance(level, (int, float)) and 0.0 < level < 1.0):
        raise InputError("interval", f"must be a level between 0 and 1, e.g. 0.8 for 80 % (got {level})")
    return float(level)


def min_runs(level: float) -> int:
    """The fewest residuals a split-conformal interval at ``level`` needs: n ≥ 2/α − 1."""
    return math.ceil(2.0 / (1.0 - level) - 1.0 - 1e-9)


def conformal_ratios(ratios: list[float], level: float) -> Optional[tuple[float, float]]:
    """(r_(k_lo), r_(k_hi)) of the module's formula, or None when the group is too small."""
    n, alpha = len(ratios), 1.0 - level
    k_lo = math.floor((n + 1) * alpha / 2 + 1e-9)
    k_hi = math.ceil((n + 1) * (1 - alpha / 2) - 1e-9)
    if k_lo < 1 or k_hi > n:
        return None
    ordered = sorted(ratios)
    return ordered[k_lo - 1], ordered[k_hi - 1]


def _describe(keys: tuple[str, ...], want: dict[str, str]) -> str:
    words = {"family": f"{want['family']} stacks", "generation": f"on {want['generation']}",
             "bucket": f"at {want['bucket']} GPUs"}
    return " ".join(words[k] for k in keys) if keys else "all validated runs"


def interval_for(step_s: float, family: str, generation: str, num_gpus: int, level: float = LEVEL,
                 residuals: Optional[list[Residual]] = None) -> StepInterval:
    """The interval of a plan predicted at ``step_s`` (module docstring), from ``residuals`` (the
    file's when None), falling back through :data:`LEVELS` to the first group large enough."""
    level = check_level(level)
    pool = load_residuals() if residuals is None else residuals
    want = {"family": family, "generation": generation, "bucket": scale_bucket(num_gpus)}
    need, skipped = min_runs(level), []
    for keys in LEVELS:
        group = [r for r in pool if all(getattr(r, k) == want[k] for k in keys)]
        bounds = conformal_ratios([r.ratio for r in group], level)
        if bounds is not None:
            note = f"only {'; '.join(skipped)}: the {100 * level:g} % interval needs {need}" if skipped else ""
            return StepInterval(step_s, step_s * bounds[0], step_s * bounds[1], level, _describe(keys, want), len(group), note)
        skipped.append(f"{len(group)} runs of {_describe(keys, want)}")
    raise InputError("interval", f"the {100 * level:g} % interval needs at least {need} validated runs; {len(pool)} are known")


def plan_interval(plan, cluster, step_s: float, level: float = LEVEL) -> StepInterval:
    """The interval of a plan (its stack family, its GPU, its GPU count) predicted at ``step_s``."""
    return interval_for(step_s, stack_family(plan.stack), gpu_generation(cluster.gpu.name), plan.num_gpus, level)


def estimate_interval(est, level: float = LEVEL) -> StepInterval:
    """The interval of an :class:`~meshplan.estimate.Estimate`'s step time."""
    return plan_interval(est.plan, est.cluster, est.time.step_s, level)


# ---- the residuals file --------------------------------------------------------------------------


def residuals_of(rows) -> list[Residual]:
    """The residuals of a validation report's rows (``RunResult``) that have both step times."""
    return [Residual(r.id, r.group, r.run_set, r.gpus, r.generation, r.family, r.stack, r.predicted_step_s,
                     r.published_step_s) for r in rows if r.error is not None]


def residuals_document(rows) -> dict:
    """What ``catalog/data/residuals.json`` holds for these rows."""
    return {"written_by": WRITE_COMMAND,
            "residual": "published_step_s / predicted_step_s (meshplan.accuracy.interval)",
            "runs": [dict(r.__dict__) for r in residuals_of(rows)]}


def residuals_json(rows) -> str:
    """:func:`residuals_document` as text, one run a line (floats at ``repr`` precision)."""
    doc = residuals_document(rows)
    runs = ",\n".join("  " + json.dumps(r, allow_nan=False) for r in doc.pop("runs"))
    head = json.dumps(doc, indent=1, allow_nan=False)[:-2]
    return f'{head},\n "runs": [\n{runs}\n ]\n}}\n'


@lru_cache(maxsize=1)
def _load() -> tuple[Residual, ...]:
    text = resources.files("meshplan.catalog").joinpath("data", RESIDUALS_FILE).read_text()
    return tuple(Residual(**r) for r in json.loads(text)["runs"])


def load_residuals() -> list[Residual]:
    """The residuals of ``catalog/data/residuals.json``."""
    return list(_load())


__all__ = ["LEVEL", "LEVELS", "Residual", "StepInterval", "check_level", "conformal_ratios", "estimate_interval",
           "interval_for", "load_residuals", "min_runs", "plan_interval", "residuals_document", "residuals_json",
           "residuals_of"]
