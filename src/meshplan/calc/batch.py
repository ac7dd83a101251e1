"""``calc batch``: gradient accumulation, the step it makes, and how efficient a batch size is.

* Accumulation: ``m = ⌈B / (b·D)⌉`` micro-batches per optimizer step for a target global batch
  ``B``, micro-batch ``b`` and data-parallel degree ``D``; the batch actually run is ``b·m·D``
  (DESIGN.md: global batch = micro_batch × grad_accum × dp).
* Step time with one gradient all-reduce per step, not overlapped: ``t = m·t_μ + t_AR``;
  throughput ``b·m·D / t``; communication share ``t_AR / t``. Without accumulation the same
  ``B`` takes ``m`` optimizer steps, each with its own all-reduce: ``m·(t_μ + t_AR)``, the
  all-reduce share ``t_AR/(t_μ + t_AR)``, ``(m − 1)·t_AR`` more communication.
* Critical batch (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", Sec. 2):
  to reach a given loss, steps and examples trade off as
  ``S = S_min·(1 + B_crit/B)`` and ``E = E_min·(1 + B/B_crit)``. Step (time) efficiency
  ``S_min/S = B/(B + B_crit)``; compute (data) efficiency ``E_min/E = B_crit/(B + B_crit)``.
  At ``B = B_crit`` both are 50%: twice the minimal steps and twice the minimal compute.
"""

from __future__ import annotations

import math

from meshplan.calc.inputs import count, positive
from meshplan.calc.result import CalcResult, derive, num, pct, secs

ACCUM = "one gradient all-reduce per optimizer step after m micro-batches (source 001, gradient accumulation)"
MCCANDLISH = "McCandlish et al. 2018, An Empirical Model of Large-Batch Training, Sec. 2 (steps vs examples trade-off)"


def accumulation_steps(target: int, micro: int, dp: int) -> int:
    return math.ceil(target / (micro * dp))


def critical_batch_efficiency(batch: float, b_crit: float) -> tuple[float, float]:
    """(step efficiency S_min/S, compute efficiency E_min/E)."""
    return batch / (batch + b_crit), b_crit / (batch + b_crit)


def batch(target: float, micro: int, dp: int, micro_time: float | None = None, allreduce_time: float | None = None,
          critical: float | None = None, seq_len: int | None = None) -> CalcResult:
    """Accumulation, step time and throughput, and critical-batch efficiency (module docstring).
    Batches are in sequences (samples); ``seq_len`` also states them in tokens, and ``critical``
    is in the same unit as ``target``."""
    B = count("target", target, 1, 10**15)
    b = count("micro_batch", micro, 1, 10**12)
    D = count("dp", dp, 1, 100_000_000)
    m = accumulation_steps(B, b, D)
    run = b * m * D
    data = {"target_batch": B, "micro_batch": b, "dp": D, "grad_accum": m, "global_batch": run, "exact": run == B}
    derivs = [
        derive("batch.grad_accum", "gradient accumulation steps", "⌈B / (b·D)⌉",
               [("B", f"{B:,} (target global batch)"), ("b", f"{b} (micro-batch)"), ("D", f"{D} (data-parallel)")],
               f"{m:,}" + ("" if run == B else f" (runs {run:,}, not {B:,}: B is not a multiple of b·D)"), "DESIGN.md vocabulary"),
    ]
    if seq_len is not None:
        s = count("seq_len", seq_len, 1, 10**9)
        data["tokens_per_step"] = run * s
    if micro_time is not None:
        tm = positive("micro_time", micro_time)
        tar = 0.0 if allreduce_time is None else positive("allreduce_time", allreduce_time, allow_zero=True)
        step = m * tm + tar
        without = m * (tm + tar)
        data.update({"micro_time_s": tm, "allreduce_time_s": tar, "step_s": step, "samples_per_s": run / step,
                     "comm_share": tar / step, "step_without_accum_s": without,
                     "comm_share_without_accum": tar / (tm + tar), "comm_saved_s": (m - 1) * tar})
        derivs += [
            derive("batch.step", "optimizer step time", "m·t_μ + t_AR", [("m", f"{m:,}"), ("t_μ", secs(tm)), ("t_AR", secs(tar))],
                   f"{secs(step)}, {num(run / step)} samples/s", ACCUM),
            derive("batch.comm_share", "all-reduce share of the step", "t_AR / (m·t_μ + t_AR)",
                   [("t_AR", secs(tar)), ("step", secs(step))], pct(tar / step), ACCUM),
            derive("batch.no_accum", "without accumulation (m steps of one micro-batch)", "m·(t_μ + t_AR); share t_AR/(t_μ + t_AR)",
                   [("m", f"{m:,}"), ("t_μ", secs(tm)), ("t_AR", secs(tar))],
                   f"{secs(without)}, all-reduce {pct(tar / (tm + tar))}; accumulation saves {secs((m - 1) * tar)}", ACCUM),
        ]
    if critical is not None:
        bc = positive("critical_batch", critical)
        step_eff, comp_eff = critical_batch_efficiency(run, bc)
        data.update({"critical_batch": bc, "steps_over_min": 1 + bc / run, "examples_over_min": 1 + run / bc,
                     "step_efficiency": step_eff, "compute_efficiency": comp_eff})
        derivs += [
            derive("batch.step_efficiency", "step efficiency S_min/S", "B / (B + B_crit)",
                   [("B", num(run)), ("B_crit", num(bc))], f"{pct(step_eff, 1)} ({num(1 + bc / run)}× the minimal steps)", MCCANDLISH),
            derive("batch.compute_efficiency", "compute efficiency E_min/E", "B_crit / (B + B_crit)",
                   [("B", num(run)), ("B_crit", num(bc))], f"{pct(comp_eff, 1)} ({num(1 + run / bc)}× the minimal compute)", MCCANDLISH),
        ]
    return CalcResult("batch", data, tuple(derivs))
