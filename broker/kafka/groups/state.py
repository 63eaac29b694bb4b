"""The classic consumer-group protocol as a pure state machine (sans-I/O).

`GroupManager` holds the groups of the `__consumer_offsets` partitions this broker
coordinates. It is driven by requests and by a clock: every operation takes `now_ms` and
returns what happened as `Effects` (replies to deliver to waiting JoinGroup/SyncGroup
requests, identified by an opaque token the caller chose, and records to persist). Timers are
`next_deadline()` + `tick(now_ms)`. No sockets, tasks or storage here, so rebalances are
unit-tested step by step; `coordinator.py` is the thin asyncio layer around it.

The rules follow Kafka's GroupCoordinator (3.x/4.x classic protocol): states Empty,
PreparingRebalance, CompletingRebalance, Stable, Dead; MEMBER_ID_REQUIRED for JoinGroup v4+;
protocol selection by vote; the initial rebalance delay; rebalance and session timeouts;
pending-sync expiry; static membership (group.instance.id) replacing a member without a
rebalance; simple (generation -1) offset commits for standalone consumers.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups.log import GroupKey, GroupValue, MemberValue, OffsetKey, OffsetValue

NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60_000  # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs
OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes default


class GroupState(str, enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 0
    offsets_retention_ms: int = 7 * 24 * 3_600_000
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS


# ---------------------------------------------------------------- results and effects


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # (member_id, instance_id, metadata), leader only
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class Write:
    """One record for the `__consumer_offsets` partition `partition`; value None = tombstone."""

    partition: int
    key: bytes
    value: bytes | None


@dataclass(slots=True)
class Effects:
    replies: list[tuple[Any, JoinResult | SyncResult]] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)

    def reply(self, token: Any, result: JoinResult | SyncResult) -> None:
        if token is not None:
            self.replies.append((token, result))


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int | None = None


@dataclass(slots=True)
class CommitPlan:
    """An accepted OffsetCommit: `writes` must be durable before `GroupManager.complete_commit`."""

    group_id: str
    errors: dict[tuple[str, int], ErrorCode]
    accepted: dict[tuple[str, int], CommittedOffset]
    writes: list[Write]


@dataclass(frozen=True, slots=True)
class MemberSummary:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    members: tuple[MemberSummary, ...]


# ---------------------------------------------------------------- members and groups


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    last_heartbeat_ms: int
    joined_at_ms: int = 0
    assignment: bytes = b""
    join_token: Any = None  # set while a JoinGroup waits for the rebalance to complete
    sync_token: Any = None  # set while a SyncGroup waits for the leader's assignment
    is_new: bool = False

    @property
    def awaiting_join(self) -> bool:
        return self.join_token is not None

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def vote(self, candidates: set[str]) -> str:
        return next(name for name in self.protocol_names() if name in candidates)

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return list(protocols) == list(self.protocols)

    def session_deadline(self, config: GroupConfig) -> int | None:
        """When this member expires, or None while it cannot (it waits in a join or sync)."""
        if self.join_token is not None:
            return self.joined_at_ms + config.new_member_join_timeout_ms if self.is_new else None
        if self.sync_token is not None:
            return None
        return self.last_heartbeat_ms + self.session_timeout_ms


@dataclass(slots=True)
class Group:
    group_id: str
    partition: int
    state: GroupState = GroupState.EMPTY
    state_timestamp_ms: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # insertion order = join order
    pending_members: dict[str, int] = field(default_factory=dict)  # MEMBER_ID_REQUIRED ids -> expiry
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    join_deadline_ms: int | None = None
    initial_delay_remaining_ms: int = 0
    in_initial_delay: bool = False
    new_member_added: bool = False
    pending_sync: set[str] = field(default_factory=set)
    sync_deadline_ms: int | None = None
    subscribed_topics: set[str] | None = None

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp_ms = now_ms

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            # prefer a member that has already rejoined this rebalance
            rejoined = [m.member_id for m in self.members.values() if m.awaiting_join]
            self.leader_id = (rejoined or list(self.members) or [None])[0]
        return member

    def candidate_protocols(self) -> set[str]:
        sets = [set(m.protocol_names()) for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not protocol_type or not protocols:
            return False
        if self.state is GroupState.EMPTY and not self.members:
            return True
        return protocol_type == self.protocol_type and bool({n for n, _ in protocols} & self.candidate_protocols())

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        # most votes; ties go to the earliest member's preference order (deterministic)
        first = next(iter(self.members.values())).protocol_names()
        return max(votes, key=lambda name: (votes[name], -first.index(name) if name in first else -len(first)))

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def is_static_fenced(self, member_id: str, instance_id: str | None) -> bool:
        if instance_id is None:
            return False
        known = self.static_members.get(instance_id)
        return known is not None and known != member_id

    def record(self) -> Write:
        members = tuple(
            MemberValue(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.rebalance_timeout_ms,
                m.session_timeout_ms,
                m.metadata(self.protocol_name),
                m.assignment,
            )
            for m in self.members.values()
        )
        value = GroupValue(
            self.protocol_type or "",
            self.generation_id,
            self.protocol_name,
            self.leader_id,
            self.state_timestamp_ms,
            members,
        )
        return Write(self.partition, GroupKey(self.group_id).encode(), value.encode())


def consumer_subscription_topics(metadata: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (any version: they all start with
    int16 version, array of string topics), or None if it does not parse."""
    try:
        pos = 2
        (count,) = struct.unpack_from(">i", metadata, pos)
        pos += 4
        if count < 0 or count > len(metadata):
            return None
        topics = set()
        for _ in range(count):
            (n,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if n < 0 or pos + n > len(metadata):
                return None
            topics.add(metadata[pos : pos + n].decode())
            pos += n
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


# ---------------------------------------------------------------- the manager


class GroupManager:
    """All groups of the loaded `__consumer_offsets` partitions of one broker."""

    def __init__(self, config: GroupConfig, num_partitions: int) -> None:
        self.config = config
        self.num_partitions = num_partitions
        self.groups: dict[str, Group] = {}

    # ----- placement

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions)

    def _new_group(self, group_id: str, now_ms: int) -> Group:
        group = Group(group_id, self.partition_for(group_id), state_timestamp_ms=now_ms)
        self.groups[group_id] = group
        return group

    # ----- JoinGroup

    def join(
        self,
        now_ms: int,
        *,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
        token: Any,
    ) -> Effects:
        fx = Effects()
        if not group_id:
            fx.reply(token, JoinResult(ErrorCode.invalid_group_id, member_id))
            return fx
        if not self.config.min_session_timeout_ms <= session_timeout_ms <= self.config.max_session_timeout_ms:
            fx.reply(token, JoinResult(ErrorCode.invalid_session_timeout, member_id))
            return fx
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                fx.reply(token, JoinResult(ErrorCode.unknown_member_id, member_id))
                return fx
            group = self._new_group(group_id, now_ms)
        if group.state is GroupState.DEAD:
            fx.reply(token, JoinResult(ErrorCode.coordinator_not_available, member_id))
            return fx
        if not group.supports(protocol_type, protocols):
            fx.reply(token, JoinResult(ErrorCode.inconsistent_group_protocol, member_id))
            return fx
        args = dict(
            group_instance_id=group_instance_id,
            client_id=client_id,
            client_host=client_host,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            protocol_type=protocol_type,
            protocols=list(protocols),
            token=token,
        )
        if not member_id:
            new_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if group_instance_id is not None:
                self._join_static_new(group, now_ms, new_id, fx, **args)
            elif require_known_member_id:
                group.pending_members[new_id] = now_ms + session_timeout_ms
                fx.reply(token, JoinResult(ErrorCode.member_id_required, new_id))
            else:
                self._add_member_and_rebalance(group, now_ms, new_id, fx, **args)
            return fx
        if member_id in group.pending_members:
            del group.pending_members[member_id]
            self._add_member_and_rebalance(group, now_ms, member_id, fx, **args)
            return fx
        if group.is_static_fenced(member_id, group_instance_id):
            fx.reply(token, JoinResult(ErrorCode.fenced_instance_id, member_id))
            return fx
        member = group.members.get(member_id)
        if member is None or group.state is GroupState.EMPTY:
            fx.reply(token, JoinResult(ErrorCode.unknown_member_id, member_id))
            return fx
        if group.state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, now_ms, fx, **args)
        elif group.state is GroupState.COMPLETING_REBALANCE:
            if member.matches(protocols):
                # a resent JoinGroup (the response was lost): answer with the current generation
                fx.reply(token, self._join_result(group, member, include_members=group.is_leader(member_id)))
            else:
                self._update_member_and_rebalance(group, member, now_ms, fx, **args)
        else:  # Stable
            if group.is_leader(member_id) or not member.matches(protocols):
                self._update_member_and_rebalance(group, member, now_ms, fx, **args)
            else:
                fx.reply(token, self._join_result(group, member, include_members=False))
        return fx

    def _join_result(
        self, group: Group, member: Member, include_members: bool, skip_assignment: bool = False
    ) -> JoinResult:
        members = ()
        if include_members:
            members = tuple(
                (m.member_id, m.group_instance_id, m.metadata(group.protocol_name)) for m in group.members.values()
            )
        return JoinResult(
            ErrorCode.none,
            member.member_id,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            members,
            skip_assignment,
        )

    def _add_member_and_rebalance(
        self, group: Group, now_ms: int, member_id: str, fx: Effects, *, token: Any, **args: Any
    ) -> None:
        member = Member(
            member_id=member_id, last_heartbeat_ms=now_ms, joined_at_ms=now_ms, join_token=token, is_new=True, **args
        )
        if group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True  # lets the initial delay extend
        group.add(member)
        self._maybe_prepare_rebalance(group, now_ms, fx)
        self._check_join_complete(group, now_ms, fx)

    def _update_member_and_rebalance(
        self, group: Group, member: Member, now_ms: int, fx: Effects, *, token: Any, **args: Any
    ) -> None:
        if member.join_token is not None and member.join_token is not token:
            # a newer JoinGroup from the same member supersedes the one still waiting
            fx.reply(member.join_token, JoinResult(ErrorCode.rebalance_in_progress, member.member_id))
        member.protocols = args["protocols"]
        member.rebalance_timeout_ms = args["rebalance_timeout_ms"]
        member.session_timeout_ms = args["session_timeout_ms"]
        member.join_token = token
        member.joined_at_ms = now_ms
        member.last_heartbeat_ms = now_ms
        self._maybe_prepare_rebalance(group, now_ms, fx)
        self._check_join_complete(group, now_ms, fx)

    def _join_static_new(self, group: Group, now_ms: int, new_id: str, fx: Effects, *, token: Any, **args: Any) -> None:
        instance_id = args["group_instance_id"]
        old_id = group.static_members.get(instance_id)
        if old_id is None or old_id not in group.members:
            self._add_member_and_rebalance(group, now_ms, new_id, fx, token=token, **args)
            return
        # A known static member restarted: it takes over its old identity without a rebalance.
        old = group.members.pop(old_id)
        fx.reply(old.join_token, JoinResult(ErrorCode.fenced_instance_id, old_id))
        fx.reply(old.sync_token, SyncResult(ErrorCode.fenced_instance_id))
        protocols_changed = not old.matches(args["protocols"])
        member = Member(
            member_id=new_id,
            last_heartbeat_ms=now_ms,
            joined_at_ms=now_ms,
            assignment=old.assignment,
            **args,
        )
        group.members[new_id] = member
        group.static_members[instance_id] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(new_id)
        if group.state is GroupState.STABLE and not protocols_changed:
            fx.writes.append(group.record())
            # KIP-814: a replaced leader gets the members but must not run a new assignment
            leader = group.is_leader(new_id)
            fx.reply(token, self._join_result(group, member, include_members=leader, skip_assignment=leader))
        else:
            member.join_token = token
            self._maybe_prepare_rebalance(group, now_ms, fx)
            self._check_join_complete(group, now_ms, fx)

    def _maybe_prepare_rebalance(self, group: Group, now_ms: int, fx: Effects) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(group, now_ms, fx)

    def _prepare_rebalance(self, group: Group, now_ms: int, fx: Effects) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._propagate_sync_error(group, ErrorCode.rebalance_in_progress, fx)
        group.pending_sync.clear()
        group.sync_deadline_ms = None
        if group.state is GroupState.EMPTY:
            delay = self.config.initial_rebalance_delay_ms
            group.in_initial_delay = True
            group.new_member_added = False
            group.initial_delay_remaining_ms = max(group.rebalance_timeout_ms() - delay, 0)
            group.join_deadline_ms = now_ms + delay
        else:
            group.in_initial_delay = False
            group.join_deadline_ms = now_ms + group.rebalance_timeout_ms()
        group.transition(GroupState.PREPARING_REBALANCE, now_ms)

    def _propagate_sync_error(self, group: Group, error: ErrorCode, fx: Effects) -> None:
        for m in group.members.values():
            m.assignment = b""
            if m.sync_token is not None:
                fx.reply(m.sync_token, SyncResult(error))
                m.sync_token = None

    def _check_join_complete(self, group: Group, now_ms: int, fx: Effects) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE or group.join_deadline_ms is None:
            return
        if group.in_initial_delay:
            if now_ms < group.join_deadline_ms:
                return
            if group.new_member_added and group.initial_delay_remaining_ms > 0:
                # members keep arriving: wait another delay (bounded by the rebalance timeout)
                step = min(self.config.initial_rebalance_delay_ms, group.initial_delay_remaining_ms)
                group.initial_delay_remaining_ms -= step
                group.new_member_added = False
                group.join_deadline_ms = now_ms + step
                return
        elif not group.all_joined() and now_ms < group.join_deadline_ms:
            return
        self._complete_join(group, now_ms, fx)

    def _complete_join(self, group: Group, now_ms: int, fx: Effects) -> None:
        for m in [m for m in group.members.values() if not m.awaiting_join]:
            group.remove(m.member_id)  # did not rejoin within the rebalance timeout
            fx.reply(m.sync_token, SyncResult(ErrorCode.unknown_member_id))
        group.join_deadline_ms = None
        group.in_initial_delay = False
        group.generation_id += 1
        if not group.members:
            group.protocol_name = None
            group.subscribed_topics = None
            group.transition(GroupState.EMPTY, now_ms)
            fx.writes.append(group.record())
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        if group.protocol_type == "consumer":
            topics: set[str] | None = set()
            for m in group.members.values():
                t = consumer_subscription_topics(m.metadata(group.protocol_name))
                if t is None:
                    topics = None
                    break
                topics |= t
            group.subscribed_topics = topics
        else:
            group.subscribed_topics = None
        group.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        for m in group.members.values():
            fx.reply(m.join_token, self._join_result(group, m, include_members=group.is_leader(m.member_id)))
            m.join_token = None
            m.is_new = False
            m.last_heartbeat_ms = now_ms
        group.pending_sync = set(group.members)
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms()

    # ----- SyncGroup

    def sync(
        self,
        now_ms: int,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
        token: Any,
    ) -> Effects:
        fx = Effects()
        group = self.groups.get(group_id)
        if group is None:
            fx.reply(token, SyncResult(ErrorCode.unknown_member_id))
            return fx
        if group.state is GroupState.DEAD:
            fx.reply(token, SyncResult(ErrorCode.coordinator_not_available))
            return fx
        if group.is_static_fenced(member_id, group_instance_id):
            fx.reply(token, SyncResult(ErrorCode.fenced_instance_id))
            return fx
        member = group.members.get(member_id)
        if member is None:
            fx.reply(token, SyncResult(ErrorCode.unknown_member_id))
            return fx
        if generation_id != group.generation_id:
            fx.reply(token, SyncResult(ErrorCode.illegal_generation))
            return fx
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            fx.reply(token, SyncResult(ErrorCode.inconsistent_group_protocol))
            return fx
        if group.state is GroupState.EMPTY:
            fx.reply(token, SyncResult(ErrorCode.unknown_member_id))
        elif group.state is GroupState.PREPARING_REBALANCE:
            fx.reply(token, SyncResult(ErrorCode.rebalance_in_progress))
        elif group.state is GroupState.COMPLETING_REBALANCE:
            if member.sync_token is not None and member.sync_token is not token:
                fx.reply(member.sync_token, SyncResult(ErrorCode.rebalance_in_progress))
            member.sync_token = token
            member.last_heartbeat_ms = now_ms
            group.pending_sync.discard(member_id)
            if group.is_leader(member_id):
                for m in group.members.values():
                    m.assignment = assignments.get(m.member_id, b"")
                group.transition(GroupState.STABLE, now_ms)
                fx.writes.append(group.record())
                for m in group.members.values():
                    if m.sync_token is not None:
                        fx.reply(
                            m.sync_token,
                            SyncResult(ErrorCode.none, group.protocol_type, group.protocol_name, m.assignment),
                        )
                        m.sync_token = None
                        m.last_heartbeat_ms = now_ms
        else:  # Stable: the assignment is known
            group.pending_sync.discard(member_id)
            member.last_heartbeat_ms = now_ms
            fx.reply(token, SyncResult(ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment))
        return fx

    # ----- Heartbeat / LeaveGroup

    def heartbeat(
        self, now_ms: int, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if group.is_static_fenced(member_id, group_instance_id):
            return ErrorCode.fenced_instance_id
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.state is GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        member.last_heartbeat_ms = now_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(
        self, now_ms: int, group_id: str, members: list[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[ErrorCode], Effects]:
        """(group error, one error per (member_id, instance_id) asked, effects)."""
        fx = Effects()
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.none, [ErrorCode.unknown_member_id] * len(members), fx
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, [ErrorCode.coordinator_not_available] * len(members), fx
        errors = []
        for member_id, instance_id in members:
            if instance_id is not None:
                known = group.static_members.get(instance_id)
                if known is None:
                    errors.append(ErrorCode.unknown_member_id)
                    continue
                if member_id and known != member_id:
                    errors.append(ErrorCode.fenced_instance_id)
                    continue
                member_id = known
            if member_id in group.pending_members:
                del group.pending_members[member_id]
                self._check_join_complete(group, now_ms, fx)
                errors.append(ErrorCode.none)
                continue
            member = group.members.get(member_id)
            if member is None:
                errors.append(ErrorCode.unknown_member_id)
                continue
            self._remove_member_and_update_group(group, member, now_ms, fx)
            errors.append(ErrorCode.none)
        return ErrorCode.none, errors, fx

    def _remove_member_and_update_group(self, group: Group, member: Member, now_ms: int, fx: Effects) -> None:
        fx.reply(member.join_token, JoinResult(ErrorCode.unknown_member_id, ""))
        member.join_token = None
        fx.reply(member.sync_token, SyncResult(ErrorCode.unknown_member_id))
        member.sync_token = None
        group.remove(member.member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, now_ms, fx)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._check_join_complete(group, now_ms, fx)

    # ----- timers

    def next_deadline(self) -> int | None:
        deadlines: list[int] = []
        for group in self.groups.values():
            deadlines.extend(group.pending_members.values())
            for m in group.members.values():
                d = m.session_deadline(self.config)
                if d is not None:
                    deadlines.append(d)
            if group.state is GroupState.PREPARING_REBALANCE and group.join_deadline_ms is not None:
                deadlines.append(group.join_deadline_ms)
            if group.pending_sync and group.sync_deadline_ms is not None:
                deadlines.append(group.sync_deadline_ms)
        return min(deadlines, default=None)

    def tick(self, now_ms: int) -> Effects:
        fx = Effects()
        for group in list(self.groups.values()):
            for pending_id, deadline in list(group.pending_members.items()):
                if now_ms >= deadline:
                    del group.pending_members[pending_id]
            for member in list(group.members.values()):
                d = member.session_deadline(self.config)
                if d is not None and now_ms >= d and member.member_id in group.members:
                    self._remove_member_and_update_group(group, member, now_ms, fx)
            if (
                group.pending_sync
                and group.sync_deadline_ms is not None
                and now_ms >= group.sync_deadline_ms
                and group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
            ):
                # members that never sent SyncGroup after the rebalance are gone
                for member_id in list(group.pending_sync):
                    member = group.members.get(member_id)
                    if member is not None:
                        self._remove_member_and_update_group(group, member, now_ms, fx)
                group.pending_sync.clear()
            self._check_join_complete(group, now_ms, fx)
        return fx

    # ----- offsets

    def prepare_commit(
        self,
        now_ms: int,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[tuple[str, int, int, int, str | None]],
        retention_ms: int = -1,
    ) -> CommitPlan:
        """Validate an OffsetCommit of (topic, partition, offset, leader_epoch, metadata)."""
        keys = [(t, p) for t, p, *_ in offsets]

        def fail(error: ErrorCode) -> CommitPlan:
            return CommitPlan(group_id, dict.fromkeys(keys, error), {}, [])

        if not group_id:
            return fail(ErrorCode.invalid_group_id)
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return fail(ErrorCode.illegal_generation)  # a member of a generation we never saw
            group = self._new_group(group_id, now_ms)  # offsets-only (standalone) group
        if group.state is GroupState.DEAD:
            return fail(ErrorCode.coordinator_not_available)
        if generation_id >= 0 or member_id or group_instance_id is not None:
            if group.is_static_fenced(member_id, group_instance_id):
                return fail(ErrorCode.fenced_instance_id)
            if member_id not in group.members:
                return fail(ErrorCode.unknown_member_id)
            if generation_id != group.generation_id:
                return fail(ErrorCode.illegal_generation)
        elif group.state is not GroupState.EMPTY:
            return fail(ErrorCode.unknown_member_id)  # only members commit for a group with members
        if group.state is GroupState.COMPLETING_REBALANCE:
            return fail(ErrorCode.rebalance_in_progress)
        member = group.members.get(member_id)
        if member is not None:
            member.last_heartbeat_ms = now_ms
        errors: dict[tuple[str, int], ErrorCode] = {}
        accepted: dict[tuple[str, int], CommittedOffset] = {}
        writes = []
        expire = now_ms + retention_ms if retention_ms >= 0 else None
        for topic, partition, offset, leader_epoch, metadata in offsets:
            meta = metadata or ""
            if len(meta.encode()) > OFFSET_METADATA_MAX_BYTES:
                errors[(topic, partition)] = ErrorCode.offset_metadata_too_large
                continue
            committed = CommittedOffset(offset, leader_epoch, meta, now_ms, expire)
            accepted[(topic, partition)] = committed
            errors[(topic, partition)] = ErrorCode.none
            writes.append(
                Write(
                    group.partition,
                    OffsetKey(group_id, topic, partition).encode(),
                    OffsetValue(offset, leader_epoch, meta, now_ms, expire).encode(),
                )
            )
        return CommitPlan(group_id, errors, accepted, writes)

    def complete_commit(self, plan: CommitPlan, now_ms: int) -> None:
        """The plan's writes are durable: make the offsets visible."""
        group = self.groups.get(plan.group_id)
        if group is None:
            group = self._new_group(plan.group_id, now_ms)
        group.offsets.update(plan.accepted)

    def fetch_offsets(
        self, group_id: str, partitions: list[tuple[str, int]] | None
    ) -> list[tuple[str, int, CommittedOffset | None]]:
        """Committed offsets of `partitions` (None: every partition the group has)."""
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None else {}
        if partitions is None:
            return [(t, p, o) for (t, p), o in sorted(offsets.items())]
        return [(t, p, offsets.get((t, p))) for t, p in partitions]

    def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode], Effects]:
        fx = Effects()
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.group_id_not_found, {}, fx
        errors: dict[tuple[str, int], ErrorCode] = {}
        if group.state is not GroupState.EMPTY:
            if group.protocol_type != "consumer":
                return ErrorCode.non_empty_group, {}, fx
            for t, p in partitions:
                if group.subscribed_topics is not None and t in group.subscribed_topics:
                    errors[(t, p)] = ErrorCode.group_subscribed_to_topic
        for t, p in partitions:
            if (t, p) in errors:
                continue
            errors[(t, p)] = ErrorCode.none
            if group.offsets.pop((t, p), None) is not None:
                fx.writes.append(Write(group.partition, OffsetKey(group_id, t, p).encode(), None))
        return ErrorCode.none, errors, fx

    def delete_group(self, group_id: str, now_ms: int) -> tuple[ErrorCode, Effects]:
        fx = Effects()
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.group_id_not_found, fx
        if group.state is not GroupState.EMPTY or group.members:
            return ErrorCode.non_empty_group, fx
        self._drop_group(group, now_ms, fx)
        return ErrorCode.none, fx

    def _drop_group(self, group: Group, now_ms: int, fx: Effects) -> None:
        for t, p in list(group.offsets):
            fx.writes.append(Write(group.partition, OffsetKey(group.group_id, t, p).encode(), None))
        fx.writes.append(Write(group.partition, GroupKey(group.group_id).encode(), None))
        group.offsets.clear()
        group.transition(GroupState.DEAD, now_ms)
        del self.groups[group.group_id]

    def expire_offsets(self, now_ms: int) -> Effects:
        """Kafka's offset retention (offsets.retention.ms): in an Empty group, an offset expires
        that long after the group became empty (consumer groups) or after its commit
        (standalone groups, no protocol type); in a Stable consumer group, offsets of topics no
        member subscribes to expire that long after their commit; an explicit expiry from
        OffsetCommit v2-v4 wins. An Empty group left without offsets is deleted."""
        fx = Effects()
        retention = self.config.offsets_retention_ms
        for group in list(self.groups.values()):
            if group.state is GroupState.EMPTY:
                candidates = list(group.offsets.items())
                # a group with a protocol type counts from when it became Empty; a standalone one
                # from each offset's commit (bound now: `group` changes with the loop)
                base_of = (
                    (lambda o, since=group.state_timestamp_ms: since) if group.protocol_type else _commit_timestamp
                )
            elif (
                group.state is GroupState.STABLE
                and group.protocol_type == "consumer"
                and group.subscribed_topics is not None
            ):
                subscribed = group.subscribed_topics
                candidates = [(k, o) for k, o in group.offsets.items() if k[0] not in subscribed]
                base_of = _commit_timestamp
            else:
                continue
            for (t, p), o in candidates:
                if o.expire_timestamp_ms is not None:
                    expired = now_ms >= o.expire_timestamp_ms
                else:
                    expired = retention >= 0 and now_ms - base_of(o) >= retention
                if expired:
                    del group.offsets[(t, p)]
                    fx.writes.append(Write(group.partition, OffsetKey(group.group_id, t, p).encode(), None))
            if group.state is GroupState.EMPTY and not group.offsets and not group.members:
                self._drop_group(group, now_ms, fx)
        return fx

    # ----- listing

    def list_groups(self, states: Iterable[str] | None = None) -> list[tuple[str, str, str]]:
        wanted = {s.lower() for s in states} if states else None
        return [
            (g.group_id, g.protocol_type or "", g.state.value)
            for g in self.groups.values()
            if wanted is None or g.state.value.lower() in wanted
        ]

    def describe(self, group_id: str) -> GroupSummary | None:
        group = self.groups.get(group_id)
        if group is None:
            return None
        stable = group.state is GroupState.STABLE
        members = tuple(
            MemberSummary(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(group.protocol_name) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return GroupSummary(
            group.group_id,
            group.state.value,
            group.protocol_type or "",
            (group.protocol_name or "") if stable else "",
            members,
        )

    # ----- loading and unloading partitions

    def load(self, partition: int, records: Iterable[tuple[object, object | None]], now_ms: int) -> None:
        """Rebuild the groups of one partition from its decoded records in log order:
        (OffsetKey | GroupKey, OffsetValue | GroupValue | None)."""
        self.unload(partition)
        loaded: dict[str, Group] = {}

        def group_for(group_id: str) -> Group:
            g = loaded.get(group_id)
            if g is None:
                g = loaded[group_id] = Group(group_id, partition, state_timestamp_ms=now_ms)
            return g

        for key, value in records:
            if isinstance(key, OffsetKey):
                if value is None:
                    if key.group_id in loaded:
                        loaded[key.group_id].offsets.pop((key.topic, key.partition), None)
                elif isinstance(value, OffsetValue):
                    group_for(key.group_id).offsets[(key.topic, key.partition)] = CommittedOffset(
                        value.offset,
                        value.leader_epoch,
                        value.metadata,
                        value.commit_timestamp_ms,
                        value.expire_timestamp_ms,
                    )
            elif isinstance(key, GroupKey):
                if value is None:
                    loaded.pop(key.group_id, None)
                elif isinstance(value, GroupValue):
                    g = group_for(key.group_id)
                    g.protocol_type = value.protocol_type or None
                    g.generation_id = value.generation_id
                    g.protocol_name = value.protocol_name
                    g.leader_id = value.leader_id
                    g.state_timestamp_ms = value.state_timestamp_ms
                    g.members = {}
                    g.static_members = {}
                    for mv in value.members:
                        g.add(
                            Member(
                                member_id=mv.member_id,
                                group_instance_id=mv.group_instance_id,
                                client_id=mv.client_id,
                                client_host=mv.client_host,
                                rebalance_timeout_ms=mv.rebalance_timeout_ms,
                                session_timeout_ms=mv.session_timeout_ms,
                                protocol_type=value.protocol_type,
                                protocols=[(value.protocol_name or "", mv.subscription)],
                                last_heartbeat_ms=now_ms,
                                assignment=mv.assignment,
                            )
                        )
                    g.leader_id = value.leader_id
        for g in loaded.values():
            if g.members:
                # members keep their generation: they heartbeat on as if nothing happened
                g.state = GroupState.STABLE
                if g.protocol_type == "consumer":
                    topics: set[str] = set()
                    for m in g.members.values():
                        topics |= consumer_subscription_topics(m.metadata(g.protocol_name)) or set()
                    g.subscribed_topics = topics
            else:
                g.state = GroupState.EMPTY
            self.groups[g.group_id] = g

    def unload(self, partition: int) -> Effects:
        """Drop the groups of a partition this broker no longer coordinates; waiting
        JoinGroup/SyncGroup requests are told NOT_COORDINATOR so clients look again."""
        fx = Effects()
        for group in [g for g in self.groups.values() if g.partition == partition]:
            for m in group.members.values():
                fx.reply(m.join_token, JoinResult(ErrorCode.not_coordinator, m.member_id))
                fx.reply(m.sync_token, SyncResult(ErrorCode.not_coordinator))
                m.join_token = m.sync_token = None
            del self.groups[group.group_id]
        return fx


def _commit_timestamp(offset: CommittedOffset) -> int:
    return offset.commit_timestamp_ms


def java_string_hashcode(value: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... over UTF-16 code units, as int32."""
    h = 0
    raw = value.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + ((raw[i] << 8) | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """Kafka's rule: Utils.abs(groupId.hashCode) % partitions (Utils.abs(MIN_VALUE) = 0)."""
    h = java_string_hashcode(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions
