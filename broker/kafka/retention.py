"""Retention: trims the streams of the partitions this broker leads by time and by size.

Kafka deletes whole segments: by time when a segment's largest timestamp is older than
`retention.ms`, by size while the log minus its oldest segment still holds at least
`retention.bytes`. There are no segments here, so the same rules apply to record batches
(time) and to ~1 MiB runs of consecutive batches (size), and "deleting" is a stream trim:
the controller moves the start offset and objects wholly below it become garbage.

Only topics whose `cleanup.policy` contains `delete` are trimmed (as in Kafka). The task
runs every `kafka.log_retention_check_interval_ms` (Kafka's `log.retention.check.interval.ms`,
5 minutes) if the node config has that key, else every 5 minutes.

Size bookkeeping: for partitions with `retention.bytes` set, the task keeps a small index of
batch-run sizes, extended from where it stopped each run (reading only new data, mostly from
the log cache). DescribeLogDirs reports sizes from this index when it exists and otherwise
from the object metadata the controller holds plus the not-yet-uploaded tail.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from automq.broker.kafka import records
from automq.broker.kafka.partitions import NotLeaderError
from automq.broker.storage.api import OffsetOutOfRangeError, StreamClosedError
from automq.broker.topic_configs import effective_config

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker
    from automq.broker.kafka.partitions import Partition

log = logging.getLogger(__name__)

RUN_BYTES = 1 << 20  # size-index granularity: batches are grouped into runs of about this size
# At most this much is read per partition per time-retention check, so one run of the task
# stays short even when a lot expired at once (the next run continues).
MAX_SCAN_BYTES_PER_CHECK = 256 << 20


@dataclass(slots=True)
class BatchRun:
    """Consecutive batches [start, end) of one partition: their bytes and newest timestamp."""

    start: int
    end: int
    size: int
    max_timestamp: int


@dataclass(slots=True)
class SizeIndex:
    stream_id: int
    leader_epoch: int
    runs: deque[BatchRun] = field(default_factory=deque)
    scanned_to: int = 0  # next offset to scan

    @property
    def total(self) -> int:
        return sum(r.size for r in self.runs)

    def drop_below(self, start_offset: int) -> None:
        while self.runs and self.runs[0].end <= start_offset:
            self.runs.popleft()


def _batches_max_timestamp(payload: Any) -> int:
    newest = -1
    for _, header in records.iter_headers(payload):
        if header.max_timestamp > newest:
            newest = header.max_timestamp
    return newest


class RetentionTask:
    """Periodic time/size retention for one broker's led partitions."""

    def __init__(self, broker: Broker, interval_ms: int | None = None, run_bytes: int = RUN_BYTES) -> None:
        self._broker = broker
        self.interval_ms = interval_ms or broker.config.kafka.log_retention_check_interval_ms
        self.run_bytes = run_bytes
        self._indexes: dict[tuple[str, int], SizeIndex] = {}
        self._task: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="retention")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("retention run failed; retrying next interval")

    # ---------------------------------------------------------------- one run

    async def run_once(self, now_ms: int | None = None) -> dict[tuple[str, int], int]:
        """Apply retention to every led partition once; returns {partition: new start offset}
        for the partitions it trimmed."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        trimmed: dict[tuple[str, int], int] = {}
        led = self._broker.partitions.led()
        live_keys = {(p.topic, p.partition) for p in led}
        for key in list(self._indexes):
            if key not in live_keys:
                del self._indexes[key]
        for partition in led:
            try:
                new_start = await self.enforce(partition, now_ms)
            except (StreamClosedError, OffsetOutOfRangeError, NotLeaderError) as exc:  # moved or closed meanwhile
                log.debug("retention skipped %s-%d: %s", partition.topic, partition.partition, exc)
                continue
            except Exception:
                log.exception("retention of %s-%d failed", partition.topic, partition.partition)
                continue
            if new_start is not None:
                trimmed[(partition.topic, partition.partition)] = new_start
        return trimmed

    async def enforce(self, partition: Partition, now_ms: int) -> int | None:
        """Trim one partition by its topic's retention; returns the new start offset if trimmed."""
        config = effective_config(partition.configs, self._broker.config)
        if not config.deletes or (config.retention_ms < 0 and config.retention_bytes < 0):
            return None
        start = partition.log_start_offset
        new_start = start
        if config.retention_ms >= 0:
            new_start = max(new_start, await self._time_limit(partition, now_ms - config.retention_ms))
        if config.retention_bytes >= 0:
            index = await self.index(partition)
            new_start = max(new_start, self._size_limit(index, config.retention_bytes))
        if new_start <= start:
            return None
        await partition.stream.trim(new_start)
        cached = self._indexes.get((partition.topic, partition.partition))
        if cached is not None:
            cached.drop_below(new_start)
        log.info(
            "retention trimmed %s-%d: offsets below %d deleted (was %d)",
            partition.topic,
            partition.partition,
            new_start,
            start,
        )
        return new_start

    async def _time_limit(self, partition: Partition, cutoff_ms: int) -> int:
        """The first offset to keep: the first batch whose newest timestamp is not expired.
        Batches without a timestamp (-1) are never expired by time."""
        hw = partition.high_watermark
        offset = partition.log_start_offset
        index = self._indexes.get((partition.topic, partition.partition))
        if index is not None:
            # whole runs first (no reads), then batch by batch inside the first live run
            for run in index.runs:
                if run.end <= offset:
                    continue
                if 0 <= run.max_timestamp < cutoff_ms:
                    offset = run.end
                else:
                    break
        scanned = 0
        while offset < hw and scanned < MAX_SCAN_BYTES_PER_CHECK:
            result = await partition.read(offset, self.run_bytes, hw)
            if not result.batches:
                break
            for batch in result.batches:
                newest = _batches_max_timestamp(batch.payload)
                if newest < 0 or newest >= cutoff_ms:
                    return offset
                offset = max(offset, batch.next_offset)
                scanned += len(batch.payload)
        return offset

    @staticmethod
    def _size_limit(index: SizeIndex, retention_bytes: int) -> int:
        total = index.total
        keep_from = index.runs[0].start if index.runs else index.scanned_to
        for run in index.runs:
            if total - run.size < retention_bytes:
                break
            total -= run.size
            keep_from = run.end
        return keep_from

    # ---------------------------------------------------------------- sizes

    async def index(self, partition: Partition) -> SizeIndex:
        """The partition's size index, extended to its high watermark."""
        key = (partition.topic, partition.partition)
        index = self._indexes.get(key)
        stream_id = getattr(partition.stream, "stream_id", -1)
        if index is None or index.leader_epoch != partition.leader_epoch or index.stream_id != stream_id:
            index = SizeIndex(stream_id, partition.leader_epoch, scanned_to=partition.log_start_offset)
            self._indexes[key] = index
        start = partition.log_start_offset
        index.drop_below(start)
        offset = max(index.scanned_to, start)
        hw = partition.high_watermark
        while offset < hw:
            result = await partition.read(offset, self.run_bytes, hw)
            if not result.batches:
                break
            for batch in result.batches:
                if batch.next_offset <= offset:
                    continue
                size = len(batch.payload)
                newest = _batches_max_timestamp(batch.payload)
                last = index.runs[-1] if index.runs else None
                if (
                    last is not None
                    and last.end == max(batch.base_offset, offset)
                    and last.size + size <= self.run_bytes
                ):
                    last.end = batch.next_offset
                    last.size += size
                    last.max_timestamp = max(last.max_timestamp, newest)
                else:
                    index.runs.append(BatchRun(max(batch.base_offset, offset), batch.next_offset, size, newest))
                offset = batch.next_offset
        index.scanned_to = offset
        return index

    def known_size(self, topic: str, partition: int) -> int | None:
        index = self._indexes.get((topic, partition))
        return index.total if index is not None else None


# One task per broker; handlers (DescribeLogDirs) find it here.
_TASKS: weakref.WeakKeyDictionary[Any, RetentionTask] = weakref.WeakKeyDictionary()


def start_retention(broker: Broker, interval_ms: int | None = None) -> RetentionTask:
    """Create and start the broker's retention task (the broker process calls this once
    its partitions are followed; `await task.close()` on shutdown)."""
    task = _TASKS.get(broker)
    if task is None:
        task = RetentionTask(broker, interval_ms)
        _TASKS[broker] = task
    task.start()
    return task


def retention_of(broker: Broker) -> RetentionTask | None:
    return _TASKS.get(broker)


async def partition_size(broker: Broker, partition: Partition) -> int:
    """Bytes a led partition holds, as far as this broker knows them cheaply:
    the retention index when it exists, else the controller's object sizes for the uploaded
    part plus the not-yet-uploaded tail read from the log cache; -1 when unknown."""
    task = retention_of(broker)
    if task is not None:
        known = task.known_size(partition.topic, partition.partition)
        if known is not None:
            return known
    get_objects = getattr(broker.cluster, "get_objects", None)
    stream = partition.stream
    start, hw = partition.log_start_offset, partition.high_watermark
    if get_objects is None:
        return -1
    try:
        objects = await asyncio.wait_for(get_objects(stream.stream_id, start, -1, 10_000), 5.0)
    except Exception as exc:
        log.debug("object metadata for %s-%d unavailable: %s", partition.topic, partition.partition, exc)
        return -1
    total = 0
    uploaded_end = start
    for obj in objects:
        ranges = obj.ranges
        span = sum(r.end_offset - r.start_offset for r in ranges) or 1
        for r in ranges:
            if r.stream_id != stream.stream_id:
                continue
            mine = max(0, r.end_offset - max(r.start_offset, start))
            # stream-set objects hold several streams: apportion the object by offsets
            total += obj.object_size * mine // span
            uploaded_end = max(uploaded_end, r.end_offset)
    offset = uploaded_end
    while offset < hw:  # the tail is recent: the log cache serves it without object reads
        result = await partition.read(offset, 8 << 20, hw)
        if not result.batches:
            break
        total += result.size
        offset = result.batches[-1].next_offset
    return total
