"""A real in-process broker (controller service + storage engine on file://) with real clients.

One controller and one broker run in the test's event loop; kafka-python's blocking clients
run in a worker thread so the loop keeps serving them.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest
from kio.schema.errors import ErrorCode

from automq.broker.config import parse_config
from automq.broker.kafka import codec
from automq.broker.kafka.process import BrokerService
from automq.broker.kafka.server import SLAB_BYTES


def _configs(tmp_path, **kafka):
    objects = f"file://{tmp_path}/objects"
    controller = parse_config(
        {
            "node_id": 0,
            "data_dir": str(tmp_path / "c"),
            "object_store_url": objects,
            "http_host": "127.0.0.1",
            "http_port": 0,
        }
    )
    return controller, objects, kafka


@pytest.fixture
async def cluster(tmp_path):
    from automq.broker.controller.process import ControllerService

    controller_cfg, objects, _ = _configs(tmp_path)
    controller = ControllerService(controller_cfg)
    await controller.start()
    broker_cfg = parse_config(
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
            "storage": {"log_cache_bytes": "32MiB", "block_cache_bytes": "16MiB"},
            "kafka": {"message_max_bytes": 200_000},
        }
    )
    service = BrokerService(broker_cfg)
    await asyncio.wait_for(service.start(), 60)
    yield service
    await asyncio.wait_for(service.stop(timeout=5), 60)
    await asyncio.wait_for(controller.stop(), 30)


def _produce_and_consume(bootstrap: str, topic: str, n: int):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, request_timeout_ms=20_000)
    futures = [producer.send(topic, key=str(i).encode(), value=f"value-{i}".encode()) for i in range(n)]
    producer.flush(30)
    offsets = sorted(f.get(timeout=30).offset for f in futures)
    producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
        fetch_max_wait_ms=200,
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    values = []
    for message in consumer:
        values.append(message.value)
        if len(values) == n:
            break
    end = consumer.end_offsets([tp])[tp]
    beginning = consumer.beginning_offsets([tp])[tp]
    consumer.close()
    return offsets, values, beginning, end


async def test_kafka_python_produces_and_consumes(cluster):
    offsets, values, beginning, end = await asyncio.to_thread(_produce_and_consume, cluster.bootstrap, "orders", 500)
    assert offsets == list(range(500))
    assert values == [f"value-{i}".encode() for i in range(500)]
    assert (beginning, end) == (0, 500)
    metrics = cluster.registry.get_sample_value("kafka_topic_messages_in_total", {"topic": "orders"})
    assert metrics == 500
    # the small Produce frames were packed into slabs: the log cache keeps its batches as views
    # of a few 1 MiB slabs (given back whole once dropped), not one heap buffer per request
    held = cluster.broker.storage.log_cache._retained._held
    assert held and len(held) <= 2 and all(size >= SLAB_BYTES for _, size in held.values()), held
    # so are frames above the 64 KiB "large frame" size that malloc would still serve from its
    # heap (below its 256 KiB mmap threshold), received in pieces straight into the slab
    await asyncio.to_thread(_produce_large, cluster.bootstrap, "orders", 4, 150_000)
    assert len(held) <= 3 and all(size >= SLAB_BYTES for _, size in held.values()), held


def _produce_large(bootstrap: str, topic: str, n: int, size: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=1 << 20)
    for i in range(n):
        producer.send(topic, value=bytes([i]) * size).get(timeout=30)
    producer.close()


def _raw_request(port: int, request, correlation_id: int = 1):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        frame = codec.encode_request(correlation_id, request)
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read_exactly(sock, 4))[0]
        return codec.decode_response(_read_exactly(sock, size), type(request))[1]


def _read_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


async def test_produce_errors_wrong_crc_old_magic_and_too_large(cluster, make_batch):
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    port = cluster.kafka_ports["PLAINTEXT"]
    meta = await asyncio.to_thread(
        _raw_request,
        port,
        MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name="hostile"),),
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        ),
    )
    assert meta.topics[0].error_code == ErrorCode.none

    good = make_batch(3)
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    old_magic = bytearray(good)
    old_magic[16] = 1
    too_big = make_batch(300, value=b"x" * 1000)

    def produce(records):
        request = ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout=codec.ZERO_THROTTLE.__class__(seconds=10),
            topic_data=(
                TopicProduceData(
                    name="hostile", partition_data=(PartitionProduceData(index=0, records=bytes(records)),)
                ),
            ),
        )
        return _raw_request(port, request).responses[0].partition_responses[0]

    # the new topic's partition opens on this broker shortly after creation (clients retry
    # NOT_LEADER_OR_FOLLOWER the same way)
    for _ in range(100):
        if cluster.broker.partitions.led():
            break
        await asyncio.sleep(0.05)
    assert (await asyncio.to_thread(produce, bad_crc)).error_code == ErrorCode.corrupt_message
    assert (await asyncio.to_thread(produce, old_magic)).error_code == ErrorCode.invalid_record
    assert (await asyncio.to_thread(produce, too_big)).error_code == ErrorCode.message_too_large
    ok = await asyncio.to_thread(produce, good)
    assert ok.error_code == ErrorCode.none and ok.base_offset == 0
    ok = await asyncio.to_thread(produce, good)
    assert ok.base_offset == 3  # offsets assigned by the broker, not the client's baseOffset

    def unknown_partition():
        request = ProduceRequest(
            transactional_id=None,
            acks=1,
            timeout=codec.ZERO_THROTTLE.__class__(seconds=10),
            topic_data=(
                TopicProduceData(name="hostile", partition_data=(PartitionProduceData(index=7, records=bytes(good)),)),
            ),
        )
        return _raw_request(port, request).responses[0].partition_responses[0]

    assert (await asyncio.to_thread(unknown_partition)).error_code == ErrorCode.unknown_topic_or_partition

    def internal():
        return (
            _raw_request(port, _produce_request(9, "__consumer_offsets", 0, bytes(good)))
            .responses[0]
            .partition_responses[0]
        )

    assert (await asyncio.to_thread(internal)).error_code == ErrorCode.invalid_topic_exception


class RawClient:
    """One socket speaking kio-encoded requests, for protocol corners clients hide."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.correlation_id = 0

    def send(self, request) -> int:
        self.correlation_id += 1
        frame = codec.encode_request(self.correlation_id, request)
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        return self.correlation_id

    def receive(self, request_cls):
        size = struct.unpack(">i", _read_exactly(self.sock, 4))[0]
        return codec.decode_response(_read_exactly(self.sock, size), request_cls)

    def call(self, request):
        cid = self.send(request)
        got, response = self.receive(type(request))
        assert got == cid
        return response

    def close(self) -> None:
        self.sock.close()


async def _topic_ready(service: BrokerService, name: str, partitions: int = 1, configs: dict | None = None):
    await service.broker.ensure_topic(name, partitions, configs or {})
    for _ in range(200):
        led = {(p.topic, p.partition) for p in service.broker.partitions.led()}
        if all((name, i) in led for i in range(partitions)):
            return service.broker.partitions.topic(name)
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} never opened")


def _produce_request(version: int, topic: str, partition: int, records: bytes, acks: int = -1):
    m = __import__(f"kio.schema.produce.v{version}.request", fromlist=["x"])
    import datetime

    return m.ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            m.TopicProduceData(name=topic, partition_data=(m.PartitionProduceData(index=partition, records=records),)),
        ),
    )


def _fetch_request(
    version: int,
    topic,
    offset: int,
    *,
    session_id=0,
    epoch=-1,
    max_wait_ms=0,
    min_bytes=0,
    partitions=(0,),
    forgotten=(),
    leader_epoch=-1,
    max_bytes=50 << 20,
    partition_max_bytes=1 << 20,
):
    import datetime

    m = __import__(f"kio.schema.fetch.v{version}.request", fromlist=["x"])
    parts = tuple(
        codec.build(
            m.FetchPartition,
            partition=p,
            current_leader_epoch=leader_epoch,
            fetch_offset=offset[p] if isinstance(offset, dict) else offset,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=partition_max_bytes,
        )
        for p in partitions
    )
    topic_key = {"topic_id": topic} if version >= 13 else {"topic": topic}
    topics = (codec.build(m.FetchTopic, partitions=parts, **topic_key),) if partitions else ()
    forgotten_topics = tuple(
        codec.build(m.ForgottenTopic, partitions=tuple(forgotten), **topic_key) for _ in [0] if forgotten
    )
    return codec.build(
        m.FetchRequest,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=1,
        session_id=session_id,
        session_epoch=epoch,
        topics=topics,
        forgotten_topics_data=forgotten_topics,
        rack_id="",
    )


async def test_fetch_long_poll_is_woken_by_produce_and_out_of_range(cluster, make_batch):
    await _topic_ready(cluster, "poll")
    port = cluster.kafka_ports["PLAINTEXT"]

    def scenario():
        consumer, producer = RawClient(port), RawClient(port)
        try:
            consumer.send(_fetch_request(12, "poll", 0, max_wait_ms=20_000, min_bytes=1))
            time.sleep(0.3)  # the fetch is parked waiting for data
            produced = producer.call(_produce_request(9, "poll", 0, make_batch(4)))
            _, fetched = consumer.receive(codec.request_class(1, 12))
            beyond = consumer.call(_fetch_request(12, "poll", 99))
            return produced, fetched, beyond
        finally:
            consumer.close()
            producer.close()

    produced, fetched, beyond = await asyncio.to_thread(scenario)
    assert produced.responses[0].partition_responses[0].error_code == ErrorCode.none
    part = fetched.responses[0].partitions[0]
    assert part.error_code == ErrorCode.none and part.high_watermark == 4 and part.last_stable_offset == 4
    from kafka.record.default_records import DefaultRecordBatch

    assert [r.offset for r in DefaultRecordBatch(part.records)] == [0, 1, 2, 3]
    out = beyond.responses[0].partitions[0]
    assert out.error_code == ErrorCode.offset_out_of_range and out.high_watermark == 4 and out.log_start_offset == 0


async def _two_partition_topic(cluster, name: str):
    """A two-partition topic, open here: its topic id (for Fetch v13+) and the Kafka port."""
    import uuid

    info = await _topic_ready(cluster, name, partitions=2)
    topic_id = uuid.UUID(info.topic_id) if len(info.topic_id) == 36 else None
    return topic_id, cluster.kafka_ports["PLAINTEXT"]


async def test_incremental_fetch_session(cluster, make_batch):
    topic_id, port = await _two_partition_topic(cluster, "sess")

    def scenario():
        c = RawClient(port)
        try:
            c.call(_produce_request(9, "sess", 0, make_batch(2)))
            c.call(_produce_request(9, "sess", 1, make_batch(3)))
            full = c.call(_fetch_request(15, topic_id, 0, session_id=0, epoch=0, partitions=(0, 1)))
            sid = full.session_id
            # the client moved its positions past what it got; nothing new: no partitions back
            quiet = c.call(_fetch_request(15, topic_id, {0: 2, 1: 3}, session_id=sid, epoch=1, partitions=(0, 1)))
            c.call(_produce_request(9, "sess", 1, make_batch(1)))
            # partition 1 moved on: only it comes back, from the session's remembered offset 3
            moved = c.call(_fetch_request(15, topic_id, 0, session_id=sid, epoch=2, partitions=()))
            stale = c.call(_fetch_request(15, topic_id, 0, session_id=sid, epoch=9, partitions=()))
            unknown = c.call(_fetch_request(15, topic_id, 0, session_id=sid + 12345, epoch=1, partitions=()))
            closed = c.call(_fetch_request(15, topic_id, 0, session_id=sid, epoch=-1, partitions=(0,)))
            return full, quiet, moved, stale, unknown, closed
        finally:
            c.close()

    full, quiet, moved, stale, unknown, closed = await asyncio.to_thread(scenario)
    assert full.session_id != 0
    assert sorted((p.partition_index, p.high_watermark) for t in full.responses for p in t.partitions) == [
        (0, 2),
        (1, 3),
    ]
    assert all(t.topic_id == topic_id for t in full.responses)
    assert quiet.error_code == ErrorCode.none and quiet.responses == ()
    assert [(p.partition_index, p.high_watermark) for t in moved.responses for p in t.partitions] == [(1, 4)]
    from kafka.record.default_records import DefaultRecordBatch

    assert [r.offset for r in DefaultRecordBatch(moved.responses[0].partitions[0].records)] == [3]
    assert stale.error_code == ErrorCode.invalid_fetch_session_epoch
    assert unknown.error_code == ErrorCode.fetch_session_id_not_found
    assert closed.session_id == 0 and closed.responses[0].partitions[0].high_watermark == 2


async def test_incremental_session_gives_partitions_that_got_data_the_back_of_the_queue(cluster, make_batch):
    """max_bytes holds one batch: the first partition in the session's order gets it (KIP-74)
    and, as in Kafka's incremental sessions, then moves to the end of the order, so the next
    response serves the other partition even though the first still has more."""
    topic_id, port = await _two_partition_topic(cluster, "rotate")

    def scenario():
        c = RawClient(port)
        try:
            for _ in range(3):
                for p in (0, 1):
                    c.call(_produce_request(9, "rotate", p, make_batch(2)))
            one = {"max_bytes": 1, "partitions": (0, 1)}
            full = c.call(_fetch_request(15, topic_id, 0, session_id=0, epoch=0, **one))
            sid = full.session_id
            got = [full]
            offsets = {0: 0, 1: 0}
            for epoch in (1, 2, 3):
                last = got[-1]
                for t in last.responses:
                    for part in t.partitions:
                        if part.records:
                            offsets[part.partition_index] += 2
                got.append(c.call(_fetch_request(15, topic_id, dict(offsets), session_id=sid, epoch=epoch, **one)))
            return got
        finally:
            c.close()

    responses = await asyncio.to_thread(scenario)
    served = [[p.partition_index for t in r.responses for p in t.partitions if p.records] for r in responses]
    # the full fetch that opens the session keeps the request's order (as Kafka's does); from
    # the first incremental fetch on, the partition served goes to the back
    assert served == [[0], [0], [1], [0]], served


async def test_a_fetch_reads_no_more_than_its_response_can_carry(cluster, make_batch, monkeypatch):
    """8 partitions x partition_max_bytes 16 KiB against max_bytes 40 KiB: the broker reads
    ~40 KiB from storage (the first partitions, in order, the last one cut), not 8 x 16 KiB of
    which most would be dropped; the partitions without room still report their watermarks."""
    from automq.broker.kafka.partitions import Partition

    await _topic_ready(cluster, "budget", partitions=8)
    port = cluster.kafka_ports["PLAINTEXT"]
    batch = make_batch(40, value=b"x" * 100)  # ~4.5 KiB
    read_bytes: list[int] = []
    real_read = Partition.read

    async def counting_read(self, offset, max_bytes, end):
        result = await real_read(self, offset, max_bytes, end)
        read_bytes.append(sum(len(b.payload) for b in result.batches))
        return result

    def produce():
        c = RawClient(port)
        try:
            for p in range(8):
                for _ in range(8):  # ~36 KiB per partition
                    c.call(_produce_request(9, "budget", p, batch))
        finally:
            c.close()

    def fetch():
        c = RawClient(port)
        try:
            return c.call(
                _fetch_request(
                    12, "budget", 0, partitions=tuple(range(8)), max_bytes=40 << 10, partition_max_bytes=16 << 10
                )
            )
        finally:
            c.close()

    await asyncio.to_thread(produce)
    monkeypatch.setattr(Partition, "read", counting_read)
    response = await asyncio.to_thread(fetch)
    parts = {p.partition_index: p for t in response.responses for p in t.partitions}
    sizes = {i: len(p.records or b"") for i, p in parts.items()}
    assert sum(sizes.values()) <= 40 << 10 and sizes[0] > 0 and sizes[1] > 0
    assert sum(read_bytes) <= (40 << 10) + len(batch), read_bytes  # + the batch that overhangs a limit
    assert len(read_bytes) < 8
    assert sorted(parts) == list(range(8)) and all(p.high_watermark == 320 for p in parts.values())


async def test_list_offsets_earliest_latest_timestamp(cluster, make_batch):
    await _topic_ready(cluster, "times")
    port = cluster.kafka_ports["PLAINTEXT"]
    from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic

    def scenario():
        c = RawClient(port)
        try:
            for _i, ts in enumerate((1000, 2000, 3000)):
                c.call(_produce_request(9, "times", 0, make_batch(2, timestamp_ms=ts)))
            answers = {}
            for ts in (-2, -1, -3, 1500, 2001, 9999):
                r = c.call(
                    ListOffsetsRequest(
                        replica_id=-1,
                        isolation_level=0,
                        topics=(
                            ListOffsetsTopic(
                                name="times",
                                partitions=(
                                    ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=ts),
                                ),
                            ),
                        ),
                    )
                )
                p = r.topics[0].partitions[0]
                answers[ts] = (p.error_code, p.offset, p.timestamp)
            return answers
        finally:
            c.close()

    answers = await asyncio.to_thread(scenario)
    assert answers[-2] == (ErrorCode.none, 0, -1)
    assert answers[-1] == (ErrorCode.none, 6, -1)
    assert answers[-3] == (ErrorCode.none, 5, 3001)
    assert answers[1500] == (ErrorCode.none, 2, 2000)  # record-level: first record at/after the time
    assert answers[2001] == (ErrorCode.none, 3, 2001)
    assert answers[9999] == (ErrorCode.none, -1, -1)


async def test_acks_zero_gets_no_response_and_log_append_time(cluster, make_batch):
    await _topic_ready(cluster, "appendtime", configs={"message.timestamp.type": "LogAppendTime"})
    port = cluster.kafka_ports["PLAINTEXT"]
    from kio.schema.api_versions.v0.request import ApiVersionsRequest

    def scenario():
        c = RawClient(port)
        try:
            c.send(_produce_request(9, "appendtime", 0, make_batch(1, timestamp_ms=5), acks=0))
            cid = c.send(ApiVersionsRequest())
            got, _ = c.receive(ApiVersionsRequest)  # the next response is ApiVersions: acks=0 got none
            before = int(time.time() * 1000)
            produced = c.call(_produce_request(9, "appendtime", 0, make_batch(1, timestamp_ms=5)))
            fetched = c.call(_fetch_request(12, "appendtime", 0))
            return cid, got, before, produced, fetched
        finally:
            c.close()

    cid, got, before, produced, fetched = await asyncio.to_thread(scenario)
    assert got == cid
    p = produced.responses[0].partition_responses[0]
    assert p.error_code == ErrorCode.none and p.base_offset == 1
    assert p.log_append_time is not None and p.log_append_time.timestamp() * 1000 >= before - 1
    from kafka.record.default_records import DefaultRecordBatch

    data = fetched.responses[0].partitions[0].records
    first = DefaultRecordBatch(
        data[: 12 + struct.unpack_from(">i", data, 8)[0]]
    )  # its CRC check reads to the buffer end
    assert first.timestamp_type == 1 and first.max_timestamp != 5 and first.validate_crc()


def _confluent_roundtrip(bootstrap: str, topic: str, n: int):
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    errors = []
    for i in range(n):
        producer.produce(
            topic, value=b"%d" % i, partition=i % 2, on_delivery=lambda err, msg: err and errors.append(err)
        )
    producer.flush(30)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "core-test",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    seen = []
    deadline = time.time() + 30
    while len(seen) < n and time.time() < deadline:
        for m in consumer.consume(1000, 0.5):
            if not m.error():
                seen.append(int(m.value()))
    consumer.close()
    return errors, sorted(seen)


async def test_confluent_kafka_idempotent_produce_and_consume(cluster):
    await _topic_ready(cluster, "rdkafka", partitions=2)
    errors, seen = await asyncio.to_thread(_confluent_roundtrip, cluster.bootstrap, "rdkafka", 2000)
    assert errors == []
    assert seen == list(range(2000))


@pytest.fixture
async def two_brokers(tmp_path):
    from automq.broker.controller.process import ControllerService

    controller_cfg, objects, _ = _configs(tmp_path)
    controller = ControllerService(controller_cfg)
    await controller.start()
    services = []
    for node in (1, 2):
        cfg = parse_config(
            {
                "node_id": node,
                "data_dir": str(tmp_path / f"b{node}"),
                "object_store_url": objects,
                "controller_urls": [controller.url],
                "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 0}],
                "http_host": "127.0.0.1",
                "http_port": 0,
                "heartbeat_interval_ms": 200,
                "wal": {"capacity": "16MiB"},
                "storage": {"log_cache_bytes": "16MiB", "block_cache_bytes": "8MiB"},
            }
        )
        service = BrokerService(cfg)
        await asyncio.wait_for(service.start(), 60)
        services.append(service)
    yield services
    for service in services:
        await asyncio.wait_for(service.stop(timeout=5), 60)
    await asyncio.wait_for(controller.stop(), 30)


async def test_reassignment_moves_leadership_without_copying_and_redirects_clients(two_brokers, make_batch):
    first, second = two_brokers
    info = await first.broker.ensure_topic("moving", 1, {})
    source = first if info.partitions[0].leader == 1 else second
    target = second if source is first else first
    await _topic_ready(source, "moving")
    port = source.kafka_ports["PLAINTEXT"]

    def produce_to(p, n):
        c = RawClient(p)
        try:
            return [
                c.call(_produce_request(10, "moving", 0, make_batch(2))).responses[0].partition_responses[0]
                for _ in range(n)
            ]
        finally:
            c.close()

    before = await asyncio.to_thread(produce_to, port, 5)
    assert [r.base_offset for r in before] == [0, 2, 4, 6, 8]
    await source.cluster.reassign_partition("moving", 0, target.broker.node_id)
    for _ in range(200):  # the target opens the stream under a higher epoch
        if any(p.topic == "moving" for p in target.broker.partitions.led()):
            break
        await asyncio.sleep(0.05)
    moved = target.broker.partitions.get("moving", 0)
    assert moved.leader_epoch > info.partitions[0].leader_epoch
    assert moved.high_watermark == 10  # all acknowledged data is there, nothing was copied
    stale = await asyncio.to_thread(produce_to, port, 1)
    assert stale[0].error_code == ErrorCode.not_leader_or_follower
    # KIP-951: the answer names the new leader (and its endpoint, at the response's top level)
    assert (stale[0].current_leader.leader_id, stale[0].current_leader.leader_epoch) == (
        target.broker.node_id,
        moved.leader_epoch,
    )
    after = await asyncio.to_thread(produce_to, target.kafka_ports["PLAINTEXT"], 1)
    assert after[0].error_code == ErrorCode.none and after[0].base_offset == 10

    def consume_all():
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=source.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=10_000,
        )
        consumer.assign([TopicPartition("moving", 0)])
        offsets = []
        for m in consumer:
            offsets.append(m.offset)
            if len(offsets) == 12:
                break
        consumer.close()
        return offsets

    # a client bootstrapped on the old leader follows metadata to the new one
    assert await asyncio.to_thread(consume_all) == list(range(12))


async def test_fetch_checks_the_clients_leader_epoch(cluster, make_batch):
    await _topic_ready(cluster, "epochs")
    epoch = cluster.broker.partitions.get("epochs", 0).leader_epoch
    port = cluster.kafka_ports["PLAINTEXT"]

    def scenario():
        c = RawClient(port)
        try:
            c.call(_produce_request(9, "epochs", 0, make_batch(1)))
            return [
                c.call(_fetch_request(12, "epochs", 0, leader_epoch=e)).responses[0].partitions[0].error_code
                for e in (epoch, epoch + 1, -1)
            ]
        finally:
            c.close()

    assert await asyncio.to_thread(scenario) == [ErrorCode.none, ErrorCode.unknown_leader_epoch, ErrorCode.none]


async def test_pipelined_produces_keep_their_order_when_the_first_waits_for_the_open(cluster, make_batch):
    """A connection's pipelined Produces are appended in request order even when the first
    one has to wait (here: for the partition's open, as right after auto-creation) and the
    later ones find the partition ready: a non-idempotent producer (confluent-kafka's default,
    up to 1M requests in flight) would otherwise see its records stored out of order. Seen in
    CI as records 11..20 stored before 0..10 of a freshly auto-created topic."""
    from automq.broker.kafka.partitions import NotLeaderError

    await _topic_ready(cluster, "ordered")
    partitions = cluster.broker.partitions
    real_get, real_wait = partitions.get, partitions.get_when_open
    gate = asyncio.Event()
    first = [True]

    def get(topic, index):
        if topic == "ordered" and first[0]:
            first[0] = False
            raise NotLeaderError("still opening")  # the first request takes the slow path
        return real_get(topic, index)

    async def get_when_open(topic, index, timeout):
        await gate.wait()
        return await real_wait(topic, index, timeout)

    partitions.get = get  # type: ignore[method-assign]
    partitions.get_when_open = get_when_open  # type: ignore[method-assign]
    server = cluster.server
    client = await asyncio.to_thread(RawClient, cluster.kafka_ports["PLAINTEXT"])
    try:
        requests = [_produce_request(9, "ordered", 0, make_batch(1, value=b"%d" % i)) for i in range(5)]
        for r in requests:
            await asyncio.to_thread(client.send, r)
        for _ in range(400):  # all five are read and handled as far as they go
            if sum(len(c._slots) for c in server.connections) == 5:
                break
            await asyncio.sleep(0.01)
        assert sum(len(c._slots) for c in server.connections) == 5
        await asyncio.sleep(0.1)  # the later four would append now, before the first
        gate.set()
        offsets = []
        for r in requests:
            _, response = await asyncio.to_thread(client.receive, type(r))
            part = response.responses[0].partition_responses[0]
            assert part.error_code == ErrorCode.none
            offsets.append(part.base_offset)
    finally:
        client.close()
        partitions.get, partitions.get_when_open = real_get, real_wait  # type: ignore[method-assign]
    assert offsets == [0, 1, 2, 3, 4]


async def test_a_move_requested_while_the_first_open_is_in_flight_completes(two_brokers):
    """A reassignment that arrives while the leader is still opening the partition (right after
    CreateTopics) must not strand it: once the open finishes, the leader hands it over."""
    first, second = two_brokers
    gate = asyncio.Event()
    for service in two_brokers:
        storage = service.broker.storage
        original = storage.open_stream

        async def slow_open(stream_id, epoch, _original=original):
            stream = await _original(stream_id, epoch)  # opened at the controller before the move
            await gate.wait()  # ... but the rest of the open finishes after it
            return stream

        storage.open_stream = slow_open  # type: ignore[method-assign]
    info = await first.cluster.create_topic("late", 1, {})
    source = first if info.partitions[0].leader == first.broker.node_id else second
    target = second if source is first else first
    key = ("late", 0)
    for _ in range(200):  # the leader's open is under way (blocked at the gate)
        if key in source.broker.partitions._transitions:
            break
        await asyncio.sleep(0.05)
    assert key in source.broker.partitions._transitions
    await first.cluster.reassign_partition("late", 0, target.broker.node_id)
    for _ in range(200):  # the leader has seen the move while its open still waits
        image = source.broker.partitions._image
        topic = next((t for t in image.topics if t.name == "late"), None) if image else None
        if topic is not None and topic.partitions[0].state == "moving":
            break
        await asyncio.sleep(0.05)
    gate.set()
    for _ in range(400):
        if any(p.topic == "late" for p in target.broker.partitions.led()):
            break
        await asyncio.sleep(0.05)
    assert any(p.topic == "late" for p in target.broker.partitions.led()), "the move stayed stranded"
    assert not any(p.topic == "late" for p in source.broker.partitions.led())
