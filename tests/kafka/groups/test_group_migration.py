"""Online migration between the classic and the KIP-848 protocol (groups/migration.py) as a
state machine: a consumer-protocol member upgrading a classic group, classic members served
by the KIP-848 group (REBALANCE_IN_PROGRESS to rejoin, generation = member epoch, assignments
written in the consumer protocol), the downgrade when the last consumer-protocol member
leaves, the policies, and every conversion surviving a replay of the group's records."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups import consumer_protocol as cp
from automq.broker.kafka.groups.consumer import HeartbeatRequest, Partitions, TopicMeta, flatten
from automq.broker.kafka.groups.log import GroupValue, decode_key
from automq.broker.kafka.groups.model import GroupConfig, GroupState, JoinResult, SyncResult
from automq.broker.kafka.groups.state import GroupManager

T1 = uuid.UUID(int=1)
TOPIC = "orders"


def subscription(version: int = 0, owned: tuple[tuple[str, int], ...] = ()) -> bytes:
    """A ConsumerProtocolSubscription as clients write it (v0: kafka-python; v1+: owned partitions)."""
    import struct

    name = TOPIC.encode()
    out = struct.pack(">hih", version, 1, len(name)) + name + struct.pack(">i", -1)
    if version >= 1:
        by_topic: dict[str, list[int]] = {}
        for t, p in owned:
            by_topic.setdefault(t, []).append(p)
        out += struct.pack(">i", len(by_topic))
        for t, ps in by_topic.items():
            out += struct.pack(">h", len(t)) + t.encode() + struct.pack(f">i{len(ps)}i", len(ps), *ps)
    return out


class Cluster:
    def __init__(self, policy: str = "bidirectional") -> None:
        self.m = GroupManager(GroupConfig(consumer_migration_policy=policy, initial_rebalance_delay_ms=100), 1)
        self.m.topic_view = lambda: {TOPIC: TopicMeta(T1, 4)}
        self.now = 1_000
        self.writes: list[tuple[bytes, bytes | None]] = []
        self.replies: dict[str, Any] = {}

    def _fx(self, fx: Any) -> None:
        self.writes.extend((w.key, w.value) for w in fx.writes)
        for token, result in fx.replies:
            self.replies[token] = result

    def join(self, token: str, member_id: str = "", sub: bytes | None = None, instance: str | None = None) -> None:
        fx = self.m.join(
            self.now,
            group_id="g",
            member_id=member_id,
            group_instance_id=instance,
            client_id="c",
            client_host="h",
            session_timeout_ms=10_000,
            rebalance_timeout_ms=20_000,
            protocol_type="consumer",
            protocols=[("range", sub if sub is not None else subscription())],
            require_known_member_id=False,
            token=token,
        )
        self._fx(fx)

    def sync(self, token: str, member_id: str, generation: int, assignments: dict[str, bytes] | None = None) -> None:
        fx = self.m.sync(
            self.now,
            group_id="g",
            generation_id=generation,
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=assignments or {},
            token=token,
        )
        self._fx(fx)

    def classic_group(self, members: int = 2, static: bool = False) -> list[str]:
        """A stable classic group whose members share the topic's 4 partitions."""
        for i in range(members):
            self.join(f"j{i}", instance=f"i{i}" if static else None)
        while "j0" not in self.replies:  # the initial delay runs out: one rebalance with every member
            self.now += 200
            self._fx(self.m.tick(self.now))
        ids = [r.member_id for t, r in self.replies.items() if t.startswith("j")]
        gen = self.replies["j0"].generation_id
        split = {mid: [p for p in range(4) if p % members == i] for i, mid in enumerate(ids)}
        self.sync("s0", ids[0], gen, {mid: cp.encode_assignment(0, {TOPIC: ps}) for mid, ps in split.items()})
        for i, mid in enumerate(ids[1:], 1):
            self.sync(f"s{i}", mid, gen)
        assert self.m.groups["g"].state is GroupState.STABLE
        return ids

    def hb(self, member: str, epoch: int, owned: Partitions | None = None, **fields: Any):
        req = HeartbeatRequest(group_id="g", member_id=member, member_epoch=epoch, owned=owned, **fields)
        result, fx = self.m.consumer_heartbeat(self.now, req)
        self._fx(fx)
        return result

    def consumer_join(self, member: str):
        return self.hb(member, 0, {}, rebalance_timeout_ms=30_000, subscribed_topic_names=(TOPIC,))

    def reloaded(self) -> GroupManager:
        m2 = GroupManager(self.m.config, 1)
        m2.topic_view = self.m.topic_view
        m2.load(0, [(decode_key(k), _value(k, v)) for k, v in self.writes], self.now)
        return m2


def _value(key: bytes, value: bytes | None) -> object:
    from automq.broker.kafka.groups.log import GroupKey

    if value is not None and isinstance(decode_key(key), GroupKey):
        return GroupValue.decode(value)
    return value


def test_a_consumer_protocol_member_upgrades_a_classic_group_and_partitions_move_by_rejoins() -> None:
    c = Cluster()
    a, b = c.classic_group()
    gen = c.m.groups["g"].generation_id
    joined = c.consumer_join("k1")
    assert joined.error == ErrorCode.none
    g = c.m.groups["g"]
    assert g.consumer is not None and not g.members
    assert set(g.consumer.members) == {a, b, "k1"}
    assert g.consumer.group_epoch == gen + 1
    # the classic members still own everything: the new member waits for their release
    assert flatten(joined.assignment or {}) == frozenset()
    # classic members keep their generation (their member epoch) and are told to rejoin
    assert c.m.heartbeat(c.now, "g", a, None, gen) == ErrorCode.rebalance_in_progress
    assert c.m.heartbeat(c.now, "g", a, None, gen + 5) == ErrorCode.illegal_generation
    # an offset commit at their generation is still accepted; another generation is not
    assert c.m.consumer_check_member("g", a, gen, [(TOPIC, 0)]) == ErrorCode.none
    assert c.m.consumer_check_member("g", a, gen - 1, [(TOPIC, 0)]) == ErrorCode.illegal_generation
    # an eager member rejoins owning nothing: it moves to the new epoch with its share of the target
    for token, member in (("ra", a), ("rb", b)):
        c.join(token, member)
        r = c.replies[token]
        assert isinstance(r, JoinResult) and r.error == ErrorCode.none
        assert (r.generation_id, r.protocol_name, r.leader_id, r.members) == (gen + 1, "range", "", ())
        c.sync("x" + token, member, r.generation_id)
        s = c.replies["x" + token]
        assert isinstance(s, SyncResult) and s.error == ErrorCode.none
        assert c.m.heartbeat(c.now, "g", member, None, r.generation_id) == ErrorCode.none
    held = {mid: set(cp.parse_assignment(c.replies["x" + t].assignment)) for t, mid in (("ra", a), ("rb", b))}
    assert not held[a] & held[b]
    # the consumer-protocol member gets the rest, nothing owned twice
    k = c.hb("k1", joined.member_epoch)
    mine = {(TOPIC, p) for _, p in flatten(k.assignment or {})}
    assert len(mine) >= 1 and not mine & (held[a] | held[b])
    assert mine | held[a] | held[b] == {(TOPIC, p) for p in range(4)}
    # replayed from its records, the group is the same consumer group with its classic members
    m2 = c.reloaded()
    assert m2.groups["g"].consumer is not None and set(m2.groups["g"].consumer.members) == {a, b, "k1"}
    assert m2.groups["g"].consumer.members[a].classic is not None
    assert not m2.groups["g"].members


def catch_up(c: Cluster, *members: str) -> None:
    """Classic members of a consumer group rejoin and sync (as told by REBALANCE_IN_PROGRESS)."""
    for member in members:
        c.join("r" + member, member)
        c.sync("s" + member, member, c.replies["r" + member].generation_id)


def test_the_last_consumer_protocol_member_leaving_downgrades_the_group() -> None:
    c = Cluster()
    a, b = c.classic_group()
    joined = c.consumer_join("k1")
    catch_up(c, a, b)
    epoch = c.m.groups["g"].consumer.group_epoch  # type: ignore[union-attr]
    assert {m.member_epoch for m in c.m.groups["g"].consumer.members.values()} == {epoch}  # type: ignore[union-attr]
    left = c.hb("k1", -1)
    assert left.error == ErrorCode.none and joined.error == ErrorCode.none
    g = c.m.groups["g"]
    assert g.consumer is None and set(g.members) == {a, b}
    # a classic group again, at the generation its members know, rebalancing
    assert g.state is GroupState.PREPARING_REBALANCE
    assert g.generation_id == epoch and g.protocol_name == "range"
    # its members are told to rejoin (not ILLEGAL_GENERATION: their commits still count)
    assert c.m.heartbeat(c.now, "g", a, None, epoch) == ErrorCode.rebalance_in_progress
    assert c.m.consumer_check_member("g", a, epoch) is None  # classic rules now
    c.join("ra", a)
    c.join("rb", b)
    assert c.replies["ra"].generation_id == epoch + 1 and c.replies["ra"].error == ErrorCode.none
    assert {c.replies["ra"].leader_id} == {c.replies["rb"].leader_id}
    m2 = c.reloaded()
    assert m2.groups["g"].consumer is None and set(m2.groups["g"].members) == {a, b}


def test_a_downgrade_waits_for_classic_members_behind_the_group_epoch() -> None:
    """Kafka converts at once and a member behind the epoch gets ILLEGAL_GENERATION (losing
    its partitions uncommitted); here the group stays a consumer group until they caught up."""
    c = Cluster()
    a, b = c.classic_group()
    gen = c.m.groups["g"].generation_id
    c.consumer_join("k1")
    c.hb("k1", -1)  # before a and b rejoined: they are still at the classic generation
    g = c.m.groups["g"]
    assert g.consumer is not None and set(g.consumer.members) == {a, b}
    assert c.m.heartbeat(c.now, "g", a, None, gen) == ErrorCode.rebalance_in_progress
    catch_up(c, a)
    assert c.m.groups["g"].consumer is not None
    catch_up(c, b)  # the last one synced at the group epoch: now the group turns classic
    g = c.m.groups["g"]
    assert g.consumer is None and set(g.members) == {a, b}
    assert g.state is GroupState.PREPARING_REBALANCE
    assert c.m.heartbeat(c.now, "g", a, None, g.generation_id) == ErrorCode.rebalance_in_progress
    assert c.m.heartbeat(c.now, "g", b, None, g.generation_id) == ErrorCode.rebalance_in_progress
    assert c.reloaded().groups["g"].consumer is None


def test_policies_refuse_what_they_do_not_allow() -> None:
    c = Cluster(policy="disabled")
    c.classic_group()
    r = c.consumer_join("k1")
    assert r.error == ErrorCode.group_id_not_found and "not a consumer group" in (r.message or "")
    assert c.m.groups["g"].consumer is None

    up = Cluster(policy="upgrade")
    a, _ = up.classic_group()
    assert up.consumer_join("k1").error == ErrorCode.none
    assert up.hb("k1", -1).error == ErrorCode.none
    # downgrade not allowed: a consumer group serving only classic members
    assert up.m.groups["g"].consumer is not None
    assert set(up.m.groups["g"].consumer.members) == {a, _}

    down = Cluster(policy="downgrade")
    down.classic_group()
    assert down.consumer_join("k1").error == ErrorCode.group_id_not_found


def test_classic_members_of_a_consumer_group_get_kafkas_errors() -> None:
    c = Cluster()
    a, _ = c.classic_group()
    c.consumer_join("k1")
    gen = c.m.groups["g"].consumer.members[a].member_epoch  # type: ignore[union-attr]
    # another protocol type, an assignor the classic members do not share, garbage metadata
    fx = c.m.join(
        c.now,
        group_id="g",
        member_id="",
        group_instance_id=None,
        client_id="c",
        client_host="h",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=20_000,
        protocol_type="connect",
        protocols=[("range", subscription())],
        require_known_member_id=True,
        token="t",
    )
    assert fx.replies[0][1].error == ErrorCode.inconsistent_group_protocol
    c.join("t2", sub=b"\x00")
    assert c.replies["t2"].error == ErrorCode.inconsistent_group_protocol
    # a consumer-protocol member is not a classic one
    assert c.m.heartbeat(c.now, "g", "k1", None, 1) == ErrorCode.unknown_member_id
    c.sync("t3", a, gen + 7)
    assert c.replies["t3"].error == ErrorCode.illegal_generation
    c.sync("t4", a, gen)
    assert c.replies["t4"].error == ErrorCode.rebalance_in_progress  # behind the group epoch: rejoin first
    top, errors, _fx = c.m.leave(c.now, "g", [(a, None), ("nobody", None)])
    assert (top, errors) == (ErrorCode.none, [ErrorCode.none, ErrorCode.unknown_member_id])


def test_a_cooperative_member_revokes_before_its_epoch_moves() -> None:
    c = Cluster()
    a, b = c.classic_group()
    k = c.consumer_join("k1")
    mine = sorted(p for p in range(4) if p % 2 == 0)
    # a v1 subscription says what the member still owns: revocation first, same epoch
    c.join("ra", a, sub=subscription(1, tuple((TOPIC, p) for p in mine)))
    r = c.replies["ra"]
    member = c.m.groups["g"].consumer.members[a]  # type: ignore[union-attr]
    assert member.revoking  # the uniform assignor gives one of its two partitions to k1
    assert r.generation_id == member.member_epoch < c.m.groups["g"].consumer.group_epoch  # type: ignore[union-attr]
    c.sync("sa", a, r.generation_id)
    kept = set(cp.parse_assignment(c.replies["sa"].assignment))
    assert kept < {(TOPIC, p) for p in mine}
    assert c.m.heartbeat(c.now, "g", a, None, r.generation_id) == ErrorCode.rebalance_in_progress
    c.join("ra2", a, sub=subscription(1, tuple(sorted(kept))))
    assert c.replies["ra2"].generation_id == c.m.groups["g"].consumer.group_epoch  # type: ignore[union-attr]
    assert k.error == ErrorCode.none and b


def test_static_members_keep_their_partitions_across_the_protocols() -> None:
    c = Cluster()
    a, b = c.classic_group()
    # a KIP-848 static member joins, then leaves with epoch -2 (it means to come back)
    k = c.hb("k1", 0, {}, rebalance_timeout_ms=30_000, subscribed_topic_names=(TOPIC,), instance_id="i1")
    assert k.error == ErrorCode.none
    catch_up(c, a, b)
    k = c.hb("k1", k.member_epoch, instance_id="i1")
    k = c.hb("k1", k.member_epoch, owned=k.assignment, instance_id="i1")
    parts = flatten(c.m.groups["g"].consumer.members["k1"].assigned)  # type: ignore[union-attr]
    assert parts
    assert c.hb("k1", -2, instance_id="i1").error == ErrorCode.none
    # it comes back as a classic consumer with the same instance id: it takes k1's place and
    # partitions (no rebalance for the others), and the group, now all classic, turns classic
    c.join("rs", "", instance="i1")
    r = c.replies["rs"]
    assert r.error == ErrorCode.none and r.member_id != "k1"
    data = c.m.groups["g"].consumer
    assert data is not None and "k1" not in data.members
    assert flatten(data.members[r.member_id].assigned) == parts
    c.sync("ss", r.member_id, r.generation_id)
    assert {(TOPIC, p) for _, p in parts} == set(cp.parse_assignment(c.replies["ss"].assignment))
    g = c.m.groups["g"]
    assert g.consumer is None and set(g.members) == {a, b, r.member_id}
    assert g.static_members == {"i1": r.member_id}
    # a classic static member restarting (unknown member id) replaces itself; a stale id is fenced
    c.join("rs2", "", instance="i1")  # (waits in the classic group's rebalance)
    assert g.static_members["i1"] != r.member_id
    c.join("old", r.member_id, instance="i1")
    assert c.replies["old"].error == ErrorCode.fenced_instance_id


def test_a_classic_member_that_never_rejoins_is_removed_after_its_rebalance_timeout() -> None:
    c = Cluster()
    a, b = c.classic_group()
    gen = c.m.groups["g"].generation_id
    c.consumer_join("k1")
    assert c.m.heartbeat(c.now, "g", a, None, gen) == ErrorCode.rebalance_in_progress
    assert c.m.deadline_added  # the coordinator wakes its timer for the new deadline
    catch_up(c, b)
    # a keeps heartbeating (its session lives) but never rejoins: gone after its rebalance timeout
    data = c.m.groups["g"].consumer
    assert data is not None
    b_gen = data.members[b].member_epoch
    answers = []
    for _ in range(6):
        c.now += 4_000
        answers.append(c.m.heartbeat(c.now, "g", a, None, gen))
        c.m.heartbeat(c.now, "g", b, None, b_gen)
        c.hb("k1", data.members["k1"].member_epoch)
        c._fx(c.m.tick(c.now))
    # told to rejoin until its rebalance timeout (20 s) ran out, then unknown
    assert answers[:4] == [ErrorCode.rebalance_in_progress] * 4 and answers[-1] == ErrorCode.unknown_member_id
    assert a not in data.members and b in data.members
    assert c.m.consumer_fencings["rebalance_timeout"] == 1


def test_a_static_classic_member_restarting_with_the_consumer_protocol_takes_its_place() -> None:
    """A rolling upgrade of static members: the pod keeps its group.instance.id and comes back
    speaking the consumer protocol; Kafka replaces the classic member at once (no epoch -2)."""
    c = Cluster()
    a, b = c.classic_group(static=True)
    before = c.m.groups["g"].members[a].assignment
    r = c.hb("k-a", 0, {}, rebalance_timeout_ms=30_000, subscribed_topic_names=(TOPIC,), instance_id="i0")
    assert r.error == ErrorCode.none
    data = c.m.groups["g"].consumer
    assert data is not None and set(data.members) == {"k-a", b}
    assert data.members["k-a"].classic is None and data.static_members == {"i0": "k-a", "i1": b}
    assert {(TOPIC, p) for _, p in flatten(r.assignment or {})} == set(cp.parse_assignment(before))
    # the other static member still speaks classic; a second consumer-protocol instance with the
    # same id as a live consumer-protocol member is refused, as in Kafka
    assert data.members[b].classic is not None
    dup = c.hb("k-a2", 0, {}, rebalance_timeout_ms=30_000, subscribed_topic_names=(TOPIC,), instance_id="i0")
    assert dup.error == ErrorCode.unreleased_instance_id
