"""The log cache: recent durable appends, in WAL order, grouped into cache blocks.

It serves two masters. Tail readers fetch from it (no object store round trip, no copy:
batches are the very bytes that were appended). The uploader takes whole sealed blocks from
it: a block holds every record between two WAL positions, so once a block is uploaded and
committed the WAL can be trimmed to the block's end.

Eviction is FIFO and bounded by bytes, but only of blocks already uploaded: data that is not
yet in the object store must stay readable here. The bound is on what the cache keeps alive
(`resident`: each request frame or WAL read its batches are slices of, once, at its allocated
size, plus each batch's objects), not on payload lengths (`size`), which ran ~12 % below it.

A compaction that rewrote a committed range of a stream (key compaction drops records) makes
the cached batches of that range stale: `invalidate_below` sets the stream's floor, and reads
below it miss (the engine reads the objects); uploaded slices wholly below it are freed.
"""

from __future__ import annotations

import bisect
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from automq.broker.storage.api import RecordBatchData
from automq.broker.storage.cache.retained import VIEW_OVERHEAD, Retained

# Per cached batch, besides its buffer: its RecordBatchData, its base offset's int and the
# two list slots (bases, batches) pointing at them.
BATCH_OVERHEAD = sys.getsizeof(RecordBatchData(1 << 40, 1, b"")) + sys.getsizeof(1 << 40) + 16


@dataclass(slots=True)
class StreamSlice:
    """One stream's consecutive batches inside one cache block."""

    stream_id: int
    epoch: int
    bases: list[int] = field(default_factory=list)
    batches: list[RecordBatchData] = field(default_factory=list)
    size: int = 0

    @property
    def start_offset(self) -> int:
        return self.bases[0]

    @property
    def end_offset(self) -> int:
        return self.batches[-1].next_offset


@dataclass(slots=True)
class CacheBlock:
    block_id: int
    created: float = field(default_factory=time.monotonic)
    size: int = 0
    wal_end: int = 0  # every record below this WAL position is in this or an earlier block
    streams: dict[int, StreamSlice] = field(default_factory=dict)
    sealed: bool = False
    sealed_at: float = 0.0  # time.monotonic() when sealed
    uploaded: bool = False


class LogCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._blocks: deque[CacheBlock] = deque()
        self._next_block_id = 0
        self.size = 0  # payload bytes
        self._retained = Retained()  # the buffers the payloads are slices of
        self._overhead = 0  # per-batch objects
        self._unuploaded = 0  # kept as a counter: checked on every append
        # Each stream's slices, oldest first, so reads never scan other streams' blocks.
        self._by_stream: dict[int, deque[StreamSlice]] = {}
        self._floor: dict[int, int] = {}  # stream -> offsets below were rewritten: never served here
        self._open = self._new_block()

    def _new_block(self) -> CacheBlock:
        block = CacheBlock(self._next_block_id)
        self._next_block_id += 1
        self._blocks.append(block)
        return block

    @property
    def open_block(self) -> CacheBlock:
        return self._open

    @property
    def unuploaded_bytes(self) -> int:
        return self._unuploaded

    def put(
        self, stream_id: int, epoch: int, base_offset: int, record_count: int, payload: bytes | memoryview, wal_end: int
    ) -> None:
        """Add a durable record. Called in WAL order."""
        block = self._open
        sl = block.streams.get(stream_id)
        if sl is not None and (sl.epoch != epoch or sl.end_offset != base_offset):
            # A new epoch (or a gap after a reopen) starts a new block, so one block never
            # holds two ranges of a stream that would need separate commits.
            block = self.seal()
            sl = None
        if sl is None:
            sl = block.streams[stream_id] = StreamSlice(stream_id, epoch)
            self._by_stream.setdefault(stream_id, deque()).append(sl)
        sl.bases.append(base_offset)
        sl.batches.append(RecordBatchData(base_offset, record_count, payload))
        self._retained.hold(payload)
        self._overhead += BATCH_OVERHEAD + VIEW_OVERHEAD if isinstance(payload, memoryview) else BATCH_OVERHEAD
        n = len(payload)
        sl.size += n
        block.size += n
        block.wal_end = wal_end
        self.size += n
        self._unuploaded += n
        if self._retained.bytes + self._overhead > self.max_bytes and self._blocks[0].uploaded:
            self.evict()  # not only when the next upload ends: the cap holds between uploads

    @property
    def resident(self) -> int:
        """Bytes this cache keeps alive: the buffers its batches are slices of, each counted
        once at its allocated size, and the batches' own objects. What `max_bytes` bounds."""
        return self._retained.bytes + self._overhead

    def _release(self, batches: list[RecordBatchData]) -> None:
        release = self._retained.release
        views = 0
        for b in batches:
            release(b.payload)
            if isinstance(b.payload, memoryview):
                views += 1
        self._overhead -= BATCH_OVERHEAD * len(batches) + VIEW_OVERHEAD * views

    def seal(self) -> CacheBlock:
        """Close the open block (it becomes an upload unit) and open a new one. Returns the
        new open block."""
        if self._open.size:
            self._open.sealed = True
            self._open.sealed_at = time.monotonic()
            self._open = self._new_block()
        return self._open

    def sealed_blocks(self) -> list[CacheBlock]:
        return [b for b in self._blocks if b.sealed and not b.uploaded]

    def mark_uploaded(self, block: CacheBlock) -> None:
        if not block.uploaded:
            block.uploaded = True
            self._unuploaded -= block.size
        self.evict()

    def evict(self) -> None:
        while self.resident > self.max_bytes and self._blocks and self._blocks[0].uploaded:
            b = self._blocks.popleft()
            self.size -= b.size
            for sid, sl in b.streams.items():
                self._release(sl.batches)
                self._unlink(sid, sl)
            b.streams.clear()  # a caller still holding the block (flush's list) holds no data

    def _unlink(self, stream_id: int, sl: StreamSlice) -> None:
        slices = self._by_stream.get(stream_id)
        if slices is None:
            return
        if slices and slices[0] is sl:
            slices.popleft()
        else:
            try:
                slices.remove(sl)
            except ValueError:
                pass
        if not slices:
            del self._by_stream[stream_id]

    def remove_slice(self, block: CacheBlock, stream_id: int) -> None:
        """Take one stream's data out of a block (already committed, or never to be)."""
        sl = block.streams.pop(stream_id, None)
        if sl is None:
            return
        block.size -= sl.size
        self.size -= sl.size
        if not block.uploaded:
            self._unuploaded -= sl.size
        self._release(sl.batches)
        self._unlink(stream_id, sl)

    def keep_from(self, block: CacheBlock, stream_id: int, first_kept: int) -> None:
        """Drop a slice's batches before index `first_kept` (they are committed already)."""
        sl = block.streams[stream_id]
        gone = sl.batches[:first_kept]
        dropped = sum(len(b.payload) for b in gone)
        self._release(gone)
        del sl.batches[:first_kept]
        del sl.bases[:first_kept]
        sl.size -= dropped
        block.size -= dropped
        self.size -= dropped
        if not block.uploaded:
            self._unuploaded -= dropped

    def drop_stream(self, stream_id: int) -> None:
        """Forget a stream's data (it was fenced or deleted: never to be uploaded)."""
        for b in self._blocks:
            if stream_id in b.streams:
                self.remove_slice(b, stream_id)
        self._by_stream.pop(stream_id, None)
        self._floor.pop(stream_id, None)

    def invalidate_below(self, stream_id: int, offset: int) -> None:
        """Offsets below `offset` were rewritten in the object store: stop serving them.

        Only uploaded slices are freed (a block the uploader still holds keeps its slices; the
        floor hides them). `offset` is a batch boundary of the original batches: a compaction
        replaces whole committed objects."""
        if offset <= self._floor.get(stream_id, 0):
            return
        self._floor[stream_id] = offset
        if stream_id not in self._by_stream:
            return
        for b in self._blocks:
            sl = b.streams.get(stream_id)
            if sl is not None and b.uploaded and sl.end_offset <= offset:
                self.remove_slice(b, stream_id)

    def first_offset(self, stream_id: int) -> int | None:
        """The first offset this cache serves for the stream (at or above its floor)."""
        slices = self._by_stream.get(stream_id)
        if not slices:
            return None
        floor = self._floor.get(stream_id, 0)
        if slices[0].start_offset >= floor:
            return slices[0].start_offset
        for sl in slices:
            if sl.end_offset <= floor:
                continue
            i = bisect.bisect_left(sl.bases, floor)
            if i < len(sl.bases):
                return sl.bases[i]
        return None

    def get(self, stream_id: int, start: int, end: int, max_bytes: int) -> list[RecordBatchData]:
        """Batches overlapping [start, end), beginning with the one that holds `start`; empty
        when the cache does not hold `start`. Whole batches, first one always included."""
        out: list[RecordBatchData] = []
        if start < self._floor.get(stream_id, 0):
            return out
        size = 0
        pos = start
        for sl in self._by_stream.get(stream_id, ()):
            if sl.end_offset <= pos:
                continue
            i = bisect.bisect_right(sl.bases, pos) - 1
            if i < 0:
                return out  # the cache starts after `start` (or, impossibly, has a gap)
            while i < len(sl.batches):
                batch = sl.batches[i]
                if batch.base_offset >= end:
                    return out
                n = len(batch.payload)
                if out and size + n > max_bytes:
                    return out
                out.append(batch)
                size += n
                pos = batch.next_offset
                i += 1
        return out
