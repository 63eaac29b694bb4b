"""Online migration between the classic and the KIP-848 consumer protocol (Kafka 4.x,
`group.consumer.migration.policy`): a mixin of `GroupManager`.

- Upgrade: a ConsumerGroupHeartbeat joining a non-empty classic group of the consumer
  protocol type converts it into a KIP-848 group. Each classic member becomes a member at
  the classic generation (group epoch = generation) keeping its assignment as its target, so
  nothing moves until the joining member bumps the epoch. JoinGroup/SyncGroup waiting in a
  rebalance are answered REBALANCE_IN_PROGRESS.
- Classic members of a KIP-848 group speak JoinGroup/SyncGroup/Heartbeat/LeaveGroup as
  before: the broker assigns their partitions (the server-side assignor; the client's own is
  not run), a heartbeat answers REBALANCE_IN_PROGRESS when the member must rejoin to revoke
  or to get more, and their generation id is their member epoch. New classic members may join
  such a group whatever the policy, as in Kafka.
- Downgrade: when the last consumer-protocol member leaves or is fenced and classic members
  remain, the group turns classic again at generation = group epoch with the target
  assignment, then rebalances (its members rejoin on REBALANCE_IN_PROGRESS); if some classic
  member is still behind that epoch, only once the last of them has synced (`_maybe_downgrade`).

Conversions are written like any change (the group's record in `__consumer_offsets`: a
consumer-group record for an upgrade, a tombstone of it and a classic group record for a
downgrade), so they survive a coordinator move; a record of either kind replaces the other
when the log is replayed (state.GroupManager.load).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups import consumer_protocol as cp
from automq.broker.kafka.groups.consumer import (
    STABLE,
    UNRELEASED,
    UNREVOKED,
    ClassicProtocol,
    ConsumerGroupData,
    ConsumerMember,
    Partitions,
    TopicView,
    flatten,
    names_by_id,
    nest,
)
from automq.broker.kafka.groups.consumer_groups import ConsumerGroups
from automq.broker.kafka.groups.log import ConsumerGroupKey
from automq.broker.kafka.groups.model import (
    Effects,
    Group,
    GroupState,
    JoinResult,
    Member,
    SyncResult,
    Write,
    consumer_subscription_topics,
)

log = logging.getLogger(__name__)

PROTOCOL_TYPE = "consumer"
POLICIES = ("bidirectional", "upgrade", "downgrade", "disabled")


class GroupMigration(ConsumerGroups):
    """Conversions and classic requests to KIP-848 groups over `self.groups`."""

    # for metrics, since this manager started: groups converted online, by direction
    migrations: dict[str, int]

    # set when a classic heartbeat gave its member a deadline: the coordinator wakes its timer
    deadline_added: bool

    def _init_migration(self) -> None:
        self.migrations = {"upgrade": 0, "downgrade": 0}
        self.deadline_added = False

    def _prepare_rebalance(self, group: Group, now_ms: int, fx: Effects) -> None:
        raise NotImplementedError

    @property
    def upgrade_enabled(self) -> bool:
        return self.config.consumer_migration_policy in ("bidirectional", "upgrade")

    @property
    def downgrade_enabled(self) -> bool:
        return self.config.consumer_migration_policy in ("bidirectional", "downgrade")

    # ----- upgrade: classic -> consumer

    def _upgrade(self, group: Group, now_ms: int, fx: Effects) -> bool:
        """Turn a non-empty classic group into a KIP-848 group; False when Kafka would refuse
        (policy, another protocol type, unreadable subscriptions)."""
        if not self.upgrade_enabled:
            log.info("classic group %r not upgraded: online upgrade is disabled", group.group_id)
            return False
        if group.protocol_type != PROTOCOL_TYPE:
            log.info("classic group %r not upgraded: protocol type %r", group.group_id, group.protocol_type)
            return False
        view = self.topic_view()
        data = ConsumerGroupData(group_epoch=group.generation_id, assignment_epoch=group.generation_id)
        try:
            for m in group.members.values():
                member = self._from_classic(m, group, view, now_ms)
                data.members[member.member_id] = member
                if member.instance_id is not None:
                    data.static_members[member.instance_id] = member.member_id
                data.target[member.member_id] = {t: set(ps) for t, ps in member.assigned.items()}
        except cp.ProtocolError as exc:
            log.warning("classic group %r not upgraded: unreadable consumer protocol (%s)", group.group_id, exc)
            return False
        for m in group.members.values():
            fx.reply(m.join_token, JoinResult(ErrorCode.rebalance_in_progress, m.member_id))
            fx.reply(m.sync_token, SyncResult(ErrorCode.rebalance_in_progress))
            m.join_token = m.sync_token = None
        group.members = {}
        group.static_members = {}
        group.pending_members = {}
        group.pending_sync = set()
        group.leader_id = None
        group.protocol_name = None
        group.join_deadline_ms = group.sync_deadline_ms = None
        group.in_initial_delay = False
        group.consumer = data
        group.protocol_type = PROTOCOL_TYPE
        group.transition(GroupState.STABLE, now_ms)
        self.migrations["upgrade"] += 1
        log.info("classic group %r upgraded to a consumer group at epoch %d", group.group_id, data.group_epoch)
        return True

    @staticmethod
    def _from_classic(m: Member, group: Group, view: TopicView, now_ms: int) -> ConsumerMember:
        metadata = m.metadata(group.protocol_name) if group.protocol_name else m.protocols[0][1]
        sub = cp.parse_subscription(metadata)
        epoch = group.generation_id
        return ConsumerMember(
            member_id=m.member_id,
            instance_id=m.group_instance_id,
            rack_id=sub.rack_id,
            client_id=m.client_id,
            client_host=m.client_host,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            subscribed_topic_names=tuple(sorted(set(sub.topics))),
            member_epoch=epoch,
            previous_member_epoch=epoch,
            state=STABLE,
            assigned=_by_id(cp.parse_assignment(m.assignment), view),
            classic=ClassicProtocol(m.session_timeout_ms, tuple(m.protocols)),
            last_heartbeat_ms=now_ms,
        )

    # ----- downgrade: consumer -> classic

    def _maybe_downgrade(self, group: Group, generation: int | None, now_ms: int, fx: Effects) -> bool:
        """Turn the group classic at `generation` if only classic members remain and every one
        of them is at that epoch (policy allowing). Called with the group epoch from before
        a consumer-protocol member's departure (as in Kafka, the departure that converts does
        not bump the epoch), and with the current group epoch after a classic member synced.

        A classic member's generation must match the classic group's, else its heartbeats and
        commits get ILLEGAL_GENERATION and it drops its partitions without committing (records
        are consumed twice). Kafka converts regardless; here a group whose classic members are
        still catching up (e.g. a cooperative member between its revocation and its rejoin)
        stays a consumer group serving them until the last one has synced at the group epoch."""
        data = group.consumer
        if data is None or generation is None or not data.members:
            return False
        if any(m.classic is None for m in data.members.values()):
            return False
        if not self.downgrade_enabled:
            log.info("consumer group %r not downgraded: online downgrade is disabled", group.group_id)
            return False
        if any(m.member_epoch != generation for m in data.members.values()):
            return False  # they rejoin (REBALANCE_IN_PROGRESS) and the last sync converts
        view = self.topic_view()
        names = names_by_id(view)
        classic = Group(group.group_id, group.partition, offsets=group.offsets)
        for m in data.members.values():
            assert m.classic is not None
            classic.add(
                Member(
                    member_id=m.member_id,
                    group_instance_id=m.instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout_ms=m.rebalance_timeout_ms,
                    session_timeout_ms=m.classic.session_timeout_ms,
                    protocol_type=PROTOCOL_TYPE,
                    protocols=list(m.classic.protocols),
                    last_heartbeat_ms=now_ms,
                    joined_at_ms=now_ms,
                )
            )
        if not classic.candidate_protocols():
            return False  # members that agree on no assignor: stay a consumer group
        protocol = classic.select_protocol()
        for member in classic.members.values():
            target = data.target.get(member.member_id, {})
            by_name: dict[str, list[int]] = {}
            for topic_id, ps in target.items():
                if topic_id in names:
                    by_name.setdefault(names[topic_id], []).extend(ps)
            member.assignment = cp.encode_assignment(cp.subscription_version(member.metadata(protocol)), by_name)
        group.consumer = None
        group.members = classic.members
        group.static_members = classic.static_members
        group.leader_id = classic.leader_id
        group.protocol_type = PROTOCOL_TYPE
        group.protocol_name = protocol
        group.generation_id = generation
        group.pending_members = {}
        group.pending_sync = set()
        topics: set[str] = set()
        for member in group.members.values():
            topics |= consumer_subscription_topics(member.metadata(protocol)) or set()
        group.subscribed_topics = topics
        group.transition(GroupState.STABLE, now_ms)
        fx.writes.append(Write(group.partition, ConsumerGroupKey(group.group_id).encode(), None))
        fx.writes.append(group.record())
        # the classic members learn the new generation by rejoining
        self._prepare_rebalance(group, now_ms, fx)
        self.migrations["downgrade"] += 1
        log.info("consumer group %r downgraded to a classic group at generation %d", group.group_id, generation)
        return True

    # ----- classic requests to a KIP-848 group

    def _classic_member(
        self, data: ConsumerGroupData, member_id: str, instance_id: str | None
    ) -> ConsumerMember | ErrorCode:
        if instance_id is not None:
            known = data.static_members.get(instance_id)
            if known is None:
                return ErrorCode.unknown_member_id
            if known != member_id:
                return ErrorCode.fenced_instance_id
        member = data.members.get(member_id)
        if member is None or member.classic is None:
            return ErrorCode.unknown_member_id
        return member

    def classic_join_consumer(
        self,
        group: Group,
        now_ms: int,
        fx: Effects,
        *,
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
    ) -> None:
        data = group.consumer
        assert data is not None

        def fail(code: ErrorCode, mid: str = member_id) -> None:
            fx.reply(token, JoinResult(code, mid))

        if protocol_type != PROTOCOL_TYPE or not protocols:
            return fail(ErrorCode.inconsistent_group_protocol)
        classic_members = [m.classic for m in data.members.values() if m.classic is not None]
        if classic_members and not any(all(name in c.names() for c in classic_members) for name, _ in protocols):
            return fail(ErrorCode.inconsistent_group_protocol)
        try:
            sub = cp.parse_subscription(protocols[0][1])
        except cp.ProtocolError:
            return fail(ErrorCode.inconsistent_group_protocol)
        unknown = not member_id
        if unknown:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id and group_instance_id is None:
                return fail(ErrorCode.member_id_required, member_id)
        view = self.topic_view()
        member: ConsumerMember | None = None
        if group_instance_id is not None and group_instance_id in data.static_members:
            previous_id = data.static_members[group_instance_id]
            if previous_id != member_id:
                if not unknown:
                    return fail(ErrorCode.fenced_instance_id)
                # a restarted static member takes its predecessor's place and partitions
                target = data.target.get(previous_id)
                previous = self.consumer_rules.remove(data, previous_id)
                assert previous is not None
                previous.member_id = member_id
                previous.sent = None
                member = previous
                data.members[member_id] = member
                data.static_members[group_instance_id] = member_id
                if target is not None:
                    data.target[member_id] = target
        if member is None:
            member = data.members.get(member_id)
            if member is not None and member.classic is None:
                return fail(ErrorCode.unknown_member_id)  # a consumer-protocol member's id
        is_new = member is None
        if member is None:
            member = ConsumerMember(member_id=member_id, last_heartbeat_ms=now_ms)
            data.members[member_id] = member
            if group_instance_id is not None:
                data.static_members[group_instance_id] = member_id
        topics = tuple(sorted(set(sub.topics)))
        bump = is_new or topics != member.subscribed_topic_names or member.subscribed_topic_regex is not None
        member.instance_id = group_instance_id
        member.rack_id = sub.rack_id
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.client_id = client_id
        member.client_host = client_host
        member.subscribed_topic_names = topics
        member.subscribed_topic_regex = None
        member.server_assignor = None
        member.classic = ClassicProtocol(session_timeout_ms, tuple(protocols))
        member.last_heartbeat_ms = now_ms
        epoch_before = data.group_epoch
        self.consumer_rules.refresh(data, view, bump=bump)
        self.consumer_rebalances += data.group_epoch - epoch_before
        owned = _by_id(sub.owned, view)
        self.consumer_rules.reconcile(data, member, owned, now_ms)
        if member.state == UNREVOKED:
            # what the client no longer owns (an eager client owns nothing when it rejoins) is
            # released at once, as Kafka's assignment builder does with the owned partitions
            self.consumer_rules.reconcile(data, member, owned, now_ms)
        member.classic_deadline_ms = now_ms + rebalance_timeout_ms  # it must sync within this
        self._consumer_changed(group, now_ms, fx)
        fx.reply(
            token,
            JoinResult(
                ErrorCode.none,
                member_id,
                member.member_epoch,
                PROTOCOL_TYPE,
                protocols[0][0],
                "",  # no leader: the broker assigns; every classic member is a follower
            ),
        )
        return None

    def classic_sync_consumer(
        self,
        group: Group,
        now_ms: int,
        fx: Effects,
        *,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        token: Any,
    ) -> None:
        data = group.consumer
        assert data is not None
        found = self._classic_member(data, member_id, group_instance_id)
        if isinstance(found, ErrorCode):
            fx.reply(token, SyncResult(found))
            return
        member = found
        assert member.classic is not None
        name = member.classic.protocols[0][0]
        if generation_id != member.member_epoch:
            fx.reply(token, SyncResult(ErrorCode.illegal_generation))
            return
        if (protocol_type is not None and protocol_type != PROTOCOL_TYPE) or (
            protocol_name is not None and protocol_name != name
        ):
            fx.reply(token, SyncResult(ErrorCode.inconsistent_group_protocol))
            return
        if data.group_epoch > member.member_epoch and member.state != UNREVOKED:
            if member.classic_deadline_ms is None:
                member.classic_deadline_ms = now_ms + member.rebalance_timeout_ms
            fx.reply(token, SyncResult(ErrorCode.rebalance_in_progress))
            return
        member.classic_deadline_ms = None
        member.last_heartbeat_ms = now_ms
        names = names_by_id(self.topic_view())
        by_name = {names[t]: sorted(ps) for t, ps in member.assigned.items() if t in names and ps}
        assignment = cp.encode_assignment(cp.subscription_version(member.classic.protocols[0][1]), by_name)
        fx.reply(token, SyncResult(ErrorCode.none, PROTOCOL_TYPE, name, assignment))
        self._maybe_downgrade(group, data.group_epoch, now_ms, fx)

    def classic_heartbeat_consumer(
        self, group: Group, now_ms: int, member_id: str, instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        data = group.consumer
        assert data is not None
        found = self._classic_member(data, member_id, instance_id)
        if isinstance(found, ErrorCode):
            return found
        member = found
        if generation_id != member.member_epoch:
            return ErrorCode.illegal_generation
        member.last_heartbeat_ms = now_ms
        # rejoin to catch up with a new epoch, to revoke, or to get partitions now released
        if (
            member.member_epoch < data.group_epoch
            or member.state == UNREVOKED
            or (member.state == UNRELEASED and not _waiting_on_unreleased(data, member))
        ):
            if member.classic_deadline_ms is None:
                member.classic_deadline_ms = now_ms + member.rebalance_timeout_ms
                self.deadline_added = True
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def classic_leave_consumer(
        self, group: Group, now_ms: int, members: list[tuple[str, str | None]], fx: Effects
    ) -> list[ErrorCode]:
        data = group.consumer
        assert data is not None
        errors: list[ErrorCode] = []
        removed = False
        for member_id, instance_id in members:
            if instance_id is not None and not member_id:
                member_id = data.static_members.get(instance_id, "")  # an admin removing by instance id
            found = self._classic_member(data, member_id, instance_id)
            if isinstance(found, ErrorCode):
                errors.append(found)
                continue
            self.consumer_rules.remove(data, found.member_id)
            removed = True
            errors.append(ErrorCode.none)
        if removed:
            epoch_before = data.group_epoch
            self.consumer_rules.refresh(data, self.topic_view(), bump=True)
            self.consumer_rebalances += data.group_epoch - epoch_before
            self._consumer_changed(group, now_ms, fx)
        return errors


def _by_id(pairs: Iterable[tuple[str, int]], view: TopicView) -> Partitions:
    """(topic name, partition) -> {topic id: partitions}; topics that no longer exist drop out."""
    return nest((view[t].topic_id, p) for t, p in pairs if t in view)


def _waiting_on_unreleased(data: ConsumerGroupData, member: ConsumerMember) -> bool:
    """Whether a partition of the member's target it does not have yet is still owned by another member."""
    missing = flatten(data.target.get(member.member_id, {})) - flatten(member.assigned)
    if not missing:
        return False
    return any(bool(missing & set(o.owned())) for o in data.members.values() if o.member_id != member.member_id)
