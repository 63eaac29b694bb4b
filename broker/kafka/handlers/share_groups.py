"""ShareGroupHeartbeat and ShareGroupDescribe: membership of KIP-932 share groups (queues).
The rules live in groups/share.py; this module translates requests and responses, topic ids
included. ShareFetch/ShareAcknowledge (the partition side) live elsewhere."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka.codec import build, nested
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.groups.share import ShareHeartbeatRequest
from automq.broker.kafka.groups.share_groups import ShareGroupSummary
from automq.broker.kafka.groups.share_settings import share_settings
from automq.broker.kafka.handlers.consumer_groups import (
    assignment_builder,
    describe_groups,
    described_group,
    heartbeat_assignment,
    heartbeat_refusal,
    heartbeat_responder,
)
from automq.broker.kafka.handlers.groups import (
    _client_host,
    _coordinator,
)
from automq.broker.kafka.handlers.registry import handles

SHARE_GROUP_HEARTBEAT = 76
SHARE_GROUP_DESCRIBE = 77


@handles(SHARE_GROUP_HEARTBEAT)
async def share_group_heartbeat(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    coordinator = _coordinator(ctx)
    interval = datetime.timedelta(milliseconds=share_settings(ctx.broker, request.group_id).heartbeat_interval_ms)

    respond = heartbeat_responder(cls, interval)
    refused = heartbeat_refusal(ctx, request)
    if refused is not None:
        return respond(*refused, None, -1, None)
    result = await coordinator.share_heartbeat(
        ShareHeartbeatRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=int(request.member_epoch),
            rack_id=request.rack_id,
            subscribed_topic_names=(
                tuple(request.subscribed_topic_names) if request.subscribed_topic_names is not None else None
            ),
            client_id=ctx.client_id or "",
            client_host=_client_host(ctx),
        )
    )
    assignment = None
    if result.error == ErrorCode.none and result.assignment is not None:
        assignment = heartbeat_assignment(cls, result.assignment)
    return respond(result.error, result.message, result.member_id, result.member_epoch, assignment)


def _describe_one(cls: Any, summary: ShareGroupSummary, names: dict[uuid.UUID, str], operations: int) -> Any:
    member_cls = nested(cls, "Member")
    assignment = assignment_builder(cls, names)
    members = tuple(
        build(
            member_cls,
            member_id=m.member_id,
            rack_id=m.rack_id,
            member_epoch=m.member_epoch,
            client_id=m.client_id,
            client_host=m.client_host,
            subscribed_topic_names=m.subscribed_topic_names,
            assignment=assignment(m.assigned),
        )
        for m in summary.members
    )
    return described_group(cls, summary, members, operations)


@handles(SHARE_GROUP_DESCRIBE)
async def share_group_describe(request: Any, ctx: RequestContext) -> Any:
    return describe_groups(request, ctx, lambda c, g: c.manager.share_describe(g), "share", _describe_one)
