"""Rich rendering of an :class:`~meshplan.estimate.Estimate` and of the catalogs.

Only presentation lives here: every number comes from the estimate (or the catalog) as is, then
is converted to the display unit with its label.
"""

from __future__ import annotations

import os
import sys
from itertools import groupby
from typing import Any, Optional

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from meshplan.catalog import stack_names, stack_overrides, stack_profile
from meshplan.cli.fit import FitTable
from meshplan.cost.attention import ATTENTION_KERNEL_NAMES, attention_kernel_of
from meshplan.cost.fsdp_copies import runs_fsdp2
from meshplan.cost.memory import state_bytes_per_param
from meshplan.estimate import Estimate
from meshplan.pipeline.lockstep import runs_lockstep
from meshplan.presets import Preset
from meshplan.specs.stack import Stack, ignored, settings_text
from meshplan.units import GB, GBPS, GiB, PFLOPS, TB, TFLOPS

BREAKDOWN_LABELS = {
    "compute": "compute (forward + backward)",
    "recompute": "recompute",
    "tp_comm": "TP communication (exposed)",
    "cp_comm": "CP communication (exposed)",
    "fsdp_comm": "FSDP weight/grad communication (exposed) + FSDP2 copies",
    "pipeline_bubble": "pipeline bubble (idle)",
    "dp_comm": "DP gradient sync (exposed)",
    "optimizer": "optimizer step",
    "param_gather": "parameter all-gather (exposed)",
    "ep_comm": "EP all-to-all (exposed)",
    "fp8_weight_cast": "FP8 weight casts (first micro-batch)",
}


def console(least: int = 132) -> Console:
    """A console on the current stdout, as wide as the terminal or as ``COLUMNS`` says; when
    stdout is a file or a pipe and ``COLUMNS`` is not set, at least ``least`` columns, so that a
    saved report keeps each table row on one line."""
    out = Console(file=sys.stdout, highlight=False, soft_wrap=False)
    if not out.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        out = Console(file=sys.stdout, highlight=False, soft_wrap=False, width=max(out.width, least))
    return out


def _mem(n: float, unit: str) -> str:
    return f"{n / (GiB if unit == 'GiB' else GB):,.2f}"


def _pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def header(est: Estimate, preset: Optional[Preset], requested: Optional[Stack] = None) -> list[str]:
    m, p, c = est.model, est.plan, est.cluster
    rec = p.precision
    per_rank = [st.layers for st in est.stages]
    net = f"{c.gpus_per_node} GPUs per node at {c.scale_up.bandwidth / GBPS:g} GB/s, NIC {c.scale_out.bandwidth / GBPS:g} GB/s per GPU"
    if c.pod_size:
        net += f", pods of {c.pod_size:,} GPUs, {c.oversubscription:g}:1 oversubscribed above"
    lines = [
        f"[bold]{m.name}[/bold] ({est.params.total:,} parameters) on [bold]{c.num_gpus:,} x {c.gpu.name}[/bold] "
        f"({c.gpu.hbm_bytes / GiB:.0f} GiB HBM each)",
        f"network: {net}",
        f"plan: TP{p.tp} CP{p.cp} PP{p.pp} DP{p.dp} EP{p.ep}, rank order {','.join(p.rank_order)} (innermost first); "
        f"{p.schedule} pipeline schedule" + (f", vpp {p.vpp}" if p.vpp > 1 else "")
        + (", lockstep runtime" if runs_lockstep(p.schedule, p.pp, p.stack.pipeline_runtime) else "")
        + (f"; TP overlap {p.stack.tp_overlap_kind if p.stack.tp_comm_overlap else 'off'}" if p.tp > 1 else ""),
        f"layers per pipeline rank: {_split(per_rank)}" + (f" (per virtual stage: {_split(est.split)})" if p.vpp > 1 else ""),
        f"batch: {p.global_batch:,} sequences x {p.seq_len:,} tokens = {p.tokens_per_step:,} tokens per step "
        f"(micro-batch {p.micro_batch} x {p.grad_accum:,} micro-batches x DP{p.dp})",
        f"memory: ZeRO-{p.zero}" + (f" (dp_shard {p.dp_shard})" if p.dp_shard else "")
        + ("; FP8 all-gather of the blocks' linear weights" if p.stack.fsdp_fp8_all_gather else "")
        + f"; recompute {p.recompute}{recompute_layers_words(p)}; sequence parallel {'on' if p.sequence_parallel and p.tp > 1 else 'off'}"
        f"; {p.attention} attention" + (f" ({ATTENTION_KERNEL_NAMES[attention_kernel_of(p.stack.kernels, p.stack.attention_kernel, est.calibration)]})"
                                          if p.attention == "flash" else "")
        + f"; {rec.precision} compute"
        + (f" ({'Transformer Engine' if p.stack.fp8_library == 'transformer-engine' else 'torchao'} linears, "
           f"{rec.fp8_scaling} scaling)" if rec.precision == "fp8" else "")
        + f", {rec.grad_dtype} gradients, "
        + _state_words(p),
    ]
    lines.insert(2, stack_line(p, requested))
    if preset:
        lines.insert(0, f"preset [bold]{preset.name}[/bold]: {preset.description}")
    return lines


def stack_line(plan, requested: Optional[Stack] = None) -> str:
    """The header's line on the software that runs ``plan``: the profile, what differs from it,
    and the fields of ``requested`` the plan ignores, with their rules."""
    words = stack_words(plan.stack, stack_overrides(plan.stack, plan))
    if requested is not None:
        skipped = ignored(requested, plan)
        if skipped:
            words += "; not used by this plan: " + ", ".join(k for k, _, _ in skipped)
    return words


def stack_words(stack: Stack, set_: dict[str, Any]) -> str:
    """``stack: NAME (the profile's title); set: k=v, ...``: a stack and the fields ``set_`` over
    its profile."""
    words = f"stack: [bold]{stack.name}[/bold]"
    if stack.name in stack_names():
        words += f" ({stack_profile(stack.name)['title']})"
    return words + (f"; set: {settings_text(set_)}" if set_ else "")


def recompute_layers_words(p) -> str:
    """`` (the first N layers of each stage)`` for recompute of some layers (recompute_layers)."""
    if p.recompute_layers is None:
        return ""
    return f" (the first {p.recompute_layers} layer{'s' if p.recompute_layers != 1 else ''} of each stage)"


def _state_words(p) -> str:
    """The master copy and the persistent bytes per parameter (:func:`meshplan.cost.memory.state_bytes_per_param`)."""
    rec = p.precision
    fsdp2 = runs_fsdp2(p.zero, p.stack.kernels)
    per_param = sum(state_bytes_per_param(rec, fsdp2))
    if not rec.master_bytes:
        return f"no master weights: {per_param} bytes per parameter"
    if fsdp2:
        return f"FSDP2's fp32 shards as master weights: {per_param} bytes per parameter"
    return f"fp32 master weights: {per_param} bytes per parameter"


def _split(split: tuple[int, ...]) -> str:
    """7,8,8,8,7 -> '7, 8 x 3, 7' (runs compressed)."""
    runs = ((layers, len(list(same))) for layers, same in groupby(split))
    return ", ".join(str(layers) if n == 1 else f"{layers} x {n}" for layers, n in runs)


def memory_table(est: Estimate, unit: str) -> Table:
    worst = max(range(len(est.stages)), key=lambda i: est.stages[i].total)
    t = FitTable(title=f"Memory per GPU by pipeline rank, in {unit} ({'2^30' if unit == 'GiB' else '1e9'} bytes)",
                 box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("rank", justify="right")
    t.add_column("layers", justify="right")
    for col, short in (("weights", None), ("gradients", "grads"), ("optimizer", "optim."), ("activations", "activ."),
                       ("other", None), ("total", None)):
        t.add_column(col, justify="right", short=short)
    t.add_column("in flight (micro-batches)", justify="right", short="in\nflight")
    at_end = []
    for i, s in enumerate(est.stages):
        style = ("bold red" if not est.fits else "bold") if i == worst else None
        ends = "merged_outputs" in s.other_items  # the peak is the step's end (pp_return_outputs)
        at_end += [s] if ends else []
        t.add_row(
            str(s.rank) + (" *" if i == worst else ""), str(s.layers),
            *(_mem(x, unit) for x in (s.weights, s.gradients, s.optimizer, s.activations, s.other, s.total)),
            "0 (step's end)" if ends else str(s.peak_inflight), style=style,
        )
    for s in at_end:
        kept = s.other_items["step_outputs"]
        t.caption = ((t.caption + "\n") if t.caption else "") + (
            f"rank {s.rank} peaks at the step's end: the last stage's {est.plan.num_microbatches} kept outputs "
            f"({_mem(kept, unit)} {unit}) and their concatenation ({_mem(kept, unit)} {unit}), every activation freed")
    return t


def verdict(est: Estimate, unit: str) -> Text:
    worst = max(range(len(est.stages)), key=lambda i: est.stages[i].total)
    peak, cap = est.peak_bytes, est.capacity_bytes
    head = cap - peak
    base = f"peak {_mem(peak, unit)} {unit} on rank {worst} (*) of {_mem(cap, unit)} {unit} per GPU: "
    if est.fits:
        return Text(base + f"fits, {_mem(head, unit)} {unit} headroom ({_pct(head / cap)})", style="green")
    return Text(base + f"DOES NOT FIT, over by {_mem(-head, unit)} {unit} ({_pct(-head / cap)})", style="bold red")


def time_table(est: Estimate) -> Table:
    tm = est.time
    t = FitTable(title=f"Step time on the critical pipeline rank ({tm.critical_rank})", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("part")
    t.add_column("time (s)", justify="right")
    t.add_column("% of step", justify="right")
    for key, val in tm.breakdown().items():
        if val == 0.0 and key != "compute":
            continue
        t.add_row(BREAKDOWN_LABELS.get(key, key), f"{val:.4f}", _pct(val / tm.step_s))
    t.add_row("step", f"{tm.step_s:.4f}", "100.0%", style="bold")
    return t


def secs(x: float) -> str:
    """Seconds at about three significant figures: 5.80, 45.8, 1,234."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def interval_words(iv) -> str:
    """``5.80 s (5.52–6.40 s, 80 %)``: a step time and its prediction interval."""
    return f"{secs(iv.step_s)} s ({secs(iv.low)}–{secs(iv.high)} s, {100 * iv.level:g} %)"


def interval_line(iv) -> str:
    """The step with its interval and where the interval comes from (meshplan.accuracy.interval)."""
    note = f" ({iv.note})" if iv.note else ""
    return (f"step {interval_words(iv)}: the measured step's prediction interval, split-conformal from the "
            f"residuals of {iv.runs} validated runs of {iv.group}{note}")


def bubble_line(est: Estimate) -> str:
    tm = est.time
    return (f"pipeline bubble over all ranks: fraction {tm.bubble_fraction:.3f} (idle share of the step), "
            f"overhead {tm.bubble_overhead:.3f} (idle / busy)")


def throughput_table(est: Estimate) -> Table:
    p = est.plan
    t = FitTable(title="Throughput", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    peak = est.mfu_peak / TFLOPS
    rows = [
        ("tokens/s (whole job)", f"{est.tokens_per_s:,.0f}"),
        ("tokens/s per GPU", f"{est.tokens_per_s / p.num_gpus:,.1f}"),
        ("model TFLOP/s per GPU", f"{est.model_tflops_per_gpu:,.1f}"),
        ("hardware TFLOP/s per GPU", f"{est.hardware_tflops_per_gpu:,.1f}"),
        (f"MFU (model FLOPs vs {peak:,.1f} TFLOP/s dense peak)", _pct(est.mfu)),
        ("HFU (hardware FLOPs, with recompute)", _pct(est.hfu)),
    ]
    for r in rows:
        t.add_row(*r)
    return t


def flops_table(est: Estimate) -> Table:
    f = est.flops
    t = FitTable(title="FLOPs per step", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("kind")
    t.add_column("FLOP", justify="right")
    t.add_column("PFLOP", justify="right")
    for name, val in (("model (MFU basis)", f.model), ("hardware (HFU basis)", f.hardware),
                      ("  dense 6·N_mm·T", f.dense), ("  attention", f.attention), ("  recompute", f.recompute)):
        t.add_row(name, f"{val:.4e}", f"{val / PFLOPS:,.1f}")
    return t


def run_table(est: Estimate, failures: Optional[dict[str, Any]] = None, iv=None) -> Optional[Table]:
    run = est.run_cost()
    if not run:
        return None
    t = FitTable(title=f"Run: {run['tokens']:.4g} tokens", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("optimizer steps", f"{run['steps']:,.0f}")
    t.add_row("wall-clock (days), step time only" if failures else "wall-clock (days)", f"{run['days']:,.2f}")
    if iv is not None:
        t.add_row(f"  {100 * iv.level:g} % interval (from the step's)", "{:,.2f}–{:,.2f}".format(*iv.scaled(run["days"])))
    if failures:
        _failure_rows(t, failures)
    t.add_row("GPU-hours", f"{run['gpu_hours']:,.0f}")
    if "dollars" in run:
        t.add_row(f"cost ($, at ${est.budget.price_per_gpu_hour:g} per GPU-hour)", f"{run['dollars']:,.0f}")
        if iv is not None:
            t.add_row(f"  {100 * iv.level:g} % interval", "{:,.0f}–{:,.0f}".format(*iv.scaled(run["dollars"])))
    t.add_row(f"energy (MWh, GPU TDP {est.cluster.gpu.tdp_watts:g} W x PUE {est.budget.pue:g})", f"{run['energy_mwh']:,.1f}")
    return t


def _failure_rows(t: Table, f: dict[str, Any]) -> None:
    """The rows of :func:`meshplan.calc.run_length.run_with_failures`' figures."""
    if not f["finishes"]:
        t.add_row("wall-clock with failures", f"never finishes: {f['why']}")
        return
    mc = f["monte_carlo"]
    t.add_row("wall-clock (days), with failures, expected", f"{f['expected_days']:,.2f}")
    if mc:
        t.add_row(f"  p10–p90 (Monte Carlo, {mc['runs']} runs, seed {mc['seed']})", f"{mc['days_p10']:,.2f}–{mc['days_p90']:,.2f}")
    t.add_row("goodput (work / wall-clock)", _pct(f["goodput"]))
    n = f["expected_failures"]
    t.add_row("failures expected", f"{n:,.0f}" if n >= 100 else f"{n:.3g}")
    t.add_row(f"checkpoint every (Daly), {f['checkpoint_bytes'] / TB:,.2f} TB written in {f['checkpoint_write_s']:.3g} s",
              f"{f['interval_s'] / 60:,.1f} min")


def failures_note(f: dict[str, Any]) -> str:
    """One line on where the failure figures' inputs come from."""
    if f.get("failures_per_gpu_hour") is not None:
        src = (f"MTBF {f['mtbf_s'] / 3600:.3g} h from the GPU count at {f['failures_per_gpu_hour']:.4g} failures per GPU-hour"
               + (f" ({f['rate_source']})" if f.get("rate_source") != "given" else " (given)"))
    else:
        src = f"MTBF {f['mtbf_s'] / 3600:.3g} h (given)"
    fs = f"capped at {f['fs_bw'] / TB:g} TB/s in total" if f.get("fs_bw") else "no filesystem cap"
    skipped = f"; Monte Carlo skipped: {f['monte_carlo_skipped']}" if f.get("monte_carlo_skipped") else ""
    return (f"failures: {src}; every GPU writes its checkpoint shard at {f['write_bw_per_gpu'] / GBPS:g} GB/s, {fs}; "
            f"restart {f['restart_s'] / 60:g} min (--failure-rate, --mtbf, --ckpt-write-bw, --ckpt-fs-bw, --restart){skipped}")


def published_table(est: Estimate, preset: Preset) -> Optional[Table]:
    pub = preset.published
    if pub is None:
        return None
    t = FitTable(title="Estimate vs published", box=box.SIMPLE_HEAD, title_justify="left")
    for col, just in (("figure", "left"), ("meshplan", "right"), ("published", "right"), ("difference", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]

    def diff(pred: float, ref: float) -> str:
        return f"{100 * (pred - ref) / ref:+.1f}%"

    n, peak = est.plan.num_gpus, est.mfu_peak
    if pub.flops_per_step is not None and pub.model_tflops_per_gpu is not None:
        # the authors' FLOP count turns their TFLOP/s into a step time and meshplan's step into
        # TFLOP/s and MFU on their basis
        flops = pub.flops_per_step(est)
        step_pub = flops / (n * pub.model_tflops_per_gpu * 1e12)
        tflops = flops / (n * est.time.step_s) / 1e12
        t.add_row("step time (s)", f"{est.time.step_s:.3f}", f"{step_pub:.3f}", diff(est.time.step_s, step_pub))
        t.add_row("TFLOP/s per GPU (their formula)", f"{tflops:,.1f}", f"{pub.model_tflops_per_gpu:g}",
                  diff(tflops, pub.model_tflops_per_gpu))
        if pub.mfu is not None:
            mfu = tflops * 1e12 / peak
            t.add_row("MFU (their formula)", _pct(mfu), _pct(pub.mfu, 0), diff(mfu, pub.mfu))
    else:
        if pub.model_tflops_per_gpu is not None:
            t.add_row("model TFLOP/s per GPU", f"{est.model_tflops_per_gpu:,.1f}", f"{pub.model_tflops_per_gpu:g}",
                      diff(est.model_tflops_per_gpu, pub.model_tflops_per_gpu))
        if pub.mfu is not None:
            t.add_row("MFU", _pct(est.mfu), _pct(pub.mfu, 0), diff(est.mfu, pub.mfu))
    if pub.step_s is not None:
        t.add_row("step time (s)", f"{est.time.step_s:.3f}", f"{pub.step_s:g}", diff(est.time.step_s, pub.step_s))
    if pub.tokens_per_s is not None:
        t.add_row("tokens/s", f"{est.tokens_per_s:,.0f}", f"{pub.tokens_per_s:,.0f}", diff(est.tokens_per_s, pub.tokens_per_s))
    if pub.peak_memory_gib is not None:
        peak = est.peak_bytes / GiB
        t.add_row("peak memory (GiB, the fullest GPU)", f"{peak:,.1f}", f"{pub.peak_memory_gib:g}", diff(peak, pub.peak_memory_gib))
    return t


def advice_lines(est: Estimate, advice: list) -> list[str]:
    """The advice (:func:`meshplan.advice.advise`): each change's flags, then its effect."""
    if not advice:
        return []
    head = ("advice: changes that fit" if not est.fits else
            "advice: changes faster by more than the estimate's error (8%)") + ", best first; add the flags to the command:"
    width = max(len(" ".join(a.flags)) for a in advice)
    return [head] + [f"  {i}. {' '.join(a.flags):<{width}}   {a.why}" for i, a in enumerate(advice, 1)]


def print_estimate(est: Estimate, preset: Optional[Preset], unit: str, requested: Optional[Stack] = None,
                   failures: Optional[dict[str, Any]] = None, advice: Optional[list] = None, iv=None) -> None:
    out = console()
    for line in header(est, preset, requested):
        out.print(line)
    out.print()
    out.print(memory_table(est, unit))
    out.print(verdict(est, unit))
    for line in advice_lines(est, advice or []):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print()
    out.print(time_table(est))
    if iv is not None:
        out.print(interval_line(iv), markup=False, highlight=False, soft_wrap=True)
    out.print(bubble_line(est))
    out.print()
    out.print(throughput_table(est))
    if preset is not None:
        pt = published_table(est, preset)
        if pt is not None:
            out.print()
            out.print(pt)
            out.print(f"published: {preset.published.source}")
            if preset.published.formula:
                out.print(f"their FLOP count: {preset.published.formula}; meshplan's own (causal "
                          f"attention) gives {est.model_tflops_per_gpu:,.1f} TFLOP/s per GPU, MFU {_pct(est.mfu)}")
            for note in preset.notes:
                out.print(f"note: {note}")
    out.print()
    out.print(flops_table(est))
    rt = run_table(est, failures, iv)
    if rt is not None:
        out.print()
        out.print(rt)
        if failures:
            out.print(failures_note(failures), markup=False, soft_wrap=True)


# ---- catalogs ------------------------------------------------------------------------------------


def models_table(rows: list[dict[str, Any]]) -> Table:
    t = FitTable(title="Models", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("name", "layers", "hidden", "heads / kv", "ffn", "vocab", "parameters", "source"):
        t.add_column(col, justify="left" if col in ("name", "source") else "right", overflow="fold")
    for r in rows:
        t.add_row(r["name"], str(r["n_layers"]), f"{r['hidden']:,}", f"{r['n_heads']} / {r['n_kv_heads']}",
                  f"{r['ffn_hidden']:,}", f"{r['vocab_size']:,}", f"{r['params_total']:,}", r["source"])
    return t


def gpus_table(rows: list[dict[str, Any]]) -> Table:
    t = FitTable(title="GPUs (dense peak, per GPU; bandwidth per direction)", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("name")
    for col in ("BF16 TFLOP/s", "FP8 TFLOP/s", "HBM (GiB)", "HBM (TB/s)", "scale-up GPUs", "scale-up (GB/s)", "NIC (GB/s)",
                "TDP (W)"):
        t.add_column(col, justify="right", short=col.replace("scale-up ", "scale-\nup ") if "scale-up" in col else None)
    for r in rows:
        fp8 = "—" if r["fp8_tflops"] is None else f"{r['fp8_tflops']:,.1f}"
        t.add_row(r["name"], f"{r['bf16_tflops']:,.1f}", fp8, f"{r['hbm_gib']:g}", f"{r['hbm_tbps']:.3f}",
                  str(r["scale_up_size"]), f"{r['scale_up_gbps']:g}", f"{r['nic_gbps']:g}", f"{r['tdp_watts']:g}")
    return t


def gpu_row(g) -> dict[str, Any]:
    fp8 = g.peak_flops.fp8
    return {
        "name": g.name,
        "vendor": g.vendor,
        "generation": g.generation,
        "bf16_tflops": g.peak_flops.bf16 / TFLOPS,
        "fp8_tflops": None if fp8 is None else fp8 / TFLOPS,
        "hbm_gib": g.hbm_bytes / GiB,
        "hbm_tbps": g.hbm_bandwidth / TB,
        "scale_up_size": g.scale_up_size,
        "scale_up_gbps": g.scale_up_bandwidth / GBPS,
        "nic_gbps": g.nic_bandwidth / GBPS,
        "tdp_watts": g.tdp_watts,
    }


__all__ = ["print_estimate", "models_table", "gpus_table", "gpu_row", "console"]
