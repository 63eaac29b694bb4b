"""The I/O-free checks of the admin handlers, fed real kio request objects."""

import pytest
from kio.schema.create_partitions.v3 import request as cp
from kio.schema.create_topics.v7 import request as ct
from kio.schema.errors import ErrorCode

from automq.broker.config import parse_config
from automq.broker.controller.protocol import (
    BrokerInfo,
    Endpoint,
    InvalidTopicError,
    MetadataImage,
    PartitionInfo,
    ReassignmentInProgressError,
    TopicExistsError,
    TopicInfo,
)
from automq.broker.kafka.handlers import admin
from automq.broker.kafka.handlers.admin import AdminError
from automq.broker.kafka.partitions import NotLeaderError
from automq.broker.topic_configs import TopicConfigError


def image(*topics: tuple[str, int], brokers=(1, 2), fenced=()):
    return MetadataImage(
        version=3,
        cluster_id="c",
        controller_id=0,
        brokers=tuple(
            BrokerInfo(
                b, 1, (Endpoint("PLAINTEXT", "127.0.0.1", 9000 + b),), state="fenced" if b in fenced else "active"
            )
            for b in (*brokers, *fenced)
        ),
        topics=tuple(
            TopicInfo(
                name,
                "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
                tuple(PartitionInfo(name, i, 10 + i, 1, 0) for i in range(n)),
            )
            for name, n in topics
        ),
    )


KAFKA = parse_config({"node_id": 1, "kafka": {"num_partitions": 3}}).kafka


def topic(name="t", partitions=-1, rf=-1, assignments=(), configs=()):
    return ct.CreatableTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=rf,
        assignments=tuple(
            ct.CreatableReplicaAssignment(partition_index=i, broker_ids=tuple(b)) for i, b in assignments
        ),
        configs=tuple(ct.CreatableTopicConfig(name=k, value=v) for k, v in configs),
    )


@pytest.mark.parametrize(
    "name,fragment",
    [
        ("", "can't be empty"),
        (".", 'cannot be "." or ".."'),
        ("..", 'cannot be "." or ".."'),
        ("a" * 250, "can't be longer than 249 characters"),
        ("a b", "contains a character other than ASCII alphanumerics"),
        ("tópico", "contains a character other than ASCII alphanumerics"),
        ("a/b", "contains a character other than ASCII alphanumerics"),
    ],
)
def test_illegal_topic_names(name, fragment):
    with pytest.raises(AdminError) as err:
        admin.validate_topic_name(name)
    assert err.value.error_code == ErrorCode.invalid_topic_exception
    assert fragment in err.value.message


def test_legal_topic_names():
    for name in ("a", "a" * 249, "A.b_c-9", "..."):
        admin.validate_topic_name(name)


def test_plan_defaults_and_rf_reported_as_requested():
    plan = admin.plan_create_topic(topic(), image(), KAFKA)
    assert (plan.partitions, plan.replication_factor, plan.configs, plan.leaders) == (3, 1, {}, None)
    plan = admin.plan_create_topic(
        topic(partitions=5, rf=3, configs=[("retention.ms", "1000")]), image(brokers=(1, 2, 3)), KAFKA
    )
    assert (plan.partitions, plan.replication_factor, plan.configs) == (5, 3, {"retention.ms": "1000"})


def test_rf_above_live_brokers_is_refused():
    with pytest.raises(admin.AdminError, match="Replication factor: 3 larger than available brokers: 2") as err:
        admin.plan_create_topic(topic(rf=3), image(), KAFKA)
    assert err.value.error_code == ErrorCode.invalid_replication_factor
    # a fenced broker does not count
    with pytest.raises(admin.AdminError):
        admin.plan_create_topic(topic(rf=2), image(fenced=(2,)), KAFKA)
    assert admin.plan_create_topic(topic(rf=2), image(), KAFKA).replication_factor == 2


@pytest.mark.parametrize(
    "kwargs,code",
    [
        (dict(partitions=0), ErrorCode.invalid_partitions),
        (dict(partitions=-2), ErrorCode.invalid_partitions),
        (dict(rf=0), ErrorCode.invalid_replication_factor),
        (dict(rf=-3), ErrorCode.invalid_replication_factor),
        (dict(partitions=2, assignments=[(0, [1]), (1, [2])]), ErrorCode.invalid_request),
        (dict(assignments=[(0, [1]), (2, [2])]), ErrorCode.invalid_replica_assignment),
        (dict(assignments=[(0, [1]), (1, [7])]), ErrorCode.invalid_replica_assignment),
        (dict(assignments=[(0, [1, 1])]), ErrorCode.invalid_replica_assignment),
        (dict(assignments=[(0, [])]), ErrorCode.invalid_replica_assignment),
        (dict(assignments=[(0, [1, 2]), (1, [2])]), ErrorCode.invalid_replica_assignment),
        (dict(assignments=[(0, [3])]), ErrorCode.invalid_replica_assignment),  # fenced broker
    ],
)
def test_plan_rejections(kwargs, code):
    with pytest.raises(AdminError) as err:
        admin.plan_create_topic(topic(**kwargs), image(fenced=(3,)), KAFKA)
    assert err.value.error_code == code


def test_plan_existing_colliding_and_bad_config():
    with pytest.raises(AdminError) as err:
        admin.plan_create_topic(topic("t"), image(("t", 1)), KAFKA)
    assert err.value.error_code == ErrorCode.topic_already_exists
    with pytest.raises(AdminError) as err:
        admin.plan_create_topic(topic("a.b"), image(("a_b", 1)), KAFKA)
    assert (
        err.value.error_code == ErrorCode.invalid_topic_exception
        and "collides with existing topic: a_b" in err.value.message
    )
    with pytest.raises(TopicConfigError, match="retention.ms"):
        admin.plan_create_topic(topic(configs=[("retention.ms", "soon")]), image(), KAFKA)


def test_plan_manual_assignment_leaders_are_first_replicas():
    plan = admin.plan_create_topic(topic(assignments=[(1, [1, 2]), (0, [2, 1])]), image(), KAFKA)
    assert (plan.partitions, plan.replication_factor, plan.leaders) == (2, 2, (2, 1))


def cp_topic(name, count, assignments=None):
    return cp.CreatePartitionsTopic(
        name=name,
        count=count,
        assignments=None
        if assignments is None
        else tuple(cp.CreatePartitionsAssignment(broker_ids=tuple(a)) for a in assignments),
    )


def test_plan_create_partitions():
    img = image(("t", 2))
    info, leaders = admin.plan_create_partitions(cp_topic("t", 4), img)
    assert info.name == "t" and leaders is None
    _, leaders = admin.plan_create_partitions(cp_topic("t", 4, [[2], [1, 2]]), img)
    assert leaders == (2, 1)
    cases = [
        (cp_topic("nope", 3), ErrorCode.unknown_topic_or_partition, "does not exist"),
        (
            cp_topic("t", 1),
            ErrorCode.invalid_partitions,
            "Topic currently has 2 partitions, which is higher than the requested 1.",
        ),
        (cp_topic("t", 2), ErrorCode.invalid_partitions, "Topic already has 2 partitions."),
        (
            cp_topic("t", 4, [[1]]),
            ErrorCode.invalid_replica_assignment,
            "Increasing the number of partitions by 2 but 1 assignments",
        ),
        (cp_topic("t", 3, [[9]]), ErrorCode.invalid_replica_assignment, "not alive"),
    ]
    for t, code, message in cases:
        with pytest.raises(AdminError) as err:
            admin.plan_create_partitions(t, img)
        assert err.value.error_code == code and message in err.value.message


def test_error_mapping():
    assert admin.error_of(TopicExistsError("x"))[0] == ErrorCode.topic_already_exists
    assert admin.error_of(InvalidTopicError("x"))[0] == ErrorCode.invalid_topic_exception
    assert admin.error_of(ReassignmentInProgressError("x"))[0] == ErrorCode.reassignment_in_progress
    assert admin.error_of(NotLeaderError("x"))[0] == ErrorCode.not_leader_or_follower
    assert admin.error_of(TimeoutError())[0] == ErrorCode.request_timed_out
    assert admin.error_of(ConnectionRefusedError("no"))[0] == ErrorCode.request_timed_out
    assert admin.error_of(TopicConfigError("Unknown topic config name: q")) == (
        ErrorCode.invalid_config,
        "Unknown topic config name: q",
    )
    assert admin.error_of(RuntimeError("boom"))[0] == ErrorCode.unknown_server_error


def test_log_dir_name_hides_query():
    assert admin.log_dir_name("s3://bucket/prefix?endpoint=http://x&secret=y") == "s3://bucket/prefix"
    assert admin.log_dir_name("file:///var/lib/automq/objects") == "file:///var/lib/automq/objects"
