"""Idempotent producers (confluent-kafka / librdkafka, kafka-python) against a real
in-process broker through a proxy that drops the connection instead of delivering some
Produce responses. The batches were appended; the clients retry them on a new connection and
the broker must answer the retries from its producer state, so every record is in the log
exactly once and in order."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from automq.broker.config import parse_config
from automq.broker.controller.process import ControllerService

TOPIC = "idem"
PARTITIONS = 2
PRODUCE = 0


class DroppingProxy:
    """TCP proxy that kills the connection in place of every `every`-th Produce response
    (at most `limit` times). It reads frames (4-byte size + body) in both directions to pair
    responses with the API key of their request."""

    def __init__(self, every: int = 3, limit: int = 6) -> None:
        self.every = every
        self.limit = limit
        self.target_port = 0
        self.produce_responses = 0
        self.dropped = 0
        self.blackhole = False  # drop every Produce response
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def listen(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()

    @staticmethod
    async def _frame(reader: asyncio.StreamReader) -> bytes:
        size = await reader.readexactly(4)
        return size + await reader.readexactly(struct.unpack(">i", size)[0])

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        broker_r, broker_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers |= {client_w, broker_w}
        api_keys: dict[int, int] = {}

        async def upstream() -> None:
            while True:
                frame = await self._frame(client_r)
                api_key, _version, correlation = struct.unpack_from(">hhi", frame, 4)
                api_keys[correlation] = api_key
                broker_w.write(frame)
                await broker_w.drain()

        async def downstream() -> None:
            while True:
                frame = await self._frame(broker_r)
                (correlation,) = struct.unpack_from(">i", frame, 4)
                if api_keys.pop(correlation, None) == PRODUCE:
                    self.produce_responses += 1
                    if self.blackhole:
                        self.dropped += 1
                        return
                    if self.dropped < self.limit and self.produce_responses % self.every == 0:
                        self.dropped += 1
                        return  # the batch was appended; the client never hears about it
                client_w.write(frame)
                await client_w.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for w in (client_w, broker_w):
                w.close()
                self._writers.discard(w)
                with contextlib.suppress(Exception):
                    await w.wait_closed()


@pytest.fixture
async def proxied_broker(tmp_path: Path, file_url: str):
    from automq.broker.kafka.process import BrokerService

    controller = ControllerService(
        parse_config(
            {
                "node_id": 0,
                "data_dir": str(tmp_path / "c"),
                "object_store_url": file_url,
                "http_host": "127.0.0.1",
                "http_port": 0,
            }
        )
    )
    await controller.start()
    proxy = DroppingProxy()
    port = await proxy.listen()
    config = parse_config(
        {
            "node_id": 1,
            "data_dir": str(tmp_path / "b1"),
            "object_store_url": file_url,
            "controller_urls": [controller.url],
            # clients are told to connect to the proxy
            "listeners": [
                {
                    "name": "PLAINTEXT",
                    "host": "127.0.0.1",
                    "port": 0,
                    "advertised_host": "127.0.0.1",
                    "advertised_port": port,
                }
            ],
            "http_host": "127.0.0.1",
            "http_port": 0,
            "heartbeat_interval_ms": 200,
            "wal": {"capacity": "16MiB"},
            "storage": {"log_cache_bytes": "32MiB", "block_cache_bytes": "16MiB"},
        }
    )
    service = BrokerService(config)
    await asyncio.wait_for(service.start(), 60)
    proxy.target_port = service.kafka_ports["PLAINTEXT"]
    await service.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    yield service, proxy, f"127.0.0.1:{port}"
    await proxy.close()
    await service.stop(timeout=5)
    await controller.stop()


def consume_all(bootstrap: str, expected: int) -> dict[int, list[int]]:
    """Every record of the topic, per partition, in log order (read_committed not needed)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", consumer_timeout_ms=3_000
    )
    consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    out: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    count = 0
    for record in consumer:
        out[record.partition].append(int(record.value))
        count += 1
    end = consumer.end_offsets([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    consumer.close()
    assert sum(end.values()) == count, "the log holds records the consumer did not see"
    return out


def check_exactly_once(per_partition: dict[int, list[int]], total: int) -> None:
    for p, values in per_partition.items():
        assert values == list(range(p, total, PARTITIONS)), f"partition {p}: duplicates, gaps or reordering"


async def test_confluent_idempotent_producer_retries_without_duplicates(proxied_broker) -> None:
    _service, proxy, bootstrap = proxied_broker
    total = 3_000

    def produce() -> list[Any]:
        from confluent_kafka import Producer

        errors: list[Any] = []
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "batch.num.messages": 100,
                "retry.backoff.ms": 20,
                "message.timeout.ms": 60_000,
            }
        )
        for i in range(total):
            producer.produce(
                TOPIC,
                value=str(i).encode(),
                partition=i % PARTITIONS,
                on_delivery=lambda err, msg: errors.append(err) if err is not None else None,
            )
            producer.poll(0)
        remaining = producer.flush(60)
        assert remaining == 0
        return errors

    errors = await asyncio.to_thread(produce)
    assert errors == []
    assert proxy.dropped >= 1, "the proxy never dropped a response: the test did not test retries"
    check_exactly_once(await asyncio.to_thread(consume_all, bootstrap, total), total)


async def test_kafka_python_idempotent_producer_retries_without_duplicates(proxied_broker) -> None:
    _service, proxy, bootstrap = proxied_broker
    total = 1_000

    def produce() -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            acks="all",
            linger_ms=2,
            batch_size=2_000,
            retries=50,
            retry_backoff_ms=20,
            request_timeout_ms=5_000,
        )
        futures = [producer.send(TOPIC, value=str(i).encode(), partition=i % PARTITIONS) for i in range(total)]
        producer.flush(60)
        for f in futures:
            f.get(timeout=1)  # raises if a record failed
        producer.close()

    await asyncio.to_thread(produce)
    assert proxy.dropped >= 1, "the proxy never dropped a response: the test did not test retries"
    check_exactly_once(await asyncio.to_thread(consume_all, bootstrap, total), total)


@pytest.fixture
async def two_proxied_brokers(tmp_path: Path, file_url: str):
    from automq.broker.kafka.process import BrokerService

    controller = ControllerService(
        parse_config(
            {
                "node_id": 0,
                "data_dir": str(tmp_path / "c"),
                "object_store_url": file_url,
                "http_host": "127.0.0.1",
                "http_port": 0,
            }
        )
    )
    await controller.start()
    services, proxies = {}, {}
    for node_id in (1, 2):
        proxy = DroppingProxy(every=4, limit=4)
        port = await proxy.listen()
        config = parse_config(
            {
                "node_id": node_id,
                "data_dir": str(tmp_path / f"b{node_id}"),
                "object_store_url": file_url,
                "controller_urls": [controller.url],
                "listeners": [
                    {
                        "name": "PLAINTEXT",
                        "host": "127.0.0.1",
                        "port": 0,
                        "advertised_host": "127.0.0.1",
                        "advertised_port": port,
                    }
                ],
                "http_host": "127.0.0.1",
                "http_port": 0,
                "heartbeat_interval_ms": 200,
                "wal": {"capacity": "16MiB"},
                "storage": {"log_cache_bytes": "32MiB", "block_cache_bytes": "16MiB"},
            }
        )
        service = BrokerService(config)
        await asyncio.wait_for(service.start(), 60)
        proxy.target_port = service.kafka_ports["PLAINTEXT"]
        services[node_id], proxies[node_id] = service, proxy
    await services[1].broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = ",".join(f"127.0.0.1:{p._server.sockets[0].getsockname()[1]}" for p in proxies.values())
    yield services, proxies, bootstrap
    for proxy in proxies.values():
        await proxy.close()
    for service in services.values():
        await service.stop(timeout=5)
    await controller.stop()


async def test_idempotent_retries_across_a_partition_move(two_proxied_brokers) -> None:
    """Batches appended by the old leader whose responses never arrive are retried at the new
    leader after the partition moves; its producer state, rebuilt from the log, must answer
    them as duplicates (a rebuild that forgets them appends them twice)."""
    from kafka import KafkaConsumer, TopicPartition

    services, proxies, bootstrap = two_proxied_brokers
    topic = "idem-move"
    await services[1].broker.ensure_topic(topic, partitions=1)
    old = services[1].broker.partitions.topic(topic).partitions[0].leader
    new = 2 if old == 1 else 1
    first, second = 500, 500
    from confluent_kafka import Producer

    errors: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.num.messages": 50,
            "retry.backoff.ms": 50,
            "message.timeout.ms": 60_000,
        }
    )

    def send(start: int, count: int) -> None:
        for i in range(start, start + count):
            producer.produce(
                topic,
                value=str(i).encode(),
                partition=0,
                on_delivery=lambda err, msg: errors.append(err) if err is not None else None,
            )
            producer.poll(0)

    await asyncio.to_thread(send, 0, first)
    assert await asyncio.to_thread(producer.flush, 30) == 0
    # from now on the old leader appends but its answers never reach the client
    proxies[old].blackhole = True
    await asyncio.to_thread(send, first, second)
    await asyncio.to_thread(producer.poll, 0.5)
    partition = services[old].broker.partitions.get(topic, 0)
    deadline = time.monotonic() + 30
    while partition.log_end_offset <= first and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert partition.log_end_offset > first, "the old leader never appended an unanswered batch"
    await asyncio.sleep(0.3)  # the client retries (duplicates, unanswered) a few times
    await services[old].broker.cluster.reassign_partition(topic, 0, new)
    assert await asyncio.to_thread(producer.flush, 60) == 0
    assert errors == []
    assert services[new].broker.partitions.get(topic, 0).leader_epoch > 0

    def consume() -> list[int]:
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=3_000,
        )
        consumer.assign([TopicPartition(topic, 0)])
        values = [int(r.value) for r in consumer]
        consumer.close()
        return values

    assert await asyncio.to_thread(consume) == list(range(first + second))
