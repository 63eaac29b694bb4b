"""Online migration with real clients against a real broker: a kafka-python (classic) group
consuming is upgraded member by member to librdkafka's KIP-848 consumer
(`group.protocol=consumer`) and downgraded back, every record consumed exactly once across
both switches (committed offsets carry over); with `group.consumer.migration.policy=disabled`
a KIP-848 consumer cannot join the non-empty classic group (GROUP_ID_NOT_FOUND)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest
from rdkafka_member import RdkafkaMember, produce_numbered, wait_for

TOPIC = "mig"
PARTITIONS = 4
GROUP = "mig-grp"
FAST = {
    "group_consumer_heartbeat_interval_ms": 300,
    "group_consumer_session_timeout_ms": 6_000,
    "group_initial_rebalance_delay_ms": 0,
}


def produce(bootstrap: str, start: int, count: int) -> None:
    produce_numbered(bootstrap, TOPIC, PARTITIONS, start, count)


class EagerClassic(threading.Thread):
    """A kafka-python consumer (classic protocol, eager range assignor) with auto-commit: the
    positions of what poll() returned are committed every 500 ms, before every rejoin (it
    gives its partitions up) and at close."""

    def __init__(self, bootstrap: str, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap = bootstrap
        self.seen: list[int] = []
        self.assigned: frozenset[int] = frozenset()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self.connection_errors: list[str] = []

    def run(self) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer
        from kafka.errors import KafkaConnectionError

        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=GROUP,
                client_id=self.name,
                enable_auto_commit=True,
                auto_commit_interval_ms=500,
                auto_offset_reset="earliest",
                session_timeout_ms=6_000,
                heartbeat_interval_ms=300,
                max_poll_interval_ms=30_000,
            )
            thread = self

            class Listener(ConsumerRebalanceListener):
                def on_partitions_revoked(self, revoked: Any) -> None:
                    thread.assigned = frozenset()

                def on_partitions_assigned(self, assigned: Any) -> None:
                    thread.assigned = frozenset(tp.partition for tp in assigned)

            consumer.partitions_for_topic(TOPIC)
            consumer.subscribe([TOPIC], listener=Listener())
            while not self.stop_flag.is_set():
                try:
                    batches = consumer.poll(timeout_ms=200)
                except KafkaConnectionError as exc:
                    # kafka-python 3.0.12 raises this out of poll() when the broker it asks
                    # for the coordinator is the one just stopped and the metadata refresh it
                    # then sends there is refused too (ensure_coordinator_ready_async catches
                    # the lookup's InvalidMetadataError, not the refresh's): an application
                    # polls again, and so does this one
                    self.connection_errors.append(repr(exc))
                    continue
                for records in batches.values():
                    self.seen.extend(int(r.value) for r in records)
            consumer.close()  # commits, then LeaveGroup
        except BaseException as exc:  # surfaced by the test
            self.error = exc


class CooperativeClassic(RdkafkaMember):
    """librdkafka's classic consumer with the cooperative-sticky assignor: its subscription
    (v3) names the partitions it owns, so it gives up only what it must, incrementally. A
    commit refused in a rebalance is Kafka's answer too: the record is read again."""

    def __init__(self, bootstrap: str, name: str, instance: str | None = None) -> None:
        settings = {
            "group.protocol": "classic",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 6_000,
            "heartbeat.interval.ms": 300,
        }
        super().__init__(
            bootstrap,
            name,
            group=GROUP,
            topic=TOPIC,
            settings=settings,
            instance=instance,
            tolerate_refused_commits=True,
        )


class Modern(RdkafkaMember):
    """librdkafka's KIP-848 consumer committing every record it sees."""

    def __init__(self, bootstrap: str, name: str, instance: str | None = None) -> None:
        settings = {"group.protocol": "consumer"}
        super().__init__(bootstrap, name, group=GROUP, topic=TOPIC, settings=settings, instance=instance)


def covering(members: list[Any]) -> bool:
    """Every partition held by exactly one of the members, each of them holding some."""
    parts = [m.assigned for m in members]
    return (
        all(parts) and sum(len(p) for p in parts) == PARTITIONS and frozenset().union(*parts) == set(range(PARTITIONS))
    )


@pytest.fixture
async def threads():
    """Every client thread a test starts is stopped when it ends; joined off the event loop,
    which runs the broker the clients are closing against."""
    started: list[Any] = []
    yield started
    for t in started:
        t.stop_flag.set()
    for t in started:
        await asyncio.to_thread(t.join, 30)


@pytest.mark.slow
@pytest.mark.parametrize(
    "Classic", [EagerClassic, CooperativeClassic], ids=["kafka-python-eager", "librdkafka-cooperative"]
)
async def test_rolling_upgrade_and_downgrade_consume_every_record_once(real_cluster, threads, Classic) -> None:
    b1 = await real_cluster.start_broker(1, offsets_topic_num_partitions=1, **FAST)
    b2 = await real_cluster.start_broker(2, offsets_topic_num_partitions=1, **FAST)
    await b1.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = f"{b1.bootstrap},{b2.bootstrap}"
    everyone: list[Any] = []
    produced = 0

    async def more(count: int = 40) -> None:
        nonlocal produced
        await asyncio.to_thread(produce, bootstrap, produced, count)
        produced += count

    def coordinator() -> int:
        for node_id, service in real_cluster.brokers.items():
            if service.broker.groups.coordinator_error(GROUP) is None:
                return int(node_id)
        return -1

    def group() -> Any:
        node = coordinator()
        return real_cluster.brokers[node].broker.groups.manager.groups.get(GROUP) if node > 0 else None

    def state() -> Any:
        return ([(t.name, sorted(t.assigned), len(t.seen), t.error) for t in everyone], group())

    def start(t: Any) -> Any:
        threads.append(t)
        everyone.append(t)
        t.start()
        return t

    async def stop(t: Any) -> None:
        t.stop_flag.set()
        await asyncio.to_thread(t.join, 30)
        assert t.error is None, t.error

    def all_seen() -> bool:
        return sum(len(t.seen) for t in everyone) >= produced

    await more()
    c1, c2 = start(Classic(bootstrap, "c1")), start(Classic(bootstrap, "c2"))
    await wait_for(lambda: covering([c1, c2]) and all_seen(), state=state)
    assert group().consumer is None and group().protocol_type == "consumer"

    # rolling upgrade: a KIP-848 member joins the classic group, then replaces each classic one
    k1 = start(Modern(bootstrap, "k1"))
    await more()
    await wait_for(lambda: covering([c1, c2, k1]) and all_seen(), state=state)
    data = group().consumer
    assert data is not None, "the group was upgraded"
    assert {m.client_id for m in data.members.values() if m.classic is not None} == {"c1", "c2"}
    # the upgraded group, classic members included, survives its coordinator stopping
    moved_from = coordinator()
    await real_cluster.stop_broker(moved_from)
    await more()
    await wait_for(lambda: coordinator() == 3 - moved_from and group() is not None, state=state)
    assert {m.client_id for m in group().consumer.members.values()} == {"c1", "c2", "k1"}
    await wait_for(lambda: covering([c1, c2, k1]) and all_seen(), state=state)
    bootstrap = real_cluster.brokers[3 - moved_from].bootstrap
    await stop(c1)
    k2 = start(Modern(bootstrap, "k2"))
    await more()
    await wait_for(lambda: covering([c2, k1, k2]) and all_seen(), state=state)
    await stop(c2)
    await more()
    await wait_for(lambda: covering([k1, k2]) and all_seen(), state=state)
    assert all(m.classic is None for m in group().consumer.members.values())

    # rolling downgrade: classic members join the consumer group, the KIP-848 ones leave
    c3 = start(Classic(bootstrap, "c3"))
    await more()
    await wait_for(lambda: covering([k1, k2, c3]) and all_seen(), state=state)
    await stop(k1)
    c4 = start(Classic(bootstrap, "c4"))
    await more()
    await wait_for(lambda: covering([k2, c3, c4]) and all_seen(), state=state)
    await stop(k2)
    await more()
    await wait_for(lambda: group().consumer is None and covering([c3, c4]) and all_seen(), state=state)
    assert {m.client_id for m in group().members.values()} == {"c3", "c4"}

    # the coordinator that converted back counts it (the upgrade happened on the other broker)
    from prometheus_client import generate_latest

    text = generate_latest(real_cluster.brokers[coordinator()].broker.registry).decode()
    assert 'kafka_coordinator_group_migrations_total{direction="downgrade"} 1.0' in text

    seen = sorted(i for t in everyone for i in t.seen)
    assert seen == list(range(produced)), "every record exactly once across both switches"
    assert [t.error for t in everyone] == [None] * len(everyone)
    # consumer errors other than commits refused in a rebalance (read again, counted once)
    assert not [e for t in everyone for e in getattr(t, "errors", ()) if not e.startswith("commit:")]


async def test_with_migration_disabled_a_kip848_member_cannot_join_a_classic_group(real_cluster, threads) -> None:
    b1 = await real_cluster.start_broker(
        1, offsets_topic_num_partitions=1, group_consumer_migration_policy="disabled", **FAST
    )
    await b1.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = b1.bootstrap
    await asyncio.to_thread(produce, bootstrap, 0, 8)
    c1 = EagerClassic(bootstrap, "c1")
    threads.append(c1)
    c1.start()
    await wait_for(lambda: len(c1.seen) == 8 and c1.assigned == set(range(PARTITIONS)))
    k1 = Modern(bootstrap, "k1")
    threads.append(k1)
    k1.start()
    await wait_for(lambda: bool(k1.errors) or k1.error is not None, timeout=30)
    assert "The group id does not exist" in " ".join(k1.errors), k1.errors  # librdkafka: GROUP_ID_NOT_FOUND
    group = b1.broker.groups.manager.groups[GROUP]
    assert group.consumer is None and len(group.members) == 1
    assert k1.assigned == frozenset() and k1.seen == []


async def test_an_aiokafka_classic_member_joins_a_kip848_group_and_stays_through_the_downgrade(
    real_cluster, threads
) -> None:
    """aiokafka (classic protocol) joining a group run by a KIP-848 member: it becomes a
    classic member of the consumer group, shares the partitions, and when the KIP-848 member
    leaves the group turns classic with aiokafka holding everything; every record once."""
    from aiokafka import AIOKafkaConsumer

    b1 = await real_cluster.start_broker(1, offsets_topic_num_partitions=1, **FAST)
    await b1.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = b1.bootstrap
    await asyncio.to_thread(produce, bootstrap, 0, 40)
    k1 = Modern(bootstrap, "k1")
    threads.append(k1)
    k1.start()
    await wait_for(lambda: len(k1.seen) == 40)

    class Aio:
        def __init__(self) -> None:
            self.seen: list[int] = []
            self.assigned: frozenset[int] = frozenset()

    aio = Aio()
    consumer = AIOKafkaConsumer(
        TOPIC,
        bootstrap_servers=bootstrap,
        group_id=GROUP,
        client_id="aio",
        auto_offset_reset="earliest",
        session_timeout_ms=6_000,
        heartbeat_interval_ms=300,
        auto_commit_interval_ms=300,
    )
    await consumer.start()

    async def consume() -> None:
        while True:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                aio.seen.extend(int(r.value) for r in records)
            aio.assigned = frozenset(tp.partition for tp in consumer.assignment())

    task = asyncio.get_running_loop().create_task(consume())
    try:
        group = b1.broker.groups.manager.groups[GROUP]
        await asyncio.to_thread(produce, bootstrap, 40, 40)
        await wait_for(lambda: covering([k1, aio]) and len(aio.seen) + len(k1.seen) >= 80, state=lambda: group)
        assert group.consumer is not None
        assert {m.client_id: m.classic is not None for m in group.consumer.members.values()} == {
            "k1": False,
            "aio": True,
        }
        k1.stop_flag.set()
        await asyncio.to_thread(k1.join, 30)
        await asyncio.to_thread(produce, bootstrap, 80, 40)
        await wait_for(
            lambda: (
                group.consumer is None
                and aio.assigned == set(range(PARTITIONS))
                and len(aio.seen) + len(k1.seen) >= 120
            ),
            state=lambda: (aio.assigned, len(aio.seen), group),
        )
        assert [m.client_id for m in group.members.values()] == ["aio"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.stop()
    assert sorted(aio.seen + k1.seen) == list(range(120))


@pytest.mark.slow
async def test_static_members_upgrade_in_place_keeping_their_instance_ids(real_cluster, threads) -> None:
    """A rolling restart of static members (group.instance.id kept): each classic instance
    stops without leaving and comes back speaking the consumer protocol; it takes over its
    own partitions at once (Kafka needs no epoch -2 from a classic instance)."""
    b1 = await real_cluster.start_broker(1, offsets_topic_num_partitions=1, **FAST)
    await b1.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = b1.bootstrap
    everyone: list[Any] = []
    await asyncio.to_thread(produce, bootstrap, 0, 40)

    def start(t: Any) -> Any:
        threads.append(t)
        everyone.append(t)
        t.start()
        return t

    def group() -> Any:
        return b1.broker.groups.manager.groups.get(GROUP)

    def state() -> Any:
        return ([(t.name, sorted(t.assigned), len(t.seen), t.error, t.errors[-2:]) for t in everyone], group())

    p1 = start(CooperativeClassic(bootstrap, "p1-classic", instance="p1"))
    p2 = start(CooperativeClassic(bootstrap, "p2-classic", instance="p2"))
    await wait_for(lambda: covering([p1, p2]) and len(p1.seen) + len(p2.seen) == 40, state=state)
    produced = 40
    for old in (p1, p2):
        kept = old.assigned
        old.stop_flag.set()  # a static member closes without LeaveGroup
        await asyncio.to_thread(old.join, 30)
        new = start(Modern(bootstrap, old.name.replace("classic", "kip848"), instance=old.instance))
        await asyncio.to_thread(produce, bootstrap, produced, 40)
        produced += 40
        await wait_for(lambda new=new, kept=kept: kept <= new.assigned, state=state)
    await wait_for(lambda: sum(len(t.seen) for t in everyone) >= produced and covering(everyone[2:]), state=state)
    data = group().consumer
    assert data is not None and sorted(data.static_members) == ["p1", "p2"]
    assert all(m.classic is None for m in data.members.values())
    assert sorted(i for t in everyone for i in t.seen) == list(range(produced))
    assert [t.error for t in everyone] == [None] * 4
