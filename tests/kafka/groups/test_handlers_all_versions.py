"""Every served version of FindCoordinator, the group APIs and InitProducerId: the handler
answers correctly and its response encodes (no missing or non-nullable None fields)."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec, handlers
from automq.broker.kafka.topic_ids import topic_uuid

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN, HEARTBEAT, LEAVE, SYNC = 8, 9, 10, 11, 12, 13, 14
DESCRIBE, LIST, DELETE, OFFSET_DELETE, INIT_PRODUCER_ID = 15, 16, 42, 47, 22


def versions(api_key: int) -> range:
    reg = handlers.lookup(api_key)
    assert reg is not None
    low, high = codec.supported_range(api_key, reg.min_version, reg.max_version)
    return range(low, high + 1)


def td(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)


def nest(cls: type, *names: str, **fields):
    for name in names:
        try:
            return codec.build(codec.nested(cls, name), **fields)
        except AttributeError:
            continue
    raise AssertionError(f"none of {names} in {cls.__module__}")


async def call(node, api_key: int, version: int, **fields):
    response = await node.call(api_key, version, **fields)
    assert type(response) is codec.response_class(api_key, version)
    codec.encode_response(7, response)  # must encode for this version
    return response


def join_fields(version: int, group: str, member_id: str = "", instance: str | None = None) -> dict:
    req = codec.request_class(JOIN, version)
    proto = nest(
        req, "JoinGroupRequestProtocol", name="range", metadata=b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff"
    )
    return dict(
        group_id=group,
        session_timeout=td(10_000),
        rebalance_timeout=td(10_000),
        member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocols=(proto,),
        reason=None,
    )


async def joined_member(node, group: str, assignment: bytes = b"x") -> tuple[str, int]:
    """A stable single-member group through JoinGroup v5 / SyncGroup v3."""
    first = await call(node, JOIN, 5, **join_fields(5, group))
    second = await call(node, JOIN, 5, **join_fields(5, group, first.member_id))
    assert second.error_code == ErrorCode.none
    assign = nest(
        codec.request_class(SYNC, 3), "SyncGroupRequestAssignment", member_id=second.member_id, assignment=assignment
    )
    synced = await call(
        node,
        SYNC,
        3,
        group_id=group,
        generation_id=second.generation_id,
        member_id=second.member_id,
        group_instance_id=None,
        assignments=(assign,),
    )
    assert synced.error_code == ErrorCode.none
    return second.member_id, second.generation_id


@pytest.fixture
async def node(cluster):
    n = await cluster.start_node(1, offsets_topic_num_partitions=1)
    await n.broker.ensure_topic("t", partitions=1)
    await n.broker.ensure_topic("__consumer_offsets")

    import asyncio

    for _ in range(400):  # the single offsets partition opens and loads
        if n.broker.groups.coordinator_error("probe") is None:
            break
        await asyncio.sleep(0.05)
    assert n.broker.groups.coordinator_error("probe") is None
    return n


async def test_find_coordinator_every_version(node) -> None:
    for v in versions(FIND_COORDINATOR):
        r = await call(node, FIND_COORDINATOR, v, key="g", key_type=0, coordinator_keys=("g", "h"))
        if v >= 4:
            assert [(c.key, c.node_id, c.error_code) for c in r.coordinators] == [
                ("g", 1, ErrorCode.none),
                ("h", 1, ErrorCode.none),
            ]
            assert r.coordinators[0].port == 9093
        else:
            assert (r.error_code, r.node_id, r.host, r.port) == (ErrorCode.none, 1, "127.0.0.1", 9093)


async def test_join_every_version(node) -> None:
    for v in versions(JOIN):
        group = f"join-v{v}"
        r = await call(node, JOIN, v, **join_fields(v, group))
        if v >= 4:
            assert r.error_code == ErrorCode.member_id_required and r.member_id
            r = await call(node, JOIN, v, **join_fields(v, group, r.member_id))
        assert r.error_code == ErrorCode.none and r.generation_id == 1 and r.leader == r.member_id
        assert r.protocol_name == "range" and len(r.members) == 1
        bad = await call(node, JOIN, v, **{**join_fields(v, group, "ghost")})
        assert bad.error_code == ErrorCode.unknown_member_id
    if 5 in versions(JOIN):
        static = await call(node, JOIN, 5, **join_fields(5, "static", instance="i-1"))
        assert static.error_code == ErrorCode.none and static.generation_id == 1


async def test_sync_heartbeat_leave_every_version(node) -> None:
    for v in versions(SYNC):
        group = f"sync-v{v}"
        first = await call(node, JOIN, 5, **join_fields(5, group))
        joined = await call(node, JOIN, 5, **join_fields(5, group, first.member_id))
        assign = nest(
            codec.request_class(SYNC, v), "SyncGroupRequestAssignment", member_id=joined.member_id, assignment=b"A"
        )
        r = await call(
            node,
            SYNC,
            v,
            group_id=group,
            generation_id=joined.generation_id,
            member_id=joined.member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=(assign,),
        )
        assert r.error_code == ErrorCode.none and r.assignment == b"A"
        wrong = await call(
            node,
            SYNC,
            v,
            group_id=group,
            generation_id=99,
            member_id=joined.member_id,
            group_instance_id=None,
            protocol_type=None,
            protocol_name=None,
            assignments=(),
        )
        assert wrong.error_code == ErrorCode.illegal_generation
    for v in versions(HEARTBEAT):
        member, generation = await joined_member(node, f"hb-v{v}")
        ok = await call(
            node, HEARTBEAT, v, group_id=f"hb-v{v}", generation_id=generation, member_id=member, group_instance_id=None
        )
        assert ok.error_code == ErrorCode.none
        stale = await call(
            node,
            HEARTBEAT,
            v,
            group_id=f"hb-v{v}",
            generation_id=generation - 1,
            member_id=member,
            group_instance_id=None,
        )
        assert stale.error_code == ErrorCode.illegal_generation
        empty = await call(node, HEARTBEAT, v, group_id="", generation_id=1, member_id="m", group_instance_id=None)
        assert empty.error_code == ErrorCode.invalid_group_id
    for v in versions(LEAVE):
        group = f"leave-v{v}"
        member, _ = await joined_member(node, group)
        req = codec.request_class(LEAVE, v)
        fields = dict(group_id=group, member_id=member)
        if v >= 3:
            fields["members"] = (
                nest(req, "MemberIdentity", member_id=member, group_instance_id=None, reason="bye"),
                nest(req, "MemberIdentity", member_id="ghost", group_instance_id=None, reason=None),
            )
        r = await call(node, LEAVE, v, **fields)
        assert r.error_code == ErrorCode.none
        if v >= 3:
            assert [m.error_code for m in r.members] == [ErrorCode.none, ErrorCode.unknown_member_id]
        again = await call(
            node,
            LEAVE,
            v,
            group_id=group,
            member_id=member,
            members=(nest(req, "MemberIdentity", member_id=member, group_instance_id=None, reason=None),)
            if v >= 3
            else (),
        )
        assert (again.members[0].error_code if v >= 3 else again.error_code) == ErrorCode.unknown_member_id


def commit_fields(version: int, group: str, generation: int, member: str, offset: int, topic_id=None) -> dict:
    """`topic_id`: topic t's id, which v10+ name it by (KIP-848)."""
    req = codec.request_class(OFFSET_COMMIT, version)
    part = nest(
        req,
        "OffsetCommitRequestPartition",
        partition_index=0,
        committed_offset=offset,
        committed_leader_epoch=-1,
        committed_metadata=f"v{version}",
        commit_timestamp=-1,
    )
    unknown = nest(
        req,
        "OffsetCommitRequestPartition",
        partition_index=5,
        committed_offset=1,
        committed_leader_epoch=-1,
        committed_metadata=None,
        commit_timestamp=-1,
    )
    topic = nest(req, "OffsetCommitRequestTopic", name="t", topic_id=topic_id, partitions=(part, unknown))
    return dict(
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member,
        group_instance_id=None,
        retention_time=td(-1),
        topics=(topic,),
    )


def fetch_fields(version: int, group: str, topics: list[str] | None, topic_id=None) -> dict:
    req = codec.request_class(OFFSET_FETCH, version)
    ts = (
        None
        if topics is None
        else tuple(
            nest(
                req,
                "OffsetFetchRequestTopic",
                "OffsetFetchRequestTopics",
                name=t,
                topic_id=topic_id,
                partition_indexes=(0, 3),
            )
            for t in topics
        )
    )
    if version >= 8:
        g = nest(req, "OffsetFetchRequestGroup", group_id=group, member_id=None, member_epoch=-1, topics=ts)
        return dict(groups=(g,), require_stable=True)
    return dict(group_id=group, topics=ts if ts is not None or version >= 2 else (), require_stable=True)


async def test_offset_commit_and_fetch_every_version(node) -> None:
    member, generation = await joined_member(node, "offsets")
    t_id = topic_uuid(node.broker.partitions.topic("t").topic_id)
    for v in versions(OFFSET_COMMIT):
        r = await call(node, OFFSET_COMMIT, v, **commit_fields(v, "offsets", generation, member, 100 + v, t_id))
        assert [(p.partition_index, p.error_code) for p in r.topics[0].partitions] == [
            (0, ErrorCode.none),
            (5, ErrorCode.unknown_topic_or_partition),
        ]
        simple = await call(node, OFFSET_COMMIT, v, **commit_fields(v, f"simple-v{v}", -1, "", v, t_id))
        assert simple.topics[0].partitions[0].error_code == ErrorCode.none
        stale = await call(node, OFFSET_COMMIT, v, **commit_fields(v, "offsets", generation + 1, member, 1, t_id))
        assert stale.topics[0].partitions[0].error_code == ErrorCode.illegal_generation
    last = max(versions(OFFSET_COMMIT))
    for v in versions(OFFSET_FETCH):
        r = await call(node, OFFSET_FETCH, v, **fetch_fields(v, "offsets", ["t"], t_id))
        topics = r.groups[0].topics if v >= 8 else r.topics
        parts = {p.partition_index: (p.committed_offset, p.metadata, p.error_code) for p in topics[0].partitions}
        assert parts == {0: (100 + last, f"v{last}", ErrorCode.none), 3: (-1, "", ErrorCode.none)}
        if v >= 2:  # all partitions of the group
            r = await call(node, OFFSET_FETCH, v, **fetch_fields(v, "offsets", None))
            topics = r.groups[0].topics if v >= 8 else r.topics
            names = [(t.topic_id if v >= 10 else t.name, [p.partition_index for p in t.partitions]) for t in topics]
            assert names == [(t_id if v >= 10 else "t", [0])]
        r = await call(node, OFFSET_FETCH, v, **fetch_fields(v, "never-seen", ["t"], t_id))
        topics = r.groups[0].topics if v >= 8 else r.topics
        assert [p.committed_offset for p in topics[0].partitions] == [-1, -1]


async def test_list_describe_delete_every_version(node) -> None:
    member, _ = await joined_member(node, "busy")
    for v in versions(LIST):
        r = await call(
            node, LIST, v, states_filter=("Stable",) if v >= 4 else (), types_filter=("classic",) if v >= 5 else ()
        )
        assert r.error_code == ErrorCode.none
        assert ("busy", "consumer") in [(g.group_id, g.protocol_type) for g in r.groups]
        if v >= 4:
            assert {g.group_state for g in r.groups} == {"Stable"}
    if max(versions(LIST)) >= 5:
        r = await call(node, LIST, 5, states_filter=(), types_filter=("consumer",))
        assert r.groups == ()
    for v in versions(DESCRIBE):
        r = await call(node, DESCRIBE, v, groups=("busy", "nope"), include_authorized_operations=True)
        busy, nope = r.groups
        assert busy.error_code == ErrorCode.none and busy.group_state == "Stable" and busy.protocol_data == "range"
        assert busy.members[0].member_id == member and busy.members[0].member_assignment == b"x"
        assert nope.group_state == "Dead"
        assert nope.error_code == (ErrorCode.group_id_not_found if v >= 6 else ErrorCode.none)
    for v in versions(DELETE):
        await call(node, OFFSET_COMMIT, 8, **commit_fields(8, f"del-v{v}", -1, "", 1))
        r = await call(node, DELETE, v, groups_names=(f"del-v{v}", "busy", "nope"))
        assert [x.error_code for x in r.results] == [
            ErrorCode.none,
            ErrorCode.non_empty_group,
            ErrorCode.group_id_not_found,
        ]
    for v in versions(OFFSET_DELETE):
        req = codec.request_class(OFFSET_DELETE, v)
        topic = nest(
            req,
            "OffsetDeleteRequestTopic",
            name="t",
            partitions=(nest(req, "OffsetDeleteRequestPartition", partition_index=0),),
        )
        await call(node, OFFSET_COMMIT, 8, **commit_fields(8, "od", -1, "", 1))
        r = await call(node, OFFSET_DELETE, v, group_id="od", topics=(topic,))
        assert r.error_code == ErrorCode.none and r.topics[0].partitions[0].error_code == ErrorCode.none
        subscribed = await call(node, OFFSET_DELETE, v, group_id="busy", topics=(topic,))
        assert subscribed.topics[0].partitions[0].error_code == ErrorCode.group_subscribed_to_topic
        missing = await call(node, OFFSET_DELETE, v, group_id="nope", topics=(topic,))
        assert missing.error_code == ErrorCode.group_id_not_found


async def test_init_producer_id_every_version(node) -> None:
    seen = set()
    for v in versions(INIT_PRODUCER_ID):
        r = await call(
            node,
            INIT_PRODUCER_ID,
            v,
            transactional_id=None,
            transaction_timeout=td(60_000),
            producer_id=-1,
            producer_epoch=-1,
        )
        assert r.error_code == ErrorCode.none and r.producer_epoch == 0 and r.producer_id >= 0
        seen.add(r.producer_id)
        # a producer asking to bump its epoch (KIP-360) gets a fresh id instead
        again = await call(
            node,
            INIT_PRODUCER_ID,
            v,
            transactional_id=None,
            transaction_timeout=td(60_000),
            producer_id=r.producer_id,
            producer_epoch=0,
        )
        assert again.error_code == ErrorCode.none and again.producer_id not in seen
        seen.add(again.producer_id)
        tx = await call(
            node,
            INIT_PRODUCER_ID,
            v,
            transactional_id="tx-1",
            transaction_timeout=td(60_000),
            producer_id=-1,
            producer_epoch=-1,
        )
        assert tx.error_code == ErrorCode.not_coordinator and tx.producer_id == -1
        empty = await call(
            node,
            INIT_PRODUCER_ID,
            v,
            transactional_id="",
            transaction_timeout=td(60_000),
            producer_id=-1,
            producer_epoch=-1,
        )
        assert empty.error_code == ErrorCode.invalid_request


async def kip848_join(node, group: str):
    """A new KIP-848 member (ConsumerGroupHeartbeat v0, epoch 0) subscribing to topic "t"."""
    return await call(
        node,
        68,
        0,
        group_id=group,
        member_id="",
        member_epoch=0,
        instance_id=None,
        rack_id=None,
        rebalance_timeout=td(10_000),
        subscribed_topic_names=("t",),
        server_assignor=None,
        topic_partitions=(),
    )


async def test_classic_apis_every_version_against_a_kip848_group(node) -> None:
    """Online migration: classic members of a KIP-848 group (JoinGroup, SyncGroup, Heartbeat,
    LeaveGroup) in every version get answers that encode; the broker assigns (no leader)."""
    group = "mixed"
    first = await kip848_join(node, group)
    assert first.error_code == ErrorCode.none and first.member_epoch == 1
    data = node.broker.groups.manager.groups[group].consumer
    for v in versions(JOIN):
        r = await call(node, JOIN, v, **join_fields(v, group))
        if v >= 4:
            assert r.error_code == ErrorCode.member_id_required and r.member_id
            r = await call(node, JOIN, v, **join_fields(v, group, r.member_id))
        assert r.error_code == ErrorCode.none, v
        assert (r.leader, tuple(r.members), r.protocol_name) == ("", (), "range")
        assert data.members[r.member_id].classic is not None
        assert r.generation_id == data.members[r.member_id].member_epoch
        member, generation = r.member_id, r.generation_id
        for sv in versions(SYNC):
            s = await call(
                node,
                SYNC,
                sv,
                group_id=group,
                generation_id=generation,
                member_id=member,
                group_instance_id=None,
                protocol_type="consumer",
                protocol_name="range",
                assignments=(),
            )
            # the consumer-protocol member still owns the partition: nothing yet, and told to rejoin later
            assert s.error_code in (ErrorCode.none, ErrorCode.rebalance_in_progress), (v, sv)
        for hv in versions(HEARTBEAT):
            h = await call(
                node, HEARTBEAT, hv, group_id=group, generation_id=generation, member_id=member, group_instance_id=None
            )
            assert h.error_code in (ErrorCode.none, ErrorCode.rebalance_in_progress)
            stale = await call(
                node,
                HEARTBEAT,
                hv,
                group_id=group,
                generation_id=generation + 9,
                member_id=member,
                group_instance_id=None,
            )
            assert stale.error_code == ErrorCode.illegal_generation
        lv = max(versions(LEAVE))
        req = codec.request_class(LEAVE, lv)
        left = await call(
            node,
            LEAVE,
            lv,
            group_id=group,
            member_id=member,
            members=(nest(req, "MemberIdentity", member_id=member, group_instance_id=None, reason="bye"),),
        )
        assert left.error_code == ErrorCode.none and [m.error_code for m in left.members] == [ErrorCode.none]
    for lv in versions(LEAVE):
        r = await call(node, JOIN, 5, **join_fields(5, group))
        r = await call(node, JOIN, 5, **join_fields(5, group, r.member_id))
        req = codec.request_class(LEAVE, lv)
        fields: dict = dict(group_id=group, member_id=r.member_id)
        if lv >= 3:
            fields["members"] = (
                nest(req, "MemberIdentity", member_id=r.member_id, group_instance_id=None, reason=None),
            )
        assert (await call(node, LEAVE, lv, **fields)).error_code == ErrorCode.none
    assert [m.classic for m in data.members.values()] == [None]  # the KIP-848 member alone again


async def test_an_upgrade_answers_classic_joins_waiting_in_a_rebalance(node) -> None:
    """A KIP-848 member joining a classic group in the middle of a rebalance: the JoinGroup
    still waiting there is answered REBALANCE_IN_PROGRESS (the client rejoins the consumer
    group), not left hanging."""
    import asyncio

    group = "upgrade-mid-rebalance"
    assignment = b"\x00\x00\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff"  # t-0
    await joined_member(node, group, assignment)
    first = await call(node, JOIN, 5, **join_fields(5, group))
    waiting = asyncio.get_running_loop().create_task(call(node, JOIN, 5, **join_fields(5, group, first.member_id)))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # the first member has not rejoined yet
    hb = await kip848_join(node, group)
    assert hb.error_code == ErrorCode.none
    answered = await asyncio.wait_for(waiting, 5)
    assert answered.error_code == ErrorCode.rebalance_in_progress
    assert node.broker.groups.manager.groups[group].consumer is not None
