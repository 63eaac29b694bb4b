"""A reassignment must finish or roll back whichever party dies in the middle (issue 17 item 1).

Real processes: one controller and two brokers started from config files as `automq
controller` / `automq broker` (what Kubernetes and local mode run), an embedded file://
object store, confluent-kafka producing acks=all idempotent, kafka-python's admin client
starting the move through the Kafka API. Each test kills one party with SIGKILL at the
worst moment, then reads every acknowledged record back and checks that the partition is
served again and is no longer "moving". The tests print how long the partition was
unservable (a busy machine: the numbers are diagnostics, never asserted).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from automq.broker import local
from automq.broker.config import Listener, NodeConfig, dump_config

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 4_000
SERVE_TIMEOUT_S = 90.0


@dataclass
class Proc:
    name: str
    config: NodeConfig
    path: Path
    log: Path
    role: str
    process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "automq.broker.cli", self.role, "--config", str(self.path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def kill9(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def terminate(self, timeout: float = 20.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()

    def ready(self) -> bool:
        return local.http_ready(self.config.http_port)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            if self.process is not None and self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{self.name} not ready: " + self.tail())

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Cluster:
    root: Path
    wal_kind: str = "volume"
    procs: dict[str, Proc] = field(default_factory=dict)

    def __post_init__(self) -> None:
        base = local.free_port_block(2)
        taken = {base, base + 1}
        http = []
        for _ in range(3):
            p = local.free_port(avoid=taken)
            taken.add(p)
            http.append(p)
        url = f"file://{self.root}/objects"
        controller_url = f"http://127.0.0.1:{http[0]}"
        common = dict(
            cluster_id="faults",
            object_store_url=url,
            controller_urls=[controller_url],
            http_host="127.0.0.1",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=500,
        )
        configs = {
            "controller": NodeConfig(
                node_id=0, data_dir=str(self.root / "c"), listeners=[], **common, http_port=http[0]
            )
        }
        for i in (1, 2):
            configs[f"broker-{i}"] = NodeConfig(
                node_id=i,
                data_dir=str(self.root / f"b{i}"),
                listeners=[Listener(host="127.0.0.1", port=base + i - 1)],
                http_port=http[i],
                wal={"kind": self.wal_kind, "capacity": 64 << 20},
                kafka={"group_initial_rebalance_delay_ms": 0},
                **common,
            )
        for name, cfg in configs.items():
            Path(cfg.data_dir).mkdir(parents=True, exist_ok=True)
            path = self.root / f"{name}.yaml"
            path.write_text(dump_config(cfg))
            role = "controller" if name == "controller" else "broker"
            self.procs[name] = Proc(name, cfg, path, self.root / f"{name}.log", role)
        self.controller_url = controller_url

    def start(self) -> Cluster:
        for p in self.procs.values():
            p.start()
        for p in self.procs.values():
            p.wait_ready()
        return self

    def stop(self) -> None:
        for name in ("broker-1", "broker-2", "controller"):
            self.procs[name].terminate()

    def bootstrap(self, node_id: int) -> str:
        return f"127.0.0.1:{self.procs[f'broker-{node_id}'].config.listeners[0].port}"

    def call(self, method: str, body: dict) -> dict:
        req = urllib.request.Request(
            f"{self.controller_url}/v1/{method}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def image(self) -> dict:
        return self.call("watch_metadata", {"since_version": -1, "timeout_ms": 0})

    def partition(self, topic: str, partition: int = 0) -> dict:
        for t in self.image()["topics"]:
            if t["name"] == topic:
                return t["partitions"][partition]
        raise AssertionError(f"no topic {topic}")

    def logs(self) -> str:
        return "".join(f"\n--- {p.name}\n{p.tail()}" for p in self.procs.values())


@pytest.fixture
def make_cluster(tmp_path):
    made: list[Cluster] = []

    def make(**kw) -> Cluster:
        c = Cluster(tmp_path / f"c{len(made)}", **kw)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        with contextlib.suppress(Exception):
            c.stop()
        for p in c.procs.values():
            p.kill9()


def create_topic(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"mv-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=30)[name].result(60)
    return name


def produce(bootstrap: str, topic: str, n: int) -> list[bytes]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    acked: list[bytes] = []
    errors: list[str] = []

    def on_delivery(err, msg):
        (errors.append(str(err)) if err is not None else acked.append(msg.value()))

    for i in range(n):
        producer.produce(topic, value=b"v-%06d" % i, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    return acked


def read_all(bootstrap: str, topic: str, expected: int, timeout: float) -> list[bytes]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1000,
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


def reassign(cluster: Cluster, topic: str, target: int) -> None:
    """Through the controller API the Kafka AlterPartitionReassignments handler calls (a
    Kafka admin client would send it to the metadata's controller node, which may be the
    broker this test just killed)."""
    cluster.call("reassign_partition", {"topic": topic, "partition": 0, "target_node_id": target})


def leader_of(cluster: Cluster, topic: str) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        p = cluster.partition(topic)
        if p["leader"] >= 0 and p["state"] == "online":
            return p["leader"]
        time.sleep(0.1)
    raise AssertionError(f"{topic} has no leader: {cluster.partition(topic)}")


def check_served(cluster: Cluster, topic: str, acked: list[bytes], started: float, what: str) -> dict:
    """Every acknowledged record reads back, in order, once; the move is over."""
    live = [int(n.split("-")[1]) for n, p in cluster.procs.items() if n != "controller" and p.process.poll() is None]
    got = read_all(",".join(cluster.bootstrap(i) for i in live), topic, len(acked), SERVE_TIMEOUT_S)
    served_after = time.monotonic() - started
    missing = len(set(acked) - set(got))
    assert missing == 0, (
        f"{what}: {missing} of {len(acked)} acknowledged records unreadable; partition {cluster.partition(topic)}"
        + cluster.logs()
    )
    assert got == acked, f"{what}: records duplicated or reordered"
    p = cluster.partition(topic)
    assert p["state"] == "online" and p["leader"] in live, p
    print(f"\n{what}: all {len(acked)} acknowledged records served again {served_after:.1f}s after the fault")
    return p


def test_old_leader_killed_then_reassigned_then_restarted(make_cluster):
    """The issue's reproduction: kill -9 the leader, move its partition before the
    controller fences it, restart the broker: the move completes and nothing is lost."""
    c = make_cluster()
    topic = create_topic(c.bootstrap(1))
    leader = leader_of(c, topic)
    other = 3 - leader
    acked = produce(c.bootstrap(leader), topic, 400)
    c.procs[f"broker-{leader}"].kill9()
    started = time.monotonic()
    reassign(c, topic, other)
    assert c.partition(topic)["state"] == "moving"
    c.procs[f"broker-{leader}"].start()
    c.procs[f"broker-{leader}"].wait_ready()
    p = check_served(c, topic, acked, started, "old leader killed, moved, restarted")
    assert p["leader"] == other, f"the move did not finish: {p}"


def wait_broker_state(cluster: Cluster, node_id: int, state: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(b["node_id"] == node_id and b["state"] == state for b in cluster.image()["brokers"]):
            return
        time.sleep(0.2)
    raise AssertionError(f"broker {node_id} never became {state}: {cluster.image()['brokers']}" + cluster.logs())


def test_old_leader_killed_fenced_then_restarted_resumes_the_move(make_cluster):
    """The old leader stays dead past its session: the partition waits offline for its
    volume WAL (nobody else can read it) but keeps the move's target; once the broker is
    back and has replayed its WAL, the move completes to the target."""
    c = make_cluster()
    topic = create_topic(c.bootstrap(1))
    leader = leader_of(c, topic)
    other = 3 - leader
    acked = produce(c.bootstrap(leader), topic, 300)
    c.procs[f"broker-{leader}"].kill9()
    started = time.monotonic()
    reassign(c, topic, other)
    wait_broker_state(c, leader, "fenced")
    assert c.partition(topic)["state"] == "offline"
    c.procs[f"broker-{leader}"].start()
    p = check_served(c, topic, acked, started, "old leader killed, moved, fenced, restarted")
    assert p["leader"] == other, f"the move did not resume: {p}"


def test_old_leader_with_s3_wal_dies_for_good(make_cluster):
    """S3 WAL: a live broker recovers the dead leader's WAL and the move completes to its
    target without the dead broker ever coming back."""
    c = make_cluster(wal_kind="s3")
    topic = create_topic(c.bootstrap(1))
    leader = leader_of(c, topic)
    other = 3 - leader
    acked = produce(c.bootstrap(leader), topic, 300)
    c.procs[f"broker-{leader}"].kill9()
    started = time.monotonic()
    reassign(c, topic, other)
    p = check_served(c, topic, acked, started, "old leader (S3 WAL) killed for good during a move")
    assert p["leader"] == other, p


def test_new_leader_dead_before_the_handover(make_cluster):
    """The target dies (not yet fenced) and the old leader hands the partition to it: once
    the controller fences the target, the partition is placed on the live broker again."""
    c = make_cluster()
    topic = create_topic(c.bootstrap(1))
    leader = leader_of(c, topic)
    other = 3 - leader
    acked = produce(c.bootstrap(leader), topic, 300)
    c.procs[f"broker-{other}"].kill9()
    started = time.monotonic()
    reassign(c, topic, other)
    p = check_served(c, topic, acked, started, "target killed before the handover")
    assert p["leader"] == leader, p


def test_controller_killed_during_the_handover(make_cluster):
    """The controller dies while the old leader hands over (its close and partition_closed
    calls fail for a while) and comes back: the move completes, nothing is lost."""
    c = make_cluster()
    topic = create_topic(c.bootstrap(1))
    leader = leader_of(c, topic)
    other = 3 - leader
    acked = produce(c.bootstrap(leader), topic, 300)
    reassign(c, topic, other)
    c.procs["controller"].kill9()
    started = time.monotonic()
    time.sleep(SESSION_TIMEOUT_MS / 1000 * 2)  # longer than the old leader kept retrying before
    c.procs["controller"].start()
    c.procs["controller"].wait_ready()
    p = check_served(c, topic, acked, started, "controller killed during the handover")
    assert p["leader"] == other, p
