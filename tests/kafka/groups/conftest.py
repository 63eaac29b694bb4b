"""An in-process cluster for coordinator tests: a real controller (HTTP) and brokers made of a
real StorageEngine (volume WAL + file:// object store) and the Kafka layer's Broker object.
Requests go straight to the registered handlers (no sockets), so the tests exercise handler,
coordinator, state machine, storage and controller together."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from automq.broker.config import NodeConfig
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.process import ControllerService
from automq.broker.kafka import codec, handlers
from automq.broker.kafka.broker import Broker, advertised_endpoints
from automq.broker.kafka.context import RequestContext
from automq.broker.objectstore import open_object_store
from automq.broker.storage.engine import StorageEngine


def node_config(data_dir: Path, store_url: str, node_id: int, controller_url: str, **kafka: Any) -> NodeConfig:
    settings = {
        "offsets_topic_num_partitions": 2,
        "group_min_session_timeout_ms": 100,
        "group_initial_rebalance_delay_ms": 0,
    }
    settings.update(kafka)
    return NodeConfig(
        node_id=node_id,
        data_dir=str(data_dir),
        object_store_url=store_url,
        controller_urls=[controller_url],
        http_host="127.0.0.1",
        http_port=0,
        listeners=[{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 9092 + node_id}],
        session_timeout_ms=60_000,
        wal={"kind": "volume", "path": "wal", "capacity": 4 << 20},
        storage={
            "log_cache_bytes": 8 << 20,
            "block_cache_bytes": 4 << 20,
            "upload_block_bytes": 1 << 20,
            "upload_interval_ms": 500,
        },
        kafka=settings,
        controller={"lease_timeout_ms": 1_000, "renew_interval_ms": 200, "poll_interval_ms": 50},
    )


class Node:
    """One broker: controller client, storage engine and Broker, with a heartbeat task."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.client = ControllerClient(config.controller_urls, retry_deadline_s=10)
        self.store = open_object_store(config.object_store_url)
        self.engine: StorageEngine | None = None
        self.broker: Broker | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        epoch = await self.client.register_broker(self.config.node_id, advertised_endpoints(self.config), None)
        self.engine = StorageEngine(self.config, self.store, self.client, self.client, self.config.node_id, epoch)
        await self.engine.start()
        self.broker = Broker(self.config, node_epoch=epoch, cluster=self.client, storage=self.engine)
        await self.broker.start()
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat(epoch))

    async def _beat(self, epoch: int) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.client.heartbeat(self.config.node_id, epoch)
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        """Graceful: close partitions (upload), storage, deregister (partitions move)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        if self.broker is not None:
            await self.broker.close()
        if self.engine is not None:
            await self.engine.close()
        if self.broker is not None:
            await self.client.unregister_broker(self.config.node_id, self.broker.node_epoch)
        await self.client.close()
        await self.store.close()
        self.broker = self.engine = None

    async def call(self, api_key: int, version: int, client_id: str = "test-client", **fields: Any) -> Any:
        """Build a request of (api_key, version) with codec.build and run its handler."""
        assert self.broker is not None
        request = codec.build(codec.request_class(api_key, version), **fields)
        ctx = RequestContext(
            api_key, version, 1, client_id, "127.0.0.1:5555", codec.response_class(api_key, version), self.broker
        )
        registration = handlers.lookup(api_key)
        assert registration is not None, f"no handler for api key {api_key}"
        return await registration.handler(request, ctx)


class Cluster:
    def __init__(self, tmp_path: Path, store_url: str) -> None:
        self.tmp_path = tmp_path
        self.store_url = store_url
        self.controller: ControllerService | None = None
        self.nodes: dict[int, Node] = {}

    async def start_controller(self) -> None:
        config = NodeConfig(
            node_id=100,
            object_store_url=self.store_url,
            http_host="127.0.0.1",
            http_port=0,
            session_timeout_ms=60_000,
            controller={"lease_timeout_ms": 1_000, "renew_interval_ms": 200, "poll_interval_ms": 50},
        )
        self.controller = ControllerService(config)
        await self.controller.start()
        await self.controller.controller.wait_leader(10)

    async def start_node(self, node_id: int, **kafka: Any) -> Node:
        assert self.controller is not None
        node = Node(
            node_config(self.tmp_path / f"node{node_id}", self.store_url, node_id, self.controller.url, **kafka)
        )
        await node.start()
        self.nodes[node_id] = node
        return node

    async def stop_node(self, node_id: int) -> None:
        await self.nodes.pop(node_id).stop()

    async def close(self) -> None:
        for node_id in list(self.nodes):
            with contextlib.suppress(Exception):
                await self.stop_node(node_id)
        if self.controller is not None:
            await self.controller.stop()


@pytest.fixture
async def cluster(tmp_path: Path, file_url: str):
    c = Cluster(tmp_path, file_url)
    await c.start_controller()
    yield c
    await c.close()


# ---------------------------------------------------------------- a real broker with sockets


def broker_config(
    tmp_path: Path,
    objects: str,
    controller_url: str,
    node_id: int = 1,
    advertised_port: int | None = None,
    **kafka: Any,
) -> NodeConfig:
    from automq.broker.config import parse_config

    settings = {
        "offsets_topic_num_partitions": 4,
        "group_min_session_timeout_ms": 1_000,
        "group_initial_rebalance_delay_ms": 0,
    }
    settings.update(kafka)
    listener: dict[str, Any] = {"name": "PLAINTEXT", "host": "127.0.0.1", "port": 0}
    if advertised_port is not None:
        listener.update(advertised_host="127.0.0.1", advertised_port=advertised_port)
    return parse_config(
        {
            "node_id": node_id,
            "data_dir": str(tmp_path / f"b{node_id}"),
            "object_store_url": objects,
            "controller_urls": [controller_url],
            "listeners": [listener],
            "http_host": "127.0.0.1",
            "http_port": 0,
            "heartbeat_interval_ms": 200,
            "wal": {"capacity": "16MiB"},
            "storage": {"log_cache_bytes": "32MiB", "block_cache_bytes": "16MiB"},
            "kafka": settings,
        }
    )


class RealCluster:
    """A controller and brokers (BrokerService: the real process object with its Kafka
    server) in this event loop; blocking clients must run in worker threads."""

    def __init__(self, tmp_path: Path, objects: str) -> None:
        self.tmp_path = tmp_path
        self.objects = objects
        self.controller: ControllerService | None = None
        self.brokers: dict[int, Any] = {}

    async def start(self) -> None:
        from automq.broker.config import parse_config

        cfg = parse_config(
            {
                "node_id": 0,
                "data_dir": str(self.tmp_path / "c"),
                "object_store_url": self.objects,
                "http_host": "127.0.0.1",
                "http_port": 0,
            }
        )
        self.controller = ControllerService(cfg)
        await self.controller.start()

    async def start_broker(self, node_id: int = 1, **kwargs: Any) -> Any:
        from automq.broker.kafka.process import BrokerService

        assert self.controller is not None
        service = BrokerService(broker_config(self.tmp_path, self.objects, self.controller.url, node_id, **kwargs))
        await asyncio.wait_for(service.start(), 60)
        self.brokers[node_id] = service
        return service

    async def stop_broker(self, node_id: int) -> None:
        await self.brokers.pop(node_id).stop(timeout=5)

    async def close(self) -> None:
        for node_id in list(self.brokers):
            with contextlib.suppress(Exception):
                await self.stop_broker(node_id)
        if self.controller is not None:
            await self.controller.stop()


@pytest.fixture
async def real_cluster(tmp_path: Path, file_url: str):
    c = RealCluster(tmp_path, file_url)
    await c.start()
    yield c
    await c.close()
