"""`automq local up --secure`: a TLS + SCRAM cluster of real processes whose printed client
settings work with librdkafka; the controller API refuses calls without its token; a plaintext
client gets nothing."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

pytestmark = pytest.mark.slow


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "automq.broker.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_local_up_secure(tmp_path):
    from automq.broker import local

    data = tmp_path / "secure-local"
    port = local.free_port_block(1)
    up = _cli("local", "up", "--secure", "--detach", "--data-dir", str(data), "--port", str(port))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        settings = dict(
            line.split("=", 1) for line in up.stdout.splitlines() if "=" in line and not line.startswith("#")
        )
        assert settings["security.protocol"] == "SASL_SSL" and settings["sasl.mechanism"] == "SCRAM-SHA-512"
        assert settings["bootstrap.servers"] == f"127.0.0.1:{port}"
        assert (data / "secure" / "node.key").stat().st_mode & 0o077 == 0  # private keys are not world-readable
        topic = "secure-" + uuid.uuid4().hex[:6]
        producer = Producer({**settings, "acks": "all"})
        producer.produce(topic, b"over TLS and SCRAM")
        assert producer.flush(30) == 0
        consumer = Consumer({**settings, "group.id": "g", "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        msg = None
        for _ in range(60):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                break
        consumer.close()
        assert msg is not None and msg.value() == b"over TLS and SCRAM"
        # a plaintext client on the same port learns nothing: its request fails (a short bound,
        # spent in full since no answer comes) and the client reports the connection failing
        errors: list[KafkaError] = []
        plain = AdminClient({"bootstrap.servers": settings["bootstrap.servers"], "error_cb": errors.append})
        with pytest.raises(KafkaException):
            plain.list_topics(timeout=1)
        deadline = time.monotonic() + 30
        while not errors and time.monotonic() < deadline:
            plain.poll(0.1)
        assert errors and errors[0].code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN), errors
        # the endpoints printed for the controller (metrics, health, schema registry) say https
        log = data / "logs" / "local-up.log"
        for _ in range(50):
            if "schema registry" in log.read_text():
                break
            time.sleep(0.2)
        text = log.read_text()
        assert (
            "controller: metrics https://127.0.0.1:" in text and "registry (Confluent-compatible): https://" in text
        ), text
        # `automq status` finds the local cluster's token and CA by itself
        status = _cli("status", "--data-dir", str(data), "--output", "json", timeout=60)
        assert '"state": "active"' in status.stdout, status.stdout + status.stderr
    finally:
        down = _cli("local", "down", "--data-dir", str(data))
        assert down.returncode == 0, down.stdout + down.stderr
