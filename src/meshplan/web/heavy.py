"""Heavy requests share a few slots: the calculators, the Plan view and explanations, the pipeline
simulations. Each request's work is bounded before it starts (the library's and the web's caps),
so a slot is held for seconds at most; at most :attr:`HeavySlots.slots` run at once, on the
server's worker threads, and a request that finds them all taken waits up to
:attr:`HeavySlots.wait_s` seconds, then is answered 503 with the error body (``field`` ``server``).
Cheap requests (catalogs, cached estimates, pages) never wait for a slot."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from meshplan.errors import InputError


class Busy(Exception):
    """Every heavy slot stayed taken for the whole wait: answered 503, body as a 422's."""

    def __init__(self, err: InputError):
        super().__init__(str(err))
        self.err = err


class HeavySlots:
    """A counting semaphore with a bounded wait, as a context manager (:meth:`slot`)."""

    def __init__(self, slots: int, wait_s: float):
        self.slots, self.wait_s = slots, wait_s
        self._sem = threading.BoundedSemaphore(slots)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot while the body runs; :class:`Busy` when none frees within the wait."""
        if not self._sem.acquire(timeout=self.wait_s):
            raise Busy(InputError("server", f"all {self.slots} slots for heavy requests stayed busy for {self.wait_s:g} s; try again shortly"))
        try:
            yield
        finally:
            self._sem.release()
