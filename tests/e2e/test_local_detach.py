"""`automq local up --detach` / `automq local down`, and a restart remembering --brokers."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from automq.broker import local


def _automq(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "automq.broker.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_detach_then_down_and_a_restart_remembers_the_options(tmp_path, e2e):
    data_dir = tmp_path / "bg"
    port = local.free_port_block(2)
    up = _automq("local", "up", "--detach", "--data-dir", str(data_dir), "--brokers", "2", "--port", str(port))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"bootstrap: 127.0.0.1:{port},127.0.0.1:{port + 1}" in up.stdout
        assert "local down" in up.stderr
        launcher = local.running_launcher(data_dir)
        assert launcher is not None and launcher > 0
        recorded = yaml.safe_load((data_dir / "cluster.yaml").read_text())
        assert recorded["brokers"] == 2 and recorded["port"] == port
        log = (data_dir / "logs" / "local-up.log").read_text()
        assert "/metrics" in log and "/healthz" in log  # the URLs are printed
        # a second start on the same data dir is refused while the first runs
        again = _automq("local", "up", "--detach", "--data-dir", str(data_dir))
        assert again.returncode == 2 and "already runs" in again.stderr
        topic = e2e.topic_name("bg")
        e2e.create_topic(f"127.0.0.1:{port}", topic, partitions=2)
        e2e.wait_for_leaders(f"127.0.0.1:{port}", topic, 2)
        e2e.produce(f"127.0.0.1:{port}", topic, [b"before restart"] * 10)
    finally:
        down = _automq("local", "down", "--data-dir", str(data_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert local.running_launcher(data_dir) is None
    assert _automq("local", "down", "--data-dir", str(data_dir)).returncode == 1  # nothing runs now

    # no --brokers/--port: the recorded ones, and the data is still there
    up = _automq("local", "up", "--detach", "--data-dir", str(data_dir))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"bootstrap: 127.0.0.1:{port},127.0.0.1:{port + 1}" in up.stdout
        assert len(e2e.consume(f"127.0.0.1:{port}", topic, 10)) == 10
    finally:
        assert _automq("local", "down", "--data-dir", str(data_dir)).returncode == 0


def test_detach_reports_a_cluster_that_cannot_start(tmp_path):
    busy = local.free_port_block(1)
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", busy))
        holder.listen()
        up = _automq("local", "up", "--detach", "--data-dir", str(tmp_path / "x"), "--port", str(busy), timeout=120)
    assert up.returncode == 2
    assert "already in use" in up.stderr and "did not start" in up.stderr
