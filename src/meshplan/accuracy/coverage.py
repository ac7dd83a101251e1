"""How often the step-time interval (:mod:`meshplan.accuracy.interval`) holds runs it never saw.

Coverage of a set T of test runs = (1/|T|) · #{t ∈ T : low_t ≤ y_t ≤ high_t}, where [low_t, high_t]
is the interval built for run t's predicted step ŷ_t from a calibration set that excludes t.
Two calibration sets, both reported:

* ``visible → held-out``: calibrated on the visible runs only (the ground truth the constants were
  checked against), tested on every held-out run. The textbook split of split-conformal
  prediction, but the visible residuals were made small by choosing constants on them, so it
  tends to under-cover.
* ``leave one source out``: each test run's interval from every validated run (visible and held
  out) except those of its own source — the source's runs share a mapping, a software release and
  often a layout, so keeping them would overstate coverage. Tested on the held-out runs, and on
  the visible runs for comparison.

Not a guarantee: sources are not exchangeable, which is why coverage is measured, not assumed.
"""

from __future__ import annotations

from statistics import median

from meshplan.accuracy.interval import LEVEL, Residual, check_level, interval_for


def _score(tests: list[Residual], calibration, level: float) -> dict:
    """Coverage and median relative width over ``tests``; ``calibration(t)`` gives t's residuals."""
    covered, widths, fallbacks = 0, [], 0
    for t in tests:
        iv = interval_for(t.predicted_step_s, t.family, t.generation, t.gpus, level, calibration(t))
        covered += iv.low <= t.published_step_s <= iv.high
        widths.append((iv.high - iv.low) / t.predicted_step_s)
        fallbacks += bool(iv.note)
    return {"runs": len(tests), "covered": covered, "coverage": covered / len(tests) if tests else None,
            "median_width": median(widths) if widths else None, "broader_group": fallbacks}


def coverage(residuals: list[Residual], level: float = LEVEL) -> dict:
    """The interval's coverage at ``level`` by the module's two calibrations."""
    level = check_level(level)
    visible = [r for r in residuals if r.run_set == "visible"]
    held = [r for r in residuals if r.run_set == "held-out"]

    def others(t: Residual) -> list[Residual]:
        return [r for r in residuals if r.source != t.source]

    methods = [
        {"name": "visible → held-out", "rows": "held-out", **_score(held, lambda t: visible, level),
         "how": "calibrated on the visible runs only"},
        {"name": "leave one source out", "rows": "held-out", **_score(held, others, level),
         "how": "each run's interval from every validated run of the other sources"},
        {"name": "leave one source out", "rows": "visible", **_score(visible, others, level),
         "how": "the same, on the visible runs"},
    ]
    return {"level": level, "methods": [m for m in methods if m["runs"]]}


__all__ = ["coverage"]
