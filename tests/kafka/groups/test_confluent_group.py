"""librdkafka (confluent-kafka) consumers in one group against a real in-process broker:
two members share the partitions after a rebalance, commit, and the group's offsets are
what a new member resumes from."""

from __future__ import annotations

import asyncio
import threading
import time

TOPIC = "rk-events"
PARTITIONS = 4


def produce(bootstrap: str, start: int, count: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(start, start + count):
        p.produce(TOPIC, value=str(i).encode(), partition=i % PARTITIONS)
    assert p.flush(30) == 0


class Member(threading.Thread):
    def __init__(self, bootstrap: str, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap = bootstrap
        self.seen: list[int] = []
        self.assigned: frozenset[int] = frozenset()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from confluent_kafka import Consumer

        try:
            c = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": "rk-grp",
                    "client.id": self.name,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "session.timeout.ms": 6_000,
                    "heartbeat.interval.ms": 500,
                    "topic.metadata.refresh.interval.ms": 1_000,
                }
            )

            def on_assign(consumer, partitions):
                self.assigned = frozenset(p.partition for p in partitions)

            def on_revoke(consumer, partitions):
                self.assigned = frozenset()

            c.subscribe([TOPIC], on_assign=on_assign, on_revoke=on_revoke)
            while not self.stop_flag.is_set():
                msg = c.poll(0.1)
                if msg is None or msg.error():
                    continue
                self.seen.append(int(msg.value()))
                c.commit(message=msg, asynchronous=False)
            c.close()
        except BaseException as exc:
            self.error = exc


async def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.1)


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


class StaticMember(Member):
    def __init__(self, bootstrap: str, name: str, instance_id: str | None) -> None:
        super().__init__(bootstrap, name)
        self.instance_id = instance_id
        self.revocations = 0

    def run(self) -> None:
        from confluent_kafka import Consumer

        try:
            conf = {
                "bootstrap.servers": self.bootstrap,
                "group.id": "st-grp",
                "client.id": self.name,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500,
            }
            if self.instance_id is not None:
                conf["group.instance.id"] = self.instance_id
            c = Consumer(conf)

            def on_assign(consumer, partitions):
                self.assigned = frozenset(p.partition for p in partitions)

            def on_revoke(consumer, partitions):
                self.revocations += 1
                self.assigned = frozenset()

            c.subscribe([TOPIC], on_assign=on_assign, on_revoke=on_revoke)
            while not self.stop_flag.is_set():
                msg = c.poll(0.1)
                if msg is not None and not msg.error():
                    self.seen.append(int(msg.value()))
            c.close()  # a static member does not leave the group on close (KIP-345)
        except BaseException as exc:
            self.error = exc


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
