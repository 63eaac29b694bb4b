"""An in-process cluster for the admin tests: a real controller (HTTP, file:// object
store), one or two real brokers (storage engine with a volume WAL, Kafka server), all on one
event loop in a background thread so synchronous Kafka clients (kafka-python, confluent)
can talk to it from the test thread: the broker process's own `BrokerService`, embedded, so
the admin handlers are exercised by real clients without spawning processes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from automq.broker.config import Listener, NodeConfig


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


async def _start(tmp_path, brokers: int, stack: list, kafka: dict | None = None) -> InProcessCluster:
    from automq.broker.controller.process import ControllerService
    from automq.broker.kafka.process import BrokerService

    url = (tmp_path / "objects").as_uri()
    (tmp_path / "objects").mkdir()
    controller = ControllerService(
        NodeConfig(node_id=0, object_store_url=url, http_host="127.0.0.1", http_port=0, listeners=[])
    )
    await controller.start()
    stack.append(controller.stop)
    cluster = InProcessCluster(asyncio.get_running_loop())
    services = []

    async def stop_brokers() -> None:
        # bounded without cancelling: a stop that swallows cancellation would hang wait_for
        stopping = [asyncio.get_running_loop().create_task(s.stop()) for s in services]
        if stopping:
            _, pending = await asyncio.wait(stopping, timeout=15)
            if pending:
                print(f"{len(pending)} BrokerService.stop() did not finish within 15 s", flush=True)

    stack.append(stop_brokers)
    for node_id in range(1, brokers + 1):
        config = NodeConfig(
            node_id=node_id,
            object_store_url=url,
            controller_urls=[controller.url],
            data_dir=str(tmp_path / f"b{node_id}"),
            listeners=[Listener(host="127.0.0.1", port=0)],
            http_host="127.0.0.1",
            http_port=0,
            heartbeat_interval_ms=500,
            wal={"capacity": 16 << 20},
            kafka={
                "group_initial_rebalance_delay_ms": 0,
                **(kafka or {}),
            },  # tests set Kafka's 3 s delay where they test it
        )
        service = BrokerService(config)
        services.append(service)
        await service.start()
        cluster.brokers.append(service.broker)
        cluster.ports.append(service.kafka_ports["PLAINTEXT"])
    return cluster


@pytest.fixture
def inprocess_cluster(tmp_path, request) -> Iterator[InProcessCluster]:
    # param: a broker count, or {"brokers": n, "kafka": {...broker kafka config...}}
    param = getattr(request, "param", 2)
    brokers, kafka = (param["brokers"], param.get("kafka")) if isinstance(param, dict) else (param, None)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stack: list = []
    try:
        cluster = asyncio.run_coroutine_threadsafe(_start(tmp_path, brokers, stack, kafka), loop).result(60)
        yield cluster
    finally:

        async def teardown() -> None:
            for close in reversed(stack):
                try:
                    await close()
                except Exception:
                    pass

        asyncio.run_coroutine_threadsafe(teardown(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
