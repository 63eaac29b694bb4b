"""The group coordinator on real storage and a real controller: committed offsets and group
metadata survive a coordinator move and a broker restart (new StorageEngine and coordinator
over the same object store and controller)."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups.coordinator import OFFSETS_TOPIC
from automq.broker.kafka.groups.state import Effects, partition_for

FIND_COORDINATOR, JOIN, HEARTBEAT, SYNC, COMMIT, FETCH, LIST, DESCRIBE, DELETE = 10, 11, 12, 14, 8, 9, 16, 15, 42


async def eventually(probe, timeout: float = 20.0, interval: float = 0.05):
    """Await probe() until it returns a truthy value (returned) or time runs out (AssertionError)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)


async def coordinator_of(node, group: str) -> int:
    async def probe():
        r = await node.call(FIND_COORDINATOR, 3, key=group, key_type=0)
        return r.node_id if r.error_code == ErrorCode.none else None

    return await eventually(probe)


async def ready(node, group: str) -> None:
    """Wait until `node` serves `group` (its partition is loaded there)."""

    async def probe():
        r = await node.call(FETCH, 8, groups=(_fetch_group(node, group, None),), require_stable=False)
        return r.groups[0].error_code == ErrorCode.none

    await eventually(probe)


def _fetch_group(node, group: str, topics):
    from automq.broker.kafka import codec

    cls = codec.nested(codec.request_class(FETCH, 8), "OffsetFetchRequestGroup")
    return codec.build(cls, group_id=group, topics=topics)


def _commit_topic(partitions: list[tuple[int, int, str]]):
    from automq.broker.kafka import codec

    topic_cls = codec.nested(codec.request_class(COMMIT, 8), "OffsetCommitRequestTopic")
    part_cls = codec.nested(codec.request_class(COMMIT, 8), "OffsetCommitRequestPartition")
    return codec.build(
        topic_cls,
        name="t",
        partitions=tuple(
            codec.build(
                part_cls, partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=m
            )
            for p, o, m in partitions
        ),
    )


async def fetched(node, group: str) -> dict[int, tuple[int, str]]:
    r = await node.call(FETCH, 8, groups=(_fetch_group(node, group, None),), require_stable=False)
    assert r.groups[0].error_code == ErrorCode.none
    return {
        p.partition_index: (p.committed_offset, p.metadata)
        for t in r.groups[0].topics
        for p in t.partitions
        if t.name == "t"
    }


async def join_and_sync(node, group: str) -> tuple[str, int]:
    from automq.broker.kafka import codec

    proto_cls = codec.nested(codec.request_class(JOIN, 5), "JoinGroupRequestProtocol")
    protocols = (codec.build(proto_cls, name="range", metadata=b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff"),)
    common = dict(
        group_id=group,
        session_timeout=_td(30_000),
        rebalance_timeout=_td(30_000),
        group_instance_id=None,
        protocol_type="consumer",
        protocols=protocols,
    )
    first = await node.call(JOIN, 5, member_id="", **common)
    assert first.error_code == ErrorCode.member_id_required
    joined = await node.call(JOIN, 5, member_id=first.member_id, **common)
    assert joined.error_code == ErrorCode.none and joined.leader == joined.member_id
    assign_cls = codec.nested(codec.request_class(SYNC, 3), "SyncGroupRequestAssignment")
    synced = await node.call(
        SYNC,
        3,
        group_id=group,
        generation_id=joined.generation_id,
        member_id=joined.member_id,
        group_instance_id=None,
        assignments=(codec.build(assign_cls, member_id=joined.member_id, assignment=b"A"),),
    )
    assert synced.error_code == ErrorCode.none and synced.assignment == b"A"
    return joined.member_id, joined.generation_id


def _td(ms: int):
    import datetime

    return datetime.timedelta(milliseconds=ms)


async def test_offsets_and_groups_survive_coordinator_move_and_restart(cluster) -> None:
    n1 = await cluster.start_node(1)
    await n1.broker.ensure_topic("t", partitions=2)
    assert await coordinator_of(n1, "g") == 1
    await ready(n1, "g")
    member, generation = await join_and_sync(n1, "g")
    r = await n1.call(
        COMMIT,
        8,
        group_id="g",
        generation_id_or_member_epoch=generation,
        member_id=member,
        group_instance_id=None,
        topics=(_commit_topic([(0, 42, "m0"), (1, 7, "")]),),
    )
    assert [p.error_code for p in r.topics[0].partitions] == [ErrorCode.none, ErrorCode.none]
    # a standalone consumer (generation -1) in another group, maybe another partition
    await ready(n1, "solo")
    r = await n1.call(
        COMMIT,
        8,
        group_id="solo",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=(_commit_topic([(0, 5, "s")]),),
    )
    assert r.topics[0].partitions[0].error_code == ErrorCode.none
    # unknown topic partitions are refused per partition
    r = await n1.call(
        COMMIT,
        8,
        group_id="solo",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=(_commit_topic([(9, 5, "")]),),
    )
    assert r.topics[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    assert await fetched(n1, "g") == {0: (42, "m0"), 1: (7, "")}

    # coordinator move: node 2 joins, node 1 leaves gracefully; node 2 replays the partitions
    n2 = await cluster.start_node(2)
    await cluster.stop_node(1)
    assert await coordinator_of(n2, "g") == 2
    await ready(n2, "g")
    await ready(n2, "solo")
    assert await fetched(n2, "g") == {0: (42, "m0"), 1: (7, "")}
    assert await fetched(n2, "solo") == {0: (5, "s")}
    # the member keeps its generation across the move (group metadata was replayed)
    r = await n2.call(HEARTBEAT, 3, group_id="g", generation_id=generation, member_id=member, group_instance_id=None)
    assert r.error_code == ErrorCode.none
    d = await n2.call(DESCRIBE, 5, groups=("g",), include_authorized_operations=False)
    assert d.groups[0].group_state == "Stable" and d.groups[0].members[0].member_assignment == b"A"
    # more commits on the new coordinator
    r = await n2.call(
        COMMIT,
        8,
        group_id="g",
        generation_id_or_member_epoch=generation,
        member_id=member,
        group_instance_id=None,
        topics=(_commit_topic([(0, 43, "m1")]),),
    )
    assert r.topics[0].partitions[0].error_code == ErrorCode.none

    # restart: node 2 stops, node 1 comes back on its old data dir (new engine, new coordinator)
    await cluster.stop_node(2)
    n1 = await cluster.start_node(1)
    assert await coordinator_of(n1, "g") == 1
    await ready(n1, "g")
    assert await fetched(n1, "g") == {0: (43, "m1"), 1: (7, "")}
    assert await fetched(n1, "solo") == {0: (5, "s")}
    # deleting the standalone group removes its offsets durably
    r = await n1.call(DELETE, 2, groups_names=("solo", "g", "nope"))
    assert [x.error_code for x in r.results] == [
        ErrorCode.none,
        ErrorCode.non_empty_group,
        ErrorCode.group_id_not_found,
    ]
    assert await fetched(n1, "solo") == {}
    await cluster.stop_node(1)
    n2 = await cluster.start_node(2)
    await ready(n2, "solo")
    assert await fetched(n2, "solo") == {}
    assert await fetched(n2, "g") == {0: (43, "m1"), 1: (7, "")}
    listed = await n2.call(LIST, 4, states_filter=())
    assert {(g.group_id, g.group_state) for g in listed.groups} == {("g", "Stable")}


async def test_wrong_broker_says_not_coordinator(cluster) -> None:
    n1 = await cluster.start_node(1)
    n2 = await cluster.start_node(2)
    topic = await n1.broker.ensure_topic(OFFSETS_TOPIC)
    assert topic is not None

    async def placed():
        t = n1.broker.partitions.topic(OFFSETS_TOPIC)
        return t is not None and all(p.leader >= 0 for p in t.partitions) and t

    topic = await eventually(placed)
    # find a group per partition, and ask the broker that does not lead it
    for index, info in enumerate(topic.partitions):
        group = next(f"g{i}" for i in range(10_000) if partition_for(f"g{i}", len(topic.partitions)) == index)
        leader, other = (n1, n2) if info.leader == 1 else (n2, n1)
        assert await coordinator_of(other, group) == info.leader
        await ready(leader, group)
        r = await other.call(HEARTBEAT, 3, group_id=group, generation_id=1, member_id="m", group_instance_id=None)
        assert r.error_code == ErrorCode.not_coordinator
        r = await other.call(FETCH, 8, groups=(_fetch_group(other, group, None),), require_stable=False)
        assert r.groups[0].error_code == ErrorCode.not_coordinator
    # a transactional id is placed on __transaction_state the same way; unknown key types are invalid
    r = await n1.call(FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("tx", ""))
    assert [c.error_code for c in r.coordinators] == [ErrorCode.none, ErrorCode.invalid_request]
    txn_topic = n1.broker.partitions.topic("__transaction_state")
    assert txn_topic is not None
    assert r.coordinators[0].node_id == txn_topic.partitions[partition_for("tx", len(txn_topic.partitions))].leader
    r = await n1.call(FIND_COORDINATOR, 4, key_type=7, coordinator_keys=("x", "y"))
    assert [c.error_code for c in r.coordinators] == [ErrorCode.invalid_request] * 2


async def test_checkpoint_trims_the_log_and_keeps_every_offset(cluster, monkeypatch) -> None:
    import automq.broker.kafka.groups.coordinator as coordinator_module

    monkeypatch.setattr(coordinator_module, "CHECKPOINT_MIN_RECORDS", 40)
    n1 = await cluster.start_node(1, offsets_topic_num_partitions=1)
    await n1.broker.ensure_topic("t", partitions=2)
    assert await coordinator_of(n1, "g") == 1
    await ready(n1, "g")
    member, generation = await join_and_sync(n1, "g")
    for i in range(120):  # many commits of the same two partitions: mostly obsolete records
        r = await n1.call(
            COMMIT,
            8,
            group_id="g",
            generation_id_or_member_epoch=generation,
            member_id=member,
            group_instance_id=None,
            topics=(_commit_topic([(0, i, f"m{i}"), (1, 1000 + i, "")]),),
        )
        assert {p.error_code for p in r.topics[0].partitions} == {ErrorCode.none}
    await ready(n1, "solo")
    r = await n1.call(
        COMMIT,
        8,
        group_id="solo",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=(_commit_topic([(1, 3, "s")]),),
    )
    assert r.topics[0].partitions[0].error_code == ErrorCode.none

    partition = n1.broker.partitions.get(OFFSETS_TOPIC, 0)

    async def trimmed():
        return partition.log_start_offset > 0

    await eventually(trimmed)
    assert partition.log_start_offset > 100  # most of the 240+ records are gone
    assert await fetched(n1, "g") == {0: (119, "m119"), 1: (1119, "")}

    await cluster.stop_node(1)
    n1 = await cluster.start_node(1, offsets_topic_num_partitions=1)
    await ready(n1, "g")
    assert await fetched(n1, "g") == {0: (119, "m119"), 1: (1119, "")}
    assert await fetched(n1, "solo") == {1: (3, "s")}
    r = await n1.call(HEARTBEAT, 3, group_id="g", generation_id=generation, member_id=member, group_instance_id=None)
    assert r.error_code == ErrorCode.none


async def test_offsets_topic_is_compacted_never_retention_trimmed(cluster) -> None:
    n1 = await cluster.start_node(1)
    assert await coordinator_of(n1, "g") == 1
    assert n1.broker.partitions.topic(OFFSETS_TOPIC).configs.get("cleanup.policy") == "compact"
    await cluster.stop_node(1)


async def test_offsets_topic_created_elsewhere_is_made_compacted(cluster) -> None:
    n1 = await cluster.start_node(1)
    await n1.broker.ensure_topic(OFFSETS_TOPIC)  # e.g. auto-created by a Metadata request: delete policy

    async def compacted():
        topic = n1.broker.partitions.topic(OFFSETS_TOPIC)
        return topic is not None and topic.configs.get("cleanup.policy") == "compact"

    await eventually(compacted)


async def test_coordinator_metrics_are_exported(cluster) -> None:
    from prometheus_client import generate_latest

    n1 = await cluster.start_node(1)
    await n1.broker.ensure_topic("t", partitions=2)
    assert await coordinator_of(n1, "g") == 1
    await ready(n1, "g")
    member, generation = await join_and_sync(n1, "g")
    await n1.call(
        COMMIT,
        8,
        group_id="g",
        generation_id_or_member_epoch=generation,
        member_id=member,
        group_instance_id=None,
        topics=(_commit_topic([(0, 1, ""), (1, 2, "")]),),
    )
    text = generate_latest(n1.broker.registry).decode()
    assert 'kafka_coordinator_groups{state="Stable",type="classic"} 1.0' in text
    assert 'kafka_coordinator_members{type="classic"} 1.0' in text
    assert "kafka_coordinator_offset_commits_total 2.0" in text
    assert "kafka_coordinator_partitions_loading 0.0" in text


async def test_consumer_protocol_group_metrics_are_exported(cluster) -> None:
    """KIP-848 groups in the collector: by type and state, members, rebalances (group epoch
    bumps) and fencings, read from the broker's registry after real heartbeats."""
    import datetime

    from prometheus_client import generate_latest

    n1 = await cluster.start_node(1)
    await n1.broker.ensure_topic("t", partitions=2)
    assert await coordinator_of(n1, "cg") == 1
    await ready(n1, "cg")

    async def heartbeat(member_id: str, epoch: int, **fields):
        return await n1.call(68, 0, group_id="cg", member_id=member_id, member_epoch=epoch, **fields)

    joined = await heartbeat(
        "",
        0,
        rebalance_timeout=datetime.timedelta(seconds=30),
        subscribed_topic_names=("t",),
        topic_partitions=(),
    )
    assert joined.error_code == ErrorCode.none and joined.member_epoch == 1
    fenced = await heartbeat(joined.member_id, 7, topic_partitions=None)
    assert fenced.error_code == ErrorCode.fenced_member_epoch
    text = generate_latest(n1.broker.registry).decode()
    assert 'kafka_coordinator_groups{state="Stable",type="consumer"} 1.0' in text
    assert 'kafka_coordinator_groups{state="Reconciling",type="consumer"} 0.0' in text
    assert 'kafka_coordinator_members{type="consumer"} 1.0' in text
    assert "kafka_coordinator_consumer_group_rebalances_total 1.0" in text
    assert 'kafka_coordinator_consumer_member_fencings_total{reason="epoch"} 1.0' in text
    assert 'kafka_coordinator_consumer_member_fencings_total{reason="session_timeout"} 0.0' in text
    assert "kafka_coordinator_consumer_members_reconciling 0.0" in text
    left = await heartbeat(joined.member_id, -1, topic_partitions=None)
    assert left.error_code == ErrorCode.none
    text = generate_latest(n1.broker.registry).decode()
    assert 'kafka_coordinator_groups{state="Empty",type="consumer"} 1.0' in text
    assert "kafka_coordinator_consumer_group_rebalances_total 2.0" in text


async def test_empty_timer_effects_do_not_wake_the_timer(cluster, monkeypatch) -> None:
    """Applying an effect wakes the timer loop (deadlines may have moved). A tick with nothing to
    do used to be applied too, so every empty tick woke the timer for another: an idle broker
    process sat at 100% of a core (measured with /proc/PID/stat before and after the fix).
    The timer must apply only effects that write or reply."""
    from automq.broker.kafka.groups.state import SyncResult, Write

    node = await cluster.start_node(1)
    coordinator = node.broker.groups
    applied: list[Effects] = []
    monkeypatch.setattr(coordinator, "apply_soon", applied.append)

    coordinator._apply_if_any(Effects())
    assert applied == []

    replying = Effects()
    replying.reply(object(), SyncResult(ErrorCode.none))
    writing = Effects(writes=[Write(partition=0, key=b"k", value=None)])
    coordinator._apply_if_any(replying)
    coordinator._apply_if_any(writing)
    assert applied == [replying, writing]
