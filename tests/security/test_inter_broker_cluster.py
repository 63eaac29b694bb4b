"""Transactions across brokers when every listener is SASL_SSL: real processes
(`automq local up --secure --brokers 2`, an ACL authorizer on, `admin` the only super user).
The coordinator's WriteTxnMarkers reach the other broker over TLS with SCRAM-SHA-512 and are
authorized there (CLUSTER_ACTION); a confluent-kafka transactional producer writes partitions
led by both brokers; read_committed consumers see committed data and never aborted data.
The admin CLI finds the secure cluster's settings by itself."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.slow


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "automq.broker.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _leaders(admin: AdminClient, topic: str, partitions: int) -> dict[int, int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        t = admin.list_topics(topic, timeout=10).topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            leaders = {p.id: p.leader for p in t.partitions.values()}
            if all(v >= 0 for v in leaders.values()):
                return leaders
        time.sleep(0.3)
    raise AssertionError(f"{topic}: no leaders")


def _read_committed(settings: dict, topic: str, expected: int, timeout: float = 60) -> list[bytes]:
    consumer = Consumer(
        {
            **settings,
            "group.id": "g-" + uuid.uuid4().hex[:6],
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": False,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
        # a little longer: nothing beyond what was committed may show up
        end = time.monotonic() + 2
        while time.monotonic() < end:
            msg = consumer.poll(0.3)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_cross_broker_transactions_over_sasl_ssl(tmp_path):
    from automq.broker import local

    data = tmp_path / "secure2"
    port = local.free_port_block(2)
    up = _cli(
        "local",
        "up",
        "--secure",
        "--detach",
        "--brokers",
        "2",
        "--data-dir",
        str(data),
        "--port",
        str(port),
        "--set",
        "authorizer.class.name=standard",
        "--set",
        "super.users=User:admin",
        "--set",
        "group.initial.rebalance.delay.ms=0",
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        settings = dict(
            line.split("=", 1) for line in up.stdout.splitlines() if "=" in line and not line.startswith("#")
        )
        settings["bootstrap.servers"] = f"127.0.0.1:{port},127.0.0.1:{port + 1}"
        topic = "xb-" + uuid.uuid4().hex[:6]
        admin = AdminClient(settings)
        for future in admin.create_topics([NewTopic(topic, 6)]).values():
            future.result(30)
        leaders = _leaders(admin, topic, 6)
        assert set(leaders.values()) == {1, 2}, leaders  # both brokers lead some: markers must cross

        producer = Producer({**settings, "transactional.id": "xb-" + topic, "acks": "all"})
        producer.init_transactions(60)
        producer.begin_transaction()
        for p in range(6):
            producer.produce(topic, f"committed-{p}".encode(), partition=p)
        producer.commit_transaction(60)
        producer.begin_transaction()
        for p in range(6):
            producer.produce(topic, f"aborted-{p}".encode(), partition=p)
        producer.abort_transaction(60)
        producer.begin_transaction()
        for p in range(6):
            producer.produce(topic, f"second-{p}".encode(), partition=p)
        producer.commit_transaction(60)
        producer.flush(10)

        values = _read_committed(settings, topic, 12)
        assert sorted(values) == sorted(
            [f"committed-{p}".encode() for p in range(6)] + [f"second-{p}".encode() for p in range(6)]
        )

        logs = "".join(p.read_text(errors="replace") for p in (data / "logs").glob("*.log"))
        assert "WriteTxnMarkers to" not in logs  # no marker send failed (would be retried, and logged)
        assert "is Denied operation = CLUSTER_ACTION" not in logs

        # the admin CLI (the balancer's client) reaches the SASL_SSL brokers with the cluster's own settings
        listed = _cli("topics", "describe", topic, "--data-dir", str(data), "-o", "json", timeout=60)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        assert {p["leader"] for p in json.loads(listed.stdout)["partitions"]} == {1, 2}
    finally:
        down = _cli("local", "down", "--data-dir", str(data))
        assert down.returncode == 0, down.stdout + down.stderr
