"""Producer-state snapshots: idempotent-producer state persisted with the stream.

A partition's producer state (per producer id: epoch, the last 5 batches' sequences and
offsets, last timestamp) must survive a move, a restart and a WAL recovery, or a retried
batch whose answer was lost is appended twice. Like Kafka's `<offset>.snapshot` files, a
snapshot is the state of every batch *below* its offset; a new owner loads the newest
snapshot at or below the stream's end and replays only the batches after it.

Object key: `producer-snapshots/<md5(stream id)[:8]>/<stream id>/<offset, 20 digits>` (a hashed
prefix spreads keys; zero-padded offsets list in offset order).

Format (big-endian), version 3 (version 2 is the same without the writer epoch, version 1
also without the transaction section):

    magic "AQPS" | version u16 | flags u16 | crc32c u32 (of everything after it)
    stream_id i64 | offset i64 | written_ms i64 | max_ts_offset i64 | max_ts i64 | producer_count u32
    producer: producer_id i64 | epoch i16 | last_timestamp i64 | baseline_last_seq i32
              | coordinator_epoch i32 | txn_first_offset i64 | batch_count u8
              batch: first_seq i32 | last_seq i32 | base_offset i64 | timestamp i64
    ongoing_count u32 | ongoing: producer_id i64 | first_offset i64
    aborted_count u32 | aborted: producer_id i64 | first_offset i64 | last_offset i64
    writer_epoch i32

`coordinator_epoch` and `txn_first_offset` are -1: the transaction section holds the open
transactions (first offsets) and aborted ranges below the snapshot's offset (txn_state.py),
what Kafka keeps in its snapshot and transaction index files. `writer_epoch` is the leader
(stream) epoch of the owner that wrote it: a snapshot describes that owner's log, and a log
in which a later epoch starts below the snapshot's offset is not that log (a fenced owner's
last records, never recovered, can sit under a snapshot it wrote before it learned of the
fence), so the loader skips it (`covers`; -1 in older versions, taken on trust). Readers refuse
other magics, unknown versions and CRC mismatches (`SnapshotFormatError`); the loader then
falls back to the next older snapshot, and finally to replaying the whole log.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import crc32c

from automq.broker.kafka.leader_epochs import LeaderEpochHistory
from automq.broker.kafka.producers import BATCHES_TO_RETAIN, ProducerEntry, StoredBatch
from automq.broker.kafka.txn_state import AbortedTxn, TxnSnapshotState
from automq.broker.objectstore import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

MAGIC = b"AQPS"
VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
KEY_PREFIX = "producer-snapshots/"
SNAPSHOTS_KEPT = 2  # the newest and the one before it (a torn/corrupt newest still has a fallback)

_HEAD = struct.Struct(">4sHHI")
_BODY = struct.Struct(">qqqqqI")
_PRODUCER = struct.Struct(">qhqiiqB")
_BATCH = struct.Struct(">iiqq")
_COUNT = struct.Struct(">I")
_ONGOING = struct.Struct(">qq")
_ABORTED = struct.Struct(">qqq")
_EPOCH = struct.Struct(">i")
_NO_TIMESTAMP = (-1, -1)


class SnapshotFormatError(Exception):
    """Bytes that are not a snapshot this code can read (magic, version, CRC, truncation)."""


@dataclass(slots=True)
class ProducerSnapshot:
    stream_id: int
    offset: int  # the state of every batch below this offset
    producers: list[ProducerEntry] = field(default_factory=list)
    max_timestamp: tuple[int, int] | None = None  # (offset, timestamp) of the largest batch maxTimestamp
    written_ms: int = 0
    transactions: TxnSnapshotState = field(default_factory=TxnSnapshotState)
    epoch: int = -1  # the writer's leader epoch (-1: unknown, a version 1 or 2 snapshot)


def snapshot_prefix(stream_id: int) -> str:
    spread = hashlib.md5(str(stream_id).encode()).hexdigest()[:8]
    return f"{KEY_PREFIX}{spread}/{stream_id}/"


def snapshot_key(stream_id: int, offset: int) -> str:
    return f"{snapshot_prefix(stream_id)}{offset:020d}"


def encode(snapshot: ProducerSnapshot) -> bytes:
    max_ts = snapshot.max_timestamp or _NO_TIMESTAMP
    parts = [
        _BODY.pack(
            snapshot.stream_id,
            snapshot.offset,
            snapshot.written_ms or int(time.time() * 1000),
            max_ts[0],
            max_ts[1],
            len(snapshot.producers),
        )
    ]
    for entry in snapshot.producers:
        batches = [b for b in entry.batches if b.base_offset is not None][-BATCHES_TO_RETAIN:]
        parts.append(
            _PRODUCER.pack(
                entry.producer_id, entry.epoch, entry.last_timestamp_ms, entry.baseline_last_seq, -1, -1, len(batches)
            )
        )
        parts.extend(_BATCH.pack(b.first_seq, b.last_seq, b.base_offset, b.timestamp_ms) for b in batches)
    txns = snapshot.transactions
    parts.append(_COUNT.pack(len(txns.ongoing)))
    parts.extend(_ONGOING.pack(pid, first) for pid, first in txns.ongoing.items())
    parts.append(_COUNT.pack(len(txns.aborted)))
    parts.extend(_ABORTED.pack(a.producer_id, a.first_offset, a.last_offset) for a in txns.aborted)
    parts.append(_EPOCH.pack(snapshot.epoch))
    body = b"".join(parts)
    return _HEAD.pack(MAGIC, VERSION, 0, crc32c.crc32c(body)) + body


def decode(data: bytes | memoryview) -> ProducerSnapshot:
    data = memoryview(data)
    if len(data) < _HEAD.size + _BODY.size:
        raise SnapshotFormatError(f"snapshot of {len(data)} bytes is shorter than its header")
    magic, version, _flags, crc = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise SnapshotFormatError(f"not a producer snapshot (magic {bytes(magic)!r})")
    if version not in READABLE_VERSIONS:
        raise SnapshotFormatError(f"producer snapshot version {version} is not supported (this broker reads {VERSION})")
    body = data[_HEAD.size :]
    if crc32c.crc32c(body) != crc:
        raise SnapshotFormatError("producer snapshot CRC mismatch")
    stream_id, offset, written_ms, ts_offset, ts, count = _BODY.unpack_from(body, 0)
    position = _BODY.size
    producers = []
    try:
        for _ in range(count):
            pid, epoch, last_ts, baseline, _coordinator_epoch, _txn_first, n = _PRODUCER.unpack_from(body, position)
            position += _PRODUCER.size
            batches = []
            for _ in range(n):
                first, last, base, batch_ts = _BATCH.unpack_from(body, position)
                position += _BATCH.size
                batches.append(StoredBatch(first, last, base, batch_ts))
            producers.append(ProducerEntry(pid, epoch, batches, last_ts, baseline))
        txns = TxnSnapshotState()
        if version >= 2:
            (n,) = _COUNT.unpack_from(body, position)
            position += _COUNT.size
            for _ in range(n):
                pid, first = _ONGOING.unpack_from(body, position)
                position += _ONGOING.size
                txns.ongoing[pid] = first
            (n,) = _COUNT.unpack_from(body, position)
            position += _COUNT.size
            for _ in range(n):
                txns.aborted.append(AbortedTxn(*_ABORTED.unpack_from(body, position)))
                position += _ABORTED.size
        writer_epoch = -1
        if version >= 3:
            (writer_epoch,) = _EPOCH.unpack_from(body, position)
            position += _EPOCH.size
    except struct.error as exc:
        raise SnapshotFormatError(f"producer snapshot is truncated: {exc}") from None
    if position != len(body):
        raise SnapshotFormatError(f"producer snapshot has {len(body) - position} trailing bytes")
    max_timestamp = None if (ts_offset, ts) == _NO_TIMESTAMP else (ts_offset, ts)
    return ProducerSnapshot(stream_id, offset, producers, max_timestamp, written_ms, txns, writer_epoch)


class ProducerSnapshotStore:
    """Reads, writes and garbage-collects the snapshots of streams in one object store."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    async def offsets(self, stream_id: int) -> list[int]:
        """Offsets of the stream's snapshots, ascending."""
        prefix = snapshot_prefix(stream_id)
        out = []
        async for info in self._store.list(prefix):
            tail = info.key[len(prefix) :]
            if tail.isdigit():
                out.append(int(tail))
        return sorted(out)

    async def load_latest(
        self, stream_id: int, at_most: int, epochs: LeaderEpochHistory | None = None
    ) -> ProducerSnapshot | None:
        """The newest readable snapshot with offset <= at_most (newer ones describe data this
        log does not hold) that describes this log (`covers`, given its epoch history), or
        None. Unreadable ones are skipped with a warning."""
        for offset in reversed(await self.offsets(stream_id)):
            if offset > at_most:
                continue
            key = snapshot_key(stream_id, offset)
            try:
                snapshot = decode(await self._store.get(key))
            except ObjectNotFound:
                continue  # garbage-collected since the listing
            except SnapshotFormatError as exc:
                log.warning("skipping producer snapshot %s: %s", key, exc)
                continue
            if snapshot.stream_id != stream_id or snapshot.offset != offset:
                log.warning(
                    "skipping producer snapshot %s: it describes stream %d offset %d",
                    key,
                    snapshot.stream_id,
                    snapshot.offset,
                )
                continue
            if epochs is not None and not covers(snapshot, epochs):
                log.warning(
                    "skipping producer snapshot %s: written under epoch %d, but this log's epochs %r "
                    "differ below its offset (its writer was fenced with records nobody recovered)",
                    key,
                    snapshot.epoch,
                    epochs.entries,
                )
                continue
            return snapshot
        return None

    async def write(self, snapshot: ProducerSnapshot) -> None:
        await self._store.put(snapshot_key(snapshot.stream_id, snapshot.offset), encode(snapshot))

    async def collect(self, stream_id: int, keep: int = SNAPSHOTS_KEPT) -> int:
        """Delete all but the newest `keep` snapshots of the stream; returns how many went."""
        offsets = await self.offsets(stream_id)
        doomed = offsets[:-keep] if keep > 0 else offsets
        if doomed:
            await self._store.delete_many([snapshot_key(stream_id, o) for o in doomed])
        return len(doomed)

    async def delete_all(self, stream_id: int) -> None:
        await self.collect(stream_id, keep=0)


def covers(snapshot: ProducerSnapshot, epochs: LeaderEpochHistory) -> bool:
    """Whether the snapshot describes the log with these epochs: no epoch after its writer's
    starts below its offset. (A fenced writer's snapshot can cover records it appended after
    the fence, which the next owner's log does not hold; that owner's epoch starts lower.)"""
    if snapshot.epoch < 0:
        return True  # written before snapshots named their epoch
    # OffsetForLeaderEpoch's answer: where the writer's epoch ended in this log (the start of
    # the next one; the snapshot's own offset when it is the newest; -1 when it is unknown
    # and newer than anything this log holds)
    _epoch, end = epochs.end_offset_for(snapshot.epoch, snapshot.offset)
    return end >= snapshot.offset


def retained(entries: Iterable[ProducerEntry], log_start_offset: int) -> list[ProducerEntry]:
    """Producers whose newest batch is still in the log. Like Kafka on loading a snapshot:
    a producer whose data was all trimmed away (retention, DeleteRecords) may also have
    written batches in the trimmed part after the snapshot was taken, so its remembered
    sequence could be stale; forgetting it makes its next batch the new baseline instead
    of a false OUT_OF_ORDER_SEQUENCE_NUMBER."""
    out = []
    for entry in entries:
        offsets = [b.base_offset for b in entry.batches if b.base_offset is not None]
        if offsets and max(offsets) >= log_start_offset:
            out.append(entry)
    return out
