"""Transactions as a partition sees them: open transactions hold the last stable offset back,
markers close them, aborted ranges are reported for read_committed fetches, and all of it
survives a new owner (snapshot + replayed tail, or the whole log) on a real storage engine
(volume WAL, file:// object store). Plus the pure pieces: txn_state, the marker batch, the
__transaction_state records and the coordinator's EndTxn rules."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from automq.broker.config import NodeConfig
from automq.broker.controller.protocol import PartitionInfo, TopicInfo
from automq.broker.kafka import records
from automq.broker.kafka.partitions import Partition
from automq.broker.kafka.producer_snapshots import ProducerSnapshot, ProducerSnapshotStore, decode, encode
from automq.broker.kafka.producers import ProducerStateError, ProducerStateManager
from automq.broker.kafka.transactions.log import TxnKey, TxnValue
from automq.broker.kafka.transactions.state import TxnMetadata, TxnState, check_producer, end_txn_answer
from automq.broker.kafka.txn_state import AbortedTxn, PartitionTxnState, TxnSnapshotState
from automq.broker.objectstore import open_object_store
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata

# ---------------------------------------------------------------- pure pieces


def test_lso_is_the_oldest_open_transaction_and_markers_close_them() -> None:
    s = PartitionTxnState()
    assert s.last_stable_offset(10) == 10
    assert s.on_data(1, 10) and not s.on_data(1, 12)  # the first batch opens it, later ones join
    s.on_data(2, 11)
    assert s.last_stable_offset(20) == 10
    s.on_marker(1, commit=False, marker_offset=20)
    assert s.last_stable_offset(21) == 11
    s.on_marker(2, commit=True, marker_offset=21)
    assert s.last_stable_offset(22) == 22
    assert s.aborted == [AbortedTxn(1, 10, 20)]  # commits leave no range
    # a fetch must hear about the range if it overlaps it at all
    assert s.aborted_between(0, 11) == [AbortedTxn(1, 10, 20)]
    assert s.aborted_between(20, 30) == [AbortedTxn(1, 10, 20)]
    assert s.aborted_between(21, 30) == [] and s.aborted_between(0, 10) == []
    s.prune(21)
    assert s.aborted == []


def test_state_at_an_offset_reopens_what_a_later_marker_closed() -> None:
    s = PartitionTxnState()
    s.on_data(1, 5)
    s.on_data(2, 6)
    s.on_marker(1, commit=False, marker_offset=8)
    s.on_marker(2, commit=True, marker_offset=12)
    at = s.at(10)
    assert at.ongoing == {2: 6}  # its marker (12) is after the snapshot's offset
    assert at.aborted == [AbortedTxn(1, 5, 8)]
    s.snapshot_written(10)
    assert s.at(10).ongoing == {2: 6}  # markers at/after the snapshot are still remembered


def test_undone_marker_reopens_the_transaction() -> None:
    s = PartitionTxnState()
    s.on_data(1, 5)
    s.on_marker(1, commit=False, marker_offset=9)
    s.undo_marker(1, 5, 9)
    assert s.ongoing == {1: 5} and s.aborted == []


def test_control_batch_round_trip() -> None:
    batch = records.control_batch(42, 3, True, 7, 1_000)
    header = records.parse_header(batch)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.record_count) == (42, 3, 1)
    assert records.control_type(batch) == records.CONTROL_COMMIT
    assert records.control_type(records.control_batch(42, 3, False, 7, 1_000)) == records.CONTROL_ABORT
    plain = records.build_batch(
        0, [records.encode_record(0, 0, None, b"v")], last_offset_delta=0, base_timestamp=0, max_timestamp=0
    )
    assert records.control_type(plain) is None


def test_snapshot_keeps_transactions_and_versions_1_and_2_still_read() -> None:
    import struct

    import crc32c

    txns = TxnSnapshotState({7: 100}, [AbortedTxn(8, 50, 60)])
    snap = ProducerSnapshot(1, 120, [], None, written_ms=5, transactions=txns, epoch=4)
    assert decode(encode(snap)) == snap
    # versions 1 (before transactions) and 2 (before the writer epoch): the same bytes without
    # the two empty transaction counts and the epoch, or without the epoch; read as epoch -1
    empty = ProducerSnapshot(1, 120, [], None, written_ms=5, epoch=4)
    v3 = bytes(encode(empty))
    for version, body in ((1, v3[12:-12]), (2, v3[12:-4])):
        old = struct.pack(">4sHHI", b"AQPS", version, 0, crc32c.crc32c(body)) + body
        assert decode(old) == ProducerSnapshot(1, 120, [], None, written_ms=5, epoch=-1)


def test_transaction_log_records_round_trip() -> None:
    value = TxnValue(9, 2, 60_000, int(TxnState.ONGOING), (("a", 0), ("a", 3), ("b", 1)), 10, 5)
    assert TxnValue.decode(value.encode()) == value
    assert TxnKey.decode(TxnKey("tid").encode()) == TxnKey("tid")


@pytest.mark.parametrize(
    ("state", "commit", "answer", "prepare"),
    [
        (TxnState.ONGOING, True, None, TxnState.PREPARE_COMMIT),
        (TxnState.ONGOING, False, None, TxnState.PREPARE_ABORT),
        (TxnState.PREPARE_COMMIT, True, ErrorCode.concurrent_transactions, None),
        (TxnState.PREPARE_COMMIT, False, ErrorCode.invalid_txn_state, None),
        (TxnState.COMPLETE_COMMIT, True, ErrorCode.none, None),  # a retried commit
        (TxnState.COMPLETE_ABORT, True, ErrorCode.invalid_txn_state, None),
        (TxnState.EMPTY, True, ErrorCode.invalid_txn_state, None),
    ],
)
def test_end_txn_rules(state, commit, answer, prepare) -> None:
    md = TxnMetadata("t", 1, 0, 1_000, state)
    assert end_txn_answer(md, commit) == (answer, prepare)


def test_producer_checks() -> None:
    md = TxnMetadata("t", 1, 4, 1_000, TxnState.ONGOING)
    assert check_producer(None, 1, 4) == ErrorCode.invalid_producer_id_mapping
    assert check_producer(md, 2, 4) == ErrorCode.invalid_producer_id_mapping
    assert check_producer(md, 1, 3) == ErrorCode.producer_fenced
    assert check_producer(md, 1, 4) is None


def test_a_marker_with_an_older_epoch_is_refused_and_a_newer_one_fences() -> None:
    state = ProducerStateManager()
    state.record(5, 2, 0, 3, 0, 1)
    with pytest.raises(ProducerStateError) as info:
        state.check_marker(5, 1)
    assert info.value.error_code == ErrorCode.invalid_producer_epoch
    state.check_marker(5, 3)
    state.record_marker(5, 3, 2)
    with pytest.raises(ProducerStateError) as info:
        state.check(5, 2, 3, 1)  # the old epoch's next batch: a zombie
    assert info.value.error_code == ErrorCode.invalid_producer_epoch


# ---------------------------------------------------------------- a partition on real storage


def _txn_batch(count: int, pid: int, epoch: int, seq: int) -> tuple[bytearray, records.BatchHeader]:
    now = int(time.time() * 1000)
    data = records.build_batch(
        0,
        [records.encode_record(i, 0, None, b"v") for i in range(count)],
        last_offset_delta=count - 1,
        base_timestamp=now,
        max_timestamp=now,
        attributes=records.TRANSACTIONAL_BIT,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )
    return bytearray(data), records.parse_header(data)


def _plain(count: int) -> tuple[bytearray, records.BatchHeader]:
    data = records.build_batch(
        0,
        [records.encode_record(i, 0, None, b"v") for i in range(count)],
        last_offset_delta=count - 1,
        base_timestamp=0,
        max_timestamp=0,
    )
    return bytearray(data), records.parse_header(data)


@pytest.mark.parametrize("snapshot_first", [True, False], ids=["from-snapshot", "from-log"])
async def test_transactions_survive_a_new_owner(tmp_path: Path, file_url: str, snapshot_first: bool) -> None:
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
    await old.append_batch(*_txn_batch(3, pid=1, epoch=0, seq=0))  # 0..2, aborted below
    await old.append_batch(*_plain(2))  # 3..4
    await old.append_batch(*_txn_batch(2, pid=2, epoch=0, seq=0))  # 5..6, left open
    assert old.last_stable_offset == 0
    assert await old.append_marker(1, 0, False, 0) == 7
    assert old.last_stable_offset == 5
    if snapshot_first:
        assert await old.write_snapshot() == 8
    await old.append_batch(*_txn_batch(2, pid=3, epoch=0, seq=0))  # 8..9
    assert await old.append_marker(3, 0, True, 0) == 10
    assert old.high_watermark == 11 and old.last_stable_offset == 5
    assert old.aborted_transactions(0, 11) == [AbortedTxn(1, 0, 7)]

    # the leader dies without closing; the next owner has the snapshot (or not) and the log
    new = partition(await engine.open_stream(stream_id, 1), 1)
    await new.rebuild_producer_state()
    assert new.snapshot_offset == (8 if snapshot_first else -1)
    assert new.txns.ongoing == {2: 5}
    assert new.last_stable_offset == 5
    assert new.aborted_transactions(0, 11) == [AbortedTxn(1, 0, 7)]
    # a zombie batch of an epoch older than a marker's is refused
    await new.append_marker(2, 1, False, 1)  # the coordinator fenced producer 2 (epoch 1)
    assert new.last_stable_offset == new.high_watermark == 12
    with pytest.raises(ProducerStateError):
        await new.append_batch(*_txn_batch(1, pid=2, epoch=0, seq=2))
    assert new.aborted_transactions(8, 12) == [AbortedTxn(2, 5, 11)]
    await new.close()
    await engine.close()
    await store.close()
