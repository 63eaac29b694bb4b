"""The authorizer's decisions (Kafka's StandardAuthorizer semantics), the principal passed in:
super users, deny over allow, literal / wildcard / prefixed patterns, wildcard principal and
host, implied operations, allow.everyone.if.no.acl.found, the cache following ACL changes,
authorize-by-resource-type (idempotent producers) and authorized-operations bit fields."""

from __future__ import annotations

import pytest

from automq.broker.config import KafkaConfig
from automq.broker.controller.acls import AclBinding, AclOperation, PatternType, PermissionType, ResourceType
from automq.broker.kafka.authorizer import Authorizer

T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY
Op = AclOperation
ALICE, BOB = "User:alice", "User:bob"


def acl(rtype, name, principal, op, perm=ALLOW, pattern=LIT, host="*") -> AclBinding:
    return AclBinding(int(rtype), name, int(pattern), principal, host, int(op), int(perm))


def authorizer(*acls: AclBinding, **kafka) -> Authorizer:
    a = Authorizer(KafkaConfig(authorizer_class_name="standard", **kafka))
    a.update(tuple(acls))
    return a


def test_no_acl_denies_unless_allow_everyone() -> None:
    assert not authorizer().authorize(ALICE, "10.0.0.1", Op.READ, T, "t")
    assert authorizer(allow_everyone_if_no_acl_found=True).authorize(ALICE, "10.0.0.1", Op.READ, T, "t")
    # an ACL on the resource for someone else: allow-everyone no longer applies to it
    a = authorizer(acl(T, "t", BOB, Op.READ), allow_everyone_if_no_acl_found=True)
    assert not a.authorize(ALICE, "h", Op.READ, T, "t")
    assert a.authorize(ALICE, "h", Op.READ, T, "other")


def test_super_users_bypass_everything_including_deny() -> None:
    a = authorizer(acl(T, "t", ALICE, Op.ALL, DENY), super_users="User:alice; User:root")
    assert a.authorize(ALICE, "h", Op.DELETE, T, "t")
    assert a.authorize("User:root", "h", Op.ALTER, C, "kafka-cluster")
    assert not a.authorize(BOB, "h", Op.READ, T, "t")


@pytest.mark.parametrize(
    ("acls", "op", "name", "expected"),
    [
        ([acl(T, "t", ALICE, Op.READ)], Op.READ, "t", True),
        ([acl(T, "t", ALICE, Op.READ)], Op.WRITE, "t", False),
        ([acl(T, "t", ALICE, Op.READ)], Op.READ, "t2", False),
        ([acl(T, "*", ALICE, Op.READ)], Op.READ, "anything", True),
        ([acl(T, "pay", ALICE, Op.WRITE, pattern=PRE)], Op.WRITE, "payments", True),
        ([acl(T, "pay", ALICE, Op.WRITE, pattern=PRE)], Op.WRITE, "pa", False),
        ([acl(T, "pay", ALICE, Op.WRITE, pattern=PRE)], Op.WRITE, "xpayments", False),
        ([acl(T, "t", "User:*", Op.READ)], Op.READ, "t", True),
        ([acl(T, "t", ALICE, Op.ALL)], Op.ALTER_CONFIGS, "t", True),
        # deny wins over allow, whatever the pattern of either
        ([acl(T, "t", ALICE, Op.READ), acl(T, "t", ALICE, Op.READ, DENY)], Op.READ, "t", False),
        ([acl(T, "p", ALICE, Op.ALL, pattern=PRE), acl(T, "pay", ALICE, Op.WRITE, DENY, PRE)], Op.WRITE, "pay1", False),
        ([acl(T, "p", ALICE, Op.ALL, pattern=PRE), acl(T, "pay", ALICE, Op.WRITE, DENY, PRE)], Op.READ, "pay1", True),
        ([acl(T, "t", ALICE, Op.READ), acl(T, "*", "User:*", Op.ALL, DENY)], Op.READ, "t", False),
        # implied operations: allows imply DESCRIBE / DESCRIBE_CONFIGS; denies imply nothing
        ([acl(T, "t", ALICE, Op.READ)], Op.DESCRIBE, "t", True),
        ([acl(T, "t", ALICE, Op.WRITE)], Op.DESCRIBE, "t", True),
        ([acl(T, "t", ALICE, Op.DELETE)], Op.DESCRIBE, "t", True),
        ([acl(T, "t", ALICE, Op.ALTER)], Op.DESCRIBE, "t", True),
        ([acl(T, "t", ALICE, Op.CREATE)], Op.DESCRIBE, "t", False),
        ([acl(T, "t", ALICE, Op.ALTER_CONFIGS)], Op.DESCRIBE_CONFIGS, "t", True),
        ([acl(T, "t", ALICE, Op.DESCRIBE)], Op.READ, "t", False),
        ([acl(T, "t", ALICE, Op.READ), acl(T, "t", ALICE, Op.READ, DENY)], Op.DESCRIBE, "t", True),
        ([acl(T, "t", ALICE, Op.DESCRIBE), acl(T, "t", ALICE, Op.ALL, DENY)], Op.DESCRIBE, "t", False),
        # resource types do not leak into each other
        ([acl(G, "t", ALICE, Op.READ)], Op.READ, "t", False),
    ],
)
def test_matrix(acls, op, name, expected) -> None:
    assert authorizer(*acls).authorize(ALICE, "10.0.0.1", op, T, name) is expected


def test_hosts() -> None:
    a = authorizer(acl(T, "t", ALICE, Op.READ, host="10.0.0.1"), acl(T, "t", ALICE, Op.READ, DENY, host="10.0.0.9"))
    assert a.authorize(ALICE, "10.0.0.1", Op.READ, T, "t")
    assert not a.authorize(ALICE, "10.0.0.2", Op.READ, T, "t")
    b = authorizer(acl(T, "t", ALICE, Op.READ), acl(T, "t", ALICE, Op.READ, DENY, host="10.0.0.9"))
    assert b.authorize(ALICE, "10.0.0.1", Op.READ, T, "t")
    assert not b.authorize(ALICE, "10.0.0.9", Op.READ, T, "t")


def test_group_and_transactional_id_resources() -> None:
    a = authorizer(acl(G, "app-", ALICE, Op.READ, pattern=PRE), acl(X, "tx-1", ALICE, Op.WRITE))
    assert a.authorize(ALICE, "h", Op.READ, G, "app-orders")
    assert a.authorize(ALICE, "h", Op.DESCRIBE, G, "app-orders")
    assert not a.authorize(ALICE, "h", Op.DELETE, G, "app-orders")
    assert not a.authorize(BOB, "h", Op.READ, G, "app-orders")
    assert a.authorize(ALICE, "h", Op.WRITE, X, "tx-1")
    assert a.authorize(ALICE, "h", Op.DESCRIBE, X, "tx-1")
    assert not a.authorize(ALICE, "h", Op.WRITE, X, "tx-2")


def test_cache_follows_acl_changes() -> None:
    a = authorizer(acl(T, "t", ALICE, Op.READ))
    assert a.authorize(ALICE, "h", Op.READ, T, "t")
    a.update((acl(T, "t", ALICE, Op.READ), acl(T, "t", ALICE, Op.READ, DENY)))
    assert not a.authorize(ALICE, "h", Op.READ, T, "t")
    a.update(())
    assert not a.authorize(ALICE, "h", Op.READ, T, "t")


def test_authorize_any_for_idempotent_producers() -> None:
    assert authorizer(acl(T, "t", ALICE, Op.WRITE)).authorize_any(ALICE, "h", Op.WRITE, T)
    assert authorizer(acl(T, "p", ALICE, Op.ALL, pattern=PRE)).authorize_any(ALICE, "h", Op.WRITE, T)
    assert not authorizer(acl(T, "t", ALICE, Op.READ)).authorize_any(ALICE, "h", Op.WRITE, T)
    assert not authorizer(acl(T, "t", BOB, Op.WRITE)).authorize_any(ALICE, "h", Op.WRITE, T)
    # an allow fully covered by a deny does not count
    covered = authorizer(acl(T, "pay", ALICE, Op.WRITE, pattern=PRE), acl(T, "p", ALICE, Op.WRITE, DENY, PRE))
    assert not covered.authorize_any(ALICE, "h", Op.WRITE, T)
    partly = authorizer(acl(T, "pay", ALICE, Op.WRITE, pattern=PRE), acl(T, "pay1", ALICE, Op.WRITE, DENY))
    assert partly.authorize_any(ALICE, "h", Op.WRITE, T)


def test_authorized_operations_bits() -> None:
    a = authorizer(acl(T, "t", ALICE, Op.READ), acl(T, "t", ALICE, Op.ALTER_CONFIGS))
    bits = a.authorized_operations(ALICE, "h", T, "t")
    allowed = {op for op in Op if bits & (1 << int(op))}
    assert allowed == {Op.READ, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS}


def test_denials_are_counted_and_audited(caplog) -> None:
    a = authorizer(acl(T, "t", ALICE, Op.READ, DENY))
    with caplog.at_level("INFO", logger="automq.authorizer"):
        assert not a.authorize(ALICE, "10.1.1.1", Op.READ, T, "t")
        assert not a.authorize(ALICE, "10.1.1.1", Op.READ, T, "t")  # cached: not logged again
    lines = [r.getMessage() for r in caplog.records if r.name == "automq.authorizer"]
    assert len(lines) == 1 and "Denied" in lines[0] and "User:alice" in lines[0] and "TOPIC:t" in lines[0]
    assert a.denials.labels("TOPIC")._value.get() == 1


def test_audit_log_option_logs_every_decision(caplog) -> None:
    a = authorizer(acl(T, "t", ALICE, Op.READ), authorizer_audit_log=True)
    with caplog.at_level("INFO", logger="automq.authorizer"):
        assert a.authorize(ALICE, "10.1.1.1", Op.READ, T, "t")
        assert a.authorize(ALICE, "10.1.1.1", Op.READ, T, "t")  # cached, still logged
        assert not a.authorize(BOB, "10.1.1.1", Op.READ, T, "t")
    lines = [r.getMessage() for r in caplog.records if r.name == "automq.authorizer"]
    assert [("Allowed" in line, "Denied" in line) for line in lines] == [(True, False), (True, False), (False, True)]
