"""Idempotent dedupe survives a partition move however much was written after the batch
(issue 17 item 4): producer state travels with the stream as snapshots in the object store.

Real in-process controller and two brokers on a file:// object store, raw Produce requests
(kio) so the very same batch bytes can be retried at the new leader, as a client does whose
answer was lost in the move.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from automq.broker.config import parse_config
from automq.broker.controller.process import ControllerService
from automq.broker.kafka import codec

PRODUCER_ID = 4242


def make_batch(count: int, *, producer_id: int = -1, epoch: int = -1, base_sequence: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for i in range(count):
        builder.append(i, timestamp=None, key=None, value=b"v%d" % i, headers=[])
    return bytes(builder.build())


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def produce(port: int, topic: str, records: bytes):
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    request = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=records),)),),
    )
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        frame = codec.encode_request(1, request)
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read_exactly(sock, 4))[0]
        return codec.decode_response(_read_exactly(sock, size), ProduceRequest)[1].responses[0].partition_responses[0]


@pytest.fixture
async def two_brokers(tmp_path: Path, file_url: str):
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
    services = {}
    for node_id in (1, 2):
        config = parse_config(
            {
                "node_id": node_id,
                "data_dir": str(tmp_path / f"b{node_id}"),
                "object_store_url": file_url,
                "controller_urls": [controller.url],
                "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 0}],
                "http_host": "127.0.0.1",
                "http_port": 0,
                "heartbeat_interval_ms": 200,
                "wal": {"capacity": "16MiB"},
                "storage": {"log_cache_bytes": "32MiB", "block_cache_bytes": "16MiB"},
            }
        )
        services[node_id] = BrokerService(config)
        await asyncio.wait_for(services[node_id].start(), 60)
    yield services
    for service in services.values():
        await asyncio.wait_for(service.stop(timeout=5), 60)
    await controller.stop()


async def _led_by(service, topic: str, timeout: float = 30.0):
    for _ in range(int(timeout / 0.05)):
        for p in service.broker.partitions.led():
            if p.topic == topic and p.partition == 0:
                return p
        await asyncio.sleep(0.05)
    raise AssertionError(f"{topic}-0 was not opened by node {service.config.node_id}")


async def _move(services, topic: str):
    """Move partition 0 of `topic` to the other broker; returns (new service, new partition)."""
    info = services[1].broker.partitions.topic(topic).partitions[0]
    new = 2 if info.leader == 1 else 1
    await services[new].broker.cluster.reassign_partition(topic, 0, new)
    return services[new], await _led_by(services[new], topic)


@pytest.mark.parametrize("after", [200, 12_000])
async def test_retried_batch_is_deduplicated_after_a_move_whatever_followed_it(two_brokers, after: int) -> None:
    services = two_brokers
    topic = f"snap-{after}"
    await services[1].broker.ensure_topic(topic, 1)
    leader_id = services[1].broker.partitions.topic(topic).partitions[0].leader
    leader = services[leader_id]
    await _led_by(leader, topic)
    port = leader.kafka_ports["PLAINTEXT"]

    batch = make_batch(5, producer_id=PRODUCER_ID, epoch=0, base_sequence=0)
    first = await asyncio.to_thread(produce, port, topic, batch)
    assert first.error_code == ErrorCode.none and first.base_offset == 0
    # other producers' data after it (plain batches of 1,000 records)
    for _ in range(after // 1_000 or 1):
        answer = await asyncio.to_thread(produce, port, topic, make_batch(min(after, 1_000)))
        assert answer.error_code == ErrorCode.none
    new, partition = await _move(services, topic)
    end = partition.log_end_offset
    assert end == 5 + after

    retry = await asyncio.to_thread(produce, new.kafka_ports["PLAINTEXT"], topic, batch)
    assert retry.error_code == ErrorCode.none
    assert retry.base_offset == 0, "the retry was appended again instead of answered with its original offset"
    assert partition.log_end_offset == end
    # and the producer goes on where it was: its next sequence is in order, a gap is not
    following = make_batch(3, producer_id=PRODUCER_ID, epoch=0, base_sequence=5)
    ok = await asyncio.to_thread(produce, new.kafka_ports["PLAINTEXT"], topic, following)
    assert ok.error_code == ErrorCode.none and ok.base_offset == end
    gap = make_batch(3, producer_id=PRODUCER_ID, epoch=0, base_sequence=100)
    refused = await asyncio.to_thread(produce, new.kafka_ports["PLAINTEXT"], topic, gap)
    assert refused.error_code == ErrorCode.out_of_order_sequence_number
