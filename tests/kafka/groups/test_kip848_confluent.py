"""librdkafka's KIP-848 consumer (`group.protocol=consumer`) against real brokers: members
joining and leaving under load share the partitions without overlap, every record is
consumed exactly once with committed offsets, the AdminClient describes and lists the group
by type, and a coordinator move (its broker stops) keeps the group going."""

from __future__ import annotations

import asyncio

import pytest
from rdkafka_member import RdkafkaMember, produce_numbered, wait_for

TOPIC = "k848"
PARTITIONS = 6
GROUP = "k848-grp"
FAST = {"group_consumer_heartbeat_interval_ms": 300, "group_consumer_session_timeout_ms": 6_000}


def produce(bootstrap: str, start: int, count: int) -> None:
    produce_numbered(bootstrap, TOPIC, PARTITIONS, start, count)


class Member(RdkafkaMember):
    """A group.protocol=consumer member committing every record it sees."""

    def __init__(self, bootstrap: str, name: str) -> None:
        super().__init__(bootstrap, name, group=GROUP, topic=TOPIC, settings={"group.protocol": "consumer"})


def settled(members: list[Member]) -> bool:
    parts = [m.assigned for m in members]
    union = frozenset().union(*parts)
    return all(parts) and sum(len(p) for p in parts) == PARTITIONS and union == frozenset(range(PARTITIONS))


def committed(bootstrap: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        return {
            tp.partition: tp.offset
            for tp in c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=20)
        }
    finally:
        c.close()


def describe(bootstrap: str):
    from confluent_kafka import ConsumerGroupType
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([GROUP])[GROUP].result(30)
    listed = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(30)
    classic = admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}).result(30)
    return described, [g.group_id for g in listed.valid], [g.group_id for g in classic.valid]


@pytest.fixture
def members():
    """Every Member a test starts is stopped when it ends, passed or failed."""
    started: list[Member] = []
    yield started
    for m in started:
        m.stop_flag.set()
    for m in started:
        m.join(30)


@pytest.mark.slow
async def test_kip848_members_join_and_leave_exactly_once(real_cluster, members) -> None:
    broker = await real_cluster.start_broker(1, **FAST)
    await broker.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = broker.bootstrap
    await asyncio.to_thread(produce, bootstrap, 0, 120)

    a = Member(bootstrap, "k-a")
    members.append(a)
    a.start()
    await wait_for(
        lambda: a.error or (len(a.seen) == 120 and a.assigned == frozenset(range(PARTITIONS))),
        state=lambda: (len(a.seen), sorted(a.assigned), a.errors[-3:]),
    )
    b = Member(bootstrap, "k-b")
    c = Member(bootstrap, "k-c")
    members += [b, c]
    b.start()
    c.start()
    produced = 120
    # produce while the group reconciles: revocations happen with records in flight
    for _ in range(5):
        await asyncio.to_thread(produce, bootstrap, produced, 60)
        produced += 60
    await wait_for(
        lambda: any(m.error for m in members) or settled(members),
        state=lambda: (
            [(m.name, sorted(m.assigned), m.errors[-3:]) for m in members],
            broker.broker.groups.manager.groups[GROUP].consumer,
        ),
    )
    assert [m.error for m in members] == [None, None, None]
    assert all(len(m.assigned) == 2 for m in members)  # uniform: 6 partitions over 3 members

    described, consumer_groups, classic_groups = await asyncio.to_thread(describe, bootstrap)
    assert GROUP in consumer_groups and GROUP not in classic_groups
    assert len(described.members) == 3
    assert {m.client_id for m in described.members} == {"k-a", "k-b", "k-c"}
    assert str(described.type).endswith("CONSUMER")

    # one member leaves; the others take its partitions over
    b.stop_flag.set()
    await asyncio.to_thread(b.join, 30)
    await asyncio.to_thread(produce, bootstrap, produced, 60)
    produced += 60
    group = broker.broker.groups.manager.groups[GROUP]
    await wait_for(
        lambda: a.error or c.error or settled([a, c]),
        state=lambda: ([(m.name, sorted(m.assigned), m.errors[-3:]) for m in (a, c)], group.consumer),
    )
    await wait_for(
        lambda: len(a.seen) + len(b.seen) + len(c.seen) >= produced,
        state=lambda: (
            len(a.seen),
            len(b.seen),
            len(c.seen),
            produced,
            sorted({i % PARTITIONS for i in set(range(produced)) - set(a.seen + b.seen + c.seen)}),
            [(m.name, sorted(m.assigned), m.errors[-3:], m.error) for m in (a, b, c)],
            group.consumer,
        ),
    )
    everything = sorted(a.seen + b.seen + c.seen)
    assert everything == list(range(produced)), "every record exactly once across the group"
    for m in (a, c):
        m.stop_flag.set()
    await asyncio.to_thread(a.join, 30)
    await asyncio.to_thread(c.join, 30)
    assert await asyncio.to_thread(committed, bootstrap) == dict.fromkeys(range(PARTITIONS), produced // PARTITIONS)


@pytest.mark.slow
async def test_kip848_group_survives_its_coordinator_moving(real_cluster, members) -> None:
    b1 = await real_cluster.start_broker(1, offsets_topic_num_partitions=1, **FAST)
    b2 = await real_cluster.start_broker(2, offsets_topic_num_partitions=1, **FAST)
    await b1.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    await asyncio.to_thread(produce, b1.bootstrap, 0, 60)
    bootstrap = f"{b1.bootstrap},{b2.bootstrap}"
    a = Member(bootstrap, "m-a")
    b = Member(bootstrap, "m-b")
    members += [a, b]
    a.start()
    b.start()
    await wait_for(lambda: a.error or b.error or (settled([a, b]) and len(a.seen) + len(b.seen) >= 60))

    def coordinator() -> tuple[int, object]:
        for node_id, service in real_cluster.brokers.items():
            group = service.broker.groups.manager.groups.get(GROUP)
            if group is not None and group.consumer is not None:
                return node_id, group.consumer
        return -1, None

    node, data = coordinator()
    assert node in (1, 2)
    epoch_before = data.group_epoch  # type: ignore[attr-defined]
    await real_cluster.stop_broker(node)
    survivor = real_cluster.brokers[3 - node]
    await asyncio.to_thread(produce, survivor.bootstrap, 60, 60)
    await wait_for(lambda: coordinator()[0] == 3 - node)
    # the same group, loaded from the log: the members were not fenced into a fresh group
    moved = coordinator()[1]
    assert moved.group_epoch >= epoch_before  # type: ignore[attr-defined]
    await wait_for(lambda: a.error or b.error or len(set(a.seen + b.seen)) >= 120)
    assert sorted(set(a.seen + b.seen)) == list(range(120))
    for m in (a, b):
        m.stop_flag.set()
    await asyncio.to_thread(a.join, 30)
    await asyncio.to_thread(b.join, 30)
    assert a.error is None and b.error is None


def commit_without_subscribing(bootstrap: str, group: str, protocol: str) -> tuple[int, int]:
    """A consumer that assign()s and commits: (offset it committed, offset read back)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol, "enable.auto.commit": False}
    )
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        c.poll(0.5)
        committed = c.commit(offsets=[TopicPartition(TOPIC, 0, 3)], asynchronous=False)
        back = c.committed([TopicPartition(TOPIC, 0)], timeout=30)
        return committed[0].offset, back[0].offset
    finally:
        c.close()


async def test_consumers_without_group_management_commit_to_an_empty_group(real_cluster) -> None:
    """librdkafka's KIP-848 consumer sends its self-generated member id with epoch -1 when it
    only assign()s; Kafka accepts such commits while the group is empty (librdkafka 0030)."""
    broker = await real_cluster.start_broker(1, **FAST)
    await broker.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    for protocol in ("consumer", "classic"):
        assert await asyncio.to_thread(
            commit_without_subscribing, broker.bootstrap, f"assign-{protocol}", protocol
        ) == (
            3,
            3,
        )
