"""Committed offsets of the classic consumer groups: commit (prepare, then complete once the
record is durable), fetch, delete and expire. A mixin of `GroupManager` (state.py), which owns
the groups; kept apart because offsets follow their own rules (generation checks, retention)
independent of the rebalance state machine.
"""

from __future__ import annotations

from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from automq.broker.kafka.groups.log import ConsumerGroupKey, GroupKey, OffsetKey, OffsetValue, ShareGroupKey
from automq.broker.kafka.groups.model import (
    OFFSET_METADATA_MAX_BYTES,
    CommitPlan,
    CommittedOffset,
    Effects,
    Group,
    GroupConfig,
    GroupState,
    Write,
)


class OffsetBook:
    """Offset operations over `self.groups`; `GroupManager` provides the group lifecycle."""

    config: GroupConfig
    groups: dict[str, Group]

    def _new_group(self, group_id: str, now_ms: int) -> Group:
        raise NotImplementedError

    def consumer_check_member(
        self, group_id: str, member_id: str, member_epoch: int, partitions: Iterable[tuple[str, int]] = ()
    ) -> ErrorCode | None:
        raise NotImplementedError

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
        if group.share is not None:
            return fail(ErrorCode.group_id_not_found)  # Kafka: a share group has no committed offsets
        checked = self.consumer_check_member(group_id, member_id, generation_id, keys)
        if checked is not None:
            if checked != ErrorCode.none:
                return fail(checked)
        elif generation_id < 0 and group.state is GroupState.EMPTY:
            pass  # Kafka: an admin client or a consumer without group management, any member id
        elif generation_id >= 0 or member_id or group_instance_id is not None:
            if group.is_static_fenced(member_id, group_instance_id):
                return fail(ErrorCode.fenced_instance_id)
            if member_id not in group.members:
                return fail(ErrorCode.unknown_member_id)
            if generation_id != group.generation_id:
                return fail(ErrorCode.illegal_generation)
        elif group.state is not GroupState.EMPTY:
            return fail(ErrorCode.unknown_member_id)  # only members commit for a group with members
        if group.state is GroupState.COMPLETING_REBALANCE and group.consumer is None:
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
        if group is None or group.state is GroupState.DEAD or group.share is not None:
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
        if group.consumer is not None:
            fx.writes.append(Write(group.partition, ConsumerGroupKey(group.group_id).encode(), None))
            group.consumer = None
        if group.share is not None:
            fx.writes.append(Write(group.partition, ShareGroupKey(group.group_id).encode(), None))
            group.share = None
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
            if group.share is not None:
                continue  # no committed offsets; an empty share group lives until DeleteGroups
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


def _commit_timestamp(offset: CommittedOffset) -> int:
    return offset.commit_timestamp_ms
