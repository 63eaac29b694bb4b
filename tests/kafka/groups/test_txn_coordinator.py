"""The transaction coordinator on real storage and a real controller, request by request:
every answer a client can get (including hostile and stale requests, with the error codes of
each version), transactional offsets visible only on commit, and a coordinator move that
keeps the state and aborts the transaction the old coordinator left open."""

from __future__ import annotations

import asyncio
import datetime

from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec
from automq.broker.kafka.groups.state import partition_for

FIND_COORDINATOR, INIT_PID, ADD_PARTS, ADD_OFFSETS, END_TXN, MARKERS, TXN_COMMIT, FETCH = 10, 22, 24, 25, 26, 27, 28, 9
DESCRIBE_PRODUCERS, DESCRIBE_TXNS, LIST_TXNS = 61, 65, 66
TXN_TOPIC = "__transaction_state"
MINUTE = datetime.timedelta(minutes=1)


async def eventually(probe, timeout: float = 30.0, interval: float = 0.05):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)


async def coordinator_node(cluster, tid: str):
    """The node coordinating `tid`, once it has loaded its partition."""
    any_node = next(iter(cluster.nodes.values()))

    async def probe():
        r = await any_node.call(FIND_COORDINATOR, 3, key=tid, key_type=1)
        if r.error_code != ErrorCode.none:
            return None
        node = cluster.nodes[r.node_id]
        init = await node.call(INIT_PID, 4, transactional_id=tid, transaction_timeout=MINUTE)
        return (node, init) if init.error_code == ErrorCode.none else None

    return await eventually(probe)


def _topics(cls, topics: dict[str, list[int]]):
    topic_cls = codec.nested(cls, "AddPartitionsToTxnTopic")
    return tuple(codec.build(topic_cls, name=t, partitions=tuple(ps)) for t, ps in topics.items())


async def add_partitions(node, version: int, tid: str, pid: int, epoch: int, topics: dict[str, list[int]]):
    cls = codec.request_class(ADD_PARTS, version)
    r = await node.call(
        ADD_PARTS,
        version,
        v3_and_below_transactional_id=tid,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=_topics(cls, topics),
    )
    return {
        (t.name, p.partition_index): p.partition_error_code
        for t in r.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


async def test_init_add_end_with_every_error_a_client_can_get(cluster) -> None:
    n1 = await cluster.start_node(1, transaction_state_log_num_partitions=2)
    n2 = await cluster.start_node(2, transaction_state_log_num_partitions=2)
    await n1.broker.ensure_topic("t", partitions=2)
    node, init = await coordinator_node(cluster, "tx")
    other = n2 if node is n1 else n1
    pid, epoch = init.producer_id, init.producer_epoch
    assert epoch == 0

    # the next instance gets the same producer id, one epoch up (and the old one is fenced)
    r = await node.call(INIT_PID, 4, transactional_id="tx", transaction_timeout=MINUTE)
    assert (r.error_code, r.producer_id, r.producer_epoch) == (ErrorCode.none, pid, 1)
    epoch = 1
    # KIP-360: a client naming its current epoch bumps it; a retry of that bump (naming the
    # epoch before it) gets the same answer again; an older epoch is fenced
    r = await node.call(
        INIT_PID, 4, transactional_id="tx", transaction_timeout=MINUTE, producer_id=pid, producer_epoch=1
    )
    assert (r.error_code, r.producer_id, r.producer_epoch) == (ErrorCode.none, pid, 2)
    r = await node.call(
        INIT_PID, 4, transactional_id="tx", transaction_timeout=MINUTE, producer_id=pid, producer_epoch=1
    )
    assert (r.error_code, r.producer_id, r.producer_epoch) == (ErrorCode.none, pid, 2)
    r = await node.call(
        INIT_PID, 4, transactional_id="tx", transaction_timeout=MINUTE, producer_id=pid, producer_epoch=0
    )
    assert r.error_code == ErrorCode.producer_fenced
    r = await node.call(
        INIT_PID, 3, transactional_id="tx", transaction_timeout=MINUTE, producer_id=pid, producer_epoch=0
    )
    assert r.error_code == ErrorCode.invalid_producer_epoch  # v3 predates PRODUCER_FENCED
    epoch = 2
    # timeouts outside (0, transaction.max.timeout.ms] and empty ids are refused
    for timeout in (datetime.timedelta(0), datetime.timedelta(hours=1)):
        r = await node.call(INIT_PID, 4, transactional_id="tx", transaction_timeout=timeout)
        assert r.error_code == ErrorCode.invalid_transaction_timeout
    r = await node.call(INIT_PID, 4, transactional_id="", transaction_timeout=MINUTE)
    assert r.error_code == ErrorCode.invalid_request
    # the broker that does not coordinate the id says so
    r = await other.call(INIT_PID, 4, transactional_id="tx", transaction_timeout=MINUTE)
    assert r.error_code == ErrorCode.not_coordinator
    assert set((await add_partitions(other, 3, "tx", pid, epoch, {"t": [0]})).values()) == {ErrorCode.not_coordinator}

    # (in-process nodes have no Kafka listener for WriteTxnMarkers: from here on one node leads all)
    await cluster.stop_node(other.config.node_id)

    async def leads_all():
        t = node.broker.partitions.topic("t")
        return t is not None and all(("t", i) in node.broker.partitions._partitions for i in range(2))

    await eventually(leads_all)
    # unknown partitions fail the whole request, naming the culprits
    assert await add_partitions(node, 3, "tx", pid, epoch, {"t": [0, 7], "nope": [0]}) == {
        ("t", 0): ErrorCode.operation_not_attempted,
        ("t", 7): ErrorCode.unknown_topic_or_partition,
        ("nope", 0): ErrorCode.unknown_topic_or_partition,
    }
    # stale epoch: PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH before v2; wrong producer id
    assert await add_partitions(node, 3, "tx", pid, epoch - 1, {"t": [0]}) == {("t", 0): ErrorCode.producer_fenced}
    assert await add_partitions(node, 1, "tx", pid, epoch - 1, {"t": [0]}) == {
        ("t", 0): ErrorCode.invalid_producer_epoch
    }
    assert await add_partitions(node, 3, "tx", pid + 1, epoch, {"t": [0]}) == {
        ("t", 0): ErrorCode.invalid_producer_id_mapping
    }
    # nothing to end yet
    r = await node.call(END_TXN, 3, transactional_id="tx", producer_id=pid, producer_epoch=epoch, committed=True)
    assert r.error_code == ErrorCode.invalid_txn_state

    assert await add_partitions(node, 3, "tx", pid, epoch, {"t": [0, 1]}) == {
        ("t", 0): ErrorCode.none,
        ("t", 1): ErrorCode.none,
    }
    # v4+: batched, and verify_only (KIP-890) tells whether a partition is in the transaction
    cls = codec.request_class(ADD_PARTS, 5)
    txn_cls = codec.nested(cls, "AddPartitionsToTxnTransaction")
    r = await node.call(
        ADD_PARTS,
        5,
        transactions=(
            codec.build(
                txn_cls,
                transactional_id="tx",
                producer_id=pid,
                producer_epoch=epoch,
                verify_only=True,
                topics=_topics(cls, {"t": [0]}),
            ),
        ),
    )
    assert r.results_by_transaction[0].topic_results[0].results_by_partition[0].partition_error_code == ErrorCode.none

    # a second instance while the transaction is open: it is aborted under a bumped epoch
    r = await node.call(INIT_PID, 4, transactional_id="tx", transaction_timeout=MINUTE)
    assert r.error_code == ErrorCode.concurrent_transactions

    async def reinit():
        r = await node.call(INIT_PID, 4, transactional_id="tx", transaction_timeout=MINUTE)
        return r if r.error_code == ErrorCode.none else None

    r = await eventually(reinit)
    assert (r.producer_id, r.producer_epoch) == (pid, epoch + 2)  # +1 for the fencing abort, +1 for the new instance
    # the fenced instance's commit: PRODUCER_FENCED (INVALID_PRODUCER_EPOCH for EndTxn v0-v1)
    r = await node.call(END_TXN, 3, transactional_id="tx", producer_id=pid, producer_epoch=epoch, committed=True)
    assert r.error_code == ErrorCode.producer_fenced
    r = await node.call(END_TXN, 1, transactional_id="tx", producer_id=pid, producer_epoch=epoch, committed=True)
    assert r.error_code == ErrorCode.invalid_producer_epoch
    # and its partitions got ABORT markers: nothing open is left
    for index in (0, 1):
        led = next(n for n in cluster.nodes.values() if ("t", index) in n.broker.partitions._partitions)
        p = led.broker.partitions.get("t", index)
        assert p.last_stable_offset == p.high_watermark

    # a full commit, then the retry of that commit, then a wrong-way abort
    epoch += 2
    assert set((await add_partitions(node, 3, "tx", pid, epoch, {"t": [0]})).values()) == {ErrorCode.none}
    r = await node.call(END_TXN, 3, transactional_id="tx", producer_id=pid, producer_epoch=epoch, committed=True)
    assert r.error_code == ErrorCode.none
    r = await node.call(END_TXN, 3, transactional_id="tx", producer_id=pid, producer_epoch=epoch, committed=True)
    assert r.error_code == ErrorCode.none
    r = await node.call(END_TXN, 3, transactional_id="tx", producer_id=pid, producer_epoch=epoch, committed=False)
    assert r.error_code == ErrorCode.invalid_txn_state


async def test_markers_from_a_stranger_and_to_the_wrong_broker(cluster) -> None:
    n1 = await cluster.start_node(1)
    n2 = await cluster.start_node(2)
    topic = await n1.broker.ensure_topic("m", partitions=2)
    assert topic is not None

    async def placed():
        t = n1.broker.partitions.topic("m")
        return t is not None and all(p.leader >= 0 for p in t.partitions) and t

    info = await eventually(placed)
    cls = codec.request_class(MARKERS, 1)
    marker_cls = codec.nested(cls, "WritableTxnMarker")
    topic_cls = codec.nested(cls, "WritableTxnMarkerTopic")
    markers = (
        codec.build(
            marker_cls,
            producer_id=5,
            producer_epoch=0,
            transaction_result=False,
            topics=(
                codec.build(topic_cls, name="m", partition_indexes=(0, 1)),
                codec.build(topic_cls, name="gone", partition_indexes=(0,)),
            ),
            coordinator_epoch=0,
        ),
    )
    for node in (n1, n2):

        async def answered(node=node):
            r = await node.call(MARKERS, 1, markers=markers)
            got = {(t.name, p.partition_index): p.error_code for t in r.markers[0].topics for p in t.partitions}
            expected = {
                ("m", i): ErrorCode.none if p.leader == node.config.node_id else ErrorCode.not_leader_or_follower
                for i, p in enumerate(info.partitions)
            }
            expected[("gone", 0)] = ErrorCode.unknown_topic_or_partition
            return got == expected

        assert await eventually(answered)
    # an ABORT marker for a producer that wrote nothing leaves no aborted range, only an offset
    for i, p in enumerate(info.partitions):
        led = cluster.nodes[p.leader].broker.partitions.get("m", i)
        assert led.aborted_transactions(0, 10) == [] and led.high_watermark == 1


async def test_transactional_offsets_count_on_commit_and_survive_a_move(cluster) -> None:
    n1 = await cluster.start_node(1, transaction_state_log_num_partitions=1, offsets_topic_num_partitions=1)
    await n1.broker.ensure_topic("t", partitions=1)
    node, init = await coordinator_node(cluster, "otx")
    pid, epoch = init.producer_id, init.producer_epoch

    async def txn_commit(offset: int) -> ErrorCode:
        cls = codec.request_class(TXN_COMMIT, 3)
        part = codec.nested(cls, "TxnOffsetCommitRequestPartition")
        topic = codec.nested(cls, "TxnOffsetCommitRequestTopic")
        r = await node.call(
            TXN_COMMIT,
            3,
            transactional_id="otx",
            group_id="g",
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
                            committed_offset=offset,
                            committed_leader_epoch=-1,
                            committed_metadata="m",
                        ),
                    ),
                ),
            ),
        )
        return r.topics[0].partitions[0].error_code

    async def committed(stable: bool) -> tuple[int, ErrorCode]:
        group_cls = codec.nested(codec.request_class(FETCH, 8), "OffsetFetchRequestGroup")
        topics_cls = codec.nested(codec.request_class(FETCH, 8), "OffsetFetchRequestTopics")
        wanted = (codec.build(topics_cls, name="t", partition_indexes=(0,)),)
        r = await node.call(
            FETCH, 8, groups=(codec.build(group_cls, group_id="g", topics=wanted),), require_stable=stable
        )
        parts = [p for t in r.groups[0].topics for p in t.partitions]
        return (parts[0].committed_offset, parts[0].error_code) if parts else (-1, ErrorCode.none)

    async def run_txn(offset: int, commit: bool) -> None:
        r = await node.call(ADD_OFFSETS, 3, transactional_id="otx", producer_id=pid, producer_epoch=epoch, group_id="g")
        assert r.error_code == ErrorCode.none

        async def group_coordinator_ready() -> bool:
            return node.broker.groups.coordinator_error("g") is None

        await eventually(group_coordinator_ready)  # (__consumer_offsets was just created)
        assert await txn_commit(offset) == ErrorCode.none
        assert await committed(False) != (offset, ErrorCode.none)  # pending: not visible yet
        assert (await committed(True))[1] == ErrorCode.unstable_offset_commit
        r = await node.call(END_TXN, 3, transactional_id="otx", producer_id=pid, producer_epoch=epoch, committed=commit)
        assert r.error_code == ErrorCode.none

    await run_txn(10, commit=True)
    assert await committed(True) == (10, ErrorCode.none)
    await run_txn(20, commit=False)
    assert await committed(True) == (10, ErrorCode.none)  # the aborted one never counts
    # a transaction left open, then the coordinator's broker goes: the next one replays both logs
    r = await node.call(ADD_OFFSETS, 3, transactional_id="otx", producer_id=pid, producer_epoch=epoch, group_id="g")
    assert r.error_code == ErrorCode.none
    assert await txn_commit(30) == ErrorCode.none
    await cluster.start_node(2, transaction_state_log_num_partitions=1, offsets_topic_num_partitions=1)
    await cluster.stop_node(1)
    node, init = await coordinator_node(cluster, "otx")  # waits out the abort of the open transaction
    assert node.config.node_id == 2
    assert (init.producer_id, init.producer_epoch) == (pid, epoch + 2)
    epoch = init.producer_epoch
    assert await committed(True) == (10, ErrorCode.none)  # the open transaction's 30 was aborted
    await run_txn(40, commit=True)
    assert await committed(True) == (40, ErrorCode.none)
    assert partition_for("otx", 1) == 0


async def test_list_and_describe_transactions_and_producers(cluster) -> None:
    n1 = await cluster.start_node(1, transaction_state_log_num_partitions=1)
    await n1.broker.ensure_topic("d", partitions=1)
    node, init = await coordinator_node(cluster, "dtx")
    pid, epoch = init.producer_id, init.producer_epoch
    assert set((await add_partitions(node, 3, "dtx", pid, epoch, {"d": [0]})).values()) == {ErrorCode.none}
    # a transactional batch in d-0, so the partition has an open transaction of pid
    from automq.broker.kafka import records

    batch = bytearray(
        records.build_batch(
            0,
            [records.encode_record(0, 0, None, b"v")],
            last_offset_delta=0,
            base_timestamp=1,
            max_timestamp=1,
            attributes=records.TRANSACTIONAL_BIT,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
        )
    )
    await node.broker.partitions.get("d", 0).append_batch(batch, records.parse_header(batch))

    r = await node.call(LIST_TXNS, 1, state_filters=("Ongoing", "Bogus"), producer_id_filters=(), duration_filter=-1)
    assert r.error_code == ErrorCode.none and r.unknown_state_filters == ("Bogus",)
    assert [(s.transactional_id, s.producer_id, s.transaction_state) for s in r.transaction_states] == [
        ("dtx", pid, "Ongoing")
    ]
    r = await node.call(LIST_TXNS, 1, state_filters=("Empty",), producer_id_filters=(), duration_filter=-1)
    assert r.transaction_states == ()
    r = await node.call(LIST_TXNS, 1, state_filters=(), producer_id_filters=(pid + 1,), duration_filter=-1)
    assert r.transaction_states == ()

    r = await node.call(DESCRIBE_TXNS, 0, transactional_ids=("dtx", "nobody"))
    found, missing = r.transaction_states
    assert (found.error_code, found.transaction_state, found.producer_id, found.producer_epoch) == (
        ErrorCode.none,
        "Ongoing",
        pid,
        epoch,
    )
    assert [(t.topic, t.partitions) for t in found.topics] == [("d", (0,))]
    assert found.transaction_timeout == MINUTE
    assert missing.error_code == ErrorCode.transactional_id_not_found

    topic_cls = codec.nested(codec.request_class(DESCRIBE_PRODUCERS, 0), "TopicRequest")
    r = await node.call(
        DESCRIBE_PRODUCERS,
        0,
        topics=(
            codec.build(topic_cls, name="d", partition_indexes=(0,)),
            codec.build(topic_cls, name="nope", partition_indexes=(0,)),
        ),
    )
    d0 = r.topics[0].partitions[0]
    assert d0.error_code == ErrorCode.none
    assert [
        (p.producer_id, p.producer_epoch, p.last_sequence, p.current_txn_start_offset) for p in d0.active_producers
    ] == [(pid, epoch, 0, 0)]
    assert r.topics[1].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    # hostile: null arrays (the wire allows them where the schema does not) are answered as empty
    r = await node.call(DESCRIBE_TXNS, 0, transactional_ids=None)
    assert r.transaction_states == ()
    r = await node.call(LIST_TXNS, 1, state_filters=None, producer_id_filters=None, duration_filter=-1)
    assert [s.transactional_id for s in r.transaction_states] == ["dtx"]
    r = await node.call(DESCRIBE_PRODUCERS, 0, topics=(codec.build(topic_cls, name="d", partition_indexes=None),))
    assert r.topics[0].partitions == ()
    r = await node.call(DESCRIBE_TXNS, 0, transactional_ids=("dtx", None))
    assert [s.error_code for s in r.transaction_states] == [ErrorCode.none, ErrorCode.invalid_request]
    r = await node.call(LIST_TXNS, 1, state_filters=(None, "Ongoing"), producer_id_filters=(), duration_filter=-1)
    assert r.unknown_state_filters == () and [s.transactional_id for s in r.transaction_states] == ["dtx"]
    # and both answers encode (what a client would receive)
    for api, version, fields in (
        (DESCRIBE_TXNS, 0, {"transactional_ids": ("dtx", None)}),
        (LIST_TXNS, 1, {"state_filters": (None,), "producer_id_filters": (), "duration_filter": -1}),
    ):
        codec.encode_response(7, await node.call(api, version, **fields))
