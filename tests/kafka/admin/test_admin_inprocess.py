"""Admin APIs served by in-process brokers to real clients (kafka-python, confluent)."""

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


def _wait_leaders(admin, name, n, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t = admin.list_topics(name, timeout=10).topics.get(name)
        if (
            t is not None
            and t.error is None
            and len(t.partitions) == n
            and all(p.leader >= 0 for p in t.partitions.values())
        ):
            return {p.id: p.leader for p in t.partitions.values()}
        time.sleep(0.1)
    raise AssertionError(f"no leaders for {name}")


def _error(future):
    with pytest.raises(KafkaException) as err:
        future.result(30)
    return err.value.args[0]


def test_topics_and_configs(inprocess_cluster):
    admin = AdminClient({"bootstrap.servers": inprocess_cluster.bootstrap})
    assert _error(admin.create_topics([NewTopic("t1", 3, 3)])["t1"]).name() == "INVALID_REPLICATION_FACTOR"
    admin.create_topics([NewTopic("t1", 3, 2, config={"retention.ms": "3600000"})])["t1"].result(30)
    leaders = _wait_leaders(admin, "t1", 3)
    assert set(leaders.values()) <= {1, 2}
    md = admin.list_topics("t1", timeout=10).topics["t1"]
    assert all(p.replicas == [p.leader] for p in md.partitions.values())

    assert _error(admin.create_topics([NewTopic("t1", 1, 1)])["t1"]).name() == "TOPIC_ALREADY_EXISTS"
    assert (
        _error(admin.create_topics([NewTopic("a b", 1, 1)])["a b"]).name() == "TOPIC_EXCEPTION"
    )  # librdkafka's name for INVALID_TOPIC_EXCEPTION (17)
    assert (
        _error(admin.create_topics([NewTopic("t2", 1, 1, config={"retention.ms": "x"})])["t2"]).name()
        == "INVALID_CONFIG"
    )
    assert _error(admin.create_topics([NewTopic("t2", 0, 1)])["t2"]).name() == "INVALID_PARTITIONS"
    admin.create_topics([NewTopic("t2", 2, 1)], validate_only=True)["t2"].result(30)
    assert "t2" not in admin.list_topics(timeout=10).topics

    res = ConfigResource(ResourceType.TOPIC, "t1")
    configs = admin.describe_configs([res])[res].result(30)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    # synonyms in precedence order: the topic's value, then the broker default it overrides
    synonyms = [(s.name, s.value, s.source) for s in configs["retention.ms"].synonyms.values()]
    assert synonyms[0] == ("retention.ms", "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert ("log.retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG.value) in synonyms

    res = ConfigResource(
        ResourceType.TOPIC,
        "t1",
        incremental_configs=[
            ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        ],
    )
    admin.incremental_alter_configs([res])[res].result(30)
    configs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "t1")])
    configs = next(iter(configs.values())).result(30)
    assert configs["retention.bytes"].value == "1048576"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["cleanup.policy"].value == "delete,compact"

    bad = ConfigResource(
        ResourceType.TOPIC,
        "t1",
        incremental_configs=[ConfigEntry("segment.bytes", "12", incremental_operation=AlterConfigOpType.SET)],
    )
    err = _error(admin.incremental_alter_configs([bad])[bad])
    assert err.name() == "INVALID_CONFIG" and "segment.bytes" in err.str()

    admin.create_partitions([NewPartitions("t1", 5)])["t1"].result(30)
    _wait_leaders(admin, "t1", 5)
    assert _error(admin.create_partitions([NewPartitions("t1", 4)])["t1"]).name() == "INVALID_PARTITIONS"

    broker_res = ConfigResource(ResourceType.BROKER, "1")
    broker_configs = admin.describe_configs([broker_res])[broker_res].result(30)
    assert broker_configs["num.partitions"].is_read_only and broker_configs["num.partitions"].value == "1"

    admin.delete_topics(["t1"], operation_timeout=30)["t1"].result(30)
    assert "t1" not in admin.list_topics(timeout=10).topics
    assert _error(admin.delete_topics(["t1"])["t1"]).name() == "UNKNOWN_TOPIC_OR_PART"


def test_delete_records_cluster_and_log_dirs(inprocess_cluster):
    from confluent_kafka import Producer
    from kafka.admin import KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": inprocess_cluster.bootstrap})
    admin.create_topics([NewTopic("d", 1, 1)])["d"].result(30)
    _wait_leaders(admin, "d", 1)
    producer = Producer({"bootstrap.servers": inprocess_cluster.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for i in range(30):
        producer.produce("d", b"v%d" % i)
        producer.flush(10)
    low = next(iter(admin.delete_records([TopicPartition("d", 0, 10)]).values())).result(30)
    assert low.low_watermark == 10
    low = next(iter(admin.delete_records([TopicPartition("d", 0, -1)]).values())).result(30)
    assert low.low_watermark == 30
    err = _error(next(iter(admin.delete_records([TopicPartition("d", 0, 99)]).values())))
    assert err.name() == "OFFSET_OUT_OF_RANGE"

    description = admin.describe_cluster().result(30)
    assert sorted(n.id for n in description.nodes) == [1, 2]

    kadmin = KafkaAdminClient(bootstrap_servers=inprocess_cluster.bootstrap)
    try:

        def sizes():
            dirs = kadmin.describe_log_dirs()
            assert "file://" in str(dirs)
            return {
                (t["name"], p["partition_index"]): p["partition_size"]
                for b in dirs
                for d in b["log_dirs"]
                for t in d["topics"]
                for p in t["partitions"]
            }

        assert sizes()[("d", 0)] == 0  # every record was deleted
        for i in range(5):
            producer.produce("d", b"w%d" % i)
        producer.flush(10)
        assert sizes()[("d", 0)] > 0
        assert kadmin.list_partition_reassignments() == {}
        info = kadmin.describe_cluster()
        assert len(info["brokers"]) == 2
    finally:
        kadmin.close()


def test_reassignment_moves_leader_and_data_follows(inprocess_cluster):
    from confluent_kafka import Consumer, Producer
    from kafka import TopicPartition as KTP
    from kafka.admin import KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": inprocess_cluster.bootstrap})
    admin.create_topics([NewTopic("m", 1, 1)])["m"].result(30)
    leader = _wait_leaders(admin, "m", 1)[0]
    target = 2 if leader == 1 else 1
    producer = Producer({"bootstrap.servers": inprocess_cluster.bootstrap, "acks": "all"})
    for i in range(50):
        producer.produce("m", b"a%d" % i)
    producer.flush(30)
    kadmin = KafkaAdminClient(bootstrap_servers=inprocess_cluster.bootstrap)
    try:
        kadmin.alter_partition_reassignments({KTP("m", 0): [target]})
        deadline = time.monotonic() + 30
        while _wait_leaders(admin, "m", 1)[0] != target and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _wait_leaders(admin, "m", 1)[0] == target
    finally:
        kadmin.close()
    for i in range(50):
        producer.produce("m", b"b%d" % i)
    producer.flush(30)
    consumer = Consumer(
        {"bootstrap.servers": inprocess_cluster.bootstrap, "group.id": "g", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe(["m"])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 100 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append((msg.offset(), msg.value()))
    consumer.close()
    assert [o for o, _ in got] == list(range(100))
    assert [v for _, v in got] == [b"a%d" % i for i in range(50)] + [b"b%d" % i for i in range(50)]


def test_delete_by_topic_id_and_full_alter_configs(inprocess_cluster):
    import uuid

    from kafka.admin import KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": inprocess_cluster.bootstrap})
    admin.create_topics([NewTopic("byid", 1, 1, config={"retention.ms": "1000", "retention.bytes": "2048"})])[
        "byid"
    ].result(30)
    _wait_leaders(admin, "byid", 1)

    # AlterConfigs (not incremental) replaces the whole set: keys left out go back to defaults
    res = ConfigResource(ResourceType.TOPIC, "byid", set_config={"retention.ms": "5000"})
    admin.alter_configs([res])[res].result(30)
    configs = next(iter(admin.describe_configs([ConfigResource(ResourceType.TOPIC, "byid")]).values())).result(30)
    assert configs["retention.ms"].value == "5000"
    assert configs["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    # validate_only changes nothing
    res = ConfigResource(ResourceType.TOPIC, "byid", set_config={"retention.ms": "7"})
    admin.alter_configs([res], validate_only=True)[res].result(30)
    configs = next(iter(admin.describe_configs([ConfigResource(ResourceType.TOPIC, "byid")]).values())).result(30)
    assert configs["retention.ms"].value == "5000"
    # broker configs are static
    broker_res = ConfigResource(ResourceType.BROKER, "1", set_config={"num.partitions": "3"})
    err = _error(admin.alter_configs([broker_res])[broker_res])
    assert err.name() == "INVALID_REQUEST" and "num.partitions" in err.str()

    kadmin = KafkaAdminClient(bootstrap_servers=inprocess_cluster.bootstrap)
    try:
        topic_id = uuid.UUID(str(kadmin.describe_topics(["byid"])[0]["topic_id"]))
        answer = kadmin.delete_topics([uuid.uuid4()], raise_errors=False)  # unknown id: answered, nothing deleted
        assert [t["error_code"] for t in answer["topics"]] == [100]  # UNKNOWN_TOPIC_ID
        assert "byid" in kadmin.list_topics()
        kadmin.delete_topics([topic_id])
        deadline = time.monotonic() + 30
        while "byid" in kadmin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "byid" not in kadmin.list_topics()
    finally:
        kadmin.close()


def test_manual_assignment_places_leaders_on_first_replicas(inprocess_cluster):
    from kafka.admin import KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": inprocess_cluster.bootstrap})
    kadmin = KafkaAdminClient(bootstrap_servers=inprocess_cluster.bootstrap)
    try:
        kadmin.create_topics({"placed": {"assignments": {0: [2, 1], 1: [1, 2], 2: [2, 1]}}})
        deadline = time.monotonic() + 30
        while _wait_leaders(admin, "placed", 3) != {0: 2, 1: 1, 2: 2} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _wait_leaders(admin, "placed", 3) == {0: 2, 1: 1, 2: 2}
        # CreatePartitions with an assignment places the new partitions too
        kadmin.create_partitions({"placed": {"count": 5, "assignments": [[1], [2]]}})
        deadline = time.monotonic() + 30
        while _wait_leaders(admin, "placed", 5) != {0: 2, 1: 1, 2: 2, 3: 1, 4: 2} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _wait_leaders(admin, "placed", 5) == {0: 2, 1: 1, 2: 2, 3: 1, 4: 2}
    finally:
        kadmin.close()


def test_topic_configs_take_effect_on_produce(inprocess_cluster):
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaError, Producer

    bootstrap = inprocess_cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [
            NewTopic("small", 1, 1, config={"max.message.bytes": "1000"}),
            NewTopic("stamped", 1, 1, config={"message.timestamp.type": "LogAppendTime"}),
        ]
    )["stamped"].result(30)
    _wait_leaders(admin, "small", 1)
    _wait_leaders(admin, "stamped", 1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "retries": 0})
    results = {}  # by topic: the two deliveries may be reported in either order
    producer.produce("small", b"x" * 4000, on_delivery=lambda err, msg: results.update({msg.topic(): err}))
    producer.produce("stamped", b"v", timestamp=1_000, on_delivery=lambda err, msg: results.update({msg.topic(): err}))
    producer.flush(30)
    assert set(results) == {"small", "stamped"}
    assert results["small"] is not None and results["small"].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert results["stamped"] is None
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ts", "auto.offset.reset": "earliest"})
    consumer.subscribe(["stamped"])
    msg = None
    deadline = time.monotonic() + 30
    while msg is None and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and not m.error():
            msg = m
    consumer.close()
    ts_type, ts = msg.timestamp()
    assert ts_type == TIMESTAMP_LOG_APPEND_TIME and ts > 1_000_000_000_000  # the broker's clock, not 1000
