"""A stalled object store must not fence healthy brokers (issue 17 item 2), and the
controller says the store is stalled (/readyz, /metrics).

Real processes: a controller and a broker (`automq controller` / `automq broker`) on the
session's SeaweedFS, which this test freezes with SIGSTOP for longer than two session
timeouts, then thaws. The controller's metadata-log writes hang for that long."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from automq.broker import local
from automq.broker.config import Listener, NodeConfig, dump_config

pytestmark = [pytest.mark.slow, pytest.mark.s3]

SESSION_TIMEOUT_MS = 4_000


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def start(role: str, config: NodeConfig, root: Path) -> subprocess.Popen:
    path = root / f"{role}-{config.node_id}.yaml"
    path.write_text(dump_config(config))
    Path(config.data_dir).mkdir(parents=True, exist_ok=True)
    with open(root / f"{role}-{config.node_id}.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "automq.broker.cli", role, "--config", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def wait_ready(port: int, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if local.http_ready(port):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"not ready:\n{log.read_text(errors='replace')[-3000:]}")


def test_frozen_object_store_fences_no_healthy_broker(seaweedfs, s3_url, tmp_path):
    http_c, http_b = local.free_port(), local.free_port()
    kafka = local.free_port_block(1)
    common = dict(
        cluster_id="stall",
        object_store_url=s3_url,
        controller_urls=[f"http://127.0.0.1:{http_c}"],
        http_host="127.0.0.1",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=500,
    )
    controller = start(
        "controller",
        NodeConfig(node_id=0, data_dir=str(tmp_path / "c"), listeners=[], http_port=http_c, **common),
        tmp_path,
    )
    broker = start(
        "broker",
        NodeConfig(
            node_id=1,
            data_dir=str(tmp_path / "b"),
            http_port=http_b,
            listeners=[Listener(host="127.0.0.1", port=kafka)],
            **common,
        ),
        tmp_path,
    )
    try:
        wait_ready(http_c, controller, tmp_path / "controller-0.log")
        wait_ready(http_b, broker, tmp_path / "broker-1.log")
        seaweedfs.freeze()
        try:
            # the idle leader writes a log entry every 500 ms: it is stuck from now on
            stalled_seen = None
            deadline = time.monotonic() + SESSION_TIMEOUT_MS / 1000 * 3
            while time.monotonic() < deadline:
                status, text = get(http_c, "/readyz")
                if status == 503 and "stalled" in text:
                    stalled_seen = text
                    _, metrics = get(http_c, "/metrics")
                    assert metric(metrics, "automq_controller_object_store_stalled") == 1
                time.sleep(0.5)
                assert broker.poll() is None, "the broker exited while the store was frozen"
        finally:
            seaweedfs.thaw()
        # long enough for a fence queued behind the stuck write to go through
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not local.http_ready(http_c):
            time.sleep(0.2)
        time.sleep(SESSION_TIMEOUT_MS / 1000)
        _, metrics = get(http_c, "/metrics")
        assert metric(metrics, "automq_controller_brokers_fenced_total") == 0, (
            tmp_path / "controller-0.log"
        ).read_text()[-3000:]
        assert broker.poll() is None, (tmp_path / "broker-1.log").read_text()[-3000:]
        assert stalled_seen, "the controller never reported the stalled object store on /readyz"
        status, text = get(http_c, "/readyz")
        assert status == 200, text
        _, metrics = get(http_c, "/metrics")
        assert metric(metrics, "automq_controller_object_store_stalled") == 0
        # a controller whose store hangs still stops on SIGTERM within local mode's grace
        seaweedfs.freeze()
        try:
            time.sleep(1.0)  # its next log write hangs
            started = time.monotonic()
            controller.send_signal(signal.SIGTERM)
            try:
                code = controller.wait(local.CONTROLLER_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                code = None
            took = time.monotonic() - started
        finally:
            seaweedfs.thaw()
        assert code == 0, f"controller still running {took:.0f}s after SIGTERM with its store frozen"
        print(f"\ncontroller stopped {took:.1f}s after SIGTERM with its object store frozen")
    finally:
        for p in (broker, controller):
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
