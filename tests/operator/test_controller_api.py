"""controller_api against a real controller (HTTP server, file:// object store) in this process."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest

from automq.broker.config import NodeConfig
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.process import ControllerService
from automq.broker.controller.protocol import Endpoint
from automq.operator.controller_api import ControllerApiError, ControllerClientApi, connect


@pytest.fixture
async def controller(file_url: str) -> AsyncIterator[ControllerService]:
    config = NodeConfig(
        node_id=1000,
        object_store_url=file_url,
        http_host="127.0.0.1",
        http_port=0,
        session_timeout_ms=60_000,
        controller={"lease_timeout_ms": 1_000, "renew_interval_ms": 200, "poll_interval_ms": 50},
    )
    service = ControllerService(config)
    await service.start()
    await service.controller.wait_leader(10)
    yield service
    await service.stop()


async def _close_moving(client: ControllerClient, node_id: int, node_epoch: int) -> int:
    """Play the old leader's part of a graceful move: close what is moving off `node_id`."""
    image = await client.watch_metadata(-1, 0)
    closed = 0
    for topic in image.topics:
        for p in topic.partitions:
            if p.state == "moving" and p.leader == node_id:
                await client.partition_closed(topic.name, p.partition, node_id, node_epoch, p.leader_epoch)
                closed += 1
    return closed


async def test_drain_and_undrain_a_broker(controller: ControllerService) -> None:
    client = ControllerClient([controller.url], retry_deadline_s=5)
    api = connect([controller.url])
    try:
        epoch1 = await client.register_broker(1, [Endpoint("PLAINTEXT", "b1", 9092)], None)
        await client.register_broker(2, [Endpoint("PLAINTEXT", "b2", 9092)], None)
        await client.create_topic("orders", 4, {})
        assert not await api.broker_drained(1)

        await api.drain_broker(1)
        assert not await api.broker_drained(1)  # moving, but broker 1 still leads until it closes
        assert await _close_moving(client, 1, epoch1) == 2
        assert await api.broker_drained(1)
        image = await client.watch_metadata(-1, 0)
        assert {b.node_id: b.state for b in image.brokers}[1] == "draining"

        await api.undrain_broker(1)
        image = await client.watch_metadata(-1, 0)
        assert {b.node_id: b.state for b in image.brokers}[1] == "active"
    finally:
        await api.close()
        await client.close()


async def test_unknown_broker_is_a_controller_api_error(controller: ControllerService) -> None:
    api = ControllerClientApi([controller.url], retry_deadline_s=1)
    try:
        with pytest.raises(ControllerApiError, match="drain of broker 42"):
            await api.drain_broker(42)
    finally:
        await api.close()


async def test_unreachable_controller_is_a_controller_api_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    api = ControllerClientApi([f"http://127.0.0.1:{port}"], request_timeout_s=0.5, retry_deadline_s=0.5)
    try:
        with pytest.raises(ControllerApiError, match="cannot read cluster metadata"):
            await api.broker_drained(0)
        with pytest.raises(ControllerApiError, match="undrain of broker 0"):
            await api.undrain_broker(0)
    finally:
        await api.close()
