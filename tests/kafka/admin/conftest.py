"""An in-process cluster for the admin tests: a real controller (HTTP, file:// object
store), one or two real brokers (storage engine with a volume WAL, Kafka server), all on one
event loop in a background thread so synchronous Kafka clients (kafka-python, confluent)
can talk to it from the test thread. Wiring mirrors what the broker process does; it is
here so the admin handlers are exercised by real clients without spawning processes."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from automq.broker.config import Listener, NodeConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class InProcessCluster:
    loop: asyncio.AbstractEventLoop
    brokers: list = field(default_factory=list)  # automq Broker objects
    ports: list[int] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def run(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


async def _start(tmp_path, brokers: int, stack: list) -> InProcessCluster:
    from automq.broker.controller.client import ControllerClient
    from automq.broker.controller.process import ControllerService
    from automq.broker.controller.protocol import Endpoint
    from automq.broker.kafka.broker import Broker
    from automq.broker.kafka.server import KafkaServer
    from automq.broker.objectstore import open_object_store
    from automq.broker.storage.engine import StorageEngine

    url = (tmp_path / "objects").as_uri()
    (tmp_path / "objects").mkdir()
    controller = ControllerService(NodeConfig(node_id=0, object_store_url=url, http_host="127.0.0.1", http_port=0, listeners=[]))
    await controller.start()
    stack.append(controller.stop)
    cluster = InProcessCluster(asyncio.get_running_loop())
    brokers_down: list = []

    async def stop_brokers() -> None:
        await asyncio.gather(*(down() for down in brokers_down), return_exceptions=True)

    stack.append(stop_brokers)
    for node_id in range(1, brokers + 1):
        port = _free_port()
        config = NodeConfig(
            node_id=node_id, object_store_url=url, controller_urls=[controller.url], data_dir=str(tmp_path / f"b{node_id}"),
            listeners=[Listener(host="127.0.0.1", port=port)], http_port=0, wal={"capacity": 16 << 20},
        )
        client = ControllerClient([controller.url])
        epoch = await client.register_broker(node_id, [Endpoint("PLAINTEXT", "127.0.0.1", port)], None)
        store = open_object_store(url)
        engine = StorageEngine(config, store, client, client, node_id, epoch)
        await engine.start()
        broker = Broker(config, node_epoch=epoch, cluster=client, storage=engine)
        server = KafkaServer(broker)
        await server.start()
        await broker.start()

        async def heartbeat(client=client, node_id=node_id, epoch=epoch) -> None:
            while True:
                await asyncio.sleep(0.5)
                try:
                    await client.heartbeat(node_id, epoch)
                except Exception:  # noqa: BLE001 - the test will notice a dead broker
                    pass

        task = asyncio.get_running_loop().create_task(heartbeat())

        async def shutdown(task=task, server=server, broker=broker, engine=engine, client=client, node_id=node_id, epoch=epoch) -> None:
            # as a broker process does: stop serving, close partitions, flush storage, deregister
            await server.stop()
            # bounded without cancelling: a close that swallows cancellation would hang wait_for
            closing = asyncio.get_running_loop().create_task(broker.close())
            await asyncio.wait({closing}, timeout=10)
            if not closing.done():
                print(f"broker {node_id}: Broker.close() did not finish within 10 s", flush=True)
            await engine.close()
            task.cancel()
            try:
                await client.unregister_broker(node_id, epoch)
            finally:
                await client.close()

        brokers_down.append(shutdown)
        cluster.brokers.append(broker)
        cluster.ports.append(port)
    return cluster


@pytest.fixture
def inprocess_cluster(tmp_path, request) -> Iterator[InProcessCluster]:
    brokers = getattr(request, "param", 2)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stack: list = []
    try:
        cluster = asyncio.run_coroutine_threadsafe(_start(tmp_path, brokers, stack), loop).result(60)
        yield cluster
    finally:
        async def teardown() -> None:
            for close in reversed(stack):
                try:
                    await close()
                except Exception:  # noqa: BLE001 - best effort teardown
                    pass

        asyncio.run_coroutine_threadsafe(teardown(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
