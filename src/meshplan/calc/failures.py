"""``calc failures``: a training run under random failures, analytically and by Monte Carlo.

Model. The run needs ``W`` seconds of failure-free compute. It is cut into segments of ``τ``
seconds of work followed by a checkpoint write of ``C`` seconds (the last segment holds the rest
of the work, and its checkpoint too). Failures arrive as a Poisson process of rate ``1/M`` over
the whole wall-clock time (``M``: the cluster's mean time between failures), during work, during
checkpoint writes and during restarts alike. A failure loses everything since the last completed
checkpoint; the restart takes ``R`` seconds (reschedule, reload the checkpoint) and starts over if
a failure hits it.

Cluster MTBF from component failure rates: ``M = 1 / Σ_i (n_i / M_i)`` for ``n_i`` components of
mean time between failures ``M_i`` each (failure rates add; e.g. GPUs: ``M_gpu / N``).

Expected wall-clock time, exact for this model (Daly 2006, FGCS 22(3), the complete model
with failures during restart): a segment of length ``s = τ + C`` takes on average
``E[T_s] = M·e^{R/M}·(e^{s/M} − 1)``, so ``E[T] = Σ_segments M·e^{R/M}·(e^{s_i/M} − 1)``; the
number of failures is a Poisson count over T, so ``E[failures] = E[T]/M``. Goodput = W / T.

Monte Carlo. Every run is simulated event by event, all runs in lockstep on numpy arrays: from
the start of a segment the time to the next failure is drawn (exponential: memoryless), every
segment that fits before it completes, and the failure lands in the next one; restarts draw
their own failure times. The percentile summary and the timeline of run 0 (work, checkpoint
writes, lost work, restarts) come from the same simulation; its mean agrees with ``E[T]`` within
the simulation's own standard error (tests).

Disk vs in-memory checkpoints (source 000): the same model with the in-memory figures, a
checkpoint copied to host memory and a partner node in seconds and a restart that reloads it in
seconds instead of minutes from the parallel filesystem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from meshplan.calc.checkpoint import daly_interval, first_order_waste, young_interval
from meshplan.calc.inputs import count, positive, seed as check_seed
from meshplan.calc.result import CalcResult, derive, num, pct, secs
from meshplan.errors import InputError

DALY = "Daly 2006, A higher order estimate of the optimum checkpoint interval for restart dumps, FGCS 22(3)"
MAX_RUNS = 1_000_000
MAX_SEGMENTS = 10_000_000
PERCENTILES = (5, 25, 50, 75, 95)
TIMELINE_SEGMENTS = 2000
MAX_SIMULATED_FAILURES = 20_000  # expected failures of one run: each is a step of the simulation
#: Monte Carlo work: runs × expected failures per run, summed over the scenarios (the simulation's
#: steps × the runs each advances): a few seconds of CPU at the bound.
MAX_MONTE_CARLO_EVENTS = 10_000_000
#: Bars of the timeline a picture may record for run 0 (checkpoint intervals and failures, two bars
#: each): about 40 MB; the picture itself draws at most :data:`PICTURE_BINS` per lane.
MAX_TIMELINE_BARS = 400_000


@dataclass(frozen=True)
class Component:
    name: str
    count: int
    mtbf: float  # seconds, per unit


def cluster_mtbf(components: list[Component]) -> float:
    """``1 / Σ n_i / M_i``."""
    if not components:
        raise InputError("component", "give at least one component (name:count:mtbf) or the cluster's mtbf")
    rate = 0.0
    for c in components:
        count(f"component {c.name} count", c.count, 1, 100_000_000)
        rate += c.count / positive(f"component {c.name} mtbf", c.mtbf)
    return 1.0 / rate


@dataclass(frozen=True)
class Scenario:
    name: str
    checkpoint: float  # C, seconds
    recovery: float  # R, seconds
    interval: Optional[float] = None  # τ; None: Daly's optimum


def segments(work: float, tau: float, C: float) -> tuple[int, float, float]:
    """(number of full segments, their length τ + C, length of the last partial one or 0)."""
    if not work / tau <= MAX_SEGMENTS:  # also infinite: a vanishing interval or an endless run
        raise InputError("interval", f"the run would have more than {MAX_SEGMENTS:,} checkpoint intervals; take a longer interval")
    n_full = int(math.floor(work / tau + 1e-12))
    rest = work - n_full * tau
    if n_full and rest <= 1e-9 * tau:  # rounding after whole intervals; with none, all the work is the rest
        rest = 0.0
    if n_full + (rest > 0) > MAX_SEGMENTS:
        raise InputError("interval", f"the run would have more than {MAX_SEGMENTS:,} checkpoint intervals; take a longer interval")
    return n_full, tau + C, (rest + C if rest > 0 else 0.0)


MAX_EXPONENT = 50.0  # e^50 ≈ 5e21 attempts per segment: beyond any run that finishes


def segment_time(s: float, M: float, R: float) -> float:
    """Expected wall time to complete a segment of length s: ``M·e^{R/M}·(e^{s/M} − 1)``."""
    if s / M > MAX_EXPONENT:
        raise InputError("interval", f"interval + checkpoint ({s:g} s) is {s / M:.0f}× the MTBF: the run would practically never finish")
    if R / M > MAX_EXPONENT:
        raise InputError("recovery", f"the restart ({R:g} s) is {R / M:.0f}× the MTBF: it would practically never succeed")
    return M * math.exp(R / M) * math.expm1(s / M)


def expected_time(work: float, tau: float, C: float, R: float, M: float) -> float:
    """``E[T] = Σ_segments M·e^{R/M}·(e^{s_i/M} − 1)``."""
    n_full, s, last = segments(work, tau, C)
    return n_full * segment_time(s, M, R) + (segment_time(last, M, R) if last else 0.0)


@dataclass
class MonteCarlo:
    total: np.ndarray  # wall-clock seconds per run
    failures: np.ndarray
    lost: np.ndarray  # seconds of work and checkpointing lost to failures
    restart: np.ndarray  # seconds spent restarting (failed restarts included)
    timeline: list = field(default_factory=list)  # run 0: (start, end, kind), kind in work/checkpoint/lost/restart

    @property
    def runs(self) -> int:
        return int(self.total.size)


def simulate(work: float, tau: float, C: float, R: float, M: float, runs: int = 1000, seed: int = 0,
             progress: Callable[[float], None] | None = None, keep_timeline: bool = True) -> MonteCarlo:
    """Monte Carlo of ``runs`` independent runs (module docstring)."""
    runs = count("runs", runs, 2, MAX_RUNS)
    n_full, s, last = segments(work, tau, C)
    rng = np.random.default_rng(seed)
    seg = np.zeros(runs, dtype=np.int64)  # segments completed
    clock = np.zeros(runs)
    lost = np.zeros(runs)
    restart = np.zeros(runs)
    fails = np.zeros(runs, dtype=np.int64)
    recovering = np.zeros(runs, dtype=bool)
    done = np.zeros(runs, dtype=bool)
    n_seg = n_full + (1 if last else 0)
    timeline: list[tuple[float, float, str]] = []
    reported = -1.0
    while not done.all():
        active = np.flatnonzero(~done)
        t = rng.exponential(M, active.size)
        rec = recovering[active]
        # restarts: finished when no failure comes within R
        ri, rt = active[rec], t[rec]
        ok = rt >= R
        spent = np.where(ok, R, rt)
        if keep_timeline and ri.size and ri[0] == 0:
            timeline.append((clock[0], clock[0] + spent[0], "restart"))
        clock[ri] += spent
        restart[ri] += spent
        fails[ri[~ok]] += 1
        recovering[ri[ok]] = False
        # work: every whole segment before the failure completes
        wi, wt = active[~rec], t[~rec]
        remaining_full = n_full - np.minimum(seg[wi], n_full)
        remaining = remaining_full * s + last
        finish = wt >= remaining
        k = np.minimum(np.floor(wt / s).astype(np.int64), remaining_full)
        k = np.where(finish, n_seg - seg[wi], k)
        into = np.where(finish, 0.0, wt - k * s)
        if keep_timeline and wi.size and wi[0] == 0:
            _record(timeline, clock[0], int(seg[0]), int(k[0]), n_full, s, last, tau, C, None if finish[0] else into[0])
        clock[wi] += np.where(finish, remaining, wt)
        seg[wi] += k
        lost[wi] += into
        fails[wi[~finish]] += 1
        recovering[wi[~finish]] = True
        done[wi[finish]] = True
        if progress is not None:
            frac = float(seg.sum()) / (runs * n_seg)
            if frac - reported >= 0.005 or done.all():
                reported = frac
                progress(frac)
    return MonteCarlo(clock, fails, lost, restart, timeline)


def _record(tl: list, t0: float, seg: int, k: int, n_full: int, s: float, last: float, tau: float, C: float,
            into: float | None) -> None:
    """Append run 0's completed segments (work then checkpoint) and, if it failed, the lost part.
    More than ``TIMELINE_SEGMENTS`` segments in a row are drawn as one stretch (a picture cannot
    show them apart), labelled work."""
    t = t0
    if k > TIMELINE_SEGMENTS:
        end = t + (k - 1) * s + (s if seg + k - 1 < n_full else last)
        tl.append((t, end, "work"))
        t = end
        k = 0
    for j in range(seg, seg + k):
        length = s if j < n_full else last
        tl.append((t, t + length - C, "work"))
        tl.append((t + length - C, t + length, "checkpoint"))
        t += length
    if into is not None:
        tl.append((t, t + into, "lost"))


def summary(mc: MonteCarlo, work: float) -> dict:
    def stats(x: np.ndarray) -> dict:
        x = np.asarray(x, dtype=float)
        return {"mean": float(x.mean()), "std": float(x.std(ddof=1)), "stderr": float(x.std(ddof=1) / math.sqrt(x.size)),
                **{f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(x, PERCENTILES))}}

    return {"runs": mc.runs, "total_s": stats(mc.total), "failures": stats(mc.failures), "lost_s": stats(mc.lost),
            "restart_s": stats(mc.restart), "goodput": stats(work / mc.total)}


def analyze(work: float, M: float, scenario: Scenario) -> dict:
    """Interval (Daly's optimum unless given), first-order waste and the exact expectation."""
    C = positive("checkpoint_time", scenario.checkpoint)
    R = positive("recovery", scenario.recovery, allow_zero=True)
    tau = daly_interval(C, M) if scenario.interval is None else positive("interval", scenario.interval)
    ET = expected_time(work, tau, C, R, M)
    return {"name": scenario.name, "checkpoint_s": C, "recovery_s": R, "interval_s": tau,
            "young_interval_s": young_interval(C, M), "daly_interval_s": daly_interval(C, M),
            "first_order_waste": first_order_waste(C, tau, M, R), "expected_time_s": ET,
            "expected_failures": ET / M, "expected_goodput": work / ET, "expected_overhead_s": ET - work}


def check_work(work: float, analyses: list[dict], runs: int, timeline: bool) -> None:
    """Refuse, before any simulation, a Monte Carlo over its bounds: failures per run
    (:data:`MAX_SIMULATED_FAILURES`), runs × failures (:data:`MAX_MONTE_CARLO_EVENTS`) and, when
    run 0's timeline is kept for a picture, its bars (:data:`MAX_TIMELINE_BARS`)."""
    if not runs:
        return
    per_run = [max(a["expected_failures"], 1.0) for a in analyses]
    if max(per_run) > MAX_SIMULATED_FAILURES:
        raise InputError("runs", f"each run would see about {max(per_run):.3g} failures, more than the {MAX_SIMULATED_FAILURES:,} "
                         "a simulation takes; use the analytic expectation (--runs 0)")
    if runs * sum(per_run) > MAX_MONTE_CARLO_EVENTS:
        most = max(2, int(MAX_MONTE_CARLO_EVENTS / sum(per_run)))
        raise InputError("runs", f"{runs:,} runs × about {sum(per_run):,.0f} failures each (all scenarios) is more than the "
                         f"{MAX_MONTE_CARLO_EVENTS:,} failure events a Monte Carlo simulates; take at most {most:,} runs")
    for a in analyses:
        bars = 2 * (work / a["interval_s"] + a["expected_failures"])
        if timeline and bars > MAX_TIMELINE_BARS:
            raise InputError("out", f"the timeline of one run would hold about {bars:,.0f} bars, more than the "
                             f"{MAX_TIMELINE_BARS:,} a picture records; take a longer --interval or leave out --out")


def standard_errors(diff: float, stderr: float) -> str:
    """``diff`` in standard errors (``+0.42 standard errors``), or that every run took the same
    time when the standard error is 0 (no failure can hit a run that short)."""
    if stderr > 0:
        return f"{diff / stderr:+.2f} standard errors"
    return "every run took the same time"


def failures(work: float, mtbf: float, scenarios: list[Scenario], runs: int = 0, seed: int = 0,
             progress: Callable[[str, float], None] | None = None, timeline: bool = True) -> CalcResult:
    """Analytic expectation for each scenario and, with ``runs`` > 0, the Monte Carlo (with run
    0's timeline in ``extra['timelines']`` when ``timeline``)."""
    W = positive("work", work)
    M = positive("mtbf", mtbf)
    if runs:
        count("runs", runs, 2, MAX_RUNS)
    seed = check_seed("seed", seed)
    out, derivs, extra = [], [], {}
    analyses = [analyze(W, M, sc) for sc in scenarios]
    check_work(W, analyses, runs, timeline)
    for sc, a in zip(scenarios, analyses):
        key = f"failures.{sc.name}"
        tau, C, R = a["interval_s"], a["checkpoint_s"], a["recovery_s"]
        derivs += [
            derive(f"{key}.interval", f"{sc.name}: checkpoint interval" + (" (Daly)" if sc.interval is None else ""),
                   "√(2CM)·[1 + ⅓·√(C/2M) + (1/9)·(C/2M)] − C" if sc.interval is None else "given",
                   [("C", secs(C)), ("M", secs(M))], secs(tau), DALY if sc.interval is None else "--interval"),
            derive(f"{key}.expected_time", f"{sc.name}: expected wall-clock time", "Σ_segments M·e^{R/M}·(e^{(τ+C)/M} − 1)",
                   [("W", secs(W) + " of work"), ("τ", secs(tau)), ("C", secs(C)), ("R", secs(R)), ("M", secs(M))],
                   f"{secs(a['expected_time_s'])}: goodput {pct(a['expected_goodput'])}, {num(a['expected_failures'])} failures",
                   DALY),
            derive(f"{key}.first_order", f"{sc.name}: waste, first order", "C/τ + (τ/2 + R)/M",
                   [("C", secs(C)), ("τ", secs(tau)), ("R", secs(R)), ("M", secs(M))], pct(a["first_order_waste"]),
                   "Young 1974"),
        ]
        if runs:
            cb = None if progress is None else (lambda f, name=sc.name: progress(name, f))
            mc = simulate(W, tau, C, R, M, runs, seed, cb, keep_timeline=timeline)
            a["monte_carlo"] = summary(mc, W)
            t = a["monte_carlo"]["total_s"]
            derivs.append(derive(f"{key}.monte_carlo", f"{sc.name}: Monte Carlo wall-clock time",
                                 f"mean of {runs:,} simulated runs ± standard error",
                                 [("p5", secs(t["p5"])), ("p50", secs(t["p50"])), ("p95", secs(t["p95"]))],
                                 f"{secs(t['mean'])} ± {secs(t['stderr'])} (analytic {secs(a['expected_time_s'])}, "
                                 f"{standard_errors(t['mean'] - a['expected_time_s'], t['stderr'])})",
                                 f"event simulation of the same model (numpy, seed {seed})"))
            extra[sc.name] = mc.timeline
        out.append(a)
    data = {"work_s": W, "mtbf_s": M, "runs": runs, "seed": seed, "scenarios": out}
    return CalcResult("failures", data, tuple(derivs), extra={"timelines": extra})
