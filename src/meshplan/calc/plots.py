"""The calculators' pictures, drawn with matplotlib (the optional ``plot`` extra), written as SVG or
PNG by the file's suffix: the LR and batch schedule over tokens, a failure-run timeline, and a
roofline. matplotlib is imported only here, when a picture is asked for."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meshplan.pyplot import pyplot, save_figure

COLORS = {"work": "#4c78a8", "checkpoint": "#f2c14e", "lost": "#e45756", "restart": "#9d755d"}
#: Most bars a timeline lane draws: a longer timeline is drawn at this resolution (each of as many
#: equal slices of the run shows the kind that fills most of it), which is finer than the picture.
PICTURE_BINS = 4000


def _covered(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time covered by the sorted, disjoint bars (``starts``, ``ends``) before each edge."""
    lengths = ends - starts
    cum = np.concatenate([[0.0], np.cumsum(lengths)])
    i = np.searchsorted(starts, edges, side="right")  # bars started by each edge
    j = np.maximum(i - 1, 0)
    partial = np.where(i > 0, np.clip(edges - starts[j], 0.0, lengths[j]), 0.0)
    return cum[j] + partial


def binned(timeline: list, bins: int = PICTURE_BINS) -> tuple[list, list]:
    """``(bars, failures)`` of a timeline of ``(start, end, kind)`` as drawn: every bar and the
    end of every lost stretch (a failure) when there are at most ``bins`` bars; else ``bins``
    equal slices of the run, each the kind that fills most of it, neighbours of one kind merged,
    and one failure mark per slice that holds one."""
    fails = [e for s, e, kind in timeline if kind == "lost"]
    if len(timeline) <= bins:
        return list(timeline), fails
    t0, t1 = min(s for s, _, _ in timeline), max(e for _, e, _ in timeline)
    edges = np.linspace(t0, t1, bins + 1)
    kinds = list(COLORS)
    fill = []
    for kind in kinds:
        bars = sorted((s, e) for s, e, k in timeline if k == kind)
        if not bars:
            fill.append(np.zeros(bins))
            continue
        arr = np.asarray(bars, dtype=float)
        fill.append(np.diff(_covered(arr[:, 0], arr[:, 1], edges)))
    fill_arr = np.vstack(fill)
    top = fill_arr.argmax(axis=0)
    out: list = []
    for b in range(bins):
        if fill_arr[top[b], b] <= 0:
            continue
        kind = kinds[top[b]]
        if out and out[-1][2] == kind and out[-1][1] == edges[b]:
            out[-1] = (out[-1][0], edges[b + 1], kind)
        else:
            out.append((edges[b], edges[b + 1], kind))
    slots = sorted(set(np.minimum(((np.asarray(fails) - t0) / (t1 - t0) * bins).astype(int), bins - 1).tolist())) if fails else []
    return out, [edges[k + 1] for k in slots]


def _save(fig, plt, path: Path) -> None:
    save_figure(plt, fig, path, format=path.suffix.lower().lstrip("."), dpi=150)


def plot_schedule(sched, ramp, end_tokens: float | None, path: Path, title: str) -> None:
    """LR (and, with a ramp, the batch in tokens) over tokens seen; without a ramp, over steps."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if ramp is not None:
        last = float(ramp.tokens_at(sched.total)) if end_tokens is None else end_tokens
        x = np.unique(np.concatenate([np.geomspace(1e6, last, 2000), [s for _, _, s in ramp.phase_steps()][1:]]))
        steps = ramp.step_at(x)
        ax.plot(x, sched.lr(steps), color="#4c78a8", label="learning rate")
        ax.set_xscale("log")
        ax.set_xlabel("tokens seen")
        ax2 = ax.twinx()
        ax2.step(x, ramp.batch_at_tokens(x) / 2**20, where="post", color="#e45756", label="batch (M tokens)")
        ax2.set_ylabel("global batch (M tokens, 2^20)")
        ax2.legend(loc="lower right", frameon=False)
    else:
        t = np.linspace(0, sched.total, 2000)
        ax.plot(t, sched.lr(t), color="#4c78a8", label="learning rate")
        ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.legend(loc="upper left", frameon=False)
    ax.set_title(title, fontsize=10, loc="left")
    fig.tight_layout()
    _save(fig, plt, path)


def plot_timelines(timelines: dict[str, list], path: Path, title: str, unit: float = 86400.0, unit_name: str = "days") -> None:
    """One lane per scenario: work, checkpoint writes, lost work and restarts of run 0 (at most
    :data:`PICTURE_BINS` bars a lane: :func:`binned`)."""
    plt = pyplot()
    from matplotlib.patches import Patch

    names = list(timelines)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.8 * len(names)))
    for lane, name in enumerate(names):
        y = len(names) - 1 - lane
        by_kind: dict[str, list] = {}
        drawn, fail_times = binned(timelines[name])
        for s, e, kind in drawn:
            by_kind.setdefault(kind, []).append((s / unit, (e - s) / unit))
        for kind, bars in by_kind.items():
            ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=COLORS[kind], linewidth=0)
        fails = [e / unit for e in fail_times]  # the failure ends the lost stretch
        ax.plot(fails, [y + 0.42] * len(fails), "v", color="#e45756", markersize=3)
    ax.set_yticks(range(len(names)), list(reversed(names)))
    ax.set_xlabel(f"wall-clock time ({unit_name})")
    ax.set_title(title, fontsize=10, loc="left")
    from matplotlib.lines import Line2D

    handles = [Patch(color=c, label=k) for k, c in COLORS.items()]
    handles.append(Line2D([], [], marker="v", color="#e45756", linestyle="", label="failure"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=5, frameon=False, fontsize=8)
    fig.tight_layout()
    _save(fig, plt, path)


def plot_roofline(data: dict, path: Path) -> None:
    """The roofline of the GPU and dtype with the operation's point."""
    plt = pyplot()
    P, beta, I = data["peak_flops"], data["hbm_bandwidth"], data["intensity"]
    ridge = data["ridge"]
    lo, hi = min(I, ridge) / 100, max(I, ridge) * 100
    x = np.geomspace(lo, hi, 400)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(x, np.minimum(P, x * beta) / 1e12, color="#4c78a8", label=f"{data['gpu']} {data['dtype']}")
    ax.axvline(ridge, color="#999999", linestyle=":", linewidth=1)
    ax.annotate(f"ridge {ridge:,.0f} FLOP/B", (ridge, P / 1e12), textcoords="offset points", xytext=(5, -15), fontsize=8)
    ax.plot([I], [data["attainable_flops"] / 1e12], "o", color="#e45756", label=f"{data['label']} ({data['bound']})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.legend(loc="lower right", frameon=False, fontsize=8)
    fig.tight_layout()
    _save(fig, plt, path)
