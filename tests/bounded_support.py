"""Run a callable under watch: its wall-clock seconds and the memory it added at its peak, for
tests that a request stays within its work bound. On Linux the peak is the process's resident
high-water mark, reset before the call (``/proc/self/clear_refs``: no slowdown); elsewhere the
peak of tracemalloc's traced allocations (Python and numpy; slower)."""

from __future__ import annotations

import contextlib
import io
import time
import tracemalloc
from typing import Any, Callable, Sequence

#: What one hostile or careless request may take: 10 s and 1 GB.
SECONDS, BYTES = 10.0, 2**30


def _status_kib(key: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise OSError(f"no {key} in /proc/{pid}/status")


def _reset_high_water_mark(pid: int | str = "self") -> bool:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        _status_kib("VmHWM", pid)
        return True
    except OSError:
        return False


def bounded(fn: Callable[[], Any], processes: Sequence[int] = ()) -> tuple[Any, float, int]:
    """``(fn(), seconds, bytes the process grew by at its peak while fn ran)``; with ``processes``
    (the web server's worker processes, on Linux) their growth is added to this one's."""
    pids = ["self", *processes]
    if all(_reset_high_water_mark(pid) for pid in pids):
        before = [_status_kib("VmRSS", pid) for pid in pids]
        t0 = time.perf_counter()
        value = fn()
        seconds = time.perf_counter() - t0
        return value, seconds, sum(max(0, _status_kib("VmHWM", pid) - b) for pid, b in zip(pids, before)) * 1024
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        value = fn()
    finally:
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return value, seconds, peak


def run_main(args: list[str], stdin: str | None = None) -> tuple[int, str, str]:
    """``meshplan ARGS`` in this process: (exit status, stdout, stderr)."""
    from meshplan.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def one_error_line(code: int, out: str, err: str) -> str:
    """The one ``error: field: rule`` line of a refusal (status 2, nothing on stdout)."""
    assert code == 2, (code, out[-500:], err[-2000:])
    assert out == "" and "Traceback" not in err, err[-2000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    return lines[0]
