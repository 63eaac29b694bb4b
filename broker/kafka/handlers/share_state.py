"""Kafka's inter-broker share-state APIs, served by a partition's leader for a group
coordinator on another broker (groups/share_admin.py): ReadShareGroupStateSummary (the
share-partition start offset and how many records above it are done), WriteShareGroupState
(accepted only without state batches: a reset of the start offset, what
AlterShareGroupOffsets needs), InitializeShareGroupState (accepted only with start offset -1:
the leader starts where the group's share.auto.offset.reset says) and DeleteShareGroupState. Brokers only: CLUSTER_ACTION when an
authorizer runs, as for WriteTxnMarkers."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka.codec import build, nested
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.groups.share_admin import (
    DELETE_SHARE_GROUP_STATE,
    INITIALIZE_SHARE_GROUP_STATE,
    READ_SHARE_GROUP_STATE_SUMMARY,
    WRITE_SHARE_GROUP_STATE,
    error_of,
    local_delete,
    local_initialize,
    local_reset,
    local_summary,
)
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.topic_ids import topic_uuid


def _names(ctx: RequestContext) -> dict[uuid.UUID, str]:
    image = ctx.broker.metadata
    return {topic_uuid(t.topic_id): t.name for t in image.topics} if image is not None else {}


def _denied(ctx: RequestContext) -> bool:
    return ctx.broker.authorizer is not None and not authz.cluster_allowed(ctx, authz.Op.CLUSTER_ACTION)


@handles(READ_SHARE_GROUP_STATE_SUMMARY)
async def read_share_group_state_summary(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    result_cls, partition_cls = nested(cls, "ReadStateSummaryResult"), nested(cls, "PartitionResult")
    names = _names(ctx)
    denied = _denied(ctx)
    results = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            error, message, start, epoch, done = ErrorCode.none, None, -1, -1, 0
            name = names.get(t.topic_id) if t.topic_id is not None else None
            if denied:
                error = ErrorCode.cluster_authorization_failed
            elif not request.group_id:
                error = ErrorCode.invalid_group_id
            elif name is None:
                error = ErrorCode.unknown_topic_or_partition
            else:
                try:
                    summary = await local_summary(ctx.broker, request.group_id, name, int(p.partition))
                except Exception as exc:
                    error, message = error_of(exc), str(exc)
                else:
                    if summary is not None:
                        start, epoch, done = summary.start_offset, summary.leader_epoch, summary.delivery_complete
            fields: dict[str, Any] = dict(
                partition=p.partition,
                error_code=error,
                error_message=message,
                state_epoch=0,
                leader_epoch=epoch,
                start_offset=start,
            )
            if ctx.api_version >= 1:
                fields["delivery_complete_count"] = done
            parts.append(build(partition_cls, **fields))
        results.append(build(result_cls, topic_id=t.topic_id, partitions=tuple(parts)))
    return build(cls, results=tuple(results))


async def _per_partition(request: Any, ctx: RequestContext, result_name: str, apply: Any) -> Any:
    cls = ctx.response_class
    result_cls, partition_cls = nested(cls, result_name), nested(cls, "PartitionResult")
    names = _names(ctx)
    denied = _denied(ctx)
    results = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            error, message = ErrorCode.none, None
            name = names.get(t.topic_id) if t.topic_id is not None else None
            if denied:
                error = ErrorCode.cluster_authorization_failed
            elif not request.group_id:
                error = ErrorCode.invalid_group_id
            elif name is None:
                error = ErrorCode.unknown_topic_or_partition
            else:
                try:
                    refusal = await apply(name, p)
                except Exception as exc:
                    error, message = error_of(exc), str(exc)
                else:
                    if refusal is not None:
                        error, message = refusal
            parts.append(build(partition_cls, partition=p.partition, error_code=error, error_message=message))
        results.append(build(result_cls, topic_id=t.topic_id, partitions=tuple(parts)))
    return build(cls, results=tuple(results))


@handles(WRITE_SHARE_GROUP_STATE)
async def write_share_group_state(request: Any, ctx: RequestContext) -> Any:
    async def apply(topic: str, p: Any) -> tuple[ErrorCode, str] | None:
        if p.state_batches:
            # the leader owns in-flight state; only a new start offset may come from outside
            return ErrorCode.invalid_request, "Only a start offset reset (no state batches) is accepted."
        if p.start_offset < 0:
            return ErrorCode.invalid_request, f"Start offset {p.start_offset} is invalid."
        await local_reset(ctx.broker, request.group_id, topic, int(p.partition), int(p.start_offset))
        return None

    return await _per_partition(request, ctx, "WriteStateResult", apply)


@handles(INITIALIZE_SHARE_GROUP_STATE)
async def initialize_share_group_state(request: Any, ctx: RequestContext) -> Any:
    async def apply(topic: str, p: Any) -> tuple[ErrorCode, str] | None:
        if p.start_offset >= 0:
            # the leader picks the start from the group's share.auto.offset.reset; an explicit
            # start is AlterShareGroupOffsets' job (WriteShareGroupState)
            return ErrorCode.invalid_request, "Only start offset -1 (share.auto.offset.reset) is accepted."
        await local_initialize(ctx.broker, request.group_id, topic, int(p.partition))
        return None

    return await _per_partition(request, ctx, "InitializeStateResult", apply)


@handles(DELETE_SHARE_GROUP_STATE)
async def delete_share_group_state(request: Any, ctx: RequestContext) -> Any:
    async def apply(topic: str, p: Any) -> None:
        await local_delete(ctx.broker, request.group_id, topic, int(p.partition))

    return await _per_partition(request, ctx, "DeleteStateResult", apply)
