"""What to change: the best few changes of one or two settings of a plan, each estimated.

``meshplan estimate`` lists them when the plan does not fit, or when a change would make the step
faster by more than the estimate's stated error (:data:`STEP_ERROR`). Candidates, each a
:meth:`~meshplan.specs.plan.TrainingPlan.replace` of the plan estimated by
:func:`meshplan.estimate.estimate` (a plan the rules refuse is skipped):

* ZeRO stage: every other stage of 1, 2, 3;
* recompute: every mode the plan's stack runs (:func:`meshplan.catalog.stack_recompute`);
* micro-batch: halved, doubled (the global batch kept, so it must divide);
* the mesh at the same GPU count: a factor 2 moved between two of TP, PP, CP and DP (TP within
  the scale-up domain); a preset's layer split is dropped with PP, as ``--pp`` drops it;
* virtual stages: halved, doubled (pp > 1); the schedule: each other one the stack runs (pp > 1);
* pairs: the :data:`PAIRS` best single changes combined two by two, where they change different
  settings.

That is at most about 40 estimates (:data:`MAX_CANDIDATES` caps it). Ranking: when the plan does not
fit, the changes that fit, fastest step first (those that do not, by peak memory, only when none
fits); when it fits, the changes that fit and cut the step by more than :data:`STEP_ERROR`,
fastest first. A pair is kept only when it beats both its halves. Flags: the options that give
the changed plan when added to the command line (``--schedule`` with ``--vpp``, and the global
batch with DP or micro-batch, since their defaults depend on each other).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from pydantic import ValidationError

from meshplan.catalog import requested_stack, stack_names, stack_recompute, stack_schedules
from meshplan.errors import InputError
from meshplan.estimate import Budget, Estimate, estimate
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.units import GiB

#: the estimate's stated error: step-time MAPE 7.9 % over the published rows (docs/accuracy.md)
STEP_ERROR = 0.08
TOP = 3
PAIRS = 4
MAX_CANDIDATES = 48
SCHEDULES = ("1f1b", "interleaved", "zbh1", "interleaved-zb", "zbv", "gpipe")
INTERLEAVED = ("interleaved", "interleaved-zb", "zbv")
RECOMPUTE = ("none", "selective", "op", "full")


@dataclass(frozen=True)
class Advice:
    """One change: ``changes`` (plan fields), the ``flags`` that make it, and its estimate's
    ``peak_bytes``, ``step_s`` and ``fits``, with ``why`` in words."""

    changes: dict[str, Any]
    flags: tuple[str, ...]
    peak_bytes: float
    step_s: float
    fits: bool
    why: str = ""
    labels: tuple[str, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"flags": list(self.flags), "changes": dict(self.changes), "peak_bytes": self.peak_bytes,
                "step_s": self.step_s, "fits": self.fits, "why": self.why}


def _mesh_moves(p: TrainingPlan, scale_up: int) -> Iterable[tuple[str, dict[str, Any]]]:
    """A factor 2 moved between two of TP, PP, CP, DP (the GPU count kept)."""
    axes = ("tp", "pp", "cp", "dp")
    for up in axes:
        for down in axes:
            if up == down or getattr(p, down) % 2:
                continue
            ch = {up: getattr(p, up) * 2, down: getattr(p, down) // 2}
            if ch.get("tp", p.tp) > scale_up:
                continue
            if "pp" in ch:  # the same virtual stages in all: vpp halved with PP doubled, and back
                ch["layer_split"] = None
                vpp = max(1, p.vpp * p.pp // ch["pp"]) if p.vpp > 1 else 1
                if ch["pp"] == 1 or vpp == 1:
                    ch.update(vpp=1, schedule="1f1b" if p.schedule in INTERLEAVED else p.schedule)
                elif vpp != p.vpp:
                    ch["vpp"] = vpp
            yield f"{up.upper()} x2, {down.upper()} /2", ch


def single_changes(p: TrainingPlan, scale_up: int) -> list[tuple[str, dict[str, Any]]]:
    """Every single-setting change of ``p`` (module docstring) as (label, plan fields)."""
    out: list[tuple[str, dict[str, Any]]] = []
    out += [(f"ZeRO-{z}", {"zero": z}) for z in (1, 2, 3) if z != p.zero]
    profile = p.stack.name in stack_names()
    modes = stack_recompute(p.stack.name) if profile else RECOMPUTE
    out += [(f"recompute {r}", {"recompute": r}) for r in modes if r != p.recompute]
    if p.micro_batch > 1:
        out.append((f"micro-batch {p.micro_batch // 2}", {"micro_batch": p.micro_batch // 2}))
    if p.global_batch % (2 * p.micro_batch * p.dp) == 0:
        out.append((f"micro-batch {p.micro_batch * 2}", {"micro_batch": p.micro_batch * 2}))
    out += list(_mesh_moves(p, scale_up))
    if p.pp > 1:
        if p.vpp > 1:
            out.append((f"vpp {p.vpp // 2}", {"vpp": p.vpp // 2, "layer_split": None}
                        | ({"schedule": "1f1b"} if p.vpp // 2 == 1 else {})))
        if p.schedule in INTERLEAVED or p.vpp == 1:
            out.append((f"vpp {p.vpp * 2}", {"vpp": p.vpp * 2, "layer_split": None}
                        | ({} if p.schedule in INTERLEAVED else {"schedule": "interleaved"})))
        runs = stack_schedules(p.stack.name) if profile else SCHEDULES
        for s in runs:
            if s != p.schedule:
                vpp = (p.vpp if p.vpp > 1 else 2) if s in INTERLEAVED else 1
                out.append((f"{s} schedule" + (f", vpp {vpp}" if vpp > 1 else ""), {"schedule": s, "vpp": vpp, "layer_split": None}))
    return out


def flags_of(p: TrainingPlan, new: TrainingPlan, changes: dict[str, Any], batch_flag: str = "--global-batch") -> tuple[str, ...]:
    """The options that turn ``p`` into ``new``, in a fixed order."""
    out: list[str] = []
    for key in ("tp", "pp", "cp", "dp"):
        if key in changes:
            out += [f"--{key}", str(getattr(new, key))]
    if (new.schedule, new.vpp) != (p.schedule, p.vpp):  # both: each one's default depends on the other
        out += ["--schedule", new.schedule, "--vpp", str(new.vpp)]
    if "micro_batch" in changes:
        out += ["--micro-batch", str(new.micro_batch)]
    if "dp" in changes or "micro_batch" in changes:
        out += [batch_flag, str(new.tokens_per_step if batch_flag == "--global-batch-tokens" else new.global_batch)]
    if "zero" in changes:
        out += ["--zero", str(new.zero)]
    if "recompute" in changes:
        out += ["--recompute", new.recompute]
    return tuple(out)


def _try(model: ModelSpec, cluster: ClusterSpec, plan: TrainingPlan, changes: dict[str, Any],
         budget: Optional[Budget]) -> Optional[tuple[TrainingPlan, Estimate]]:
    try:
        # the requested stack, its rules applied to the new layout: a plan at tp 1 has TP's fields
        # set aside, which its advice with TP gets back, as the same flags on the command line do
        new = plan.replace(stack=requested_stack(plan), **changes)
        return new, estimate(model, cluster, new, budget)
    except (InputError, ValidationError, ValueError):
        return None


def _why(base: Estimate, est: Estimate, labels: tuple[str, ...]) -> str:
    mem = f"fits at {est.peak_bytes / GiB:.2f} GiB" if est.fits else f"still over: {est.peak_bytes / GiB:.2f} GiB"
    speed = (est.time.step_s - base.time.step_s) / base.time.step_s
    return f"{' + '.join(labels)}: {mem}, step {est.time.step_s:.3f} s ({100 * speed:+.1f}%)"


def advise(model: ModelSpec, cluster: ClusterSpec, plan: TrainingPlan, base: Estimate, budget: Optional[Budget] = None,
           top: int = TOP, batch_flag: str = "--global-batch") -> list[Advice]:
    """The best ``top`` changes of one or two settings (module docstring); empty when the plan
    fits and nothing beats it by more than :data:`STEP_ERROR`."""
    singles = single_changes(plan, cluster.gpus_per_node)[:MAX_CANDIDATES]
    tried: list[Advice] = []
    for label, ch in singles:
        got = _try(model, cluster, plan, ch, budget)
        if got is not None:
            new, est = got
            tried.append(Advice(ch, flags_of(plan, new, ch, batch_flag), est.peak_bytes, est.time.step_s, est.fits,
                                _why(base, est, (label,)), (label,)))
    tried.sort(key=lambda a: _rank(a, base))
    best = tried[:PAIRS]
    for i, a in enumerate(best):
        for b in best[i + 1:]:
            if set(a.changes) & set(b.changes):
                continue
            ch = {**a.changes, **b.changes}
            got = _try(model, cluster, plan, ch, budget)
            if got is None:
                continue
            new, est = got
            pair = Advice(ch, flags_of(plan, new, ch, batch_flag), est.peak_bytes, est.time.step_s, est.fits,
                          _why(base, est, a.labels + b.labels), a.labels + b.labels)
            if _better_pair(pair, a, b):
                tried.append(pair)
    tried.sort(key=lambda a: _rank(a, base))
    return [a for a in tried if _useful(a, base, any(t.fits for t in tried))][:top]


def _better_pair(pair: Advice, a: Advice, b: Advice) -> bool:
    """A pair is worth its second change when it fits where neither half does, or is faster than
    each half that fits by more than 1 %."""
    if not pair.fits:
        return False
    halves = [h.step_s for h in (a, b) if h.fits]
    return not halves or pair.step_s < 0.99 * min(halves)


def _rank(a: Advice, base: Estimate) -> tuple:
    """Fitting changes first, fastest step first; the others by peak memory."""
    return (0, a.step_s, a.peak_bytes) if a.fits else (1, a.peak_bytes, a.step_s)


def _useful(a: Advice, base: Estimate, any_fits: bool) -> bool:
    if not base.fits:
        return a.fits or (not any_fits and a.peak_bytes < base.peak_bytes)
    return a.fits and a.step_s < base.time.step_s * (1 - STEP_ERROR)
