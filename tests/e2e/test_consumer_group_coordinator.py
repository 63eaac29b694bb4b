"""KIP-848 proof: librdkafka consumers with `group.protocol=consumer` on a 3-broker local cluster
(real processes) while the broker coordinating their group is killed -9 under load. The group is
reloaded from __consumer_offsets by whichever broker coordinates it next: members keep their ids
and epochs (nobody is fenced, nothing is revoked), so every record is consumed exactly once
across the group, before and after the kill, with offsets committed synchronously."""

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
    from kio.schema.consumer_group_describe.v0.request import ConsumerGroupDescribeRequest

    return described_by_coordinator(
        cluster, group, lambda g: ConsumerGroupDescribeRequest(group_ids=(g,), include_authorized_operations=False)
    )


class Member(threading.Thread):
    def __init__(self, bootstrap: str, group: str, topic: str, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.consumed: Counter[bytes] = Counter()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from confluent_kafka import Consumer, KafkaException

        try:
            c = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": self.group,
                    "client.id": self.name,
                    "group.protocol": "consumer",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                }
            )
            c.subscribe([self.topic])
            while not self.stop_flag.is_set():
                batch = [m for m in c.consume(100, 0.3) if m.error() is None]
                if not batch:
                    continue
                self.consumed.update(m.value() for m in batch)
                while not self.stop_flag.is_set():
                    try:  # the coordinator may be down: retry until the commit lands
                        c.commit(asynchronous=False)
                        break
                    except KafkaException:
                        time.sleep(0.2)
            c.close()
        except BaseException as exc:
            self.error = exc


def test_kip848_group_survives_its_coordinator_killed_9(tmp_path, e2e):
    cluster = e2e.LocalCluster(
        tmp_path,
        3,
        e2e.free_port_block(3),
        sets=[
            "group.initial.rebalance.delay.ms=0",
            "group.consumer.heartbeat.interval.ms=500",
            "offsets.topic.num.partitions=3",
        ],
    ).start()
    members: list[Member] = []
    try:
        topic, group = e2e.topic_name("k848k"), f"k848k-{uuid.uuid4().hex[:8]}"
        e2e.create_topic(cluster.bootstrap, topic, partitions=PARTITIONS)
        first = [f"a{i}".encode() for i in range(600)]
        e2e.produce(cluster.bootstrap, topic, first)
        members = [Member(cluster.bootstrap, group, topic, f"k848k-{n}") for n in "abc"]
        for m in members:
            m.start()

        def consumed() -> int:
            return sum(sum(m.consumed.values()) for m in members)

        deadline = time.monotonic() + 90
        while True:  # every member reconciled to the group's assignment epoch, all of `first` read
            node, before = described(cluster, group)
            epochs = {m.member_id: m.member_epoch for m in before.members}
            settled = len(epochs) == 3 and set(epochs.values()) == {before.assignment_epoch}
            if settled and consumed() >= len(first):
                break
            assert not any(m.error for m in members), [m.error for m in members]
            assert time.monotonic() < deadline, (consumed(), before)
            time.sleep(0.2)

        old_pid = cluster.kill9(f"broker-{node}")  # the coordinator dies; it also leads partitions
        second = [f"b{i}".encode() for i in range(600)]
        e2e.produce(cluster.bootstrap, topic, second)
        cluster.wait_restarted(f"broker-{node}", old_pid)
        deadline = time.monotonic() + 120
        while consumed() < len(first) + len(second) and not any(m.error for m in members):
            assert time.monotonic() < deadline, f"only {consumed()} of {len(first) + len(second)} consumed"
            time.sleep(0.2)
        time.sleep(1.0)  # anything delivered twice would show up now
        _, after = described(cluster, group)
        # same members, same epochs, same group epoch: reloaded, not rebuilt by rejoins
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
    assert [m.error for m in members] == [None, None, None]
    total: Counter[bytes] = Counter()
    for m in members:
        total.update(m.consumed)
    assert sorted(total) == sorted(first + second)
    assert [v for v, n in total.items() if n > 1] == []
