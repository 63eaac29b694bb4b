"""Every process stops on SIGTERM within its grace period, whatever it waits for (issue 17
item 8); what a broker held in its WAL is safe there.

Real processes: `automq controller` and `automq broker` from config files, confluent-kafka
producing acks=all. The grace periods are local mode's (broker 30 s, controller 10 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from automq.broker import local
from automq.broker.config import Listener, NodeConfig, dump_config

pytestmark = pytest.mark.slow


class Node:
    def __init__(self, role: str, config: NodeConfig, root: Path) -> None:
        self.role, self.config = role, config
        self.path = root / f"{role}-{config.node_id}.yaml"
        self.log = root / f"{role}-{config.node_id}.log"
        self.path.write_text(dump_config(config))
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen | None = None

    def start(self) -> Node:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "automq.broker.cli", self.role, "--config", str(self.path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if local.http_ready(self.config.http_port):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{self.role} not ready:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def sigterm_and_wait(self, grace: float) -> tuple[int | None, float]:
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(grace)
        except subprocess.TimeoutExpired:
            code = None
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def nodes(tmp_path):
    http_c, http_b = local.free_port(), local.free_port()
    kafka = local.free_port_block(1)
    common = dict(
        cluster_id="sigterm",
        object_store_url=f"file://{tmp_path}/objects",
        controller_urls=[f"http://127.0.0.1:{http_c}"],
        http_host="127.0.0.1",
    )
    c = Node(
        "controller",
        NodeConfig(node_id=0, data_dir=str(tmp_path / "c"), listeners=[], http_port=http_c, **common),
        tmp_path,
    )
    b = Node(
        "broker",
        NodeConfig(
            node_id=1,
            data_dir=str(tmp_path / "b"),
            http_port=http_b,
            listeners=[Listener(host="127.0.0.1", port=kafka)],
            kafka={"group_initial_rebalance_delay_ms": 0},
            **common,
        ),
        tmp_path,
    )
    yield c, b, f"127.0.0.1:{kafka}"
    for n in (b, c):
        n.kill()


def produce(bootstrap: str, topic: str, n: int) -> list[bytes]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    acked: list[bytes] = []
    for i in range(n):
        p.produce(topic, value=b"s-%06d" % i, on_delivery=lambda err, msg: err is None and acked.append(msg.value()))
        p.poll(0)
    assert p.flush(60) == 0
    return acked


def read_all(bootstrap: str, topic: str, expected: int, timeout: float = 60.0) -> list[bytes]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append(msg.value())
    finally:
        consumer.close()
    return out


def test_broker_with_unuploaded_data_stops_on_sigterm_while_its_controller_is_down(nodes):
    controller, broker, bootstrap = nodes
    controller.start().wait_ready()
    broker.start().wait_ready()
    topic = f"st-{uuid.uuid4().hex[:8]}"
    acked = produce(bootstrap, topic, 500)  # auto-created; uploads wait for 60 s: all in the WAL
    controller.process.send_signal(signal.SIGKILL)
    controller.process.wait()
    code, took = broker.sigterm_and_wait(local.BROKER_STOP_GRACE_S)
    assert code == 0, f"broker still running {took:.0f}s after SIGTERM (exit {code}):\n{broker.tail()}"
    print(f"\nbroker stopped {took:.1f}s after SIGTERM with its controller down")
    # what it acknowledged is in its WAL: the next start replays it
    controller.start().wait_ready()
    broker.start().wait_ready()
    got = read_all(bootstrap, topic, len(acked))
    assert got == acked, f"{len(set(acked) - set(got))} acknowledged records missing after the restart"
    code, took = broker.sigterm_and_wait(local.BROKER_STOP_GRACE_S)
    assert code == 0, broker.tail()
    print(f"broker stopped {took:.1f}s after SIGTERM with its controller up")
    code, took = controller.sigterm_and_wait(local.CONTROLLER_STOP_GRACE_S)
    assert code == 0, controller.tail()
