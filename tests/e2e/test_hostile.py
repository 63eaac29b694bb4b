"""Hostile input against the real broker process: each is answered (or the connection
closed) as a Java broker would, and the broker keeps serving other clients throughout."""

import datetime
import os
import socket
import struct

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as produce_v9
from kio.static.primitive import i32Timedelta

from automq.broker.kafka import codec

pytestmark = pytest.mark.slow


def _connect(cluster, broker: int = 1) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", cluster.port + broker - 1), timeout=10)
    s.settimeout(10)
    return s


def _send_frame(s: socket.socket, body: bytes) -> None:
    s.sendall(struct.pack(">i", len(body)) + body)


def _read_frame(s: socket.socket) -> bytes | None:
    """One response frame, or None if the broker closed the connection."""
    head = _recv_exactly(s, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return _recv_exactly(s, size)


def _recv_exactly(s: socket.socket, n: int) -> bytes | None:
    out = b""
    while len(out) < n:
        try:
            chunk = s.recv(n - len(out))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        out += chunk
    return out


def _closed_by_broker(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _still_serves(cluster, e2e, broker: int = 1) -> None:
    """Another client, on the same broker, gets a full produce/consume round trip."""
    topic = e2e.topic_name("ok")
    e2e.create_topic(cluster.broker_bootstrap(broker), topic)
    e2e.produce(cluster.broker_bootstrap(broker), topic, [b"fine"])
    assert [m.value() for m in e2e.consume(cluster.broker_bootstrap(broker), topic, 1)] == [b"fine"]


def _api_versions(s: socket.socket, correlation_id: int = 7):
    _send_frame(
        s,
        codec.encode_request(correlation_id, ApiVersionsRequest(client_software_name="t", client_software_version="1")),
    )
    frame = _read_frame(s)
    assert frame is not None, "broker closed a valid ApiVersions connection"
    return codec.decode_response(frame, ApiVersionsRequest)


def test_random_and_truncated_frames_and_idle_clients(cluster, e2e):
    idle = _connect(cluster)  # connects and sends nothing, for the whole test
    garbage = _connect(cluster)
    _send_frame(garbage, os.urandom(64))
    assert _closed_by_broker(garbage)
    truncated = _connect(cluster)
    truncated.sendall(struct.pack(">i", 100) + os.urandom(10))  # promises 100 bytes, sends 10
    half_header = _connect(cluster)
    _send_frame(half_header, b"\x00\x12")  # 2 bytes: shorter than a request header
    assert _closed_by_broker(half_header)
    _still_serves(cluster, e2e)
    for s in (idle, garbage, truncated, half_header):
        s.close()


def test_oversized_and_negative_sizes_close_the_connection(cluster, e2e):
    big = _connect(cluster)
    big.sendall(struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 16)
    assert _closed_by_broker(big)
    negative = _connect(cluster)
    negative.sendall(struct.pack(">i", -5))
    assert _closed_by_broker(negative)
    _still_serves(cluster, e2e)


def test_unknown_api_key_and_unsupported_versions(cluster, e2e):
    # unknown api key 999: Kafka closes the connection (InvalidRequestException)
    s = _connect(cluster)
    _send_frame(s, struct.pack(">hhih", 999, 0, 1, -1))
    assert _closed_by_broker(s)
    # ApiVersions at a version from the future is answered (KIP-511): UNSUPPORTED_VERSION in a v0 body
    s = _connect(cluster)
    _send_frame(s, struct.pack(">hhih", 18, 99, 42, -1) + b"\x00")
    frame = _read_frame(s)
    assert frame is not None
    correlation_id, error_code = struct.unpack_from(">ih", frame, 0)
    assert (correlation_id, error_code) == (42, ErrorCode.unsupported_version.value)
    s.close()
    # Metadata at an unsupported version: closed
    s = _connect(cluster)
    _send_frame(s, struct.pack(">hhih", 3, 99, 5, -1))
    assert _closed_by_broker(s)
    # a well-formed ApiVersions on a fresh connection still works, and advertises the admin APIs
    s = _connect(cluster)
    _, response = _api_versions(s)
    s.close()
    assert response.error_code == ErrorCode.none
    advertised = {k.api_key for k in response.api_keys}
    assert {19, 20, 21, 32, 33, 35, 37, 44, 45, 46, 60} <= advertised
    _still_serves(cluster, e2e)


def _record_batch(values: list[bytes]) -> bytearray:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, v in enumerate(values):
        builder.append(i, timestamp=None, key=None, value=v, headers=[])
    return bytearray(builder.build())


def _produce(s: socket.socket, topic: str, records: bytes, correlation_id: int):
    request = produce_v9.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(
            produce_v9.TopicProduceData(
                name=topic, partition_data=(produce_v9.PartitionProduceData(index=0, records=records),)
            ),
        ),
    )
    _send_frame(s, codec.encode_request(correlation_id, request))
    frame = _read_frame(s)
    assert frame is not None, "broker closed the connection instead of answering the produce"
    cid, response = codec.decode_response(frame, produce_v9.ProduceRequest)
    assert cid == correlation_id
    return response.responses[0].partition_responses[0]


def test_wrong_crc_and_bad_batches_are_refused_per_partition(cluster, e2e):
    topic = e2e.topic_name("crc")
    e2e.create_topic(cluster.bootstrap, topic)
    # a normal client's produce first: the leader has the partition open before we poke it
    e2e.produce(cluster.bootstrap, topic, [b"first"])
    leader = e2e.wait_for_leaders(cluster.bootstrap, topic, 1)[0]
    s = _connect(cluster, leader)
    good = _record_batch([b"a", b"b"])
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF  # payload byte covered by the CRC
    assert _produce(s, topic, bytes(corrupt), 1).error_code == ErrorCode.corrupt_message
    wrong_magic = bytearray(good)
    wrong_magic[16] = 1
    assert _produce(s, topic, bytes(wrong_magic), 2).error_code in (
        ErrorCode.corrupt_message,
        ErrorCode.invalid_record,
        ErrorCode.unsupported_for_message_format,
    )
    assert _produce(s, topic, bytes(good[:30]), 3).error_code in (ErrorCode.corrupt_message, ErrorCode.invalid_record)
    # the same connection then appends a valid batch right after the first record: nothing bad was stored
    ok = _produce(s, topic, bytes(good), 4)
    assert (ok.error_code, ok.base_offset) == (ErrorCode.none, 1)
    s.close()
    assert [m.value() for m in e2e.consume(cluster.bootstrap, topic, 3)] == [b"first", b"a", b"b"]
