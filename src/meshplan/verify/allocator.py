"""torch's CUDA caching allocator, modelled, replaying an allocation trace taken on the CPU.

Published peaks from PyTorch runs (torchtitan's among them) are the caching allocator's *reserved*
peak (``torch.cuda.max_memory_reserved``); what meshplan counts are allocated bytes, plus the one
block this model shows kept at the loss (below). The two differ where a
freed block cannot serve a later, larger request: the allocator keeps it and grows instead. Which
blocks those are depends only on the order and sizes of the allocations and frees, which torch's
profiler records on the CPU as well (``profile_memory=True``: every allocation and free of the CPU
allocator, with its address). :func:`replay` runs such a trace through the model of the large pool
of one stream under expandable segments, :class:`meshplan.cost.allocator.CachingAllocator` (its
rules are listed there).

Without expandable segments (not modelled) every growth is a ``cudaMalloc`` segment of its own,
whose blocks merge only within it: in the loss's trace below the logits and their upcast then stay
two free segments, the first fp32 request takes the upcast's and the logits' is still too small, so
the reserved peak is the same. :func:`profiled_events` takes the trace.

What the model shows for torch's eager loss (``meshplan.cost.activations.freed_logits_block_bytes``):
the LM head's e-byte logits (e < 4), freed before the backward (torchtitan's ``del pred``), leave
a hole of e·n·V/t bytes between the fp32 tensors of ``cross_entropy`` on ``logits.float()``, which
the backward's fp32 requests, twice as large, cannot use.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable

from meshplan.cost.allocator import CachingAllocator, replay  # noqa: F401


def profiled_events(fn: Callable[[], Any]) -> list[tuple[int, int]]:
    """The CPU allocator's allocations and frees while ``fn()`` runs, in order, as ``(address,
    bytes)`` (torch's profiler with ``profile_memory=True``; its ``[memory]`` events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    memory = [e for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    memory.sort(key=lambda e: e["ts"])  # stable: events of one timestamp keep the recorded order
    return [(int(e["args"]["Addr"]), int(e["args"]["Bytes"])) for e in memory]
