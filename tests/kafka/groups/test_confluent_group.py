"""librdkafka (confluent-kafka) consumers in one group against a real in-process broker:
two members share the partitions after a rebalance, commit, and the group's offsets are
what a new member resumes from."""

from __future__ import annotations

import asyncio

from rdkafka_member import RdkafkaMember, produce_numbered, wait_for

TOPIC = "rk-events"
PARTITIONS = 4


def produce(bootstrap: str, start: int, count: int) -> None:
    produce_numbered(bootstrap, TOPIC, PARTITIONS, start, count)


class Member(RdkafkaMember):
    def __init__(self, bootstrap: str, name: str) -> None:
        settings = {"session.timeout.ms": 6_000, "heartbeat.interval.ms": 500}
        super().__init__(bootstrap, name, group="rk-grp", topic=TOPIC, settings=settings)


def committed(bootstrap: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "rk-grp", "enable.auto.commit": False})
    try:
        return {
            tp.partition: tp.offset
            for tp in c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=20)
        }
    finally:
        c.close()


async def test_librdkafka_members_rebalance_and_commit(real_cluster) -> None:
    broker = await real_cluster.start_broker(1)
    await broker.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = broker.bootstrap
    await asyncio.to_thread(produce, bootstrap, 0, 100)

    a = Member(bootstrap, "rk-a")
    a.start()
    await wait_for(lambda: a.error or (len(a.seen) == 100 and a.assigned == frozenset(range(PARTITIONS))))
    b = Member(bootstrap, "rk-b")
    b.start()
    await wait_for(
        lambda: a.error or b.error or (a.assigned and b.assigned and len(a.assigned) + len(b.assigned) == PARTITIONS)
    )
    assert a.error is None and b.error is None
    assert a.assigned.isdisjoint(b.assigned)

    await asyncio.to_thread(produce, bootstrap, 100, 100)
    await wait_for(lambda: a.error or b.error or len(a.seen) + len(b.seen) >= 200)
    assert sorted(a.seen + b.seen) == list(range(200))
    assert {i % PARTITIONS for i in b.seen} == set(b.assigned)

    for m in (a, b):
        m.stop_flag.set()
    await asyncio.to_thread(a.join, 30)
    await asyncio.to_thread(b.join, 30)
    assert await asyncio.to_thread(committed, bootstrap) == dict.fromkeys(range(PARTITIONS), 50)


class StaticMember(RdkafkaMember):
    """Polls without committing; `instance` None makes it a dynamic member."""

    def __init__(self, bootstrap: str, name: str, instance: str | None) -> None:
        settings = {"session.timeout.ms": 10_000, "heartbeat.interval.ms": 500}
        super().__init__(
            bootstrap, name, group="st-grp", topic=TOPIC, settings=settings, instance=instance, commit=False
        )


async def test_static_member_restart_does_not_rebalance(real_cluster) -> None:
    broker = await real_cluster.start_broker(1)
    await broker.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = broker.bootstrap
    a = StaticMember(bootstrap, "st-a", "instance-a")
    b = StaticMember(bootstrap, "st-b", None)
    a.start()
    await wait_for(lambda: a.error or a.assigned == frozenset(range(PARTITIONS)))
    b.start()
    await wait_for(
        lambda: a.error or b.error or (a.assigned and b.assigned and len(a.assigned) + len(b.assigned) == PARTITIONS)
    )
    group = broker.broker.groups.manager.groups["st-grp"]
    await wait_for(lambda: group.state.value == "Stable")
    generation, a_partitions, b_revocations = group.generation_id, a.assigned, b.revocations

    a.stop_flag.set()
    await asyncio.to_thread(a.join, 30)
    assert len(group.members) == 2  # no LeaveGroup: the static member keeps its place
    a2 = StaticMember(bootstrap, "st-a2", "instance-a")
    a2.start()
    await wait_for(lambda: a2.error or a2.assigned)
    assert a2.error is None and b.error is None
    assert a2.assigned == a_partitions
    assert group.generation_id == generation and b.revocations == b_revocations
    assert len(group.members) == 2 and group.static_members["instance-a"] in group.members
    for m in (a2, b):
        m.stop_flag.set()
    await asyncio.to_thread(a2.join, 30)
    await asyncio.to_thread(b.join, 30)
