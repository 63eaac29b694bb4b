"""Expiry of idle producer state, durable across a coordinator or leader change: transactional
ids idle for transactional.id.expiration.ms (none open or completing) are tombstoned in
`__transaction_state`; idempotent producers idle for producer.id.expiration.ms are dropped from
a partition's state by the periodic sweep and stay dropped in its snapshots. Driven through the
real coordinator and handlers on real storage; the clock is passed in, so nothing waits."""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from automq.broker.config import ConfigError, parse_config
from automq.broker.kafka import codec, producer_recovery, records

FIND_COORDINATOR, INIT_PID, ADD_PARTS, END_TXN, DESCRIBE_TXNS = 10, 22, 24, 26, 65
MINUTE = datetime.timedelta(minutes=1)
DAY_MS = 24 * 3_600_000


async def eventually(probe, timeout: float = 30.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"not true within {timeout}s: {value!r}"
        await asyncio.sleep(0.05)


async def init(node, tid: str):
    async def probe():
        await node.call(FIND_COORDINATOR, 3, key=tid, key_type=1)  # creates __transaction_state
        r = await node.call(INIT_PID, 4, transactional_id=tid, transaction_timeout=MINUTE)
        return r if r.error_code == ErrorCode.none else None

    return await eventually(probe)


async def add(node, tid: str, pid: int, epoch: int, topic: str, index: int) -> ErrorCode:
    cls = codec.request_class(ADD_PARTS, 3)
    topic_cls = codec.nested(cls, "AddPartitionsToTxnTopic")
    r = await node.call(
        ADD_PARTS,
        3,
        v3_and_below_transactional_id=tid,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(codec.build(topic_cls, name=topic, partitions=(index,)),),
    )
    return r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code


async def described(node, tid: str) -> ErrorCode:
    r = await node.call(DESCRIBE_TXNS, 0, transactional_ids=(tid,))
    return r.transaction_states[0].error_code


async def test_idle_transactional_ids_expire_durably(cluster) -> None:
    n1 = await cluster.start_node(1, transaction_state_log_num_partitions=1)
    await n1.broker.ensure_topic("t", partitions=1)
    coordinator = n1.broker.transactions
    old = await init(n1, "old")
    assert await add(n1, "old", old.producer_id, old.producer_epoch, "t", 0) == ErrorCode.none
    r = await n1.call(
        END_TXN,
        3,
        transactional_id="old",
        producer_id=old.producer_id,
        producer_epoch=old.producer_epoch,
        committed=True,
    )
    assert r.error_code == ErrorCode.none
    await init(n1, "idle-open")
    await asyncio.sleep(0.01)  # the ids below were last used strictly later than "old"
    fresh = await init(n1, "fresh")
    opened = await init(n1, "open")
    assert await add(n1, "open", opened.producer_id, opened.producer_epoch, "t", 0) == ErrorCode.none
    cut = max(coordinator.describe(t).last_update_ms for t in ("old", "idle-open")) + coordinator.id_expiration_ms
    assert coordinator.describe("fresh").last_update_ms + coordinator.id_expiration_ms > cut

    first = min(md.last_update_ms for md in coordinator.txns.values())
    assert await coordinator.expire_ids(first + coordinator.id_expiration_ms - 1) == []  # none idle long enough yet
    assert sorted(await coordinator.expire_ids(cut)) == ["idle-open", "old"]
    # far later, an open transaction still keeps its id (its timeout aborts it first)
    assert await coordinator.expire_ids(cut + 10 * DAY_MS) == ["fresh"]
    assert coordinator.describe("open") is not None
    assert await described(n1, "old") == ErrorCode.transactional_id_not_found

    # durable: the coordinator's next leader replays the tombstones
    await cluster.start_node(2, transaction_state_log_num_partitions=1)
    await cluster.stop_node(1)
    n2 = cluster.nodes[2]

    async def loaded():
        return n2.broker.transactions.coordinator_error("open") is None

    await eventually(loaded)
    assert n2.broker.transactions.describe("old") is None
    assert n2.broker.transactions.describe("fresh") is None
    assert n2.broker.transactions.describe("open") is not None
    # an expired id starts afresh: a new producer id at epoch 0
    again = await init(n2, "old")
    assert again.producer_id != old.producer_id and again.producer_epoch == 0
    assert fresh.producer_id != again.producer_id


def idempotent_batch(pid: int, timestamp_ms: int, transactional: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=transactional,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=0,
        batch_size=1 << 20,
    )
    builder.append(0, timestamp=timestamp_ms, key=b"k", value=b"v", headers=[])
    return bytes(builder.build())


async def test_idle_idempotent_producers_expire_and_stay_expired_on_the_next_owner(cluster) -> None:
    n1 = await cluster.start_node(1, producer_id_expiration_ms=DAY_MS, transaction_partition_verification_enable=False)
    await n1.broker.ensure_topic("i", partitions=1)
    p = await n1.broker.partitions.get_when_open("i", 0, 30)
    now = int(time.time() * 1000)
    # producer 7 last wrote (CreateTime) more than a day ago, 8 just now; 9 as long ago as 7,
    # but inside a transaction still open here (Kafka never expires such a producer)
    for pid, ts, txn in ((7, now - DAY_MS - 60_000, False), (8, now, False), (9, now - DAY_MS - 60_000, True)):
        await p.append_batch(
            bytearray(idempotent_batch(pid, ts, txn)), records.parse_header(idempotent_batch(pid, ts, txn))
        )
    assert {e.producer_id for e in p.producer_state.entries()} == {7, 8, 9}
    assert producer_recovery.expire_producers(n1.broker.partitions.led(), now) == 1
    assert {e.producer_id for e in p.producer_state.entries()} == {8, 9}

    # the next owner (a move: snapshot at close, rebuild on open) does not bring 7 back
    await cluster.start_node(2, producer_id_expiration_ms=DAY_MS, transaction_partition_verification_enable=False)
    await cluster.stop_node(1)
    moved = await cluster.nodes[2].broker.partitions.get_when_open("i", 0, 30)
    assert moved.snapshot_offset == 3  # it started from the final snapshot, not a replay
    assert {e.producer_id for e in moved.producer_state.entries()} == {8, 9}
    assert moved.txns.ongoing == {9: 2}


def test_expiration_settings_must_be_positive_durations() -> None:
    """0 would forget every id right after InitProducerId: refused at start, naming the key."""
    for key in ("transactional_id_expiration_ms", "producer_id_expiration_ms"):
        with pytest.raises(ConfigError, match=f"kafka.{key}"):
            parse_config({"node_id": 1, "object_store_url": "file:///tmp/t", "kafka": {key: 0}})
    config = parse_config(
        {"node_id": 1, "object_store_url": "file:///tmp/t", "kafka": {"producer_id_expiration_ms": "90s"}}
    )
    assert config.kafka.producer_id_expiration_ms == 90_000
