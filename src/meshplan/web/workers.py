"""Worker processes for the web server's heavy work, so that it never holds the server's GIL:
while one request simulates a long pipeline, the server process keeps answering the others at
full speed.

A :class:`WorkerPool` keeps at most one process per heavy slot, started on first use (forked from
a forkserver that has imported the web's modules once, so a start takes milliseconds; spawned where
there is no forkserver). A call sends a module-level function and its plain arguments down a pipe
and waits for the answer with a time limit. Past the limit the process running it is killed (its
work cannot be stopped any other way); a process that died (killed, out of memory) is replaced on
the next call. Bad input found in the worker (:class:`~meshplan.errors.InputError`, pydantic's
``ValidationError``) comes back as its field and rule and is raised again here, so it is answered
as if the work had run in the server.
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
import threading
import traceback
import weakref
from typing import Any, Callable

from pydantic import ValidationError

from meshplan.errors import InputError
from meshplan.specs.base import input_error_from

#: Modules a new worker finds imported (those of the heavy work): with a forkserver, imported once.
PRELOAD = ("meshplan.web",)
#: Seconds a new worker process may take to start and import what the work needs.
START_S = 60.0


class WorkerLost(Exception):
    """The work got no answer: its process could not start, passed the time limit (and was killed),
    died, or ran out of memory. The message is one line saying which."""


def _outcome(job: bytes) -> tuple:
    """Run one pickled ``(function, arguments)`` job: ``("ok", result)``, ``("input", field, rule)``
    for bad input, ``("memory",)``, or ``("error", traceback)`` for a defect."""
    try:
        fn, args = pickle.loads(job)
        return ("ok", fn(*args))
    except InputError as err:
        return ("input", err.field, err.rule)
    except ValidationError as err:
        bad = input_error_from(err)
        return ("input", bad.field, bad.rule)
    except MemoryError:
        return ("memory",)
    except Exception:
        return ("error", traceback.format_exc())


def serve(conn: Any, preload: tuple[str, ...]) -> None:
    """A worker process's loop: import ``preload``, say ready, then answer jobs until the pipe
    closes. Ctrl+C in the terminal is the server's to handle: the server stops its workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in preload:
        __import__(module)
    conn.send(("ready",))
    while True:
        try:
            job = conn.recv_bytes()
        except (EOFError, OSError):
            return
        out = _outcome(job)
        try:
            conn.send(out)
        except Exception:  # an answer that does not pickle is a defect of the work
            conn.send(("error", traceback.format_exc()))
        if out[0] == "memory":
            return  # a fresh process replaces this one


def _context() -> Any:
    """A forkserver preloaded with :data:`PRELOAD` where the platform has one; spawn elsewhere."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        return ctx
    return multiprocessing.get_context("spawn")


class Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: Any):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child, PRELOAD), name="meshplan-heavy", daemon=True)
        try:
            self.proc.start()
        except OSError as err:  # out of processes or of file descriptors
            self.conn.close()
            raise WorkerLost(f"no worker process could start ({err.strerror or err}); try again shortly") from None
        finally:
            child.close()
        if not self.conn.poll(START_S):
            self.stop()
            raise WorkerLost(f"no worker process started within {START_S:g} s; try again shortly")
        try:
            self.conn.recv()
        except (EOFError, OSError):
            self.stop()
            raise WorkerLost(f"the worker process stopped while starting ({self.exit_status()}); try again shortly") from None

    def call(self, job: bytes, timeout_s: float) -> tuple:
        """The outcome of a pickled job (see :func:`_outcome`); :class:`WorkerLost` past
        ``timeout_s`` seconds (the process is then killed) or when the process died."""
        try:
            self.conn.send_bytes(job)
            if not self.conn.poll(timeout_s):
                self.stop()
                raise WorkerLost(f"the work passed the {timeout_s:g} s a heavy request may take and was stopped; ask for less or try again shortly")
            return self.conn.recv()
        except (EOFError, OSError):
            self.stop()
            raise WorkerLost(f"the worker process running the work stopped ({self.exit_status()}); try again shortly") from None

    def alive(self) -> bool:
        """Whether an idle worker can take a job: its process runs and its pipe is open (an idle
        worker sends nothing, so a readable pipe means it closed)."""
        try:
            return self.proc.is_alive() and not self.conn.poll()
        except OSError:
            return False

    def exit_status(self) -> str:
        """How the process ended, for the error's line: ``exit status N`` or ``signal N``."""
        self.proc.join(1)
        code = self.proc.exitcode
        if code is None:
            return "still running"
        return f"signal {-code}" if code < 0 else f"exit status {code}"

    def stop(self) -> None:
        """Kill the process (if it runs) and close the pipe."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


def _stop_all(workers: list[Worker]) -> None:
    for w in list(workers):
        w.stop()
    workers.clear()


class WorkerPool:
    """Idle worker processes, started when first needed; callers (at most one per heavy slot) take
    one for a call and give it back. Dead or stopped processes are dropped and replaced."""

    def __init__(self) -> None:
        self._idle: list[Worker] = []
        self._lock = threading.Lock()
        self._ctx: Any = None
        self._closed = False
        # a pool dropped without close() (an app never shut down) still stops its processes
        self._finalizer = weakref.finalize(self, _stop_all, self._idle)

    def _take(self) -> Worker:
        with self._lock:
            while self._idle:
                w = self._idle.pop()
                if w.alive():
                    return w
                w.stop()
            if self._ctx is None:
                self._ctx = _context()
            ctx = self._ctx
        return Worker(ctx)

    def _give_back(self, w: Worker, keep: bool) -> None:
        with self._lock:
            if keep and not self._closed:
                self._idle.append(w)
                return
        w.stop()

    def call(self, fn: Callable[..., Any], args: tuple, timeout_s: float) -> Any:
        """``fn(*args)`` in a worker process: its result; InputError for bad input (as raised in
        the worker); :class:`WorkerLost`; RuntimeError with the worker's traceback for a defect."""
        job = pickle.dumps((fn, args))
        w = self._take()
        out: tuple = ("lost",)
        try:
            out = w.call(job, timeout_s)
        finally:
            self._give_back(w, keep=out[0] in ("ok", "input", "error"))
        if out[0] == "memory":
            raise WorkerLost("the work ran out of memory in its worker process; ask for less")
        if out[0] == "input":
            raise InputError(out[1], out[2])
        if out[0] == "error":
            raise RuntimeError(f"heavy work failed in its worker process:\n{out[1]}")
        return out[1]

    def pids(self) -> list[int]:
        """The idle worker processes' ids."""
        with self._lock:
            return [w.proc.pid for w in self._idle]

    def close(self) -> None:
        """Stop the idle worker processes, and each busy one when its call ends."""
        with self._lock:
            self._closed = True
            _stop_all(self._idle)
