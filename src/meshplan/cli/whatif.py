"""``meshplan estimate --vs FIELD=VALUE``: the plan with some fields changed, beside the baseline.

Each ``--vs`` is one alternative; several fields in one ``--vs``, separated by commas, change
together (``--vs tp=4,pp=32``). A comma starts a new field only where ``NAME=`` follows it, so a
value may hold commas (``--vs rank_order=tp,cp,pp,dp``). FIELD is, in this order:

* a plan option of ``meshplan estimate``, by its name with ``_`` or ``-``: ``gpus``, ``tp``,
  ``zero``, ``nic_gbps``, ``gpu``, ``global_batch``, ``tokens``, ... (not ``preset``, ``plan`` or
  ``set``), its value as the option takes it; ``gpus`` and ``dp`` replace each other, and so do
  ``global_batch`` and ``global_batch_tokens``;
* a stack field (``meshplan stacks NAME``: ``kernels``, ``pp_buffers``, ...), as ``--set`` takes it;
* a GPU figure in a GPU file's keys and units (:mod:`meshplan.catalog.gpu_file`): ``hbm_gbps``,
  ``hbm_gib``, ``scale_up_gbps``, ``scale_up_size``, ``sm_count``, ``tdp_watts``, ``generation``,
  ``vendor``; ``peak_tflops.DTYPE`` (one dtype's dense peak) and ``peak_tflops`` (the bf16 peak,
  every other dtype's in proportion: a faster clock); ``power_watts`` is ``gpu_power``. They
  change the plan's GPU (the ``--gpu``, the preset's or the default) before any power cap.

The alternative is what ``meshplan estimate`` gives with the baseline's options and these: the
options are resolved the same way (:func:`meshplan.cli.options.resolve`) and estimated by the same
engine. A field that is not one of these, or a value its rule refuses, is one error line,
``error: --vs: ...``, naming the alternative, the field and the rule.

The comparison shows each alternative's key figures (:func:`key_figures`) beside the baseline's
with ``delta`` = alternative − baseline and ``change`` = alternative / baseline − 1. The same
module renders ``--sensitivity`` (:mod:`meshplan.sensitivity`: the table, what it means, and the
tornado chart of :mod:`meshplan.tornado` for ``--out``).
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Optional

from rich import box
from rich.table import Table

from meshplan.accuracy.interval import StepInterval, estimate_interval
from meshplan.catalog.gpu_file import FIGURE_KEYS, gpu_with_keys
from meshplan.cli.fit import FitTable
from meshplan.cli.options import PLAN_OPTIONS, PlanArgs, Setup, parse_set, plan_gpu, resolve
from meshplan.cli.search_report import plan_row
from meshplan.errors import InputError
from meshplan.estimate import Estimate, estimate
from meshplan.outfile import out_path, write_text
from meshplan.sensitivity import DELTA, FACTORED, Elasticity, e_words, sensitivity
from meshplan.specs.stack import BEHAVIOUR_FIELDS
from meshplan.tornado import svg_tornado
from meshplan.units import GB, GiB, TFLOPS

#: the plan options ``--vs`` changes: every option of the plan but where it starts from and ``--set``
VS_OPTIONS: tuple[str, ...] = tuple(k for k in PLAN_OPTIONS if k not in ("preset", "plan_file", "set_fields"))
#: the GPU figures ``--vs`` changes (``nic_gbps`` is the plan option of the same meaning)
GPU_KEYS: tuple[str, ...] = tuple(k for k in FIGURE_KEYS if k not in VS_OPTIONS)
#: options that replace each other: giving one in ``--vs`` drops the other
_REPLACES = {"gpus": "dp", "dp": "gpus", "global_batch": "global_batch_tokens", "global_batch_tokens": "global_batch"}
_NEXT_FIELD = re.compile(r",(?=\s*[A-Za-z][\w.-]*\s*=)")
MAX_ALTERNATIVES = 8
_UNITS = {"GiB": GiB, "GB": GB}


def _bad(rule: str) -> InputError:
    return InputError("--vs", rule)


@dataclass(frozen=True)
class Alternative:
    """One ``--vs``: its ``text``, the ``fields`` it changes (values as parsed), the command-line
    ``flags`` that give it (GPU figures have none: they belong in a GPU file) and the ``args``."""

    text: str
    fields: dict[str, Any]
    flags: tuple[str, ...]
    args: PlanArgs


def split_fields(text: str) -> list[tuple[str, str]]:
    """``"tp=4,rank_order=tp,cp,pp,dp"`` -> [("tp", "4"), ("rank_order", "tp,cp,pp,dp")]: a comma
    starts a new field only before ``NAME=``."""
    out = []
    for part in _NEXT_FIELD.split(str(text)):
        name, sep, value = part.partition("=")
        key = name.strip().lower().replace("-", "_")
        if not sep or not key or not value.strip():
            raise _bad(f"must be FIELD=VALUE, several joined by commas, e.g. nic_gbps=100 or tp=4,pp=32 (got {text!r})")
        out.append((key, value.strip()))
    return out


def _option_value(name: str, text: str) -> Any:
    """``text`` as plan option ``name`` takes it (its type in :data:`PLAN_OPTIONS`)."""
    kind = next(t for t in typing.get_args(PLAN_OPTIONS[name][0]) if t is not type(None))
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        if text not in choices:
            raise _bad(f"{name}: must be one of {', '.join(choices)} (got {text!r})")
        return text
    if kind is bool:
        from meshplan.interop.common import as_bool

        try:
            return as_bool(name, text)
        except InputError as err:
            raise _bad(f"{name}: {err.rule}") from None
    if kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value):
            raise _bad(f"{name}: must be {'a whole number' if kind is int else 'a finite number'} (got {text!r})")
        return value
    return text


def _number(text: str) -> Any:
    """A GPU figure's value: an integer, else a number, else the word (the GPU file's checks follow)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _flags(name: str, value: Any, text: str) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else f"--no-{name.replace('_', '-')}"]
    return [flag, text]


def _gpu_data(gpu_fields: dict[str, Any], args: PlanArgs) -> dict[str, Any]:
    """The GPU-file mapping of ``--vs``'s GPU figures (``peak_tflops`` alone: the bf16 peak, the
    other dtypes in proportion)."""
    data: dict[str, Any] = {k: v for k, v in gpu_fields.items() if not k.startswith("peak_tflops")}
    peaks = {k.split(".", 1)[1]: v for k, v in gpu_fields.items() if k.startswith("peak_tflops.")}
    if "peak_tflops" in gpu_fields:
        bf16, x = plan_gpu(args).peak_flops.bf16 / TFLOPS, gpu_fields["peak_tflops"]
        if not isinstance(x, (int, float)) or not 0 < x <= 1e9:
            raise InputError("gpu.peak_tflops", f"must be a positive number of TFLOP/s (got {x!r})")
        scaled = {k: v / TFLOPS * (x / bf16) for k, v in plan_gpu(args).peak_flops.model_dump().items() if v is not None}
        peaks = {**scaled, "bf16": x, **peaks}
    if peaks:
        data["peak_tflops"] = peaks
    return data


def alternative(args: PlanArgs, text: str) -> Alternative:
    """The plan options of one ``--vs`` over the baseline's ``args`` (module docstring)."""
    changes: dict[str, Any] = {}
    sets: list[str] = []
    gpu_fields: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    flags: list[str] = []
    for key, raw in split_fields(text):
        key = "gpu_power" if key == "power_watts" else key
        if key in fields:
            raise _bad(f"{key} is given twice in {text!r}")
        if key in VS_OPTIONS:
            fields[key] = changes[key] = _option_value(key, raw)
            flags += _flags(key, changes[key], raw)
            if key in _REPLACES and _REPLACES[key] not in changes:
                changes[_REPLACES[key]] = None
        elif key in BEHAVIOUR_FIELDS:
            try:
                fields[key] = parse_set([f"{key}={raw}"])[key]
            except InputError as err:
                raise _bad(f"{key}: {err.rule}") from None
            sets.append(f"{key}={raw}")
            flags += ["--set", f"{key}={raw}"]
        elif key in GPU_KEYS or key == "peak_tflops" or key.startswith("peak_tflops."):
            fields[key] = gpu_fields[key] = _number(raw)
        else:
            raise _bad(f"unknown field '{key}' (plan options: {', '.join(VS_OPTIONS)}; stack fields: "
                       f"{', '.join(BEHAVIOUR_FIELDS)}; GPU figures: {', '.join(GPU_KEYS)}, peak_tflops[.DTYPE], power_watts)")
    alt = replace(args, **changes)
    if sets:
        alt = replace(alt, set_fields=[*(args.set_fields or []), *sets])
    if gpu_fields:
        try:
            alt = replace(alt, gpu=gpu_with_keys(plan_gpu(alt), _gpu_data(gpu_fields, alt)))
        except InputError as err:
            raise _bad(f"{text!r}: {err}") from None
    return Alternative(str(text), fields, tuple(flags), alt)


def alternatives(args: PlanArgs, texts: Optional[list[str]]) -> list[Alternative]:
    """Every ``--vs`` parsed, before any estimate (at most :data:`MAX_ALTERNATIVES`)."""
    texts = list(texts or [])
    if len(texts) > MAX_ALTERNATIVES:
        raise _bad(f"at most {MAX_ALTERNATIVES} alternatives (got {len(texts)})")
    return [alternative(args, t) for t in texts]


def resolve_alternative(alt: Alternative) -> Setup:
    """The alternative's model, cluster, plan and budget, or its error as ``--vs``'s."""
    try:
        return resolve(alt.args)
    except InputError as err:
        raise _bad(f"{alt.text!r}: {err}") from None


def estimate_alternative(alt: Alternative) -> Estimate:
    """The alternative's estimate; its refusals, and a step that is not a finite number of seconds
    (a rate so small that a time overflows), as ``--vs``'s errors."""
    setup = resolve_alternative(alt)
    try:
        est = estimate(setup.model, setup.cluster, setup.plan, setup.budget)
    except InputError as err:
        raise _bad(f"{alt.text!r}: {err}") from None
    if not (math.isfinite(est.time.step_s) and est.time.step_s > 0):
        raise _bad(f"{alt.text!r}: the step is not a finite time ({est.time.step_s!r} s): a figure too small for the model")
    return est


# ---- the comparison -------------------------------------------------------------------------------

#: figures compared, with their deltas (``delta``: alternative − baseline; ``change``: the ratio − 1)
COMPARED = ("step_s", "mfu", "tokens_per_s", "peak_bytes", "days", "dollars")


def key_figures(est: Estimate, iv: StepInterval) -> dict[str, Any]:
    """What the comparison shows of one estimate: GPUs, layout, step and its interval, MFU,
    tokens/s, peak memory and whether it fits, and with ``--tokens`` days (and dollars with
    ``--price``) with their intervals (:mod:`meshplan.estimate_report`)."""
    row = plan_row(est)
    out: dict[str, Any] = {
        "num_gpus": est.plan.num_gpus, "gpu": est.cluster.gpu.name, "layout": row["layout"], "pipeline": row["pipeline"],
        "step_s": est.time.step_s, "step_s_interval": [iv.low, iv.high], "mfu": est.mfu, "tokens_per_s": est.tokens_per_s,
        "peak_bytes": est.peak_bytes, "fits": est.fits,
    }
    run = est.run_cost()
    for key in ("days", "dollars"):
        if run and key in run:
            out[key], out[f"{key}_interval"] = run[key], list(iv.scaled(run[key]))
    return out


def compare(base: dict[str, Any], alt: dict[str, Any]) -> dict[str, Any]:
    """``delta`` (alternative − baseline) and ``change`` (alternative / baseline − 1) of the
    :data:`COMPARED` figures both have."""
    keys = [k for k in COMPARED if k in base and k in alt]
    return {"delta": {k: alt[k] - base[k] for k in keys},
            "change": {k: (alt[k] / base[k] - 1.0 if base[k] else None) for k in keys}}


def vs_entries(est: Estimate, alts: list[Alternative], level: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The baseline's key figures and one entry per alternative: its text, fields, flags, key
    figures and their deltas (``vs`` in ``--json``)."""
    base = key_figures(est, estimate_interval(est, level))
    out = []
    for alt in alts:
        other = estimate_alternative(alt)
        figures = key_figures(other, estimate_interval(other, level))
        out.append({"vs": alt.text, "fields": alt.fields, "flags": list(alt.flags), **figures, **compare(base, figures)})
    return base, out


def _pct(x: Optional[float]) -> str:
    return "" if x is None else f"{100 * x:+.1f}%"


def _rows(fig: dict[str, Any], level: float, unit: str = "GiB") -> list[tuple[str, str]]:
    """(figure, value) rows of one column, memory in ``unit`` (GiB or GB)."""
    rows = [("GPUs", f"{fig['num_gpus']:,}"), ("GPU", fig["gpu"]), ("layout", fig["layout"]), ("pipeline", fig["pipeline"]),
            ("step (s)", f"{fig['step_s']:.3f}"),
            (f"  {100 * level:g} % interval", "{:.2f}–{:.2f}".format(*fig["step_s_interval"])), ("MFU", f"{100 * fig['mfu']:.1f}%"),
            ("tokens/s", f"{fig['tokens_per_s']:,.0f}")]
    if "days" in fig:
        rows += [("days", f"{fig['days']:,.2f}"), ("  days interval", "{:,.1f}–{:,.1f}".format(*fig["days_interval"]))]
    if "dollars" in fig:
        rows += [("cost ($M)", f"{fig['dollars'] / 1e6:,.2f}"),
                 ("  cost interval", "{:,.1f}–{:,.1f}".format(*(x / 1e6 for x in fig["dollars_interval"])))]
    return rows + [(f"peak memory ({unit})", f"{fig['peak_bytes'] / _UNITS[unit]:.2f}"), ("fits", "yes" if fig["fits"] else "NO")]


def _deltas(entry: dict[str, Any], unit: str = "GiB") -> dict[str, str]:
    ch, d = entry["change"], entry["delta"]
    out = {"step (s)": _pct(ch["step_s"]), "MFU": f"{100 * d['mfu']:+.1f} pt", "tokens/s": _pct(ch["tokens_per_s"]),
           f"peak memory ({unit})": f"{d['peak_bytes'] / _UNITS[unit]:+.2f}"}
    for key, label in (("days", "days"), ("dollars", "cost ($M)")):
        if key in ch:
            out[label] = _pct(ch[key])
    return out


def vs_table(base: dict[str, Any], entries: list[dict[str, Any]], level: float, unit: str = "GiB") -> Table:
    """The baseline and each alternative side by side, each with its Δ against the baseline (memory
    in ``unit``, GiB or GB)."""
    t = FitTable(title="What if (Δ: against the baseline)", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("figure")
    t.add_column("baseline", justify="right")
    for e in entries:
        t.add_column(e["vs"], justify="right", overflow="fold")
        t.add_column("Δ", justify="right")
    columns = [dict(_rows(fig, level, unit)) for fig in (base, *entries)]
    labels = list(dict.fromkeys(label for fig in (base, *entries) for label, _ in _rows(fig, level, unit)))
    deltas = [_deltas(e, unit) for e in entries]
    for label in labels:
        cells = [label, columns[0].get(label, "")]
        for col, dl in zip(columns[1:], deltas):
            cells += [col.get(label, ""), dl.get(label, "")]
        t.add_row(*cells)
    return t


# ---- the sensitivity ------------------------------------------------------------------------------


def tornado_path(out: Optional[str], sensitivity: bool) -> Optional[Path]:
    """The ``--out`` file, checked before any work: a new .svg, and only with ``--sensitivity``."""
    if out is None:
        return None
    if not sensitivity:
        raise InputError("out", "draws the sensitivity's tornado chart: give --sensitivity too")
    return out_path(out, (".svg",))


def _side(r: Elasticity, lower: bool) -> str:
    t = r.step_s_minus if lower else r.step_s_plus
    if t is None:
        return "no valid count"
    n = r.gpus_minus if lower else r.gpus_plus
    return f"{t:.3f} s ({n:,})" if r.parameter == "gpus" else f"{t:.3f} s (x{r.factor_minus if lower else r.factor_plus:g})"


def sensitivity_table(est: Estimate, rows: list[Elasticity]) -> Table:
    """The elasticities, largest magnitude first, with the steps they come from."""
    t = FitTable(title=f"Sensitivity of the step ({est.time.step_s:.3f} s) to the hardware: e = d ln(step) / d ln(x)",
                 box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("parameter", "baseline", "e", "step at lower x", "step at higher x"):
        t.add_column(col, justify="left" if col in ("parameter", "baseline") else "right")
    for r in rows:
        t.add_row(r.label, r.baseline, e_words(r.elasticity), _side(r, True), _side(r, False))
    return t


def sensitivity_notes(est: Estimate, rows: list[Elasticity], delta: float = DELTA) -> list[str]:
    """What the table means, the scale identity's sum, and what follows for days and GPU-hours."""
    e = {r.parameter: r.elasticity for r in rows}
    total = sum(e[k] for k in FACTORED if k != "latency") - e["latency"]
    lines = [f"e: a 1 % larger x changes the step by about e %; central difference at x·(1 ± {delta:g}); GPU count at the "
             f"nearest valid counts with the same global batch ({est.plan.global_batch:,} sequences), tp·cp·pp kept",
             f"the rates' e less the latency's: {total:+.3f} (for small changes −1 less the fixed costs' e, per kernel and per "
             "collective call: the step scales as 1/λ with every rate x λ and every latency and fixed cost x 1/λ)"]
    if est.run_cost() and e["gpus"] is not None:
        lines.append(f"days move as the step (the same e); GPU-hours and $ go as GPUs x step: e = {e['gpus'] + 1:+.3f} "
                     "for the GPU count")
    return lines


@dataclass
class WhatIf:
    """The baseline's key figures and the alternatives' entries (``--vs``), and the elasticities
    (``--sensitivity``; None without it)."""

    base: Optional[dict[str, Any]]
    entries: list[dict[str, Any]]
    rows: Optional[list[Elasticity]]


def run_what_if(est: Estimate, alts: list[Alternative], with_sensitivity: bool, level: float,
                picture: Optional[Path] = None, shown: Optional[str] = None) -> WhatIf:
    """Estimate the alternatives and the sensitivity of ``est``; write the tornado chart to
    ``picture`` (as the user named it: ``shown``)."""
    base, entries = vs_entries(est, alts, level) if alts else (None, [])
    rows = sensitivity(est) if with_sensitivity else None
    if picture is not None and rows is not None:
        c = est.cluster
        title = f"Sensitivity of the step: {est.model.name} on {c.num_gpus:,} x {c.gpu.name}, {plan_row(est)['layout']}"
        write_text(picture, svg_tornado(rows, est.time.step_s, title), shown)
    return WhatIf(base, entries, rows)


def add_json(d: dict[str, Any], w: WhatIf) -> None:
    """``vs`` and ``sensitivity`` in ``--json``'s object ``d`` (docs/schema.md)."""
    if w.base is not None:
        d["vs"] = w.entries
    if w.rows is not None:
        d["sensitivity"] = [r.to_dict() for r in w.rows]


def print_what_if(est: Estimate, w: WhatIf, level: float, header: list[str], unit: str = "GiB") -> None:
    """The baseline in words (``header``), then the comparison (memory in ``unit``) and the sensitivity."""
    from meshplan.cli import render

    out = render.console()
    for line in header:
        out.print(line)
    if w.base is not None:
        out.print()
        out.print(vs_table(w.base, w.entries, level, unit))
        out.print("(the full estimate of one: `meshplan estimate` with the baseline's options and the alternative's flags)",
                  markup=False, highlight=False)
    if w.rows is not None:
        out.print()
        out.print(sensitivity_table(est, w.rows))
        for line in sensitivity_notes(est, w.rows):
            out.print(line, markup=False, highlight=False, soft_wrap=True)


__all__ = ["Alternative", "alternative", "alternatives", "split_fields", "vs_entries", "vs_table", "key_figures", "compare",
           "VS_OPTIONS", "GPU_KEYS", "WhatIf", "run_what_if", "add_json", "print_what_if", "tornado_path", "sensitivity_table"]
