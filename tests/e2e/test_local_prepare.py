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


def test_set_and_config_reach_every_node_config(tmp_path):
    fragment = tmp_path / "extra.yaml"
    fragment.write_text("kafka:\n  num_partitions: 4\n  group_min_session_timeout_ms: 1000\nlog_level: DEBUG\n")
    overrides = local.node_overrides(
        # a Kafka name and a dotted key; --set wins over --config
        ["group.initial.rebalance.delay.ms=250", "kafka.num_partitions=6", "wal.capacity=32MiB"],
        fragment,
    )
    nodes = local.prepare(2, tmp_path / "d", _free_block(2), None, overrides)
    configs = {n.name: load_config(n.config_path) for n in nodes}
    for name in ("broker-1", "broker-2"):
        kafka = configs[name].kafka
        assert (kafka.num_partitions, kafka.group_min_session_timeout_ms) == (6, 1000)
        assert kafka.group_initial_rebalance_delay_ms == 250
        assert configs[name].wal.capacity == 32 << 20 and configs[name].log_level == "DEBUG"
    # local mode's own keys are kept
    assert [configs[f"broker-{i}"].node_id for i in (1, 2)] == [1, 2]
    assert configs["controller"].log_level == "DEBUG" and configs["controller"].listeners == []


@pytest.mark.parametrize(
    ("sets", "fragment", "message"),
    [
        (["kafka.no_such_key=1"], None, r"kafka\.no_such_key: unknown key"),
        (["no.such.thing=1"], None, r"no: unknown key"),
        (["kafka.num_partitions=zero"], None, r"kafka\.num_partitions"),
        (["num.partitions"], None, r"expected KEY=VALUE"),
        (["listeners=[]"], None, r"listeners cannot be set in local mode: use --port"),
        ([], "kafka: [1, 2]\n", r"kafka"),
        ([], "- a\n", r"must hold a mapping"),
        ([], "a: [\n", r"not valid YAML"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(tmp_path, sets, fragment, message):
    path = None
    if fragment is not None:
        path = tmp_path / "f.yaml"
        path.write_text(fragment)
    with pytest.raises(local.LocalClusterError, match=message):
        local.node_overrides(sets, path)
    with pytest.raises(local.LocalClusterError, match="cannot read it"):
        local.node_overrides([], tmp_path / "missing.yaml")
