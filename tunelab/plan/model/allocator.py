"""CUDA's caching allocator, modelled from its code, to replay a simulated step's allocations on this CPU.

``torch.cuda.max_memory_allocated`` counts the blocks the allocator hands out, not the bytes asked for. The rules of
PyTorch's native allocator at default settings (``c10/cuda/CUDACachingAllocator.cpp``): requests rounded up to 512
bytes; a small pool (up to 1 MiB) and a large one; the smallest cached free block that fits, split when the rest is
large enough; segments from cudaMalloc in 2 MiB (small) or 20 MiB / rounded (large) units; freed blocks merged with
free neighbours. :func:`replay` runs a list of allocations and frees through these rules and reports the peaks a
GPU would (allocated and reserved); ``scripts/replay_allocator.py`` and ``reports/planner-accuracy/`` use it."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

MIN_BLOCK = 512
"""``kMinBlockSize``: every request is rounded up to a multiple of it."""
SMALL_SIZE = 1 << 20
"""``kSmallSize``: the largest request of the small pool."""
SMALL_BUFFER = 2 << 20
"""``kSmallBuffer``: a small-pool segment."""
LARGE_BUFFER = 20 << 20
"""``kLargeBuffer``: the segment for a large request under MIN_LARGE_ALLOC."""
MIN_LARGE_ALLOC = 10 << 20
"""``kMinLargeAlloc``: from this size a request gets a segment of its own."""
ROUND_LARGE = 2 << 20
"""``kRoundLarge``: such a segment is rounded up to a multiple of it."""


class _Block:
    __slots__ = ("addr", "size", "small", "prev", "next", "allocated")

    def __init__(self, addr: int, size: int, small: bool):
        self.addr, self.size, self.small = addr, size, small
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.allocated = False


@dataclass
class Peaks:
    """What the allocator reported at its peaks (bytes)."""

    requested: int
    """The largest sum of live requests (what the simulated step counts)."""
    allocated: int
    """``torch.cuda.max_memory_allocated``: the largest sum of live blocks."""
    reserved: int
    """``torch.cuda.max_memory_reserved``: the largest sum of segments."""


class CachingAllocator:
    """The allocator's bookkeeping, without memory: see the module docstring."""

    def __init__(self) -> None:
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # (size, addr), sorted, per pool
        self._blocks: dict[tuple[int, int], _Block] = {}  # free blocks by (size, addr)
        self._next_addr = 0
        self.requested = self.allocated = self.reserved = 0
        self.peaks = Peaks(0, 0, 0)

    @staticmethod
    def round_size(nbytes: int) -> int:
        return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK

    @staticmethod
    def segment_size(size: int) -> int:
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    def _insert(self, block: _Block) -> None:
        key = (block.size, block.addr)
        bisect.insort(self._free[block.small], key)
        self._blocks[key] = block

    def _remove(self, block: _Block) -> None:
        key = (block.size, block.addr)
        pool = self._free[block.small]
        del pool[bisect.bisect_left(pool, key)]
        del self._blocks[key]

    def malloc(self, nbytes: int) -> _Block:
        size = self.round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = self._blocks.pop(pool.pop(i))
        else:
            segment = self.segment_size(size)
            block = _Block(self._next_addr, segment, small)
            self._next_addr += segment
            self.reserved += segment
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = _Block(block.addr + size, remaining, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert(rest)
        block.allocated = True
        self.allocated += block.size
        self.requested += nbytes
        self.peaks = Peaks(
            max(self.peaks.requested, self.requested),
            max(self.peaks.allocated, self.allocated),
            max(self.peaks.reserved, self.reserved),
        )
        return block

    def free(self, block: _Block, nbytes: int) -> None:
        self.allocated -= block.size
        self.requested -= nbytes
        block.allocated = False
        prev = block.prev
        if prev is not None and not prev.allocated:
            self._remove(prev)
            block.addr, block.size, block.prev = prev.addr, prev.size + block.size, prev.prev
            if prev.prev is not None:
                prev.prev.next = block
        nxt = block.next
        if nxt is not None and not nxt.allocated:
            self._remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        self._insert(block)


def replay(events, marks: dict[str, int] | None = None) -> tuple[Peaks, dict[str, Peaks]]:
    """Run ``events`` (``("alloc" | "free", key, nbytes)``, in order) through a :class:`CachingAllocator`: its peaks,
    and the peaks so far at each of ``marks`` ({name: index of the event before which to read them})."""
    allocator = CachingAllocator()
    live: dict = {}
    at = {i: name for name, i in (marks or {}).items()}
    so_far: dict[str, Peaks] = {}
    for i, (kind, key, nbytes) in enumerate(events):
        if i in at:
            so_far[at[i]] = allocator.peaks
        if kind == "alloc":
            if nbytes > 0:  # CUDA hands out no block for an empty tensor
                live[key] = (allocator.malloc(nbytes), nbytes)
        elif key in live:
            allocator.free(*live.pop(key))
    return allocator.peaks, so_far
