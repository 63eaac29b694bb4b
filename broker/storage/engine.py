"""`StorageEngine`: the stream storage engine a broker runs (implements `StreamClient`).

It wires the parts together and owns nothing else:

    append ─▶ WAL (group commit) ─durable─▶ log cache (confirm offset advances) ─▶ uploader
    fetch  ─▶ log cache (tail) ─miss─▶ ObjectReader ─▶ block cache ─▶ object store

`start()` replays the WAL from its trim point, uploads and commits what was not, and only
then lets the WAL accept appends (recovery is idempotent: the uploader drops what the
metadata says is already committed). `close()` drains appends, uploads and commits
everything, closes open streams and the WAL.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import CollectorRegistry

from automq.broker.config import NodeConfig
from automq.broker.objectstore import ObjectNotFound, ObjectStore
from automq.broker.storage.ack_lease import AckLease, LeaseRevokedError
from automq.broker.storage.api import (
    FetchResult,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StreamClosedError,
    StreamError,
)
from automq.broker.storage.cache.block_cache import BlockCache
from automq.broker.storage.cache.log_cache import LogCache
from automq.broker.storage.metadata import (
    ObjectManager,
    StreamFencedError,
    StreamManager,
    StreamMetadata,
    StreamNotOpenError,
)
from automq.broker.storage.metrics import StorageMetrics
from automq.broker.storage.read.reader import ObjectReader
from automq.broker.storage.recovery import upload_recovered
from automq.broker.storage.upload.uploader import Uploader, UploadSettings
from automq.broker.storage.wal.base import WalError, WalRecord, WalRecordTooLargeError, WriteAheadLog

log = logging.getLogger(__name__)


def build_wal(
    config: NodeConfig, object_store: ObjectStore, node_id: int, node_epoch: int, metrics: StorageMetrics | None
) -> WriteAheadLog:
    wal = config.wal
    if wal.kind == "volume":
        from automq.broker.storage.wal.volume import VolumeWal

        return VolumeWal(
            config.data_path(wal.path),
            wal.capacity,
            node_id,
            node_epoch,
            group_commit_delay_ms=wal.group_commit_max_delay_ms,
            metrics=metrics,
        )
    from automq.broker.storage.wal.objectstore import ObjectStoreWal

    return ObjectStoreWal(
        object_store,
        node_id,
        node_epoch,
        bulk_interval_ms=wal.s3_bulk_interval_ms,
        bulk_bytes=wal.s3_bulk_bytes,
        metrics=metrics,
    )


class EngineStream:
    """One open stream. Implements `automq.broker.storage.api.Stream`."""

    def __init__(self, engine: StorageEngine, meta: StreamMetadata) -> None:
        self._engine = engine
        self.stream_id = meta.stream_id
        self.epoch = meta.epoch
        self.epochs = meta.epochs
        self._start = meta.start_offset
        self._end = meta.end_offset
        self._confirm = meta.end_offset
        self._closed: str | None = None
        self._drained = asyncio.Event()
        self._drained.set()

    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def end_offset(self) -> int:
        return self._end

    @property
    def confirm_offset(self) -> int:
        return self._confirm

    def _check_open(self) -> None:
        if self._closed is not None:
            raise StreamClosedError(f"stream {self.stream_id} epoch {self.epoch} is {self._closed}")

    async def append(self, payload: bytes | memoryview, record_count: int) -> int:
        self._check_open()
        if record_count <= 0:
            raise ValueError(f"record_count must be positive, got {record_count}")
        engine = self._engine
        base = self._end
        self._end = base + record_count
        started = time.perf_counter()
        try:
            fut = engine.wal.append(WalRecord(self.stream_id, self.epoch, base, record_count, payload))
        except WalRecordTooLargeError as exc:
            self._end = base  # refused before any await: nothing else reserved offsets since
            raise RecordTooLargeError(f"stream {self.stream_id}: {exc}") from exc
        except WalError as exc:
            self._end = base
            self._closed = f"failed: {exc}"
            raise StreamError(f"stream {self.stream_id}: WAL refused the append: {exc}") from exc
        self._drained.clear()
        try:
            # No shield (it costs a task per append): if the caller is cancelled the WAL
            # still writes the record and on_durable still confirms it; only the answer is lost.
            await fut
        except WalError as exc:
            self._closed = f"failed: {exc}"
            raise StreamError(f"stream {self.stream_id}: WAL failed: {exc}") from exc
        finally:
            if self._confirm >= self._end:
                self._drained.set()
        lease = engine.ack_lease
        if lease is not None and not lease.valid():
            await self._hold_lease(lease, "append")
        m = engine.metrics
        m.append_seconds.observe(time.perf_counter() - started)
        m.append_bytes.inc(len(payload))
        if self._closed is not None and self._closed.startswith("fenced"):
            raise StreamClosedError(f"stream {self.stream_id} was fenced before its append could be committed")
        cache = engine.log_cache
        if cache.unuploaded_bytes > cache.max_bytes:
            await engine._after_append()
        return base

    def _confirmed(self, next_offset: int) -> None:
        if next_offset > self._confirm:
            self._confirm = next_offset
            if self._confirm >= self._end:
                self._drained.set()

    def invalidate_cached_below(self, offset: int) -> None:
        """A compaction rewrote this stream below `offset`: the log cache stops serving it."""
        self._engine.log_cache.invalidate_below(self.stream_id, offset)

    async def fetch(self, start_offset: int, end_offset: int, max_bytes: int) -> FetchResult:
        self._check_open()
        confirm = self._confirm
        if start_offset < self._start or start_offset > confirm:
            raise OffsetOutOfRangeError(
                f"stream {self.stream_id}: offset {start_offset} is outside [{self._start}, {confirm}]",
                start_offset=self._start,
                end_offset=confirm,
            )
        end = min(end_offset, confirm)
        if start_offset >= end:
            return FetchResult([], "log_cache")
        result = await self._engine._fetch(self.stream_id, start_offset, end, max_bytes)
        # what was read is durable; served only under a valid lease, it is also recoverable
        lease = self._engine.ack_lease
        if lease is not None and not lease.valid():
            await self._hold_lease(lease, "fetch")
        return result

    async def _hold_lease(self, lease: AckLease, what: str) -> None:
        """The acknowledgement lease ran out (ack_lease.py): wait for the next heartbeat; a
        fence means a recoverer may already have read the WAL, so nothing is answered."""
        self._engine.metrics.ack_lease_waits.inc()
        log.warning(
            "stream %d: %s held, the acknowledgement lease ran out %.1fs ago (no heartbeat answered since)",
            self.stream_id,
            what,
            -lease.remaining(),
        )
        try:
            await lease.hold()
        except LeaseRevokedError as exc:
            self._fence(f"node fenced: {exc}")
            raise StreamClosedError(
                f"stream {self.stream_id}: this node was fenced before the {what} could be answered ({exc})"
            ) from None

    async def trim(self, new_start_offset: int) -> None:
        self._check_open()
        if new_start_offset > self._end:
            raise OffsetOutOfRangeError(
                f"stream {self.stream_id}: cannot trim to {new_start_offset} past the end {self._end}",
                start_offset=self._start,
                end_offset=self._end,
            )
        if new_start_offset <= self._start:
            return
        self._start = new_start_offset
        e = self._engine
        await e.streams.trim_stream(self.stream_id, self.epoch, new_start_offset, e.node_id, e.node_epoch)

    async def close(self) -> None:
        if self._closed is not None:
            if self._closed.startswith("failed"):
                self._engine._forget(self)  # its WAL failed: nothing more can be made durable
            return
        self._closed = "closing"
        await self._drained.wait()
        e = self._engine
        try:
            await e.uploader.flush()
            await e.streams.close_stream(self.stream_id, self.epoch, e.node_id, e.node_epoch)
        finally:
            self._closed = "closed"
            e._forget(self)

    def _fence(self, reason: str) -> None:
        if self._closed is None or self._closed == "closing":
            self._closed = f"fenced ({reason})"
        self._drained.set()


class StorageEngine:
    """Implements `automq.broker.storage.api.StreamClient`."""

    def __init__(
        self,
        config: NodeConfig,
        object_store: ObjectStore,
        streams: StreamManager,
        objects: ObjectManager,
        node_id: int,
        node_epoch: int,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.object_store = object_store
        self.streams = streams
        self.objects = objects
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.metrics = StorageMetrics(registry)
        # set by the broker process once registered (ack_lease.py); None: acknowledge freely
        self.ack_lease: AckLease | None = None
        s = config.storage
        self.wal = build_wal(config, object_store, node_id, node_epoch, self.metrics)
        self.wal.on_durable = self._on_durable
        self.log_cache = LogCache(s.log_cache_bytes)
        self.block_cache = BlockCache(s.block_cache_bytes, self.metrics)
        self.reader = ObjectReader(
            object_store,
            objects,
            self.block_cache,
            read_ahead_initial=s.read_ahead_initial_bytes,
            read_ahead_max=s.read_ahead_max_bytes,
            metrics=self.metrics,
        )
        self.uploader = Uploader(
            self.log_cache,
            self.wal,
            object_store,
            streams,
            objects,
            UploadSettings.of(config.storage),
            node_id,
            node_epoch,
            metrics=self.metrics,
            on_fenced=self._stream_fenced,
            on_node_fenced=self._node_fenced,
        )
        self.wal.set_pressure_handler(self.uploader.request_upload)
        self._open: dict[int, EngineStream] = {}
        self._fenced: BaseException | None = None
        self._stopping = False
        self._started = False
        self._stream_locks: dict[int, asyncio.Lock] = {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Recover the WAL (replay, upload, commit), then accept appends."""
        try:
            records = await self.wal.recover()
            report = self.wal.report
            self.metrics.wal_recovered_records.inc(report.records)
            if report.stop_reason == "torn":
                self.metrics.wal_damaged_records.inc()
                log.warning(
                    "WAL recovery stopped at a damaged tail record (never acknowledged): %s", "; ".join(report.details)
                )
            if records:
                log.info("WAL recovery: %d records, %d bytes to upload", report.records, report.bytes)
                await upload_recovered(
                    records,
                    self.object_store,
                    self.streams,
                    self.objects,
                    UploadSettings.of(self.config.storage),
                    self.node_id,
                    self.node_epoch,
                )
            await self.wal.start(report.end_position)
        except BaseException:
            await self.wal.close()
            raise
        self.uploader.start()
        self._started = True

    async def close(self) -> None:
        """Drain appends, upload and commit everything, close streams, the WAL and uploader."""
        if not self._started:
            return
        self._started = False
        for stream in list(self._open.values()):
            try:
                await stream.close()
            except Exception:
                log.exception("closing stream %d failed", stream.stream_id)
        try:
            if self._fenced is None:
                await self.uploader.flush()
        finally:
            await self.uploader.close()
            await self.wal.close()

    async def abort(self) -> None:
        """Stop without uploading (the controller or the object store is unreachable, or the
        stop deadline passed): what is durable stays in the WAL for the next start (or for
        the WAL recovery of this node), nothing is trimmed that was not committed."""
        self.stop_waiting()
        self._started = False
        try:
            await self.uploader.close()
        finally:
            await self.wal.close()

    # ------------------------------------------------------------------ StreamClient

    async def create_stream(self, tags: dict[str, str] | None = None) -> int:
        return await self.streams.create_stream(tags)

    async def open_stream(self, stream_id: int, epoch: int) -> EngineStream:
        self._check_usable()
        lock = self._stream_locks.setdefault(stream_id, asyncio.Lock())
        async with lock:
            old = self._open.get(stream_id)
            if old is not None:
                if old.epoch == epoch and old._closed is None:
                    return old
                # Our own earlier epoch still has data in the cache: commit it under that
                # epoch before the new one fences it.
                await old.close()
            meta = await self.streams.open_stream(stream_id, epoch, self.node_id, self.node_epoch)
            stream = EngineStream(self, meta)
            self._open[stream_id] = stream
            self.metrics.open_streams.set(len(self._open))
            return stream

    async def release_stream(self, stream_id: int, epoch: int) -> None:
        """Give up ownership of a stream under `epoch`, whether or not it is open here: the
        open stream is closed as usual; otherwise (this process restarted and replayed its
        WAL into the stream, or an earlier close failed half way) everything the cache holds
        is uploaded and committed first, then the controller closes it. A stream a newer
        owner took over is already released."""
        self._check_usable()
        lock = self._stream_locks.setdefault(stream_id, asyncio.Lock())
        async with lock:
            old = self._open.get(stream_id)
            if old is not None:
                await old.close()
                return
            await self.uploader.flush()
            try:
                await self.streams.close_stream(stream_id, epoch, self.node_id, self.node_epoch)
            except (StreamFencedError, StreamNotOpenError):
                pass  # another node owns it now: nothing of ours is left to release

    async def delete_stream(self, stream_id: int, epoch: int) -> None:
        stream = self._open.pop(stream_id, None)
        if stream is not None:
            stream._fence("deleted")
            self.log_cache.drop_stream(stream_id)
        await self.streams.delete_stream(stream_id, epoch, self.node_id, self.node_epoch)
        self.metrics.open_streams.set(len(self._open))

    # ------------------------------------------------------------------ internals

    def _check_usable(self) -> None:
        if self._fenced is not None:
            raise StreamClosedError(f"node {self.node_id} epoch {self.node_epoch} is fenced: {self._fenced}")
        if not self._started:
            raise StreamError("storage engine is not started (call await engine.start())")

    def _forget(self, stream: EngineStream) -> None:
        if self._open.get(stream.stream_id) is stream:
            del self._open[stream.stream_id]
        self.metrics.open_streams.set(len(self._open))

    def _on_durable(self, records: list[WalRecord]) -> None:
        cache = self.log_cache
        streams = self._open
        for r in records:
            cache.put(r.stream_id, r.stream_epoch, r.base_offset, r.record_count, r.payload, r.wal_end)
            s = streams.get(r.stream_id)
            if s is not None and s.epoch == r.stream_epoch:
                s._confirmed(r.base_offset + r.record_count)
        self.metrics.cache_bytes.labels("log_cache").set(cache.resident)
        self.metrics.wal_bytes_pending.set(self.wal.bytes_pending_trim)
        if cache.open_block.size >= self.config.storage.upload_block_bytes:
            # Seal here, not in the uploader: while it is busy with the previous block the
            # open one must not grow past the configured size.
            cache.seal()
            self.uploader.block_sealed()

    async def _after_append(self) -> None:
        # Back-pressure: never hold more unuploaded data than the log cache may hold.
        cache = self.log_cache
        while (
            cache.unuploaded_bytes > cache.max_bytes and self._fenced is None and self._started and not self._stopping
        ):
            self.uploader.request_upload()
            await self.uploader.wait_progress()

    def _stream_fenced(self, stream_id: int) -> None:
        s = self._open.get(stream_id)
        if s is not None:
            s._fence("a newer owner opened it")
            self._forget(s)
        self.log_cache.drop_stream(stream_id)

    def stop_waiting(self) -> None:
        """The node is stopping (or learned it is fenced): appends waiting for WAL space or
        for the log cache to drain fail now instead of waiting for uploads. Appends already
        durable in the WAL stay durable; the next start replays them."""
        self._stopping = True
        self.wal.stop_waiting()
        self.uploader.wake_waiters()  # _after_append loops see _stopping

    def _node_fenced(self, exc: BaseException) -> None:
        self._fenced = exc
        self.wal.stop_waiting()
        for s in list(self._open.values()):
            s._fence(f"node fenced: {exc}")
        self._open.clear()

    async def _fetch(self, stream_id: int, start: int, end: int, max_bytes: int) -> FetchResult:
        cache = self.log_cache
        first_cached = cache.first_offset(stream_id)
        m = self.metrics
        if first_cached is not None and first_cached <= start:
            batches = cache.get(stream_id, start, end, max_bytes)
            if batches:
                m.cache_requests.labels("log_cache", "hit").inc()
                result = FetchResult(batches, "log_cache")
                m.fetch_bytes.labels("log_cache").inc(result.size)
                return result
        m.cache_requests.labels("log_cache", "miss").inc()
        object_end = end if first_cached is None else min(end, max(first_cached, start + 1))
        try:
            batches, all_cached = await self.reader.read(stream_id, start, object_end, max_bytes)
        except ObjectNotFound:
            # Compaction or retention replaced the object after we looked it up: the
            # metadata now names its successor.
            batches, all_cached = await self.reader.read(stream_id, start, object_end, max_bytes)
        source = "block_cache" if all_cached else "object_store"
        if (
            batches
            and first_cached is not None
            and batches[-1].next_offset >= first_cached
            and batches[-1].next_offset < end
        ):
            size = sum(len(b.payload) for b in batches)
            more = cache.get(stream_id, batches[-1].next_offset, end, max(0, max_bytes - size))
            if more and size + sum(len(b.payload) for b in more) <= max_bytes:
                batches.extend(more)
                source = "mixed"
        result = FetchResult(batches, source)
        m.fetch_bytes.labels(source).inc(result.size)
        return result
