"""The broker as a process: `automq broker --config FILE`, probes, metrics, SIGTERM, fencing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from automq.broker.config import parse_config


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def controller(tmp_path):
    from automq.broker.controller.process import ControllerService

    cfg = parse_config(
        {
            "node_id": 0,
            "data_dir": str(tmp_path / "c"),
            "object_store_url": f"file://{tmp_path}/objects",
            "http_host": "127.0.0.1",
            "http_port": 0,
            "session_timeout_ms": 1500,
        }
    )
    service = ControllerService(cfg)
    await service.start()
    yield service
    await service.stop()


def _start_broker(
    tmp_path, controller_url: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, int, int]:
    kafka_port, http_port = _free_port(), _free_port()
    config = {
        "node_id": 1,
        "data_dir": str(tmp_path / "b1"),
        "object_store_url": f"file://{tmp_path}/objects",
        "controller_urls": [controller_url],
        "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": kafka_port}],
        "http_host": "127.0.0.1",
        "http_port": http_port,
        "heartbeat_interval_ms": 200,
        "wal": {"capacity": "16MiB"},
        "storage": {"log_cache_bytes": "16MiB", "block_cache_bytes": "8MiB"},
    }
    path = tmp_path / "broker.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(tmp_path / "broker.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "automq.broker.cli", "broker", "--config", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    return proc, kafka_port, http_port


async def _wait_ready(proc: subprocess.Popen, http_port: int) -> None:
    for _ in range(300):
        status, _ = await asyncio.to_thread(_get, f"http://127.0.0.1:{http_port}/readyz")
        if status == 200:
            return
        assert proc.poll() is None, "broker exited before it was ready"
        await asyncio.sleep(0.1)
    raise AssertionError("broker never became ready")


async def _wait_exit(proc: subprocess.Popen, timeout: float = 30) -> int:
    for _ in range(int(timeout * 10)):
        if proc.poll() is not None:
            return proc.returncode
        await asyncio.sleep(0.1)
    proc.kill()
    raise AssertionError("broker did not exit")


async def test_probes_metrics_and_graceful_sigterm(tmp_path, controller):
    proc, kafka_port, http_port = _start_broker(tmp_path, controller.url)
    try:
        await _wait_ready(proc, http_port)
        assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{http_port}/healthz"))[0] == 200

        def produce():
            from kafka import KafkaProducer

            p = KafkaProducer(bootstrap_servers=f"127.0.0.1:{kafka_port}", acks="all")
            p.send("probe-topic", b"hello").get(timeout=30)
            p.close()

        await asyncio.to_thread(produce)
        status, text = await asyncio.to_thread(_get, f"http://127.0.0.1:{http_port}/metrics")
        assert status == 200
        assert 'kafka_topic_messages_in_total{topic="probe-topic"} 1.0' in text
        assert 'kafka_requests_total{api="Produce"}' in text
        assert "kafka_request_latency_seconds_bucket" in text
        assert "kafka_partitions_led" in text
        # per-partition series (Kafka's BrokerTopicMetrics names), process CPU, socket bytes
        assert 'kafka_server_brokertopicmetrics_messagesin_total{partition="0",topic="probe-topic"} 1.0' in text
        assert 'kafka_server_brokertopicmetrics_bytesin_total{partition="0",topic="probe-topic"}' in text
        assert "process_cpu_seconds_total" in text
        assert "kafka_server_socket_server_metrics_incoming_byte_total" in text

        def metrics_url_config():
            from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

            admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{kafka_port}")
            try:
                return admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "1")], config_filter="all")
            finally:
                admin.close()

        configs = await asyncio.to_thread(metrics_url_config)
        assert "automq.metrics.url" in repr(configs), configs
        assert f"http://127.0.0.1:{http_port}/metrics" in repr(configs), configs
        # and registered with the controller, so the operator finds it in the broker registry
        from automq.broker.balancer.model import ClusterMetadata
        from automq.broker.controller.client import ControllerClient

        async with ControllerClient([controller.url]) as client:
            registered = ClusterMetadata.from_image(await client.watch_metadata(-1, 0))
        assert registered.brokers[1].metrics_url == f"http://127.0.0.1:{http_port}/metrics"
        proc.send_signal(signal.SIGTERM)
        assert await _wait_exit(proc) == 0
        # unregistered: the controller no longer lists it as an active broker
        from automq.broker.controller.client import ControllerClient

        async with ControllerClient([controller.url]) as client:
            image = await client.watch_metadata(-1, 0)
        assert not [b for b in image.brokers if b.node_id == 1 and b.state == "active"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def _wait_fenced(controller_url: str, node_id: int, timeout: float = 60) -> None:
    """Until the controller has fenced the node (its session timed out): resuming it any
    earlier would test a broker that merely paused, not one that was fenced."""
    from automq.broker.controller.client import ControllerClient

    deadline = time.monotonic() + timeout
    async with ControllerClient([controller_url]) as client:
        while time.monotonic() < deadline:
            image = await client.watch_metadata(-1, 0)
            if any(b.node_id == node_id and b.state == "fenced" for b in image.brokers):
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"the controller did not fence node {node_id} within {timeout:.0f}s")


async def test_fenced_broker_exits_non_zero(tmp_path, controller):
    proc, _, http_port = _start_broker(tmp_path, controller.url)
    try:
        await _wait_ready(proc, http_port)
        os.kill(proc.pid, signal.SIGSTOP)  # no heartbeats for longer than the session timeout
        await _wait_fenced(controller.url, node_id=1)
        os.kill(proc.pid, signal.SIGCONT)
        code = await _wait_exit(proc)
        assert code != 0
        assert b"fenced" in (tmp_path / "broker.log").read_bytes()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# Loaded by the broker process (PYTHONPATH): while the trigger file exists, every fdatasync of
# the node fails as a dying disk's would.
_FAILING_SYNCS = """
import errno, os
from automq.broker import diskio
_real = diskio.datasync
def datasync(fd):
    if os.path.exists({trigger!r}):
        raise OSError(errno.EIO, "Input/output error (injected)")
    _real(fd)
diskio.datasync = datasync
"""


async def test_a_broker_whose_wal_fails_answers_with_an_error_and_exits(tmp_path, controller):
    """A write error stops the WAL for good (nothing after it can be acknowledged): the Produce
    gets an error, not a wait until its timeout, and the broker exits non-zero so its
    supervisor restarts it, as Kafka halts when its last log directory fails. The restart
    replays what was acknowledged."""
    from confluent_kafka import Consumer, KafkaException, Producer

    hook, trigger = tmp_path / "hook", tmp_path / "fail-syncs"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_FAILING_SYNCS.format(trigger=str(trigger)))
    paths = [str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]
    proc, kafka_port, http_port = _start_broker(tmp_path, controller.url, env={"PYTHONPATH": os.pathsep.join(paths)})
    bootstrap = f"127.0.0.1:{kafka_port}"
    try:
        await _wait_ready(proc, http_port)

        def produce(value: bytes, extra: dict | None = None) -> str | None:
            p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 20000, **(extra or {})})
            outcome: list = []
            p.produce("wal-fails", value, on_delivery=lambda err, msg: outcome.append(err))
            p.flush(30)
            return None if outcome[0] is None else str(outcome[0])

        assert await asyncio.to_thread(produce, b"before") is None
        trigger.touch()
        error = await asyncio.to_thread(produce, b"after", {"retries": 0})
        assert error is not None and "KAFKA_STORAGE_ERROR" in error, error  # the broker's answer, not a timeout
        assert await _wait_exit(proc, timeout=30) == 3
        text = (tmp_path / "broker.log").read_text()
        assert "WAL failed" in text and "Input/output error (injected)" in text

        trigger.unlink()
        proc, kafka_port, http_port = _start_broker(tmp_path, controller.url)
        bootstrap = f"127.0.0.1:{kafka_port}"
        await _wait_ready(proc, http_port)

        def consume() -> list[bytes]:
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "auto.offset.reset": "earliest"})
            c.subscribe(["wal-fails"])
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not got:
                for m in c.consume(10, 0.5):
                    if m.error():
                        raise KafkaException(m.error())
                    got.append(m.value())
            c.close()
            return got

        values = await asyncio.to_thread(consume)
        # "after" may be there too: its bytes were written before the failed sync, and a
        # failed Produce never promises absence (an idempotent producer's retry dedupes it)
        assert values[:1] == [b"before"] and values.count(b"before") == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
