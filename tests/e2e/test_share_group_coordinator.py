"""KIP-932 proof, group side: librdkafka ShareConsumers on a 3-broker local cluster (real
processes) while the broker coordinating their share group is killed -9. The group is
reloaded from __consumer_offsets by whichever broker coordinates it next: the members keep
their ids and epochs (the group epoch does not move: nobody was fenced or rejoined), and every
record is acknowledged exactly once across the group."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from kafka_call import described_by_coordinator

pytestmark = pytest.mark.slow

PARTITIONS = 6


def described(cluster, group: str) -> tuple[int, Any]:
    from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest

    return described_by_coordinator(
        cluster, group, lambda g: ShareGroupDescribeRequest(group_ids=(g,), include_authorized_operations=False)
    )


class Member(threading.Thread):
    def __init__(self, bootstrap: str, group: str, topic: str, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.accepted: Counter[bytes] = Counter()
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
            c.subscribe([self.topic])
            while not self.stop_flag.is_set():
                batch = [m for m in c.poll(0.3) if m.error() is None]
                if not batch:
                    continue
                for m in batch:
                    c.acknowledge(m)
                failed = {tp.partition for tp, err in c.commit_sync(30).items() if err is not None}
                self.accepted.update(m.value() for m in batch if m.partition() not in failed)
            c.close()
        except BaseException as exc:
            self.error = exc


def set_earliest(bootstrap: str, group: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(30)


def test_share_group_survives_its_coordinator_killed_9(tmp_path, e2e):
    cluster = e2e.LocalCluster(
        tmp_path,
        3,
        e2e.free_port_block(3),
        sets=[
            "group.initial.rebalance.delay.ms=0",
            "group.share.record.lock.duration.ms=4000",
            "group.share.heartbeat.interval.ms=500",
            "group.share.session.timeout.ms=45000",
            "offsets.topic.num.partitions=3",
        ],
    ).start()
    members: list[Member] = []
    try:
        topic, group = e2e.topic_name("sqk"), f"sqk-{uuid.uuid4().hex[:8]}"
        e2e.create_topic(cluster.bootstrap, topic, partitions=PARTITIONS)
        set_earliest(cluster.bootstrap, group)
        first = [f"a{i}".encode() for i in range(300)]
        e2e.produce(cluster.bootstrap, topic, first)
        members = [Member(cluster.bootstrap, group, topic, f"sqk-{n}") for n in "ab"]
        for m in members:
            m.start()

        def accepted() -> int:
            return sum(sum(m.accepted.values()) for m in members)

        deadline = time.monotonic() + 90
        while accepted() < len(first) and not any(m.error for m in members):
            assert time.monotonic() < deadline, f"only {accepted()} of {len(first)} acknowledged"
            time.sleep(0.2)
        deadline = time.monotonic() + 30
        while True:  # both members heartbeated since the last one joined: all at the group's epoch
            node, before = described(cluster, group)
            epochs = {m.member_id: m.member_epoch for m in before.members}
            if len(epochs) == 2 and set(epochs.values()) == {before.assignment_epoch}:
                break
            assert time.monotonic() < deadline, before
            time.sleep(0.2)

        old_pid = cluster.kill9(f"broker-{node}")  # the coordinator dies; it also leads partitions
        second = [f"b{i}".encode() for i in range(300)]
        e2e.produce(cluster.bootstrap, topic, second)
        cluster.wait_restarted(f"broker-{node}", old_pid)
        deadline = time.monotonic() + 120
        while accepted() < len(first) + len(second) and not any(m.error for m in members):
            assert time.monotonic() < deadline, f"only {accepted()} of {len(first) + len(second)} acknowledged"
            time.sleep(0.2)
        time.sleep(1.0)  # anything delivered and accepted twice would show up now
        _, after = described(cluster, group)
        # same members, same epochs, same group epoch: the group was reloaded, not rebuilt by rejoins
        assert {m.member_id: m.member_epoch for m in after.members} == epochs
        assert after.group_epoch == before.group_epoch
    finally:
        for m in members:
            m.stop_flag.set()
        for m in members:
            m.join(30)
        try:
            cluster.stop()
        finally:
            cluster.kill()
    assert [m.error for m in members] == [None, None]
    total: Counter[bytes] = Counter()
    for m in members:
        total.update(m.accepted)
    assert sorted(total) == sorted(first + second)
    assert [v for v, n in total.items() if n > 1] == []
