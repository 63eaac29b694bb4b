"""KIP-848 consumer groups inside `GroupManager`: a mixin (like `OffsetBook`) that routes
ConsumerGroupHeartbeat and ConsumerGroupDescribe to the rules of consumer.py and turns their
changes into records and group states the rest of the manager understands.

A group id names one group whichever protocol it uses: its committed offsets are shared,
and an empty group converts between the classic and the consumer protocol on the next
member's first request. A non-empty group converts online as `group.consumer.migration.policy`
allows (migration.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups import assignors
from automq.broker.kafka.groups.consumer import (
    FENCED_EPOCH,
    FENCING_REASONS,
    ConsumerGroupData,
    ConsumerGroupRules,
    ConsumerMember,
    HeartbeatRequest,
    HeartbeatResult,
    Partitions,
    TopicView,
    error,
    validate,
)
from automq.broker.kafka.groups.log import ConsumerGroupKey
from automq.broker.kafka.groups.model import Effects, Group, GroupConfig, GroupState, Write


@dataclass(frozen=True, slots=True)
class ConsumerGroupSummary:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[ConsumerMember, ...]
    targets: dict[str, Partitions]  # member id -> target assignment


class ConsumerGroups:
    """KIP-848 operations over `self.groups`; `GroupManager` provides the group lifecycle."""

    config: GroupConfig
    groups: dict[str, Group]
    consumer_rules: ConsumerGroupRules
    # the coordinator replaces this with the broker's view of the cluster's topics
    topic_view: Callable[[], TopicView]
    # for metrics, since this manager started: group epoch bumps (each one a rebalance of its
    # group) and members fenced, by reason (consumer.FENCING_REASONS)
    consumer_rebalances: int
    consumer_fencings: dict[str, int]
    # a group's session timeout (its consumer.session.timeout.ms config, else the broker's)
    consumer_session_timeout: Callable[[str], int]

    def _init_consumer_groups(self) -> None:
        enabled = tuple(a for a in self.config.consumer_assignors if a in assignors.ASSIGNORS) or assignors.ASSIGNORS
        self.consumer_rules = ConsumerGroupRules(enabled[0], enabled)
        self.topic_view = dict
        self.consumer_rebalances = 0
        self.consumer_fencings = dict.fromkeys(FENCING_REASONS, 0)
        self.consumer_session_timeout = lambda _group_id: self.config.consumer_session_timeout_ms

    def _new_group(self, group_id: str, now_ms: int) -> Group:
        raise NotImplementedError

    def _upgrade(self, group: Group, now_ms: int, fx: Effects) -> bool:
        raise NotImplementedError  # migration.py

    def _maybe_downgrade(self, group: Group, generation: int | None, now_ms: int, fx: Effects) -> bool:
        raise NotImplementedError  # migration.py

    def consumer_heartbeat(self, now_ms: int, req: HeartbeatRequest) -> tuple[HeartbeatResult, Effects]:
        fx = Effects()
        invalid = validate(req, self.consumer_rules.assignors)
        if invalid is not None:
            return invalid, fx
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_epoch != 0:
                return error(ErrorCode.group_id_not_found, f"Group {req.group_id} not found."), fx
            group = self._new_group(req.group_id, now_ms)
        if group.share is not None:
            return error(ErrorCode.group_id_not_found, f"Group {req.group_id} is not a consumer group."), fx
        upgraded = False
        if group.consumer is None:
            if group.members or group.state not in (GroupState.EMPTY, GroupState.DEAD):
                # Kafka: a member joining (epoch 0) upgrades the classic group when the policy allows
                if req.member_epoch != 0 or not self._upgrade(group, now_ms, fx):
                    return error(ErrorCode.group_id_not_found, f"Group {req.group_id} is not a consumer group."), fx
                upgraded = True  # written even if this heartbeat fails: the classic members now live here
            else:
                if req.member_epoch != 0:
                    return error(ErrorCode.group_id_not_found, f"Group {req.group_id} not found."), fx
                group.consumer = ConsumerGroupData()
                group.protocol_type = "consumer"
                group.protocol_name = None
                group.generation_id = 0
        data = group.consumer
        assert data is not None
        epoch_before = data.group_epoch
        had_consumer_members = any(m.classic is None for m in data.members.values())
        result, changed = self.consumer_rules.heartbeat(data, req, self.topic_view(), now_ms)
        self.consumer_rebalances += data.group_epoch - epoch_before
        if result.error == ErrorCode.fenced_member_epoch:
            self.consumer_fencings[FENCED_EPOCH] += 1
        if (changed or upgraded) and not self._maybe_downgrade(
            group, epoch_before if had_consumer_members else None, now_ms, fx
        ):
            self._consumer_changed(group, now_ms, fx)
        return result, fx

    def _consumer_changed(self, group: Group, now_ms: int, fx: Effects) -> None:
        data = group.consumer
        assert data is not None
        fx.writes.append(self.consumer_record(group))
        has_members = bool(data.members)
        wanted = GroupState.STABLE if has_members else GroupState.EMPTY
        if group.state is not wanted:
            group.transition(wanted, now_ms)
        group.subscribed_topics = data.subscribed_topics(self.topic_view()) if has_members else None

    @staticmethod
    def consumer_record(group: Group) -> Write:
        assert group.consumer is not None
        return Write(group.partition, ConsumerGroupKey(group.group_id).encode(), group.consumer.record())

    def consumer_leave_classic(self, group: Group) -> Write | None:
        """An empty consumer group turning classic: forget its KIP-848 state (tombstone)."""
        if group.consumer is None or group.consumer.members:
            return None
        group.consumer = None
        return Write(group.partition, ConsumerGroupKey(group.group_id).encode(), None)

    def consumer_deadlines(self) -> Iterable[int]:
        for group in self.groups.values():
            if group.consumer is not None and group.consumer.members:
                timeout = self.consumer_session_timeout(group.group_id)
                yield from ConsumerGroupRules.deadlines(group.consumer, timeout)

    def consumer_tick(self, now_ms: int, fx: Effects) -> None:
        topics: TopicView | None = None
        for group in self.groups.values():
            data = group.consumer
            if data is None or not data.members:
                continue
            timeout = self.consumer_session_timeout(group.group_id)
            if topics is None:
                topics = self.topic_view()
            epoch_before = data.group_epoch
            had_consumer_members = any(m.classic is None for m in data.members.values())
            gone = self.consumer_rules.expire(data, timeout, topics, now_ms)
            if gone:
                self.consumer_rebalances += data.group_epoch - epoch_before
                for reason in gone.values():
                    self.consumer_fencings[reason] += 1
                if not self._maybe_downgrade(group, epoch_before if had_consumer_members else None, now_ms, fx):
                    self._consumer_changed(group, now_ms, fx)

    def consumer_check_member(
        self, group_id: str, member_id: str, member_epoch: int, partitions: Iterable[tuple[str, int]] = ()
    ) -> ErrorCode | None:
        """For offset requests: None when the group is not a consumer group (classic rules apply)."""
        group = self.groups.get(group_id)
        if group is None or group.consumer is None:
            return None
        view = self.topic_view()
        ids = [(view[t].topic_id, p) for t, p in partitions if t in view]
        return ConsumerGroupRules.check_member(group.consumer, member_id, member_epoch, ids)

    def consumer_describe(self, group_id: str) -> ConsumerGroupSummary | ErrorCode | None:
        group = self.groups.get(group_id)
        if group is None:
            return None
        data = group.consumer
        if data is None:
            return ErrorCode.group_id_not_found
        return ConsumerGroupSummary(
            group_id,
            data.state_name(),
            data.group_epoch,
            data.assignment_epoch,
            self.consumer_rules.assignor_of(data),
            tuple(data.members.values()),
            dict(data.target),
        )
