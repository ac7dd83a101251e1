"""Predict every published run with :func:`meshplan.estimate.estimate` and compare.

Each supported run is estimated exactly as ``meshplan estimate`` would: the same ``estimate``, the
same catalog, the same calibration table (``meshplan.cost.calibration.calibration_for``, read
inside ``estimate`` and ``ClusterSpec.of``); nothing here is tuned for validation.

Three sets of runs (``run_set``): ``visible``, the ground truth of ``published_runs.yaml``
(what the calibration was checked against); ``held-out``, the runs of ``heldout_runs.yaml``
that no constant was set from (:mod:`meshplan.accuracy.heldout`); ``all``, both.

Errors are signed fractions, ``(predicted − published) / published`` (positive: meshplan predicts
a slower step, or more memory). MAPE is the mean of ``|error|`` over a group's supported rows
(a fraction; 0.057 = 5.7 %), per source group and over all supported rows, and by the plans'
compute precision: over all rows, and within each source that ran more than one (a BF16 row and
an FP8 row of the same layout differ only in the GEMMs' format, so their split isolates it).

The signed bias of a group G of predicted rows is the mean signed error,
``bias(G) = (1/|G|) · Σ_{i∈G} (ŷ_i − y_i) / y_i`` (ŷ the predicted step, y the published one), beside
``MAPE(G) = (1/|G|) · Σ |ŷ_i − y_i| / y_i``; both are given per source, overall, per scale bucket,
per GPU generation and per stack profile (:mod:`meshplan.accuracy.groups` defines the groups);
and along each scaling series, one layout at several GPU counts, the scaling efficiency published
and predicted and the error's drift per doubling of the GPU count (:mod:`meshplan.accuracy.series`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional

from meshplan.accuracy.groups import bucket_order, gpu_generation, scale_bucket, stack_family
from meshplan.accuracy.mapping import map_runs
from meshplan.accuracy.runs import MappedRun
from meshplan.accuracy.series import DriftSummary, SeriesSummary, drift_summary, scaling_series, series_key
from meshplan.estimate import estimate
from meshplan.units import GiB


@dataclass
class RunResult:
    id: str
    run_id: str
    group: str
    source: str
    gpu: str
    gpus: Optional[int]
    status: str  # "ok" | "unsupported"
    reason: str = ""
    published_step_s: Optional[float] = None
    predicted_step_s: Optional[float] = None
    error: Optional[float] = None  # signed fraction
    published_mem_gib: Optional[float] = None
    predicted_mem_gib: Optional[float] = None
    mem_error: Optional[float] = None  # signed fraction
    predicted_mfu: Optional[float] = None
    fits: Optional[bool] = None  # predicted peak within the GPU's memory
    precision: Optional[str] = None  # the plan's compute precision (bf16, fp16, fp8, fp32)
    stack: Optional[str] = None  # the plan's stack profile (plan.stack.name)
    family: Optional[str] = None  # its stack family (meshplan.accuracy.groups.stack_family)
    generation: Optional[str] = None  # the GPU generation (A100, H100, H200, ...)
    run_set: str = "visible"  # the set the run belongs to: visible | held-out
    series: Optional[str] = None  # its scaling series' label (meshplan.accuracy.series.series_key)
    series_id: Optional[str] = None  # and its key: runs alike in all but the data-parallel width share it
    tokens: Optional[int] = None  # tokens a step: global batch x sequence length
    breakdown: dict[str, float] = field(default_factory=dict)  # predicted step, seconds by part
    assumptions: list[str] = field(default_factory=list)
    formula: str = ""


@dataclass
class GroupSummary:
    group: str
    rows: int  # all rows of the group
    supported: int
    mape: Optional[float]  # mean |error| of step time over supported rows
    bias: Optional[float]  # mean signed error of step time
    max_abs_error: Optional[float]
    mem_rows: int
    mem_mape: Optional[float]


@dataclass
class ValidationReport:
    rows: list[RunResult]
    groups: dict[str, GroupSummary]
    overall: GroupSummary
    worst: list[RunResult]  # supported rows by |error|, largest first
    run_set: str = "visible"  # visible | held-out | all
    precisions: dict[str, GroupSummary] = field(default_factory=dict)  # all rows, by compute precision
    source_precisions: dict[str, GroupSummary] = field(default_factory=dict)  # "source/precision", mixed sources only
    buckets: dict[str, GroupSummary] = field(default_factory=dict)  # predicted rows by scale bucket (GPU count)
    generations: dict[str, GroupSummary] = field(default_factory=dict)  # predicted rows by GPU generation
    stacks: dict[str, GroupSummary] = field(default_factory=dict)  # predicted rows by stack profile
    series: dict[str, SeriesSummary] = field(default_factory=dict)  # one layout at several GPU counts

    def supported(self) -> list[RunResult]:
        return [r for r in self.rows if r.status == "ok"]

    def unsupported(self) -> list[RunResult]:
        return [r for r in self.rows if r.status != "ok"]

    def row(self, row_id: str) -> RunResult:
        for r in self.rows:
            if r.id == row_id:
                return r
        raise KeyError(row_id)

    def to_dict(self) -> dict:
        return {
            "set": self.run_set,
            "rows": [asdict(r) for r in self.rows],
            "groups": {k: asdict(g) for k, g in self.groups.items()},
            "overall": asdict(self.overall),
            "precisions": {k: asdict(g) for k, g in self.precisions.items()},
            "source_precisions": {k: asdict(g) for k, g in self.source_precisions.items()},
            **{name: {k: asdict(g) for k, g in getattr(self, name).items()} for name in BREAKDOWNS},
            "series": {k: asdict(s) for k, s in self.series.items()},
            "series_drift": asdict(self.drift()),
            "worst": [r.id for r in self.worst],
        }

    def of_set(self, run_set: str, worst: int = 5) -> "ValidationReport":
        """The report of this report's rows of ``run_set`` (visible or held-out), as
        ``validate_runs(run_set=...)`` gives it, without predicting them again."""
        return report_of([r for r in self.rows if r.run_set == run_set], worst=worst, run_set=run_set)

    def drift(self) -> DriftSummary:
        """The drift of the error along the report's scaling series (:mod:`meshplan.accuracy.series`)."""
        return drift_summary(self.series)


def _mean(xs: list[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


def summarize(group: str, rows: list[RunResult]) -> GroupSummary:
    errs = [r.error for r in rows if r.status == "ok" and r.error is not None]
    mems = [r.mem_error for r in rows if r.status == "ok" and r.mem_error is not None]
    return GroupSummary(
        group=group,
        rows=len(rows),
        supported=sum(r.status == "ok" for r in rows),
        mape=_mean([abs(e) for e in errs]),
        bias=_mean(errs),
        max_abs_error=max((abs(e) for e in errs), default=None),
        mem_rows=len(mems),
        mem_mape=_mean([abs(e) for e in mems]),
    )


def predict(run: MappedRun) -> RunResult:
    """One mapped run through ``estimate`` (unsupported runs pass through with their reason)."""
    res = RunResult(
        id=run.id, run_id=run.run_id, group=run.group, source=run.source, gpu=run.gpu, gpus=run.gpus,
        status=run.status, reason=run.reason, published_step_s=run.published_step_s,
        published_mem_gib=run.published_mem_gib, assumptions=list(run.assumptions), formula=run.formula,
    )
    if not run.supported:
        return res
    est = estimate(run.model, run.cluster, run.plan)
    res.precision = run.plan.precision.precision
    res.stack, res.family = run.plan.stack.name, stack_family(run.plan.stack)
    res.generation = gpu_generation(run.cluster.gpu.name)
    (res.series_id, res.series), res.tokens = series_key(run), run.plan.tokens_per_step
    res.predicted_step_s = est.time.step_s
    res.predicted_mem_gib = est.peak_bytes / GiB
    res.predicted_mfu = est.mfu
    res.fits = est.fits
    res.breakdown = est.time.breakdown()
    if run.published_step_s:
        res.error = (res.predicted_step_s - run.published_step_s) / run.published_step_s
    if run.published_mem_gib:
        res.mem_error = (res.predicted_mem_gib - run.published_mem_gib) / run.published_mem_gib
    return res


RUN_SETS = ("visible", "held-out", "all")


def runs_of(run_set: str = "visible") -> list[MappedRun]:
    """The mapped runs of ``run_set`` (module docstring)."""
    from meshplan.accuracy.heldout import map_heldout_runs
    from meshplan.errors import InputError

    if run_set not in RUN_SETS:
        raise InputError("set", f"must be one of {', '.join(RUN_SETS)} (got {run_set!r})")
    out: list[MappedRun] = []
    if run_set in ("visible", "all"):
        out += map_runs()
    if run_set in ("held-out", "all"):
        out += map_heldout_runs()
    return out



def validate_runs(
    runs: Optional[Iterable[MappedRun]] = None, *, worst: int = 5, run_set: str = "visible"
) -> ValidationReport:
    """Predict every run of ``run_set`` (or ``runs``, labelled ``run_set``) and summarize the
    errors by source group."""
    rows = [predict(r) for r in (runs_of(run_set) if runs is None else runs)]
    from meshplan.accuracy.heldout import HELDOUT_SOURCES

    for r in rows:
        r.run_set = "held-out" if r.group in HELDOUT_SOURCES else "visible"
    return report_of(rows, worst=worst, run_set=run_set)


def report_of(rows: list[RunResult], *, worst: int = 5, run_set: str = "visible") -> ValidationReport:
    """The report of already predicted ``rows`` (labelled ``run_set``): every summary of
    :func:`validate_runs`, computed from the rows alone."""
    by_group: dict[str, list[RunResult]] = {}
    for r in rows:
        by_group.setdefault(r.group, []).append(r)
    groups = {g: summarize(g, rs) for g, rs in by_group.items()}
    ranked = sorted((r for r in rows if r.error is not None), key=lambda r: abs(r.error), reverse=True)
    precisions, source_precisions = precision_summaries(rows)
    return ValidationReport(rows=rows, groups=groups, overall=summarize("overall", rows), worst=ranked[:worst],
                            run_set=run_set, precisions=precisions, source_precisions=source_precisions,
                            series=scaling_series(rows), **breakdowns(rows))


#: the report's breakdowns beyond source and precision: its field → the row's label, in the order shown
BREAKDOWNS = {
    "buckets": lambda r: scale_bucket(r.gpus),
    "generations": lambda r: r.generation,
    "stacks": lambda r: r.stack,
}


def summaries_by(rows: list[RunResult], key) -> dict[str, GroupSummary]:
    """The predicted rows (``status == "ok"``) summarized by ``key(row)``, in first-seen order."""
    by: dict[str, list[RunResult]] = {}
    for r in rows:
        if r.status == "ok":
            by.setdefault(key(r), []).append(r)
    return {k: summarize(k, rs) for k, rs in by.items()}


def breakdowns(rows: list[RunResult]) -> dict[str, dict[str, GroupSummary]]:
    """Bias and MAPE of the predicted rows per scale bucket (in increasing GPU count), per GPU
    generation (by name) and per stack profile (first seen first): :data:`BREAKDOWNS`."""
    out = {name: summaries_by(rows, key) for name, key in BREAKDOWNS.items()}
    out["buckets"] = {b: out["buckets"][b] for b in bucket_order(out["buckets"])}
    out["generations"] = dict(sorted(out["generations"].items()))
    return out


def precision_summaries(rows: list[RunResult]) -> tuple[dict[str, GroupSummary], dict[str, GroupSummary]]:
    """(all supported rows by compute precision, and by ``source/precision`` within each source
    whose rows ran more than one precision), in first-seen order."""
    ran = [r for r in rows if r.precision]
    precisions = summaries_by(ran, lambda r: r.precision)
    mixed_sources = {g for g in {r.group for r in ran} if len({r.precision for r in ran if r.group == g}) > 1}
    mixed = summaries_by([r for r in ran if r.group in mixed_sources], lambda r: f"{r.group}/{r.precision}")
    return precisions, mixed
