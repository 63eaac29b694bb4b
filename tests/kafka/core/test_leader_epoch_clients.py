"""Leader epochs across moves and a broker restart, checked on the wire and with real clients.

Two in-process brokers and a controller (file:// object store). The partition moves twice and
then its leader stops: every epoch's records carry that epoch, OffsetForLeaderEpoch answers
where each epoch ended (also on the broker that took over), Fetch reports diverging epochs and
fences stale or future leader epochs, ListOffsets names the epoch that wrote an offset; and
kafka-python (which validates positions with OffsetForLeaderEpoch), librdkafka and aiokafka
keep consuming across a move with no offset reset allowed.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import struct
import time

import pytest
from kio.schema.errors import ErrorCode

from automq.broker.config import parse_config
from automq.broker.kafka import codec
from automq.broker.kafka.process import BrokerService


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.correlation_id = 0

    def call(self, request):
        self.correlation_id += 1
        frame = codec.encode_request(self.correlation_id, request)
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read_exactly(self.sock, 4))[0]
        got, response = codec.decode_response(_read_exactly(self.sock, size), type(request))
        assert got == self.correlation_id
        return response

    def close(self) -> None:
        self.sock.close()


def _m(api: str, version: int):
    return __import__(f"kio.schema.{api}.v{version}.request", fromlist=["x"])


def _produce(topic: str, records: bytes):
    m = _m("produce", 9)
    return m.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            m.TopicProduceData(name=topic, partition_data=(m.PartitionProduceData(index=0, records=records),)),
        ),
    )


def _offset_for_leader_epoch(topic: str, pairs):
    m = _m("offset_for_leader_epoch", 4)
    parts = tuple(m.OffsetForLeaderPartition(partition=0, current_leader_epoch=c, leader_epoch=e) for c, e in pairs)
    return m.OffsetForLeaderEpochRequest(replica_id=-1, topics=(m.OffsetForLeaderTopic(topic=topic, partitions=parts),))


def _fetch(topic: str, offset: int, *, current_leader_epoch: int = -1, last_fetched_epoch: int = -1):
    m = _m("fetch", 12)
    part = m.FetchPartition(
        partition=0,
        current_leader_epoch=current_leader_epoch,
        fetch_offset=offset,
        last_fetched_epoch=last_fetched_epoch,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    return codec.build(
        m.FetchRequest,
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(m.FetchTopic(topic=topic, partitions=(part,)),),
        forgotten_topics_data=(),
        rack_id="",
    )


def _list_offsets(topic: str, timestamp: int):
    m = _m("list_offsets", 9)
    part = m.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=timestamp)
    return m.ListOffsetsRequest(
        replica_id=-1, isolation_level=0, topics=(m.ListOffsetsTopic(name=topic, partitions=(part,)),)
    )


def _batch_epochs(records: bytes) -> list[tuple[int, int]]:
    """(base offset, partitionLeaderEpoch) of each v2 batch in a fetch answer."""
    out, pos = [], 0
    while pos + 17 <= len(records):
        base, length, epoch = struct.unpack_from(">qii", records, pos)
        out.append((base, epoch))
        pos += 12 + length
    return out


def _broker_config(tmp_path, node: int, controller_url: str, objects: str):
    return parse_config(
        {
            "node_id": node,
            "data_dir": str(tmp_path / f"b{node}"),
            "object_store_url": objects,
            "controller_urls": [controller_url],
            "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 0}],
            "http_host": "127.0.0.1",
            "http_port": 0,
            "heartbeat_interval_ms": 200,
            "wal": {"capacity": "16MiB"},
            "storage": {"log_cache_bytes": "16MiB", "block_cache_bytes": "8MiB"},
        }
    )


@pytest.fixture
async def brokers(tmp_path):
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
    services = {}
    for node in (1, 2):
        service = BrokerService(_broker_config(tmp_path, node, controller.url, objects))
        await asyncio.wait_for(service.start(), 60)
        services[node] = service
    yield services
    for service in services.values():
        if service.broker is not None and not getattr(service, "_stopped_by_test", False):
            await asyncio.wait_for(service.stop(timeout=5), 60)
    await asyncio.wait_for(controller.stop(), 30)


async def _led_by(service: BrokerService, topic: str, above_epoch: int = -1):
    for _ in range(400):
        for p in service.broker.partitions.led():
            if p.topic == topic and p.leader_epoch > above_epoch:
                return p
        await asyncio.sleep(0.05)
    raise AssertionError(f"{topic} is not led by node {service.broker.node_id} above epoch {above_epoch}")


async def _leader(services, topic: str):
    for _ in range(400):
        for s in services.values():
            for p in s.broker.partitions.led():
                if p.topic == topic:
                    return s, p
        await asyncio.sleep(0.05)
    raise AssertionError(f"{topic} has no leader")


async def test_epochs_across_moves_and_a_restart(brokers, make_batch):
    first = brokers[1]
    await first.broker.ensure_topic("le", 1, {})
    src, p0 = await _leader(brokers, "le")
    e0 = p0.leader_epoch

    def produce(port: int, batches: int) -> list[int]:
        c = RawClient(port)
        try:
            out = []
            for _ in range(batches):
                r = c.call(_produce("le", make_batch(2))).responses[0].partition_responses[0]
                assert r.error_code == ErrorCode.none
                out.append(r.base_offset)
            return out
        finally:
            c.close()

    assert await asyncio.to_thread(produce, src.kafka_ports["PLAINTEXT"], 3) == [0, 2, 4]
    dst = next(s for s in brokers.values() if s is not src)
    await src.cluster.reassign_partition("le", 0, dst.broker.node_id)
    p1 = await _led_by(dst, "le", e0)
    e1 = p1.leader_epoch
    assert await asyncio.to_thread(produce, dst.kafka_ports["PLAINTEXT"], 2) == [6, 8]
    await dst.cluster.reassign_partition("le", 0, src.broker.node_id)
    p2 = await _led_by(src, "le", e1)
    e2 = p2.leader_epoch
    assert e0 < e1 < e2
    assert await asyncio.to_thread(produce, src.kafka_ports["PLAINTEXT"], 1) == [10]
    # a metadata answer names the same epoch
    assert src.broker.leader_of("le", 0) == (src.broker.node_id, e2)

    def wire_checks(port: int, old_port: int):
        c = RawClient(port)
        old = RawClient(old_port)
        try:
            ofle = c.call(
                _offset_for_leader_epoch("le", [(-1, e0), (-1, e1), (e2, e2), (-1, e2 + 1), (-1, -1), (-1, e1 - 1)])
            )
            answers = [(p.error_code, p.leader_epoch, p.end_offset) for p in ofle.topics[0].partitions]
            fenced = c.call(_offset_for_leader_epoch("le", [(e1, e1), (e2 + 1, e1)])).topics[0].partitions
            not_leader = old.call(_offset_for_leader_epoch("le", [(-1, e0)])).topics[0].partitions[0].error_code
            batches: list[tuple[int, int]] = []
            while len(batches) < 6:  # a read may stop where one object or the cache ends
                got = _batch_epochs(bytes(c.call(_fetch("le", 2 * len(batches))).responses[0].partitions[0].records))
                assert got, batches
                batches.extend(got)
            fetch_at = {
                key: c.call(_fetch("le", off, last_fetched_epoch=last, current_leader_epoch=cur))
                .responses[0]
                .partitions[0]
                for key, (off, last, cur) in {
                    "in-epoch": (6, e0, -1),
                    "past-epoch": (8, e0, e2),
                    "future": (12, e2 + 5, -1),
                    "stale": (0, -1, e1),
                    "ahead": (0, -1, e2 + 1),
                }.items()
            }
            earliest = c.call(_list_offsets("le", -2)).topics[0].partitions[0]
            latest = c.call(_list_offsets("le", -1)).topics[0].partitions[0]
            return answers, fenced, not_leader, batches, fetch_at, earliest, latest
        finally:
            c.close()
            old.close()

    answers, fenced, not_leader, batches, fetch_at, earliest, latest = await asyncio.to_thread(
        wire_checks, src.kafka_ports["PLAINTEXT"], dst.kafka_ports["PLAINTEXT"]
    )
    none = ErrorCode.none
    assert answers[:5] == [(none, e0, 6), (none, e1, 10), (none, e2, 12), (none, -1, -1), (none, -1, -1)]
    # an epoch between two known ones that never led: the largest epoch below it, where that ended
    assert answers[5] == (none, e0, 6)
    assert [p.error_code for p in fenced] == [ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch]
    assert not_leader == ErrorCode.not_leader_or_follower
    # every batch carries the epoch of the leader that appended it
    assert batches == [(0, e0), (2, e0), (4, e0), (6, e1), (8, e1), (10, e2)]
    assert fetch_at["in-epoch"].diverging_epoch.end_offset == -1  # no divergence: default answer
    assert fetch_at["in-epoch"].records  # and the records are served
    assert (fetch_at["past-epoch"].diverging_epoch.epoch, fetch_at["past-epoch"].diverging_epoch.end_offset) == (
        e0,
        6,
    )
    assert not fetch_at["past-epoch"].records
    # the rest of a diverging answer is the partition's state, as with any answer
    assert (fetch_at["past-epoch"].high_watermark, fetch_at["past-epoch"].last_stable_offset) == (12, 12)
    assert fetch_at["future"].diverging_epoch.epoch == -1
    assert fetch_at["stale"].error_code == ErrorCode.fenced_leader_epoch
    # KIP-951: a fenced fetch names the current leader and epoch
    assert (fetch_at["stale"].current_leader.leader_id, fetch_at["stale"].current_leader.leader_epoch) == (
        src.broker.node_id,
        e2,
    )
    assert fetch_at["ahead"].error_code == ErrorCode.unknown_leader_epoch
    assert (earliest.offset, earliest.leader_epoch) == (0, e0)
    assert (latest.offset, latest.leader_epoch) == (12, e2)

    # the leader stops: the other broker takes over under a newer epoch with the whole history
    await asyncio.wait_for(src.stop(timeout=5), 60)
    src._stopped_by_test = True  # type: ignore[attr-defined]
    p3 = await _led_by(dst, "le", e2)
    e3 = p3.leader_epoch

    def after_failover(port: int):
        c = RawClient(port)
        try:
            ofle = c.call(_offset_for_leader_epoch("le", [(e3, e0), (e3, e1), (e3, e2), (e3, e3)]))
            return [(p.error_code, p.leader_epoch, p.end_offset) for p in ofle.topics[0].partitions]
        finally:
            c.close()

    assert await asyncio.to_thread(after_failover, dst.kafka_ports["PLAINTEXT"]) == [
        (none, e0, 6),
        (none, e1, 10),
        (none, e2, 12),
        (none, e3, 12),
    ]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def test_clients_keep_consuming_across_a_move_without_resets(brokers):
    """No client may reset its offset (reset policies are off) or see a truncation when the
    partition moves; kafka-python validates its position with OffsetForLeaderEpoch."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTP
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KpTP

    first = brokers[1]
    topic = "follow"
    await first.broker.ensure_topic(topic, 1, {})
    src, p0 = await _leader(brokers, topic)
    bootstrap = first.bootstrap
    n = 20

    def produce(start: int) -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2, request_timeout_ms=20_000)
        for i in range(start, start + n):
            producer.send(topic, value=b"%d" % i)
        producer.flush(30)
        producer.close()

    await asyncio.to_thread(produce, 0)

    def kp_consumer() -> KafkaConsumer:  # blocking (bootstrap): not on the brokers' event loop
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            auto_offset_reset="none",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            metadata_max_age_ms=500,
        )
        consumer.assign([kp_tp])
        consumer.seek(kp_tp, 0)
        return consumer

    kp_tp = KpTP(topic, 0)
    kp = await asyncio.to_thread(kp_consumer)
    rd = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "le-rd",
            "auto.offset.reset": "error",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 500,
            "fetch.wait.max.ms": 100,
        }
    )
    rd.assign([TopicPartition(topic, 0, 0)])
    aio = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="none", enable_auto_commit=False, metadata_max_age_ms=500
    )
    await aio.start()
    aio_tp = AioTP(topic, 0)
    aio.assign([aio_tp])
    aio.seek(aio_tp, 0)

    capture = _Capture()
    fetcher_log = logging.getLogger("kafka.consumer.fetcher")
    old_level = fetcher_log.level
    fetcher_log.setLevel(logging.DEBUG)
    fetcher_log.addHandler(capture)

    def kp_read(count: int) -> list[int]:
        out: list[int] = []
        deadline = time.monotonic() + 60
        while len(out) < count and time.monotonic() < deadline:
            for records in kp.poll(timeout_ms=200).values():  # raises on truncation or a needed reset
                out.extend(r.offset for r in records)
        return out

    def rd_read(count: int) -> list[int]:
        out: list[int] = []
        deadline = time.monotonic() + 60
        while len(out) < count and time.monotonic() < deadline:
            for m in rd.consume(100, 0.2):
                err = m.error()
                if err is not None:
                    assert err.code() in (-191,), f"librdkafka reported {err}"  # only _PARTITION_EOF
                    continue
                out.append(m.offset())
        return out

    async def aio_read(count: int) -> list[int]:
        out: list[int] = []
        deadline = time.monotonic() + 60
        while len(out) < count and time.monotonic() < deadline:
            batch = await aio.getmany(aio_tp, timeout_ms=200)  # raises on a needed reset
            for records in batch.values():
                out.extend(r.offset for r in records)
        return out

    try:
        assert await asyncio.to_thread(kp_read, n) == list(range(n))
        assert await asyncio.to_thread(rd_read, n) == list(range(n))
        assert await aio_read(n) == list(range(n))
        dst = next(s for s in brokers.values() if s is not src)
        await src.cluster.reassign_partition(topic, 0, dst.broker.node_id)
        p1 = await _led_by(dst, topic, p0.leader_epoch)
        await asyncio.to_thread(produce, n)
        assert await asyncio.to_thread(kp_read, n) == list(range(n, 2 * n))
        assert await asyncio.to_thread(rd_read, n) == list(range(n, 2 * n))
        assert await aio_read(n) == list(range(n, 2 * n))
    finally:
        fetcher_log.removeHandler(capture)
        fetcher_log.setLevel(old_level)
        await asyncio.to_thread(kp.close)
        await asyncio.to_thread(rd.close)
        await aio.stop()
    # kafka-python saw the new epoch and validated its position against the new leader, which
    # confirmed it (no truncation: the epoch it had read ended where the new one began)
    validations = sum(
        (s.broker.metrics.registry.get_sample_value("kafka_requests_total", {"api": "OffsetForLeaderEpoch"}) or 0)
        for s in brokers.values()
    )
    assert validations >= 1, "no client validated its position"
    assert any("OffsetForLeaderEpoch" in m for m in capture.messages)
    assert not any("Truncation detected" in m for m in capture.messages)
    assert p1.leader_epoch > p0.leader_epoch
