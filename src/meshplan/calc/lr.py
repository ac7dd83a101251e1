"""``calc lr``: learning-rate scaling with batch size, warmup, and warmup + cosine schedules with a
batch-size ramp (the Llama 3 405B schedule as a preset).

* Linear scaling (Goyal et al. 2017, "Accurate, Large Minibatch SGD", Sec. 2.1):
  ``η = η₀·B/B₀``. Square-root scaling (Krizhevsky 2014, "One weird trick"; Malladi et al.
  2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms", for Adam):
  ``η = η₀·√(B/B₀)``.
* Warmup heuristic (source 001): ``w = (B/B₀)·w₀`` steps for a base warmup ``w₀`` (1,000) at
  ``B₀``; reported as a share of the run's steps (5-10% is the usual range).
* Schedule: linear warmup from 0 to the peak ``η_max`` over ``w`` steps, then cosine decay to a
  floor ``η_min`` at step ``T`` (Loshchilov & Hutter 2017, SGDR, Eq. 5, without restarts):
  ``η(t) = η_min + ½(η_max − η_min)(1 + cos(π·(t − w)/(T − w)))`` for ``w ≤ t ≤ T``, ``η_min``
  after. ``linear`` decays linearly instead, ``constant`` keeps the peak.
* Batch ramp: the global batch in tokens as a function of tokens seen, e.g. Llama 3 405B
  (Grattafiori et al. 2024, "The Llama 3 Herd of Models", Sec. 3.4.1; source 003): 4M tokens
  (sequences of 4,096) at first, 8M (sequences of 8,192) after 252M tokens, 16M after 2.87T
  tokens; peak 8e-5, 8,000 warmup steps, cosine to 8e-7 over 1,200,000 steps. Tokens seen after
  step ``t`` are the sum of the batches of steps 0..t−1, so steps and tokens convert both ways.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from meshplan.calc.inputs import choice, count, positive
from meshplan.calc.result import CalcResult, derive, num, pct
from meshplan.errors import InputError

GOYAL = "Goyal et al. 2017, Accurate, Large Minibatch SGD, Sec. 2.1 (linear scaling rule)"
SQRT = "Krizhevsky 2014, One weird trick for parallelizing CNNs; Malladi et al. 2022 (square-root rule for Adam)"
COSINE = "Loshchilov & Hutter 2017, SGDR, Eq. 5 (no restarts), with linear warmup"
LLAMA3 = "Grattafiori et al. 2024, The Llama 3 Herd of Models, Sec. 3.4.1 (source 003)"
KINDS = ("cosine", "linear", "constant")
MiB_TOKENS = 2**20  # batch sizes are quoted in binary M: 4M tokens = 1,024 sequences of 4,096


@dataclass(frozen=True)
class Schedule:
    peak: float
    warmup: int
    total: int
    floor: float = 0.0
    kind: str = "cosine"

    def lr(self, step):
        """η at ``step`` (scalar or numpy array); step 0 is the first optimizer step, at η_max/w."""
        t = np.asarray(step, dtype=float)
        warm = self.peak * np.minimum(1.0, (t + 1) / self.warmup) if self.warmup else np.full_like(t, self.peak)
        span = max(1, self.total - self.warmup)
        x = np.clip((t - self.warmup) / span, 0.0, 1.0)
        if self.kind == "cosine":
            decay = self.floor + 0.5 * (self.peak - self.floor) * (1 + np.cos(np.pi * x))
        elif self.kind == "linear":
            decay = self.peak - (self.peak - self.floor) * x
        else:
            decay = np.full_like(t, self.peak)
        out = np.where(t < self.warmup, warm, decay)
        return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True)
class Ramp:
    """Global batch in tokens: ``batches[i]`` from ``starts[i]`` tokens seen on (starts[0] = 0)."""

    starts: tuple[float, ...]
    batches: tuple[int, ...]
    seq_lens: tuple[int, ...]

    def phase_steps(self) -> list[tuple[int, int, float]]:
        """(first step, batch tokens, tokens seen at that step) of each phase."""
        out, step, seen = [], 0, 0.0
        for i, b in enumerate(self.batches):
            out.append((step, b, seen))
            if i + 1 < len(self.batches):
                n = max(0, math.ceil((self.starts[i + 1] - seen) / b))
                step += n
                seen += n * b
        return out

    def tokens_at(self, step):
        """Tokens seen before ``step`` (array-friendly)."""
        t = np.asarray(step, dtype=float)
        out = np.zeros_like(t)
        for first, b, seen in self.phase_steps():
            out = np.where(t >= first, seen + (t - first) * b, out)
        return out

    def step_at(self, tokens):
        """The step at which ``tokens`` have been seen (fractional)."""
        x = np.asarray(tokens, dtype=float)
        out = np.zeros_like(x)
        for first, b, seen in self.phase_steps():
            out = np.where(x >= seen, first + (x - seen) / b, out)
        return out

    def batch_at_tokens(self, tokens):
        x = np.asarray(tokens, dtype=float)
        out = np.full_like(x, self.batches[0])
        for first, b, seen in self.phase_steps():
            out = np.where(x >= seen, b, out)
        return out


LLAMA3_405B = (
    Schedule(peak=8e-5, warmup=8000, total=1_200_000, floor=8e-7, kind="cosine"),
    Ramp(starts=(0.0, 252e6, 2.87e12), batches=(4 * MiB_TOKENS, 8 * MiB_TOKENS, 16 * MiB_TOKENS), seq_lens=(4096, 8192, 8192)),
    15.6e12,
)
PRESETS = {"llama3-405b": LLAMA3_405B}


def scaling(base_lr: float, base_batch: float, batch: float, base_warmup: int = 1000, total_steps: int | None = None) -> CalcResult:
    """Linear and square-root LR scaling and the warmup heuristic."""
    lr0 = positive("base_lr", base_lr)
    B0 = positive("base_batch", base_batch)
    B = positive("batch", batch)
    w0 = count("base_warmup", base_warmup, 0, 10**12)
    k = B / B0
    lin, sq = lr0 * k, lr0 * math.sqrt(k)
    warm = k * w0
    data = {"base_lr": lr0, "base_batch": B0, "batch": B, "ratio": k, "linear_lr": lin, "sqrt_lr": sq, "warmup_steps": warm}
    derivs = [
        derive("lr.linear", "LR, linear scaling", "η₀·B/B₀", [("η₀", num(lr0)), ("B", num(B)), ("B₀", num(B0))], num(lin), GOYAL),
        derive("lr.sqrt", "LR, square-root scaling", "η₀·√(B/B₀)", [("η₀", num(lr0)), ("B/B₀", num(k))],
               f"{num(sq)} ({num(math.sqrt(k))}× the base)", SQRT),
        derive("lr.warmup", "warmup steps (heuristic)", "(B/B₀)·w₀", [("B/B₀", num(k)), ("w₀", f"{w0:,} steps at B₀")],
               f"{num(warm)} steps", "source 001 heuristic; Goyal et al. 2017 Sec. 2.2 (gradual warmup)"),
    ]
    if total_steps is not None:
        T = count("steps", total_steps, 1, 10**12)
        data["warmup_fraction"] = warm / T
        derivs.append(derive("lr.warmup_fraction", "warmup share of the run", "w / T", [("w", num(warm)), ("T", f"{T:,} steps")],
                             pct(warm / T, 1) + (" (inside the usual 5-10%)" if 0.05 <= warm / T <= 0.10 else ""), "source 001 (5-10% of training)"))
    return CalcResult("lr", data, tuple(derivs))


def milestones(sched: Schedule, ramp: Ramp | None = None, end_tokens: float | None = None) -> list[dict]:
    """LR (and batch, tokens) at the schedule's landmarks."""
    steps = {0, max(0, sched.warmup - 1), sched.warmup, (sched.warmup + sched.total) // 2, sched.total}
    if ramp is not None:
        steps |= {first for first, _, _ in ramp.phase_steps()}
    if ramp is not None and end_tokens:
        steps.add(int(math.ceil(float(ramp.step_at(end_tokens)))))
    rows = []
    for s in sorted(steps):
        row = {"step": int(s), "lr": sched.lr(s)}
        if ramp is not None:
            tok = float(ramp.tokens_at(s))
            row.update({"tokens_seen": tok, "batch_tokens": float(ramp.batch_at_tokens(tok))})
        rows.append(row)
    return rows


def schedule(peak: float | None = None, warmup: int | None = None, total: int | None = None, floor: float = 0.0,
             kind: str = "cosine", preset: str | None = None, at: list[int] | None = None) -> CalcResult:
    """A warmup + decay schedule (or the preset's), its landmarks, and LR at the steps ``at``."""
    ramp, end_tokens = None, None
    if preset is not None:
        sched, ramp, end_tokens = PRESETS[choice("preset", preset, tuple(PRESETS))]
    else:
        if peak is None or total is None:
            raise InputError("peak", "give --peak and --steps for a schedule (or --preset llama3-405b)")
        p = positive("peak", peak)
        T = count("steps", total, 1, 10**12)
        w = count("warmup", 0 if warmup is None else warmup, 0, 10**12)
        if w >= T:
            raise InputError("warmup", f"must be shorter than the run ({w:,} ≥ {T:,} steps)")
        fl = positive("floor", floor, allow_zero=True)
        if fl > p:
            raise InputError("floor", f"must not exceed the peak ({fl:g} > {p:g})")
        sched = Schedule(p, w, T, fl, choice("schedule", kind, KINDS))
    rows = milestones(sched, ramp, end_tokens)
    data = {"peak": sched.peak, "warmup_steps": sched.warmup, "total_steps": sched.total, "floor": sched.floor,
            "kind": sched.kind, "milestones": rows}
    derivs = [derive("lr.schedule", f"LR schedule ({sched.kind})",
                     "η_max·(t+1)/w for t < w; η_min + ½(η_max − η_min)(1 + cos(π(t − w)/(T − w)))" if sched.kind == "cosine"
                     else f"η_max·(t+1)/w for t < w; then {sched.kind}",
                     [("η_max", num(sched.peak)), ("w", f"{sched.warmup:,}"), ("T", f"{sched.total:,}"), ("η_min", num(sched.floor))],
                     f"η(T/2) = {num(sched.lr((sched.warmup + sched.total) // 2))}", LLAMA3 if preset else COSINE)]
    if ramp is not None:
        phases = ramp.phase_steps()
        data["preset"] = preset
        data["ramp"] = [{"first_step": f, "batch_tokens": b, "tokens_seen": s, "seq_len": L}
                        for (f, b, s), L in zip(phases, ramp.seq_lens)]
        end_step = float(ramp.step_at(end_tokens))
        data["run_tokens"], data["run_steps"], data["lr_at_run_end"] = end_tokens, end_step, sched.lr(end_step)
        derivs.append(derive("lr.ramp", "batch ramp (tokens per step)", "4M → 8M after 252M tokens → 16M after 2.87T tokens",
                             [(f"phase {i}", f"{b / MiB_TOKENS:g}M tokens (seq {L:,}) from step {f:,}, {num(s)} tokens seen")
                              for i, ((f, b, s), L) in enumerate(zip(phases, ramp.seq_lens))],
                             f"{num(end_tokens)} tokens at step {num(end_step)}; LR there {num(sched.lr(end_step))}", LLAMA3))
    if at:
        data["at"] = [{"step": count("at", s, 0, 10**12), "lr": sched.lr(s)} for s in at]
    return CalcResult("lr", data, tuple(derivs))
