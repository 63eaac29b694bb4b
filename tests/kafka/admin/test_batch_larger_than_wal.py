"""A batch the volume WAL can never hold is refused for good (MESSAGE_TOO_LARGE), never with the
retriable KAFKA_STORAGE_ERROR that makes a client retry it until its delivery timeout; and a
broker refuses to start on a WAL too small for a batch of `kafka.message_max_bytes`.

The only way such a batch passes the broker-wide limit is a topic whose `max.message.bytes`
is raised above half the WAL, which Kafka allows per topic, so that is what is produced here."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9.request import (
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)

from automq.broker.config import ConfigError, check_broker_config, parse_config
from automq.broker.kafka import codec
from automq.broker.kafka.process import BrokerService
from automq.broker.storage.wal.volume import RECORD_HEADER_SIZE


def _batch(value_size: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    builder.append(0, timestamp=1_700_000_000_000, key=None, value=b"x" * value_size, headers=[])
    return bytes(builder.build())


def _produce(port: int, topic: str, batch: bytes, correlation_id: int):
    import datetime

    request = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=20),
        topic_data=(TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=batch),)),),
    )
    frame = codec.encode_request(correlation_id, request)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _recv(s, 4))[0]
        _, response = codec.decode_response(_recv(s, size), ProduceRequest)
    return response.responses[0].partition_responses[0]


def _recv(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "broker closed the connection"
        out += chunk
    return bytes(out)


@pytest.mark.parametrize("inprocess_cluster", [1], indirect=True)
def test_batch_larger_than_half_the_wal_is_message_too_large(inprocess_cluster):
    admin = AdminClient({"bootstrap.servers": inprocess_cluster.bootstrap})
    # the WAL is 16 MiB: a batch may take at most half of it
    admin.create_topics([NewTopic("big", 1, 1, config={"max.message.bytes": str(12 << 20)})])["big"].result(30)
    port = inprocess_cluster.ports[0]
    deadline_tries = 100
    for attempt in range(deadline_tries):  # until the new partition is led
        answer = _produce(port, "big", _batch(10), attempt)
        if answer.error_code == ErrorCode.none:
            break
        import time

        time.sleep(0.1)
    assert answer.error_code == ErrorCode.none

    answer = _produce(port, "big", _batch(9 << 20), 1000)
    assert answer.error_code == ErrorCode.message_too_large
    assert "wal.capacity" in (answer.error_message or "")

    # the partition keeps serving: the refusal reserved nothing and closed nothing
    answer = _produce(port, "big", _batch(1 << 20), 1001)
    assert answer.error_code == ErrorCode.none
    assert answer.base_offset == 1


def _config(capacity, message_max_bytes=None, kind="volume"):
    raw = {"node_id": 1, "wal": {"kind": kind, "capacity": capacity}}
    if message_max_bytes is not None:
        raw["kafka"] = {"message_max_bytes": message_max_bytes}
    return parse_config(raw)


def test_start_up_refuses_a_wal_smaller_than_two_max_batches(tmp_path):
    small = _config("1MiB")  # the default message_max_bytes is 1 MiB + 12
    with pytest.raises(ConfigError) as err:
        check_broker_config(small)
    assert "wal.capacity" in str(err.value) and "kafka.message_max_bytes" in str(err.value)
    with pytest.raises(ConfigError):
        BrokerService(small)

    # exactly enough: two batches of message_max_bytes with their WAL record headers
    check_broker_config(_config(2 * (1_048_588 + RECORD_HEADER_SIZE)))
    with pytest.raises(ConfigError):
        check_broker_config(_config(2 * (1_048_588 + RECORD_HEADER_SIZE) - 1))
    check_broker_config(_config("1MiB", message_max_bytes="256KiB"))
    check_broker_config(_config("1MiB", kind="s3"))  # the S3 WAL has no ring to overflow

    config_file = tmp_path / "broker.yaml"
    config_file.write_text("node_id: 1\nwal: {capacity: 1MiB}\n")
    done = subprocess.run(
        [sys.executable, "-m", "automq.broker.cli", "broker", "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "wal.capacity" in done.stderr and "kafka.message_max_bytes" in done.stderr
