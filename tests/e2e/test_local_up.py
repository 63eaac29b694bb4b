"""`automq local up` as a user runs it: errors that name what to fix, a clean stop on
SIGTERM, and a restart on the same data dir that finds everything again."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "automq.broker.cli",
                "local",
                "up",
                "--data-dir",
                str(tmp_path),
                "--port",
                str(busy),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2
    assert f"port {busy}" in out.stderr and "already in use" in out.stderr
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").glob("*.pid"))


def test_stop_restart_same_data_dir_and_lock(tmp_path, e2e):
    cluster = e2e.LocalCluster(tmp_path, 1, e2e.free_port_block(1)).start()
    try:
        assert cluster.bootstrap == f"127.0.0.1:{cluster.port}"
        assert (tmp_path / "logs" / "controller.log").exists() and (tmp_path / "logs" / "broker-1.log").exists()
        # a second launcher on the same data dir is refused while the first runs
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "automq.broker.cli",
                "local",
                "up",
                "--data-dir",
                str(tmp_path),
                "--port",
                str(e2e.free_port_block(1)),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2 and "in use by another" in second.stderr

        topic = e2e.topic_name("restart")
        e2e.create_topic(cluster.bootstrap, topic, partitions=2)
        e2e.produce(cluster.bootstrap, topic, [b"r-%d" % i for i in range(200)])
        pids = cluster.pids()
        assert set(pids) == {"controller", "broker-1"}
        assert cluster.stop(sig=signal.SIGINT) == 0  # Ctrl-C
        for pid in pids.values():  # every child is gone
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)

        cluster.start()
        msgs = e2e.consume(cluster.bootstrap, topic, 200, timeout=120)
        assert sorted(m.value() for m in msgs) == sorted(b"r-%d" % i for i in range(200))
        # new appends continue after the recovered offsets
        acked = e2e.produce(cluster.bootstrap, topic, [b"more"] * 10)
        assert all(offset >= 0 for _, offset in acked)
        assert sum(1 for m in e2e.consume(cluster.bootstrap, topic, 210, timeout=60)) == 210
    finally:
        try:
            cluster.stop()
        finally:
            cluster.kill()


def test_controller_death_restarts_it_and_keeps_the_brokers(tmp_path, e2e):
    """The controller is a node like the others: restarted (it reloads its state from the
    object store); its broker keeps running and serves again."""
    cluster = e2e.LocalCluster(tmp_path, 1, e2e.free_port_block(1)).start()
    try:
        pids = cluster.pids()
        os.kill(pids["controller"], signal.SIGKILL)
        cluster.wait_restarted("controller", pids["controller"], timeout=90)
        assert cluster.process.poll() is None
        assert any("controller exited with code" in line for line in cluster.output), cluster.output[-10:]
        assert cluster.pids()["broker-1"] == pids["broker-1"]
        topic = e2e.topic_name("ctl")
        e2e.create_topic(cluster.bootstrap, topic)
        assert len(e2e.produce(cluster.bootstrap, topic, [b"x"] * 10)) == 10
    finally:
        cluster.stop()
        cluster.kill()


def test_killing_the_launcher_stops_its_processes(tmp_path, e2e):
    cluster = e2e.LocalCluster(tmp_path, 1, e2e.free_port_block(1)).start()
    try:
        pids = cluster.pids()
        cluster.process.kill()  # SIGKILL: the launcher cannot clean up itself
        cluster.process.wait(10)
        deadline = time.monotonic() + 60
        alive = dict(pids)
        while alive and time.monotonic() < deadline:
            for name, pid in list(alive.items()):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    del alive[name]
            time.sleep(0.2)
        assert not alive, f"still running after the launcher died: {alive}"
    finally:
        cluster.kill()


def test_a_crashing_broker_is_restarted_with_backoff_and_the_rest_keeps_running(tmp_path, e2e):
    """A broker that exits at every start (here: its config file was broken under it) is
    restarted with a growing delay; the launcher names it with the last lines of its log
    and keeps the controller and the other broker running; fixed, it comes back."""
    cluster = e2e.LocalCluster(tmp_path, 2, e2e.free_port_block(2)).start()
    try:
        config = tmp_path / "config" / "broker-2.yaml"
        good = config.read_text()
        config.write_text("node_id: [this is not a node id\n")
        pids = cluster.pids()
        os.kill(pids["broker-2"], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("broker-2 keeps exiting" in line for line in cluster.output):
            assert cluster.process.poll() is None, "the launcher gave up:\n" + "\n".join(cluster.output[-20:])
            time.sleep(0.2)
        text = "\n".join(cluster.output)
        assert "broker-2 keeps exiting" in text, text[-3000:]
        assert "not valid YAML" in text, "the last lines of its log are not shown:\n" + text[-3000:]
        assert cluster.process.poll() is None, "the launcher gave up on the cluster"
        assert cluster.pids()["broker-1"] == pids["broker-1"] and cluster.is_ready("broker-1")
        assert cluster.pids()["controller"] == pids["controller"] and cluster.is_ready("controller")
        config.write_text(good)
        cluster.wait_restarted("broker-2", pids["broker-2"], timeout=90)
    finally:
        cluster.stop()
        cluster.kill()


def test_unknown_set_key_fails_at_start_naming_it(tmp_path):
    out = subprocess.run(
        [
            *(sys.executable, "-m", "automq.broker.cli", "local", "up", "--data-dir", str(tmp_path)),
            *("--set", "num.partitions=3", "--set", "kafka.num_partitons=3"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "kafka.num_partitons: unknown key" in out.stderr
    assert not (tmp_path / "run").exists()  # nothing started
