"""Hostile ShareGroupHeartbeat / ShareGroupDescribe requests (KIP-932) over the wire, as raw
kio frames against a real broker: each gets the error code a Kafka broker gives, the broker
logs no error and keeps serving, and the group's honest member heartbeats on unharmed. Group
ids of the other types (classic, KIP-848) are refused both ways; ListGroups filters by type."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from typing import Any

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.join_group.v9.request import JoinGroupRequest
from kio.schema.list_groups.v5.request import ListGroupsRequest
from kio.schema.offset_commit.v8.request import OffsetCommitRequest
from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64
from test_consumer_group_hostile import RETRIABLE, Conn, no_broker_errors  # noqa: F401 - fixture

from automq.broker.kafka import codec

TOPIC = "hostile-932"
GROUP = "hostile-932-grp"
PARTITIONS = 3


def heartbeat(conn: Conn, member_id: str, epoch: int, *, group: str = GROUP, **fields: Any) -> Any:
    topics = fields.pop("topics", None)
    request = ShareGroupHeartbeatRequest(
        group_id=GroupId(group),
        member_id=member_id,
        member_epoch=i32(epoch),
        rack_id=fields.pop("rack_id", None),
        subscribed_topic_names=None if topics is None else tuple(TopicName(t) for t in topics),
    )
    assert not fields, fields
    return conn.call(request)


def describe(conn: Conn, *groups: str) -> Any:
    return conn.call(
        ShareGroupDescribeRequest(group_ids=tuple(GroupId(g) for g in groups), include_authorized_operations=False)
    )


@pytest.fixture(scope="module")
def member(fuzz_broker):
    """An honest member of GROUP: (conn, member id, epoch, topic id)."""
    service: Any = fuzz_broker.service
    asyncio.run_coroutine_threadsafe(
        service.broker.ensure_topic(TOPIC, partitions=PARTITIONS), fuzz_broker.loop
    ).result(60)
    conn = Conn(fuzz_broker.port)
    member_id = str(uuid.uuid4())
    deadline = time.monotonic() + 60
    while True:
        found = conn.call(FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(GROUP,)))
        ok = found.coordinators[0].error_code == ErrorCode.none
        r = heartbeat(conn, member_id, 0, topics=(TOPIC,)) if ok else found.coordinators[0]
        if r.error_code not in RETRIABLE or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.error_code == ErrorCode.none, r
    assert r.member_id == member_id and r.member_epoch >= 1
    [tp] = r.assignment.topic_partitions
    assert sorted(tp.partitions) == list(range(PARTITIONS))
    assert r.heartbeat_interval.total_seconds() > 0
    yield conn, member_id, r.member_epoch, tp.topic_id
    conn.close()


def still_fine(fuzz_broker, member) -> None:
    fuzz_broker.assert_serving()
    conn, member_id, epoch, _ = member
    r = heartbeat(conn, member_id, epoch)
    assert (r.error_code, r.member_epoch) == (ErrorCode.none, epoch), r


def test_api_versions_advertises_share_group_apis(fuzz_broker) -> None:
    conn = Conn(fuzz_broker.port)
    try:
        r = conn.call(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    finally:
        conn.close()
    ranges = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert ranges[76] == (1, 1) and ranges[77] == (1, 1)


CASES = {
    "empty group id": (dict(group="", member_id="m", epoch=0, topics=(TOPIC,)), ErrorCode.invalid_request),
    "empty member id": (dict(member_id="", epoch=0, topics=(TOPIC,)), ErrorCode.invalid_request),
    "blank member id": (dict(member_id="   ", epoch=0, topics=(TOPIC,)), ErrorCode.invalid_request),
    "blank rack": (dict(member_id="m", epoch=0, topics=(TOPIC,), rack_id=""), ErrorCode.invalid_request),
    "epoch -2 (no static members)": (dict(member_id="m", epoch=-2), ErrorCode.invalid_request),
    "epoch far below": (dict(member_id="m", epoch=-(2**31)), ErrorCode.invalid_request),
    "join without subscription": (dict(member_id="m", epoch=0), ErrorCode.invalid_request),
    "join with empty subscription": (dict(member_id="m", epoch=0, topics=()), ErrorCode.invalid_request),
    "unknown member": (dict(member_id="nobody", epoch=1), ErrorCode.unknown_member_id),
    "unknown member leaving": (dict(member_id="nobody", epoch=-1), ErrorCode.unknown_member_id),
    "unknown group, epoch > 0": (dict(group="no-such-932", member_id="m", epoch=3), ErrorCode.group_id_not_found),
    "unknown group, leaving": (dict(group="no-such-932", member_id="m", epoch=-1), ErrorCode.group_id_not_found),
}


@pytest.mark.parametrize("case", list(CASES))
def test_invalid_heartbeat_gets_kafkas_error(fuzz_broker, member, case) -> None:
    fields, expected = CASES[case]
    fields = dict(fields)
    conn = Conn(fuzz_broker.port)
    try:
        r = heartbeat(conn, fields.pop("member_id"), fields.pop("epoch"), **fields)
    finally:
        conn.close()
    assert r.error_code == expected, (r.error_code, r.error_message)
    assert r.member_epoch == -1 and r.assignment is None
    assert r.error_message
    still_fine(fuzz_broker, member)


def test_stale_and_future_epochs_are_fenced(fuzz_broker, member) -> None:
    _, member_id, epoch, _ = member
    other = Conn(fuzz_broker.port)
    try:
        for wrong in (epoch + 1, epoch + 1_000_000, 2**31 - 1):
            r = heartbeat(other, member_id, wrong)
            assert r.error_code == ErrorCode.fenced_member_epoch, (wrong, r)
            assert r.assignment is None
    finally:
        other.close()
    still_fine(fuzz_broker, member)


def test_huge_subscription_is_answered_and_only_real_topics_are_assigned(fuzz_broker, member) -> None:
    conn = Conn(fuzz_broker.port)
    try:
        member_id = str(uuid.uuid4())
        names = (*(f"no-such-topic-{i}" for i in range(20_000)), TOPIC)
        r = heartbeat(conn, member_id, 0, group="hostile-932-huge", topics=names)
        assert r.error_code == ErrorCode.none, r
        [tp] = r.assignment.topic_partitions
        assert sorted(tp.partitions) == list(range(PARTITIONS))
        assert heartbeat(conn, member_id, r.member_epoch, group="hostile-932-huge").error_code == ErrorCode.none
        assert heartbeat(conn, member_id, -1, group="hostile-932-huge").error_code == ErrorCode.none
    finally:
        conn.close()
    still_fine(fuzz_broker, member)


def test_a_share_group_id_refuses_the_other_protocols_and_back(fuzz_broker, member) -> None:
    conn = Conn(fuzz_broker.port)
    try:
        # KIP-848 heartbeat on the share group's id
        r = conn.call(
            ConsumerGroupHeartbeatRequest(
                group_id=GroupId(GROUP),
                member_id=str(uuid.uuid4()),
                member_epoch=i32(0),
                instance_id=None,
                rack_id=None,
                rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
                subscribed_topic_names=(TopicName(TOPIC),),
                subscribed_topic_regex=None,
                server_assignor=None,
                topic_partitions=(),
            )
        )
        assert r.error_code == ErrorCode.group_id_not_found and "not a consumer group" in r.error_message
        # classic JoinGroup on the share group's id
        join_cls = JoinGroupRequest
        protocol = codec.nested(join_cls, "JoinGroupRequestProtocol")
        j = conn.call(
            join_cls(
                group_id=GroupId(GROUP),
                session_timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
                rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
                member_id="",
                group_instance_id=None,
                protocol_type="consumer",
                protocols=(protocol(name="range", metadata=b""),),
                reason=None,
            )
        )
        assert j.error_code == ErrorCode.inconsistent_group_protocol
        # a committed offset for a share group
        topic_cls = codec.nested(OffsetCommitRequest, "OffsetCommitRequestTopic")
        part_cls = codec.nested(OffsetCommitRequest, "OffsetCommitRequestPartition")
        c = conn.call(
            OffsetCommitRequest(
                group_id=GroupId(GROUP),
                generation_id_or_member_epoch=i32(-1),
                member_id="",
                group_instance_id=None,
                topics=(
                    topic_cls(
                        name=TopicName(TOPIC),
                        partitions=(
                            part_cls(
                                partition_index=i32(0),
                                committed_offset=i64(1),
                                committed_leader_epoch=i32(-1),
                                committed_metadata="",
                            ),
                        ),
                    ),
                ),
            )
        )
        assert c.topics[0].partitions[0].error_code == ErrorCode.group_id_not_found
        # committed offsets of a share group: there are none, the group is not found (Kafka)
        from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup

        f = conn.call(
            OffsetFetchRequest(
                groups=(OffsetFetchRequestGroup(group_id=GroupId(GROUP), topics=None),), require_stable=False
            )
        )
        assert f.groups[0].error_code == ErrorCode.group_id_not_found
        # classic DescribeGroups: not a classic group
        d = conn.call(DescribeGroupsRequest(groups=(GroupId(GROUP),), include_authorized_operations=False))
        assert d.groups[0].group_state == "Dead" and d.groups[0].members == ()
        # and a KIP-848 group's id refuses share members
        other = "hostile-932-consumer"
        found = conn.call(FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(other,)))
        assert found.coordinators[0].error_code == ErrorCode.none
        k = conn.call(
            ConsumerGroupHeartbeatRequest(
                group_id=GroupId(other),
                member_id=str(uuid.uuid4()),
                member_epoch=i32(0),
                instance_id=None,
                rack_id=None,
                rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
                subscribed_topic_names=(TopicName(TOPIC),),
                subscribed_topic_regex=None,
                server_assignor=None,
                topic_partitions=(),
            )
        )
        assert k.error_code == ErrorCode.none, k
        s = heartbeat(conn, str(uuid.uuid4()), 0, group=other, topics=(TOPIC,))
        assert s.error_code == ErrorCode.group_id_not_found and "not a share group" in s.error_message
        described = describe(conn, other, GROUP, "no-such-932", "")
        errors = [(g.group_id, g.error_code) for g in described.groups]
        assert errors == [
            (other, ErrorCode.group_id_not_found),
            (GROUP, ErrorCode.none),
            ("no-such-932", ErrorCode.group_id_not_found),
            ("", ErrorCode.invalid_group_id),
        ]
        mine = described.groups[1]
        assert mine.group_state == "Stable" and mine.assignor_name == "simple"
        assert [m.member_id for m in mine.members] == [member[1]]
        assert mine.members[0].assignment.topic_partitions[0].topic_name == TOPIC
        # ListGroups by type
        listed = {
            kind: {g.group_id for g in conn.call(ListGroupsRequest(states_filter=(), types_filter=(kind,))).groups}
            for kind in ("share", "consumer", "classic")
        }
        assert GROUP in listed["share"] and other not in listed["share"]
        assert other in listed["consumer"] and GROUP not in listed["consumer"]
        assert GROUP not in listed["classic"]
    finally:
        conn.close()
    still_fine(fuzz_broker, member)


def describe_offsets(conn: Conn, groups: dict[str, dict[str, list[int]] | None]) -> Any:
    from kio.schema.describe_share_group_offsets.v1.request import (
        DescribeShareGroupOffsetsRequest,
        DescribeShareGroupOffsetsRequestGroup,
        DescribeShareGroupOffsetsRequestTopic,
    )

    return conn.call(
        DescribeShareGroupOffsetsRequest(
            groups=tuple(
                DescribeShareGroupOffsetsRequestGroup(
                    group_id=GroupId(g),
                    topics=None
                    if topics is None
                    else tuple(
                        DescribeShareGroupOffsetsRequestTopic(
                            topic_name=TopicName(t), partitions=tuple(i32(p) for p in ps)
                        )
                        for t, ps in topics.items()
                    ),
                )
                for g, topics in groups.items()
            )
        )
    )


def alter_offsets(conn: Conn, group: str, offsets: list[tuple[str, int, int]]) -> Any:
    from kio.schema.alter_share_group_offsets.v0.request import (
        AlterShareGroupOffsetsRequest,
        AlterShareGroupOffsetsRequestPartition,
        AlterShareGroupOffsetsRequestTopic,
    )

    by_topic: dict[str, list[tuple[int, int]]] = {}
    for t, p, o in offsets:
        by_topic.setdefault(t, []).append((p, o))
    return conn.call(
        AlterShareGroupOffsetsRequest(
            group_id=GroupId(group),
            topics=tuple(
                AlterShareGroupOffsetsRequestTopic(
                    topic_name=TopicName(t),
                    partitions=tuple(
                        AlterShareGroupOffsetsRequestPartition(partition_index=i32(p), start_offset=i64(o))
                        for p, o in ps
                    ),
                )
                for t, ps in by_topic.items()
            ),
        )
    )


def test_hostile_share_offsets_requests(fuzz_broker, member) -> None:
    conn = Conn(fuzz_broker.port)
    try:
        # many groups at once, an empty id, an unknown one, a live share group with absurd partitions
        groups: dict[str, dict[str, list[int]] | None] = {f"no-such-share-{i}": None for i in range(2_000)}
        groups[""] = None
        groups[GROUP] = {TOPIC: [-1, 0, PARTITIONS, 2**31 - 1], "no-such-topic": list(range(5_000))}
        r = describe_offsets(conn, groups)
        by_id = {g.group_id: g for g in r.groups}
        assert len(r.groups) == len(groups)
        assert by_id[""].error_code == ErrorCode.invalid_group_id
        assert {by_id[f"no-such-share-{i}"].error_code for i in range(2_000)} == {ErrorCode.group_id_not_found}
        mine = by_id[GROUP]
        assert mine.error_code == ErrorCode.none
        errors = {(t.topic_name, p.partition_index): p.error_code for t in mine.topics for p in t.partitions}
        assert errors[(TOPIC, 0)] == ErrorCode.none
        for bad in (-1, PARTITIONS, 2**31 - 1):
            assert errors[(TOPIC, bad)] == ErrorCode.unknown_topic_or_partition
        assert {e for (t, _), e in errors.items() if t == "no-such-topic"} == {ErrorCode.unknown_topic_or_partition}

        # the live group has a member: no changes, whatever they ask
        r = alter_offsets(conn, GROUP, [(TOPIC, 0, 0)])
        assert r.error_code == ErrorCode.non_empty_group and r.responses == ()
        assert alter_offsets(conn, "", [(TOPIC, 0, 0)]).error_code == ErrorCode.invalid_group_id
        empty = "hostile-932-empty"
        r = alter_offsets(
            conn,
            empty,
            [(TOPIC, 0, -1), (TOPIC, 1, -(2**63)), (TOPIC, -7, 0), (TOPIC, 2, 2**63 - 1), ("no-such-topic", 0, 1)],
        )
        assert r.error_code == ErrorCode.none
        got = {(t.topic_name, p.partition_index): p.error_code for t in r.responses for p in t.partitions}
        assert got == {
            (TOPIC, 0): ErrorCode.invalid_request,
            (TOPIC, 1): ErrorCode.invalid_request,
            (TOPIC, -7): ErrorCode.unknown_topic_or_partition,
            (TOPIC, 2): ErrorCode.none,  # beyond the log end: nothing is delivered until records reach it
            ("no-such-topic", 0): ErrorCode.unknown_topic_or_partition,
        }
        d = describe_offsets(conn, {empty: None})
        [g] = d.groups
        assert [(p.partition_index, p.start_offset, p.lag) for t in g.topics for p in t.partitions] == [
            (2, 2**63 - 1, 0)
        ]
    finally:
        conn.close()
    still_fine(fuzz_broker, member)


def test_share_state_apis_called_by_a_client_are_answered(fuzz_broker, member) -> None:
    """The inter-broker share-state APIs with unknown topic ids, an empty group id, and state
    batches (only a start-offset reset is accepted): answered per partition, nothing changes."""
    from kio.schema.delete_share_group_state.v0.request import DeleteShareGroupStateRequest
    from kio.schema.read_share_group_state_summary.v1.request import ReadShareGroupStateSummaryRequest
    from kio.schema.write_share_group_state.v1.request import WriteShareGroupStateRequest

    _, _, _, topic_id = member
    conn = Conn(fuzz_broker.port)
    try:
        rc = ReadShareGroupStateSummaryRequest
        read = conn.call(
            rc(
                group_id=GROUP,
                topics=(
                    codec.nested(rc, "ReadStateSummaryData")(
                        topic_id=uuid.uuid4(),
                        partitions=(codec.nested(rc, "PartitionData")(partition=0, leader_epoch=-1),),
                    ),
                    codec.nested(rc, "ReadStateSummaryData")(
                        topic_id=topic_id,
                        partitions=(codec.nested(rc, "PartitionData")(partition=99, leader_epoch=-1),),
                    ),
                ),
            )
        )
        assert [r.partitions[0].error_code for r in read.results] == [
            ErrorCode.unknown_topic_or_partition,
            ErrorCode.unknown_topic_or_partition,
        ]
        wc = WriteShareGroupStateRequest
        batch = codec.nested(wc, "StateBatch")(first_offset=0, last_offset=5, delivery_state=2, delivery_count=1)
        write = conn.call(
            wc(
                group_id=GROUP,
                topics=(
                    codec.nested(wc, "WriteStateData")(
                        topic_id=topic_id,
                        partitions=(
                            codec.nested(wc, "PartitionData")(
                                partition=0,
                                state_epoch=0,
                                leader_epoch=-1,
                                start_offset=0,
                                delivery_complete_count=0,
                                state_batches=(batch,),
                            ),
                        ),
                    ),
                ),
            )
        )
        assert write.results[0].partitions[0].error_code == ErrorCode.invalid_request
        dc = DeleteShareGroupStateRequest
        delete = conn.call(
            dc(
                group_id="",
                topics=(
                    codec.nested(dc, "DeleteStateData")(
                        topic_id=topic_id, partitions=(codec.nested(dc, "PartitionData")(partition=0),)
                    ),
                ),
            )
        )
        assert delete.results[0].partitions[0].error_code == ErrorCode.invalid_group_id
    finally:
        conn.close()
    still_fine(fuzz_broker, member)
