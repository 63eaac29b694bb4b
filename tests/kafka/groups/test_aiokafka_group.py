"""aiokafka (pure-Python asyncio client, older protocol versions) in a consumer group on the
same event loop as an in-process broker: two members rebalance, commit and a third resumes."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

TOPIC = "aio-events"
PARTITIONS = 2


async def consume_until(consumer: AIOKafkaConsumer, seen: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        batches = await consumer.getmany(timeout_ms=100)
        for records in batches.values():
            seen.extend(int(r.value) for r in records)
        if batches:
            await consumer.commit()


async def wait_for(condition, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)


async def test_aiokafka_group_rebalance_commit_resume(real_cluster) -> None:
    broker = await real_cluster.start_broker(1)
    await broker.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = broker.bootstrap
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    for i in range(60):
        await producer.send(TOPIC, str(i).encode(), partition=i % PARTITIONS)
    await producer.flush()

    def member(name: str) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            TOPIC,
            bootstrap_servers=bootstrap,
            group_id="aio-grp",
            client_id=name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6_000,
            heartbeat_interval_ms=500,
        )

    a, b = member("aio-a"), member("aio-b")
    seen_a: list[int] = []
    seen_b: list[int] = []
    stop = asyncio.Event()
    await a.start()
    task_a = asyncio.create_task(consume_until(a, seen_a, stop))
    await wait_for(lambda: len(seen_a) == 60)
    await b.start()
    task_b = asyncio.create_task(consume_until(b, seen_b, stop))
    await wait_for(lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1)
    assert a.assignment() | b.assignment() == {TopicPartition(TOPIC, p) for p in range(PARTITIONS)}
    for i in range(60, 100):
        await producer.send(TOPIC, str(i).encode(), partition=i % PARTITIONS)
    await producer.flush()
    await wait_for(lambda: len(seen_a) + len(seen_b) == 100)
    stop.set()
    await asyncio.gather(task_a, task_b)
    await a.stop()
    await b.stop()
    assert sorted(seen_a + seen_b) == list(range(100))

    for i in range(100, 110):
        await producer.send(TOPIC, str(i).encode(), partition=i % PARTITIONS)
    await producer.stop()
    c = member("aio-c")
    await c.start()
    seen_c: list[int] = []
    stop_c = asyncio.Event()
    task_c = asyncio.create_task(consume_until(c, seen_c, stop_c))
    await wait_for(lambda: len(seen_c) >= 10)
    stop_c.set()
    await task_c
    await c.stop()
    assert sorted(seen_c) == list(range(100, 110))
