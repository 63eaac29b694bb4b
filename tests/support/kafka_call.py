"""One Kafka request over a fresh blocking socket to a real broker, answered and decoded with
the broker's own codec (kio): for tests that need a request no client library sends."""

from __future__ import annotations

import socket
import struct
from typing import Any

from automq.broker.kafka import codec


def call(bootstrap: str, request: Any) -> Any:
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        frame = codec.encode_request(1, request)
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        _, response = codec.decode_response(s.recv(size, socket.MSG_WAITALL), type(request))
    return response
