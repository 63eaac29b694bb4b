"""Real clients speaking the Kafka 4.1/4.2 versions the broker advertises: the versions each
request arrived in are recorded on the broker (the registered handlers are wrapped), so a
client that quietly falls back to an older version fails the test."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time

import pytest

from automq.broker.config import parse_config
from automq.broker.kafka.handlers import registry
from automq.broker.kafka.process import BrokerService

WATCHED = (0, 1, 2, 8, 9)  # Produce, Fetch, ListOffsets, OffsetCommit, OffsetFetch


@pytest.fixture
async def broker(tmp_path):
    from automq.broker.controller.process import ControllerService

    objects = f"file://{tmp_path}/objects"
    controller = ControllerService(
        parse_config(
            {
                "node_id": 0,
                "data_dir": str(tmp_path / "c"),
                "object_store_url": objects,
                "http_host": "127.0.0.1",
                "http_port": 0,
            }
        )
    )
    await controller.start()
    service = BrokerService(
        parse_config(
            {
                "node_id": 1,
                "data_dir": str(tmp_path / "b1"),
                "object_store_url": objects,
                "controller_urls": [controller.url],
                "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 0}],
                "http_host": "127.0.0.1",
                "http_port": 0,
                "heartbeat_interval_ms": 200,
                "wal": {"capacity": "16MiB"},
                "storage": {"log_cache_bytes": "16MiB", "block_cache_bytes": "8MiB"},
                "kafka": {"group_initial_rebalance_delay_ms": 0},
            }
        )
    )
    await asyncio.wait_for(service.start(), 60)
    yield service
    await asyncio.wait_for(service.stop(timeout=5), 60)
    await asyncio.wait_for(controller.stop(), 30)


@pytest.fixture
def versions_seen(monkeypatch) -> dict[int, collections.Counter]:
    seen: dict[int, collections.Counter] = {key: collections.Counter() for key in WATCHED}
    for key in WATCHED:
        reg = registry.lookup(key)
        assert reg is not None

        def counting(request, ctx, _handler=reg.handler, _key=key):
            seen[_key][ctx.api_version] += 1
            return _handler(request, ctx)

        monkeypatch.setitem(registry._HANDLERS, key, dataclasses.replace(reg, handler=counting))
    return seen


async def _topic_ready(service: BrokerService, name: str, partitions: int) -> None:
    await service.broker.ensure_topic(name, partitions, {})
    for _ in range(200):
        led = {(p.topic, p.partition) for p in service.broker.partitions.led()}
        if all((name, i) in led for i in range(partitions)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} never opened")


def _confluent_roundtrip(bootstrap: str, topic: str, n: int) -> tuple[list, list[int], int]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    errors: list = []
    for i in range(n):
        producer.produce(topic, value=b"%d" % i, partition=i % 2, on_delivery=lambda e, m: e and errors.append(e))
    producer.flush(30)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "v41-clients",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    seen: list[int] = []
    deadline = time.time() + 30
    while len(seen) < n and time.time() < deadline:
        for m in consumer.consume(1000, 0.5):
            if not m.error():
                seen.append(int(m.value()))
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    consumer.close()
    return errors, sorted(seen), sum(tp.offset for tp in committed)


def _kafka_python_inferred_version(bootstrap: str) -> tuple[int, ...]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return tuple(admin._manager.broker_version)
    finally:
        admin.close()


async def test_clients_against_the_kafka_41_versions(broker, versions_seen):
    """No installed client sends Produce v13 yet (librdkafka 2.16 stops at v10, kafka-python's
    producer at v9): they keep negotiating their own newest version and work unchanged, and
    kafka-python's version inference, which reads Produce v13 as "4.1" and ListOffsets v11 as
    "4.2", now sees them."""
    await _topic_ready(broker, "k41", 2)
    errors, seen, committed = await asyncio.to_thread(_confluent_roundtrip, broker.bootstrap, "k41", 500)
    assert errors == []
    assert seen == list(range(500))
    assert committed == 500
    # whatever Produce version the installed librdkafka negotiates (2.16: v10) is one we serve
    assert versions_seen[0] and max(versions_seen[0]) <= 13, versions_seen
    assert await asyncio.to_thread(_kafka_python_inferred_version, broker.bootstrap) >= (4, 2)


def _kafka_python_offsets(bootstrap: str, topic: str):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        return (
            consumer.beginning_offsets(tps),
            consumer.end_offsets(tps),
            consumer.offsets_for_times(dict.fromkeys(tps, 0)),
        )
    finally:
        consumer.close()


async def test_kafka_python_lists_offsets_with_v11(broker, versions_seen):
    """kafka-python 3.0.12 sends the newest ListOffsets both sides know: v11 (Kafka 4.2)."""
    await _topic_ready(broker, "lo11", 2)
    await asyncio.to_thread(_confluent_roundtrip, broker.bootstrap, "lo11", 10)
    versions_seen[2].clear()
    beginning, end, by_time = await asyncio.to_thread(_kafka_python_offsets, broker.bootstrap, "lo11")
    assert sorted(beginning.values()) == [0, 0]
    assert sorted(end.values()) == [5, 5]
    assert sorted(o.offset for o in by_time.values()) == [0, 0]
    assert set(versions_seen[2]) == {11}, versions_seen
