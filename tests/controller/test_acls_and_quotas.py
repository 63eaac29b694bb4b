"""ACLs and client quotas in the controller: validation per item, filters, durability (log
replay and snapshots), the HTTP API, and the metadata image that carries them to brokers."""

from __future__ import annotations

import pytest

from automq.broker.controller import security
from automq.broker.controller.acls import (
    AclBinding,
    AclFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.commands import Tx
from automq.broker.controller.quotas import InvalidQuotaError, filter_matches, make_entity, resolve
from automq.broker.controller.state import MetadataState

T, G, C = int(ResourceType.TOPIC), int(ResourceType.GROUP), int(ResourceType.CLUSTER)
LIT, PRE, ANY, MATCH = int(PatternType.LITERAL), int(PatternType.PREFIXED), int(PatternType.ANY), int(PatternType.MATCH)
ALLOW, DENY = int(PermissionType.ALLOW), int(PermissionType.DENY)
READ, WRITE, ALL_OPS = int(AclOperation.READ), int(AclOperation.WRITE), int(AclOperation.ANY)


def b(rtype=T, name="t", pattern=LIT, principal="User:alice", host="*", op=READ, perm=ALLOW) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def f(rtype=int(ResourceType.ANY), name=None, pattern=ANY, principal=None, host=None, op=ALL_OPS, perm=1) -> AclFilter:
    return AclFilter(rtype, name, pattern, principal, host, op, perm)


def run(state: MetadataState, fn):
    tx = Tx(state, 1_000)
    out = fn(tx)
    return out, tx.records


def test_create_validates_each_binding_and_is_idempotent() -> None:
    st = MetadataState()
    bad = [
        b(rtype=int(ResourceType.ANY)),
        b(pattern=MATCH),
        b(op=ALL_OPS),
        b(perm=1),
        b(principal="alice"),
        b(name=""),
        b(rtype=C, name="other"),
        b(pattern=PRE, name="*"),
        b(op=99),
        b(host=""),
    ]
    results, records = run(st, lambda tx: security.create_acls(tx, [b(), *bad, b()]))
    assert results[0] == (None, None) and results[-1] == (None, None)
    for code, message in results[1:-1]:
        assert code == "INVALID_REQUEST" and message
    assert len(records) == 1 and len(st.acls) == 1  # the duplicate is stored once
    results, records = run(st, lambda tx: security.create_acls(tx, [b()]))
    assert results == [(None, None)] and records == []


def test_filters_any_match_and_delete() -> None:
    st = MetadataState()
    acls = [
        b(name="orders"),
        b(name="ord", pattern=PRE),
        b(name="*"),
        b(name="payments", op=WRITE, perm=DENY),
        b(rtype=G, name="orders"),
    ]
    run(st, lambda tx: security.create_acls(tx, acls))
    image = st.image()
    assert set(image.acls) == set(acls)
    # ANY: same name, any pattern type; MATCH: whatever applies to the resource "orders"
    assert {x for x in acls if f(name="orders").matches(x)} == {acls[0], acls[4]}
    assert {x for x in acls if f(rtype=T, name="orders", pattern=MATCH).matches(x)} == set(acls[:3])
    assert {x for x in acls if f(perm=DENY).matches(x)} == {acls[3]}
    assert {x for x in acls if f(pattern=PRE).matches(x)} == {acls[1]}
    results, _ = run(st, lambda tx: security.delete_acls(tx, [f(rtype=T, name="orders", pattern=MATCH), f(pattern=0)]))
    assert results[0][0] == (None, None) and set(results[0][1]) == set(acls[:3])
    assert results[1][0][0] == "INVALID_REQUEST"
    assert set(st.image().acls) == {acls[3], acls[4]}


def test_acls_and_quotas_survive_snapshots_and_replay() -> None:
    st = MetadataState()
    _, recs1 = run(st, lambda tx: security.create_acls(tx, [b(), b(name="x", pattern=PRE, perm=DENY)]))
    _, recs2 = run(
        st,
        lambda tx: security.alter_client_quotas(
            tx,
            [
                ([("user", "alice")], {"producer_byte_rate": 1024.0}),
                ([("user", None), ("client-id", "c1")], {"consumer_byte_rate": 2048.0, "request_percentage": 50.0}),
            ],
            False,
        ),
    )
    restored = MetadataState.from_snapshot(st.snapshot())
    assert restored.image().acls == st.image().acls
    assert restored.image().client_quotas == st.image().client_quotas
    replayed = MetadataState()
    for rec in recs1 + recs2:
        replayed.apply(rec)
    assert replayed.image().acls == st.image().acls
    assert replayed.client_quotas == st.client_quotas
    # an old snapshot without the keys still loads
    old = st.snapshot()
    del old["acls"], old["client_quotas"]
    assert MetadataState.from_snapshot(old).acls == {}


def test_quota_validation_and_removal() -> None:
    st = MetadataState()
    results, _ = run(
        st,
        lambda tx: security.alter_client_quotas(
            tx,
            [
                ([("user", "a")], {"producer_byte_rate": 100.0}),
                ([("user", "a")], {"bogus_rate": 1.0}),
                ([("user", "a")], {"producer_byte_rate": -1.0}),
                ([("user", "a")], {"producer_byte_rate": 1.5}),
                ([("ip", "10.0.0.1")], {"producer_byte_rate": 1.0}),
                ([("ip", "nope")], {"connection_creation_rate": 1.0}),
                ([("user", "a"), ("ip", "10.0.0.1")], {"request_percentage": 1.0}),
                ([("user", "a"), ("user", "b")], {"request_percentage": 1.0}),
                ([("group", "g")], {"request_percentage": 1.0}),
                ([], {"request_percentage": 1.0}),
            ],
            False,
        ),
    )
    assert results[0] == (None, None)
    assert all(code == "INVALID_REQUEST" and msg for code, msg in results[1:])
    assert st.client_quotas == {(("user", "a"),): {"producer_byte_rate": 100.0}}
    run(st, lambda tx: security.alter_client_quotas(tx, [([("user", "a")], {"producer_byte_rate": None})], False))
    assert st.client_quotas == {}
    run(st, lambda tx: security.alter_client_quotas(tx, [([("user", "a")], {"producer_byte_rate": 5.0})], True))
    assert st.client_quotas == {}  # validate_only


def test_quota_precedence_is_kafkas() -> None:
    table: dict = {}

    def put(pairs, value):
        table[make_entity(pairs)] = {"producer_byte_rate": value}

    put([("client-id", None)], 8)
    assert resolve(table, "alice", "c1", "producer_byte_rate") == (((("client-id", None),)), 8)
    put([("client-id", "c1")], 7)
    put([("user", None)], 6)
    put([("user", None), ("client-id", None)], 5)
    put([("user", None), ("client-id", "c1")], 4)
    put([("user", "alice")], 3)
    put([("user", "alice"), ("client-id", None)], 2)
    put([("user", "alice"), ("client-id", "c1")], 1)
    order = [1, 2, 3, 4, 5, 6, 7, 8]
    for expected in order:
        entity, value = resolve(table, "alice", "c1", "producer_byte_rate")  # type: ignore[misc]
        assert value == expected
        del table[entity]
    assert resolve(table, "alice", "c1", "producer_byte_rate") is None
    with pytest.raises(InvalidQuotaError):
        make_entity([("ip", "x")])


def test_describe_filter_components() -> None:
    e = make_entity([("user", "alice"), ("client-id", None)])
    assert filter_matches(e, [("user", 0, "alice")], strict=False)
    assert not filter_matches(e, [("user", 0, "alice")], strict=True)
    assert filter_matches(e, [("user", 2, None), ("client-id", 1, None)], strict=True)
    assert not filter_matches(e, [("client-id", 0, "c1")], strict=False)


async def test_http_api_round_trip(client: ControllerClient) -> None:
    results = await client.create_acls([b(), b(principal="nobody")])
    assert results[0] == (None, None) and results[1][0] == "INVALID_REQUEST"
    image = await client.watch_metadata(-1, 0)
    assert image.acls == (b(),)
    deleted = await client.delete_acls([f(principal="User:alice")])
    assert deleted == [((None, None), [b()])]
    answers = await client.alter_client_quotas([([("user", "alice")], {"producer_byte_rate": 1000.0})], False)
    assert answers == [(None, None)]
    image = await client.watch_metadata(-1, 0)
    assert image.acls == ()
    assert [(q.entity, q.values) for q in image.client_quotas] == [
        ((("user", "alice"),), {"producer_byte_rate": 1000.0})
    ]
