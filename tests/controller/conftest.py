"""Fixtures: a real controller (HTTP server + file:// object store) in this process."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from automq.broker.config import NodeConfig
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.process import ControllerService


def controller_config(
    object_store_url: str,
    node_id: int = 0,
    session_timeout_ms: int = 60_000,
    gc_retention_ms: int = 60_000,
    **controller: object,
) -> NodeConfig:
    settings = {"lease_timeout_ms": 1_000, "renew_interval_ms": 200, "poll_interval_ms": 50, "gc_interval_ms": 60_000}
    settings.update(controller)
    return NodeConfig(
        node_id=node_id,
        object_store_url=object_store_url,
        http_host="127.0.0.1",
        http_port=0,
        session_timeout_ms=session_timeout_ms,
        storage={"object_gc_retention_ms": gc_retention_ms},
        controller=settings,
    )


@pytest.fixture
def make_config():
    """controller_config(object_store_url, node_id=0, **controller_settings) -> NodeConfig"""
    return controller_config


@pytest.fixture
async def service(file_url: str) -> AsyncIterator[ControllerService]:
    svc = ControllerService(controller_config(file_url))
    await svc.start()
    await svc.controller.wait_leader(10)
    yield svc
    await svc.stop()


@pytest.fixture
async def client(service: ControllerService) -> AsyncIterator[ControllerClient]:
    c = ControllerClient([service.url], retry_deadline_s=5)
    yield c
    await c.close()
