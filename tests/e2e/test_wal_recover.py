"""`automq wal recover` on the WAL file of a real broker process that was kill -9'd.

Real processes started directly (no supervisor, so the killed broker stays dead, as on a lost
node): a controller and two brokers on the embedded object store. A confluent-kafka producer
(acks=all, idempotent, values carrying a sequence number) writes while broker 2, leader of
some partitions, is killed with SIGKILL; the operator's first step (fence at the controller)
is done through the controller API; then the recovery command runs as its own process on the
dead broker's WAL file. Every acknowledged record must then be read back exactly once, and a
rerun of the command must do nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from automq.broker import local

pytestmark = pytest.mark.slow


def _wait(what: str, check, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}", pytrace=False)


@pytest.fixture
def processes(tmp_path):
    port = local.free_port_block(2)
    nodes = {n.name: n for n in local.prepare(2, tmp_path, port, None)}
    try:
        local.spawn(nodes["controller"])
        _wait("controller ready", lambda: local.is_ready(nodes["controller"]))
        for name in ("broker-1", "broker-2"):
            local.spawn(nodes[name])
        _wait("brokers ready", lambda: all(local.is_ready(nodes[b]) for b in ("broker-1", "broker-2")))
        yield nodes
    finally:
        for node in nodes.values():
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
                node.process.wait(10)


def _recover(nodes, tmp_path) -> subprocess.CompletedProcess[str]:
    controller = f"http://127.0.0.1:{nodes['controller'].http_port}"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "automq.broker.cli",
            "wal",
            "recover",
            "--wal",
            str(tmp_path / "broker-2" / "wal"),
            "--controller",
            controller,
            "--node-id",
            "2",
            "--object-store",
            (tmp_path / "objects").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_recover_a_killed_brokers_wal_file_every_ack_once(processes, tmp_path, e2e):
    import asyncio

    from confluent_kafka import Producer

    from automq.broker.controller.client import ControllerClient

    nodes = processes
    bootstrap = f"127.0.0.1:{nodes['broker-1'].kafka_port}"
    topic = e2e.topic_name("lost")
    e2e.create_topic(bootstrap, topic, partitions=4)
    leaders = e2e.wait_for_leaders(bootstrap, topic, 4)
    assert 2 in leaders.values(), leaders  # placement spreads partitions over both brokers

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": 180_000,
            "retry.backoff.ms": 100,
        }
    )
    acked: list[bytes] = []
    on_broker_2 = [0]  # acknowledged by broker 2 (its partitions' leader): in its WAL only
    errors: list[str] = []
    lock = threading.Lock()

    def on_delivery(err, msg) -> None:
        with lock:
            if err is not None:
                errors.append(str(err))
                return
            acked.append(msg.value())
            if leaders[msg.partition()] == 2:
                on_broker_2[0] += 1

    stop = threading.Event()

    def produce() -> None:
        seq = 0
        while not stop.is_set():
            try:
                producer.produce(topic, value=b"seq-%08d" % seq, key=b"%d" % seq, on_delivery=on_delivery)
                seq += 1
            except BufferError:
                producer.poll(0.01)
            producer.poll(0)
            if seq % 100 == 0:
                time.sleep(0.005)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        # broker 1's partitions can reach 2000 acks before broker 2 has acknowledged anything
        _wait("2000 acknowledged records, 200 by broker 2", lambda: len(acked) >= 2000 and on_broker_2[0] >= 200, 60)
        # The node is lost: the broker dies with acknowledged writes only in its WAL.
        os.kill(nodes["broker-2"].process.pid, signal.SIGKILL)
        nodes["broker-2"].process.wait(10)

        async def fence() -> None:
            client = ControllerClient([f"http://127.0.0.1:{nodes['controller'].http_port}"])
            try:
                await client.fence_broker(2)
            finally:
                await client.close()

        asyncio.run(fence())
        first = _recover(nodes, tmp_path)
        assert first.returncode == 0, first.stderr[-3000:]
        assert "completed under recovery epoch" in first.stdout, first.stdout
        records = int(first.stdout.split(": ")[2].split(" records")[0])
        assert records > 0, first.stdout  # the WAL held data not in the object store yet
        again = _recover(nodes, tmp_path)
        assert again.returncode == 0 and "nothing to do" in again.stdout, (again.stdout, again.stderr[-2000:])
        # Partitions are served by the live broker now; keep producing a little.
        target = len(acked) + 1000
        _wait("producing again after recovery", lambda: len(acked) >= target, timeout=120)
    finally:
        stop.set()
        thread.join(30)
        with contextlib.suppress(Exception):
            producer.flush(120)
    assert not errors, errors[:5]
    with lock:
        expected = list(acked)
    got = [m.value() for m in e2e.consume(bootstrap, topic, len(expected), timeout=120)]
    assert len(got) == len(set(got)), "a record was read twice"
    missing = set(expected) - set(got)
    assert not missing, f"{len(missing)} acknowledged records missing, e.g. {sorted(missing)[:3]}"


def test_recover_refuses_a_broker_that_is_not_fenced(processes, tmp_path):
    result = _recover(processes, tmp_path)
    assert result.returncode == 1
    assert "broker 2 is active, not fenced" in result.stderr


def test_a_frozen_broker_resumed_after_recovery_cannot_write(processes, tmp_path, e2e):
    """A zombie: broker 2 is frozen (SIGSTOP, as on a partitioned node), fenced, its WAL
    recovered elsewhere; then it resumes while a client still sends it produce requests.
    Whatever is acknowledged must be readable exactly once from the live broker, and the
    zombie must stop (it is fenced: no heartbeat, no commit is accepted)."""
    import asyncio

    from confluent_kafka import Producer

    from automq.broker.controller.client import ControllerClient

    nodes = processes
    bootstrap = f"127.0.0.1:{nodes['broker-1'].kafka_port}"
    topic = e2e.topic_name("zombie")
    e2e.create_topic(bootstrap, topic, partitions=4)
    leaders = e2e.wait_for_leaders(bootstrap, topic, 4)
    zombie_parts = [p for p, leader in leaders.items() if leader == 2]
    assert zombie_parts, leaders
    zombie = nodes["broker-2"].process
    os.kill(zombie.pid, signal.SIGSTOP)
    try:

        async def fence() -> None:
            client = ControllerClient([f"http://127.0.0.1:{nodes['controller'].http_port}"])
            try:
                await client.fence_broker(2)
            finally:
                await client.close()

        asyncio.run(fence())
        assert _recover(nodes, tmp_path).returncode == 0
        # A client that only knows the zombie's address (stale metadata) produces to it.
        producer = Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{nodes['broker-2'].kafka_port},{bootstrap}",
                "acks": "all",
                "enable.idempotence": True,
                "message.timeout.ms": 60_000,
            }
        )
        acked: list[bytes] = []
        for i in range(50):
            producer.produce(
                topic,
                value=b"after-%d" % i,
                partition=zombie_parts[i % len(zombie_parts)],
                on_delivery=lambda err, msg: err is None and acked.append(msg.value()),
            )
        producer.poll(0)
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    assert producer.flush(90) == 0
    _wait("the zombie to stop", lambda: zombie.poll() is not None, timeout=60)
    assert zombie.returncode != 0
    assert "was fenced" in nodes["broker-2"].log_path.read_text(errors="replace")
    got = [m.value() for m in e2e.consume(bootstrap, topic, len(acked), timeout=60)]
    assert sorted(got) == sorted(acked) and len(acked) == 50
