"""`automq status` against the shared real cluster (a controller and two broker processes)."""

from __future__ import annotations

import json
import subprocess
import sys

from automq.broker import local


def _status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "automq.broker.cli", "status", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_json_of_a_healthy_cluster(cluster, e2e):
    topic = e2e.topic_name("status")
    e2e.create_topic(cluster.bootstrap, topic, partitions=4)
    e2e.wait_for_leaders(cluster.bootstrap, topic, 4)
    e2e.produce(cluster.bootstrap, topic, [b"x" * 100] * 20)
    result = _status("--data-dir", str(cluster.data_dir), "--output", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    status = json.loads(result.stdout)
    assert status["healthy"] is True and status["problems"] == []
    [controller] = status["controllers"]
    assert controller["role"] == "leader" and controller["ready"] is True
    brokers = {b["node_id"]: b for b in status["brokers"]}
    assert len(brokers) == 2 and {b["state"] for b in brokers.values()} == {"active"}
    assert all(b["node_epoch"] >= 1 and b["heartbeat_age_ms"] is not None for b in brokers.values())
    # every partition (ours and whatever other tests made) is led by one of the two brokers
    assert sum(b["partitions_led"] for b in brokers.values()) == status["partitions"] >= 4
    assert all(b["wal_backlog_bytes"] is not None and b["open_streams"] is not None for b in brokers.values())
    kafka_ports = {int(e.rsplit(":", 1)[1]) for b in brokers.values() for e in b["kafka_endpoints"]}
    assert cluster.port in kafka_ports


def test_status_table_names_an_unreachable_controller_and_exits_1(cluster):
    dead = f"http://127.0.0.1:{local.free_port()}"
    live = f"http://127.0.0.1:{cluster.http_port('controller')}"
    result = _status("--controller", live, "--controller", dead, "--timeout", "2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "unhealthy" in result.stdout
    assert f"controller {dead} is unreachable" in result.stdout
    assert "Brokers" in result.stdout  # the rest is still shown


def test_status_without_any_controller_says_so(tmp_path):
    result = _status("--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert "no local cluster" in result.stderr
    dead = f"http://127.0.0.1:{local.free_port()}"
    result = _status("--controller", dead, "--output", "json", "--timeout", "1")
    assert result.returncode == 1
    status = json.loads(result.stdout)
    assert status["healthy"] is False and status["problems"][0].startswith("no controller answered")
    assert _status("--controller", "127.0.0.1:9093").returncode == 2
