"""Admin APIs through real admin clients (confluent AdminClient, kafka-python
KafkaAdminClient) against the shared local cluster."""

import time

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

pytestmark = pytest.mark.slow


def _error_name(future):
    with pytest.raises(KafkaException) as err:
        future.result(30)
    return err.value.args[0].name()


def test_confluent_create_describe_alter_delete(cluster, e2e):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    name = e2e.topic_name("adm")
    # a replication factor above the 2 live brokers is refused, as Kafka does (also validate-only)
    for validate_only in (True, False):
        fs = admin.create_topics([NewTopic(name, 3, 3)], validate_only=validate_only)
        assert _error_name(fs[name]) == "INVALID_REPLICATION_FACTOR"
    fs = admin.create_topics([NewTopic(name, 3, 2, config={"retention.ms": "3600000", "cleanup.policy": "delete"})])
    fs[name].result(30)
    e2e.wait_for_leaders(cluster.bootstrap, name, 3)

    # RF 2 (= live brokers) was accepted and is reported honestly as one replica
    md = admin.list_topics(name, timeout=10).topics[name]
    assert sorted(md.partitions) == [0, 1, 2]
    assert all(len(p.replicas) == 1 and p.replicas == p.isrs == [p.leader] for p in md.partitions.values())

    # duplicate and invalid creations
    assert _error_name(admin.create_topics([NewTopic(name, 1, 1)])[name]) == "TOPIC_ALREADY_EXISTS"
    bad = "bad/name"
    assert (
        _error_name(admin.create_topics([NewTopic(bad, 1, 1)])[bad]) == "TOPIC_EXCEPTION"
    )  # librdkafka's name for INVALID_TOPIC_EXCEPTION (17)
    other = e2e.topic_name("adm")
    assert (
        _error_name(admin.create_topics([NewTopic(other, 1, 1, config={"retention.ms": "soon"})])[other])
        == "INVALID_CONFIG"
    )
    assert (
        _error_name(admin.create_topics([NewTopic(other, 1, 1, config={"no.such.key": "1"})])[other])
        == "INVALID_CONFIG"
    )
    # validate_only creates nothing
    admin.create_topics([NewTopic(other, 2, 1)], validate_only=True)[other].result(30)
    assert other not in admin.list_topics(timeout=10).topics

    # describe: the set key is a topic config, the rest come from the broker/defaults
    res = ConfigResource(ResourceType.TOPIC, name)
    configs = admin.describe_configs([res])[res].result(30)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["max.message.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["cleanup.policy"].value == "delete"

    # incremental alter: SET, DELETE, APPEND
    res = ConfigResource(
        ResourceType.TOPIC,
        name,
        incremental_configs=[
            ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        ],
    )
    admin.incremental_alter_configs([res])[res].result(30)
    configs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)])
    configs = next(iter(configs.values())).result(30)
    assert configs["retention.bytes"].value == "1048576"
    assert configs["retention.ms"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert set(configs["cleanup.policy"].value.split(",")) == {"delete", "compact"}

    # a bad value names the key
    res = ConfigResource(
        ResourceType.TOPIC,
        name,
        incremental_configs=[ConfigEntry("segment.bytes", "12", incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(KafkaException) as err:
        admin.incremental_alter_configs([res])[res].result(30)
    assert err.value.args[0].name() == "INVALID_CONFIG" and "segment.bytes" in err.value.args[0].str()

    # partitions can only grow
    admin.create_partitions([NewPartitions(name, 5)])[name].result(30)
    e2e.wait_for_leaders(cluster.bootstrap, name, 5)
    assert _error_name(admin.create_partitions([NewPartitions(name, 2)])[name]) == "INVALID_PARTITIONS"

    # broker resource: read-only node config
    broker_res = ConfigResource(ResourceType.BROKER, "1")
    broker_configs = admin.describe_configs([broker_res])[broker_res].result(30)
    assert broker_configs["num.partitions"].is_read_only
    assert broker_configs["log.retention.ms"].value.lstrip("-").isdigit()

    admin.delete_topics([name], operation_timeout=30)[name].result(30)
    deadline = time.monotonic() + 30
    while name in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    assert name not in admin.list_topics(timeout=10).topics
    assert _error_name(admin.delete_topics([name])[name]) == "UNKNOWN_TOPIC_OR_PART"


def test_confluent_delete_records_and_describe_cluster(cluster, e2e):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    name = e2e.topic_name("dr")
    e2e.create_topic(cluster.bootstrap, name, partitions=1)
    e2e.produce(cluster.bootstrap, name, [b"r%d" % i for i in range(50)], **{"linger.ms": 0, "batch.num.messages": 1})
    result = admin.delete_records([TopicPartition(name, 0, 20)])
    low = next(iter(result.values())).result(30)
    assert low.low_watermark == 20
    msgs = e2e.consume(cluster.bootstrap, name, 30)
    assert sorted(m.offset() for m in msgs) == list(range(20, 50))
    # -1 = up to the high watermark
    low = next(iter(admin.delete_records([TopicPartition(name, 0, -1)]).values())).result(30)
    assert low.low_watermark == 50

    description = admin.describe_cluster().result(30)
    assert sorted(n.id for n in description.nodes) == [1, 2]
    assert {n.port for n in description.nodes} == {cluster.port, cluster.port + 1}
    assert description.cluster_id


def test_kafka_python_admin(cluster, e2e):
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.errors import InvalidPartitionsError, TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30_000)
    try:
        name = e2e.topic_name("kpa")
        admin.create_topics(
            {name: {"num_partitions": 2, "replication_factor": 1, "configs": {"max.message.bytes": "200000"}}}
        )
        e2e.wait_for_leaders(cluster.bootstrap, name, 2)
        assert name in admin.list_topics()
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics({name: {"num_partitions": 1}})

        described = admin.describe_topics([name])
        assert described[0]["name"] == name and len(described[0]["partitions"]) == 2

        resource = KConfigResource(ConfigResourceType.TOPIC, name)
        response = admin.describe_configs([resource], config_filter="all")
        text = str(response)
        assert "max.message.bytes" in text and "200000" in text

        admin.alter_configs([KConfigResource(ConfigResourceType.TOPIC, name, configs={"retention.ms": "120000"})])
        text = str(admin.describe_configs([KConfigResource(ConfigResourceType.TOPIC, name)], config_filter="all"))
        assert "120000" in text

        admin.create_partitions({name: 4})
        e2e.wait_for_leaders(cluster.bootstrap, name, 4)
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({name: 3})

        e2e.produce(cluster.bootstrap, name, [b"x"] * 20)
        dirs = admin.describe_log_dirs()
        assert "s3://" in str(dirs) or "file://" in str(dirs)

        cluster_info = admin.describe_cluster()
        assert len(cluster_info["brokers"]) == 2
        assert "CREATE" in cluster_info["authorized_operations"] and "READ" not in cluster_info["authorized_operations"]

        admin.delete_records({KTopicPartition(name, 0): -1})
        assert admin.list_partition_reassignments() == {}

        admin.delete_topics([name])
        deadline = time.monotonic() + 30
        while name in admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert name not in admin.list_topics()
    finally:
        admin.close()


def test_kafka_python_reassignment_moves_leader(cluster, e2e):
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import KafkaAdminClient

    name = e2e.topic_name("mv")
    e2e.create_topic(cluster.bootstrap, name, partitions=1)
    leader = e2e.wait_for_leaders(cluster.bootstrap, name, 1)[0]
    target = 2 if leader == 1 else 1
    e2e.produce(cluster.bootstrap, name, [b"before-%d" % i for i in range(100)])
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30_000)
    try:
        admin.alter_partition_reassignments({KTopicPartition(name, 0): [target]})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if e2e.wait_for_leaders(cluster.bootstrap, name, 1)[0] == target:
                break
            time.sleep(0.1)
        assert e2e.wait_for_leaders(cluster.bootstrap, name, 1)[0] == target
        # a dead broker in the target list: the partition's own error (kafka-python returns it)
        from kafka.errors import InvalidReplicationAssignmentError

        result = admin.alter_partition_reassignments({KTopicPartition(name, 0): [99]})
        assert result[KTopicPartition(name, 0)] is InvalidReplicationAssignmentError
    finally:
        admin.close()
    e2e.produce(cluster.bootstrap, name, [b"after-%d" % i for i in range(100)])
    msgs = e2e.consume(cluster.bootstrap, name, 200)
    assert [m.offset() for m in msgs] == list(range(200))
