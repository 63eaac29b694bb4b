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


def test_controller_death_stops_the_cluster_with_an_error(tmp_path, e2e):
    cluster = e2e.LocalCluster(tmp_path, 1, e2e.free_port_block(1)).start()
    try:
        pids = cluster.pids()
        os.kill(pids["controller"], signal.SIGKILL)
        assert cluster.process.wait(90) == 1
        cluster._reader.join(10)  # all of the launcher's output is read
        assert any("the controller exited" in line for line in cluster.output), cluster.output[-10:]
        with pytest.raises(ProcessLookupError):  # the broker was stopped too
            os.kill(pids["broker-1"], 0)
    finally:
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
