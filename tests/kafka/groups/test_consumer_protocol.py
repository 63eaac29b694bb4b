"""The KIP-848 consumer group protocol as a state machine (groups/consumer.py through
GroupManager): joining, incremental reassignment (revoke before assign), epochs and fencing,
leaving, session and revocation expiry, static members, regex subscriptions, the assignors,
offset commits checked against member epochs, and the state surviving a reload."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups import assignors
from automq.broker.kafka.groups.consumer import HeartbeatRequest, Partitions, TopicMeta, flatten
from automq.broker.kafka.groups.log import ConsumerGroupKey, decode_key
from automq.broker.kafka.groups.model import GroupConfig
from automq.broker.kafka.groups.state import GroupManager

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
SESSION = 45_000


class Cluster:
    """A GroupManager with a topic view the test controls, and a clock."""

    def __init__(self, **config: object) -> None:
        self.m = GroupManager(GroupConfig(**config), 1)  # type: ignore[arg-type]
        self.topics = {"orders": TopicMeta(T1, 6), "audit": TopicMeta(T2, 2)}
        self.m.topic_view = lambda: self.topics
        self.now = 1_000
        self.writes: list[tuple[bytes, bytes | None]] = []

    def hb(self, member: str, epoch: int, owned: Partitions | None = None, **fields: object):
        req = HeartbeatRequest(group_id="g", member_id=member, member_epoch=epoch, owned=owned, **fields)  # type: ignore[arg-type]
        result, fx = self.m.consumer_heartbeat(self.now, req)
        self.writes.extend((w.key, w.value) for w in fx.writes)
        return result

    def join(self, member: str, topics: tuple[str, ...] = ("orders",), **fields: object):
        return self.hb(member, 0, {}, rebalance_timeout_ms=30_000, subscribed_topic_names=topics, **fields)


def owned(result_or_parts) -> frozenset[tuple[uuid.UUID, int]]:
    parts = getattr(result_or_parts, "assignment", result_or_parts)
    return flatten(parts or {})


def test_first_member_gets_every_partition_at_once() -> None:
    c = Cluster()
    r = c.join("a")
    assert r.error == ErrorCode.none
    assert r.member_epoch == 1
    assert owned(r) == {(T1, p) for p in range(6)}
    # a heartbeat that changes nothing gets no assignment ("unchanged") and writes nothing
    c.writes.clear()
    again = c.hb("a", 1)
    assert (again.error, again.member_epoch, again.assignment) == (ErrorCode.none, 1, None)
    assert c.writes == []


def test_second_member_partitions_move_only_after_revocation() -> None:
    c = Cluster()
    a = c.join("a")
    a_parts = a.assignment
    b = c.join("b")
    # b is in the group at the new epoch but gets nothing a still owns
    assert b.member_epoch == 2 and owned(b) == frozenset()
    # a is told to keep three partitions (revoking the other three); its epoch stays
    ra = c.hb("a", 1)
    assert ra.member_epoch == 1
    kept = owned(ra)
    assert len(kept) == 3
    revoked = owned(a_parts) - kept
    # b still cannot have them: a has not confirmed the revocation
    assert c.hb("b", 2).assignment is None
    # a confirms (owns only what it kept): its epoch moves to the assignment epoch
    ra2 = c.hb("a", 1, owned=ra.assignment)
    assert ra2.member_epoch == 2
    # now b gets the revoked partitions
    rb = c.hb("b", 2)
    assert owned(rb) == revoked
    assert c.m.consumer_describe("g").state == "Stable"  # type: ignore[union-attr]


def test_stale_or_future_epoch_is_fenced_and_previous_epoch_tolerated() -> None:
    c = Cluster()
    c.join("a")
    assert c.hb("a", 7).error == ErrorCode.fenced_member_epoch
    c.join("b")
    ra = c.hb("a", 1)
    c.hb("a", 1, owned=ra.assignment)  # a moves to epoch 2
    # the response that told a about epoch 2 was lost: epoch 1 with an owned subset is accepted
    assert c.hb("a", 1, owned=ra.assignment).error == ErrorCode.none
    # but not epoch 0 of something that is not a join, nor an epoch two behind
    assert c.hb("a", -5).error == ErrorCode.invalid_request
    assert c.hb("nobody", 3).error == ErrorCode.unknown_member_id


def test_leave_frees_partitions_for_the_others() -> None:
    c = Cluster()
    c.join("a")
    c.join("b")
    ra = c.hb("a", 1)
    c.hb("a", 1, owned=ra.assignment)
    c.hb("b", 2)
    left = c.hb("b", -1)
    assert (left.error, left.member_epoch) == (ErrorCode.none, -1)
    ra = c.hb("a", 2)
    assert owned(ra) == {(T1, p) for p in range(6)}
    assert ra.member_epoch == 3


def test_silent_member_expires_and_slow_revoker_is_removed() -> None:
    c = Cluster()
    c.join("a")
    c.join("b")
    assert c.m.next_deadline() is not None
    # a never confirms its revocation: removed after its rebalance timeout (30 s)
    c.hb("a", 1)
    c.now += 30_001
    c.hb("b", 2)  # b is alive
    fx = c.m.tick(c.now)
    assert fx.writes, "the removal is written"
    assert "a" not in c.m.groups["g"].consumer.members  # type: ignore[union-attr]
    assert owned(c.hb("b", 2)) == {(T1, p) for p in range(6)}
    # b then falls silent for a whole session
    c.now += SESSION + 1
    c.m.tick(c.now)
    assert c.m.groups["g"].consumer.members == {}  # type: ignore[union-attr]
    assert c.m.list_groups() == [("g", "consumer", "Empty", "consumer")]


def test_static_member_replaced_without_rebalance() -> None:
    c = Cluster()
    first = c.join("a1", instance_id="pod-0")
    epoch = first.member_epoch
    # a second process with the same instance id while the first is alive: refused
    assert c.join("a2", instance_id="pod-0").error == ErrorCode.unreleased_instance_id
    assert c.hb("a1", epoch, instance_id="pod-0").error == ErrorCode.none
    assert c.hb("a1", -2, instance_id="pod-0").member_epoch == -2
    replaced = c.join("a2", instance_id="pod-0")
    assert replaced.error == ErrorCode.none
    assert replaced.member_epoch == epoch  # no new epoch: nothing was rebalanced
    assert owned(replaced) == owned(first)


def test_join_validation_answers_kafkas_errors() -> None:
    c = Cluster()
    assert c.hb("a", 0, {}, subscribed_topic_names=("orders",)).error == ErrorCode.invalid_request  # no timeout
    assert c.hb("a", 0, None, rebalance_timeout_ms=1, subscribed_topic_names=("orders",)).error == (
        ErrorCode.invalid_request
    )
    assert c.hb("a", 0, {}, rebalance_timeout_ms=1).error == ErrorCode.invalid_request  # no subscription
    assert c.join("a", server_assignor="sticky").error == ErrorCode.unsupported_assignor
    assert c.hb("a", 0, {}, rebalance_timeout_ms=1, subscribed_topic_regex="(").error == (
        ErrorCode.invalid_regular_expression
    )
    assert c.join("", version=1).error == ErrorCode.invalid_request  # v1: the client names itself
    assert c.hb("a", 3).error == ErrorCode.group_id_not_found  # no such group yet


def test_regex_subscription_follows_new_topics() -> None:
    c = Cluster()
    r = c.hb("a", 0, {}, rebalance_timeout_ms=1_000, subscribed_topic_regex="or.*")
    assert owned(r) == set()  # a regex new to the group is resolved after this heartbeat
    r = c.hb("a", r.member_epoch, {})
    assert owned(r) == {(T1, p) for p in range(6)}
    c.topics = {**c.topics, "orders-eu": TopicMeta(uuid.UUID(int=3), 1)}
    r = c.hb("a", r.member_epoch)
    assert (uuid.UUID(int=3), 0) in owned(r)


def test_literal_topics_come_first_and_a_regex_new_to_the_group_at_the_next_heartbeat() -> None:
    """Kafka resolves a new regex asynchronously: librdkafka's 0045 test waits for the literal
    topic's assignment, then the regex's. A regex the group already resolved (another member
    uses it) counts at once; one no member uses any more is forgotten, so subscribing to it
    again is new again."""
    c = Cluster()
    r = c.hb("a", 0, {}, rebalance_timeout_ms=1_000, subscribed_topic_names=["audit"], subscribed_topic_regex="or.*")
    assert owned(r) == {(T2, 0), (T2, 1)}
    epoch = r.member_epoch
    r = c.hb("a", epoch, {T2: {0, 1}})
    assert r.member_epoch == epoch + 1  # the resolution bumped the group epoch
    assert owned(r) == {(T2, 0), (T2, 1)} | {(T1, p) for p in range(6)}

    b = c.hb("b", 0, {}, rebalance_timeout_ms=1_000, subscribed_topic_regex="or.*")
    assert c.m.groups["g"].consumer.resolved_regexes == {"or.*"}  # resolved already: b shares at once
    assert b.error == ErrorCode.none

    for member in ("a", "b"):
        c.hb(member, -1)  # leave
    assert c.m.groups["g"].consumer.resolved_regexes == set()
    r = c.hb("c", 0, {}, rebalance_timeout_ms=1_000, subscribed_topic_regex="or.*")
    assert owned(r) == set()


def test_partition_count_change_bumps_the_epoch() -> None:
    c = Cluster()
    r = c.join("a")
    c.topics = {**c.topics, "orders": TopicMeta(T1, 8)}
    r2 = c.hb("a", r.member_epoch)
    assert r2.member_epoch == r.member_epoch + 1
    assert owned(r2) == {(T1, p) for p in range(8)}


def classic_join(c: Cluster):
    return c.m.join(
        c.now,
        group_id="g",
        member_id="",
        group_instance_id=None,
        client_id="old",
        client_host="/h",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=[("range", b"")],
        require_known_member_id=False,
        token="t",
    )


def test_classic_and_consumer_protocols_share_a_group_id_only_when_empty() -> None:
    c = Cluster(initial_rebalance_delay_ms=0)
    c.join("a")
    fx = classic_join(c)
    assert fx.replies[0][1].error == ErrorCode.inconsistent_group_protocol
    c.hb("a", 1, owned=None)
    c.hb("a", -1)
    fx = classic_join(c)
    assert c.m.groups["g"].consumer is None
    assert any(isinstance(decode_key(w.key), ConsumerGroupKey) and w.value is None for w in fx.writes)
    # and the classic group now refuses the consumer protocol
    assert c.join("b").error == ErrorCode.group_id_not_found


def test_offset_commit_checks_member_epoch() -> None:
    c = Cluster()
    r = c.join("a")

    def commit(member: str, epoch: int) -> ErrorCode:
        plan = c.m.prepare_commit(
            c.now,
            group_id="g",
            generation_id=epoch,
            member_id=member,
            group_instance_id=None,
            offsets=[("orders", 0, 5, -1, None)],
        )
        return plan.errors[("orders", 0)]

    assert commit("a", r.member_epoch) == ErrorCode.none
    assert commit("a", r.member_epoch + 1) == ErrorCode.fenced_member_epoch
    assert commit("zz", r.member_epoch) == ErrorCode.unknown_member_id
    # an older epoch: accepted for a partition the member still owns (its epoch moved on a
    # heartbeat the commit crossed), refused for one it does not own
    c.join("b")
    ra = c.hb("a", r.member_epoch)  # a starts revoking three partitions
    c.hb("a", r.member_epoch, owned=ra.assignment)  # a revoked them: its epoch moves on
    mine = min(p for _t, p in owned(ra))
    gone = min(set(range(6)) - {p for _t, p in owned(ra)})
    plan = c.m.prepare_commit(
        c.now,
        group_id="g",
        generation_id=r.member_epoch,
        member_id="a",
        group_instance_id=None,
        offsets=[("orders", mine, 5, -1, None)],
    )
    assert plan.errors[("orders", mine)] == ErrorCode.none
    plan = c.m.prepare_commit(
        c.now,
        group_id="g",
        generation_id=r.member_epoch,
        member_id="a",
        group_instance_id=None,
        offsets=[("orders", gone, 5, -1, None)],
    )
    assert plan.errors[("orders", gone)] == ErrorCode.stale_member_epoch
    assert commit("", -1) == ErrorCode.unknown_member_id  # admin commits need an empty group


def test_state_survives_a_reload() -> None:
    c = Cluster()
    c.join("a")
    c.join("b")
    ra = c.hb("a", 1)
    records = [(decode_key(k), v) for k, v in c.writes]
    m2 = GroupManager(GroupConfig(), 1)
    m2.topic_view = lambda: c.topics
    m2.load(0, records, c.now)
    data = m2.groups["g"].consumer
    assert data is not None
    assert set(data.members) == {"a", "b"}
    # a carries on with its epoch on the new coordinator and completes its revocation there
    result, _ = m2.consumer_heartbeat(c.now, HeartbeatRequest("g", "a", 1, owned=ra.assignment))
    assert (result.error, result.member_epoch) == (ErrorCode.none, 2)
    assert m2.list_groups() == [("g", "consumer", "Reconciling", "consumer")]


@pytest.mark.parametrize("name", assignors.ASSIGNORS)
def test_assignors_cover_every_partition_once_and_balance(name: str) -> None:
    subs = {f"m{i}": frozenset({T1, T2}) for i in range(4)}
    counts = {T1: 10, T2: 3}
    out = assignors.assign(name, subs, counts, {})
    pairs = [(t, p) for parts in out.values() for t, ps in parts.items() for p in ps]
    assert sorted(pairs) == sorted((t, p) for t, n in counts.items() for p in range(n))
    sizes = [sum(len(ps) for ps in parts.values()) for parts in out.values()]
    if name == assignors.UNIFORM:
        assert max(sizes) - min(sizes) <= 1


def test_uniform_is_sticky() -> None:
    subs = {"a": frozenset({T1}), "b": frozenset({T1})}
    first = assignors.uniform_assign(subs, {T1: 6}, {})
    subs3 = {**subs, "c": frozenset({T1})}
    second = assignors.uniform_assign(subs3, {T1: 6}, first)
    moved = sum(len(first[m][T1] - second[m].get(T1, set())) for m in ("a", "b"))
    assert moved == 2  # only what c needs
    assert all(len(second[m][T1]) == 2 for m in subs3)


def test_uniform_keeps_kafkas_placement_as_members_join() -> None:
    """Owners keep their lowest partitions up to their share, newcomers get the rest, as with
    Kafka's uniform assignor (librdkafka's 0113 x_incremental_rebalances checks it)."""
    one = assignors.uniform_assign({"a": frozenset({T1})}, {T1: 6}, {})
    assert one == {"a": {T1: {0, 1, 2, 3, 4, 5}}}
    two = assignors.uniform_assign({"a": frozenset({T1}), "b": frozenset({T1})}, {T1: 6}, one)
    assert two == {"a": {T1: {0, 1, 2}}, "b": {T1: {3, 4, 5}}}
    three = assignors.uniform_assign({m: frozenset({T1}) for m in "abc"}, {T1: 6}, two)
    assert three == {"a": {T1: {0, 1}}, "b": {T1: {3, 4}}, "c": {T1: {2, 5}}}


def test_uniform_with_different_subscriptions() -> None:
    subs = {"a": frozenset({T1, T2}), "b": frozenset({T1})}
    out = assignors.uniform_assign(subs, {T1: 4, T2: 4}, {})
    assert out["b"].get(T2) is None
    assert sum(len(ps) for ps in out["a"].values()) + sum(len(ps) for ps in out["b"].values()) == 8
    assert abs(len(out["b"][T1]) - sum(len(ps) for ps in out["a"].values())) <= 2


def test_rebalances_and_fencings_are_counted_for_metrics() -> None:
    c = Cluster(consumer_session_timeout_ms=SESSION)
    c.join("a")  # epoch 1: the group's first rebalance
    rb = c.join("b")  # epoch 2
    assert c.m.consumer_rebalances == 2
    # a heartbeat that changes nothing is no rebalance
    c.hb("b", rb.member_epoch)
    assert c.m.consumer_rebalances == 2
    # a wrong epoch is fenced (and changes nothing)
    assert c.hb("b", 99).error == ErrorCode.fenced_member_epoch
    assert c.m.consumer_fencings == {"epoch": 1, "session_timeout": 0, "rebalance_timeout": 0}
    assert c.m.consumer_rebalances == 2
    # a never confirms its revocation: fenced after its rebalance timeout; b stays alive
    c.hb("a", 1)
    c.now += 30_001
    c.hb("b", 2)
    c.m.tick(c.now)
    assert c.m.consumer_fencings["rebalance_timeout"] == 1
    assert c.m.consumer_rebalances == 3  # a's removal bumped the epoch
    c.now += SESSION + 1
    c.m.tick(c.now)
    assert c.m.consumer_fencings == {"epoch": 1, "session_timeout": 1, "rebalance_timeout": 1}
    assert c.m.consumer_rebalances == 4
    # leaving is no fencing
    c.join("d")
    c.hb("d", 5, owned={})
    assert c.hb("d", -1).error == ErrorCode.none
    assert sum(c.m.consumer_fencings.values()) == 3


def test_a_heartbeat_that_writes_nothing_changed_nothing() -> None:
    """Randomized: members join, leave, reconcile (reporting what they own, sometimes stale),
    topics grow; whenever a heartbeat writes no record the group's state is exactly the last
    record written (the steady path compares the member and the epochs, not the whole group)."""
    import random

    rng = random.Random(848)
    c = Cluster()
    data_of = lambda: c.m.groups["g"].consumer
    members: dict[str, int] = {}
    for step in range(600):
        roll = rng.random()
        before = len(c.writes)
        if roll < 0.1 or not members:
            name = f"m{rng.randrange(8)}"
            r = c.join(name, rng.choice([("orders",), ("audit",), ("orders", "audit")]))
        elif roll < 0.15:
            name = rng.choice(sorted(members))
            r = c.hb(name, -1)
            members.pop(name, None)
            continue
        elif roll < 0.18:
            t = rng.choice(["orders", "audit"])
            c.topics[t] = TopicMeta(c.topics[t].topic_id, c.topics[t].partitions + 1)
            continue
        else:
            name = rng.choice(sorted(members))
            member = data_of().members.get(name)
            if member is None:
                members.pop(name)
                continue
            owned = None if rng.random() < 0.3 else {t: set(ps) for t, ps in member.assigned.items()}
            if owned is not None and member.revoking and rng.random() < 0.5:
                for t, ps in member.revoking.items():  # still holding what it must give up
                    owned.setdefault(t, set()).update(ps)
            r = c.hb(name, member.member_epoch, owned)
        if r.error == ErrorCode.none:
            members[name] = r.member_epoch
        data = data_of()
        if data is not None and len(c.writes) == before:
            assert data.to_json() == data.persisted, f"step {step}: a change was not written"
