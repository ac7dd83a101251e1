"""The pipeline Gantt as a PNG, drawn with matplotlib (the optional ``plot`` extra).

The same picture as :func:`meshplan.pipeline.gantt.svg_gantt`: one lane per rank, one bar per
action coloured by kind (lighter for later chunks), labelled with kind and micro-batch where it
fits, idle time as the bare lane, a time axis, a legend, and the bubble figures in the caption.
"""

from __future__ import annotations

from pathlib import Path

from meshplan.pipeline.gantt import KIND_NAMES, _timeline, caption, kind_color, n_chunks
from meshplan.pipeline.simulate import SimResult
from meshplan.pyplot import pyplot, save_figure


def write_png_gantt(result: SimResult, title: str, path: Path, unit: str = "ms", dpi: int = 150) -> None:
    """Draw ``result`` and save it to ``path`` as PNG."""
    plt = pyplot("writing a PNG needs", " (or write .svg)")
    from matplotlib.patches import Patch
    tl, v, span = _timeline(result), n_chunks(result), result.makespan
    p = len(tl)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * p + 0.9))
    for r, row in enumerate(tl):
        y = p - 1 - r
        ax.broken_barh([(0, span)], (y - 0.4, 0.8), facecolors="#ececec")
        for a, s, e in row:
            color = kind_color(a.kind, a.stage // p, v)
            ax.broken_barh([(s, e - s)], (y - 0.4, 0.8), facecolors=color, edgecolors="white", linewidth=0.5)
            label = f"{a.kind}{a.microbatch}"
            if span > 0 and (e - s) / span * 12 * 72 >= 7 * len(label):  # fits at ~7 pt per character
                ax.text((s + e) / 2, y, label, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(p), [f"rank {r}" for r in reversed(range(p))])
    ax.set_xlim(0, span if span > 0 else 1)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(f"{title}\n{caption(result, unit)}", fontsize=10, loc="left")
    kinds = sorted({a.kind for row in tl for a, _, _ in row}, key=lambda k: ("FBIW".find(k) % 5, k))
    handles = [Patch(color=kind_color(k), label=f"{k}: {KIND_NAMES.get(k, k)}") for k in kinds]
    handles.append(Patch(color="#ececec", label="idle (bubble)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(handles), frameon=False, fontsize=8)
    fig.tight_layout()
    save_figure(plt, fig, path, dpi=dpi, format="png")
