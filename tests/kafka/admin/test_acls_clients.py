"""ACLs end to end with real clients against an in-process cluster with the authorizer on.

Every client here is `User:ANONYMOUS` (plaintext, no SASL), so the ACLs name that
principal; the principal-specific semantics are covered in test_authorizer.py. What this
proves: confluent-kafka's and kafka-python's admin ACL calls work unchanged, bindings are
stored by the controller and reach every broker, and produce / consume / groups / metadata
/ topic creation are allowed or refused with the errors these clients expect."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KResourceType
from kafka.errors import ClusterAuthorizationFailedError

from automq.broker.controller import acls as model

ME = "User:ANONYMOUS"
SECURE = {
    "brokers": 2,
    "kafka": {"authorizer_class_name": "standard", "allow_everyone_if_no_acl_found": False},
}


def seed(cluster, *bindings: model.AclBinding) -> None:
    """ACLs written straight to the controller (an operator's path), then seen by every broker."""
    results = cluster.run(cluster.brokers[0].cluster.create_acls(list(bindings)))
    assert all(code is None for code, _ in results), results
    keys = {x.key() for x in bindings}
    deadline = time.monotonic() + 10
    while not all(keys <= {a.key() for a in b.metadata.acls} for b in cluster.brokers):
        assert time.monotonic() < deadline, "ACLs did not reach every broker"
        time.sleep(0.05)


def binding(rtype, name, op, perm=model.PermissionType.ALLOW, pattern=model.PatternType.LITERAL):
    return model.AclBinding(int(rtype), name, int(pattern), ME, "*", int(op), int(perm))


def produce(bootstrap: str, topic: str, n: int = 3) -> list:
    errors: list = []
    p = Producer(
        {"bootstrap.servers": bootstrap, "message.timeout.ms": 8000, "topic.metadata.refresh.interval.ms": 500}
    )
    for i in range(n):
        p.produce(topic, f"v{i}".encode(), on_delivery=lambda err, msg: errors.append(err))
    p.flush(15)
    return errors


def consume(bootstrap: str, topic: str, group: str, want: int, timeout: float = 15.0) -> tuple[list[bytes], list]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 500,
        }
    )
    c.subscribe([topic])
    values, errors = [], []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and len(values) < want and not errors:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                errors.append(msg.error().code())
            else:
                values.append(msg.value())
    finally:
        c.close()
    return values, errors


@pytest.mark.parametrize("inprocess_cluster", [SECURE], indirect=True)
def test_acl_matrix_with_confluent_and_kafka_python(inprocess_cluster) -> None:
    cluster = inprocess_cluster
    bs = cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bs})
    any_filter = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )

    # no ACL at all: nothing is allowed, not even to manage ACLs
    grant = AclBinding(
        ResourceType.GROUP, "g-ok", ResourcePatternType.LITERAL, ME, "*", AclOperation.READ, AclPermissionType.ALLOW
    )
    with pytest.raises(KafkaException) as denied:
        next(iter(admin.create_acls([grant]).values())).result(timeout=15)
    assert denied.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    errors = produce(bs, "pub-a", 1)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # (librdkafka drops DescribeAcls' top-level error code; kafka-python raises it)
    kadmin = KafkaAdminClient(bootstrap_servers=bs, client_id=f"acl-{uuid.uuid4().hex[:6]}")
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            kadmin.describe_acls(
                ACLFilter(
                    principal=None,
                    host=None,
                    operation=ACLOperation.ANY,
                    permission_type=ACLPermissionType.ANY,
                    resource_pattern=ResourcePatternFilter(KResourceType.ANY, None, ACLResourcePatternType.ANY),
                )
            )
    finally:
        kadmin.close()

    # the operator lets this principal manage ACLs and describe the cluster
    seed(
        cluster,
        binding(model.ResourceType.CLUSTER, "kafka-cluster", model.AclOperation.ALTER),
        binding(model.ResourceType.CLUSTER, "kafka-cluster", model.AclOperation.DESCRIBE),
    )
    topic_acls = [
        AclBinding(ResourceType.TOPIC, "pub-", ResourcePatternType.PREFIXED, ME, "*", op, AclPermissionType.ALLOW)
        for op in (AclOperation.CREATE, AclOperation.WRITE, AclOperation.READ)
    ] + [
        AclBinding(
            ResourceType.TOPIC, "pub-b", ResourcePatternType.LITERAL, ME, "*", AclOperation.READ, AclPermissionType.DENY
        ),
        AclBinding(
            ResourceType.GROUP, "g-ok", ResourcePatternType.LITERAL, ME, "*", AclOperation.READ, AclPermissionType.ALLOW
        ),
    ]
    for fut in admin.create_acls(topic_acls).values():
        assert fut.result(timeout=15) is None
    described = admin.describe_acls(any_filter).result(timeout=15)
    assert len(described) == 7
    assert {(a.name, a.resource_pattern_type, a.operation, a.permission_type) for a in described} >= {
        ("pub-b", ResourcePatternType.LITERAL, AclOperation.READ, AclPermissionType.DENY),
        ("pub-", ResourcePatternType.PREFIXED, AclOperation.WRITE, AclPermissionType.ALLOW),
    }
    # a bad binding is refused on its own (a prefixed CLUSTER ACL)
    bad = AclBinding(
        ResourceType.BROKER,
        "kafka-cluster",
        ResourcePatternType.PREFIXED,
        ME,
        "*",
        AclOperation.ALTER,
        AclPermissionType.ALLOW,
    )
    with pytest.raises(KafkaException) as invalid:
        next(iter(admin.create_acls([bad]).values())).result(timeout=15)
    assert invalid.value.args[0].code() == KafkaError.INVALID_REQUEST

    # the admin creates a topic under the allowed prefix; another name needs CREATE it lacks
    created = admin.create_topics([NewTopic("pub-a", 2), NewTopic("pub-b", 1), NewTopic("private", 1)])
    created["pub-a"].result(timeout=15)
    created["pub-b"].result(timeout=15)
    with pytest.raises(KafkaException) as no_create:
        created["private"].result(timeout=15)
    assert no_create.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    cluster.run(cluster.brokers[0].cluster.create_topic("secret", 1, {}))

    # metadata: topics this principal may not DESCRIBE are hidden (pub-b stays visible:
    # READ is denied but WRITE, which implies DESCRIBE, is allowed)
    deadline = time.monotonic() + 10
    while "secret" not in {t.name for b in cluster.brokers for t in b.metadata.topics}:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    listed = set(admin.list_topics(timeout=10).topics)
    assert {"pub-a", "pub-b"} <= listed and "secret" not in listed and "__consumer_offsets" not in listed

    assert produce(bs, "pub-a", 5) == [None] * 5
    assert produce(bs, "pub-b", 2) == [None] * 2
    values, errors = consume(bs, "pub-a", "g-ok", 5)
    assert sorted(values) == [f"v{i}".encode() for i in range(5)] and not errors
    # deny wins over the prefixed allow
    values, errors = consume(bs, "pub-b", "g-ok", 1)
    assert values == [] and errors == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # a group without an ACL
    values, errors = consume(bs, "pub-a", "g-other", 1)
    assert values == [] and errors == [KafkaError.GROUP_AUTHORIZATION_FAILED]

    # kafka-python's admin: describe, delete the deny, create again
    kadmin = KafkaAdminClient(bootstrap_servers=bs, client_id=f"acl-{uuid.uuid4().hex[:6]}")
    try:
        deny_filter = ACLFilter(
            principal=ME,
            host="*",
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.DENY,
            resource_pattern=ResourcePatternFilter(KResourceType.TOPIC, None, ACLResourcePatternType.ANY),
        )
        found, error = kadmin.describe_acls(deny_filter)
        assert error.errno == 0 and [(a.resource_pattern.resource_name, a.operation) for a in found] == [
            ("pub-b", ACLOperation.READ)
        ]
        deleted = kadmin.delete_acls([deny_filter])
        assert [(e.errno, [a.resource_pattern.resource_name for a in matches]) for _, matches, e in deleted] == [
            (0, ["pub-b"])
        ]
        values, errors = consume(bs, "pub-b", "g-ok", 2)
        assert sorted(values) == [b"v0", b"v1"] and not errors
        result = kadmin.create_acls(
            [
                ACL(
                    principal=ME,
                    host="*",
                    operation=ACLOperation.DESCRIBE,
                    permission_type=ACLPermissionType.ALLOW,
                    resource_pattern=ResourcePattern(KResourceType.TOPIC, "secret", ACLResourcePatternType.LITERAL),
                )
            ]
        )
        assert len(result["succeeded"]) == 1 and not result["failed"]
    finally:
        kadmin.close()
    deadline = time.monotonic() + 10
    while "secret" not in set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, "a new DESCRIBE ACL did not make the topic visible"
        time.sleep(0.2)


@pytest.mark.parametrize("inprocess_cluster", [1], indirect=True)
def test_acl_apis_without_authorizer_answer_security_disabled(inprocess_cluster) -> None:
    admin = AdminClient({"bootstrap.servers": inprocess_cluster.bootstrap})
    grant = AclBinding(
        ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, ME, "*", AclOperation.READ, AclPermissionType.ALLOW
    )
    with pytest.raises(KafkaException) as exc:
        next(iter(admin.create_acls([grant]).values())).result(timeout=15)
    assert exc.value.args[0].code() == KafkaError.SECURITY_DISABLED
    assert produce(inprocess_cluster.bootstrap, "open-topic", 2) == [None, None]


@pytest.mark.parametrize("inprocess_cluster", [{"brokers": 1, "kafka": SECURE["kafka"]}], indirect=True)
def test_denied_for_aiokafka_kcat_and_idempotent_librdkafka(inprocess_cluster) -> None:
    import asyncio
    import shutil
    import subprocess

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import TopicAuthorizationFailedError

    bs = inprocess_cluster.bootstrap

    async def aiokafka_send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bs, request_timeout_ms=10_000)
        await producer.start()
        try:
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait("closed", b"v")
        finally:
            await producer.stop()

    asyncio.run(aiokafka_send())

    # an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "message.timeout.ms": 5000})
    p.produce("closed", b"v")
    deadline = time.monotonic() + 20
    with pytest.raises(KafkaException) as fatal:  # librdkafka raises its fatal error from poll()
        while time.monotonic() < deadline:
            p.poll(0.2)
    error = fatal.value.args[0]
    assert error.fatal() and error.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, error

    kcat = shutil.which("kcat")
    if kcat is not None:  # installed by scripts/install-system-deps.sh
        done = subprocess.run(
            [kcat, "-b", bs, "-P", "-t", "closed", "-m", "10"], input=b"v\n", capture_output=True, timeout=60
        )
        assert done.returncode != 0
        assert b"authorization failed" in done.stderr.lower(), done.stderr


@pytest.mark.parametrize("inprocess_cluster", [{"brokers": 1, "kafka": SECURE["kafka"]}], indirect=True)
def test_kip848_consumer_needs_group_read_and_topic_describe(inprocess_cluster) -> None:
    cluster = inprocess_cluster
    seed(
        cluster,
        binding(model.ResourceType.CLUSTER, "kafka-cluster", model.AclOperation.CREATE),
        binding(model.ResourceType.TOPIC, "k-ok", model.AclOperation.WRITE),
        binding(model.ResourceType.TOPIC, "k-ok", model.AclOperation.READ),
        binding(model.ResourceType.TOPIC, "k-no", model.AclOperation.WRITE),
        binding(model.ResourceType.GROUP, "g848", model.AclOperation.READ),
    )
    bs = cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bs})
    for f in admin.create_topics([NewTopic("k-ok", 1), NewTopic("k-no", 1)]).values():
        f.result(30)
    assert produce(bs, "k-ok", 3) == [None] * 3

    def consume848(topic: str, group: str) -> tuple[int, list]:
        c = Consumer(
            {"bootstrap.servers": bs, "group.id": group, "group.protocol": "consumer", "auto.offset.reset": "earliest"}
        )
        c.subscribe([topic])
        got, errors = 0, []
        deadline = time.monotonic() + 30
        try:
            while got < 3 and not errors and time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    errors.append(msg.error().code())
                else:
                    got += 1
        finally:
            c.close()
        return got, errors

    assert consume848("k-ok", "g848") == (3, [])
    got, errors = consume848("k-ok", "other")
    assert got == 0 and errors and errors[0] == KafkaError.GROUP_AUTHORIZATION_FAILED
    got, errors = consume848("k-no", "g848")  # WRITE implies DESCRIBE, but READ is missing
    assert got == 0 and errors and errors[0] == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # on the wire: a heartbeat subscribing to a topic the client may not DESCRIBE
    import datetime
    import socket
    import struct

    from kio.schema.consumer_group_heartbeat.v0.request import ConsumerGroupHeartbeatRequest

    from automq.broker.kafka import codec

    cluster.run(cluster.brokers[0].cluster.create_topic("k-secret", 1, {}))
    request = ConsumerGroupHeartbeatRequest(
        group_id="g848",
        member_id="",
        member_epoch=0,
        rebalance_timeout=datetime.timedelta(seconds=30),
        subscribed_topic_names=("k-ok", "k-secret"),
        topic_partitions=(),
    )
    with socket.create_connection(("127.0.0.1", cluster.ports[0]), timeout=10) as sock:
        frame = codec.encode_request(7, request)
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        _, response = codec.decode_response(sock.recv(size, socket.MSG_WAITALL), ConsumerGroupHeartbeatRequest)
    assert response.error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED and "k-secret" in response.error_message
