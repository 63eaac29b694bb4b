"""The uploader: turns sealed log-cache blocks into objects, commits them, then trims the WAL.

Order is the whole point. Blocks are committed one at a time, oldest first (the objects of
the next block may already be in flight); a block is marked uploaded (evictable) and the WAL
trimmed to its end only after the ObjectManager accepted the commit. A failed upload or
commit is retried (new object ids; the abandoned ones expire) and never trims. Before a
retry (and for replayed WAL data) the commit is reconciled with the stream metadata, which
makes it idempotent: ranges already committed (a commit whose answer was lost, or a replay
after a crash) are dropped, and streams fenced by a newer owner are handed to `on_fenced`.

One upload writes at most one stream-set object (every stream with a little data) plus one
stream object per stream that has `stream_split_bytes` or more in the block.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from automq.broker.config import StorageConfig
from automq.broker.objectstore import ObjectStore
from automq.broker.storage.api import RecordBatchData
from automq.broker.storage.cache.log_cache import CacheBlock, LogCache, StreamSlice
from automq.broker.storage.metadata import (
    CommitStreamSetObjectRequest,
    NodeFencedError,
    ObjectManager,
    ObjectStreamRange,
    OffsetMismatchError,
    StreamFencedError,
    StreamManager,
    StreamNotFoundError,
    StreamNotOpenError,
    StreamObject,
    object_key,
)
from automq.broker.storage.objects.format import ObjectWriter
from automq.broker.storage.upload.pace import UploadPace
from automq.broker.storage.wal.base import WriteAheadLog

log = logging.getLogger(__name__)

PREPARE_TTL_MS = 10 * 60_000
# An object bigger than this is handed to the store in MULTIPART_PART pieces, each joined
# only when the store takes it, instead of as one joined copy: a 64 MiB block's copy was the
# largest transient in the broker's memory at load (issue 14 goal 5). The S3 store sends
# pieces as multipart parts; a store that writes parts unjoined (file://) takes them all.
MULTIPART_THRESHOLD = 16 << 20
MULTIPART_PART = 8 << 20
PIPELINE_DEPTH = 2  # blocks whose objects are written at once (commits stay in order)
# Laying out a block's batches is per-batch Python work on the event loop (a 64 MiB block of
# 1 KiB batches is ~65k batches, ~100 ms): give the loop back every this many batches so
# appends and fetches are not stalled behind an upload (produce p99, issue 14).
BATCHES_PER_SLICE = 512


class UploaderStoppedError(Exception):
    """The uploader stopped (node fenced or engine closed); nothing more will be uploaded."""


@dataclass(slots=True)
class UploadSettings:
    upload_block_bytes: int
    upload_interval_ms: int
    stream_split_bytes: int
    object_block_bytes: int

    @classmethod
    def of(cls, storage: StorageConfig) -> UploadSettings:
        return cls(
            storage.upload_block_bytes,
            storage.upload_interval_ms,
            storage.stream_split_bytes,
            storage.object_block_bytes,
        )


class Uploader:
    def __init__(
        self,
        cache: LogCache,
        wal: WriteAheadLog | None,
        store: ObjectStore,
        streams: StreamManager,
        objects: ObjectManager,
        settings: UploadSettings,
        node_id: int,
        node_epoch: int,
        *,
        metrics=None,
        on_fenced: Callable[[int], None] | None = None,
        on_node_fenced: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._cache = cache
        self._wal = wal
        self._store = store
        self._streams = streams
        self._objects = objects
        self._settings = settings
        self.node_id = node_id
        self.node_epoch = node_epoch
        self._metrics = metrics
        self._on_fenced = on_fenced or (lambda sid: None)
        self._on_node_fenced = on_node_fenced or (lambda exc: None)
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._force = False
        self._pace = UploadPace()
        self._task: asyncio.Task | None = None
        self._stopped: BaseException | None = None
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="uploader")

    def request_upload(self) -> None:
        """Seal the open block now and upload everything sealed, unpaced (WAL or cache
        pressure, a flush)."""
        self._force = True
        self._pace.urgent = True
        self._wake.set()

    def block_sealed(self) -> None:
        """A block was sealed at its size: upload it, at the usual pace unless blocks pile up
        (the uploader falls behind: then unpaced, the one in flight included)."""
        if len(self._cache.sealed_blocks()) > 1:
            self._pace.urgent = True
        self._wake.set()

    async def flush(self) -> None:
        """Upload and commit everything appended so far (durable records in the cache)."""
        self._cache.seal()
        target = list(self._cache.sealed_blocks())
        self.request_upload()  # someone waits for it: no pacing
        while True:
            progress = self._progress  # taken before the check, so no wake-up is lost
            if all(b.uploaded for b in target):
                return
            if self._stopped is not None:
                raise UploaderStoppedError(f"uploader stopped: {self._stopped}") from self._stopped
            if self._task is None or self._task.done():
                # not running (recovery before start, or after close): upload inline
                for b in target:
                    if not b.uploaded:
                        await self._upload_until_done(b)
                continue
            self._wake.set()
            await progress.wait()

    async def wait_progress(self) -> None:
        """Wait until the uploader finished an upload (or stopped)."""
        if self._stopped is not None:
            raise UploaderStoppedError(f"uploader stopped: {self._stopped}") from self._stopped
        await self._progress.wait()

    def wake_waiters(self) -> None:
        """Wake wait_progress() callers now (they re-check why they wait: e.g. a stopping node)."""
        self._notify_progress()

    def _notify_progress(self) -> None:
        # A fresh event per round: waiters hold the old one, which is set exactly once.
        self._progress.set()
        self._progress = asyncio.Event()

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None

    async def _run(self) -> None:
        interval = self._settings.upload_interval_ms / 1000
        tick = max(0.05, min(1.0, interval / 4))
        try:
            while not self._closing:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=tick)
                except TimeoutError:
                    pass
                self._wake.clear()
                block = self._cache.open_block
                if block.size and (
                    self._force
                    or block.size >= self._settings.upload_block_bytes
                    or time.monotonic() - block.created >= interval
                ):
                    self._cache.seal()
                self._set_pace()
                self._force = False
                await self._upload_round()
                self._notify_progress()
        except NodeFencedError as exc:
            self._stopped = exc
            self._notify_progress()
            self._on_node_fenced(exc)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: stop loudly rather than trim wrongly
            log.exception("uploader failed")
            self._stopped = exc
            self._notify_progress()
            self._on_node_fenced(exc)

    def _set_pace(self) -> None:
        """Before a round: unpaced if asked to hurry or behind (more than one block sealed,
        half the log cache not uploaded), else at the pace of the first block's filling."""
        cache = self._cache
        sealed = cache.sealed_blocks()
        urgent = self._force or len(sealed) > 1 or cache.unuploaded_bytes > cache.max_bytes // 2
        self._pace.urgent = urgent
        if sealed and not urgent:
            self._pace.block_sealed(sealed[0].size, sealed[0].sealed_at - sealed[0].created)

    async def _upload_round(self) -> None:
        """Upload every sealed block. The objects of up to PIPELINE_DEPTH blocks are written in
        parallel (PUT latency overlaps); commits, and the WAL trims after them, stay strictly
        in block order. A block whose first attempt fails goes through the sequential retry
        path, which reconciles with the metadata first."""
        blocks = self._cache.sealed_blocks()
        started: deque[tuple[CacheBlock, float, asyncio.Future]] = deque()
        i = 0
        try:
            while i < len(blocks) or started:
                while i < len(blocks) and len(started) < PIPELINE_DEPTH:
                    b = blocks[i]
                    i += 1
                    started.append((b, time.perf_counter(), asyncio.ensure_future(self._write_objects(b))))
                block, t0, writing = started.popleft()
                try:
                    request = await writing
                    if request is not None:
                        await self._commit(request)
                    await self._finish(block, t0)
                except NodeFencedError:
                    raise
                except Exception as exc:
                    log.warning("upload of cache block %d failed (%r); retrying", block.block_id, exc)
                    if self._metrics is not None:
                        self._metrics.upload_failures.inc()
                    await self._upload_until_done(block)
                self._notify_progress()
        finally:
            for _, _, writing in started:
                writing.cancel()

    async def _upload_until_done(self, block: CacheBlock) -> None:
        delay = 0.1
        while True:
            try:
                await self.upload_block(block)
                return
            except NodeFencedError:
                raise
            except (StreamFencedError, StreamNotOpenError, OffsetMismatchError, StreamNotFoundError) as exc:
                log.warning(
                    "commit of cache block %d rejected (%s); reconciling with stream metadata", block.block_id, exc
                )
            except Exception as exc:
                log.warning(
                    "upload of cache block %d failed (%r); retrying in %.1fs", block.block_id, exc, delay, exc_info=True
                )
            if self._metrics is not None:
                self._metrics.upload_failures.inc()
            if self._closing:
                raise UploaderStoppedError("engine closing with an upload still failing")
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)

    async def _reconcile(self, block: CacheBlock) -> None:
        """Drop what metadata says is already committed or no longer ours."""
        cache = self._cache
        metas = {m.stream_id: m for m in await self._streams.get_streams(list(block.streams))}
        for sid, sl in list(block.streams.items()):
            m = metas.get(sid)
            if m is None or m.epoch != sl.epoch or m.owner_node_id != self.node_id or m.state != "open":
                if m is not None and m.end_offset >= sl.end_offset:
                    cache.remove_slice(block, sid)  # already committed; nothing lost
                    continue
                log.warning(
                    "stream %d was fenced or deleted with uncommitted data [%d, %d); dropping it",
                    sid,
                    sl.start_offset,
                    sl.end_offset,
                )
                cache.remove_slice(block, sid)
                self._on_fenced(sid)
                continue
            if m.end_offset >= sl.end_offset:
                cache.remove_slice(block, sid)
            elif m.end_offset > sl.start_offset:
                first = next((i for i, b in enumerate(sl.batches) if b.base_offset >= m.end_offset), len(sl.batches))
                if first == len(sl.batches) or sl.batches[first].base_offset != m.end_offset:
                    raise OffsetMismatchError(f"stream {sid}: committed end {m.end_offset} falls inside a batch")
                cache.keep_from(block, sid, first)
            elif m.end_offset < sl.start_offset:
                raise OffsetMismatchError(
                    f"stream {sid}: committed end {m.end_offset} is below cached data at {sl.start_offset} (a gap)"
                )

    async def upload_block(self, block: CacheBlock, *, reconcile: bool = True) -> None:
        """Upload, commit and finish one block, sequentially."""
        if reconcile:
            # One get_streams per attempt buys idempotence: a replay after a crash, or a retry
            # of a commit whose answer was lost, drops what is already committed.
            await self._reconcile(block)
        started = time.perf_counter()
        request = await self._write_objects(block)
        if request is not None:
            await self._commit(request)
        await self._finish(block, started)

    async def _finish(self, block: CacheBlock, started: float) -> None:
        """After the commit: metrics, make the block evictable, trim the WAL."""
        if self._metrics is not None:
            self._metrics.upload_seconds.observe(time.perf_counter() - started)
            self._metrics.upload_bytes.inc(block.size)
        self._cache.mark_uploaded(block)
        if self._wal is not None and block.wal_end > 0:
            try:
                await self._wal.trim(block.wal_end)
            except Exception:  # the data is committed; a later trim covers this one
                log.exception("WAL trim to %d failed", block.wal_end)
            if self._metrics is not None:
                self._metrics.wal_bytes_pending.set(self._wal.bytes_pending_trim)

    async def _write_objects(self, block: CacheBlock) -> CommitStreamSetObjectRequest | None:
        """Prepare ids and PUT the block's objects; returns the commit request (None when
        the block holds nothing any more)."""
        slices = sorted(block.streams.values(), key=lambda s: s.stream_id)
        if not slices:
            return None
        split = self._settings.stream_split_bytes
        shared = [s for s in slices if s.size < split]
        own = [s for s in slices if s.size >= split]
        count = (1 if shared else 0) + len(own)
        first_id = await self._objects.prepare_objects(count, PREPARE_TTL_MS)
        next_id = first_id
        puts = []
        sso_id, sso_size = -1, 0
        ranges: list[ObjectStreamRange] = []
        added = 0  # batches laid out since the loop last got a turn
        if shared:
            sso_id = next_id
            next_id += 1
            writer = ObjectWriter(self._settings.object_block_bytes)
            for sl in shared:
                added = await self._add_slice(writer, sl, added)
                ranges.append(ObjectStreamRange(sl.stream_id, sl.epoch, sl.start_offset, sl.end_offset, sl.size))
            sso_size = writer.total_size
            puts.append(self._put(object_key(sso_id), writer.finish(), sso_size))
        stream_objects = []
        for sl in own:
            writer = ObjectWriter(self._settings.object_block_bytes)
            added = await self._add_slice(writer, sl, added)
            size = writer.total_size
            stream_objects.append(StreamObject(next_id, size, sl.stream_id, sl.start_offset, sl.end_offset))
            puts.append(self._put(object_key(next_id), writer.finish(), size))
            next_id += 1
        if self._store.writes_in_parallel:
            await asyncio.gather(*puts)
        else:
            try:
                for put in puts:
                    await put
            finally:
                for put in puts:
                    put.close()  # the ones a failure left unstarted (a no-op for the others)
        # Stream objects carry no epoch: the commit checks them against the stream's current
        # epoch and owner (a reopen by this node under a newer epoch first commits the old
        # epoch's data, see StorageEngine.open_stream). Ranges are never empty.
        return CommitStreamSetObjectRequest(
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            object_id=sso_id,
            object_size=sso_size,
            stream_ranges=tuple(ranges),
            stream_objects=tuple(stream_objects),
        )

    async def _commit(self, request: CommitStreamSetObjectRequest) -> None:
        await self._objects.commit_stream_set_object(request)
        if self._metrics is not None:
            if request.object_id >= 0:
                self._metrics.objects_committed.labels("stream_set").inc()
            if request.stream_objects:
                self._metrics.objects_committed.labels("stream").inc(len(request.stream_objects))

    @staticmethod
    async def _add_slice(writer: ObjectWriter, sl: StreamSlice, added: int) -> int:
        """Adds the slice's batches, yielding to the loop every BATCHES_PER_SLICE batches
        (counted across slices: `added` carries over); returns the new count. A sealed
        block's slices do not change meanwhile: only this uploader edits them."""
        batches = sl.batches
        sid = sl.stream_id
        add = writer.add_batch
        b: RecordBatchData
        i = 0
        while i < len(batches):
            room = BATCHES_PER_SLICE - added
            for b in batches[i : i + room]:
                add(sid, b.base_offset, b.record_count, b.payload)
            step = min(room, len(batches) - i)
            i += step
            added += step
            if added >= BATCHES_PER_SLICE:
                await asyncio.sleep(0)
                added = 0
        return added

    async def _put(self, key: str, parts: list[bytes | memoryview], size: int) -> None:
        # Joins (tens of ms for tens of MiB) happen off the event loop, so appends and fetches
        # are not stalled behind an upload; the file:// store writes the parts in small runs.
        if size <= MULTIPART_THRESHOLD or self._store.writes_parts_unjoined:
            await self._store.put_parts(key, parts, pace=self._pace)
            return
        await self._store.put_multipart(key, self._pieces(parts))

    @staticmethod
    async def _pieces(parts: list[bytes | memoryview]) -> AsyncIterator[bytes]:
        """The parts joined into MULTIPART_PART pieces, one at a time as the store asks."""
        bounds = await asyncio.to_thread(Uploader._bounds, parts)
        for i, j in bounds:
            yield await asyncio.to_thread(b"".join, parts[i:j])

    @staticmethod
    def _bounds(parts: list[bytes | memoryview]) -> list[tuple[int, int]]:
        bounds = []
        start, n = 0, 0
        for i, p in enumerate(parts):
            n += len(p)
            if n >= MULTIPART_PART:
                bounds.append((start, i + 1))
                start, n = i + 1, 0
        if start < len(parts):
            bounds.append((start, len(parts)))
        return bounds
