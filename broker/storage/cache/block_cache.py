"""The block cache: an LRU of object data blocks (and object indexes), bounded by bytes.

Catch-up readers go through it. It only stores and evicts; deciding what to read ahead is
the reader's job (`automq.broker.storage.read.reader`). Keys are (object id, block
position); an object's index is cached under position -1 so an object is opened once.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class BlockCache:
    def __init__(self, max_bytes: int, metrics: Any = None) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, int], tuple[Any, int]] = OrderedDict()
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._metrics = metrics

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

    def put(self, object_id: int, position: int, value: Any, size: int) -> None:
        key = (object_id, position)
        old = self._entries.pop(key, None)
        if old is not None:
            self.size -= old[1]
        self._entries[key] = (value, size)
        self.size += size
        while self.size > self.max_bytes and len(self._entries) > 1:
            _, (_, n) = self._entries.popitem(last=False)
            self.size -= n
        if self._metrics is not None:
            self._metrics.cache_bytes.labels("block_cache").set(self.size)

    def drop_object(self, object_id: int) -> None:
        for key in [k for k in self._entries if k[0] == object_id]:
            _, n = self._entries.pop(key)
            self.size -= n
