"""The block cache: an LRU of object data blocks (and object indexes), bounded by bytes.

Catch-up readers go through it. It only stores and evicts; deciding what to read ahead is
the reader's job (`automq.broker.storage.read.reader`). Keys are (object id, block
position); an object's index is cached under position -1 so an object is opened once.

The bound is on what the cache keeps alive (`resident`), not on block lengths (`size`): a
block is a slice of the ranged GET that read its whole read-ahead group, and that buffer
stays alive while any block of it is cached. Each buffer counts once, at its allocated
size; a value that is not a buffer (an index) counts the size its caller gives.

Reads on their way in count too: the reader reserves a read-ahead group's bytes when it
starts the GET (`reserve`) and releases them just before it puts the blocks, so what the
cache keeps alive plus what is landing stays within `max_bytes`, instead of a cache already
full holding its whole size while up to a quarter of it more arrives.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from automq.broker.storage.cache.retained import VIEW_OVERHEAD, Retained

# Per entry: the OrderedDict's node and slot, the key tuple and its ints, the value tuple.
ENTRY_OVERHEAD = 250  # measured with tracemalloc (tests/storage/test_cache_memory.py)


def _is_buffer(value: Any) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview))


class BlockCache:
    def __init__(self, max_bytes: int, metrics: Any = None) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, int], tuple[Any, int]] = OrderedDict()
        self.size = 0  # block lengths (and indexes' given sizes)
        self._retained = Retained()
        self._other = 0  # what is not a buffer: indexes' sizes and per-entry objects
        self.reserved = 0  # bytes of reads in flight that will be put here
        self.hits = 0
        self.misses = 0
        self._metrics = metrics

    @property
    def resident(self) -> int:
        """Bytes this cache keeps alive; what `max_bytes` bounds."""
        return self._retained.bytes + self._other

    def get(self, object_id: int, position: int) -> Any | None:
        entry = self._entries.get((object_id, position))
        if entry is None:
            self.misses += 1
            if self._metrics is not None:
                self._metrics.cache_requests.labels("block_cache", "miss").inc()
            return None
        self._entries.move_to_end((object_id, position))
        self.hits += 1
        if self._metrics is not None:
            self._metrics.cache_requests.labels("block_cache", "hit").inc()
        return entry[0]

    def contains(self, object_id: int, position: int) -> bool:
        return (object_id, position) in self._entries

    def _add(self, value: Any, size: int) -> None:
        self.size += size
        if _is_buffer(value):
            self._retained.hold(value)
            self._other += ENTRY_OVERHEAD + (VIEW_OVERHEAD if isinstance(value, memoryview) else 0)
        else:
            self._other += ENTRY_OVERHEAD + size

    def _remove(self, value: Any, size: int) -> None:
        self.size -= size
        if _is_buffer(value):
            self._retained.release(value)
            self._other -= ENTRY_OVERHEAD + (VIEW_OVERHEAD if isinstance(value, memoryview) else 0)
        else:
            self._other -= ENTRY_OVERHEAD + size

    def put(self, object_id: int, position: int, value: Any, size: int) -> None:
        key = (object_id, position)
        old = self._entries.pop(key, None)
        if old is not None:
            self._remove(*old)
        self._entries[key] = (value, size)
        self._add(value, size)
        self._evict(keep=1)

    def reserve(self, size: int) -> None:
        """Make room for `size` bytes that a read in flight will put here."""
        self.reserved += size
        self._evict(keep=0)

    def release(self, size: int) -> None:
        self.reserved -= size

    def _evict(self, keep: int) -> None:
        # Oldest first; blocks of one read-ahead group sit next to each other in this order
        # (read together, then read in turn), so their shared buffer goes with them.
        # `keep`: the entry just put stays even if it alone is over the bound.
        while self.resident + self.reserved > self.max_bytes and len(self._entries) > keep:
            _, old = self._entries.popitem(last=False)
            self._remove(*old)
        if self._metrics is not None:
            self._metrics.cache_bytes.labels("block_cache").set(self.resident)

    def drop_object(self, object_id: int) -> None:
        for key in [k for k in self._entries if k[0] == object_id]:
            self._remove(*self._entries.pop(key))
