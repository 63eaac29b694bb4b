"""A librdkafka (confluent-kafka) group member on its own thread, for the group tests against
in-process brokers, and the helpers those tests share: numbered records produced round-robin
over a topic's partitions, and an async wait for a condition."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any


def produce_numbered(bootstrap: str, topic: str, partitions: int, start: int, count: int) -> None:
    """Records start..start+count-1 (their number as the value), record i on partition
    i % partitions, acks=all; fails unless every one is acknowledged."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(start, start + count):
        p.produce(topic, value=str(i).encode(), partition=i % partitions)
    assert p.flush(30) == 0


async def wait_for(condition: Callable[[], Any], timeout: float = 90.0, state: Callable[[], Any] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in time: {state()}")
        await asyncio.sleep(0.1)


class RdkafkaMember(threading.Thread):
    """Subscribes to `topic` in `group` (`settings` are added to the consumer's configuration:
    group.protocol, assignor, timeouts), tracks `assigned` through the rebalance callbacks
    (`revocations` counts the revoke callbacks) and records every value it polls in `seen`.

    With `commit` each record's offset is committed synchronously before the record counts.
    A refused commit fails the member (`error`) unless `tolerate_refused_commits`: then it is
    noted in `errors` and the record is read again, here if the member still owns its
    partition, else by the partition's next owner from the committed offset (Kafka's answer
    when a classic member's generation has just moved on)."""

    def __init__(
        self,
        bootstrap: str,
        name: str,
        *,
        group: str,
        topic: str,
        settings: dict[str, Any] | None = None,
        instance: str | None = None,
        commit: bool = True,
        tolerate_refused_commits: bool = False,
    ) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.settings = dict(settings or {})
        self.instance = instance  # group.instance.id: a static member
        self.commit, self.tolerate_refused_commits = commit, tolerate_refused_commits
        self.seen: list[int] = []
        self.assigned: frozenset[int] = frozenset()
        self.revocations = 0
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self.errors: list[str] = []

    def run(self) -> None:
        from confluent_kafka import Consumer

        try:
            c = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": self.group,
                    "client.id": self.name,
                    **({"group.instance.id": self.instance} if self.instance else {}),
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "topic.metadata.refresh.interval.ms": 1_000,
                    **self.settings,
                }
            )

            def on_assign(consumer: Any, partitions: Any) -> None:
                self.assigned = self.assigned | {p.partition for p in partitions}

            def on_revoke(consumer: Any, partitions: Any) -> None:
                self.revocations += 1
                self.assigned = self.assigned - {p.partition for p in partitions}

            c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
            while not self.stop_flag.is_set():
                msg = c.poll(0.1)
                if msg is None:
                    continue
                if msg.error():
                    self.errors.append(str(msg.error()))
                    continue
                if not self.commit or self._committed(c, msg):
                    self.seen.append(int(msg.value()))
            c.close()  # a dynamic member leaves the group; a static one keeps its place (KIP-345)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _committed(self, c: Any, msg: Any) -> bool:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            c.commit(message=msg, asynchronous=False)
            return True
        except KafkaException as exc:
            if not self.tolerate_refused_commits:
                raise
            self.errors.append(f"commit: {exc}")
            try:
                c.seek(TopicPartition(msg.topic(), msg.partition(), msg.offset()))
            except KafkaException:
                pass  # no longer ours
            return False
