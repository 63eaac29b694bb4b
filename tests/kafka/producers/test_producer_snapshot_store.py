"""Producer-state snapshots: the format (round trip, hostile bytes), the store (newest at or
below the end, fallbacks, garbage collection) and a partition that crashed: a new owner
recovers dedupe from the periodic snapshot plus the replayed tail, on a real storage engine
(volume WAL, file:// object store)."""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

import pytest

from automq.broker.config import NodeConfig
from automq.broker.controller.protocol import PartitionInfo, TopicInfo
from automq.broker.kafka import producer_recovery, records
from automq.broker.kafka.leader_epochs import LeaderEpochHistory
from automq.broker.kafka.partitions import Partition
from automq.broker.kafka.producer_snapshots import (
    ProducerSnapshot,
    ProducerSnapshotStore,
    SnapshotFormatError,
    covers,
    decode,
    encode,
    retained,
    snapshot_key,
)
from automq.broker.kafka.producers import ProducerEntry, ProducerStateManager, StoredBatch
from automq.broker.objectstore import open_object_store
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata


def _snapshot(stream_id: int = 7, offset: int = 100, epoch: int = -1) -> ProducerSnapshot:
    return ProducerSnapshot(
        stream_id,
        offset,
        [
            ProducerEntry(1, 3, [StoredBatch(0, 4, 10, 1_000), StoredBatch(5, 9, 20, 1_001)], 1_001, -1),
            ProducerEntry(2**40, 0, [StoredBatch(2**31 - 2, 1, 50, 2_000)], 2_000, -1),
        ],
        (55, 2_000),
        written_ms=123,
        epoch=epoch,
    )


def test_round_trip_keeps_every_field() -> None:
    got = decode(encode(_snapshot()))
    assert got == _snapshot()


def test_only_durable_batches_are_written() -> None:
    s = _snapshot()
    s.producers[0].batches.append(StoredBatch(10, 12, None, -1))  # pending: not durable yet
    assert decode(encode(s)).producers[0].batches == _snapshot().producers[0].batches


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1],  # truncated
        lambda b: b + b"\0",  # trailing bytes
        lambda b: b"XXXX" + b[4:],  # magic
        lambda b: b[:4] + struct.pack(">H", 99) + b[6:],  # version
        lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:],  # a flipped bit
        lambda b: b[:10],  # shorter than the header
    ],
)
def test_damaged_snapshots_are_refused(damage) -> None:
    with pytest.raises(SnapshotFormatError):
        decode(damage(encode(_snapshot())))


def test_producers_whose_data_was_trimmed_are_forgotten() -> None:
    entries = _snapshot().producers
    assert [e.producer_id for e in retained(entries, 21)] == [2**40]
    assert len(retained(entries, 20)) == 2


async def test_store_loads_the_newest_readable_snapshot_at_or_below_the_end(file_url: str) -> None:
    store = open_object_store(file_url)
    snapshots = ProducerSnapshotStore(store)
    for offset in (100, 200, 300):
        await snapshots.write(_snapshot(offset=offset))
    await snapshots.write(_snapshot(stream_id=70, offset=999))  # another stream, similar prefix
    assert await snapshots.offsets(7) == [100, 200, 300]
    assert (await snapshots.load_latest(7, 250)).offset == 200  # 300 describes data beyond the end
    await store.put(snapshot_key(7, 300), b"garbage")
    assert (await snapshots.load_latest(7, 1_000)).offset == 200  # the damaged newest is skipped
    assert await snapshots.load_latest(7, 99) is None
    assert await snapshots.collect(7) == 1
    assert await snapshots.offsets(7) == [200, 300]
    await snapshots.delete_all(7)
    assert await snapshots.offsets(7) == []
    assert await snapshots.offsets(70) == [999]
    await store.close()


async def test_a_snapshot_a_fenced_writer_took_past_the_next_epoch_s_start_is_skipped(file_url: str) -> None:
    """Epoch 6 wrote records up to 96 and snapshotted there after it was fenced, but its
    successor's log (epoch 7) starts at 94: records 94-95 exist only in the fenced writer's
    WAL. Its snapshot at 96 does not describe this log even once the log passes 96."""
    store = open_object_store(file_url)
    snapshots = ProducerSnapshotStore(store)
    await snapshots.write(_snapshot(offset=90, epoch=6))
    await snapshots.write(_snapshot(offset=96, epoch=6))
    epochs = LeaderEpochHistory([(5, 0), (6, 40), (7, 94)])
    assert not covers(_snapshot(offset=96, epoch=6), epochs)
    assert covers(_snapshot(offset=94, epoch=6), epochs)  # an owner's last snapshot at its end
    assert covers(_snapshot(offset=96, epoch=7), epochs)  # the current owner's own
    assert not covers(_snapshot(offset=96, epoch=8), epochs)  # a newer writer than this log knows
    assert covers(_snapshot(offset=96), epochs)  # a version 1 or 2 snapshot names no epoch
    assert (await snapshots.load_latest(7, 200, epochs)).offset == 90
    assert (await snapshots.load_latest(7, 200)).offset == 96  # without the history: newest at or below
    await snapshots.write(_snapshot(offset=150, epoch=7))
    assert (await snapshots.load_latest(7, 200, epochs)).offset == 150
    await store.close()


def _batch(count: int, pid: int = -1, seq: int = -1) -> tuple[bytearray, records.BatchHeader]:
    body = [records.encode_record(i, 0, None, b"v") for i in range(count)]
    now = int(time.time() * 1000)  # producers idle past producer.id.expiration.ms are forgotten on load
    data = records.build_batch(
        0,
        body,
        last_offset_delta=count - 1,
        base_timestamp=now,
        max_timestamp=now,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=seq,
    )
    return bytearray(data), records.parse_header(data)


async def test_a_crashed_leader_s_successor_dedupes_from_snapshot_plus_tail(
    tmp_path: Path, file_url: str, monkeypatch
) -> None:
    """No graceful close: the new owner has only the periodic snapshot and the log after it."""
    monkeypatch.setattr(producer_recovery, "PRODUCER_SNAPSHOT_INTERVAL_OFFSETS", 1_000)
    monkeypatch.setattr(producer_recovery, "PRODUCER_SNAPSHOT_MIN_INTERVAL_S", 0.0)
    config = NodeConfig(
        node_id=1,
        data_dir=str(tmp_path / "node"),
        object_store_url=file_url,
        wal={"capacity": 4 << 20},
        storage={"log_cache_bytes": 8 << 20, "block_cache_bytes": 4 << 20, "upload_interval_ms": 200},
    )
    store = open_object_store(file_url)
    metadata = InProcessMetadata(store)
    engine = StorageEngine(config, store, metadata, metadata, 1, await metadata.register_node(1))
    await engine.start()
    snapshots = ProducerSnapshotStore(store)
    stream_id = await engine.create_stream()
    topic = TopicInfo("t", "id", ())

    def partition(stream, epoch: int) -> Partition:
        return Partition(
            PartitionInfo("t", 0, stream_id, 1, epoch), topic, stream, ProducerStateManager(), None, snapshots
        )

    old = partition(await engine.open_stream(stream_id, 0), 0)
    await old.rebuild_producer_state()
    watched = _batch(5, pid=77, seq=0)
    first = await old.append_batch(bytearray(watched[0]), watched[1])
    assert first.base_offset == 0
    for _ in range(25):  # 2,500 records after it: snapshots at ~1,000 and ~2,000, then a tail
        await old.append_batch(*_batch(100))
    while old.snapshots.task is not None:
        await old.snapshots.task
    assert old.snapshot_offset >= 1_000
    assert await snapshots.offsets(stream_id), "no periodic snapshot was written"
    end = old.log_end_offset

    # the leader dies without closing anything; the next owner opens the stream under a new epoch
    new = partition(await engine.open_stream(stream_id, 1), 1)
    await new.rebuild_producer_state()
    assert new.snapshot_offset >= 1_000  # it started from a snapshot, not from offset 0
    retry = await new.append_batch(bytearray(watched[0]), watched[1])
    assert retry.duplicate and retry.base_offset == 0
    assert new.log_end_offset == end
    nxt = _batch(2, pid=77, seq=5)
    assert (await new.append_batch(*nxt)).base_offset == end
    await new.close()
    assert await snapshots.offsets(stream_id) == sorted(await snapshots.offsets(stream_id))[-2:]
    assert (await snapshots.offsets(stream_id))[-1] == end + 2  # the final snapshot at close
    await engine.close()
    await store.close()


async def _engine(tmp_path: Path, file_url: str):
    config = NodeConfig(
        node_id=1,
        data_dir=str(tmp_path / "node"),
        object_store_url=file_url,
        wal={"capacity": 4 << 20},
        storage={"log_cache_bytes": 8 << 20, "block_cache_bytes": 4 << 20, "upload_interval_ms": 200},
    )
    store = open_object_store(file_url)
    metadata = InProcessMetadata(store)
    engine = StorageEngine(config, store, metadata, metadata, 1, await metadata.register_node(1))
    await engine.start()
    return engine, store


async def test_snapshot_never_covers_an_append_still_in_flight(tmp_path: Path, file_url: str) -> None:
    engine, store = await _engine(tmp_path, file_url)
    stream_id = await engine.create_stream()
    p = Partition(
        PartitionInfo("t", 0, stream_id, 1, 0),
        TopicInfo("t", "id", ()),
        await engine.open_stream(stream_id, 0),
        ProducerStateManager(),
        None,
        ProducerSnapshotStore(store),
    )
    await p.append_batch(*_batch(10, pid=5, seq=0))
    pending = asyncio.ensure_future(p.append_batch(*_batch(10, pid=5, seq=10)))
    await asyncio.sleep(0)  # the append reserved offsets 10..19 and waits for the WAL
    assert p.snapshots.safe_offset() <= 10
    assert await p.write_snapshot() == 10
    await pending
    assert await p.write_snapshot() == 20
    snapshot = await ProducerSnapshotStore(store).load_latest(stream_id, 20)
    assert [(b.first_seq, b.base_offset) for b in snapshot.producers[0].batches] == [(0, 0), (10, 10)]
    await p.close()
    await engine.close()
    await store.close()


async def test_idle_producers_expire_on_load(tmp_path: Path, file_url: str) -> None:
    """producer.id.expiration.ms applies to the loaded state, by the last batch timestamp."""
    engine, store = await _engine(tmp_path, file_url)
    snapshots = ProducerSnapshotStore(store)
    stream_id = await engine.create_stream()
    topic = TopicInfo("t", "id", ())

    def partition(stream, epoch: int) -> Partition:
        state = ProducerStateManager(producer_id_expiration_ms=3_600_000)
        return Partition(PartitionInfo("t", 0, stream_id, 1, epoch), topic, stream, state, None, snapshots)

    old = partition(await engine.open_stream(stream_id, 0), 0)
    two_hours_ago = int(time.time() * 1000) - 2 * 3_600_000
    idle = bytearray(
        records.build_batch(
            0,
            [records.encode_record(i, 0, None, b"v") for i in range(3)],
            last_offset_delta=2,
            base_timestamp=two_hours_ago,
            max_timestamp=two_hours_ago,
            producer_id=1,
            producer_epoch=0,
            base_sequence=0,
        )
    )
    await old.append_batch(idle, records.parse_header(idle))
    await old.append_batch(*_batch(3, pid=2, seq=0))
    await old.close()  # final snapshot
    new = partition(await engine.open_stream(stream_id, 1), 1)
    await new.rebuild_producer_state()
    assert new.snapshot_offset == 6
    assert new.producer_state.entry(1) is None
    assert new.producer_state.entry(2) is not None
    await new.close()
    await engine.close()
    await store.close()
