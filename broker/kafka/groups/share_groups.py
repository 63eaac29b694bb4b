"""KIP-932 share groups inside `GroupManager`: a mixin (like `ConsumerGroups`) that routes
ShareGroupHeartbeat and ShareGroupDescribe to the rules of share.py and turns their changes into
records and group states the rest of the manager understands.

A group id is one type for life, as in Kafka: a share group never turns into a classic or
consumer group (their requests get GROUP_ID_NOT_FOUND / INCONSISTENT_GROUP_PROTOCOL) and an
existing classic or consumer group never turns into a share group; DeleteGroups frees the id.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups.consumer import Partitions, TopicView
from automq.broker.kafka.groups.log import ShareGroupKey
from automq.broker.kafka.groups.model import Effects, Group, GroupConfig, GroupState, Write
from automq.broker.kafka.groups.share import (
    FENCED_EPOCH,
    FENCING_REASONS,
    SESSION_TIMEOUT,
    SIMPLE_ASSIGNOR,
    ShareGroupData,
    ShareGroupRules,
    ShareHeartbeatRequest,
    ShareHeartbeatResult,
    ShareMember,
    share_error,
    validate,
)


@dataclass(frozen=True, slots=True)
class ShareGroupSummary:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[ShareMember, ...]


def is_blank(group: Group) -> bool:
    """A group object that holds nothing yet (created by a request that then failed): any
    protocol may claim its id."""
    return (
        group.consumer is None
        and group.share is None
        and not group.members
        and not group.offsets
        and not group.protocol_type
        and group.state in (GroupState.EMPTY, GroupState.DEAD)
    )


class ShareGroups:
    """Share-group operations over `self.groups`; `GroupManager` provides the group lifecycle."""

    config: GroupConfig
    groups: dict[str, Group]
    topic_view: Callable[[], TopicView]
    share_rules: ShareGroupRules
    # for metrics, since this manager started: group epoch bumps and members fenced, by reason
    share_rebalances: int
    share_fencings: dict[str, int]
    # (group id, member id) of members that left or were fenced, for the coordinator to tell
    # the partition side (which then releases their records early); drained by the coordinator
    share_departed: list[tuple[str, str]]
    # a group's session timeout (its share.session.timeout.ms config, else the broker's)
    share_session_timeout: Callable[[str], int]

    def _init_share_groups(self) -> None:
        self.share_rules = ShareGroupRules(self.config.share_max_size)
        self.share_session_timeout = lambda _group_id: self.config.share_session_timeout_ms
        self.share_rebalances = 0
        self.share_fencings = dict.fromkeys(FENCING_REASONS, 0)
        self.share_departed = []

    def _new_group(self, group_id: str, now_ms: int) -> Group:
        raise NotImplementedError

    def share_heartbeat(self, now_ms: int, req: ShareHeartbeatRequest) -> tuple[ShareHeartbeatResult, Effects]:
        fx = Effects()
        invalid = validate(req)
        if invalid is not None:
            return invalid, fx
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_epoch != 0:
                return share_error(ErrorCode.group_id_not_found, f"Group {req.group_id} not found."), fx
            group = self._new_group(req.group_id, now_ms)
        if group.share is None:
            if not is_blank(group):
                return share_error(ErrorCode.group_id_not_found, f"Group {req.group_id} is not a share group."), fx
            if req.member_epoch != 0:
                return share_error(ErrorCode.group_id_not_found, f"Group {req.group_id} not found."), fx
            group.share = ShareGroupData()
            group.protocol_type = "share"
            group.protocol_name = None
        data = group.share
        epoch_before = data.group_epoch
        result, changed = self.share_rules.heartbeat(req.group_id, data, req, self.topic_view(), now_ms)
        self.share_rebalances += data.group_epoch - epoch_before
        if result.error == ErrorCode.fenced_member_epoch:
            self.share_fencings[FENCED_EPOCH] += 1
        if result.error == ErrorCode.none and req.member_epoch == -1:
            self.share_departed.append((req.group_id, req.member_id))
        if changed:
            self._share_changed(group, now_ms, fx)
        return result, fx

    def _share_changed(self, group: Group, now_ms: int, fx: Effects) -> None:
        data = group.share
        assert data is not None
        fx.writes.append(self.share_record(group))
        wanted = GroupState.STABLE if data.members else GroupState.EMPTY
        if group.state is not wanted:
            group.transition(wanted, now_ms)
        group.subscribed_topics = data.subscribed_topics() if data.members else None

    @staticmethod
    def share_record(group: Group) -> Write:
        assert group.share is not None
        return Write(group.partition, ShareGroupKey(group.group_id).encode(), group.share.to_json())

    def share_deadlines(self) -> Iterable[int]:
        for group in self.groups.values():
            if group.share is not None and group.share.members:
                yield from ShareGroupRules.deadlines(group.share, self.share_session_timeout(group.group_id))

    def share_tick(self, now_ms: int, fx: Effects) -> None:
        topics: TopicView | None = None
        for group in self.groups.values():
            data = group.share
            if data is None or not data.members:
                continue
            timeout = self.share_session_timeout(group.group_id)
            if topics is None:
                topics = self.topic_view()
            epoch_before = data.group_epoch
            gone = self.share_rules.expire(data, timeout, topics, now_ms)
            if gone:
                self.share_rebalances += data.group_epoch - epoch_before
                self.share_fencings[SESSION_TIMEOUT] += len(gone)
                self.share_departed.extend((group.group_id, m) for m in gone)
                self._share_changed(group, now_ms, fx)

    def share_member(self, group_id: str, member_id: str) -> bool | None:
        """Whether `member_id` is a member of share group `group_id`; None when the group is
        not known here (another broker may coordinate it)."""
        group = self.groups.get(group_id)
        if group is None or group.share is None:
            return None
        return member_id in group.share.members

    def share_describe(self, group_id: str) -> ShareGroupSummary | ErrorCode | None:
        group = self.groups.get(group_id)
        if group is None:
            return None
        data = group.share
        if data is None:
            return ErrorCode.group_id_not_found
        return ShareGroupSummary(
            group_id,
            data.state_name(),
            data.group_epoch,
            data.assignment_epoch,
            SIMPLE_ASSIGNOR,
            tuple(data.members.values()),
        )

    def share_admin_group(self, group_id: str, now_ms: int, *, create: bool) -> tuple[Group | ErrorCode, Effects]:
        """The share group an offsets admin request names: GROUP_ID_NOT_FOUND when it is unknown
        (unless `create`: AlterShareGroupOffsets creates an empty share group, as in Kafka) or
        of another type."""
        fx = Effects()
        group = self.groups.get(group_id)
        if group is None:
            if not create:
                return ErrorCode.group_id_not_found, fx
            group = self._new_group(group_id, now_ms)
        if group.share is None:
            if not (create and is_blank(group)):
                return ErrorCode.group_id_not_found, fx
            group.share = ShareGroupData()
            group.protocol_type = "share"
            self._share_changed(group, now_ms, fx)
        return group, fx

    def share_uninitialized(self, group_id: str) -> set[tuple[uuid.UUID, int]]:
        group = self.groups.get(group_id)
        if group is None or group.share is None:
            return set()
        return group.share.uninitialized()

    def share_mark_initialized(
        self, group_id: str, pairs: Iterable[tuple[uuid.UUID, int]], now_ms: int, *, initialized: bool = True
    ) -> Effects:
        """Record that share-partitions' state was created (or, `initialized=False`, deleted)."""
        fx = Effects()
        group = self.groups.get(group_id)
        if group is None or group.share is None:
            return fx
        before = set(group.share.initialized)
        if initialized:
            group.share.initialized |= set(pairs)
        else:
            group.share.initialized -= set(pairs)
        if group.share.initialized != before:
            fx.writes.append(self.share_record(group))
        return fx

    def share_assignment(self, group_id: str) -> dict[str, Partitions]:
        group = self.groups.get(group_id)
        if group is None or group.share is None:
            return {}
        return {m.member_id: m.assigned for m in group.share.members.values()}
