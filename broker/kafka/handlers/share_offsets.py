"""DescribeShareGroupOffsets, AlterShareGroupOffsets and DeleteShareGroupOffsets (KIP-932
admin, `kafka-share-groups --describe / --reset-offsets / --delete-offsets`): served by the
group's coordinator, which reads or changes each partition's share state through its leader
(groups/share_admin.py). Altering and deleting need an empty group, as in Kafka."""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka.codec import ZERO_THROTTLE, build, nested
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.groups.coordinator import now_ms
from automq.broker.kafka.groups.model import Group
from automq.broker.kafka.groups.share_admin import StateSummary
from automq.broker.kafka.handlers.groups import _coordinator, _group_error
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.topic_ids import topic_uuid

DESCRIBE_SHARE_GROUP_OFFSETS = 90
ALTER_SHARE_GROUP_OFFSETS = 91
DELETE_SHARE_GROUP_OFFSETS = 92


def _topic(ctx: RequestContext, name: str) -> Any:
    return ctx.broker.partitions.topic(name)


async def _group(ctx: RequestContext, group_id: str, op: int, *, create: bool) -> Group | tuple[ErrorCode, str]:
    """The share group, or (error, message) for the whole group."""
    error = _group_error(ctx, group_id, op)
    if error is None and not group_id:
        error = ErrorCode.invalid_group_id
    if error is not None:
        return error, error.name.upper()
    coordinator = _coordinator(ctx)
    found, fx = coordinator.manager.share_admin_group(group_id, now_ms(), create=create)
    if isinstance(found, ErrorCode):
        group = coordinator.manager.groups.get(group_id)
        what = "not found" if group is None else "is not a share group"
        return found, f"Group {group_id} {what}."
    if fx.writes and not await coordinator.write(fx.writes):
        return ErrorCode.not_coordinator, "The group's state could not be written."
    return found


@handles(DESCRIBE_SHARE_GROUP_OFFSETS)
async def describe_share_group_offsets(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    group_cls = nested(cls, "DescribeShareGroupOffsetsResponseGroup")
    topic_cls = nested(cls, "DescribeShareGroupOffsetsResponseTopic")
    part_cls = nested(cls, "DescribeShareGroupOffsetsResponsePartition")
    with_lag = ctx.api_version >= 1

    def partition(index: int, error: ErrorCode, summary: StateSummary | None = None, message: str | None = None) -> Any:
        fields: dict[str, Any] = dict(
            partition_index=index,
            start_offset=summary.start_offset if summary is not None else -1,
            leader_epoch=summary.leader_epoch if summary is not None else -1,
            error_code=error,
            error_message=message,
        )
        if with_lag:
            fields["lag"] = summary.lag if summary is not None else -1
        return build(part_cls, **fields)

    out = []
    for g in request.groups:
        found = await _group(ctx, g.group_id, authz.Op.DESCRIBE, create=False)
        if not isinstance(found, Group):
            out.append(build(group_cls, group_id=g.group_id, topics=(), error_code=found[0], error_message=found[1]))
            continue
        router = _coordinator(ctx).share_state
        wanted: dict[str, list[int]] = {}
        if g.topics is None:
            for t, p in await router.partitions_with_state(g.group_id):
                wanted.setdefault(t, []).append(p)
        else:
            for t in g.topics:
                wanted.setdefault(t.topic_name, []).extend(int(p) for p in t.partitions)
        topics = []
        for name, indexes in wanted.items():
            info = _topic(ctx, name)
            if not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, name):
                parts = [partition(i, ErrorCode.topic_authorization_failed) for i in indexes]
            elif info is None:
                parts = [partition(i, ErrorCode.unknown_topic_or_partition) for i in indexes]
            else:
                summaries = await asyncio.gather(*(router.summary(g.group_id, name, i) for i in indexes))
                parts = [
                    partition(i, s) if isinstance(s, ErrorCode) else partition(i, ErrorCode.none, s)
                    for i, s in zip(indexes, summaries, strict=True)
                ]
            topic_id = topic_uuid(info.topic_id) if info is not None else None
            topics.append(build(topic_cls, topic_name=name, topic_id=topic_id, partitions=tuple(parts)))
        out.append(
            build(group_cls, group_id=g.group_id, topics=tuple(topics), error_code=ErrorCode.none, error_message=None)
        )
    return build(cls, throttle_time=ZERO_THROTTLE, groups=tuple(out))


async def _record_initialized(coordinator: Any, group_id: str, pairs: list[tuple[Any, int]], initialized: bool) -> None:
    if pairs:
        fx = coordinator.manager.share_mark_initialized(group_id, pairs, now_ms(), initialized=initialized)
        if fx.writes:
            await coordinator.write(fx.writes)


def _not_empty(group: Group) -> tuple[ErrorCode, str] | None:
    if group.share is not None and group.share.members:
        return ErrorCode.non_empty_group, f"The group {group.group_id} has members; stop them first."
    return None


@handles(ALTER_SHARE_GROUP_OFFSETS)
async def alter_share_group_offsets(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    topic_cls = nested(cls, "AlterShareGroupOffsetsResponseTopic")
    part_cls = nested(cls, "AlterShareGroupOffsetsResponsePartition")

    def failed(error: ErrorCode, message: str) -> Any:
        return build(cls, throttle_time=ZERO_THROTTLE, error_code=error, error_message=message, responses=())

    found = await _group(ctx, request.group_id, authz.Op.READ, create=True)
    if not isinstance(found, Group):
        return failed(*found)
    busy = _not_empty(found)
    if busy is not None:
        return failed(*busy)
    coordinator = _coordinator(ctx)
    router = coordinator.share_state
    reset: list[tuple[Any, int]] = []
    responses = []
    for t in request.topics:
        info = _topic(ctx, t.topic_name)
        parts = []
        for p in t.partitions:
            index = int(p.partition_index)
            error, message = ErrorCode.none, None
            if not authz.allowed(ctx, authz.Op.READ, authz.TOPIC, t.topic_name):
                error = ErrorCode.topic_authorization_failed
            elif info is None or not 0 <= index < len(info.partitions):
                error = ErrorCode.unknown_topic_or_partition
            elif p.start_offset < 0:
                error, message = ErrorCode.invalid_request, f"Start offset {p.start_offset} is invalid."
            else:
                error = await router.reset(request.group_id, t.topic_name, index, int(p.start_offset))
                if error == ErrorCode.none:
                    reset.append((topic_uuid(info.topic_id), index))
            parts.append(build(part_cls, partition_index=index, error_code=error, error_message=message))
        topic_id = topic_uuid(info.topic_id) if info is not None else None
        responses.append(build(topic_cls, topic_name=t.topic_name, topic_id=topic_id, partitions=tuple(parts)))
    await _record_initialized(coordinator, request.group_id, reset, True)
    return build(
        cls, throttle_time=ZERO_THROTTLE, error_code=ErrorCode.none, error_message=None, responses=tuple(responses)
    )


@handles(DELETE_SHARE_GROUP_OFFSETS)
async def delete_share_group_offsets(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    topic_cls = nested(cls, "DeleteShareGroupOffsetsResponseTopic")

    def failed(error: ErrorCode, message: str) -> Any:
        return build(cls, throttle_time=ZERO_THROTTLE, error_code=error, error_message=message, responses=())

    found = await _group(ctx, request.group_id, authz.Op.DELETE, create=False)
    if not isinstance(found, Group):
        return failed(*found)
    busy = _not_empty(found)
    if busy is not None:
        return failed(*busy)
    coordinator = _coordinator(ctx)
    router = coordinator.share_state
    with_state = await router.partitions_with_state(request.group_id)
    deleted: list[tuple[Any, int]] = []
    responses = []
    for t in request.topics:
        info = _topic(ctx, t.topic_name)
        error, message = ErrorCode.none, None
        if not authz.allowed(ctx, authz.Op.READ, authz.TOPIC, t.topic_name):
            error = ErrorCode.topic_authorization_failed
        elif info is None:
            error = ErrorCode.unknown_topic_or_partition
        else:
            for index in [p for name, p in with_state if name == t.topic_name]:
                result = await router.delete(request.group_id, t.topic_name, index)
                if result != ErrorCode.none:
                    error, message = result, f"Partition {index}: {result.name.upper()}"
                    break
                deleted.append((topic_uuid(info.topic_id), index))
        topic_id = topic_uuid(info.topic_id) if info is not None else None
        responses.append(
            build(topic_cls, topic_name=t.topic_name, topic_id=topic_id, error_code=error, error_message=message)
        )
    # deleted state is created again (share.auto.offset.reset) when the partition is next assigned
    await _record_initialized(coordinator, request.group_id, deleted, False)
    return build(
        cls, throttle_time=ZERO_THROTTLE, error_code=ErrorCode.none, error_message=None, responses=tuple(responses)
    )
