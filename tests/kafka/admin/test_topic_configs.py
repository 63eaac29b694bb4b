"""Topic config keys: validation messages name the key, defaults come from the node config,
DescribeConfigs sources and synonyms follow Kafka's precedence."""

import pytest
from kio.schema.errors import ErrorCode

from automq.broker import topic_configs as tc
from automq.broker.config import parse_config
from automq.broker.topic_configs import AlterConfigOp, ConfigSource, ConfigType, TopicConfigError


def node(**kafka):
    return parse_config({"node_id": 1, "kafka": kafka} if kafka else {"node_id": 1})


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("retention.ms", "abc", "Invalid value abc for configuration retention.ms: Not a number of type LONG"),
        ("retention.ms", "-2", "Invalid value -2 for configuration retention.ms: Value must be at least -1"),
        ("retention.bytes", "1.5", "Invalid value 1.5 for configuration retention.bytes: Not a number of type LONG"),
        ("max.message.bytes", str(1 << 31), "configuration max.message.bytes: Not a number of type INT"),
        ("segment.bytes", "1000", "configuration segment.bytes: Value must be at least 1048576"),
        ("cleanup.policy", "shred", "configuration cleanup.policy: Invalid value shred for a list of: compact, delete"),
        ("cleanup.policy", "delete,delete", "configuration cleanup.policy: Values must not contain duplicates"),
        (
            "message.timestamp.type",
            "createtime",
            "configuration message.timestamp.type: String must be one of: CreateTime, LogAppendTime",
        ),
        ("compression.type", "brotli", "configuration compression.type: String must be one of"),
        ("preallocate", "yes", "configuration preallocate: Expected value to be either true or false"),
        ("min.cleanable.dirty.ratio", "1.5", "configuration min.cleanable.dirty.ratio: Value must be between"),
        ("min.cleanable.dirty.ratio", "nan", "configuration min.cleanable.dirty.ratio: Value must be between"),
        ("leader.replication.throttled.replicas", "0-1", "configuration leader.replication.throttled.replicas"),
        ("min.insync.replicas", "0", "configuration min.insync.replicas: Value must be at least 1"),
    ],
)
def test_bad_values_are_invalid_config_naming_the_key(name, value, message):
    with pytest.raises(TopicConfigError) as err:
        tc.validate_topic_configs([(name, value)])
    assert message in str(err.value)
    assert err.value.error_code == ErrorCode.invalid_config


def test_unknown_key_and_null_value():
    with pytest.raises(TopicConfigError, match="Unknown topic config name: retention.minutes"):
        tc.validate_topic_configs([("retention.minutes", "1")])
    with pytest.raises(TopicConfigError, match="Null value not supported for topic configs: retention.ms"):
        tc.validate_topic_configs([("retention.ms", None)])


def test_duplicate_key_is_invalid_request():
    with pytest.raises(TopicConfigError) as err:
        tc.validate_topic_configs([("retention.ms", "1"), ("retention.ms", "2")])
    assert err.value.error_code == ErrorCode.invalid_request


def test_good_values_are_canonicalised():
    out = tc.validate_topic_configs(
        [
            ("retention.ms", " 60000 "),
            ("cleanup.policy", "delete, compact"),
            ("preallocate", "TRUE"),
            ("compression.type", "zstd"),
        ]
    )
    assert out == {
        "retention.ms": "60000",
        "cleanup.policy": "delete,compact",
        "preallocate": "true",
        "compression.type": "zstd",
    }


def test_compact_is_accepted():
    assert tc.validate_topic_configs([("cleanup.policy", "compact")]) == {"cleanup.policy": "compact"}
    eff = tc.effective_config({"cleanup.policy": "compact"}, node())
    assert not eff.deletes
    assert tc.effective_config({"cleanup.policy": "compact,delete"}, node()).deletes


def test_local_retention_may_not_exceed_total():
    with pytest.raises(TopicConfigError, match="local.retention.ms"):
        tc.validate_topic_configs([("retention.ms", "1000"), ("local.retention.ms", "2000")])


def test_effective_config_topic_over_broker_over_kafka_default():
    n = node(log_retention_ms=1234, message_max_bytes="2MiB")
    eff = tc.effective_config({}, n)
    assert eff.retention_ms == 1234
    assert eff.max_message_bytes == 2 << 20
    assert eff.retention_bytes == -1
    assert eff.message_timestamp_type == "CreateTime"
    assert eff.cleanup_policy == {"delete"}
    eff = tc.effective_config({"retention.ms": "99", "message.timestamp.type": "LogAppendTime"}, n)
    assert eff.retention_ms == 99 and eff.message_timestamp_type == "LogAppendTime"


def test_describe_topic_sources_and_synonyms():
    n = node(log_retention_ms=1234)
    described = {d.name: d for d in tc.describe_topic({"retention.bytes": "100"}, n, include_synonyms=True)}
    assert set(described) == set(tc.TOPIC_CONFIGS)
    rb = described["retention.bytes"]
    assert (rb.value, rb.source, rb.type) == ("100", ConfigSource.DYNAMIC_TOPIC_CONFIG, ConfigType.LONG)
    assert [(s.name, s.value, s.source) for s in rb.synonyms] == [
        ("retention.bytes", "100", ConfigSource.DYNAMIC_TOPIC_CONFIG),
        ("log.retention.bytes", "-1", ConfigSource.DEFAULT_CONFIG),
    ]
    rm = described["retention.ms"]
    assert (rm.value, rm.source) == ("1234", ConfigSource.STATIC_BROKER_CONFIG)
    assert [(s.name, s.value, s.source) for s in rm.synonyms] == [
        ("log.retention.ms", "1234", ConfigSource.STATIC_BROKER_CONFIG),
        ("log.retention.ms", str(7 * 24 * 3600 * 1000), ConfigSource.DEFAULT_CONFIG),
    ]
    cp = described["cleanup.policy"]
    assert (cp.value, cp.source, cp.type, cp.read_only) == (
        "delete",
        ConfigSource.DEFAULT_CONFIG,
        ConfigType.LIST,
        False,
    )


def test_describe_topic_key_filter_and_docs():
    out = tc.describe_topic({}, node(), keys=["retention.ms", "no.such.key"], include_documentation=True)
    assert [d.name for d in out] == ["retention.ms"]
    assert out[0].synonyms == ()
    assert "retention task" in out[0].documentation


def test_describe_broker_reports_node_config_read_only():
    n = node(num_partitions=3)
    described = {d.name: d for d in tc.describe_broker(n)}
    assert described["num.partitions"].value == "3"
    assert described["num.partitions"].source == ConfigSource.STATIC_BROKER_CONFIG
    assert described["log.retention.ms"].source == ConfigSource.DEFAULT_CONFIG
    assert described["auto.create.topics.enable"].type == ConfigType.BOOLEAN
    assert described["node.id"].value == "1"
    assert described["log.cleanup.policy"].value == "delete"
    assert all(d.read_only for d in described.values())
    only = tc.describe_broker(n, keys=["num.partitions"])
    assert [d.name for d in only] == ["num.partitions"]


def test_incremental_set_delete_append_subtract():
    current = {"retention.ms": "1000", "cleanup.policy": "delete"}
    changes = tc.apply_incremental(
        current,
        [
            ("retention.ms", AlterConfigOp.DELETE, None),
            ("cleanup.policy", AlterConfigOp.APPEND, "compact"),
            ("retention.bytes", AlterConfigOp.SET, "5"),
        ],
    )
    assert changes == {"retention.ms": None, "cleanup.policy": "delete,compact", "retention.bytes": "5"}
    changes = tc.apply_incremental(
        {"cleanup.policy": "delete,compact"}, [("cleanup.policy", AlterConfigOp.SUBTRACT, "compact")]
    )
    assert changes == {"cleanup.policy": "delete"}
    # APPEND to an unset list starts from the default ("delete")
    assert tc.apply_incremental({}, [("cleanup.policy", AlterConfigOp.APPEND, "compact")]) == {
        "cleanup.policy": "delete,compact"
    }
    # deleting an unset key changes nothing
    assert tc.apply_incremental({}, [("retention.ms", AlterConfigOp.DELETE, None)]) == {}


def test_incremental_errors():
    with pytest.raises(TopicConfigError, match="append/subtract is not allowed for config key: retention.ms"):
        tc.apply_incremental({}, [("retention.ms", AlterConfigOp.APPEND, "5")])
    with pytest.raises(TopicConfigError) as err:
        tc.apply_incremental({}, [("retention.ms", 7, "5")])
    assert err.value.error_code == ErrorCode.invalid_request
    with pytest.raises(TopicConfigError) as err:
        tc.apply_incremental({}, [("retention.ms", 0, "5"), ("retention.ms", 1, None)])
    assert err.value.error_code == ErrorCode.invalid_request
    # Kafka 4.x: SUBTRACT of the last policy leaves an empty list, accepted (no cleanup)
    assert tc.apply_incremental(
        {"cleanup.policy": "delete"}, [("cleanup.policy", AlterConfigOp.SUBTRACT, "delete")]
    ) == {"cleanup.policy": ""}
    with pytest.raises(TopicConfigError, match="Unknown topic config name: bogus"):
        tc.apply_incremental({}, [("bogus", AlterConfigOp.DELETE, None)])


def test_replace_all_drops_keys_left_out():
    assert tc.replace_all({"retention.ms": "1", "retention.bytes": "2"}, [("retention.bytes", "3")]) == {
        "retention.bytes": "3",
        "retention.ms": None,
    }


def test_doc_table_lists_every_key():
    table = tc.topic_config_table()
    for name in tc.TOPIC_CONFIGS:
        assert f"| `{name}` |" in table
