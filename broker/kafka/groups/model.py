"""The classic consumer-group protocol's data: group and member bookkeeping, the results and
effects the state machine returns, and where a group lives (its `__consumer_offsets` partition).

Pure data and small rules on one group (protocol vote, session deadlines, static fencing);
the transitions between groups' states are in `state.py`, offset bookkeeping in `offsets.py`.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups.log import GroupKey, GroupValue, MemberValue

if TYPE_CHECKING:
    from automq.broker.kafka.groups.consumer import ConsumerGroupData
    from automq.broker.kafka.groups.share import ShareGroupData

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
    initial_rebalance_delay_ms: int = 3_000
    offsets_retention_ms: int = 7 * 24 * 3_600_000
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS
    # KIP-848 consumer groups (group.consumer.*)
    consumer_session_timeout_ms: int = 45_000
    consumer_heartbeat_interval_ms: int = 5_000
    consumer_assignors: tuple[str, ...] = ("uniform", "range")
    consumer_migration_policy: str = "bidirectional"  # group.consumer.migration.policy (migration.py)
    # KIP-932 share groups (group.share.*)
    share_enable: bool = True
    share_session_timeout_ms: int = 45_000
    share_heartbeat_interval_ms: int = 5_000
    share_max_size: int = 200


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
    consumer: ConsumerGroupData | None = None  # set while the group uses the KIP-848 protocol
    share: ShareGroupData | None = None  # set for a KIP-932 share group (a group id is one type for life)

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
            self.leader_id = next(iter(rejoined or list(self.members)), None)
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
