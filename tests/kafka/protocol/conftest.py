"""One real broker for the protocol tests: a controller (HTTP, file:// object store) and a
broker (storage engine on a volume WAL, Kafka server) embedded on an event loop in a background
thread, shared by the module, so hostile clients in the test thread reach real handlers."""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@dataclass
class FuzzBroker:
    loop: asyncio.AbstractEventLoop
    service: object  # BrokerService
    port: int

    def assert_serving(self) -> None:
        """The broker answers a fresh connection's ApiVersions with error code 0."""
        from kio.schema.api_versions.v0.request import ApiVersionsRequest
        from kio.schema.errors import ErrorCode

        from automq.broker.kafka import codec

        frame = codec.encode_request(99, ApiVersionsRequest())
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(struct.pack(">i", len(frame)) + frame)
            data = b""
            while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
                chunk = s.recv(1 << 16)
                assert chunk, "broker closed a plain ApiVersions request"
                data += chunk
        correlation_id, response = codec.decode_response(data[4:], ApiVersionsRequest)
        assert correlation_id == 99 and response.error_code == ErrorCode.none


async def _start(tmp: Path, stack: list) -> FuzzBroker:
    from automq.broker.config import Listener, NodeConfig
    from automq.broker.controller.process import ControllerService
    from automq.broker.kafka.process import BrokerService

    objects = tmp / "objects"
    objects.mkdir()
    controller = ControllerService(
        NodeConfig(node_id=0, object_store_url=objects.as_uri(), http_host="127.0.0.1", http_port=0, listeners=[])
    )
    await controller.start()
    stack.append(controller.stop)
    service = BrokerService(
        NodeConfig(
            node_id=1,
            object_store_url=objects.as_uri(),
            controller_urls=[controller.url],
            data_dir=str(tmp / "broker"),
            listeners=[Listener(host="127.0.0.1", port=0)],
            http_host="127.0.0.1",
            http_port=0,
            heartbeat_interval_ms=500,
            wal={"capacity": 16 << 20},
        )
    )
    stack.append(service.stop)
    await service.start()
    return FuzzBroker(asyncio.get_running_loop(), service, service.kafka_ports["PLAINTEXT"])


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory) -> Iterator[FuzzBroker]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stack: list = []
    try:
        yield asyncio.run_coroutine_threadsafe(_start(tmp_path_factory.mktemp("fuzz"), stack), loop).result(60)
    finally:

        async def teardown() -> None:
            for close in reversed(stack):
                try:
                    await asyncio.wait_for(close(), 20)
                except Exception:
                    pass

        asyncio.run_coroutine_threadsafe(teardown(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
