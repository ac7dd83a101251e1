"""Heavy requests share a few slots: the calculators, the Plan view and explanations, the pipeline
simulations. Each request's work is bounded before it starts (the library's and the web's caps,
checked in the server process, so a refusal costs nothing), so a slot is held for seconds at
most; at most :attr:`HeavySlots.slots` run at once, and a request that finds them all taken waits
up to :attr:`HeavySlots.wait_s` seconds, then is answered 503 with the error body (``field``
``server``).

The work itself runs in a worker process, one per slot (:mod:`meshplan.web.workers`), so that it
never holds the server's GIL: cheap requests (catalogs, estimates, pages) keep their speed while
heavy ones run, and never wait for a slot. Work that passes :attr:`HeavySlots.timeout_s` seconds
is stopped, and work whose process died is answered; both are 503 with the error body too."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from meshplan.errors import InputError
from meshplan.web.workers import WorkerLost, WorkerPool


class Unavailable(Exception):
    """A heavy request the server could not finish: no slot freed within the wait, or its work
    passed the time limit or lost its worker process. Answered 503, body as a 422's."""

    def __init__(self, err: InputError):
        super().__init__(str(err))
        self.err = err


class HeavySlots:
    """A counting semaphore with a bounded wait (:meth:`slot`), and the worker processes that run
    the work in a slot (:meth:`run`)."""

    def __init__(self, slots: int, wait_s: float, timeout_s: float):
        self.slots, self.wait_s, self.timeout_s = slots, wait_s, timeout_s
        self._sem = threading.BoundedSemaphore(slots)
        self.pool = WorkerPool()

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot while the body runs; :class:`Unavailable` when none frees within the wait."""
        if not self._sem.acquire(timeout=self.wait_s):
            raise Unavailable(InputError("server", f"all {self.slots} slots for heavy requests stayed busy for {self.wait_s:g} s; try again shortly"))
        try:
            yield
        finally:
            self._sem.release()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a slot, in a worker process: ``fn`` a module-level function, ``args`` and
        its result plain data. Bad input it raises is raised here (InputError); a result past
        :attr:`timeout_s` or from a process that died is :class:`Unavailable`."""
        with self.slot():
            try:
                return self.pool.call(fn, args, self.timeout_s)
            except WorkerLost as lost:
                raise Unavailable(InputError("server", str(lost))) from None

    def close(self) -> None:
        """Stop the worker processes (the server is shutting down)."""
        self.pool.close()
