"""ACLs and quotas with authenticated principals: SASL PLAIN users (alice, a super user, and
bob), the anonymous principal of a plaintext listener and a TLS client certificate's mapped
principal, on one secured in-process broker with the authorizer on. Real clients
(confluent-kafka) throughout; quotas keyed by the authenticated user name."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from conftest import ThreadedCluster, secure_configs


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory, pki):
    tmp = tmp_path_factory.mktemp("acl-secure")
    controller_cfg, broker_raw = secure_configs(tmp, pki)
    broker_raw["kafka"].update(
        {
            "authorizer_class_name": "standard",
            "super_users": "User:alice",
            "quota_window_num": 2,
            "quota_window_size_seconds": 1,
        }
    )
    # the certificate's principal stays its full DN here (User:CN=alice,O=acme), not the
    # SASL super user alice that the shared fixture's mapping rule would make of it
    broker_raw["tls"] = {**broker_raw["tls"], "principal_mapping_rules": ["DEFAULT"]}
    cluster = ThreadedCluster(controller_cfg, broker_raw).start()
    yield cluster
    cluster.stop()


def sasl(cluster, user: str) -> dict:
    return {
        "bootstrap.servers": cluster.bootstrap("SASL"),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": f"{user}-secret",
    }


def produce(conf: dict, topic: str, n: int = 3, **extra) -> list:
    results: list = []
    p = Producer({**conf, "message.timeout.ms": 8000, **extra})
    for i in range(n):
        p.produce(topic, f"v{i}".encode(), on_delivery=lambda err, msg: results.append(err))
    p.flush(20)
    return [None if e is None else e.code() for e in results]


def consume(conf: dict, topic: str, group: str, want: int) -> tuple[int, list]:
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got, errors = 0, []
    deadline = time.monotonic() + 20
    try:
        while got < want and not errors and time.monotonic() < deadline:
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


def allow(rtype, name, principal, op, pattern=ResourcePatternType.LITERAL, host="*", perm=AclPermissionType.ALLOW):
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def test_principals_from_sasl_tls_and_plaintext_are_authorized_separately(acl_cluster, pki) -> None:
    admin = AdminClient(sasl(acl_cluster, "alice"))  # a super user
    for f in admin.create_topics([NewTopic(t, 1) for t in ("team-a", "team-b", "hosty")]).values():
        f.result(30)
    acls = [
        allow(ResourceType.TOPIC, "team-", "User:bob", AclOperation.WRITE, ResourcePatternType.PREFIXED),
        allow(ResourceType.TOPIC, "team-", "User:bob", AclOperation.READ, ResourcePatternType.PREFIXED),
        allow(ResourceType.TOPIC, "team-b", "User:bob", AclOperation.READ, perm=AclPermissionType.DENY),  # deny wins
        allow(ResourceType.GROUP, "bob-", "User:bob", AclOperation.READ, ResourcePatternType.PREFIXED),
        allow(ResourceType.TOPIC, "hosty", "User:bob", AclOperation.WRITE, host="10.9.9.9"),  # another host
        allow(ResourceType.TOPIC, "team-a", "User:ANONYMOUS", AclOperation.DESCRIBE),
    ]
    for f in admin.create_acls(acls).values():
        assert f.result(30) is None

    bob = sasl(acl_cluster, "bob")
    assert produce(bob, "team-a") == [None] * 3
    assert produce(bob, "team-b") == [None] * 3
    assert produce(bob, "hosty", 1) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert consume(bob, "team-a", "bob-1", 3) == (3, [])
    assert consume(bob, "team-b", "bob-2", 1) == (0, [KafkaError.TOPIC_AUTHORIZATION_FAILED])
    assert consume(bob, "team-a", "other-group", 1) == (0, [KafkaError.GROUP_AUTHORIZATION_FAILED])
    # bob may not manage ACLs; alice (super user) may do anything
    bob_admin = AdminClient(bob)
    with pytest.raises(KafkaException) as denied:
        next(iter(bob_admin.create_acls([acls[0]]).values())).result(30)
    assert denied.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert produce(sasl(acl_cluster, "alice"), "team-b") == [None] * 3

    # the plaintext listener's principal is User:ANONYMOUS: it sees team-a (DESCRIBE), writes nothing
    anonymous = {"bootstrap.servers": acl_cluster.bootstrap("INTERNAL")}
    assert produce(anonymous, "team-a", 1) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    topics = AdminClient(anonymous).list_topics(timeout=10).topics
    assert "team-a" in topics and "team-b" not in topics
    # a TLS client certificate's principal is its subject DN (DEFAULT mapping here): no ACL for
    # it yet, then one naming exactly that principal
    tls = {
        "bootstrap.servers": acl_cluster.bootstrap("TLS"),
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca.path),
        "ssl.certificate.location": str(pki.client_cert),
        "ssl.key.location": str(pki.client_key),
    }
    assert produce(tls, "team-a", 1) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    cert_acl = allow(ResourceType.TOPIC, "team-a", "User:CN=alice,O=acme", AclOperation.WRITE)
    assert next(iter(admin.create_acls([cert_acl]).values())).result(30) is None
    assert produce(tls, "team-a", 1) == [None]
    no_cert = {k: v for k, v in tls.items() if not k.startswith("ssl.certificate") and not k.startswith("ssl.key")}
    assert produce(no_cert, "team-a", 1) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]  # User:ANONYMOUS


def test_user_quota_throttles_that_user_only(acl_cluster) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest

    kadmin = KafkaAdminClient(
        bootstrap_servers=acl_cluster.bootstrap("SASL"),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="alice",
        sasl_plain_password="alice-secret",
    )
    Entry = AlterClientQuotasRequest.EntryData
    try:
        response = kadmin._manager.run(
            kadmin._manager.send,
            AlterClientQuotasRequest(
                entries=[
                    Entry(
                        entity=[Entry.EntityData(entity_type="user", entity_name="bob")],
                        ops=[Entry.OpData(key="producer_byte_rate", value=50_000.0, remove=False)],
                    )
                ],
                validate_only=False,
            ),
        )
    finally:
        kadmin.close()
    assert [e.error_code for e in response.entries] == [0]
    deadline = time.monotonic() + 10
    while not acl_cluster.broker.broker.quotas.active:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    def throttles(user: str) -> list[int]:
        seen: list[int] = []
        chunk = "x" * 10_000
        p = Producer({**sasl(acl_cluster, user), "linger.ms": 5, "throttle_cb": lambda e: seen.append(e.throttle_time)})
        for _ in range(60):
            p.produce("team-a", chunk.encode())
            p.poll(0)
        assert p.flush(60) == 0
        p.poll(0.5)
        return [t for t in seen if t > 0]

    assert throttles("bob")  # 600 kB at 50 kB/s: throttled
    assert not throttles("alice")  # another user: no quota
