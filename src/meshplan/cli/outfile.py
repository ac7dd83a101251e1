"""Writing what a command produces to the file the user named (``--out``)."""

from __future__ import annotations

from pathlib import Path

from meshplan.errors import InputError


def write_text(path: Path, text: str, shown: object = None) -> None:
    """Write ``text`` (UTF-8) to ``path``; an ``out`` error naming the file (as ``shown``, default
    the path) when it cannot be written. Whether an existing file may be replaced is the caller's
    check, made before any work."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise InputError("out", f"cannot write '{path if shown is None else shown}': {err.strerror or err}") from None
