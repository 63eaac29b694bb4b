"""FindCoordinator and the classic consumer-group APIs: translate kio requests of any version
into GroupCoordinator calls and build the version's response.

Which broker coordinates a group is Kafka's rule: the leader of `__consumer_offsets`
partition abs(javaHashCode(group_id)) % partitions (the topic is created on first use).
A broker asked about a group it does not coordinate says NOT_COORDINATOR; while it replays
the partition it says COORDINATOR_LOAD_IN_PROGRESS. A transactional id (key type 1) is placed
the same way on `__transaction_state` (transactions/coordinator.py).

OffsetCommit/OffsetFetch are served up to v9 (v10 identifies topics by id only, a Kafka 4.1
addition this broker does not implement; clients negotiate v9).
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka.codec import ZERO_THROTTLE, build, has_field, nested
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.groups.coordinator import OFFSETS_TOPIC, OFFSETS_TOPIC_CONFIGS, GroupCoordinator, now_ms
from automq.broker.kafka.groups.state import partition_for
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.topic_ids import topic_uuid
from automq.broker.kafka.transactions.coordinator import TXN_TOPIC, TXN_TOPIC_CONFIGS

log = logging.getLogger(__name__)

OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
DELETE_GROUPS = 42
OFFSET_DELETE = 47

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
NO_AUTHORIZED_OPERATIONS = -(2**31)  # Kafka's "not requested" value
# READ, DELETE, DESCRIBE (AclOperation codes): what any client may do to a group without an authorizer
GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)


def _ms(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    return int(value)


def _coordinator(ctx: RequestContext) -> GroupCoordinator:
    coordinator = ctx.broker.groups
    if coordinator is None:
        raise RuntimeError("this broker runs without a group coordinator")
    return coordinator


def _client_host(ctx: RequestContext) -> str:
    host = ctx.peer.rsplit(":", 1)[0] if ctx.peer else ""
    return "/" + host.strip("[]")


def _group_error(ctx: RequestContext, group_id: str, op: int = authz.Op.READ) -> ErrorCode | None:
    if ctx.broker.authorizer is not None and not authz.allowed(ctx, op, authz.GROUP, group_id):
        return ErrorCode.group_authorization_failed
    if not group_id:
        return None  # the state machine answers INVALID_GROUP_ID where Kafka does
    return _coordinator(ctx).coordinator_error(group_id)


# ---------------------------------------------------------------- FindCoordinator


async def _locate(ctx: RequestContext, key_type: int, key: str) -> tuple[ErrorCode, str | None, int, str, int]:
    """(error, message, node_id, host, port) of the coordinator of `key`."""
    if key_type == KEY_TYPE_TRANSACTION:
        if not key:
            return ErrorCode.invalid_request, "the transactional id is empty", -1, "", -1
        internal, configs = TXN_TOPIC, TXN_TOPIC_CONFIGS
    elif key_type == KEY_TYPE_GROUP:
        internal, configs = OFFSETS_TOPIC, OFFSETS_TOPIC_CONFIGS
    else:
        return ErrorCode.invalid_request, f"unsupported coordinator key type {key_type}", -1, "", -1
    if key_type == KEY_TYPE_TRANSACTION:
        if not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TRANSACTIONAL_ID, key):
            return (
                ErrorCode.transactional_id_authorization_failed,
                "Transactional Id authorization failed.",
                -1,
                "",
                -1,
            )
    elif not authz.allowed(ctx, authz.Op.DESCRIBE, authz.GROUP, key):
        return ErrorCode.group_authorization_failed, "Group authorization failed.", -1, "", -1
    broker = ctx.broker
    try:
        topic = await broker.ensure_topic(internal, configs=dict(configs))
    except Exception as exc:  # the controller is unreachable or refused: clients retry
        log.warning("cannot create %s: %s", internal, exc)
        topic = None
    if topic is None or not topic.partitions:
        return ErrorCode.coordinator_not_available, f"{internal} is not available yet", -1, "", -1
    info = topic.partitions[partition_for(key, len(topic.partitions))]
    if info.leader < 0 or info.state != "online":
        return ErrorCode.coordinator_not_available, "the coordinator is moving", -1, "", -1
    image = broker.metadata
    endpoint = None
    if image is not None:
        node = next((b for b in image.brokers if b.node_id == info.leader and b.state != "fenced"), None)
        if node is not None and node.endpoints:
            endpoint = next((e for e in node.endpoints if e.listener == ctx.listener), None)
    if endpoint is None:
        return ErrorCode.coordinator_not_available, "the coordinator's broker is not available", -1, "", -1
    return ErrorCode.none, None, info.leader, endpoint.host, endpoint.port


@handles(FIND_COORDINATOR)
async def find_coordinator(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    key_type = int(getattr(request, "key_type", KEY_TYPE_GROUP))
    if has_field(cls, "coordinators"):
        coordinator_cls = nested(cls, "Coordinator")
        results = []
        for key in request.coordinator_keys:
            error, message, node_id, host, port = await _locate(ctx, key_type, key)
            results.append(
                build(
                    coordinator_cls,
                    key=key,
                    node_id=node_id,
                    host=host,
                    port=port,
                    error_code=error,
                    error_message=message,
                )
            )
        return build(cls, throttle_time=ZERO_THROTTLE, coordinators=tuple(results))
    error, message, node_id, host, port = await _locate(ctx, key_type, request.key)
    return build(
        cls, throttle_time=ZERO_THROTTLE, error_code=error, error_message=message, node_id=node_id, host=host, port=port
    )


# ---------------------------------------------------------------- JoinGroup / SyncGroup / Heartbeat / LeaveGroup


def _join_response(ctx: RequestContext, error: ErrorCode, member_id: str, result: Any = None) -> Any:
    cls = ctx.response_class
    old = ctx.api_version < 7  # protocol_name is not nullable before v7
    if result is None:
        return build(
            cls,
            throttle_time=ZERO_THROTTLE,
            error_code=error,
            generation_id=-1,
            protocol_type=None,
            protocol_name="" if old else None,
            leader="",
            skip_assignment=False,
            member_id=member_id,
            members=(),
        )
    member_cls = nested(cls, "JoinGroupResponseMember")
    members = tuple(build(member_cls, member_id=m, group_instance_id=i, metadata=meta) for m, i, meta in result.members)
    return build(
        cls,
        throttle_time=ZERO_THROTTLE,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name if result.protocol_name is not None else ("" if old else None),
        leader=result.leader_id,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=members,
    )


@handles(JOIN_GROUP)
async def join_group(request: Any, ctx: RequestContext) -> Any:
    error = _group_error(ctx, request.group_id)
    if error is not None:
        return _join_response(ctx, error, request.member_id)
    session = _ms(request.session_timeout)
    rebalance = _ms(getattr(request, "rebalance_timeout", -1))
    result = await _coordinator(ctx).join(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        client_id=ctx.client_id or "",
        client_host=_client_host(ctx),
        session_timeout_ms=session,
        rebalance_timeout_ms=rebalance if rebalance >= 0 else session,  # v0 has none: Kafka uses the session timeout
        protocol_type=request.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
        require_known_member_id=ctx.api_version >= 4,
    )
    return _join_response(ctx, result.error, result.member_id, result)


@handles(SYNC_GROUP)
async def sync_group(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    error = _group_error(ctx, request.group_id)
    if error is None:
        result = await _coordinator(ctx).sync(
            group_id=request.group_id,
            generation_id=request.generation_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            protocol_type=getattr(request, "protocol_type", None),
            protocol_name=getattr(request, "protocol_name", None),
            assignments={a.member_id: bytes(a.assignment) for a in request.assignments},
        )
        return build(
            cls,
            throttle_time=ZERO_THROTTLE,
            error_code=result.error,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )
    return build(
        cls, throttle_time=ZERO_THROTTLE, error_code=error, protocol_type=None, protocol_name=None, assignment=b""
    )


@handles(HEARTBEAT)
async def heartbeat(request: Any, ctx: RequestContext) -> Any:
    error = _group_error(ctx, request.group_id)
    if error is None:
        if not request.group_id:
            error = ErrorCode.invalid_group_id
        else:
            error = _coordinator(ctx).heartbeat(
                request.group_id, request.member_id, getattr(request, "group_instance_id", None), request.generation_id
            )
    return build(ctx.response_class, throttle_time=ZERO_THROTTLE, error_code=error)


@handles(LEAVE_GROUP)
async def leave_group(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    batched = has_field(type(request), "members")
    identities: list[tuple[str, str | None]] = (
        [(m.member_id, m.group_instance_id) for m in request.members] if batched else [(request.member_id, None)]
    )
    error = _group_error(ctx, request.group_id)
    if error is None and not request.group_id:
        error = ErrorCode.invalid_group_id
    if error is not None:
        return build(cls, throttle_time=ZERO_THROTTLE, error_code=error, members=())
    top, errors = await _coordinator(ctx).leave(request.group_id, identities)
    if not batched:
        return build(cls, throttle_time=ZERO_THROTTLE, error_code=top if top != ErrorCode.none else errors[0])
    member_cls = nested(cls, "MemberResponse")
    members = tuple(
        build(member_cls, member_id=mid, group_instance_id=iid, error_code=err)
        for (mid, iid), err in zip(identities, errors, strict=False)
    )
    return build(cls, throttle_time=ZERO_THROTTLE, error_code=top, members=members)


# ---------------------------------------------------------------- offsets


def _known_partition(ctx: RequestContext, topic: str, partition: int) -> bool:
    info = ctx.broker.partitions.topic(topic)
    return info is not None and 0 <= partition < len(info.partitions)


# OffsetCommit v10 and OffsetFetch v10 (Kafka 4.2, KIP-848) name topics by id instead of name
FIRST_OFFSETS_TOPIC_ID = 10


def _topic_name_of(ctx: RequestContext, topic: Any) -> str | None:
    """The topic's name: from its id in v10+ (None when this broker does not know the id, the
    zero id included), else as sent."""
    if ctx.api_version < FIRST_OFFSETS_TOPIC_ID:
        name: str = topic.name
        return name
    info = ctx.broker.partitions.topic_by_id(topic.topic_id)
    return info.name if info is not None else None


def _topic_id_of(ctx: RequestContext, name: str) -> Any:
    info = ctx.broker.partitions.topic(name)
    return topic_uuid(info.topic_id) if info is not None else None


@handles(OFFSET_COMMIT)
async def offset_commit(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    topic_cls = nested(cls, "OffsetCommitResponseTopic")
    partition_cls = nested(cls, "OffsetCommitResponsePartition")
    by_id = ctx.api_version >= FIRST_OFFSETS_TOPIC_ID
    # each request topic's name, None for an id this broker does not know (UNKNOWN_TOPIC_ID)
    named = [(t, _topic_name_of(ctx, t)) for t in request.topics]
    errors: dict[tuple[str, int], ErrorCode] = {}
    order = [(name, p.partition_index) for t, name in named if name is not None for p in t.partitions]
    error = _group_error(ctx, request.group_id)
    if error is not None:
        errors = dict.fromkeys(order, error)
    else:
        coordinator = _coordinator(ctx)
        offsets = []
        for t, name in named:
            if name is None:
                continue
            readable = authz.allowed(ctx, authz.Op.READ, authz.TOPIC, name)
            for p in t.partitions:
                if not readable:
                    errors[(name, p.partition_index)] = ErrorCode.topic_authorization_failed
                elif _known_partition(ctx, name, p.partition_index):
                    offsets.append(
                        (
                            name,
                            p.partition_index,
                            p.committed_offset,
                            getattr(p, "committed_leader_epoch", -1),
                            p.committed_metadata,
                        )
                    )
                else:
                    errors[(name, p.partition_index)] = ErrorCode.unknown_topic_or_partition
        retention = _ms(getattr(request, "retention_time", -1))
        plan = coordinator.manager.prepare_commit(
            now_ms(),
            group_id=request.group_id,
            generation_id=request.generation_id_or_member_epoch,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            offsets=offsets,
            retention_ms=retention if retention >= 0 else -1,
        )
        errors.update(await coordinator.commit(plan))
    topics: dict[Any, list[Any]] = {}
    for t, name in named:
        key = t.topic_id if by_id else t.name
        for p in t.partitions:
            code = ErrorCode.unknown_topic_id if name is None else errors.get((name, p.partition_index), ErrorCode.none)
            topics.setdefault(key, []).append(build(partition_cls, partition_index=p.partition_index, error_code=code))
    key_field = "topic_id" if by_id else "name"
    return build(
        cls,
        throttle_time=ZERO_THROTTLE,
        topics=tuple(build(topic_cls, partitions=tuple(ps), **{key_field: k}) for k, ps in topics.items()),
    )


def _fetch_group(
    ctx: RequestContext,
    group_id: str,
    requested: list[tuple[str, list[int]]] | None,
    require_stable: bool = False,
    member: tuple[str | None, int] = (None, -1),
) -> tuple[ErrorCode, list[tuple[str, list[tuple[int, Any, ErrorCode]]]]]:
    """(group error, [(topic, [(partition, CommittedOffset | None, partition error)])]).
    `member`: OffsetFetch v9's member id and epoch, checked for KIP-848 groups."""
    error = _group_error(ctx, group_id, authz.Op.DESCRIBE)
    if error is None and not group_id:
        error = ErrorCode.invalid_group_id
    if error is None:
        group = _coordinator(ctx).manager.groups.get(group_id)
        if group is not None and group.share is not None:
            error = ErrorCode.group_id_not_found  # Kafka: a share group has no committed offsets
    if error is None and member[0] is not None and member[1] >= 0:
        asked = [(t, p) for t, ps in requested or () for p in ps]
        member_error = _coordinator(ctx).manager.consumer_check_member(group_id, member[0], member[1], asked)
        if member_error is not None and member_error != ErrorCode.none:
            error = member_error
    if error is not None:
        if requested is None:
            return error, []
        return error, [(t, [(p, None, error) for p in ps]) for t, ps in requested]
    coordinator = _coordinator(ctx)
    manager = coordinator.manager
    checked = ctx.broker.authorizer is not None
    denied: list[tuple[str, list[int]]] = []
    if checked and requested is not None:
        denied = [(t, ps) for t, ps in requested if not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, t)]
        requested = [(t, ps) for t, ps in requested if authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, t)]
    wanted = None if requested is None else [(t, p) for t, ps in requested for p in ps]
    by_topic: dict[str, list[tuple[int, Any, ErrorCode]]] = {}
    for t, p, committed in manager.fetch_offsets(group_id, wanted):
        if checked and requested is None and not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, t):
            continue  # all of the group's offsets: only those of topics the client may see
        if require_stable and coordinator.has_pending_txn_offset(group_id, t, p):
            # an open transaction holds an offset for it: the client retries (KIP-447)
            by_topic.setdefault(t, []).append((p, None, ErrorCode.unstable_offset_commit))
            continue
        by_topic.setdefault(t, []).append((p, committed, ErrorCode.none))
    for t, ps in denied:
        by_topic.setdefault(t, []).extend((p, None, ErrorCode.topic_authorization_failed) for p in ps)
    return ErrorCode.none, list(by_topic.items())


@handles(OFFSET_FETCH)
async def offset_fetch(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    # require_stable (v7+): a partition with a pending transactional offset answers
    # UNSTABLE_OFFSET_COMMIT (retriable) until the transaction ends
    stable = bool(getattr(request, "require_stable", False))
    if has_field(cls, "groups"):
        group_cls = nested(cls, "OffsetFetchResponseGroup")
        topic_cls = nested(cls, "OffsetFetchResponseTopics")
        partition_cls = nested(cls, "OffsetFetchResponsePartitions")
        groups = []
        by_id = ctx.api_version >= FIRST_OFFSETS_TOPIC_ID
        for g in request.groups:
            requested: list[tuple[str, list[int]]] | None = None
            unknown: list[tuple[Any, list[int]]] = []  # v10: ids this broker does not know
            if g.topics is not None:
                requested = []
                for t in g.topics:
                    name = _topic_name_of(ctx, t)
                    if name is None:
                        unknown.append((t.topic_id, list(t.partition_indexes)))
                    else:
                        requested.append((name, list(t.partition_indexes)))
            error, topics = _fetch_group(
                ctx,
                g.group_id,
                requested,
                stable,
                (getattr(g, "member_id", None), int(getattr(g, "member_epoch", -1))),
            )
            answered = _fetch_topics(topic_cls, partition_cls, topics, ctx if by_id else None)
            if unknown:
                answered += tuple(
                    build(
                        topic_cls,
                        topic_id=topic_id,
                        partitions=tuple(
                            build(
                                partition_cls,
                                partition_index=p,
                                committed_offset=-1,
                                committed_leader_epoch=-1,
                                metadata="",
                                error_code=ErrorCode.unknown_topic_id,
                            )
                            for p in ps
                        ),
                    )
                    for topic_id, ps in unknown
                )
            groups.append(build(group_cls, group_id=g.group_id, error_code=error, topics=answered))
        return build(cls, throttle_time=ZERO_THROTTLE, groups=tuple(groups))
    topic_cls = nested(cls, "OffsetFetchResponseTopic")
    partition_cls = nested(cls, "OffsetFetchResponsePartition")
    requested = None if request.topics is None else [(t.name, list(t.partition_indexes)) for t in request.topics]
    error, topics = _fetch_group(ctx, request.group_id, requested, stable)
    if has_field(cls, "error_code") and error != ErrorCode.none:
        topics = []  # v2+: a group-level error is reported once, at the top, with no partitions
    return build(
        cls, throttle_time=ZERO_THROTTLE, error_code=error, topics=_fetch_topics(topic_cls, partition_cls, topics)
    )


def _fetch_topics(
    topic_cls: type,
    partition_cls: type,
    topics: list[tuple[str, list[tuple[int, Any, ErrorCode]]]],
    by_id: RequestContext | None = None,
) -> tuple[Any, ...]:
    """`by_id` (v10+): topics are named by their current id; offsets of a topic that has none
    any more (deleted) are left out, as Kafka does."""
    out = []
    for name, parts in topics:
        topic_id = None
        if by_id is not None:
            topic_id = _topic_id_of(by_id, name)
            if topic_id is None:
                continue
        out.append(
            build(
                topic_cls,
                name=name,
                topic_id=topic_id,
                partitions=tuple(
                    build(
                        partition_cls,
                        partition_index=p,
                        committed_offset=o.offset if o is not None else -1,
                        committed_leader_epoch=o.leader_epoch if o is not None else -1,
                        metadata=o.metadata if o is not None else "",
                        error_code=err,
                    )
                    for p, o, err in parts
                ),
            )
        )
    return tuple(out)


@handles(OFFSET_DELETE)
async def offset_delete(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    topic_cls = nested(cls, "OffsetDeleteResponseTopic")
    partition_cls = nested(cls, "OffsetDeleteResponsePartition")
    error = _group_error(ctx, request.group_id, authz.Op.DELETE)
    if error is None and not request.group_id:
        error = ErrorCode.invalid_group_id
    if error is not None:
        return build(cls, error_code=error, throttle_time=ZERO_THROTTLE, topics=())
    order = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    unknown = {
        k: ErrorCode.topic_authorization_failed
        if not authz.allowed(ctx, authz.Op.READ, authz.TOPIC, k[0])
        else ErrorCode.unknown_topic_or_partition
        for k in order
        if not _known_partition(ctx, *k) or not authz.allowed(ctx, authz.Op.READ, authz.TOPIC, k[0])
    }
    top, errors = await _coordinator(ctx).delete_offsets(request.group_id, [k for k in order if k not in unknown])
    if top != ErrorCode.none:
        return build(cls, error_code=top, throttle_time=ZERO_THROTTLE, topics=())
    errors.update(unknown)
    topics: dict[str, list[Any]] = {}
    for name, index in order:
        topics.setdefault(name, []).append(
            build(partition_cls, partition_index=index, error_code=errors.get((name, index), ErrorCode.none))
        )
    return build(
        cls,
        error_code=ErrorCode.none,
        throttle_time=ZERO_THROTTLE,
        topics=tuple(build(topic_cls, name=n, partitions=tuple(ps)) for n, ps in topics.items()),
    )


# ---------------------------------------------------------------- listing, describing, deleting groups


@handles(LIST_GROUPS)
async def list_groups(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    group_cls = nested(cls, "ListedGroup")
    coordinator = _coordinator(ctx)
    states = list(getattr(request, "states_filter", ()) or ())
    types = [t.lower() for t in (getattr(request, "types_filter", ()) or ())]
    listed = [g for g in coordinator.manager.list_groups(states) if not types or g[3] in types]
    if ctx.broker.authorizer is not None and not authz.cluster_allowed(ctx, authz.Op.DESCRIBE):
        listed = [g for g in listed if authz.allowed(ctx, authz.Op.DESCRIBE, authz.GROUP, g[0])]
    error = ErrorCode.coordinator_load_in_progress if coordinator.loading else ErrorCode.none
    groups = tuple(
        build(group_cls, group_id=g, protocol_type=pt, group_state=st, group_type=kind) for g, pt, st, kind in listed
    )
    return build(cls, throttle_time=ZERO_THROTTLE, error_code=error, groups=groups)


@handles(DESCRIBE_GROUPS)
async def describe_groups(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    group_cls = nested(cls, "DescribedGroup")
    member_cls = nested(cls, "DescribedGroupMember")
    operations = (
        GROUP_OPERATIONS if getattr(request, "include_authorized_operations", False) else NO_AUTHORIZED_OPERATIONS
    )
    out = []
    for group_id in request.groups:
        if ctx.broker.authorizer is not None and operations != NO_AUTHORIZED_OPERATIONS:
            operations = authz.operations(ctx, True, authz.GROUP, group_id)
        common = dict(group_id=group_id, authorized_operations=operations, error_message=None)
        error = _group_error(ctx, group_id, authz.Op.DESCRIBE)
        if error is None and not group_id:
            error = ErrorCode.invalid_group_id
        if error is not None:
            out.append(
                build(
                    group_cls,
                    error_code=error,
                    group_state="",
                    protocol_type="",
                    protocol_data="",
                    members=(),
                    **common,
                )
            )
            continue
        manager = _coordinator(ctx).manager
        summary = manager.describe(group_id)
        group = manager.groups.get(group_id)
        missing: str | None = None
        if group is not None and (group.consumer is not None or group.share is not None):
            # as Kafka: a KIP-848 group is described with ConsumerGroupDescribe, a share group
            # with ShareGroupDescribe
            missing = f"Group {group_id} is not a classic group."
        elif summary is None:
            missing = f"Group {group_id} not found."
        if missing is not None:
            # v6+ says so; older versions answer a Dead group without an error
            found_error = ErrorCode.group_id_not_found if ctx.api_version >= 6 else ErrorCode.none
            out.append(
                build(
                    group_cls,
                    **{**common, "error_message": missing if ctx.api_version >= 6 else None},
                    error_code=found_error,
                    group_state="Dead",
                    protocol_type="",
                    protocol_data="",
                    members=(),
                )
            )
            continue
        assert summary is not None
        members = tuple(
            build(
                member_cls,
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata,
                member_assignment=m.assignment,
            )
            for m in summary.members
        )
        out.append(
            build(
                group_cls,
                error_code=ErrorCode.none,
                group_state=summary.state,
                protocol_type=summary.protocol_type,
                protocol_data=summary.protocol_name,
                members=members,
                **common,
            )
        )
    return build(cls, throttle_time=ZERO_THROTTLE, groups=tuple(out))


@handles(DELETE_GROUPS)
async def delete_groups(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    result_cls = nested(cls, "DeletableGroupResult")
    results = []
    for group_id in request.groups_names:
        error = _group_error(ctx, group_id, authz.Op.DELETE)
        if error is None:
            error = ErrorCode.invalid_group_id if not group_id else await _coordinator(ctx).delete_group(group_id)
        results.append(build(result_cls, group_id=group_id, error_code=error))
    return build(cls, throttle_time=ZERO_THROTTLE, results=tuple(results))
