"""kafka-python consumers in one group against a real in-process broker: two members
rebalance (disjoint assignments covering every partition), commit, and a later member of the
group resumes exactly from the committed offsets, also after a broker restart."""

from __future__ import annotations

import asyncio
import threading
import time

from kafka import TopicPartition

TOPIC = "events"
PARTITIONS = 4


def produce(bootstrap: str, start: int, count: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for i in range(start, start + count):
        producer.send(TOPIC, key=str(i).encode(), value=str(i).encode(), partition=i % PARTITIONS)
    producer.flush(30)
    producer.close()


class Member(threading.Thread):
    """A consumer polling in its own thread, committing synchronously after each poll."""

    def __init__(self, bootstrap: str, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap = bootstrap
        self.seen: list[int] = []
        self.assignments: list[frozenset[int]] = []
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    @property
    def current(self) -> frozenset[int]:
        """The latest assignment; empty until the first one (the thread appends it later)."""
        assignments = self.assignments
        return assignments[-1] if assignments else frozenset()

    def run(self) -> None:
        from kafka import KafkaConsumer

        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id="grp",
                client_id=self.name,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=6_000,
                heartbeat_interval_ms=500,
                max_poll_interval_ms=20_000,
            )
            # Know the topic's partitions before joining: a leader that assigns from empty
            # client metadata ("No partition metadata") may not rejoin in kafka-python.
            consumer.partitions_for_topic(TOPIC)
            consumer.subscribe([TOPIC])
            while not self.stop_flag.is_set():
                batches = consumer.poll(timeout_ms=200)
                for records in batches.values():
                    self.seen.extend(int(r.value) for r in records)
                if batches:
                    consumer.commit()
                current = frozenset(tp.partition for tp in consumer.assignment())
                if not self.assignments or self.assignments[-1] != current:
                    self.assignments.append(current)
            consumer.close()  # commits nothing more; sends LeaveGroup
        except BaseException as exc:  # surfaced by the test
            self.error = exc


async def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.1)


async def committed(bootstrap: str) -> dict[int, int]:
    """The group's committed offsets; retried while the coordinator loads (right after a
    restart the broker answers COORDINATOR_LOAD_IN_PROGRESS, as Kafka does)."""

    def fetch() -> dict[int, int]:
        from kafka import KafkaAdminClient
        from kafka.errors import CoordinatorLoadInProgressError, NotCoordinatorError

        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            for _ in range(100):
                try:
                    return {
                        tp.partition: meta.offset for tp, meta in admin.list_group_offsets({"grp": None})["grp"].items()
                    }
                except (CoordinatorLoadInProgressError, NotCoordinatorError):
                    time.sleep(0.1)
            raise AssertionError("the coordinator never finished loading")
        finally:
            admin.close()

    return await asyncio.to_thread(fetch)


async def test_two_members_rebalance_commit_and_resume_after_restart(real_cluster) -> None:
    broker = await real_cluster.start_broker(1)
    await broker.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = broker.bootstrap
    await asyncio.to_thread(produce, bootstrap, 0, 200)

    a = Member(bootstrap, "member-a")
    a.start()
    await wait_for(
        lambda: a.error is not None or (len(set(a.seen)) == 200 and a.current == frozenset(range(PARTITIONS)))
    )
    assert a.error is None

    b = Member(bootstrap, "member-b")
    b.start()
    # the group rebalances: each member ends up with a disjoint half
    await wait_for(
        lambda: (
            a.error
            or b.error
            or (b.assignments and b.current and a.current and len(a.current) + len(b.current) == PARTITIONS)
        )
    )
    assert a.error is None and b.error is None
    assert a.assignments[-1].isdisjoint(b.assignments[-1])
    assert a.assignments[-1] | b.assignments[-1] == frozenset(range(PARTITIONS))
    assert b.seen == []  # everything was committed by a before b joined

    await asyncio.to_thread(produce, bootstrap, 200, 100)
    await wait_for(lambda: a.error or b.error or len(set(a.seen) | set(b.seen)) == 300)
    assert a.error is None and b.error is None
    assert sorted(a.seen + b.seen) == list(range(300))  # nothing twice, nothing lost
    assert {i % PARTITIONS for i in b.seen if i >= 200} == set(b.assignments[-1])

    a.stop_flag.set()
    b.stop_flag.set()
    await asyncio.to_thread(a.join, 30)
    await asyncio.to_thread(b.join, 30)
    assert await committed(bootstrap) == dict.fromkeys(range(PARTITIONS), 75)

    # restart the broker (new storage engine, new coordinator, same object store + WAL dir)
    await real_cluster.stop_broker(1)
    broker = await real_cluster.start_broker(1)
    bootstrap = broker.bootstrap
    assert await committed(bootstrap) == dict.fromkeys(range(PARTITIONS), 75)
    await asyncio.to_thread(produce, bootstrap, 300, 20)
    c = Member(bootstrap, "member-c")
    c.start()
    # a member not resuming from the committed offsets would see old records first
    await wait_for(lambda: c.error or len(c.seen) >= 20)
    c.stop_flag.set()
    await asyncio.to_thread(c.join, 30)
    assert c.error is None
    assert sorted(c.seen) == list(range(300, 320))


async def test_admin_describe_list_and_delete_groups(real_cluster) -> None:
    broker = await real_cluster.start_broker(1)
    await broker.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = broker.bootstrap
    await asyncio.to_thread(produce, bootstrap, 0, 8)
    m = Member(bootstrap, "member-d")
    m.start()
    await wait_for(lambda: m.error or len(m.seen) == 8)

    def admin_calls():
        from kafka import KafkaAdminClient, TopicPartition

        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            out = {}
            out["listed"] = admin.list_groups()
            out["described"] = admin.describe_groups(["grp"])
            out["delete_subscribed"] = admin.delete_group_offsets("grp", [TopicPartition(TOPIC, 0)])
            out["delete_group"] = admin.delete_groups(["grp"])
            return out
        finally:
            admin.close()

    out = await asyncio.to_thread(admin_calls)
    assert out["listed"] == [
        {"group_id": "grp", "group_state": "Stable", "group_type": "classic", "protocol_type": "consumer"}
    ]
    described = out["described"]["grp"]
    assert described["group_state"] == "Stable" and described["protocol_data"] == "range"
    (member,) = described["members"]
    assert member["client_id"] == "member-d" and member["client_host"] == "/127.0.0.1"
    assert member["member_metadata"]["topics"] == [TOPIC]
    assert member["member_assignment"]["assigned_partitions"] == [{"topic": TOPIC, "partitions": [0, 1, 2, 3]}]
    from kafka.errors import GroupSubscribedToTopicError

    assert out["delete_subscribed"] == {TopicPartition(TOPIC, 0): GroupSubscribedToTopicError}
    assert out["delete_group"] == {"grp": "NonEmptyGroupError"}

    m.stop_flag.set()
    await asyncio.to_thread(m.join, 30)

    def after_leave():
        from kafka import KafkaAdminClient, TopicPartition

        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            state = admin.describe_groups(["grp"])["grp"]["group_state"]
            admin.delete_group_offsets("grp", [TopicPartition(TOPIC, 0)])
            left = admin.list_group_offsets({"grp": None})["grp"]
            deleted = admin.delete_groups(["grp"])
            gone = admin.list_groups()
            return state, {tp.partition: o.offset for tp, o in left.items()}, deleted, gone
        finally:
            admin.close()

    state, left, deleted, gone = await asyncio.to_thread(after_leave)
    assert state == "Empty"
    assert left == {1: 2, 2: 2, 3: 2}
    assert deleted == {"grp": "OK"}
    assert gone == []


CRASHING_MEMBER = """
import sys, time
from kafka import KafkaConsumer
c = KafkaConsumer(bootstrap_servers=sys.argv[1], group_id="grp", client_id="doomed", enable_auto_commit=False,
                  auto_offset_reset="earliest", session_timeout_ms=2000, heartbeat_interval_ms=300, max_poll_interval_ms=20000)
c.partitions_for_topic(sys.argv[2])
c.subscribe([sys.argv[2]])
while True:
    c.poll(timeout_ms=100)
    if c.assignment():
        print("assigned", sorted(tp.partition for tp in c.assignment()), flush=True)
"""


async def test_killed_member_expires_and_its_partitions_move(real_cluster, tmp_path) -> None:
    import subprocess
    import sys

    broker = await real_cluster.start_broker(1)
    await broker.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = broker.bootstrap
    a = Member(bootstrap, "member-a")
    a.start()
    await wait_for(lambda: a.error or (a.assignments and a.current == frozenset(range(PARTITIONS))))
    script = tmp_path / "doomed.py"
    script.write_text(CRASHING_MEMBER)
    doomed = subprocess.Popen([sys.executable, str(script), bootstrap, TOPIC], stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(doomed.stdout.readline), 60)
        assert line.startswith("assigned"), line
        await wait_for(lambda: a.error or (a.current and len(a.current) < PARTITIONS))
        doomed.kill()  # no LeaveGroup: only its session timeout tells the coordinator
        doomed.wait(10)
        await wait_for(lambda: a.error or a.current == frozenset(range(PARTITIONS)))
        assert a.error is None
        group = broker.broker.groups.manager.groups["grp"]
        assert [m.client_id for m in group.members.values()] == ["member-a"]
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(10)
        a.stop_flag.set()
        await asyncio.to_thread(a.join, 30)


async def test_coordinator_moves_between_brokers_under_a_live_group(real_cluster) -> None:
    from automq.broker.kafka.groups.coordinator import OFFSETS_TOPIC
    from automq.broker.kafka.groups.state import partition_for

    b1 = await real_cluster.start_broker(1)
    b2 = await real_cluster.start_broker(2)
    await b1.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = f"{b1.bootstrap},{b2.bootstrap}"
    await asyncio.to_thread(produce, bootstrap, 0, 100)
    a = Member(bootstrap, "member-a")
    a.start()
    await wait_for(lambda: a.error or len(set(a.seen)) == 100)
    assert a.error is None

    topic = b1.broker.partitions.topic(OFFSETS_TOPIC)
    index = partition_for("grp", len(topic.partitions))
    old = topic.partitions[index].leader
    new = 2 if old == 1 else 1
    services = {1: b1, 2: b2}
    await services[old].broker.cluster.reassign_partition(OFFSETS_TOPIC, index, new)

    def moved() -> bool:
        info = services[new].broker.partitions.topic(OFFSETS_TOPIC).partitions[index]
        return (
            info.leader == new
            and info.state == "online"
            and services[new].broker.groups.coordinator_error("grp") is None
        )

    await wait_for(moved)
    # the member finds the new coordinator (NOT_COORDINATOR -> FindCoordinator) and keeps committing
    await asyncio.to_thread(produce, bootstrap, 100, 100)
    await wait_for(lambda: a.error or len(set(a.seen)) == 200)
    a.stop_flag.set()
    await asyncio.to_thread(a.join, 30)
    assert a.error is None
    assert sorted(set(a.seen)) == list(range(200))
    assert await committed(bootstrap) == dict.fromkeys(range(PARTITIONS), 50)
    group = services[new].broker.groups.manager.groups["grp"]
    assert group.offsets[(TOPIC, 0)].offset == 50
    assert "grp" not in services[old].broker.groups.manager.groups
