"""PyTorch's CUDA caching allocator, modelled for what vLLM's "Model loading took X GiB" counts.

That figure is torch.cuda.memory_allocated() after load_model (vLLM 0.25.0 platforms/cuda.py
get_current_memory_usage, through utils/mem_utils.py DeviceMemoryProfiler), and it counts each tensor at the block
the allocator gave it, not at the bytes it asked for. load_model runs with max_split_size_mb 20
(v1/worker/gpu_worker.py _scoped_allocator_max_split, vLLM PR #41268; read in 0.25.0-0.33.0), under which
c10/cuda/CUDACachingAllocator.cpp
  - rounds a request to 512 bytes; a new request of 10 MiB or more gets a segment rounded up to 2 MiB
    (get_allocation_size, kRoundLarge), a smaller one a 20 MiB segment (kLargeBuffer) to share;
  - never splits a block for a request of max_split_size or more (should_split), so such a tensor holds its whole
    2 MiB-rounded segment, and takes a cached free block up to 20 MiB larger than itself whole (get_free_block);
  - splits a block only when more than 1 MiB (kSmallSize) would be left.
Qwen3.5-27B's 42.5 MiB down_proj holds 44 MiB; over the model that is 0.22-0.26 GiB of what the estimator fits as
"extra bytes a group" per kernel (benchmarks/weights_load.py). Requests of 1 MiB or less come from a pool of their
own and never share a block with these; they count at their 512-byte rounding.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from autotune.units import MiB

LOAD_MAX_SPLIT_BYTES = 20 * MiB  # gpu_worker.load_model: "20 MiB is the minimum PyTorch allows for max_split_size_mb"
SMALL_SIZE = 1 * MiB  # kSmallSize
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: the segment a 1-10 MiB request gets; also max_non_split_rounding's default
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge
MIN_BLOCK = 512  # kMinBlockSize


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(eq=False)
class Block:
    ptr: int
    size: int
    allocated: bool = False
    segment: int = -1  # -1: the small pool
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)


class CachingAllocator:
    """The large pool of one device and stream: malloc, free and the bytes counted as allocated."""

    def __init__(self, max_split: int = LOAD_MAX_SPLIT_BYTES):
        self.max_split = max_split
        self.allocated = 0
        self._free: list[tuple[int, int, int, Block]] = []  # (size, segment, offset, block): best fit first
        self._segments = itertools.count()
        self._segment_size: dict[int, int] = {}
        self._segment_used: dict[int, int] = {}

    @property
    def held(self) -> int:
        """What the device holds for torch once every wholly free segment is released (as empty_cache, or an
        out-of-memory retry, does): allocated blocks, and the free blocks that share a segment with one."""
        small = self.allocated - sum(self._segment_used.values())
        return small + sum(self._segment_size[s] for s, used in self._segment_used.items() if used)

    def malloc(self, n: int) -> Block:
        size = _round_up(max(n, 1), MIN_BLOCK)
        if size <= SMALL_SIZE:  # the small pool: never shares a block with the large one
            block = Block(0, size, True)
            self.allocated += size
            return block
        block = self._cached(size)
        if block is None:
            segment = next(self._segments)
            self._segment_size[segment] = LARGE_BUFFER if size < MIN_LARGE_ALLOC else _round_up(size, ROUND_LARGE)
            self._segment_used[segment] = 0
            block = Block(0, self._segment_size[segment], segment=segment)
        if size < self.max_split and block.size - size > SMALL_SIZE:  # split: the rest stays cached
            rest = Block(block.ptr + size, block.size - size, segment=block.segment, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._cache(rest)
        block.allocated = True
        self.allocated += block.size
        self._segment_used[block.segment] += block.size
        return block

    def free(self, block: Block) -> None:
        block.allocated = False
        self.allocated -= block.size
        if block.segment < 0:
            return
        self._segment_used[block.segment] -= block.size
        for neighbour in (block.prev, block.next):  # merge with free neighbours of the same segment
            if neighbour is None or neighbour.allocated:
                continue
            self._uncache(neighbour)
            if neighbour is block.prev:
                block.ptr, block.prev = neighbour.ptr, neighbour.prev
                if block.prev is not None:
                    block.prev.next = block
            else:
                block.next = neighbour.next
                if block.next is not None:
                    block.next.prev = block
            block.size += neighbour.size
        self._cache(block)

    def _cached(self, size: int) -> Block | None:
        """The smallest cached block that may serve `size` (get_free_block), taken out of the cache."""
        i = bisect.bisect_left(self._free, (size, -1))
        if i == len(self._free):
            return None
        block = self._free[i][-1]
        if size < self.max_split and block.size >= self.max_split:
            return None  # an oversize block is not cut for a small request
        if size >= self.max_split and block.size >= size + LARGE_BUFFER:
            return None  # nor taken whole by a large one it exceeds by 20 MiB or more
        del self._free[i]
        return block

    def _cache(self, block: Block) -> None:
        bisect.insort(self._free, (block.size, block.segment, block.ptr, block))

    def _uncache(self, block: Block) -> None:
        i = bisect.bisect_left(self._free, (block.size, block.segment, block.ptr))
        assert self._free[i][-1] is block
        del self._free[i]
