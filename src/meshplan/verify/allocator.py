"""torch's CUDA caching allocator, modelled, replaying an allocation trace taken on the CPU.

Published peaks from PyTorch runs (torchtitan's among them) are the caching allocator's *reserved*
peak (``torch.cuda.max_memory_reserved``); what meshplan counts are allocated bytes, plus the one
block this model shows kept at the loss (below). The two differ where a
freed block cannot serve a later, larger request: the allocator keeps it and grows instead. Which
blocks those are depends only on the order and sizes of the allocations and frees, which torch's
profiler records on the CPU as well (``profile_memory=True``: every allocation and free of the CPU
allocator, with its address). :func:`replay` runs such a trace through a model of the large pool of
``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.x) as torchtitan launches it, with
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``:

* requests of at most 1 MiB (``kSmallSize``) go to the small pool, which is left out;
* a request is rounded up to 512 bytes (``kMinBlockSize``) and served by the best-fitting free block,
  the smallest at least as large, the lowest address among equals (``BlockComparatorSize``,
  ``get_free_block``), split when more than 1 MiB would remain (``should_split``);
* with no free block large enough, the segment grows at its end, taking in a free block that ends
  it (``expandable_segments``: one segment per stream, extended by mapping pages);
* a freed block merges with free neighbours (``free_block`` → ``try_merge_blocks``);
* nothing is given back (no ``empty_cache``, no out-of-memory retry), so the reserved peak is the
  segment's largest extent.

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
from dataclasses import dataclass, field
from typing import Any, Callable

#: Requests up to this size go to the small pool (``kSmallSize``).
SMALL_REQUEST = 1 << 20
#: Allocation granularity of the large pool (``kMinBlockSize``).
ROUND = 512


@dataclass
class _Block:
    start: int
    size: int
    free: bool


@dataclass
class CachingAllocator:
    """The large pool of one stream under expandable segments (module docstring)."""

    blocks: list[_Block] = field(default_factory=list)
    allocated: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0

    @property
    def reserved(self) -> int:
        return sum(b.size for b in self.blocks)

    def malloc(self, nbytes: int) -> int:
        """Serve a request of ``nbytes`` (> :data:`SMALL_REQUEST`); returns the block's address."""
        size = -(-nbytes // ROUND) * ROUND
        fits = [b for b in self.blocks if b.free and b.size >= size]
        if fits:
            block = min(fits, key=lambda b: (b.size, b.start))
            if block.size - size > SMALL_REQUEST:
                i = self.blocks.index(block)
                self.blocks.insert(i + 1, _Block(block.start + size, block.size - size, True))
                block.size = size
        elif self.blocks and self.blocks[-1].free:  # grow the segment, taking in its free end
            block = self.blocks[-1]
            block.size = size
        else:
            block = _Block(self.reserved, size, False)
            self.blocks.append(block)
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block.start

    def release(self, start: int) -> None:
        """Free the block at ``start`` and merge it with free neighbours."""
        i = next(i for i, b in enumerate(self.blocks) if b.start == start and not b.free)
        block = self.blocks[i]
        block.free = True
        self.allocated -= block.size
        if i + 1 < len(self.blocks) and self.blocks[i + 1].free:
            block.size += self.blocks.pop(i + 1).size
        if i > 0 and self.blocks[i - 1].free:
            self.blocks[i - 1].size += self.blocks.pop(i).size


def replay(events: list[tuple[int, int]]) -> CachingAllocator:
    """Run ``(address, bytes)`` events (bytes > 0 an allocation, < 0 a free, in program order)
    through :class:`CachingAllocator`; requests of the small pool and frees of blocks allocated
    before the trace began are skipped."""
    alloc = CachingAllocator()
    where: dict[int, int] = {}
    for addr, nbytes in events:
        if nbytes > SMALL_REQUEST:
            if addr in where:
                raise ValueError(f"address {addr:#x} allocated twice without a free: the trace is out of order")
            where[addr] = alloc.malloc(nbytes)
        elif nbytes < 0 and addr in where:
            alloc.release(where.pop(addr))
    return alloc


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
