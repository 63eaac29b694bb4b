"""End-to-end fixtures: a real local cluster (`automq local up` in a subprocess: one
controller and two broker processes) shared by the tests that do not break it, and helpers
to start more (destructive tests get their own, SeaweedFS-backed ones too).

Every process is started by the fixture and stopped by it; data dirs are pytest tmp dirs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from automq.broker import local

START_TIMEOUT_S = 180.0


@dataclass
class LocalCluster:
    data_dir: Path
    brokers: int
    port: int
    object_store_url: str | None = None
    # Kafka's 3 s first-join delay would only slow the tests down; tests of it set their own
    # (transaction timeouts are checked every second instead of every 10 s for the same reason)
    sets: list[str] = field(
        default_factory=lambda: [
            "group.initial.rebalance.delay.ms=0",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000",
        ]
    )
    process: subprocess.Popen[str] | None = None
    bootstrap: str = ""
    output: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> LocalCluster:
        cmd = [
            sys.executable,
            "-m",
            "automq.broker.cli",
            "local",
            "up",
            "--brokers",
            str(self.brokers),
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
        ]
        if self.object_store_url:
            cmd += ["--object-store", self.object_store_url]
        for item in self.sets:
            cmd += ["--set", item]
        self.output = []
        self.bootstrap = ""
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        ready = threading.Event()

        def read() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line.rstrip("\n"))
                if line.startswith("bootstrap: "):
                    self.bootstrap = line.split(" ", 1)[1].strip()
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        ready.wait(START_TIMEOUT_S)
        if not self.bootstrap:
            code = self.process.poll()
            self.kill()
            pytest.fail(
                f"local cluster did not start (exit {code}):\n" + "\n".join(self.output[-40:]) + self.logs_tail(),
                pytrace=False,
            )
        return self

    def stop(self, timeout: float = 60.0, sig: int = signal.SIGTERM) -> int:
        """SIGTERM (or Ctrl-C's SIGINT) to `automq local up`: it stops brokers, then the
        controller. Returns its exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """Last resort: kill the launcher and every child it started."""
        for pid in self.pids().values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    # ---------------------------------------------------------------- nodes

    def pids(self) -> dict[str, int]:
        out = {}
        for p in (self.data_dir / "run").glob("*.pid"):
            with contextlib.suppress(ValueError, OSError):
                out[p.stem] = int(p.read_text().strip())
        return out

    def broker_bootstrap(self, broker: int) -> str:
        return f"127.0.0.1:{self.port + broker - 1}"

    def http_port(self, node: str) -> int:
        return yaml.safe_load((self.data_dir / "config" / f"{node}.yaml").read_text())["http_port"]

    def is_ready(self, node: str) -> bool:
        return local.http_ready(self.http_port(node))

    def kill9(self, node: str) -> int:
        """SIGKILL one node process; the launcher restarts brokers. Returns the killed pid."""
        pid = self.pids()[node]
        os.kill(pid, signal.SIGKILL)
        return pid

    def wait_restarted(self, node: str, old_pid: int, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.pids().get(node)
            if pid is not None and pid != old_pid and self.is_ready(node):
                return
            time.sleep(0.2)
        pytest.fail(f"{node} was not restarted and ready within {timeout:.0f}s" + self.logs_tail(node), pytrace=False)

    def grep_logs(self, needle: str, lines: int = 40) -> str:
        """The last `lines` log lines (all nodes) mentioning `needle`: diagnostics for failures."""
        hits = []
        for log in sorted((self.data_dir / "logs").glob("*.log")):
            hits += [f"{log.stem}: {line}" for line in log.read_text(errors="replace").splitlines() if needle in line]
        return "\n".join(hits[-lines:])

    def logs_tail(self, node: str | None = None, lines: int = 30) -> str:
        out = []
        for log in sorted((self.data_dir / "logs").glob("*.log")):
            if node is None or log.stem == node:
                text = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"\n--- {log.name}\n" + "\n".join(text))
        return "".join(out)


@contextlib.contextmanager
def running_cluster(
    data_dir: Path, brokers: int = 2, object_store_url: str | None = None, sets: Iterable[str] = ()
) -> Iterator[LocalCluster]:
    """A started LocalCluster, stopped on exit; `sets` are --set items added to the defaults."""
    cluster = LocalCluster(data_dir, brokers, local.free_port_block(brokers), object_store_url)
    cluster.sets += sets
    cluster.start()
    try:
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            cluster.kill()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One shared 2-broker cluster on the embedded (file://) object store. Tests using it
    must leave it running (no kills, no restarts) and use their own topics."""
    with running_cluster(tmp_path_factory.mktemp("session-cluster")) as c:
        yield c


def topic_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=configs or {})], operation_timeout=30
    )
    futures[name].result(60)
    wait_for_leaders(bootstrap, name, partitions)


def wait_for_leaders(bootstrap: str, name: str, partitions: int, timeout: float = 60.0) -> dict[int, int]:
    """{partition: leader} once every partition of the topic has a leader in metadata."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=10)
        t = md.topics.get(name)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            leaders = {p.id: p.leader for p in t.partitions.values()}
            if all(
                leader >= 0 and p.error is None
                for p, leader in zip(t.partitions.values(), leaders.values(), strict=False)
            ):
                return leaders
        last = t
        time.sleep(0.2)
    raise AssertionError(f"topic {name} has no leaders for all {partitions} partitions: {last}")


def produce_confluent(bootstrap: str, topic: str, values: list[bytes], **config) -> list[tuple[int, int]]:
    """Produce with acks=all; returns (partition, offset) of each acknowledged record."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **config})
    acked: list[tuple[int, int]] = []
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            acked.append((msg.partition(), msg.offset()))

    for i, v in enumerate(values):
        while True:
            try:
                producer.produce(topic, value=v, key=str(i).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(60)
    assert remaining == 0, f"{remaining} records not delivered"
    assert not errors, errors[:5]
    return acked


def consume_confluent(bootstrap: str, topic: str, expected: int, timeout: float = 60.0, **config) -> list:
    """Read from the beginning (no group commits) until `expected` records or timeout."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **config,
        }
    )
    consumer.subscribe([topic])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                continue  # transient (e.g. partition EOF, leader moved)
            out.append(msg)
    finally:
        consumer.close()
    return out


class Helpers:
    """What tests import from here (test modules cannot import conftest in importlib mode)."""

    topic_name = staticmethod(topic_name)
    create_topic = staticmethod(create_topic)
    wait_for_leaders = staticmethod(wait_for_leaders)
    produce = staticmethod(produce_confluent)
    consume = staticmethod(consume_confluent)
    running_cluster = staticmethod(running_cluster)
    free_port_block = staticmethod(local.free_port_block)
    LocalCluster = LocalCluster


@pytest.fixture(scope="session")
def e2e() -> type[Helpers]:
    return Helpers
