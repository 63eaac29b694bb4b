"""Reading committed stream data back out of objects: the catch-up read path.

`ObjectReader.read` asks the ObjectManager which objects cover a range, opens each object's
index (one ranged GET of the tail, cached in the block cache) and fetches only the data
blocks it needs, through the block cache. When a reader misses, it reads ahead: the
needed block plus the stream's following blocks in the same object, in ONE ranged GET, and
the read-ahead window grows by the initial size on every further miss of that stream (up to
the maximum), so a consumer catching up sequentially soon reads large ranges per request.
While such a reader processes one answer, the block its next fetch will need is already
being fetched (also across object boundaries).
Concurrent readers of the same block share one GET.

What is read ahead is bounded in total, not only per stream: the groups in flight together
hold at most a quarter of the block cache (beyond the block each reader needs now), so many
streams catching up at once get smaller groups instead of holding GETs several times the
cache's size in memory while they land. And each stream's window is bounded by its share
of the cache: with N streams catching up (a read-ahead miss in the last ACTIVE_S seconds),
at most half the cache divided by N, so the groups of all of them fit in the cache together
and a group is not evicted before its reader gets to it (then read again: read
amplification, which the memory benchmark prints).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import time
from dataclasses import dataclass

from automq.broker.objectstore import ObjectStore
from automq.broker.storage.api import RecordBatchData
from automq.broker.storage.cache.block_cache import BlockCache
from automq.broker.storage.metadata import ObjectManager, ObjectMetadata
from automq.broker.storage.objects.format import (
    FOOTER,
    TAIL_READ_BYTES,
    IndexEntry,
    ObjectFormatError,
    ObjectIndex,
    iter_block_batches,
    parse_index,
    parse_tail,
)
from automq.broker.storage.read.buffers import ReadBuffers

log = logging.getLogger(__name__)

INDEX_POSITION = -1
OBJECTS_PER_READ = 8
ACTIVE_S = 10.0  # a stream with a read-ahead miss this recent counts as catching up


@dataclass(slots=True)
class _ReadAhead:
    window: int
    last: float  # monotonic time of its last miss
    misses: int = 0


class ObjectReader:
    def __init__(
        self,
        store: ObjectStore,
        objects: ObjectManager,
        block_cache: BlockCache,
        *,
        read_ahead_initial: int = 512 << 10,
        read_ahead_max: int = 32 << 20,
        metrics=None,
    ) -> None:
        self._store = store
        self._objects = objects
        self._cache = block_cache
        self._initial = read_ahead_initial
        self._max = read_ahead_max
        self._metrics = metrics
        self._read_ahead: dict[int, _ReadAhead] = {}
        self._inflight: dict[tuple[int, int], asyncio.Future] = {}
        self._prefetching: set[asyncio.Task] = set()
        self._ahead_budget = block_cache.max_bytes // 4
        self._ahead_bytes = 0  # bytes of the read-ahead GETs in flight
        self._counted_at = 0.0  # when streams idle for ACTIVE_S were last forgotten
        # Read-ahead groups land in reused buffers when the store can read into them.
        self._buffers = ReadBuffers(block_cache.max_bytes // 8, block_cache) if store.reads_into_buffers else None

    async def read(self, stream_id: int, start: int, end: int, max_bytes: int) -> tuple[list[RecordBatchData], bool]:
        """Batches overlapping [start, end) from committed objects, contiguous from the batch
        holding `start`. Returns (batches, all_from_cache)."""
        objs = await self._objects.get_objects(stream_id, start, end, OBJECTS_PER_READ)
        out, cached, pos = await self._collect(objs, stream_id, start, end, max_bytes)
        ra = self._read_ahead.get(stream_id)
        if ra is not None and ra.misses and pos < end:
            # A reader catching up: fetch what it will ask for next while it processes this.
            self._prefetch(objs, stream_id, pos)
        return out, cached

    async def _collect(self, objs: list[ObjectMetadata], stream_id: int, start: int, end: int, max_bytes: int):
        out: list[RecordBatchData] = []
        size = 0
        pos = start
        cached = True
        for obj in objs:
            index = await self._index(obj)
            for entry in index.blocks(stream_id, pos, end):
                if entry.start_offset > pos and out:
                    return out, cached, pos  # a gap: never serve around it
                data, hit = await self._block(obj, index, entry)
                cached = cached and hit
                for base, count, payload in iter_block_batches(data, key=obj.key):
                    if base + count <= pos:
                        continue
                    if base >= end or (out and size + len(payload) > max_bytes):
                        return out, cached, pos
                    out.append(RecordBatchData(base, count, payload))
                    size += len(payload)
                    pos = base + count
                if pos >= end:
                    return out, cached, pos
        return out, cached, pos

    def _prefetch(self, objs: list[ObjectMetadata], stream_id: int, pos: int) -> None:
        for obj in objs:
            if any(r.stream_id == stream_id and r.start_offset <= pos < r.end_offset for r in obj.ranges):
                task = asyncio.create_task(self._prefetch_block(obj, stream_id, pos))
                self._prefetching.add(task)
                task.add_done_callback(self._prefetching.discard)
                return

    async def _prefetch_block(self, obj: ObjectMetadata, stream_id: int, pos: int) -> None:
        try:
            index = await self._index(obj)
            entries = index.blocks(stream_id, pos, pos + 1)
            if entries and not self._cache.contains(obj.object_id, entries[0].position):
                await self._block(obj, index, entries[0])
        except Exception:  # only an optimisation; the real read will report the problem
            log.debug("prefetch of %s failed", obj.key, exc_info=True)

    async def _index(self, obj: ObjectMetadata) -> ObjectIndex:
        index = self._cache.get(obj.object_id, INDEX_POSITION)
        if index is not None:
            return index
        return await self._shared((obj.object_id, INDEX_POSITION), lambda: self._load_index(obj))

    async def _load_index(self, obj: ObjectMetadata) -> ObjectIndex:
        size = obj.object_size
        tail_start = max(0, size - TAIL_READ_BYTES)
        tail = await self._get(obj.key, tail_start, size)
        index_pos, index_len, crc = parse_tail(tail, size, key=obj.key)
        if index_pos >= tail_start:
            raw = memoryview(tail)[index_pos - tail_start : index_pos - tail_start + index_len]
        else:  # a big index: one more GET for the part the tail read did not cover
            joined = await self._get(obj.key, index_pos, tail_start) + tail[: len(tail) - FOOTER.size]
            raw = memoryview(joined)[:index_len]
        index = parse_index(raw, crc, size, key=obj.key)
        self._cache.put(obj.object_id, INDEX_POSITION, index, index_len + 64 * len(index.entries))
        return index

    async def _block(
        self, obj: ObjectMetadata, index: ObjectIndex, entry: IndexEntry
    ) -> tuple[bytes | memoryview, bool]:
        data = self._cache.get(obj.object_id, entry.position)
        if data is not None:
            return data, True
        fut = self._inflight.get((obj.object_id, entry.position))
        if fut is None:
            fut = self._start_read_ahead(obj, index, entry)
        return await asyncio.shield(fut), False

    async def _shared(self, key: tuple[int, int], load):
        fut = self._inflight.get(key)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            value = await load()
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved; waiters re-raise it
            raise
        finally:
            self._inflight.pop(key, None)
        fut.set_result(value)
        return value

    def _start_read_ahead(self, obj: ObjectMetadata, index: ObjectIndex, entry: IndexEntry) -> asyncio.Future:
        """One GET for `entry` and the stream's following blocks in this object, as far as
        the stream's read-ahead window reaches. Every block in it is marked in flight at
        once, so concurrent readers (and the prefetcher) never fetch a block twice."""
        now = time.monotonic()
        ra = self._read_ahead.get(entry.stream_id)
        new = ra is None
        if ra is None:
            ra = self._read_ahead[entry.stream_id] = _ReadAhead(self._initial, now)
        else:
            ra.misses += 1
            ra.window = min(self._max, ra.window + self._initial)
            ra.last = now
        group = [entry]
        span = entry.size
        limit = min(ra.window, self._share(now, new), self._ahead_budget - self._ahead_bytes)
        for nxt in index.stream_blocks_after(entry):
            key = (obj.object_id, nxt.position)
            if span + nxt.size > limit or self._cache.contains(*key) or key in self._inflight:
                break
            if nxt.position != group[-1].position + group[-1].size:
                break
            group.append(nxt)
            span += nxt.size
        loop = asyncio.get_running_loop()
        futures = {e.position: loop.create_future() for e in group}
        for pos, f in futures.items():
            self._inflight[(obj.object_id, pos)] = f
        self._ahead_bytes += span
        self._cache.reserve(span)  # evicts first, so buffers it frees serve this read
        # a store that reads straight from the device wants aligned ranges: room for the
        # aligned superset of the group (at most two blocks more)
        align = self._store.read_alignment
        buf = self._buffers.take(span + 2 * align) if self._buffers is not None else None
        task = asyncio.create_task(self._read_group(obj, group, span, futures, buf, align))
        self._prefetching.add(task)
        task.add_done_callback(self._prefetching.discard)
        return futures[entry.position]

    def _share(self, now: float, new_stream: bool) -> int:
        """One catching-up stream's part of the cache: half of it over the streams catching
        up (those in `_read_ahead`). Streams idle for ACTIVE_S are forgotten at most once a
        second, and whenever a stream starts catching up, so its count is current."""
        if new_stream or now - self._counted_at >= 1.0:
            self._counted_at = now
            for sid in [s for s, ra in self._read_ahead.items() if now - ra.last > ACTIVE_S]:
                del self._read_ahead[sid]
        return max(self._initial, self._cache.max_bytes // (2 * max(1, len(self._read_ahead))))

    async def _read_group(
        self,
        obj: ObjectMetadata,
        group: list[IndexEntry],
        span: int,
        futures: dict[int, asyncio.Future],
        buf: mmap.mmap | None,
        align: int = 0,
    ) -> None:
        first = group[0].position
        reserved = span
        try:
            if buf is None:
                raw = memoryview(await self._get(obj.key, first, first + span))
            else:
                lead = first % align if align else 0
                length = -(-(lead + span) // align) * align if align else span
                raw = await self._get_into(obj.key, first - lead, memoryview(buf)[:length])
                raw = raw[lead : lead + span]
                del buf  # the views hold it now; the pool sees it free once they are gone
            self._cache.release(reserved)
            reserved = 0
            if len(raw) < span:
                raise ObjectFormatError(f"short read of blocks [{first}, +{span}): got {len(raw)} bytes", key=obj.key)
            for e in group:
                data = raw[e.position - first : e.position - first + e.size]
                self._cache.put(obj.object_id, e.position, data, e.size)
                futures[e.position].set_result(data)
        except BaseException as exc:
            for f in futures.values():
                if not f.done():
                    f.set_exception(exc)
                    f.exception()  # retrieved by whoever awaits it; no "never retrieved" noise
            if not isinstance(exc, Exception):
                raise
        finally:
            self._cache.release(reserved)
            self._ahead_bytes -= span
            for pos in futures:
                self._inflight.pop((obj.object_id, pos), None)

    async def _get_into(self, key: str, start: int, buffer: memoryview) -> memoryview:
        """The bytes read into `buffer`, as a read-only view (blocks are never written)."""
        t0 = time.perf_counter()
        n = await self._store.get_into(key, start, buffer)
        self._observe(t0, n)
        return buffer[:n].toreadonly()

    async def _get(self, key: str, start: int, end: int) -> bytes:
        t0 = time.perf_counter()
        data = await self._store.get(key, start, end)
        self._observe(t0, len(data))
        return data

    def _observe(self, t0: float, n: int) -> None:
        if self._metrics is not None:
            self._metrics.object_read_seconds.observe(time.perf_counter() - t0)
            self._metrics.object_read_bytes.inc(n)
