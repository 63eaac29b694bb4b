"""Config: one model for every node; errors name the key."""

import pytest

from automq.broker.config import ConfigError, dump_config, load_config, parse_config


def test_sizes_and_durations_parse_with_units(tmp_path):
    f = tmp_path / "node.yaml"
    f.write_text(
        "node_id: 3\nwal: {kind: s3, s3_bulk_interval_ms: 250ms, s3_bulk_bytes: 8MiB}\nstorage: {upload_interval_ms: 1m}\n"
    )
    cfg = load_config(f)
    assert cfg.wal.s3_bulk_bytes == 8 << 20
    assert cfg.wal.s3_bulk_interval_ms == 250
    assert cfg.storage.upload_interval_ms == 60_000
    assert load_config_roundtrip(cfg, tmp_path) == cfg


def load_config_roundtrip(cfg, tmp_path):
    f = tmp_path / "again.yaml"
    f.write_text(dump_config(cfg))
    return load_config(f)


@pytest.mark.parametrize(
    "raw, key, reason",
    [
        ({}, "node_id", "Field required"),
        ({"node_id": 1, "wal": {"kind": "tape"}}, "wal.kind", "'volume' or 's3'"),
        ({"node_id": 1, "storage": {"log_cache_bytes": "lots"}}, "storage.log_cache_bytes", "expected a size"),
        ({"node_id": 1, "wal": {"capasity": 5}}, "wal.capasity", "unknown key"),
        ({"node_id": 1, "object_store_url": "ftp://x"}, "(top level)", "s3:// or file://"),
        ({"node_id": -1}, "node_id", "greater than or equal to 0"),
    ],
)
def test_bad_config_names_the_key(raw, key, reason):
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, source="node.yaml")
    message = str(exc.value)
    assert "node.yaml" in message and key in message and reason in message


def test_unreadable_and_non_mapping_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("node_id: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)


# Apache Kafka broker configs that have a `kafka.*` field here (names as Kafka's docs spell them).
_REAL_KAFKA_BROKER_KEYS = frozenset(
    [
        "auto.create.topics.enable",
        "num.partitions",
        "default.replication.factor",
        "log.retention.ms",
        "log.retention.bytes",
        "log.retention.check.interval.ms",
        "message.max.bytes",
        "socket.request.max.bytes",
        "group.initial.rebalance.delay.ms",
        "group.min.session.timeout.ms",
        "group.max.session.timeout.ms",
        "group.consumer.session.timeout.ms",
        "group.consumer.heartbeat.interval.ms",
        "group.consumer.assignors",
        "group.share.enable",
        "group.share.session.timeout.ms",
        "group.share.heartbeat.interval.ms",
        "group.share.max.size",
        "group.share.record.lock.duration.ms",
        "group.share.delivery.count.limit",
        "group.share.partition.max.record.locks",
        "group.share.min.record.lock.duration.ms",
        "group.share.max.record.lock.duration.ms",
        "group.share.min.session.timeout.ms",
        "group.share.max.session.timeout.ms",
        "group.share.min.heartbeat.interval.ms",
        "group.share.max.heartbeat.interval.ms",
        "group.share.max.share.sessions",
        "group.share.min.delivery.count.limit",
        "group.share.max.delivery.count.limit",
        "group.share.min.partition.max.record.locks",
        "group.share.max.partition.max.record.locks",
        "group.consumer.migration.policy",
        "inter.broker.listener.name",
        "transactional.id.expiration.ms",
        "producer.id.expiration.ms",
        "producer.id.expiration.check.interval.ms",
        "offsets.topic.num.partitions",
        "transaction.state.log.num.partitions",
        "transaction.max.timeout.ms",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "transaction.partition.verification.enable",
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        "connections.max.idle.ms",
        "max.connections",
        "max.connections.per.ip",
        "max.connections.per.ip.overrides",
        "queued.max.request.bytes",
        "max.incremental.fetch.session.cache.slots",
        "authorizer.class.name",
        "super.users",
        "allow.everyone.if.no.acl.found",
        "quota.window.num",
        "quota.window.size.seconds",
    ]
)


def test_every_kafka_name_the_docs_give_is_a_real_kafka_key():
    """A new `kafka.*` field whose dotted name is not Kafka's must be listed in
    KAFKA_NAME_EXCEPTIONS (with Kafka's name, or None), or docs and DescribeConfigs lie."""
    from automq.broker.config import KafkaConfig, kafka_field, kafka_name

    for field in KafkaConfig.model_fields:
        name = kafka_name(field)
        assert name is None or name in _REAL_KAFKA_BROKER_KEYS, f"kafka.{field} is documented as {name!r}"
        if name is not None:
            assert kafka_field(name) == field
    assert kafka_name("fetch_session_cache_slots") == "max.incremental.fetch.session.cache.slots"


def test_local_set_takes_kafka_names():
    from automq.broker.local import node_overrides

    assert node_overrides(["max.incremental.fetch.session.cache.slots=5"]) == {
        "kafka": {"fetch_session_cache_slots": 5}
    }
    assert node_overrides(["fetch.session.cache.slots=6"]) == {"kafka": {"fetch_session_cache_slots": 6}}
    assert node_overrides(["kafka.fetch_session_cache_slots=7"]) == {"kafka": {"fetch_session_cache_slots": 7}}


def test_nodes_run_with_a_short_gil_switch_interval(tmp_path):
    """A node sets Python's switch interval from gil_switch_interval_us before its loop starts
    (the WAL thread's hand-offs wait up to it for the GIL); a value outside 50-100000 us is
    refused naming the setting."""
    import sys

    from automq.broker.node import run_node

    seen: list[float] = []

    async def serve(config) -> int:
        seen.append(sys.getswitchinterval())
        return 0

    before = sys.getswitchinterval()
    try:
        for value, expected in ((None, 0.0005), (2000, 0.002)):
            raw = {"node_id": 1, "data_dir": str(tmp_path), "object_store_url": f"file://{tmp_path}/objects"}
            if value is not None:
                raw["gil_switch_interval_us"] = value
            run_node(parse_config(raw), serve)
            assert seen[-1] == pytest.approx(expected)
    finally:
        sys.setswitchinterval(before)
    with pytest.raises(ConfigError, match="gil_switch_interval_us"):
        parse_config({"node_id": 1, "gil_switch_interval_us": 10})
