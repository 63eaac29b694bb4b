"""KIP-890 part 1, server-side transaction verification, on two real brokers (BrokerService with
its Kafka listener, so a partition leader asks a coordinator on the other broker over the wire):
a transactional batch for a partition that is not in the producer's transaction is refused with
Kafka's error for the Produce version and nothing is appended; a batch verified before an abort
marker cannot open a transaction after it (the hanging transaction KIP-890 prevents); Produce v12
adds the partition itself; well-behaved producers pay one verification per transaction and
partition, not per batch."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from txn_requests import call, produce, txn_batch  # tests/support

from automq.broker.kafka import codec, handlers, records
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.groups.state import partition_for
from automq.broker.kafka.producers import ProducerStateError

PRODUCE, INIT_PID, ADD_PARTS, ADD_OFFSETS, END_TXN, TXN_COMMIT = 0, 22, 24, 25, 26, 28
TXN_TOPIC = "__transaction_state"
MINUTE = datetime.timedelta(minutes=1)


async def add_partitions(broker: Any, tid: str, pid: int, epoch: int, tps: list[tuple[str, int]]) -> set[ErrorCode]:
    cls = codec.request_class(ADD_PARTS, 3)
    topic_cls = codec.nested(cls, "AddPartitionsToTxnTopic")
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(p)
    r = await call(
        broker,
        ADD_PARTS,
        3,
        v3_and_below_transactional_id=tid,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=tuple(codec.build(topic_cls, name=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
    )
    return {p.partition_error_code for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}


async def eventually(probe, timeout: float = 30.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"not true within {timeout}s: {value!r}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def two_brokers(real_cluster):
    b1 = await real_cluster.start_broker(1, transaction_state_log_num_partitions=1)
    b2 = await real_cluster.start_broker(2, transaction_state_log_num_partitions=1)
    brokers = {1: b1.broker, 2: b2.broker}
    await b1.broker.ensure_topic("t", partitions=4)
    await b1.broker.ensure_topic(TXN_TOPIC, partitions=1)

    async def placed():
        for b in brokers.values():
            for name, n in (("t", 4), (TXN_TOPIC, 1)):
                info = b.partitions.topic(name)
                if info is None or len(info.partitions) != n or any(p.leader < 0 for p in info.partitions):
                    return None
        return True

    await eventually(placed)
    return brokers


async def coordinated(brokers: dict[int, Any], tid: str) -> tuple[Any, int, int]:
    """(the coordinator's broker, producer id, epoch) after InitProducerId."""
    assert partition_for(tid, 1) == 0

    async def init():
        for b in brokers.values():
            r = await call(b, INIT_PID, 4, transactional_id=tid, transaction_timeout=MINUTE)
            if r.error_code == ErrorCode.none:
                return b, r.producer_id, r.producer_epoch
        return None

    return await eventually(init)


def leader_broker(brokers: dict[int, Any], index: int) -> Any:
    leader = next(iter(brokers.values())).leader_of("t", index)
    assert leader is not None
    return brokers[leader[0]]


async def led(broker: Any, index: int) -> Any:
    return await broker.partitions.get_when_open("t", index, 30)


async def test_batch_outside_the_transaction_is_refused_with_kafka_errors(two_brokers) -> None:
    brokers = two_brokers
    coordinator, pid, epoch = await coordinated(brokers, "v-tx")
    # partitions led by the coordinator's broker (asked locally) and by the other (over the wire)
    local = [i for i in range(4) if leader_broker(brokers, i) is coordinator]
    remote = [i for i in range(4) if leader_broker(brokers, i) is not coordinator]
    assert local and remote, "the four partitions should spread over both brokers"
    for index in (local[0], remote[0]):
        broker = leader_broker(brokers, index)
        p = await led(broker, index)
        before = p.high_watermark
        asked = broker.txn_verifier.verifications
        # not added to any transaction: refused, the error depending on the client's version
        for version, error in ((9, ErrorCode.invalid_txn_state), (11, ErrorCode.transaction_abortable)):
            r = await produce(broker, version, "v-tx", "t", index, txn_batch(pid, epoch, 0))
            assert r.error_code == error, (index, version)
            assert r.error_message == "Partition was not added to the transaction"
        # a stale epoch: the producer is fenced
        r = await produce(broker, 9, "v-tx", "t", index, txn_batch(pid, epoch - 1 if epoch else 0, 0))
        if epoch:
            assert r.error_code == ErrorCode.invalid_producer_epoch
        # a transactional batch without the request's transactional id (Kafka refuses it so)
        r = await produce(broker, 9, None, "t", index, txn_batch(pid, epoch, 0))
        assert r.error_code == ErrorCode.transactional_id_authorization_failed
        assert p.high_watermark == before  # nothing was appended ...
        assert p.last_stable_offset == p.high_watermark  # ... and no transaction hangs
        assert not p.txns.verifying  # no guard left behind by the refusals
        assert broker.txn_verifier.verifications > asked
        refused = broker.registry.get_sample_value("kafka_txn_verifications_total", {"result": "not_in_transaction"})
        assert refused is not None and refused >= 2  # operators see the refusals

    # added first, as every client does: accepted, and verified once per partition only
    tps = [("t", local[0]), ("t", remote[0])]
    assert await add_partitions(coordinator, "v-tx", pid, epoch, tps) == {ErrorCode.none}
    for index in (local[0], remote[0]):
        broker = leader_broker(brokers, index)
        asked = broker.txn_verifier.verifications
        r = await produce(broker, 9, "v-tx", "t", index, txn_batch(pid, epoch, 0))
        assert r.error_code == ErrorCode.none
        assert broker.txn_verifier.verifications == asked + 1
        r = await produce(broker, 9, "v-tx", "t", index, txn_batch(pid, epoch, 2))
        assert r.error_code == ErrorCode.none
        assert broker.txn_verifier.verifications == asked + 1  # the transaction is open here now
        p = await led(broker, index)
        assert p.last_stable_offset < p.high_watermark
    r = await call(
        coordinator, END_TXN, 3, transactional_id="v-tx", producer_id=pid, producer_epoch=epoch, committed=True
    )
    assert r.error_code == ErrorCode.none
    for index in (local[0], remote[0]):
        p = await led(leader_broker(brokers, index), index)
        assert p.last_stable_offset == p.high_watermark


async def test_a_batch_verified_before_the_abort_marker_cannot_open_a_transaction_after_it(two_brokers) -> None:
    """The race KIP-890 closes: the coordinator said yes, then the transaction was aborted (its
    marker written here) before the batch reached the log. Appending it would open a
    transaction no marker ever closes."""
    brokers = two_brokers
    _, pid, epoch = await coordinated(brokers, "race-tx")
    broker = leader_broker(brokers, 0)
    p = await led(broker, 0)
    batch = bytearray(txn_batch(pid, epoch, 0))
    header = records.parse_header(batch)
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    append = broker.txn_verifier.append(p, batch, header, answer, 9)
    await asyncio.sleep(0)
    await p.append_marker(pid, epoch, False, 0)  # the abort overtakes the verified batch
    answer.set_result({("t", 0): ErrorCode.none})
    with pytest.raises(ProducerStateError) as refused:
        await append
    assert refused.value.error_code == ErrorCode.invalid_txn_state
    assert p.txns.ongoing == {}
    assert p.last_stable_offset == p.high_watermark

    # without the marker in between, the verified batch opens the transaction as usual
    answer = asyncio.get_running_loop().create_future()
    append = broker.txn_verifier.append(p, bytearray(batch), header, answer, 9)
    answer.set_result({("t", 0): ErrorCode.none})
    await append
    assert pid in p.txns.ongoing and not p.txns.verifying


async def test_produce_v12_adds_the_partition_itself(two_brokers) -> None:
    """KIP-890 part 2's Produce v12: the producer sends no AddPartitionsToTxn; the partition
    leader has the coordinator add the partition, so EndTxn still writes its marker there."""
    brokers = two_brokers
    coordinator, pid, epoch = await coordinated(brokers, "v12-tx")
    for index in range(2):
        broker = leader_broker(brokers, index)
        r = await produce(broker, 12, "v12-tx", "t", index, txn_batch(pid, epoch, 0))
        assert r.error_code == ErrorCode.none, index
    md = coordinator.transactions.describe("v12-tx")
    assert md is not None and md.partitions == frozenset({("t", 0), ("t", 1)})
    r = await call(
        coordinator, END_TXN, 3, transactional_id="v12-tx", producer_id=pid, producer_epoch=epoch, committed=False
    )
    assert r.error_code == ErrorCode.none
    for index in range(2):
        p = await led(leader_broker(brokers, index), index)
        assert p.last_stable_offset == p.high_watermark
        assert [a.producer_id for a in p.aborted_transactions(0, p.high_watermark)] == [pid]


async def test_add_partitions_v4_and_v5_verify_only_answers(two_brokers) -> None:
    brokers = two_brokers
    coordinator, pid, epoch = await coordinated(brokers, "vo-tx")
    assert await add_partitions(coordinator, "vo-tx", pid, epoch, [("t", 0)]) == {ErrorCode.none}
    for version, missing in ((4, ErrorCode.invalid_txn_state), (5, ErrorCode.transaction_abortable)):
        cls = codec.request_class(ADD_PARTS, version)
        txn_cls = codec.nested(cls, "AddPartitionsToTxnTransaction")
        topic_cls = codec.nested(cls, "AddPartitionsToTxnTopic")
        r = await call(
            coordinator,
            ADD_PARTS,
            version,
            transactions=(
                codec.build(
                    txn_cls,
                    transactional_id="vo-tx",
                    producer_id=pid,
                    producer_epoch=epoch,
                    verify_only=True,
                    topics=(codec.build(topic_cls, name="t", partitions=(0, 1)),),
                ),
            ),
        )
        errors = {
            (t.name, p.partition_index): p.partition_error_code
            for t in r.results_by_transaction[0].topic_results
            for p in t.results_by_partition
        }
        assert errors == {("t", 0): ErrorCode.none, ("t", 1): missing}, version
    md = coordinator.transactions.describe("vo-tx")
    assert md is not None and md.partitions == frozenset({("t", 0)})  # verify_only added nothing


async def test_verification_can_be_turned_off(real_cluster) -> None:
    """transaction.partition.verification.enable=false: the pre-KIP-890 behaviour."""
    service = await real_cluster.start_broker(1, transaction_partition_verification_enable=False)
    broker = service.broker
    await broker.ensure_topic("t", partitions=1)
    p = await led(broker, 0)
    r = await produce(broker, 9, "off-tx", "t", 0, txn_batch(4242, 0, 0))
    assert r.error_code == ErrorCode.none
    assert broker.txn_verifier.verifications == 0
    assert p.last_stable_offset < p.high_watermark  # a transaction no coordinator knows: it hangs


async def test_txn_offset_commit_outside_the_transaction_is_refused(two_brokers) -> None:
    """TxnOffsetCommit without AddOffsetsToTxn: the group coordinator asks the transaction
    coordinator first and writes nothing (no pending offsets that would hold back
    require_stable fetches for good)."""
    brokers = two_brokers
    coordinator, pid, epoch = await coordinated(brokers, "o-tx")
    for b in brokers.values():
        await call(b, 10, 3, key="og", key_type=0)  # creates __consumer_offsets

    async def group_coordinator():
        return next((b for b in brokers.values() if b.groups.coordinator_error("og") is None), None)

    group_broker = await eventually(group_coordinator)

    async def commit(version: int) -> ErrorCode:
        cls = codec.request_class(TXN_COMMIT, version)
        part = codec.nested(cls, "TxnOffsetCommitRequestPartition")
        topic = codec.nested(cls, "TxnOffsetCommitRequestTopic")
        r = await call(
            group_broker,
            TXN_COMMIT,
            version,
            transactional_id="o-tx",
            group_id="og",
            producer_id=pid,
            producer_epoch=epoch,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=(
                codec.build(
                    topic,
                    name="t",
                    partitions=(
                        codec.build(
                            part,
                            partition_index=0,
                            committed_offset=5,
                            committed_leader_epoch=-1,
                            committed_metadata="",
                        ),
                    ),
                ),
            ),
        )
        return r.topics[0].partitions[0].error_code

    assert await commit(3) == ErrorCode.invalid_txn_state
    assert await commit(4) == ErrorCode.transaction_abortable
    offsets = await group_broker.partitions.get_when_open(
        "__consumer_offsets", group_broker.groups.partition_for("og"), 30
    )
    assert pid not in offsets.txns.ongoing and not offsets.txns.verifying
    r = await call(
        coordinator, ADD_OFFSETS, 3, transactional_id="o-tx", producer_id=pid, producer_epoch=epoch, group_id="og"
    )
    assert r.error_code == ErrorCode.none
    assert await commit(3) == ErrorCode.none
    assert pid in offsets.txns.ongoing


async def test_broker_verification_needs_cluster_action_only(two_brokers) -> None:
    """With an authorizer: AddPartitionsToTxn v4+ is a broker's request, allowed by CLUSTER_ACTION
    alone (the asking broker checked the producer's own rights); a client principal without it
    gets CLUSTER_AUTHORIZATION_FAILED, as from Kafka."""
    from automq.broker.config import KafkaConfig
    from automq.broker.controller.acls import AclBinding, AclOperation, PatternType, PermissionType, ResourceType
    from automq.broker.kafka.authorizer import Authorizer

    brokers = two_brokers
    coordinator, pid, epoch = await coordinated(brokers, "acl-tx")
    assert await add_partitions(coordinator, "acl-tx", pid, epoch, [("t", 0)]) == {ErrorCode.none}
    authorizer = Authorizer(KafkaConfig(authorizer_class_name="standard"))
    authorizer.update(
        (
            AclBinding(
                int(ResourceType.CLUSTER),
                "kafka-cluster",
                int(PatternType.LITERAL),
                "User:broker",
                "*",
                int(AclOperation.CLUSTER_ACTION),
                int(PermissionType.ALLOW),
            ),
        )
    )
    cls = codec.request_class(ADD_PARTS, 5)
    txn_cls = codec.nested(cls, "AddPartitionsToTxnTransaction")
    topic_cls = codec.nested(cls, "AddPartitionsToTxnTopic")
    request = codec.build(
        cls,
        transactions=(
            codec.build(
                txn_cls,
                transactional_id="acl-tx",
                producer_id=pid,
                producer_epoch=epoch,
                verify_only=True,
                topics=(codec.build(topic_cls, name="t", partitions=(0, 1)),),
            ),
        ),
    )
    handler = handlers.lookup(ADD_PARTS)
    assert handler is not None
    answers = {}
    coordinator.authorizer = authorizer
    try:
        for principal in ("User:broker", "User:client"):
            ctx = RequestContext(
                ADD_PARTS, 5, 1, "test-client", "127.0.0.1:5555", codec.response_class(ADD_PARTS, 5), coordinator
            )
            ctx.principal = principal
            answers[principal] = await handler.handler(request, ctx)
    finally:
        coordinator.authorizer = None
    r = answers["User:broker"]
    assert r.error_code == ErrorCode.none
    assert {
        (t.name, p.partition_index): p.partition_error_code
        for t in r.results_by_transaction[0].topic_results
        for p in t.results_by_partition
    } == {("t", 0): ErrorCode.none, ("t", 1): ErrorCode.transaction_abortable}
    assert answers["User:client"].error_code == ErrorCode.cluster_authorization_failed


async def test_a_hanging_transaction_is_found_and_aborted_as_kafka_tools_do(real_cluster) -> None:
    """The operator's way out for a transaction no coordinator will end (written with
    verification off, or by an old broker): `kafka-transactions.sh find-hanging` reads
    DescribeProducers (an open transaction's start offset), `abort` sends WriteTxnMarkers
    with that producer's id and epoch to the partition's leader; the last stable offset moves on."""
    service = await real_cluster.start_broker(1, transaction_partition_verification_enable=False)
    broker = service.broker
    await broker.ensure_topic("h", partitions=1)
    p = await broker.partitions.get_when_open("h", 0, 30)
    assert (await produce(broker, 9, "nobody", "h", 0, txn_batch(777, 3, 0))).error_code == ErrorCode.none
    assert p.last_stable_offset == 0 < p.high_watermark  # hanging

    topic_cls = codec.nested(codec.request_class(61, 0), "TopicRequest")
    r = await call(broker, 61, 0, topics=(codec.build(topic_cls, name="h", partition_indexes=(0,)),))
    hanging = [
        (a.producer_id, a.producer_epoch, a.current_txn_start_offset)
        for a in r.topics[0].partitions[0].active_producers
        if a.current_txn_start_offset >= 0
    ]
    assert hanging == [(777, 3, 0)]

    cls = codec.request_class(27, 1)
    marker_cls = codec.nested(cls, "WritableTxnMarker")
    mtopic_cls = codec.nested(cls, "WritableTxnMarkerTopic")
    r = await call(
        broker,
        27,
        1,
        markers=(
            codec.build(
                marker_cls,
                producer_id=777,
                producer_epoch=3,
                transaction_result=False,
                topics=(codec.build(mtopic_cls, name="h", partition_indexes=(0,)),),
                coordinator_epoch=-1,
            ),
        ),
    )
    assert r.markers[0].topics[0].partitions[0].error_code == ErrorCode.none
    assert p.last_stable_offset == p.high_watermark
    assert [a.producer_id for a in p.aborted_transactions(0, p.high_watermark)] == [777]
