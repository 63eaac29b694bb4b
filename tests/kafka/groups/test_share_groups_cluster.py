"""KIP-932 share groups, group side, against real brokers (BrokerService with its Kafka server,
a controller, the file object store): per-group configs set with confluent-kafka's admin client
reach every broker (the share-partition leaders read them), bad ones get INVALID_CONFIG; and a
share group's members and epochs survive their coordinator's broker stopping (the group is
reloaded from __consumer_offsets by the next coordinator; members heartbeat on, no rejoin)."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i8, i32

from automq.broker.kafka import codec
from automq.broker.kafka.groups.share_settings import share_settings

TOPIC = "sg-cluster"
RETRIABLE = {ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available, ErrorCode.not_coordinator}


def call(port: int, request: Any) -> Any:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        frame = codec.encode_request(1, request, client_id="sg-test")
        s.sendall(struct.pack(">i", len(frame)) + frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = s.recv(1 << 16)
            assert chunk, "the broker closed the connection"
            data += chunk
    _, response = codec.decode_response(data[4:], type(request))
    return response


def heartbeat(port: int, group: str, member: str, epoch: int, topics: tuple[str, ...] | None = None) -> Any:
    return call(
        port,
        ShareGroupHeartbeatRequest(
            group_id=GroupId(group),
            member_id=member,
            member_epoch=i32(epoch),
            subscribed_topic_names=None if topics is None else tuple(TopicName(t) for t in topics),
        ),
    )


def retrying(fn, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        r = fn()
        if r.error_code not in RETRIABLE or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def coordinator_port(ports: dict[int, int], group: str) -> int:
    any_port = next(iter(ports.values()))

    def find() -> Any:
        return call(any_port, FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(group,))).coordinators[0]

    c = retrying(find)
    assert c.error_code == ErrorCode.none, c
    return int(c.port)


def admin_configs(bootstrap: str, group: str) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})

    def alter(*entries: ConfigEntry) -> None:
        resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=list(entries))
        admin.incremental_alter_configs([resource])[resource].result(30)

    def describe() -> dict[str, Any]:
        resource = ConfigResource(ResourceType.GROUP, group)
        return admin.describe_configs([resource])[resource].result(30)

    out: dict[str, Any] = {}
    alter(
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("share.record.lock.duration.ms", "15000", incremental_operation=AlterConfigOpType.SET),
    )
    out["after_set"] = {k: (v.value, v.source) for k, v in describe().items()}
    for bad in (
        ConfigEntry("share.auto.offset.reset", "sometimes", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("share.delivery.count.limit", "1", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("consumer.session.timeout.ms", "soon", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET),
    ):
        try:
            alter(bad)
            out.setdefault("bad", []).append((bad.name, None))
        except Exception as exc:
            out.setdefault("bad", []).append((bad.name, str(exc)))
    alter(ConfigEntry("share.record.lock.duration.ms", None, incremental_operation=AlterConfigOpType.DELETE))
    out["after_delete"] = {k: (v.value, v.source) for k, v in describe().items()}
    return out


async def test_group_configs_reach_every_broker(real_cluster) -> None:
    default_source, group_source = 5, 8  # Kafka's ConfigSource DEFAULT_CONFIG, GROUP_CONFIG
    b1 = await real_cluster.start_broker(1)
    b2 = await real_cluster.start_broker(2)
    group = "sg-configs"
    default = share_settings(b2.broker, group)
    assert (default.auto_offset_reset, default.record_lock_duration_ms) == ("latest", 30_000)
    out = await asyncio.to_thread(admin_configs, f"{b1.bootstrap},{b2.bootstrap}", group)
    after = out["after_set"]
    assert after["share.auto.offset.reset"][0] == "earliest"
    assert after["share.record.lock.duration.ms"][0] == "15000"
    assert after["share.delivery.count.limit"] == ("5", default_source)
    assert after["share.auto.offset.reset"][1] == group_source
    bad = dict(out["bad"])
    assert all(bad[name] and "INVALID_CONFIG" in bad[name] for name in bad), bad
    assert "sometimes" in bad["share.auto.offset.reset"]
    assert out["after_delete"]["share.record.lock.duration.ms"] == ("30000", default_source)
    # both brokers see the group's settings (the admin call waits for the local image only)
    deadline = time.monotonic() + 30
    while share_settings(b2.broker, group).auto_offset_reset != "earliest" and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    for b in (b1, b2):
        s = share_settings(b.broker, group)
        assert (s.auto_offset_reset, s.record_lock_duration_ms) == ("earliest", 30_000)
    assert share_settings(b1.broker, "another-group").auto_offset_reset == "latest"


async def test_share_group_survives_its_coordinator_stopping(real_cluster) -> None:
    fast = {"offsets_topic_num_partitions": 1, "group_share_session_timeout_ms": 60_000}
    b1 = await real_cluster.start_broker(1, **fast)
    b2 = await real_cluster.start_broker(2, **fast)
    await b1.broker.ensure_topic(TOPIC, partitions=4)
    group = "sg-durable"
    ports = {1: b1.kafka_ports["PLAINTEXT"], 2: b2.kafka_ports["PLAINTEXT"]}
    port = await asyncio.to_thread(coordinator_port, ports, group)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    ra = await asyncio.to_thread(retrying, lambda: heartbeat(port, group, a, 0, (TOPIC,)))
    assert ra.error_code == ErrorCode.none, ra
    rb = await asyncio.to_thread(heartbeat, port, group, b, 0, (TOPIC,))
    assert (rb.error_code, rb.member_epoch) == (ErrorCode.none, 2)
    ra = await asyncio.to_thread(heartbeat, port, group, a, ra.member_epoch)
    assert (ra.error_code, ra.member_epoch) == (ErrorCode.none, 2)
    parts = {m: {p for tp in r.assignment.topic_partitions for p in tp.partitions} for m, r in ((a, ra), (b, rb))}
    assert parts[a] | parts[b] == {0, 1, 2, 3} and not parts[a] & parts[b]

    node = next(n for n, p in ports.items() if p == port)
    await real_cluster.stop_broker(node)
    survivor = ports[3 - node]
    # the next coordinator replays the group: the same epochs are accepted, nobody rejoins
    for member in (a, b):
        r = await asyncio.to_thread(retrying, lambda member=member: heartbeat(survivor, group, member, 2), 90)
        assert (r.error_code, r.member_epoch) == (ErrorCode.none, 2), r
    described = await asyncio.to_thread(
        call, survivor, ShareGroupDescribeRequest(group_ids=(GroupId(group),), include_authorized_operations=False)
    )
    [g] = described.groups
    assert (g.error_code, g.group_state, g.group_epoch) == (ErrorCode.none, "Stable", 2)
    assert {m.member_id: {p for tp in m.assignment.topic_partitions for p in tp.partitions} for m in g.members} == parts
    # a transactional offset commit (no member information) cannot give a share group offsets
    survivor_groups = real_cluster.brokers[3 - node].broker.groups
    refused = await survivor_groups.txn_commit(
        group_id=group,
        producer_id=1,
        producer_epoch=0,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=[(TOPIC, 0, 5, -1, "")],
    )
    assert refused == {(TOPIC, 0): ErrorCode.group_id_not_found}
    # it is the survivor that holds the group now, loaded from the log
    moved = real_cluster.brokers[3 - node].broker.groups.manager.groups[group].share
    assert moved is not None and (moved.group_epoch, set(moved.members)) == (2, {a, b})
    # a wrong epoch is still fenced by the new coordinator
    stale = await asyncio.to_thread(heartbeat, survivor, group, a, 3)
    assert stale.error_code == ErrorCode.fenced_member_epoch
    from prometheus_client import generate_latest

    text = generate_latest(real_cluster.brokers[3 - node].broker.registry).decode()
    assert 'kafka_coordinator_groups{state="Stable",type="share"} 1.0' in text
    assert 'kafka_coordinator_members{type="share"} 2.0' in text
    assert 'kafka_coordinator_share_member_fencings_total{reason="epoch"} 1.0' in text
    assert 'kafka_coordinator_share_member_fencings_total{reason="session_timeout"} 0.0' in text


def describe_offsets(port: int, group: str, topics: dict[str, list[int]] | None) -> Any:
    from kio.schema.describe_share_group_offsets.v1.request import (
        DescribeShareGroupOffsetsRequest,
        DescribeShareGroupOffsetsRequestGroup,
        DescribeShareGroupOffsetsRequestTopic,
    )

    wanted = (
        None
        if topics is None
        else tuple(
            DescribeShareGroupOffsetsRequestTopic(topic_name=TopicName(t), partitions=tuple(i32(p) for p in ps))
            for t, ps in topics.items()
        )
    )
    r = call(
        port,
        DescribeShareGroupOffsetsRequest(
            groups=(DescribeShareGroupOffsetsRequestGroup(group_id=GroupId(group), topics=wanted),)
        ),
    )
    [g] = r.groups
    return g


def offsets_of(g: Any) -> dict[tuple[str, int], tuple[int, int, ErrorCode]]:
    return {
        (t.topic_name, p.partition_index): (p.start_offset, p.lag, p.error_code) for t in g.topics for p in t.partitions
    }


def alter_offsets(port: int, group: str, offsets: dict[tuple[str, int], int]) -> Any:
    from kio.schema.alter_share_group_offsets.v0.request import (
        AlterShareGroupOffsetsRequest,
        AlterShareGroupOffsetsRequestPartition,
        AlterShareGroupOffsetsRequestTopic,
    )
    from kio.static.primitive import i64

    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (t, p), o in offsets.items():
        by_topic.setdefault(t, []).append((p, o))
    return call(
        port,
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
        ),
    )


def delete_offsets(port: int, group: str, topics: list[str]) -> Any:
    from kio.schema.delete_share_group_offsets.v0.request import (
        DeleteShareGroupOffsetsRequest,
        DeleteShareGroupOffsetsRequestTopic,
    )

    return call(
        port,
        DeleteShareGroupOffsetsRequest(
            group_id=GroupId(group),
            topics=tuple(DeleteShareGroupOffsetsRequestTopic(topic_name=TopicName(t)) for t in topics),
        ),
    )


def produce(bootstrap: str, topic: str, per_partition: int, partitions: int, start: int = 0) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(start, start + per_partition * partitions):
        p.produce(topic, value=str(i).encode(), partition=i % partitions)
    assert p.flush(30) == 0


async def test_share_group_offsets_admin_across_brokers(real_cluster) -> None:
    """Alter, describe and delete a share group's start offsets on partitions led by both
    brokers (the coordinator calls the other broker's leader with the inter-broker share-state
    APIs); a group with members refuses changes; DeleteGroups removes the state with the group."""
    b1 = await real_cluster.start_broker(1, offsets_topic_num_partitions=1)
    b2 = await real_cluster.start_broker(2, offsets_topic_num_partitions=1)
    await b1.broker.ensure_topic(TOPIC, partitions=4)
    await asyncio.to_thread(produce, f"{b1.bootstrap},{b2.bootstrap}", TOPIC, 10, 4)
    leaders = {p: b1.broker.leader_of(TOPIC, p)[0] for p in range(4)}  # type: ignore[index]
    assert set(leaders.values()) == {1, 2}, leaders  # both brokers lead some: remote calls happen
    group = "sg-admin"
    ports = {1: b1.kafka_ports["PLAINTEXT"], 2: b2.kafka_ports["PLAINTEXT"]}
    port = await asyncio.to_thread(coordinator_port, ports, group)

    # Alter on an unknown group creates an empty share group (as Kafka)
    offsets = {(TOPIC, 0): 3, (TOPIC, 1): 7, (TOPIC, 2): 0, (TOPIC, 3): 10}
    r = await asyncio.to_thread(retrying, lambda: alter_offsets(port, group, offsets))
    assert r.error_code == ErrorCode.none, r
    assert [(p.partition_index, p.error_code) for t in r.responses for p in t.partitions] == [
        (0, ErrorCode.none),
        (1, ErrorCode.none),
        (2, ErrorCode.none),
        (3, ErrorCode.none),
    ]
    g = await asyncio.to_thread(describe_offsets, port, group, None)
    assert g.error_code == ErrorCode.none
    assert offsets_of(g) == {
        (TOPIC, 0): (3, 7, ErrorCode.none),
        (TOPIC, 1): (7, 3, ErrorCode.none),
        (TOPIC, 2): (0, 10, ErrorCode.none),
        (TOPIC, 3): (10, 0, ErrorCode.none),
    }
    coordinator = {ports[1]: b1, ports[2]: b2}[port].broker.groups
    assert coordinator.share_state._connections, "partitions led by the other broker were reached over the wire"
    # named partitions: one without state, one that does not exist, an unknown topic
    g = await asyncio.to_thread(describe_offsets, port, group, {TOPIC: [1, 9], "no-such-topic": [0]})
    got = offsets_of(g)
    assert got[(TOPIC, 1)] == (7, 3, ErrorCode.none)
    assert got[(TOPIC, 9)][2] == ErrorCode.unknown_topic_or_partition
    assert got[("no-such-topic", 0)][2] == ErrorCode.unknown_topic_or_partition

    # hostile alters: negative offset, unknown partition; a consumer group's id
    r = await asyncio.to_thread(alter_offsets, port, group, {(TOPIC, 0): -5, (TOPIC, 99): 1, ("nope", 0): 1})
    errors = {(t.topic_name, p.partition_index): p.error_code for t in r.responses for p in t.partitions}
    assert errors == {
        (TOPIC, 0): ErrorCode.invalid_request,
        (TOPIC, 99): ErrorCode.unknown_topic_or_partition,
        ("nope", 0): ErrorCode.unknown_topic_or_partition,
    }

    # a member joins: changes are refused while the group has members
    member = str(uuid.uuid4())
    hb = await asyncio.to_thread(heartbeat, port, group, member, 0, (TOPIC,))
    assert hb.error_code == ErrorCode.none, hb
    r = await asyncio.to_thread(alter_offsets, port, group, {(TOPIC, 0): 1})
    assert r.error_code == ErrorCode.non_empty_group
    r = await asyncio.to_thread(delete_offsets, port, group, [TOPIC])
    assert r.error_code == ErrorCode.non_empty_group
    assert (await asyncio.to_thread(heartbeat, port, group, member, -1)).error_code == ErrorCode.none

    # delete a topic's offsets: the state is gone from every partition
    r = await asyncio.to_thread(delete_offsets, port, group, [TOPIC, "no-such-topic"])
    assert r.error_code == ErrorCode.none
    assert {t.topic_name: t.error_code for t in r.responses} == {
        TOPIC: ErrorCode.none,
        "no-such-topic": ErrorCode.unknown_topic_or_partition,
    }
    g = await asyncio.to_thread(describe_offsets, port, group, None)
    assert offsets_of(g) == {}

    # DeleteGroups of a share group removes its state too
    await asyncio.to_thread(alter_offsets, port, group, {(TOPIC, 0): 2, (TOPIC, 1): 2})
    from kio.schema.delete_groups.v2.request import DeleteGroupsRequest

    d = await asyncio.to_thread(call, port, DeleteGroupsRequest(groups_names=(GroupId(group),)))
    assert d.results[0].error_code == ErrorCode.none
    assert await b1.broker.share_partitions.store.streams_of_group(group) == []
    g = await asyncio.to_thread(describe_offsets, port, group, None)
    assert g.error_code == ErrorCode.group_id_not_found

    # a KIP-848/classic group id is not a share group
    g = await asyncio.to_thread(describe_offsets, port, "never-seen", None)
    assert g.error_code == ErrorCode.group_id_not_found


class ShareMember(threading.Thread):
    """A librdkafka ShareConsumer accepting every record; counts what its commits confirmed."""

    def __init__(self, bootstrap: str, group: str, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap, self.group = bootstrap, group
        self.accepted: Counter[int] = Counter()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from confluent_kafka import ShareConsumer

        try:
            c = ShareConsumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": self.group,
                    "client.id": self.name,
                    "share.acknowledgement.mode": "explicit",
                }
            )
            c.subscribe([TOPIC])
            while not self.stop_flag.is_set():
                batch = [m for m in c.poll(0.2) if m.error() is None]
                if not batch:
                    continue
                for m in batch:
                    c.acknowledge(m)
                failed = {tp.partition for tp, err in c.commit_sync(30).items() if err is not None}
                self.accepted.update(int(m.value()) for m in batch if m.partition() not in failed)
            c.close()
        except BaseException as exc:
            self.error = exc


@pytest.mark.slow
async def test_share_consumers_keep_their_membership_when_the_coordinator_stops(real_cluster) -> None:
    """Two ShareConsumers (librdkafka) on 2 brokers; the broker coordinating their group stops:
    the other broker loads the group from __consumer_offsets and the members heartbeat on with
    their epochs (nobody is fenced or rejoins); every record is acknowledged, none twice."""
    settings = {
        "offsets_topic_num_partitions": 1,
        "group_share_heartbeat_interval_ms": 300,
        "group_share_session_timeout_ms": 30_000,
        "group_share_record_lock_duration_ms": 5_000,
    }
    b1 = await real_cluster.start_broker(1, **settings)
    b2 = await real_cluster.start_broker(2, **settings)
    await b1.broker.ensure_topic(TOPIC, partitions=4)
    bootstrap = f"{b1.bootstrap},{b2.bootstrap}"
    group = "sg-move"
    await asyncio.to_thread(set_earliest, bootstrap, group)
    await asyncio.to_thread(produce, bootstrap, TOPIC, 25, 4)
    members = [ShareMember(bootstrap, group, f"sg-move-{n}") for n in "ab"]
    for m in members:
        m.start()

    def coordinator() -> tuple[int, Any]:
        for node_id, service in real_cluster.brokers.items():
            g = service.broker.groups.manager.groups.get(group)
            if g is not None and g.share is not None and g.share.members:
                return node_id, g.share
        return -1, None

    try:
        await wait_for(lambda: any(m.error for m in members) or sum(map(total, members)) >= 100)
        # both members heartbeated since the second joined: everyone at the group's epoch
        await wait_for(
            lambda: (
                coordinator()[1] is not None
                and len(coordinator()[1].members) == 2
                and {m.member_epoch for m in coordinator()[1].members.values()} == {coordinator()[1].assignment_epoch}
            )
        )
        node, data = coordinator()
        epochs = {mid: m.member_epoch for mid, m in data.members.items()}
        await real_cluster.stop_broker(node)
        await asyncio.to_thread(produce, real_cluster.brokers[3 - node].bootstrap, TOPIC, 25, 4, 100)
        await wait_for(lambda: coordinator()[0] == 3 - node)
        await wait_for(lambda: any(m.error for m in members) or sum(map(total, members)) >= 200, timeout=120)
        moved = coordinator()[1]
        # the same members at the same epochs (a rejoin would have bumped the group epoch)
        assert {mid: m.member_epoch for mid, m in moved.members.items()} == epochs
        assert real_cluster.brokers[3 - node].broker.groups.manager.share_fencings == {"epoch": 0, "session_timeout": 0}
    finally:
        for m in members:
            m.stop_flag.set()
        for m in members:
            await asyncio.to_thread(m.join, 30)
    assert [m.error for m in members] == [None, None]
    everything: Counter[int] = Counter()
    for m in members:
        everything.update(m.accepted)
    assert sorted(everything) == list(range(200))
    assert [v for v, n in everything.items() if n > 1] == []


def total(m: ShareMember) -> int:
    return len(m.accepted)


def set_earliest(bootstrap: str, group: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer comes
    admin.incremental_alter_configs([resource])[resource].result(30)


async def wait_for(condition, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_share_groups_turned_off_are_neither_advertised_nor_served(real_cluster) -> None:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    from automq.broker.kafka.handlers.registry import SHARE_GROUP_APIS

    off = await real_cluster.start_broker(1, group_share_enable=False)
    port = off.kafka_ports["PLAINTEXT"]
    r = await asyncio.to_thread(call, port, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    advertised = {k.api_key for k in r.api_keys}
    assert not advertised & SHARE_GROUP_APIS and {0, 1, 68} <= advertised

    def closed_on_heartbeat() -> bool:
        try:
            heartbeat(port, "g", str(uuid.uuid4()), 0, (TOPIC,))
        except AssertionError as exc:  # call(): "the broker closed the connection"
            return "closed" in str(exc)
        return False

    assert await asyncio.to_thread(closed_on_heartbeat)
    again = await asyncio.to_thread(
        call, port, ApiVersionsRequest(client_software_name="t", client_software_version="1")
    )
    assert again.error_code == ErrorCode.none  # still serving


async def test_assigned_partitions_are_initialized_before_the_first_fetch(real_cluster) -> None:
    """With share.auto.offset.reset=latest (the default), the state of a partition is created
    when it is first assigned (the coordinator asks each leader, the other broker's through
    InitializeShareGroupState), so records produced after the assignment but before any fetch
    are the group's to consume; deleted offsets are initialized again on the next assignment."""
    b1 = await real_cluster.start_broker(1, offsets_topic_num_partitions=1)
    b2 = await real_cluster.start_broker(2, offsets_topic_num_partitions=1)
    await b1.broker.ensure_topic(TOPIC, partitions=4)
    bootstrap = f"{b1.bootstrap},{b2.bootstrap}"
    await asyncio.to_thread(produce, bootstrap, TOPIC, 5, 4)  # before the group: not the group's
    group = "sg-init"
    ports = {1: b1.kafka_ports["PLAINTEXT"], 2: b2.kafka_ports["PLAINTEXT"]}
    port = await asyncio.to_thread(coordinator_port, ports, group)
    member = str(uuid.uuid4())
    r = await asyncio.to_thread(retrying, lambda: heartbeat(port, group, member, 0, (TOPIC,)))
    assert r.error_code == ErrorCode.none, r
    store = b1.broker.share_partitions.store

    async def initialized(n: int) -> None:
        deadline = time.monotonic() + 30
        while len(await store.streams_of_group(group)) != n:
            assert time.monotonic() < deadline, await store.streams_of_group(group)
            await asyncio.sleep(0.1)

    await initialized(4)  # no ShareFetch was sent: the coordinator did it
    await asyncio.to_thread(produce, bootstrap, TOPIC, 3, 4, 20)
    g = await asyncio.to_thread(describe_offsets, port, group, None)
    assert offsets_of(g) == {(TOPIC, p): (5, 3, ErrorCode.none) for p in range(4)}

    # state deleted while the group is empty comes back when the partitions are assigned again
    assert (await asyncio.to_thread(heartbeat, port, group, member, -1)).error_code == ErrorCode.none
    assert (await asyncio.to_thread(delete_offsets, port, group, [TOPIC])).error_code == ErrorCode.none
    await initialized(0)
    r = await asyncio.to_thread(heartbeat, port, group, member, 0, (TOPIC,))
    assert r.error_code == ErrorCode.none, r
    await initialized(4)
    g = await asyncio.to_thread(describe_offsets, port, group, None)
    assert offsets_of(g) == {(TOPIC, p): (8, 0, ErrorCode.none) for p in range(4)}


async def test_kip848_group_configs_take_effect(real_cluster) -> None:
    """consumer.heartbeat.interval.ms / consumer.session.timeout.ms set on one KIP-848 group:
    its members are told that interval, and a silent member leaves after that timeout; another
    group keeps the broker's settings."""
    import datetime

    from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
    from kio.schema.incremental_alter_configs.v1.request import (
        AlterableConfig,
        AlterConfigsResource,
        IncrementalAlterConfigsRequest,
    )

    b1 = await real_cluster.start_broker(1, offsets_topic_num_partitions=1)
    await b1.broker.ensure_topic(TOPIC, partitions=2)
    port = b1.kafka_ports["PLAINTEXT"]
    r = await asyncio.to_thread(
        call,
        port,
        IncrementalAlterConfigsRequest(
            resources=(
                AlterConfigsResource(
                    resource_type=32,
                    resource_name="k-conf",
                    configs=(
                        AlterableConfig(name="consumer.heartbeat.interval.ms", config_operation=0, value="1234"),
                        AlterableConfig(name="consumer.session.timeout.ms", config_operation=0, value="1500"),
                    ),
                ),
            ),
            validate_only=False,
        ),
    )
    assert r.responses[0].error_code == ErrorCode.none, r

    def join(group: str) -> Any:
        return call(
            port,
            ConsumerGroupHeartbeatRequest(
                group_id=group,
                member_id=str(uuid.uuid4()),
                member_epoch=0,
                rebalance_timeout=datetime.timedelta(seconds=30),
                subscribed_topic_names=(TOPIC,),
                topic_partitions=(),
            ),
        )

    await asyncio.to_thread(coordinator_port, {1: port}, "k-conf")  # creates __consumer_offsets
    configured = await asyncio.to_thread(retrying, lambda: join("k-conf"))
    plain = await asyncio.to_thread(retrying, lambda: join("k-plain"))
    assert configured.error_code == plain.error_code == ErrorCode.none
    assert configured.heartbeat_interval == datetime.timedelta(milliseconds=1234)
    assert plain.heartbeat_interval == datetime.timedelta(milliseconds=5000)
    groups = b1.broker.groups.manager.groups
    deadline = time.monotonic() + 30
    while groups["k-conf"].consumer.members:  # silent: removed after 1.5 s, not the broker's 45 s
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert len(groups["k-plain"].consumer.members) == 1
