"""A fenced broker whose volume WAL is full exits at once (issue 17 item 3).

Real processes: a controller (metadata on a file:// store) and a broker whose data goes to
the session's SeaweedFS, frozen with SIGSTOP so no upload can free the WAL. confluent-kafka
fills the 512 KiB WAL until appends wait for space; then the operator's `fence_broker`
fences the broker. It used to wait 30 s for a trim that could never come."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from automq.broker import local
from automq.broker.config import Listener, NodeConfig, dump_config

pytestmark = [pytest.mark.slow, pytest.mark.s3]


def spawn(role: str, config: NodeConfig, root: Path) -> subprocess.Popen:
    path = root / f"{role}.yaml"
    path.write_text(dump_config(config))
    Path(config.data_dir).mkdir(parents=True, exist_ok=True)
    with open(root / f"{role}.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "automq.broker.cli", role, "--config", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def wait_ready(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if local.http_ready(port):
            return
        time.sleep(0.1)
    raise AssertionError(log.read_text(errors="replace")[-3000:])


def test_fenced_broker_with_a_full_wal_exits_at_once(seaweedfs, s3_url, tmp_path):
    from confluent_kafka import Producer

    http_c, http_b, kafka = local.free_port(), local.free_port(), local.free_port_block(1)
    controller = spawn(
        "controller",
        NodeConfig(
            node_id=0,
            data_dir=str(tmp_path / "c"),
            listeners=[],
            object_store_url=f"file://{tmp_path}/meta",
            controller_urls=[f"http://127.0.0.1:{http_c}"],
            http_host="127.0.0.1",
            http_port=http_c,
        ),
        tmp_path,
    )
    broker = spawn(
        "broker",
        NodeConfig(
            node_id=1,
            data_dir=str(tmp_path / "b"),
            object_store_url=s3_url,
            controller_urls=[f"http://127.0.0.1:{http_c}"],
            http_host="127.0.0.1",
            http_port=http_b,
            listeners=[Listener(host="127.0.0.1", port=kafka)],
            heartbeat_interval_ms=300,
            wal={"capacity": 512 << 10},
            kafka={"message_max_bytes": 64 << 10},
        ),
        tmp_path,
    )
    producer = None
    try:
        wait_ready(http_c, controller, tmp_path / "controller.log")
        wait_ready(http_b, broker, tmp_path / "broker.log")
        producer = Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{kafka}",
                "acks": "all",
                "linger.ms": 5,
                "batch.size": 32 << 10,
                "message.timeout.ms": 120_000,
            }
        )
        producer.produce("full", value=b"warm-up")
        assert producer.flush(30) == 0
        seaweedfs.freeze()
        stop = threading.Event()

        def produce() -> None:
            while not stop.is_set():
                try:
                    producer.produce("full", value=os.urandom(4 << 10))
                except BufferError:
                    time.sleep(0.01)
                producer.poll(0.001)

        filler = threading.Thread(target=produce, daemon=True)
        filler.start()
        log = tmp_path / "broker.log"
        deadline = time.monotonic() + 60
        full = False
        while time.monotonic() < deadline and not full:  # the WAL asks for an upload when it is full
            time.sleep(0.5)
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{http_b}/metrics", timeout=5).read().decode()
            full = any(
                line.startswith("automq_storage_wal_full_total ") and float(line.split()[1]) > 0
                for line in metrics.splitlines()
            )
        assert full, "the WAL never filled up"
        req = urllib.request.Request(
            f"http://127.0.0.1:{http_c}/v1/fence_broker",
            data=json.dumps({"node_id": 1}).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=10).read()
        fenced_at = time.monotonic()
        try:
            code = broker.wait(local.BROKER_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - fenced_at
        stop.set()
        assert code is not None, f"fenced broker still running {took:.0f}s later:\n{log.read_text()[-3000:]}"
        print(f"\nfenced broker with a full WAL exited {took:.1f}s after the fence (exit {code})")
        assert code == 3, log.read_text()[-3000:]  # fenced: non-zero, its supervisor restarts it
    finally:
        seaweedfs.thaw()
        for p in (broker, controller):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
