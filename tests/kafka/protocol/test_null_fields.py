"""Null where Kafka forbids it: every non-nullable string, bytes and array field of every API and
version the broker serves, at every depth, sent as null (-1). A Java broker fails to parse such
a request and closes the connection (InvalidRequestException); so does ours, before any handler
sees it: no traceback, no answer without an error code, the broker stays up."""

from __future__ import annotations

import logging
import socket
import struct

import pytest
from request_builder import encode_with_null, minimal, null_paths

from automq.broker.kafka import codec
from automq.broker.kafka.handlers import registry

SERVED = registry.served_ranges()
VERSIONS = [(key, v) for key, (low, high) in sorted(SERVED.items()) for v in range(low, high + 1)]
CASES = [(key, v, path) for key, v in VERSIONS for path in null_paths(codec.request_class(key, v))]


def test_every_served_api_has_null_cases():
    # the generator reaches nested fields, and covers most served versions
    assert len(CASES) > 400
    assert any(len(path) >= 3 for _, _, path in CASES)
    assert len({(k, v) for k, v, _ in CASES}) > 0.8 * len(VERSIONS)


@pytest.mark.parametrize(("api_key", "version"), VERSIONS, ids=[f"{codec.api_name(k)}-v{v}" for k, v in VERSIONS])
def test_null_in_non_nullable_field_is_a_decode_error(api_key, version):
    request = minimal(codec.request_class(api_key, version))
    valid = encode_with_null(1, request, ())
    assert codec.decode_request(valid, SERVED).request == request  # the builder writes what kio reads
    for path in null_paths(type(request)):
        frame = encode_with_null(1, request, path)
        for variant in (frame, bytearray(frame)):  # bytearray: large frames, in-place Produce decoding
            with pytest.raises(codec.RequestDecodeError, match="null"):
                codec.decode_request(variant, SERVED)


def _exchange(port: int, frame: bytes) -> bytes | None:
    """The response frame, or None when the broker closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                return data or None
            data += chunk
            if len(data) >= 4 and len(data) >= 4 + struct.unpack(">i", data[:4])[0]:
                return data


def test_broker_closes_on_every_null_case_without_a_traceback(fuzz_broker, caplog):
    caplog.set_level(logging.WARNING, logger="automq")
    answered = []
    for key, version, path in CASES:
        request = minimal(codec.request_class(key, version))
        if _exchange(fuzz_broker.port, encode_with_null(7, request, path)) is not None:
            answered.append((codec.api_name(key), version, path))
    assert answered == []
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert tracebacks == []
    fuzz_broker.assert_serving()
