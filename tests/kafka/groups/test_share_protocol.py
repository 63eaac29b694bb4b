"""KIP-932 share groups, group side, as a state machine (groups/share.py through GroupManager):
joining, epochs and fencing, leaving, session expiry, the simple assignor (partitions shared
when members outnumber them), group size limit, one type per group id, and the state
surviving a reload from its records."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups.consumer import HeartbeatRequest, TopicMeta, flatten
from automq.broker.kafka.groups.log import ShareGroupKey, decode_key
from automq.broker.kafka.groups.model import GroupConfig
from automq.broker.kafka.groups.share import ShareHeartbeatRequest, simple_assign
from automq.broker.kafka.groups.state import GroupManager

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
SESSION = 45_000


class Cluster:
    def __init__(self, **config: object) -> None:
        self.m = GroupManager(GroupConfig(**config), 1)  # type: ignore[arg-type]
        self.topics = {"orders": TopicMeta(T1, 6), "audit": TopicMeta(T2, 2)}
        self.m.topic_view = lambda: self.topics
        self.now = 1_000
        self.writes: list[tuple[bytes, bytes | None]] = []

    def hb(self, member: str, epoch: int, topics: tuple[str, ...] | None = None, group: str = "q", **fields: object):
        req = ShareHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=epoch, subscribed_topic_names=topics, **fields
        )  # type: ignore[arg-type]
        result, fx = self.m.share_heartbeat(self.now, req)
        self.writes.extend((w.key, w.value) for w in fx.writes)
        return result

    def join(self, member: str, topics: tuple[str, ...] = ("orders",), group: str = "q"):
        return self.hb(member, 0, topics, group=group)

    def assigned(self, group: str = "q") -> dict[str, frozenset[tuple[uuid.UUID, int]]]:
        data = self.m.groups[group].share
        assert data is not None
        return {mid: flatten(m.assigned) for mid, m in data.members.items()}


def test_first_member_gets_everything_and_an_unchanged_heartbeat_writes_nothing() -> None:
    c = Cluster()
    r = c.join("a")
    assert (r.error, r.member_id, r.member_epoch) == (ErrorCode.none, "a", 1)
    assert flatten(r.assignment) == {(T1, p) for p in range(6)}
    assert [decode_key(k) for k, _ in c.writes] == [ShareGroupKey("q")]
    c.writes.clear()
    again = c.hb("a", 1)
    assert (again.error, again.member_epoch, again.assignment) == (ErrorCode.none, 1, None)
    assert c.writes == []
    assert c.m.list_groups() == [("q", "share", "Stable", "share")]


def test_second_member_gets_its_share_at_once_and_the_first_learns_on_its_next_heartbeat() -> None:
    c = Cluster()
    c.join("a")
    b = c.join("b")
    # nothing to revoke in a share group: b is at the new epoch with its partitions right away
    assert (b.error, b.member_epoch) == (ErrorCode.none, 2)
    assert len(flatten(b.assignment)) == 3
    a = c.hb("a", 1)
    assert (a.error, a.member_epoch) == (ErrorCode.none, 2)
    assert flatten(a.assignment) | flatten(b.assignment) == {(T1, p) for p in range(6)}
    assert not flatten(a.assignment) & flatten(b.assignment)


def test_members_outnumbering_partitions_share_them() -> None:
    c = Cluster()
    for name in "abcde":
        c.join(name, ("audit",))  # 2 partitions, 5 members
    for name in "abcde":
        c.hb(name, c.m.groups["q"].share.members[name].member_epoch)  # type: ignore[union-attr]
    assigned = c.assigned()
    assert all(len(parts) == 1 for parts in assigned.values()), assigned
    owners = Counter(tp for parts in assigned.values() for tp in parts)
    assert set(owners) == {(T2, 0), (T2, 1)}
    assert sorted(owners.values()) == [2, 3]


@pytest.mark.parametrize("members,partitions", [(1, 1), (3, 10), (10, 3), (7, 7), (4, 1), (2, 9)])
def test_simple_assignor_covers_every_partition_and_every_member(members: int, partitions: int) -> None:
    subs = {f"m{i}": frozenset({T1}) for i in range(members)}
    out = simple_assign(subs, {T1: partitions}, {})
    counts = {m: len(out[m].get(T1, ())) for m in subs}
    assert all(n >= 1 for n in counts.values())
    covered = Counter(p for m in subs for p in out[m].get(T1, ()))
    assert set(covered) == set(range(partitions))
    if members <= partitions:
        assert max(counts.values()) - min(counts.values()) <= 1
        assert all(n == 1 for n in covered.values())  # no sharing needed
    else:
        assert max(covered.values()) - min(covered.values()) <= 1
    # sticky: the same input keeps the same answer
    assert simple_assign(subs, {T1: partitions}, out) == out


def test_simple_assignor_keeps_partitions_where_they_were_when_a_member_joins() -> None:
    subs = {f"m{i}": frozenset({T1}) for i in range(3)}
    before = simple_assign(subs, {T1: 12}, {})
    after = simple_assign({**subs, "m3": frozenset({T1})}, {T1: 12}, before)
    moved = sum(len(before[m][T1] - after[m].get(T1, set())) for m in before)
    assert moved == 3  # only what the newcomer needs
    assert len(after["m3"][T1]) == 3


def test_simple_assignor_only_gives_subscribed_topics() -> None:
    out = simple_assign({"a": frozenset({T1}), "b": frozenset({T1, T2})}, {T1: 4, T2: 2}, {})
    assert T2 not in out["a"]
    assert out["b"][T2] == {0, 1}


def test_epochs_fencing_and_lost_response() -> None:
    c = Cluster()
    c.join("a")
    c.join("b")
    r = c.hb("a", 1)
    assert r.member_epoch == 2
    # the answer moving a to epoch 2 was lost: epoch 1 once more is accepted
    again = c.hb("a", 1)
    assert (again.error, again.member_epoch) == (ErrorCode.none, 2)
    for wrong in (3, 100, 2**31 - 1):
        f = c.hb("a", wrong)
        assert f.error == ErrorCode.fenced_member_epoch, wrong
        assert f.assignment is None and f.member_epoch == -1
    c.join("c")
    c.hb("a", 2)  # a at 3
    assert c.hb("a", 1).error == ErrorCode.fenced_member_epoch  # two behind
    assert c.m.share_fencings["epoch"] == 4


def test_errors_kafka_gives() -> None:
    c = Cluster(share_max_size=2)
    assert c.hb("", 0, ("orders",)).error == ErrorCode.invalid_request
    assert c.hb("  ", 0, ("orders",)).error == ErrorCode.invalid_request
    assert c.hb("a", 0, ("orders",), group="").error == ErrorCode.invalid_request
    assert c.hb("a", 0, None).error == ErrorCode.invalid_request  # first request without subscription
    assert c.hb("a", 0, ()).error == ErrorCode.invalid_request
    assert c.hb("a", -2).error == ErrorCode.invalid_request  # no static members in share groups
    assert c.hb("a", 0, ("orders",), rack_id=" ").error == ErrorCode.invalid_request
    assert c.hb("a", 3, group="nope").error == ErrorCode.group_id_not_found
    assert c.hb("a", -1, group="nope").error == ErrorCode.group_id_not_found
    c.join("a")
    assert c.hb("ghost", 1).error == ErrorCode.unknown_member_id
    assert c.hb("ghost", -1).error == ErrorCode.unknown_member_id
    c.join("b")
    full = c.join("c")
    assert full.error == ErrorCode.group_max_size_reached
    assert "maximum capacity of 2" in (full.message or "")
    assert "nope" not in c.m.groups or c.m.groups["nope"].share is None


def test_leave_rebalances_and_the_last_leave_empties_the_group() -> None:
    c = Cluster()
    c.join("a")
    c.join("b")
    r = c.hb("b", -1)
    assert (r.error, r.member_epoch) == (ErrorCode.none, -1)
    a = c.hb("a", 1)
    # a never learnt of b (no heartbeat in between): its partitions did not change, only its epoch
    assert (a.member_epoch, a.assignment) == (3, None)
    assert len(c.assigned()["a"]) == 6
    c.hb("a", -1)
    assert c.m.list_groups() == [("q", "share", "Empty", "share")]
    assert c.m.share_departed == [("q", "b"), ("q", "a")]
    # an empty share group stays (it has share-partition state) until deleted
    assert c.m.expire_offsets(c.now + 10 * 24 * 3_600_000).writes == []
    assert "q" in c.m.groups
    assert c.m.delete_group("q", c.now)[0] == ErrorCode.none
    assert "q" not in c.m.groups


def test_session_timeout_removes_silent_members() -> None:
    c = Cluster()
    c.join("a")
    c.now += 10_000
    c.join("b")
    assert c.m.next_deadline() == 1_000 + SESSION
    c.now = 1_000 + SESSION
    fx = c.m.tick(c.now)
    assert fx.writes  # the new membership is written
    assert set(c.m.groups["q"].share.members) == {"b"}  # type: ignore[union-attr]
    assert c.m.share_fencings["session_timeout"] == 1
    assert ("q", "a") in c.m.share_departed
    r = c.hb("b", 2)
    assert r.member_epoch == 3 and len(flatten(r.assignment)) == 6
    assert c.hb("a", 2).error == ErrorCode.unknown_member_id


def test_subscription_and_topic_changes_bump_the_epoch() -> None:
    c = Cluster()
    c.join("a")
    r = c.hb("a", 1, ("orders", "audit"))
    assert r.member_epoch == 2 and len(flatten(r.assignment)) == 8
    c.topics["audit"] = TopicMeta(T2, 4)  # partitions added
    r = c.hb("a", 2)
    assert r.member_epoch == 3 and len(flatten(r.assignment)) == 10
    # a topic that does not exist yet: no partitions, no error; assigned once it exists
    r = c.hb("a", 3, ("later",))
    assert r.member_epoch == 4 and flatten(r.assignment) == set()
    t3 = uuid.UUID(int=3)
    c.topics["later"] = TopicMeta(t3, 1)
    r = c.hb("a", 4)
    assert r.member_epoch == 5 and flatten(r.assignment) == {(t3, 0)}


def test_a_group_id_is_one_type_for_life() -> None:
    c = Cluster()
    c.join("a", group="s")
    # a KIP-848 consumer on a share group's id
    hb = HeartbeatRequest(
        group_id="s",
        member_id="x",
        member_epoch=0,
        rebalance_timeout_ms=1,
        subscribed_topic_names=("orders",),
        owned={},
    )
    r, _ = c.m.consumer_heartbeat(c.now, hb)
    assert r.error == ErrorCode.group_id_not_found and "not a consumer group" in (r.message or "")
    # a classic JoinGroup on a share group's id
    fx = c.m.join(
        c.now,
        group_id="s",
        member_id="",
        group_instance_id=None,
        client_id="c",
        client_host="h",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=[("range", b"")],
        require_known_member_id=False,
        token="t",
    )
    assert fx.replies[0][1].error == ErrorCode.inconsistent_group_protocol
    # offsets cannot be committed to (or deleted from) a share group
    plan = c.m.prepare_commit(
        c.now, group_id="s", generation_id=-1, member_id="", group_instance_id=None, offsets=[("orders", 0, 5, -1, "")]
    )
    assert plan.errors == {("orders", 0): ErrorCode.group_id_not_found}
    assert c.m.delete_offsets("s", [("orders", 0)])[0] == ErrorCode.group_id_not_found
    # a share member on a consumer group's id
    c.m.consumer_heartbeat(
        c.now,
        HeartbeatRequest(
            group_id="k",
            member_id="x",
            member_epoch=0,
            rebalance_timeout_ms=1,
            subscribed_topic_names=("orders",),
            owned={},
        ),
    )
    r2 = c.join("a", group="k")
    assert r2.error == ErrorCode.group_id_not_found and "not a share group" in (r2.message or "")
    # classic DescribeGroups does not describe it as a classic group
    assert c.m.describe("s") is None
    assert c.m.share_describe("k") == ErrorCode.group_id_not_found
    assert {g[0]: g[3] for g in c.m.list_groups()} == {"s": "share", "k": "consumer"}


def test_non_empty_share_group_cannot_be_deleted() -> None:
    c = Cluster()
    c.join("a")
    assert c.m.delete_group("q", c.now)[0] == ErrorCode.non_empty_group


def test_state_survives_a_reload_and_members_heartbeat_on() -> None:
    c = Cluster()
    c.join("a")
    c.join("b")
    c.hb("a", 1)
    before = c.assigned()
    records = [(decode_key(k), v) for k, v in c.writes]
    fresh = GroupManager(GroupConfig(), 1)
    fresh.topic_view = lambda: c.topics
    fresh.load(0, records, c.now + 5)
    c.m = fresh
    assert c.assigned() == before
    r = c.hb("a", 2)
    # the new coordinator does not know what a was told: it repeats the same assignment once
    assert (r.error, r.member_epoch, flatten(r.assignment)) == (ErrorCode.none, 2, before["a"])
    assert c.hb("a", 2).assignment is None
    r = c.hb("b", 2)
    assert (r.error, r.member_epoch) == (ErrorCode.none, 2)
    assert fresh.list_groups() == [("q", "share", "Stable", "share")]
    # a deleted share group stays deleted after a reload
    c.hb("a", -1)
    c.hb("b", -1)
    error, fx = fresh.delete_group("q", c.now)
    assert error == ErrorCode.none
    c.writes.extend((w.key, w.value) for w in fx.writes)
    again = GroupManager(GroupConfig(), 1)
    again.topic_view = lambda: c.topics
    again.load(0, [(decode_key(k), v) for k, v in c.writes], c.now)
    assert "q" not in again.groups


def test_share_group_apis_are_not_served_when_turned_off() -> None:
    from types import SimpleNamespace

    from automq.broker.kafka.handlers import registry

    on = registry.served_ranges(SimpleNamespace(kafka=SimpleNamespace(group_share_enable=True)))
    off = registry.served_ranges(SimpleNamespace(kafka=SimpleNamespace(group_share_enable=False)))
    assert on[76] == (1, 1) and on[77] == (1, 1)
    assert 76 not in off and 77 not in off
    assert set(on) - set(off) <= registry.SHARE_GROUP_APIS


def test_initialized_partitions_are_tracked_and_survive_a_reload() -> None:
    c = Cluster()
    c.join("a", ("orders", "audit"))
    assert c.m.share_uninitialized("q") == {(T1, p) for p in range(6)} | {(T2, 0), (T2, 1)}
    fx = c.m.share_mark_initialized("q", [(T1, p) for p in range(6)], c.now)
    c.writes.extend((w.key, w.value) for w in fx.writes)
    assert c.m.share_uninitialized("q") == {(T2, 0), (T2, 1)}
    assert c.m.share_mark_initialized("q", [(T1, 0)], c.now).writes == []  # nothing new: nothing written
    fresh = GroupManager(GroupConfig(), 1)
    fresh.topic_view = lambda: c.topics
    fresh.load(0, [(decode_key(k), v) for k, v in c.writes], c.now)
    assert fresh.share_uninitialized("q") == {(T2, 0), (T2, 1)}
    # offsets deleted: those partitions are initialized again when next assigned
    fresh.share_mark_initialized("q", [(T1, 0), (T1, 1)], c.now, initialized=False)
    assert fresh.share_uninitialized("q") == {(T1, 0), (T1, 1), (T2, 0), (T2, 1)}
    assert fresh.share_uninitialized("unknown") == set()


def test_a_share_heartbeat_that_writes_nothing_changed_nothing() -> None:
    """Randomized joins, leaves, subscription and client changes, growing topics, lost answers:
    whenever a heartbeat writes no record, the group's state is exactly the last one written."""
    import random

    rng = random.Random(932)
    c = Cluster()
    last: bytes | None = None
    for step in range(800):
        roll = rng.random()
        data = c.m.groups["q"].share if "q" in c.m.groups else None
        names = sorted(data.members) if data is not None else []
        before = len(c.writes)
        if roll < 0.12 or not names:
            c.join(f"m{rng.randrange(10)}", rng.choice([("orders",), ("audit",), ("orders", "audit")]))
        elif roll < 0.17:
            c.hb(rng.choice(names), -1)
        elif roll < 0.2:
            t = rng.choice(["orders", "audit"])
            c.topics[t] = TopicMeta(c.topics[t].topic_id, c.topics[t].partitions + 1)
            continue
        else:
            m = data.members[rng.choice(names)]  # type: ignore[union-attr]
            epoch = m.previous_member_epoch if rng.random() < 0.1 and m.previous_member_epoch > 0 else m.member_epoch
            fields: dict = {}
            if rng.random() < 0.1:
                fields["topics"] = rng.choice([("orders",), ("audit",), ("orders", "audit")])
            if rng.random() < 0.05:
                fields["client_id"] = f"client-{rng.randrange(3)}"
            c.hb(m.member_id, epoch, fields.pop("topics", None), **fields)
        if len(c.writes) > before:
            last = c.writes[-1][1]
        data = c.m.groups["q"].share if "q" in c.m.groups else None
        if data is not None and last is not None:
            assert data.to_json() == last, f"step {step}: a change was not written"
