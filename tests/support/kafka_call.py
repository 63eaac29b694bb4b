"""One Kafka request over a fresh blocking socket to a real broker, answered and decoded with
the broker's own codec (kio): for tests that need a request no client library sends."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
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


def described_by_coordinator(cluster: Any, group: str, describe: Callable[[str], Any]) -> tuple[int, Any]:
    """(coordinator node id, the group as its coordinator describes it): FindCoordinator on
    each broker until one answers, then `describe(group)` (a ConsumerGroupDescribe or
    ShareGroupDescribe request) sent to the coordinator; retried for up to 60 s while brokers
    restart or the group loads."""
    from kio.schema.errors import ErrorCode
    from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

    deadline = time.monotonic() + 60
    while True:
        try:
            for b in range(1, cluster.brokers + 1):
                found = call(cluster.broker_bootstrap(b), FindCoordinatorRequest(key_type=0, coordinator_keys=(group,)))
                c = found.coordinators[0]
                if c.error_code != ErrorCode.none:
                    continue
                g = call(f"127.0.0.1:{c.port}", describe(group)).groups[0]
                if g.error_code == ErrorCode.none:
                    return int(c.node_id), g
        except OSError:
            pass
        assert time.monotonic() < deadline, f"no broker describes group {group}"
        time.sleep(0.3)
