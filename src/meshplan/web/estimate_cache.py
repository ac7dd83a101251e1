"""Estimates kept as JSON bytes, and the ASGI layer that answers a repeated ``/api/estimate`` from
them before routing.

An estimate is a pure function of its options, so a repeated request (a page reloaded, a link
shared, the Plan view revisiting a plan) can be answered with the bytes of the first answer. Two
keys lead to the same bytes:

- the raw query string of a request already answered 200, which :class:`CachedEstimates` looks up
  in front of the application: no routing, no query validation, no re-encoding, one dictionary
  look-up;
- the canonical request, the options after validation (``tp=04`` and ``tp=4``, any order of the
  parameters), looked up by :class:`CachedEstimates` for a new query string that validates and
  by :func:`~meshplan.web.plan_api.api_estimate` behind FastAPI's own validation.

Only answers of status 200 are kept; bad input goes to the application, which answers 422 with
its field and rule.

Both maps hold at most ``size`` entries; the oldest goes first when one is full.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Hashable, Optional

from pydantic import ValidationError

from meshplan.errors import InputError

#: The path :class:`CachedEstimates` answers.
ESTIMATE_PATH = "/api/estimate"


class BoundedMap:
    """A dictionary of at most ``size`` entries that drops the oldest insertion when full. Reads
    take no lock (a ``dict`` read is atomic); writes from the thread pool take one."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"size must be at least 1 (got {size})")
        self.size, self.data, self.lock = size, {}, threading.Lock()

    def get(self, key: Hashable) -> Any:
        return self.data.get(key)

    def put(self, key: Hashable, value: Any) -> None:
        with self.lock:
            self.data[key] = value
            while len(self.data) > self.size:
                self.data.pop(next(iter(self.data)))

    def __len__(self) -> int:
        return len(self.data)


#: An answer: the JSON bytes and the HTTP headers that go with them.
Answer = tuple[bytes, list[tuple[bytes, bytes]]]


class EstimateCache:
    """Estimate answers by canonical options and by raw query string, each map bounded to ``size``
    entries. ``compute`` gives the JSON of canonical options (sorted ``(name, value)`` pairs) and
    raises on bad input; ``key_of_query`` gives the canonical options of a raw query string, or
    None when it does not validate (the application then answers, with the field and the rule)."""

    def __init__(self, size: int, compute: Callable[[tuple], bytes], key_of_query: Callable[[bytes], Optional[tuple]],
                 threads: int = 1):
        self.compute_body, self.key_of_query = compute, key_of_query
        self.canonical, self.raw = BoundedMap(size), BoundedMap(size)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="meshplan-estimate")
        self.pending: dict[tuple, Future] = {}  # estimates being computed, which later askers wait for
        self.pending_lock = threading.Lock()

    def compute(self, key: tuple) -> Answer:
        """Compute and keep the answer for canonical options ``key``; bad input raises and is not
        kept."""
        body = self.compute_body(key)
        answer = (body, [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")])
        self.canonical.put(key, answer)
        return answer

    async def answer(self, key: tuple, query_string: bytes) -> Answer:
        """The answer for canonical options ``key``, computed off the event loop when new (on the
        estimate threads, in arrival order; requests for a key being computed wait for that
        computation), and kept for the raw ``query_string`` that asked for it."""
        answer = self.canonical.get(key)
        if answer is None:  # one computation per key, however many ask for it meanwhile
            with self.pending_lock:
                job = self.pending.get(key)
                if job is None:
                    job = self.pending[key] = self.pool.submit(self._compute_pending, key)
            answer = await asyncio.wrap_future(job)
        self.raw.put(query_string, answer)
        return answer

    def _compute_pending(self, key: tuple) -> Answer:
        try:
            return self.compute(key)
        finally:
            with self.pending_lock:
                self.pending.pop(key, None)


class CachedEstimates:
    """ASGI middleware for ``GET /api/estimate``: a query string already answered gets the same
    bytes and headers; a new one that validates is answered from the canonical cache or computed,
    without routing; anything else (bad input, other paths and methods) goes to the application."""

    def __init__(self, app: Any, cache: EstimateCache):
        self.app, self.cache = app, cache

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["path"] == ESTIMATE_PATH and scope["method"] == "GET":
            query = scope["query_string"]
            answer = self.cache.raw.get(query)
            if answer is None:
                key = self.cache.key_of_query(query)
                if key is not None:
                    try:
                        answer = await self.cache.answer(key, query)
                    except (InputError, ValidationError):  # the application answers with field and rule
                        pass
            if answer is not None:
                body, headers = answer
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


__all__ = ["Answer", "BoundedMap", "CachedEstimates", "EstimateCache", "ESTIMATE_PATH"]
