"""Local mode's preparation step (no processes): configs, ports, the data dir record."""

import socket

import pytest

from automq.broker import local
from automq.broker.config import load_config


def _free_block(n: int) -> int:
    for _ in range(50):
        base = local.free_port()
        if base + n < 65535 and all(local.port_is_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no free port block")


def test_prepare_writes_loadable_configs(tmp_path):
    port = _free_block(2)
    nodes = local.prepare(2, tmp_path, port, None)
    assert [n.name for n in nodes] == ["controller", "broker-1", "broker-2"]
    configs = {n.name: load_config(n.config_path) for n in nodes}
    # only what local mode sets is in the files (a written key counts as set by the user)
    text = nodes[1].config_path.read_text()
    assert "node_id: 1" in text and "wal:" not in text and "kafka:" not in text
    assert configs["controller"].node_id == 0
    assert [configs[f"broker-{i}"].node_id for i in (1, 2)] == [1, 2]
    assert [configs[f"broker-{i}"].listeners[0].port for i in (1, 2)] == [port, port + 1]
    url = (tmp_path / "objects").as_uri()
    assert {c.object_store_url for c in configs.values()} == {url}
    controller_url = f"http://127.0.0.1:{configs['controller'].http_port}"
    assert all(c.controller_urls == [controller_url] for c in configs.values())
    http_ports = [c.http_port for c in configs.values()]
    assert len(set(http_ports)) == 3 and not {port, port + 1} & set(http_ports)
    # the same data dir keeps node ids and WAL locations on a second start
    again = {n.name: load_config(n.config_path) for n in local.prepare(2, tmp_path, port, None)}
    assert again["broker-2"].data_dir == configs["broker-2"].data_dir == str(tmp_path / "broker-2")


def test_port_in_use_names_the_port(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(
            local.LocalClusterError, match=f"port {busy} \\(broker 1's Kafka listener\\) is already in use"
        ):
            local.prepare(1, tmp_path, busy, None)
        if local.port_is_free(busy - 1):
            with pytest.raises(local.LocalClusterError, match=f"port {busy} \\(broker 2's Kafka listener\\)"):
                local.prepare(2, tmp_path, busy - 1, None)


def test_object_store_is_remembered_per_data_dir(tmp_path):
    port = _free_block(1)
    local.prepare(1, tmp_path, port, "s3://bucket?endpoint=http://127.0.0.1:1")
    # a restart without --object-store finds the recorded one
    nodes = local.prepare(1, tmp_path, port, None)
    assert load_config(nodes[1].config_path).object_store_url == "s3://bucket?endpoint=http://127.0.0.1:1"
    with pytest.raises(local.LocalClusterError, match="holds a cluster on object store s3://bucket"):
        local.prepare(1, tmp_path, port, "file:///elsewhere")


def test_bad_arguments(tmp_path):
    with pytest.raises(local.LocalClusterError, match="--brokers must be at least 1"):
        local.prepare(0, tmp_path, 9092, None)
    with pytest.raises(local.LocalClusterError, match="leaves the port range"):
        local.prepare(3, tmp_path, 65534, None)
    with pytest.raises(local.LocalClusterError, match="must be an s3:// or file:// URL"):
        local.prepare(1, tmp_path / "x", _free_block(1), "http://nope")


def test_free_port_block_is_free_and_below_the_ephemeral_range():
    floor = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    base = local.free_port_block(3)
    assert base >= 10_000 and base + 3 <= floor
    assert all(local.port_is_free(base + i) for i in range(3))
