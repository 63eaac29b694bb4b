"""A group's coordinator killed -9 under load, on one 3-broker local cluster (real processes)
with librdkafka members: a KIP-848 consumer group (`group.protocol=consumer`, offsets committed
synchronously) and a KIP-932 share group (explicit acknowledgements). Either group is reloaded
from __consumer_offsets by whichever broker coordinates it next: members keep their ids and
epochs and the group epoch does not move (nobody was fenced, revoked or rejoined), and every
record is consumed (or acknowledged) exactly once across the group, before and after the kill."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from kafka_call import described_by_coordinator

pytestmark = pytest.mark.slow

PARTITIONS = 6


class Member(threading.Thread):
    """One group member on its own thread; `received` counts what it consumed and committed
    (or acknowledged and committed)."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.received: Counter[bytes] = Counter()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def open(self) -> Any:
        raise NotImplementedError

    def take(self, client: Any) -> list[bytes]:
        """One poll round: the values it delivered and durably committed."""
        raise NotImplementedError

    def run(self) -> None:
        try:
            client = self.open()
            client.subscribe([self.topic])
            while not self.stop_flag.is_set():
                self.received.update(self.take(client))
            client.close()
        except BaseException as exc:
            self.error = exc


class ConsumerMember(Member):
    def open(self) -> Any:
        from confluent_kafka import Consumer

        settings = {"group.protocol": "consumer", "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        return Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": self.name, **settings}
        )

    def take(self, client: Any) -> list[bytes]:
        from confluent_kafka import KafkaException

        batch = [m for m in client.consume(100, 0.3) if m.error() is None]
        while batch and not self.stop_flag.is_set():
            try:  # the coordinator may be down: retry until the commit lands
                client.commit(asynchronous=False)
                return [m.value() for m in batch]
            except KafkaException:
                time.sleep(0.2)
        return []


class ShareMember(Member):
    def open(self) -> Any:
        from confluent_kafka import ShareConsumer

        settings = {"share.acknowledgement.mode": "explicit"}
        return ShareConsumer(
            {"bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": self.name, **settings}
        )

    def take(self, client: Any) -> list[bytes]:
        batch = [m for m in client.poll(0.3) if m.error() is None]
        if not batch:
            return []
        for m in batch:
            client.acknowledge(m)
        failed = {tp.partition for tp, err in client.commit_sync(30).items() if err is not None}
        return [m.value() for m in batch if m.partition() not in failed]


def consumer_group_described(g: str) -> Any:
    from kio.schema.consumer_group_describe.v0.request import ConsumerGroupDescribeRequest
    from kio.schema.types import GroupId

    return ConsumerGroupDescribeRequest(group_ids=(GroupId(g),), include_authorized_operations=False)


def share_group_described(g: str) -> Any:
    from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest
    from kio.schema.types import GroupId

    return ShareGroupDescribeRequest(group_ids=(GroupId(g),), include_authorized_operations=False)


def set_share_earliest(bootstrap: str, group: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(30)


@pytest.fixture(scope="module")
def three_brokers(tmp_path_factory, e2e):
    sets = [
        "group.consumer.heartbeat.interval.ms=500",
        "group.share.record.lock.duration.ms=4000",
        "group.share.heartbeat.interval.ms=500",
        "group.share.session.timeout.ms=45000",
        "offsets.topic.num.partitions=3",
    ]
    with e2e.running_cluster(tmp_path_factory.mktemp("coordinator-kill"), brokers=3, sets=sets) as c:
        yield c


# kind -> (member class, describe request, members, records produced before and after the kill)
KINDS: dict[str, tuple[type[Member], Callable[[str], Any], int, int]] = {
    "consumer": (ConsumerMember, consumer_group_described, 3, 600),
    "share": (ShareMember, share_group_described, 2, 300),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_group_survives_its_coordinator_killed_9(three_brokers, e2e, kind: str):
    member, describe, size, records = KINDS[kind]
    cluster = three_brokers
    topic, group = e2e.topic_name(f"{kind}k"), f"{kind}k-{uuid.uuid4().hex[:8]}"
    e2e.create_topic(cluster.bootstrap, topic, partitions=PARTITIONS)
    if kind == "share":
        set_share_earliest(cluster.bootstrap, group)
    first = [f"a{i}".encode() for i in range(records)]
    e2e.produce(cluster.bootstrap, topic, first)
    members = [member(cluster.bootstrap, group, topic, f"{kind}k-{n}") for n in "abc"[:size]]
    for m in members:
        m.start()

    def received() -> int:
        return sum(sum(m.received.values()) for m in members)

    try:
        deadline = time.monotonic() + 90
        while True:  # every member at the group's assignment epoch, all of `first` read
            node, before = described_by_coordinator(cluster, group, describe)
            epochs = {m.member_id: m.member_epoch for m in before.members}
            settled = len(epochs) == size and set(epochs.values()) == {before.assignment_epoch}
            if settled and received() >= len(first):
                break
            assert not any(m.error for m in members), [m.error for m in members]
            assert time.monotonic() < deadline, (received(), before)
            time.sleep(0.2)

        old_pid = cluster.kill9(f"broker-{node}")  # the coordinator dies; it also leads partitions
        second = [f"b{i}".encode() for i in range(records)]
        e2e.produce(cluster.bootstrap, topic, second)
        cluster.wait_restarted(f"broker-{node}", old_pid)
        deadline = time.monotonic() + 120
        while received() < len(first) + len(second) and not any(m.error for m in members):
            assert time.monotonic() < deadline, f"only {received()} of {len(first) + len(second)} received"
            time.sleep(0.2)
        time.sleep(1.0)  # anything delivered (and committed) twice would show up now
        _, after = described_by_coordinator(cluster, group, describe)
        # same members, same epochs, same group epoch: reloaded, not rebuilt by rejoins
        assert {m.member_id: m.member_epoch for m in after.members} == epochs
        assert after.group_epoch == before.group_epoch
    finally:
        for m in members:
            m.stop_flag.set()
        for m in members:
            m.join(30)
    assert [m.error for m in members] == [None] * size
    total: Counter[bytes] = Counter()
    for m in members:
        total.update(m.received)
    assert sorted(total) == sorted(first + second)
    assert [v for v, n in total.items() if n > 1] == []
