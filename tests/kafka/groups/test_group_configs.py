"""Per-group dynamic configs (ConfigResource GROUP): validation in Kafka's words, the
controller storing them durably (log replay, snapshots) and the image carrying them to the
brokers, where share_settings() applies them over the broker defaults."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from automq.broker import group_configs as gc
from automq.broker.config import ConfigError, parse_config
from automq.broker.controller import commands
from automq.broker.controller.commands import Tx
from automq.broker.controller.state import MetadataState
from automq.broker.kafka.groups.share_settings import share_settings
from automq.broker.storage.metadata import MetadataError
from automq.broker.topic_configs import TopicConfigError

SET, DELETE, APPEND = 0, 1, 2


def test_values_are_validated_in_kafkas_words() -> None:
    ok = gc.apply_incremental(
        {},
        [
            ("share.auto.offset.reset", SET, " EARLIEST "),
            ("share.isolation.level", SET, "read_committed"),
            ("share.delivery.count.limit", SET, "3"),
        ],
    )
    assert ok == {
        "share.auto.offset.reset": "earliest",
        "share.isolation.level": "read_committed",
        "share.delivery.count.limit": "3",
    }
    assert gc.apply_incremental({}, [("share.auto.offset.reset", SET, "by_duration:P1DT2H30M")]) == {
        "share.auto.offset.reset": "by_duration:P1DT2H30M"
    }
    assert gc.parse_by_duration("by_duration:P1DT2H30M") == (26 * 60 + 30) * 60_000
    assert gc.parse_by_duration("by_duration:PT0.5S") == 500
    bad = [
        (("share.auto.offset.reset", SET, "sometimes"), "share.auto.offset.reset"),
        (("share.auto.offset.reset", SET, "by_duration:-P1D"), "Invalid duration"),
        (("share.auto.offset.reset", SET, "by_duration:PT"), "Invalid duration"),
        (("share.delivery.count.limit", SET, "1"), "at least 2"),
        (("share.delivery.count.limit", SET, "11"), "no more than 10"),
        (("share.record.lock.duration.ms", SET, "soon"), "Not a number"),
        (("share.isolation.level", SET, "serializable"), "read_committed"),
        (("consumer.session.timeout.ms", SET, "soon"), "Not a number"),
        (("consumer.heartbeat.interval.ms", SET, "50"), "at least 100"),
        (("consumer.group.max.size", SET, "10"), "Unknown group config name"),
        (("unknown.key", SET, "1"), "Unknown group config name: unknown.key"),
        (("share.auto.offset.reset", SET, None), "Null value"),
        (("share.auto.offset.reset", APPEND, "x"), "append/subtract"),
    ]
    for op, words in bad:
        with pytest.raises(TopicConfigError, match=words):
            gc.apply_incremental({}, [op])
    with pytest.raises(TopicConfigError, match="must be less than share.session.timeout.ms"):
        gc.apply_incremental(
            {}, [("share.heartbeat.interval.ms", SET, "9000"), ("share.session.timeout.ms", SET, "9000")]
        )
    with pytest.raises(TopicConfigError, match="must be less than consumer.session.timeout.ms"):
        gc.apply_incremental({"consumer.session.timeout.ms": "5000"}, [("consumer.heartbeat.interval.ms", SET, "6000")])
    assert gc.apply_incremental({}, [("consumer.session.timeout.ms", SET, "20000")]) == {
        "consumer.session.timeout.ms": "20000"
    }
    with pytest.raises(TopicConfigError, match="duplicate"):
        gc.apply_incremental(
            {}, [("share.isolation.level", SET, "read_committed"), ("share.isolation.level", DELETE, None)]
        )
    # deleting returns to the default; deleting what is not set changes nothing
    assert gc.apply_incremental(
        {"share.isolation.level": "read_committed"}, [("share.isolation.level", DELETE, None)]
    ) == {"share.isolation.level": None}
    assert gc.apply_incremental({}, [("share.isolation.level", DELETE, None)]) == {}


def test_controller_stores_group_configs_durably() -> None:
    st = MetadataState()
    tx = Tx(st, 1_000)
    commands.alter_group_configs(tx, "q", {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "4"})
    records = list(tx.records)
    tx = Tx(st, 1_001)
    commands.alter_group_configs(tx, "q", {"share.delivery.count.limit": None})
    records += tx.records
    with pytest.raises(MetadataError, match="Unknown group config name"):
        commands.alter_group_configs(Tx(st, 1_002), "q", {"bogus": "1"})
    [entry] = st.image().group_configs
    assert (entry.group_id, entry.configs) == ("q", {"share.auto.offset.reset": "earliest"})
    assert MetadataState.from_snapshot(st.snapshot()).image().group_configs == st.image().group_configs
    replayed = MetadataState()
    for rec in records:
        replayed.apply(rec)
    assert replayed.image().group_configs == st.image().group_configs
    old = st.snapshot()
    del old["group_configs"]
    assert MetadataState.from_snapshot(old).group_configs == {}
    # the last key removed: the group has no entry any more
    commands.alter_group_configs(Tx(st, 1_003), "q", {"share.auto.offset.reset": None})
    assert st.image().group_configs == ()


def test_share_settings_apply_group_configs_over_broker_defaults() -> None:
    node = parse_config(
        {"node_id": 1, "object_store_url": "file:///tmp/x", "kafka": {"group_share_record_lock_duration_ms": 20_000}}
    )
    st = MetadataState()
    commands.alter_group_configs(
        Tx(st, 1), "q", {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "7"}
    )
    broker = SimpleNamespace(config=node, metadata=st.image())
    s = share_settings(broker, "q")  # type: ignore[arg-type]
    assert (s.auto_offset_reset, s.delivery_count_limit, s.record_lock_duration_ms) == ("earliest", 7, 20_000)
    other = share_settings(broker, "other")  # type: ignore[arg-type]
    assert (other.auto_offset_reset, other.delivery_count_limit) == ("latest", 5)
    assert share_settings(SimpleNamespace(config=node, metadata=None), "q").auto_offset_reset == "latest"  # type: ignore[arg-type]


def test_share_values_must_lie_within_the_brokers_min_max_bounds() -> None:
    """Kafka 4.x: a group's share.record.lock.duration.ms (and share session timeout and
    heartbeat interval) must lie within group.share.min/max.*; a broker whose own default
    lies outside bounds it set does not start."""
    node = parse_config({"node_id": 1, "object_store_url": "file:///tmp/x"})
    assert (node.kafka.group_share_min_record_lock_duration_ms, node.kafka.group_share_max_record_lock_duration_ms) == (
        15_000,
        60_000,
    )
    assert gc.apply_incremental({}, [("share.record.lock.duration.ms", SET, "15000")], node) == {
        "share.record.lock.duration.ms": "15000"
    }
    with pytest.raises(TopicConfigError, match="greater than or equal to group.share.min.record.lock.duration.ms"):
        gc.apply_incremental({}, [("share.record.lock.duration.ms", SET, "14999")], node)
    with pytest.raises(TopicConfigError, match="less than or equal to group.share.max.record.lock.duration.ms"):
        gc.replace_all({}, [("share.record.lock.duration.ms", "60001")], node)
    with pytest.raises(TopicConfigError, match="greater than or equal to group.share.min.session.timeout.ms"):
        gc.apply_incremental({}, [("share.session.timeout.ms", SET, "30000")], node)
    # KIP-1240's bounds of the delivery count limit and of the record locks per partition
    assert gc.apply_incremental({}, [("share.delivery.count.limit", SET, "10")], node)
    with pytest.raises(TopicConfigError, match="less than or equal to group.share.max.partition.max.record.locks"):
        gc.apply_incremental({}, [("share.partition.max.record.locks", SET, "5000")], node)
    tight = parse_config(
        {"node_id": 1, "object_store_url": "file:///tmp/x", "kafka": {"group_share_max_delivery_count_limit": 6}}
    )
    with pytest.raises(TopicConfigError, match="less than or equal to group.share.max.delivery.count.limit"):
        gc.apply_incremental({}, [("share.delivery.count.limit", SET, "7")], tight)
    wide = parse_config(
        {
            "node_id": 1,
            "object_store_url": "file:///tmp/x",
            "kafka": {
                "group_share_max_record_lock_duration_ms": 600_000,
                "group_share_min_record_lock_duration_ms": 1_000,
            },
        }
    )
    assert gc.apply_incremental({}, [("share.record.lock.duration.ms", SET, "600000")], wide)
    assert gc.apply_incremental({}, [("share.record.lock.duration.ms", SET, "1000")], wide)
    for bad in (
        {"group_share_min_record_lock_duration_ms": 20_000, "group_share_record_lock_duration_ms": 10_000},
        {"group_share_max_session_timeout_ms": 50_000, "group_share_session_timeout_ms": 55_000},
        {"group_share_min_heartbeat_interval_ms": 9_000, "group_share_max_heartbeat_interval_ms": 8_000},
        {"group_share_min_record_lock_duration_ms": 500},  # Kafka's range: 1000-30000
        {"group_share_max_delivery_count_limit": 6, "group_share_delivery_count_limit": 8},
        {"group_share_min_partition_max_record_locks": 3_000, "group_share_partition_max_record_locks": 2_000},
    ):
        with pytest.raises(ConfigError, match="group.share"):
            parse_config({"node_id": 1, "object_store_url": "file:///tmp/x", "kafka": bad})
