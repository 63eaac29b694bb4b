"""The window a broker kill only sometimes hits, made deterministic: the coordinator has decided
to commit (PrepareCommit durable) and written the marker into the partition it leads, but the
marker for the other broker's partition has not got through, and then the coordinator goes.
Two real brokers (BrokerService with Kafka listeners, controller, file:// store); the marker
channel to the other broker is cut by replacing its send with one that fails as an unreachable
broker does.

Meanwhile the transaction is never visible as aborted anywhere: the unmarked partition holds its
last stable offset below the transaction's data (read_committed readers wait). The next
coordinator replays PrepareCommit and writes the missing COMMIT marker: the transaction ends
committed in every partition, none of its data among the aborted ranges."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec, handlers
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.groups.state import partition_for

PRODUCE, INIT_PID, ADD_PARTS, END_TXN = 0, 22, 24, 26
TXN_TOPIC = "__transaction_state"
TID = "decided-tx"


async def call(broker: Any, api_key: int, version: int, **fields: Any) -> Any:
    request = codec.build(codec.request_class(api_key, version), **fields)
    ctx = RequestContext(
        api_key, version, 1, "test-client", "127.0.0.1:5555", codec.response_class(api_key, version), broker
    )
    registration = handlers.lookup(api_key)
    assert registration is not None
    return await registration.handler(request, ctx)


def txn_batch(pid: int, epoch: int, sequence: int, count: int = 3) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
        batch_size=1 << 20,
    )
    for i in range(count):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=b"v", headers=[])
    return bytes(builder.build())


async def produce(broker: Any, index: int, batch: bytes) -> Any:
    cls = codec.request_class(PRODUCE, 9)
    topic_cls = codec.nested(cls, "TopicProduceData")
    part_cls = codec.nested(cls, "PartitionProduceData")
    r = await call(
        broker,
        PRODUCE,
        9,
        transactional_id=TID,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            codec.build(topic_cls, name="t", partition_data=(codec.build(part_cls, index=index, records=batch),)),
        ),
    )
    return r.responses[0].partition_responses[0]


async def eventually(probe, timeout: float = 60.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"not true within {timeout}s: {value!r}"
        await asyncio.sleep(0.05)


async def test_a_decided_commit_completes_on_the_next_coordinator(real_cluster) -> None:
    services = {n: await real_cluster.start_broker(n, transaction_state_log_num_partitions=1) for n in (1, 2)}
    brokers = {n: s.broker for n, s in services.items()}
    await brokers[1].ensure_topic("t", partitions=4)
    await brokers[1].ensure_topic(TXN_TOPIC, partitions=1)

    async def placed():
        for b in brokers.values():
            for name, n in (("t", 4), (TXN_TOPIC, 1)):
                info = b.partitions.topic(name)
                if info is None or len(info.partitions) != n or any(p.leader < 0 for p in info.partitions):
                    return None
        return True

    await eventually(placed)
    assert partition_for(TID, 1) == 0

    async def init():
        for node_id, b in brokers.items():
            r = await call(b, INIT_PID, 4, transactional_id=TID, transaction_timeout=datetime.timedelta(minutes=1))
            if r.error_code == ErrorCode.none:
                return node_id, r.producer_id, r.producer_epoch
        return None

    coordinator_id, pid, epoch = await eventually(init)
    coordinator = brokers[coordinator_id]
    other_id = next(n for n in brokers if n != coordinator_id)

    def leader(index: int) -> int:
        found = coordinator.leader_of("t", index)
        assert found is not None
        return found[0]

    local = next(i for i in range(4) if leader(i) == coordinator_id)
    remote = next(i for i in range(4) if leader(i) == other_id)

    cls = codec.request_class(ADD_PARTS, 3)
    topic_cls = codec.nested(cls, "AddPartitionsToTxnTopic")
    r = await call(
        coordinator,
        ADD_PARTS,
        3,
        v3_and_below_transactional_id=TID,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(codec.build(topic_cls, name="t", partitions=(local, remote)),),
    )
    assert {p.partition_error_code for t in r.results_by_topic_v3_and_below for p in t.results_by_partition} == {
        ErrorCode.none
    }
    for index in (local, remote):
        answer = await produce(brokers[leader(index)], index, txn_batch(pid, epoch, 0))
        assert answer.error_code == ErrorCode.none, index

    # the marker channel to the other broker is cut: it fails as an unreachable broker does
    cut: list[list[tuple[str, int]]] = []

    async def unreachable(host, port, partitions, *args, **kwargs):
        cut.append(list(partitions))
        return dict.fromkeys(partitions, ErrorCode.not_leader_or_follower)

    coordinator.transactions._channel.send = unreachable
    r = await call(coordinator, END_TXN, 3, transactional_id=TID, producer_id=pid, producer_epoch=epoch, committed=True)
    assert r.error_code == ErrorCode.none  # decided; EndTxn stops waiting for the markers after its bound
    assert cut and all(parts == [("t", remote)] for parts in cut)

    committed_here = await coordinator.partitions.get_when_open("t", local, 30)
    assert committed_here.last_stable_offset == committed_here.high_watermark
    assert committed_here.aborted_transactions(0, committed_here.high_watermark) == []
    waiting = await brokers[other_id].partitions.get_when_open("t", remote, 30)
    assert waiting.last_stable_offset == 0 < waiting.high_watermark  # held back, not shown, not aborted
    assert waiting.aborted_transactions(0, waiting.high_watermark) == []

    await real_cluster.stop_broker(coordinator_id)  # the coordinator goes with its decision half delivered
    survivor = brokers[other_id]

    async def completed():
        for index in (local, remote):
            p = await survivor.partitions.get_when_open("t", index, 30)
            if p.last_stable_offset != p.high_watermark:
                return None
        return True

    await eventually(completed)
    for index in (local, remote):
        p = await survivor.partitions.get_when_open("t", index, 30)
        assert p.aborted_transactions(0, p.high_watermark) == [], index  # committed: nothing dropped
        assert p.txns.ongoing.get(pid) is None
    md = survivor.transactions.describe(TID)
    assert md is not None and md.state.name == "COMPLETE_COMMIT", md
