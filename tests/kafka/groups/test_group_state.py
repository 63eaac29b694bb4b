"""The classic group protocol state machine, step by step with a fake clock (no sockets)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups.log import GroupKey, GroupValue, OffsetKey, OffsetValue, decode_key
from automq.broker.kafka.groups.state import (
    GroupConfig,
    GroupManager,
    GroupState,
    JoinResult,
    SyncResult,
    consumer_subscription_topics,
    java_string_hashcode,
    partition_for,
)

SESSION = 10_000
REBALANCE = 30_000


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)  # user data null


class Clients:
    """Drives a GroupManager like clients would, collecting replies by token."""

    def __init__(self, config: GroupConfig | None = None) -> None:
        self.m = GroupManager(config or GroupConfig(initial_rebalance_delay_ms=0), num_partitions=4)
        self.now = 1_000_000
        self.replies: dict[object, JoinResult | SyncResult] = {}
        self.writes: list = []
        self._n = 0

    def _apply(self, fx):
        for token, result in fx.replies:
            assert token not in self.replies, f"token {token} answered twice"
            self.replies[token] = result
        self.writes.extend(fx.writes)
        return fx

    def token(self, name: str) -> str:
        self._n += 1
        return f"{name}#{self._n}"

    def join(
        self,
        member_id="",
        group="g",
        protocols=(("range", b"r"),),
        instance=None,
        v4=True,
        session=SESSION,
        client="c",
        protocol_type="consumer",
        rebalance=REBALANCE,
    ):
        tok = self.token("join")
        self._apply(
            self.m.join(
                self.now,
                group_id=group,
                member_id=member_id,
                group_instance_id=instance,
                client_id=client,
                client_host="/127.0.0.1",
                session_timeout_ms=session,
                rebalance_timeout_ms=rebalance,
                protocol_type=protocol_type,
                protocols=list(protocols),
                require_known_member_id=v4,
                token=tok,
            )
        )
        return tok

    def full_join(self, group="g", **kw) -> str:
        """First join (MEMBER_ID_REQUIRED) + second join; returns the second join's token."""
        t = self.join(group=group, **kw)
        r = self.replies[t]
        assert r.error == ErrorCode.member_id_required and r.member_id
        return self.join(member_id=r.member_id, group=group, **kw)

    def sync(
        self, member_id, generation, assignments=None, group="g", protocol_type=None, protocol_name=None, instance=None
    ):
        tok = self.token("sync")
        self._apply(
            self.m.sync(
                self.now,
                group_id=group,
                generation_id=generation,
                member_id=member_id,
                group_instance_id=instance,
                protocol_type=protocol_type,
                protocol_name=protocol_name,
                assignments=assignments or {},
                token=tok,
            )
        )
        return tok

    def advance(self, ms: int):
        self.now += ms
        return self._apply(self.m.tick(self.now))

    def state(self, group="g") -> GroupState:
        return self.m.groups[group].state


def test_single_member_join_sync_heartbeat() -> None:
    c = Clients()
    t = c.full_join()
    r = c.replies[t]
    assert r.error == ErrorCode.none and r.generation_id == 1 and r.leader_id == r.member_id
    assert r.protocol_name == "range" and r.members == ((r.member_id, None, b"r"),)
    assert c.state() is GroupState.COMPLETING_REBALANCE
    s = c.sync(r.member_id, 1, {r.member_id: b"assign-1"})
    assert c.replies[s] == SyncResult(ErrorCode.none, "consumer", "range", b"assign-1")
    assert c.state() is GroupState.STABLE
    assert c.m.heartbeat(c.now, "g", r.member_id, None, 1) == ErrorCode.none
    assert c.m.heartbeat(c.now, "g", r.member_id, None, 0) == ErrorCode.illegal_generation
    assert c.m.heartbeat(c.now, "g", "nobody", None, 1) == ErrorCode.unknown_member_id
    assert c.m.heartbeat(c.now, "other", r.member_id, None, 1) == ErrorCode.unknown_member_id
    # the leader's sync wrote the group metadata with the assignment
    key, value = c.writes[-1].key, GroupValue.decode(c.writes[-1].value)
    assert decode_key(key) == GroupKey("g")
    assert value.generation_id == 1 and value.members[0].assignment == b"assign-1"


def test_join_validation_errors() -> None:
    c = Clients()
    assert c.replies[c.join(group="")].error == ErrorCode.invalid_group_id
    assert c.replies[c.join(session=10)].error == ErrorCode.invalid_session_timeout
    assert c.replies[c.join(member_id="ghost")].error == ErrorCode.unknown_member_id
    assert c.replies[c.join(protocols=())].error == ErrorCode.inconsistent_group_protocol
    assert c.replies[c.join(protocol_type="")].error == ErrorCode.inconsistent_group_protocol
    first = c.replies[c.full_join()]
    # a joiner with no protocol in common, or another protocol type, is refused
    assert c.replies[c.join(protocols=(("roundrobin", b""),), v4=False)].error == ErrorCode.inconsistent_group_protocol
    assert c.replies[c.join(protocol_type="connect", v4=False)].error == ErrorCode.inconsistent_group_protocol
    assert first.error == ErrorCode.none


def test_v3_join_gets_member_id_without_member_id_required() -> None:
    c = Clients()
    r = c.replies[c.join(v4=False)]
    assert r.error == ErrorCode.none and r.member_id.startswith("c-") and r.generation_id == 1


def test_three_members_rebalance_joining_and_leaving() -> None:
    c = Clients()
    a = c.replies[c.full_join(client="a")]
    c.sync(a.member_id, 1, {a.member_id: b"A1"})
    assert c.state() is GroupState.STABLE
    # b joins: the group prepares a rebalance and waits for a to rejoin
    tb = c.full_join(client="b")
    assert tb not in c.replies and c.state() is GroupState.PREPARING_REBALANCE
    assert c.m.heartbeat(c.now, "g", a.member_id, None, 1) == ErrorCode.rebalance_in_progress
    ta = c.join(member_id=a.member_id)
    ra, rb = c.replies[ta], c.replies[tb]
    assert ra.generation_id == rb.generation_id == 2
    assert ra.leader_id == a.member_id and len(ra.members) == 2 and rb.members == ()
    # c joins during CompletingRebalance: pending syncs are answered REBALANCE_IN_PROGRESS
    sb = c.sync(rb.member_id, 2)
    assert sb not in c.replies
    tc = c.full_join(client="c")
    assert c.replies[sb].error == ErrorCode.rebalance_in_progress
    ta, tb = c.join(member_id=a.member_id), c.join(member_id=rb.member_id)
    rc, ra, rb = c.replies[tc], c.replies[ta], c.replies[tb]
    assert {rc.generation_id, ra.generation_id, rb.generation_id} == {3}
    assert len(ra.members) == 3
    # the leader's sync completes everyone's pending sync
    sb, sc = c.sync(rb.member_id, 3), c.sync(rc.member_id, 3)
    sa = c.sync(a.member_id, 3, {a.member_id: b"A", rb.member_id: b"B", rc.member_id: b"C"})
    assert [c.replies[s].assignment for s in (sa, sb, sc)] == [b"A", b"B", b"C"]
    assert c.state() is GroupState.STABLE
    # the leader leaves: rebalance, a new leader among the rejoiners
    top, errs, fx = c.m.leave(c.now, "g", [(a.member_id, None), ("ghost", None)])
    c._apply(fx)
    assert top == ErrorCode.none and errs == [ErrorCode.none, ErrorCode.unknown_member_id]
    assert c.state() is GroupState.PREPARING_REBALANCE
    tb, tc = c.join(member_id=rb.member_id), c.join(member_id=rc.member_id)
    rb, rc = c.replies[tb], c.replies[tc]
    assert rb.generation_id == 4 and rb.leader_id in (rb.member_id, rc.member_id)
    assert sorted(m[0] for m in (rb.members or rc.members)) == sorted([rb.member_id, rc.member_id])
    # everyone leaves: Empty, a new generation is written
    c.sync(rb.member_id, 4)
    _, _, fx = c.m.leave(c.now, "g", [(rb.member_id, None), (rc.member_id, None)])
    c._apply(fx)
    assert c.state() is GroupState.EMPTY and c.m.groups["g"].generation_id == 5
    assert GroupValue.decode(c.writes[-1].value).members == ()


def test_session_expiry_removes_member_and_rebalances() -> None:
    c = Clients()
    a = c.replies[c.full_join(client="a")]
    c.sync(a.member_id, 1)
    tb = c.full_join(client="b")
    ta = c.join(member_id=a.member_id)
    rb = c.replies[tb]
    c.sync(a.member_id, 2)
    c.sync(rb.member_id, 2)
    assert c.state() is GroupState.STABLE
    # a keeps heartbeating, b goes silent
    for _ in range(3):
        c.advance(SESSION // 2)
        assert c.m.heartbeat(c.now, "g", a.member_id, None, 2) in (ErrorCode.none, ErrorCode.rebalance_in_progress)
    assert rb.member_id not in c.m.groups["g"].members
    assert c.state() is GroupState.PREPARING_REBALANCE
    assert c.m.heartbeat(c.now, "g", rb.member_id, None, 2) == ErrorCode.unknown_member_id
    ta = c.join(member_id=a.member_id)
    assert c.replies[ta].generation_id == 3 and len(c.replies[ta].members) == 1
    assert c.m.next_deadline() is not None


def test_rebalance_timeout_drops_members_that_do_not_rejoin() -> None:
    c = Clients()
    a = c.replies[c.full_join(client="a")]
    c.sync(a.member_id, 1)
    tb = c.full_join(client="b", rebalance=20_000)
    # a never rejoins; it keeps heartbeating, which is not enough. The group waits for the
    # largest rebalance timeout of its members (a's 30 s).
    for _ in range(5):
        c.advance(5_000)
        assert c.m.heartbeat(c.now, "g", a.member_id, None, 1) == ErrorCode.rebalance_in_progress
        assert tb not in c.replies
    c.advance(5_000)
    rb = c.replies[tb]
    assert rb.error == ErrorCode.none and rb.generation_id == 2 and rb.leader_id == rb.member_id
    assert list(c.m.groups["g"].members) == [rb.member_id]
    assert c.m.heartbeat(c.now, "g", a.member_id, None, 1) == ErrorCode.unknown_member_id


def test_pending_member_id_expires_and_does_not_block_rebalance_forever() -> None:
    c = Clients()
    a = c.replies[c.full_join(client="a")]
    c.sync(a.member_id, 1)
    pending = c.replies[c.join(client="b")].member_id  # got an id, never comes back
    tb2 = c.full_join(client="c")
    ta = c.join(member_id=a.member_id)
    assert ta not in c.replies  # waiting for the pending member
    c.advance(SESSION)
    assert c.replies[ta].generation_id == 2 and c.replies[tb2].generation_id == 2
    assert pending not in c.m.groups["g"].members
    assert c.replies[c.join(member_id=pending)].error == ErrorCode.unknown_member_id


def test_members_that_never_sync_are_removed() -> None:
    c = Clients()
    a = c.replies[c.full_join(client="a")]
    c.sync(a.member_id, 1)
    tb = c.full_join(client="b")
    c.join(member_id=a.member_id)
    rb = c.replies[tb]
    c.sync(a.member_id, 2, {a.member_id: b"x", rb.member_id: b"y"})
    for _ in range(REBALANCE // 5_000 - 1):  # b heartbeats but never sends SyncGroup
        c.advance(5_000)
        assert c.m.heartbeat(c.now, "g", a.member_id, None, 2) == ErrorCode.none
        assert c.m.heartbeat(c.now, "g", rb.member_id, None, 2) == ErrorCode.none
    assert rb.member_id in c.m.groups["g"].members
    c.advance(5_000)
    assert rb.member_id not in c.m.groups["g"].members
    assert c.state() is GroupState.PREPARING_REBALANCE
    assert c.m.heartbeat(c.now, "g", a.member_id, None, 2) == ErrorCode.rebalance_in_progress


def test_initial_rebalance_delay_collects_members() -> None:
    c = Clients(GroupConfig(initial_rebalance_delay_ms=3_000))
    ta = c.full_join(client="a")
    c.advance(2_000)
    tb = c.full_join(client="b")
    assert ta not in c.replies and tb not in c.replies
    c.advance(1_000)  # first delay over, but a member arrived during it: one more delay
    assert ta not in c.replies
    c.advance(3_000)
    assert c.replies[ta].generation_id == c.replies[tb].generation_id == 1
    assert len(c.replies[ta].members) == 2


def test_protocol_selected_by_vote() -> None:
    c = Clients(GroupConfig(initial_rebalance_delay_ms=100))
    ta = c.full_join(client="a", protocols=(("range", b"1"), ("roundrobin", b"2")))
    tb = c.full_join(client="b", protocols=(("roundrobin", b"3"), ("range", b"4")))
    tc = c.full_join(client="c", protocols=(("roundrobin", b"5"), ("sticky", b"6"), ("range", b"7")))
    c.advance(100)  # b and c arrived during the initial delay: it is extended once
    assert ta not in c.replies
    c.advance(100)
    results = [c.replies[t] for t in (ta, tb, tc)]
    assert {r.protocol_name for r in results} == {"roundrobin"}
    leader = next(r for r in results if r.members)
    assert sorted(m[2] for m in leader.members) == [b"2", b"3", b"5"]


def test_sync_checks() -> None:
    c = Clients()
    a = c.replies[c.full_join()]
    assert c.replies[c.sync(a.member_id, 0)].error == ErrorCode.illegal_generation
    assert c.replies[c.sync("ghost", 1)].error == ErrorCode.unknown_member_id
    assert c.replies[c.sync(a.member_id, 1, group="nope")].error == ErrorCode.unknown_member_id
    assert c.replies[c.sync(a.member_id, 1, protocol_type="connect")].error == ErrorCode.inconsistent_group_protocol
    assert c.replies[c.sync(a.member_id, 1, protocol_name="sticky")].error == ErrorCode.inconsistent_group_protocol
    ok = c.sync(a.member_id, 1, protocol_type="consumer", protocol_name="range")
    assert c.replies[ok].error == ErrorCode.none
    # a follower's late sync in Stable gets its stored assignment
    assert c.replies[c.sync(a.member_id, 1)].error == ErrorCode.none


def test_rejoin_with_same_metadata_in_stable_returns_current_generation() -> None:
    c = Clients()
    a = c.replies[c.full_join(client="a")]
    c.sync(a.member_id, 1)
    tb = c.full_join(client="b")
    c.join(member_id=a.member_id)
    rb = c.replies[tb]
    c.sync(a.member_id, 2)
    c.sync(rb.member_id, 2)
    again = c.replies[c.join(member_id=rb.member_id)]  # follower, unchanged
    assert again.generation_id == 2 and again.members == () and c.state() is GroupState.STABLE
    c.join(member_id=rb.member_id, protocols=(("range", b"changed"),))
    assert c.state() is GroupState.PREPARING_REBALANCE


def test_static_member_rejoin_keeps_generation_and_fences_old_id() -> None:
    c = Clients()
    t = c.join(instance="i-1", client="a")
    a = c.replies[t]
    assert a.error == ErrorCode.none and a.generation_id == 1  # static members skip MEMBER_ID_REQUIRED
    c.sync(a.member_id, 1, {a.member_id: b"A"}, instance="i-1")
    # the process restarts and rejoins with no member id: same generation, no rebalance
    r = c.replies[c.join(instance="i-1", client="a")]
    assert r.error == ErrorCode.none and r.generation_id == 1 and r.member_id != a.member_id
    assert r.skip_assignment and r.leader_id == r.member_id
    assert c.state() is GroupState.STABLE
    assert c.m.heartbeat(c.now, "g", a.member_id, "i-1", 1) == ErrorCode.fenced_instance_id
    assert c.replies[c.sync(r.member_id, 1, instance="i-1")].assignment == b"A"
    _top, errs, fx = c.m.leave(c.now, "g", [("", "i-1")])
    assert errs == [ErrorCode.none]
    c._apply(fx)
    assert c.state() is GroupState.EMPTY


def test_offsets_commit_fetch_and_member_checks() -> None:
    c = Clients()
    # standalone consumer: generation -1, no member id, creates the group
    plan = c.m.prepare_commit(
        c.now,
        group_id="solo",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=[("t", 0, 42, 3, "meta"), ("t", 1, 7, -1, None)],
    )
    assert set(plan.errors.values()) == {ErrorCode.none} and len(plan.writes) == 2
    assert c.m.fetch_offsets("solo", [("t", 0)])[0][2] is None  # not visible before durable
    c.m.complete_commit(plan, c.now)
    got = {(t, p): o for t, p, o in c.m.fetch_offsets("solo", None)}
    assert got[("t", 0)].offset == 42 and got[("t", 0)].leader_epoch == 3 and got[("t", 0)].metadata == "meta"
    assert got[("t", 1)].metadata == ""
    assert decode_key(plan.writes[0].key) == OffsetKey("solo", "t", 0)
    assert OffsetValue.decode(plan.writes[0].value).offset == 42
    # unknown group with a generation: ILLEGAL_GENERATION
    bad = c.m.prepare_commit(
        c.now, group_id="nope", generation_id=3, member_id="m", group_instance_id=None, offsets=[("t", 0, 1, -1, "")]
    )
    assert bad.errors == {("t", 0): ErrorCode.illegal_generation}
    # a real group: members only, matching generation, not during CompletingRebalance
    a = c.replies[c.full_join()]
    commit = lambda gen, mid: c.m.prepare_commit(
        c.now,
        group_id="g",
        generation_id=gen,
        member_id=mid,
        group_instance_id=None,
        offsets=[("t", 0, 5, -1, "")],
    ).errors[("t", 0)]
    assert commit(1, a.member_id) == ErrorCode.rebalance_in_progress
    c.sync(a.member_id, 1)
    assert commit(1, a.member_id) == ErrorCode.none
    assert commit(0, a.member_id) == ErrorCode.illegal_generation
    assert commit(1, "ghost") == ErrorCode.unknown_member_id
    assert commit(-1, "") == ErrorCode.unknown_member_id  # group has members
    too_big = c.m.prepare_commit(
        c.now,
        group_id="g",
        generation_id=1,
        member_id=a.member_id,
        group_instance_id=None,
        offsets=[("t", 0, 5, -1, "x" * 5000), ("t", 1, 5, -1, "")],
    )
    assert too_big.errors == {("t", 0): ErrorCode.offset_metadata_too_large, ("t", 1): ErrorCode.none}
    assert (
        c.m.prepare_commit(
            c.now, group_id="", generation_id=-1, member_id="", group_instance_id=None, offsets=[("t", 0, 1, -1, "")]
        ).errors[("t", 0)]
        == ErrorCode.invalid_group_id
    )


def test_delete_groups_and_offsets() -> None:
    c = Clients()
    a = c.replies[c.full_join(protocols=(("range", subscription("t1")),))]
    c.sync(a.member_id, 1)
    plan = c.m.prepare_commit(
        c.now,
        group_id="g",
        generation_id=1,
        member_id=a.member_id,
        group_instance_id=None,
        offsets=[("t1", 0, 1, -1, ""), ("t2", 0, 2, -1, "")],
    )
    c.m.complete_commit(plan, c.now)
    assert c.m.delete_group("g", c.now)[0] == ErrorCode.non_empty_group
    assert c.m.delete_group("nope", c.now)[0] == ErrorCode.group_id_not_found
    top, errors, fx = c.m.delete_offsets("g", [("t1", 0), ("t2", 0)])
    assert top == ErrorCode.none
    assert errors == {("t1", 0): ErrorCode.group_subscribed_to_topic, ("t2", 0): ErrorCode.none}
    assert [decode_key(w.key) for w in fx.writes] == [OffsetKey("g", "t2", 0)] and fx.writes[0].value is None
    assert c.m.delete_offsets("nope", [("t1", 0)])[0] == ErrorCode.group_id_not_found
    c._apply(c.m.leave(c.now, "g", [(a.member_id, None)])[2])
    err, fx = c.m.delete_group("g", c.now)
    assert err == ErrorCode.none and "g" not in c.m.groups
    assert {decode_key(w.key) for w in fx.writes} == {OffsetKey("g", "t1", 0), GroupKey("g")}
    assert all(w.value is None for w in fx.writes)
    assert c.m.fetch_offsets("g", [("t1", 0)])[0][2] is None


def test_offset_retention() -> None:
    c = Clients(GroupConfig(offsets_retention_ms=60_000))
    plan = c.m.prepare_commit(
        c.now, group_id="solo", generation_id=-1, member_id="", group_instance_id=None, offsets=[("t", 0, 1, -1, "")]
    )
    c.m.complete_commit(plan, c.now)
    short = c.m.prepare_commit(
        c.now,
        group_id="solo",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=[("t", 1, 1, -1, "")],
        retention_ms=1_000,
    )
    c.m.complete_commit(short, c.now)
    c.now += 1_000
    fx = c.m.expire_offsets(c.now)
    assert [decode_key(w.key) for w in fx.writes] == [OffsetKey("solo", "t", 1)]
    c.now += 59_000
    fx = c.m.expire_offsets(c.now)
    assert "solo" not in c.m.groups and {decode_key(w.key) for w in fx.writes} == {
        OffsetKey("solo", "t", 0),
        GroupKey("solo"),
    }


def test_list_describe() -> None:
    c = Clients()
    a = c.replies[c.full_join(protocols=(("range", b"meta"),))]
    d = c.m.describe("g")
    assert d.state == "CompletingRebalance" and d.protocol_name == "" and d.members[0].metadata == b""
    c.sync(a.member_id, 1, {a.member_id: b"as"})
    d = c.m.describe("g")
    assert d.state == "Stable" and d.protocol_type == "consumer" and d.protocol_name == "range"
    assert (
        d.members[0].metadata == b"meta"
        and d.members[0].assignment == b"as"
        and d.members[0].client_host == "/127.0.0.1"
    )
    assert c.m.describe("nope") is None
    assert c.m.list_groups() == [("g", "consumer", "Stable", "classic")]
    assert c.m.list_groups(["empty"]) == []
    assert c.m.list_groups(["STABLE"]) == [("g", "consumer", "Stable", "classic")]


def test_load_rebuilds_groups_from_records_and_unload_answers_waiters() -> None:
    c = Clients()
    a = c.replies[c.full_join(protocols=(("range", subscription("t")),))]
    c.sync(a.member_id, 1, {a.member_id: b"A"})
    plan = c.m.prepare_commit(
        c.now,
        group_id="g",
        generation_id=1,
        member_id=a.member_id,
        group_instance_id=None,
        offsets=[("t", 0, 10, 1, "m")],
    )
    c.m.complete_commit(plan, c.now)
    records = [(decode_key(w.key), w.value) for w in c.writes + plan.writes]
    decoded = [
        (k, None if v is None else (GroupValue.decode(v) if isinstance(k, GroupKey) else OffsetValue.decode(v)))
        for k, v in records
    ]
    other = GroupManager(GroupConfig(initial_rebalance_delay_ms=0), num_partitions=4)
    other.load(c.m.partition_for("g"), decoded, c.now)
    g = other.groups["g"]
    assert g.state is GroupState.STABLE and g.generation_id == 1 and g.leader_id == a.member_id
    assert g.members[a.member_id].assignment == b"A" and g.subscribed_topics == {"t"}
    assert other.heartbeat(c.now, "g", a.member_id, None, 1) == ErrorCode.none
    assert other.fetch_offsets("g", [("t", 0)])[0][2].offset == 10
    # a waiting join is answered NOT_COORDINATOR when the partition goes away
    tok = "late-join"
    other.join(
        c.now,
        group_id="g",
        member_id="",
        group_instance_id=None,
        client_id="x",
        client_host="h",
        session_timeout_ms=SESSION,
        rebalance_timeout_ms=REBALANCE,
        protocol_type="consumer",
        protocols=[("range", subscription("t"))],
        require_known_member_id=False,
        token=tok,
    )
    fx = other.unload(g.partition)
    assert fx.replies == [(tok, JoinResult(ErrorCode.not_coordinator, fx.replies[0][1].member_id))]
    assert "g" not in other.groups


def test_subscription_parser_is_hostile_input_safe() -> None:
    assert consumer_subscription_topics(subscription("a", "b")) == {"a", "b"}
    assert consumer_subscription_topics(b"") is None
    assert consumer_subscription_topics(b"\x00\x00\x7f\xff\xff\xff") is None
    assert consumer_subscription_topics(b"\x00\x00\x00\x00\x00\x01\x00\x09ab") is None


@pytest.mark.parametrize(
    "value, expected",
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("my-group", java_string_hashcode("my-group")),
        ("polygenelubricants", -2147483648),
    ],
)
def test_java_hashcode_and_partition(value: str, expected: int) -> None:
    assert java_string_hashcode(value) == expected
    assert 0 <= partition_for(value, 50) < 50


def test_partition_for_known_values() -> None:
    # "polygenelubricants".hashCode() == Integer.MIN_VALUE: Kafka's Utils.abs maps it to 0
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    assert java_string_hashcode("\u00e9\U0001f600") == (233 * 31 + 0xD83D) * 31 + 0xDE00  # UTF-16 surrogates
    assert java_string_hashcode("ab") == 97 * 31 + 98


def test_hostile_join_and_sync_values() -> None:
    c = Clients()
    for session in (-1, 0, 2**31 - 1):
        assert c.replies[c.join(session=session)].error == ErrorCode.invalid_session_timeout
    # a leader assigning to members that do not exist (and forgetting real ones)
    a = c.replies[c.full_join(client="a")]
    c.sync(a.member_id, 1)
    tb = c.full_join(client="b")
    c.join(member_id=a.member_id)
    rb = c.replies[tb]
    sb = c.sync(rb.member_id, 2)
    c.sync(a.member_id, 2, {"ghost-1": b"x", "": b"y", a.member_id: b"mine"})
    assert c.replies[sb] == SyncResult(ErrorCode.none, "consumer", "range", b"")
    assert "ghost-1" not in c.m.groups["g"].members
    # a duplicate of a pending JoinGroup supersedes the first one (which is answered)
    c.join(member_id=rb.member_id, protocols=(("range", b"new"),))
    t1 = c.join(member_id=rb.member_id, protocols=(("range", b"newer"),))
    assert c.state() is GroupState.PREPARING_REBALANCE and t1 not in c.replies
    superseded = [
        r for t, r in c.replies.items() if isinstance(r, JoinResult) and r.error == ErrorCode.rebalance_in_progress
    ]
    assert len(superseded) == 1


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.text(max_size=40))
def test_random_protocol_metadata_and_group_ids(metadata: bytes, group_id: str) -> None:
    consumer_subscription_topics(metadata)  # never raises
    c = Clients()
    t = c.join(group=group_id, protocols=(("range", metadata),), v4=False)
    r = c.replies[t]
    if not group_id:
        assert r.error == ErrorCode.invalid_group_id
        return
    assert r.error == ErrorCode.none and r.members[0][2] == metadata
    c.sync(r.member_id, 1, {r.member_id: metadata}, group=group_id)
    d = c.m.describe(group_id)
    assert d.members[0].metadata == metadata and d.members[0].assignment == metadata
    value = GroupValue.decode(c.writes[-1].value)
    assert value.members[0].subscription == metadata and decode_key(c.writes[-1].key) == GroupKey(group_id)


def test_static_member_edge_cases() -> None:
    c = Clients()
    a = c.replies[c.join(instance="i-1", client="a")]
    c.sync(a.member_id, 1, instance="i-1")
    # a restart with different protocols cannot keep the old assignment: rebalance
    t = c.join(instance="i-1", client="a", protocols=(("range", b"other"),))
    new_id = c.m.groups["g"].static_members["i-1"]
    assert c.replies[t] == JoinResult(
        ErrorCode.none, new_id, 2, "consumer", "range", new_id, ((new_id, "i-1", b"other"),)
    )
    assert new_id != a.member_id and c.m.groups["g"].generation_id == 2
    c.sync(new_id, 2, {new_id: b"A2"}, instance="i-1")
    # leaving with the instance id but someone else's member id is fenced; the real one leaves
    _, errs, fx = c.m.leave(c.now, "g", [(a.member_id, "i-1"), ("", "unknown-instance")])
    assert errs == [ErrorCode.fenced_instance_id, ErrorCode.unknown_member_id]
    assert (
        c.m.prepare_commit(
            c.now,
            group_id="g",
            generation_id=2,
            member_id=a.member_id,
            group_instance_id="i-1",
            offsets=[("t", 0, 1, -1, "")],
        ).errors[("t", 0)]
        == ErrorCode.fenced_instance_id
    )
    assert c.replies[c.sync(a.member_id, 2, instance="i-1")].error == ErrorCode.fenced_instance_id
    _, errs, fx = c.m.leave(c.now, "g", [(new_id, "i-1")])
    c._apply(fx)
    assert errs == [ErrorCode.none] and c.state() is GroupState.EMPTY and not c.m.groups["g"].static_members
