"""ConsumerGroupHeartbeat and ConsumerGroupDescribe: the KIP-848 consumer group protocol
(`group.protocol=consumer` in librdkafka 2.4+ and the Java client 3.7+). The rules live in
groups/consumer.py; this module translates requests and responses, topic ids included."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka.codec import ZERO_THROTTLE, build, nested
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.groups.consumer import HeartbeatRequest, Partitions, names_by_id
from automq.broker.kafka.groups.consumer_groups import ConsumerGroupSummary
from automq.broker.kafka.groups.coordinator import GroupCoordinator
from automq.broker.kafka.handlers.groups import (
    GROUP_OPERATIONS,
    NO_AUTHORIZED_OPERATIONS,
    _client_host,
    _coordinator,
    _group_error,
    _ms,
)
from automq.broker.kafka.handlers.registry import handles

CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69
MEMBER_TYPE_CONSUMER = 1  # ConsumerGroupDescribe v1 (KIP-1099)
MEMBER_TYPE_CLASSIC = 0  # a classic member of a KIP-848 group (online migration)


def _owned(topic_partitions: Any) -> Partitions | None:
    if topic_partitions is None:
        return None
    out: Partitions = {}
    for tp in topic_partitions:
        if tp.topic_id is not None:
            out.setdefault(tp.topic_id, set()).update(int(p) for p in tp.partitions)
    return out


HeartbeatResponder = Callable[[ErrorCode, str | None, str | None, int, Any], Any]


def heartbeat_responder(cls: Any, interval: datetime.timedelta) -> HeartbeatResponder:
    """respond(error, message, member_id, epoch, assignment) -> a Consumer/ShareGroupHeartbeat
    response; the heartbeat interval is sent only with success (Kafka sends 0 with an error)."""

    def respond(error: ErrorCode, message: str | None, member_id: str | None, epoch: int, assignment: Any) -> Any:
        return build(
            cls,
            throttle_time=ZERO_THROTTLE,
            error_code=error,
            error_message=message,
            member_id=member_id,
            member_epoch=epoch,
            heartbeat_interval=interval if error == ErrorCode.none else datetime.timedelta(0),
            assignment=assignment,
        )

    return respond


def heartbeat_refusal(ctx: RequestContext, request: Any) -> tuple[ErrorCode, str | None] | None:
    """Why a Consumer/ShareGroupHeartbeat is refused before its group is touched: the group's
    error (not coordinator, loading, ...), or, as in Kafka, a subscription naming a topic the
    principal may not DESCRIBE (TOPIC_AUTHORIZATION_FAILED listing them); None if neither."""
    error = _group_error(ctx, request.group_id)
    if error is not None:
        return error, None
    if ctx.broker.authorizer is not None and request.subscribed_topic_names:
        hidden = sorted(
            t for t in request.subscribed_topic_names if not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, t)
        )
        if hidden:
            return (
                ErrorCode.topic_authorization_failed,
                "The client is not authorized to describe topics: " + ", ".join(hidden),
            )
    return None


@handles(CONSUMER_GROUP_HEARTBEAT)
async def consumer_group_heartbeat(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    coordinator = _coordinator(ctx)
    interval = datetime.timedelta(
        milliseconds=int(coordinator.group_config(request.group_id)["consumer.heartbeat.interval.ms"])
    )

    respond = heartbeat_responder(cls, interval)
    refused = heartbeat_refusal(ctx, request)
    if refused is not None:
        return respond(*refused, None, -1, None)
    result = await coordinator.consumer_heartbeat(
        HeartbeatRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=int(request.member_epoch),
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout_ms=_ms(request.rebalance_timeout),
            subscribed_topic_names=(
                tuple(request.subscribed_topic_names) if request.subscribed_topic_names is not None else None
            ),
            subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
            server_assignor=request.server_assignor,
            owned=_owned(request.topic_partitions),
            client_id=ctx.client_id or "",
            client_host=_client_host(ctx),
            version=ctx.api_version,
        )
    )
    assignment = None
    if result.error == ErrorCode.none and result.assignment is not None:
        assignment = heartbeat_assignment(cls, result.assignment)
    return respond(result.error, result.message, result.member_id, result.member_epoch, assignment)


def heartbeat_assignment(cls: Any, parts: Partitions) -> Any:
    """A heartbeat response's Assignment (topic ids and partitions), for KIP-848 and share groups."""
    tp_cls = nested(cls, "TopicPartitions")
    return build(
        nested(cls, "Assignment"),
        topic_partitions=tuple(
            build(tp_cls, topic_id=t, partitions=tuple(sorted(ps)))
            for t, ps in sorted(parts.items(), key=lambda kv: str(kv[0]))
            if ps
        ),
    )


def assignment_builder(cls: Any, names: dict[uuid.UUID, str]) -> Callable[[Partitions], Any]:
    """Builds a describe response's member Assignment (topic ids, names and partitions)."""
    assignment_cls = nested(cls, "Assignment")
    tp_cls = nested(cls, "TopicPartitions")

    def assignment(parts: Partitions) -> Any:
        return build(
            assignment_cls,
            topic_partitions=tuple(
                build(tp_cls, topic_id=t, topic_name=names.get(t, ""), partitions=tuple(sorted(ps)))
                for t, ps in sorted(parts.items(), key=lambda kv: names.get(kv[0], str(kv[0])))
                if ps
            ),
        )

    return assignment


def described_group(cls: Any, summary: Any, members: tuple[Any, ...], operations: int) -> Any:
    return build(
        nested(cls, "DescribedGroup"),
        error_code=ErrorCode.none,
        error_message=None,
        group_id=summary.group_id,
        group_state=summary.state,
        group_epoch=summary.group_epoch,
        assignment_epoch=summary.assignment_epoch,
        assignor_name=summary.assignor,
        members=members,
        authorized_operations=operations,
    )


def describe_groups(
    request: Any,
    ctx: RequestContext,
    lookup: Callable[[GroupCoordinator, str], Any],
    kind: str,
    describe_one: Callable[[Any, Any, dict[uuid.UUID, str], int], Any],
) -> Any:
    """ConsumerGroupDescribe and ShareGroupDescribe: per group id, authorization, then the
    coordinator's summary (`lookup`: None when unknown, an ErrorCode when of another type)."""
    cls = ctx.response_class
    group_cls = nested(cls, "DescribedGroup")
    operations = GROUP_OPERATIONS if request.include_authorized_operations else NO_AUTHORIZED_OPERATIONS
    out = []
    for group_id in request.group_ids:

        def failed(error: ErrorCode, message: str | None, group_id: str = group_id) -> Any:
            return build(
                group_cls,
                error_code=error,
                error_message=message,
                group_id=group_id,
                group_state="Dead",
                group_epoch=-1,
                assignment_epoch=-1,
                assignor_name="",
                members=(),
                authorized_operations=operations,
            )

        error = _group_error(ctx, group_id, authz.Op.DESCRIBE)
        if error is None and not group_id:
            error = ErrorCode.invalid_group_id
        if error is not None:
            out.append(failed(error, None))
            continue
        coordinator = _coordinator(ctx)
        summary = lookup(coordinator, group_id)
        if summary is None:
            out.append(failed(ErrorCode.group_id_not_found, f"Group {group_id} not found."))
        elif isinstance(summary, ErrorCode):
            out.append(failed(summary, f"Group {group_id} is not a {kind} group."))
        else:
            out.append(describe_one(cls, summary, names_by_id(coordinator.topic_view()), operations))
    return build(cls, throttle_time=ZERO_THROTTLE, groups=tuple(out))


def _describe_one(cls: Any, summary: ConsumerGroupSummary, names: dict[uuid.UUID, str], operations: int) -> Any:
    member_cls = nested(cls, "Member")
    assignment = assignment_builder(cls, names)
    members = tuple(
        build(
            member_cls,
            member_id=m.member_id,
            instance_id=m.instance_id,
            rack_id=m.rack_id,
            member_epoch=m.member_epoch,
            client_id=m.client_id,
            client_host=m.client_host,
            subscribed_topic_names=m.subscribed_topic_names,
            subscribed_topic_regex=m.subscribed_topic_regex,
            assignment=assignment(m.assigned),
            target_assignment=assignment(summary.targets.get(m.member_id, {})),
            member_type=MEMBER_TYPE_CLASSIC if m.classic is not None else MEMBER_TYPE_CONSUMER,
        )
        for m in summary.members
    )
    return described_group(cls, summary, members, operations)


@handles(CONSUMER_GROUP_DESCRIBE)
async def consumer_group_describe(request: Any, ctx: RequestContext) -> Any:
    return describe_groups(request, ctx, lambda c, g: c.manager.consumer_describe(g), "consumer", _describe_one)
