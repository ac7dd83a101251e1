"""matplotlib for the pictures meshplan writes (the optional ``plot`` extra), on the
non-interactive Agg backend, or one ``out`` error naming the extra when it is not installed."""

from __future__ import annotations

from pathlib import Path

from meshplan.errors import InputError
from meshplan.outfile import write_file


def pyplot(what: str = "pictures need", alternative: str = ""):
    """``matplotlib.pyplot`` on the Agg backend; without matplotlib an ``out`` error
    ``"<what> matplotlib: pip install 'meshplan[plot]'<alternative>"``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("out", f"{what} matplotlib: pip install 'meshplan[plot]'{alternative}") from None
    return plt


def save_figure(plt, fig, path, **savefig: object) -> None:
    """Write ``fig`` to ``path`` (``savefig``: ``Figure.savefig``'s keywords, e.g. dpi, format) and
    close it, written or not; an ``out`` error naming the file when it cannot be written. The file
    is written as every output is (:func:`meshplan.outfile.write_file`: atomically, never over an
    existing file); the format defaults to the file's ending."""
    options = {"format": Path(path).suffix.lower().lstrip(".") or "png", **savefig}
    try:
        write_file(Path(path), lambda f: fig.savefig(f, **options))
    finally:
        plt.close(fig)
