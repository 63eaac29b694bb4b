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

import uuid
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups.consumer import ConsumerGroupData
from automq.broker.kafka.groups.log import (
    ConsumerGroupKey,
    GroupKey,
    GroupValue,
    OffsetKey,
    OffsetValue,
    ShareGroupKey,
)
from automq.broker.kafka.groups.migration import GroupMigration
from automq.broker.kafka.groups.model import (
    CommittedOffset,
    Effects,
    Group,
    GroupConfig,
    GroupState,
    GroupSummary,
    JoinResult,
    Member,
    MemberSummary,
    SyncResult,
    Write,
    consumer_subscription_topics,
    java_string_hashcode,
    partition_for,
)
from automq.broker.kafka.groups.offsets import OffsetBook
from automq.broker.kafka.groups.share import ShareGroupData
from automq.broker.kafka.groups.share_groups import ShareGroups

__all__ = (
    "Effects",
    "GroupConfig",
    "GroupManager",
    "GroupState",
    "JoinResult",
    "SyncResult",
    "Write",
    "consumer_subscription_topics",
    "java_string_hashcode",
    "partition_for",
)

# ---------------------------------------------------------------- the manager


class GroupManager(GroupMigration, ShareGroups, OffsetBook):
    """All groups of the loaded `__consumer_offsets` partitions of one broker."""

    def __init__(self, config: GroupConfig, num_partitions: int) -> None:
        self.config = config
        self.num_partitions = num_partitions
        self.groups: dict[str, Group] = {}
        self._init_consumer_groups()
        self._init_migration()
        self._init_share_groups()

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
        if group.share is not None:
            # a group id is one type for life; a share group never speaks the classic protocol
            fx.reply(token, JoinResult(ErrorCode.inconsistent_group_protocol, member_id))
            return fx
        if group.consumer is not None:
            if group.consumer.members:
                # a KIP-848 group serves classic members too (online migration, migration.py)
                self.classic_join_consumer(
                    group,
                    now_ms,
                    fx,
                    member_id=member_id,
                    group_instance_id=group_instance_id,
                    client_id=client_id,
                    client_host=client_host,
                    session_timeout_ms=session_timeout_ms,
                    rebalance_timeout_ms=rebalance_timeout_ms,
                    protocol_type=protocol_type,
                    protocols=protocols,
                    require_known_member_id=require_known_member_id,
                    token=token,
                )
                return fx
            # an empty KIP-848 group: the classic protocol takes it over
            tombstone = self.consumer_leave_classic(group)
            assert tombstone is not None
            fx.writes.append(tombstone)
            group.protocol_type = None
            group.subscribed_topics = None
            group.transition(GroupState.EMPTY, now_ms)
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
        members: tuple[tuple[str, str | None, bytes], ...] = ()
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
            topics: set[str] = set()
            for m in group.members.values():
                t = consumer_subscription_topics(m.metadata(group.protocol_name))
                if t is None:  # a subscription we cannot read: expire no offsets by topic
                    group.subscribed_topics = None
                    break
                topics |= t
            else:
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
        if group.consumer is not None:
            self.classic_sync_consumer(
                group,
                now_ms,
                fx,
                generation_id=generation_id,
                member_id=member_id,
                group_instance_id=group_instance_id,
                protocol_type=protocol_type,
                protocol_name=protocol_name,
                token=token,
            )
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
        if group.consumer is not None:
            return self.classic_heartbeat_consumer(group, now_ms, member_id, group_instance_id, generation_id)
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
        if group.consumer is not None:
            return ErrorCode.none, self.classic_leave_consumer(group, now_ms, members, fx), fx
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
        deadlines.extend(self.consumer_deadlines())
        deadlines.extend(self.share_deadlines())
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
                    pending = group.members.get(member_id)
                    if pending is not None:
                        self._remove_member_and_update_group(group, pending, now_ms, fx)
                group.pending_sync.clear()
            if group.consumer is None and group.share is None:
                self._check_join_complete(group, now_ms, fx)
        self.consumer_tick(now_ms, fx)
        self.share_tick(now_ms, fx)
        return fx

    # ----- listing

    def list_groups(self, states: Iterable[str] | None = None) -> list[tuple[str, str, str, str]]:
        """(group id, protocol type, state, type: "classic", "consumer" or "share") of every group."""
        wanted = {s.lower() for s in states} if states else None
        out = []
        for g in self.groups.values():
            if g.consumer is not None:
                listed = (g.group_id, "consumer", g.consumer.state_name(), "consumer")
            elif g.share is not None:
                listed = (g.group_id, "share", g.share.state_name(), "share")
            else:
                listed = (g.group_id, g.protocol_type or "", g.state.value, "classic")
            if wanted is None or listed[2].lower() in wanted:
                out.append(listed)
        return out

    def describe(self, group_id: str) -> GroupSummary | None:
        group = self.groups.get(group_id)
        if group is None or group.consumer is not None or group.share is not None:
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
        (OffsetKey | GroupKey | ConsumerGroupKey | ShareGroupKey, OffsetValue | GroupValue | bytes | None)."""
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
            elif isinstance(key, ConsumerGroupKey):
                if value is None:
                    if key.group_id in loaded:
                        loaded[key.group_id].consumer = None
                elif isinstance(value, bytes):
                    try:
                        consumer = ConsumerGroupData.from_json(value, now_ms)
                    except (ValueError, KeyError, TypeError):
                        continue  # unreadable (a newer layout?): the members rejoin
                    g = group_for(key.group_id)
                    g.consumer = consumer
                    g.protocol_type = "consumer"
                    # an upgraded classic group: its members now live in the consumer state
                    g.members, g.static_members, g.leader_id, g.protocol_name = {}, {}, None, None
            elif isinstance(key, ShareGroupKey):
                if value is None:
                    loaded.pop(key.group_id, None)
                elif isinstance(value, bytes):
                    try:
                        share = ShareGroupData.from_json(value, now_ms)
                    except (ValueError, KeyError, TypeError):
                        continue  # unreadable (a newer layout?): the members rejoin
                    g = group_for(key.group_id)
                    g.share = share
                    g.protocol_type = "share"
            elif isinstance(key, GroupKey):
                if value is None:
                    loaded.pop(key.group_id, None)
                elif isinstance(value, GroupValue):
                    g = group_for(key.group_id)
                    g.consumer = None  # a classic record after a consumer one: the group was downgraded
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
            if g.share is not None:
                g.state = GroupState.STABLE if g.share.members else GroupState.EMPTY
                g.subscribed_topics = g.share.subscribed_topics() if g.share.members else None
            elif g.consumer is not None:
                g.state = GroupState.STABLE if g.consumer.members else GroupState.EMPTY
                if g.consumer.members:
                    g.subscribed_topics = g.consumer.subscribed_topics(self.topic_view())
            elif g.members:
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
