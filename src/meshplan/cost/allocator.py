"""torch's CUDA caching allocator, modelled: what a sequence of allocations and frees reserves.

Published peaks from PyTorch runs (torchtitan's among them) are the caching allocator's *reserved*
peak (``torch.cuda.max_memory_reserved``). :class:`CachingAllocator` models the large pool of one
stream of ``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.x) as torchtitan launches it, with
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

Each stream has its own pool: a block freed on one stream serves only requests of that stream
(``get_free_block`` matches the block's stream). :func:`all_gather_pool_bytes` uses that for the
buffers FSDP2 all-gathers into on its copy-in stream; :mod:`meshplan.verify.allocator` replays
torch's own allocation traces through the same model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

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


def all_gather_pool_bytes(units: Sequence[float]) -> float:
    """Reserved bytes of the pool of FSDP2's all-gather copy-in stream over one forward through
    units of ``units`` gathered bytes each (P_u·w: a unit's parameters on one GPU after TP, in the
    dtype they are gathered in), in the order the forward runs them.

    FSDP2 all-gathers a unit into one flat buffer it allocates on its copy-in stream
    (``foreach_all_gather``: ``all_gather_comm.allocate`` under ``all_gather_copy_in_stream``),
    copies it out into the parameters' unsharded tensors on the compute stream
    (``foreach_all_gather_copy_out``) and frees it. In the forward it frees a unit's buffer only
    after the next unit's all-gather is issued (``FSDPParamGroup.wait_for_unshard``: "to overlap
    the current copy-out with the next all-gather, we save a reference to the current all-gather
    result to free after the next copy-out", ``comm_ctx.all_gather_state``), so two buffers are
    live at once: allocate unit i, free unit i − 1. The compute stream cannot reuse that pool, so
    its reserved peak stands beside the compute stream's through the step (the backward, which
    frees each buffer at once, fits in it). Units of at most 1 MiB go to the small pool and are
    left out, as :func:`replay` leaves them (and units without parameters). Two equal
    blocks reserve 2·P·w; a smaller unit before them (an embedding, torchtitan's 2024 root unit)
    leaves a hole they do not fit, E + 2·P·w; a larger one, E + P·w."""
    pool = CachingAllocator()
    previous = None
    for size in units:
        if size <= SMALL_REQUEST:
            continue
        current = pool.malloc(int(size))
        if previous is not None:
            pool.release(previous)
        previous = current
    return float(pool.peak_reserved)
