"""Reusable buffers for the read path's ranged GETs from a store that reads into them.

A catch-up reads its object data in read-ahead groups of up to `read_ahead_max` bytes. Read
into a fresh buffer each time, every group cost the process new pages: with the allocator's
fixed mmap threshold (`automq.broker.malloc`) a big buffer is an mmap of its own, the read
faults in and zeroes each of its 4 KiB pages (~0.5 s of CPU per GiB read, against ~0.05 s
for the copy itself), and freeing it unmaps them, on the event loop, where the block cache
evicts (~2 ms for a 32 MiB group). Here a group's buffer is used again once nothing refers
to it any more: no block of it in the block cache and no response still sending a slice.

Buffers are anonymous mmaps in size classes (from 256 KiB; four steps between two powers of
two, so a buffer is at most a quarter bigger than its read): making one touches no page (the
first read into it faults them in, as a fresh buffer's did), and a read-ahead window that
grows a little with every miss still finds a buffer of its class free. The block cache
counts a buffer at its whole size, so the rounding costs cache room, not memory; and it
counts the idle buffers too (as a reservation), so cached blocks, reads landing and idle
buffers together stay within `storage.block_cache_bytes`. Idle buffers are kept up to an
eighth of the cache, and let go IDLE_S after the last read.

How "nothing refers to it" is known: every view of a buffer (the group's memoryview, its
blocks' slices, a transport's pending writes) holds one reference to the mmap through their
shared export, so a lent buffer is free again exactly when its reference count is back to
what the pool's own list gives it. That count is measured once, on a buffer no one else
sees, rather than assumed; a count above it, whatever holds it, keeps the buffer lent.
The reader hands out read-only views, as the bytes it read before were.
"""

from __future__ import annotations

import asyncio
import mmap
import sys

from automq.broker.storage.cache.block_cache import BlockCache

GRANULE = 256 << 10  # the smallest buffer
IDLE_S = 10.0  # no read for this long: idle buffers are let go


def capacity(size: int) -> int:
    """The buffer class for a read of `size` bytes, at least GRANULE: between two powers of
    two, four steps (5/8, 6/8, 7/8 and 8/8 of the upper one), so a buffer is at most a
    quarter bigger than its read."""
    if size <= GRANULE:
        return GRANULE
    step = (1 << (size - 1).bit_length()) // 8
    return -(-size // step) * step


def _counts(buffers: list[mmap.mmap]) -> list[int]:
    return [sys.getrefcount(b) for b in buffers]


def _free_count() -> int:
    """The count `_counts` sees on a buffer held by the pool's list alone."""
    return _counts([mmap.mmap(-1, mmap.PAGESIZE)])[0]


class ReadBuffers:
    """Buffers lent to reads, and idle ones kept for the next (at most `max_idle` bytes,
    reserved in `cache`)."""

    def __init__(self, max_idle: int, cache: BlockCache, idle_s: float = IDLE_S) -> None:
        self.max_idle = max_idle
        self._cache = cache
        self._idle_s = idle_s
        self._last_take = 0.0
        self._expiry: asyncio.TimerHandle | None = None
        self._lent: list[mmap.mmap] = []
        self._idle: dict[int, list[mmap.mmap]] = {}  # by capacity
        self.idle_bytes = 0
        self.allocated = 0  # buffers made (tests check that buffers are reused)

    @property
    def lent_bytes(self) -> int:
        return sum(len(b) for b in self._lent)

    def take(self, size: int) -> mmap.mmap:
        """A buffer for a read of `size` bytes, lent from now on: an idle one of its class,
        or a new one."""
        self._reclaim()
        cap = capacity(size)
        idle = self._idle.get(cap)
        if idle:
            buf = idle.pop()
            self.idle_bytes -= cap
            self._cache.release(cap)
        else:
            buf = mmap.mmap(-1, cap)
            self.allocated += 1
        self._lent.append(buf)
        self._trim(self.max_idle)
        loop = asyncio.get_running_loop()
        self._last_take = loop.time()
        if self._expiry is None:
            self._expiry = loop.call_later(self._idle_s, self._expire)
        return buf

    def _expire(self) -> None:
        """No read for `idle_s`: the catch-up is over, so the buffers nothing refers to any
        more go back to the system (and their room to the block cache)."""
        self._expiry = None
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_take < self._idle_s:
            self._expiry = loop.call_at(self._last_take + self._idle_s, self._expire)
            return
        self._reclaim()
        self._trim(0)
        if self._lent:  # still read by cached blocks or answers: look again later
            self._expiry = loop.call_later(self._idle_s, self._expire)

    def _reclaim(self) -> None:
        if not self._lent:
            return
        counts = _counts(self._lent)
        if _FREE not in counts:
            return
        still = []
        for buf, count in zip(self._lent, counts, strict=True):
            if count == _FREE:
                self._idle.setdefault(len(buf), []).append(buf)
                self.idle_bytes += len(buf)
                self._cache.reserve(len(buf))
            else:
                still.append(buf)
        self._lent = still

    def _trim(self, keep: int) -> None:
        """Beyond `keep` idle bytes, the biggest idle buffers go; they are unmapped in a
        worker thread, so that never holds up the event loop."""
        doomed = []
        while self.idle_bytes > keep:
            cap = max(c for c, bufs in self._idle.items() if bufs)
            doomed.append(self._idle[cap].pop())
            self.idle_bytes -= cap
            self._cache.release(cap)
        if doomed:
            asyncio.get_running_loop().run_in_executor(None, doomed.clear)


_FREE = _free_count()
