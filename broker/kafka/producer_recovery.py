"""A led partition's producer state across owners: snapshots while it is led, rebuild on open.

Producer state (idempotent sequences, open transactions and aborted ranges, the largest
timestamp) lives in memory on the partition's leader and is persisted as snapshots in the
object store (producer_snapshots.py). A newly opened partition loads the newest snapshot and
replays only the batches after it. A snapshot is written once PRODUCER_SNAPSHOT_INTERVAL_OFFSETS
offsets were appended since the last one (and at most every PRODUCER_SNAPSHOT_MIN_INTERVAL_S),
and when the partition closes, so the replay on open stays short whatever the partition's size:
reassignment time must not grow with it.

`PartitionSnapshots` is the per-partition bookkeeping (which offsets are safe to cover, the
task writing one); `rebuild_producer_state` is the replay a new owner runs before serving;
`expire_producers` drops producers idle for producer.id.expiration.ms (run every
producer.id.expiration.check.interval.ms, at rebuild, and every EXPIRE_CHECK_EVERY records),
so an expired producer is left out of later snapshots and stays expired on the next owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from automq.broker.kafka import records
from automq.broker.kafka.producer_snapshots import ProducerSnapshot, ProducerSnapshotStore, retained

if TYPE_CHECKING:
    from automq.broker.kafka.partitions import Partition

log = logging.getLogger(__name__)

PRODUCER_SNAPSHOT_INTERVAL_OFFSETS = 10_000
PRODUCER_SNAPSHOT_MIN_INTERVAL_S = 5.0
PRODUCER_SNAPSHOT_CLOSE_TIMEOUT_S = 10.0  # a final snapshot must not hold a stalled close for long
PRODUCER_STATE_REBUILD_BYTES = 8 << 20


class PartitionSnapshots:
    """Producer-state snapshots of one partition.

    `unrecorded` holds the base offsets of appends between their offset reservation and
    their producer-state record: a snapshot may only cover offsets below all of them (the
    partition adds and discards them on its append paths)."""

    def __init__(self, partition: Partition, store: ProducerSnapshotStore | None) -> None:
        self._partition = partition
        self.store = store
        self.unrecorded: set[int] = set()
        self.offset = -1  # the offset of the newest snapshot (written or loaded)
        self.task: asyncio.Task[None] | None = None
        self._due = 0.0  # monotonic time before which no periodic snapshot starts

    def after_append(self, base_offset: int) -> None:
        """Start a periodic snapshot when enough was appended since the last one."""
        if (
            self.store is not None
            and base_offset - self.offset >= PRODUCER_SNAPSHOT_INTERVAL_OFFSETS
            and self.task is None
        ):
            self.start()

    def safe_offset(self) -> int:
        """The highest offset below which every batch is durable and recorded."""
        offset = self._partition.stream.confirm_offset
        if self.unrecorded:
            offset = min(offset, min(self.unrecorded))
        return offset

    def start(self) -> None:
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + PRODUCER_SNAPSHOT_MIN_INTERVAL_S
        p = self._partition
        self.task = asyncio.get_running_loop().create_task(
            self._write_in_background(), name=f"producer-snapshot-{p.topic}-{p.partition}"
        )

    async def _write_in_background(self) -> None:
        try:
            await self.write()
        except Exception as exc:
            p = self._partition
            log.warning("writing the producer snapshot of %s-%d failed: %s", p.topic, p.partition, exc)
        finally:
            self.task = None

    async def write(self) -> int | None:
        """Persist the producer state as of the highest safe offset; returns that offset
        (None when there is nothing new). All but the newest two snapshots are deleted."""
        store = self.store
        if store is None:
            return None
        offset = self.safe_offset()
        if offset <= self.offset:
            return None
        p = self._partition
        state = p.producer_state
        latest = p.max_timestamp
        snapshot = ProducerSnapshot(
            p.stream.stream_id,
            offset,
            state.snapshot(offset) if state is not None else [],
            latest if latest is not None and latest[0] < offset else None,
            transactions=p.txns.at(offset),
            epoch=p.leader_epoch,
        )
        await store.write(snapshot)
        p.txns.snapshot_written(offset)
        self.offset = max(self.offset, offset)
        try:
            await store.collect(p.stream.stream_id)
        except Exception as exc:
            log.info("collecting old producer snapshots of %s-%d failed: %s", p.topic, p.partition, exc)
        return offset

    async def write_final(self) -> None:
        """On close, before the stream is released: a snapshot at the end, so the next owner
        replays nothing. Bounded by PRODUCER_SNAPSHOT_CLOSE_TIMEOUT_S; a failure only costs
        the next owner a longer replay."""
        try:
            await asyncio.wait_for(self._final(), PRODUCER_SNAPSHOT_CLOSE_TIMEOUT_S)
        except Exception as exc:
            p = self._partition
            log.warning(
                "final producer snapshot of %s-%d not written (%r); the next owner replays from the last one",
                p.topic,
                p.partition,
                exc,
            )

    async def _final(self) -> None:
        task = self.task
        if task is not None:
            await asyncio.shield(task)
        # appends already past their offset reservation finish (or fail) first
        while self.unrecorded:
            await asyncio.sleep(0.01)
        await self.write()


async def rebuild_producer_state(p: Partition) -> None:
    """Load the newest producer snapshot at or below the end and replay the batches after
    it (the whole log when there is none), noting the largest timestamp on the way (for
    ListOffsets MAX_TIMESTAMP). Producers whose data is all trimmed, or idle longer than
    producer.id.expiration.ms, are forgotten as Kafka does."""
    state = p.producer_state
    stream = p.stream
    snapshots = p.snapshots
    end = stream.confirm_offset
    start = stream.start_offset
    snapshot = None
    covered = -1  # batches below this are in the snapshot
    if snapshots.store is not None:
        snapshot = await snapshots.store.load_latest(stream.stream_id, end, p.epochs)
    if snapshot is not None:
        if state is not None:
            state.load(retained(snapshot.producers, start))
        if snapshot.max_timestamp is not None and snapshot.max_timestamp[0] >= start:
            p.max_timestamp = snapshot.max_timestamp
        snapshots.offset = covered = snapshot.offset
        start = max(start, snapshot.offset)
        p.txns.load(snapshot.transactions)
    offset = start
    while offset < end:
        result = await stream.fetch(offset, end, PRODUCER_STATE_REBUILD_BYTES)
        if not result.batches:
            break
        for data in result.batches:
            if data.base_offset < covered:
                continue  # already in the snapshot
            for _pos, h in records.iter_headers(data.payload):
                if h.producer_id < 0:
                    continue
                if h.is_control:
                    kind = records.control_type(data.payload[_pos : _pos + h.size], h)
                    if kind is not None:
                        p.txns.on_marker(h.producer_id, kind == records.CONTROL_COMMIT, h.base_offset)
                        if state is not None:
                            state.record_marker(h.producer_id, h.producer_epoch, h.max_timestamp)
                    continue
                if h.is_transactional:
                    p.txns.on_data(h.producer_id, h.base_offset)
                if state is not None and h.base_sequence >= 0:
                    # the offset span, not the record count: key compaction removes
                    # records but keeps the span, and the sequences follow the span
                    state.record(
                        h.producer_id,
                        h.producer_epoch,
                        h.base_sequence,
                        h.last_offset_delta + 1,
                        h.base_offset,
                        h.max_timestamp,
                    )
            latest = records.max_timestamp(data.payload)
            if latest is not None and (p.max_timestamp is None or latest[1] > p.max_timestamp[1]):
                p.max_timestamp = latest
        offset = result.batches[-1].next_offset
    if state is not None:
        state.expire(int(time.time() * 1000))
    if end - max(snapshots.offset, 0) >= PRODUCER_SNAPSHOT_INTERVAL_OFFSETS:
        snapshots.start()  # a long replay: spare the next owner the same one


def expire_producers(partitions: Iterable[Partition], now_ms: int) -> int:
    """Forget, in each partition, the idempotent producers idle for producer.id.expiration.ms
    (not those with a transaction open there); returns how many were dropped."""
    dropped = 0
    for p in partitions:
        state = p.producer_state
        if state is not None and len(state):
            dropped += len(state.expire(now_ms))
    return dropped
