"""ShareFetch (78) and ShareAcknowledge (79): KIP-932 share groups, the partition leader's side.

A ShareFetch does, in order: session bookkeeping (share sessions, sessions.py), the
acknowledgements piggy-backed on it (applied, then made durable before the answer), and the
acquisition of records for the member: for each partition of its session, the available
records from the share-partition's first acquirable offset, whole stored batches as they
are, plus the AcquiredRecords ranges (first, last, delivery count) that say which of their
records the member now holds. It long-polls like Fetch (min_bytes / max_wait) on appends to
the partitions and on records becoming available again (releases, lock expiries).

Errors are Kafka's: top level INVALID_SHARE_SESSION_EPOCH, SHARE_SESSION_NOT_FOUND,
SHARE_SESSION_LIMIT_REACHED, INVALID_REQUEST (acknowledgements on a session-opening fetch,
no member id), GROUP_AUTHORIZATION_FAILED; per partition UNKNOWN_TOPIC_ID,
NOT_LEADER_OR_FOLLOWER (with the leader's endpoint, KIP-951), TOPIC_AUTHORIZATION_FAILED;
per partition acknowledge_error_code INVALID_RECORD_STATE (records this member does not hold)
and INVALID_REQUEST (malformed or overlapping batches).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka import codec, records
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.metadata import topic_uuid
from automq.broker.kafka.handlers.produce import node_endpoints
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.partitions import NotLeaderError, UnknownPartitionError
from automq.broker.kafka.share.manager import SharePartition, SharePartitionManager, ShareStateFenced
from automq.broker.kafka.share.metrics import ACK_TYPE_NAMES
from automq.broker.kafka.share.partition_state import REJECT, InvalidAcknowledgement, InvalidRecordState
from automq.broker.kafka.share.sessions import FINAL_EPOCH, INITIAL_EPOCH, ShareSession
from automq.broker.storage.api import StreamClosedError

log = logging.getLogger(__name__)

SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79
_NO_LEADER = (-1, -1)
READ_CAP_BYTES = 8 << 20


@dataclass(slots=True)
class _Part:
    """One partition's answer being assembled."""

    topic: str | None
    topic_id: uuid.UUID | None
    index: int
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    ack_error: ErrorCode = ErrorCode.none
    ack_message: str | None = None
    acked: bool = False  # the request carried acknowledgements for it
    share: SharePartition | None = None
    payloads: list = field(default_factory=list)
    acquired: list = field(default_factory=list)  # (first, last, delivery count)
    size: int = 0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _manager(ctx: RequestContext) -> SharePartitionManager:
    manager: SharePartitionManager = ctx.broker.share_partitions
    return manager


def _resolve(ctx: RequestContext, topic_id: uuid.UUID | None) -> tuple[str | None, ErrorCode, int]:
    """(topic name, error, partition count) of a requested topic id."""
    info = ctx.broker.partitions.topic_by_id(topic_id)
    if info is None:
        return None, ErrorCode.unknown_topic_id, 0
    if ctx.broker.authorizer is not None and not authz.allowed(ctx, authz.Op.READ, authz.TOPIC, info.name):
        return info.name, ErrorCode.topic_authorization_failed, len(info.partitions)
    return info.name, ErrorCode.none, len(info.partitions)


def _check_group(ctx: RequestContext, group_id: str | None, member_id: str | None) -> ErrorCode:
    if not group_id:
        return ErrorCode.invalid_group_id
    if not member_id:
        return ErrorCode.invalid_request
    if ctx.broker.authorizer is not None and not authz.allowed(ctx, authz.Op.READ, authz.GROUP, group_id):
        return ErrorCode.group_authorization_failed
    return ErrorCode.none


async def _share_of(manager: SharePartitionManager, group_id: str, part: _Part) -> SharePartition | None:
    """The share-partition, or None with part.error set."""
    if part.topic is None or part.error != ErrorCode.none:
        return None
    try:
        return await manager.get(group_id, part.topic, part.index)
    except (NotLeaderError, StreamClosedError, ShareStateFenced):
        part.error = ErrorCode.not_leader_or_follower
    except UnknownPartitionError:
        part.error = ErrorCode.unknown_topic_or_partition
    except Exception as exc:
        log.exception("loading share state of %s for %s-%d failed", group_id, part.topic, part.index)
        part.error, part.message = ErrorCode.kafka_storage_error, f"share state unavailable: {exc}"
    return None


async def _acknowledge(
    manager: SharePartitionManager, group_id: str, member_id: str, part: _Part, batches: Any
) -> SharePartition | None:
    """Apply one partition's acknowledgement batches (not yet durable); returns the
    share-partition to persist, or None with part.ack_error set."""
    part.acked = True
    if part.error != ErrorCode.none:
        part.ack_error = part.error
        return None
    share = await _share_of(manager, group_id, part)
    if share is None:
        part.ack_error = part.error
        return None
    part.share = share
    previous_last = -1
    for b in batches:
        if b.first_offset <= previous_last:
            part.ack_error = ErrorCode.invalid_request
            part.ack_message = f"acknowledgement batches overlap or are out of order at offset {b.first_offset}"
            return share
        previous_last = b.last_offset
    # all or nothing for the partition: every batch is checked before any is applied
    for b in batches:
        try:
            share.state.validate(member_id, b.first_offset, b.last_offset, b.acknowledge_types)
        except InvalidRecordState as exc:
            part.ack_error, part.ack_message = ErrorCode.invalid_record_state, str(exc)
            return None
        except InvalidAcknowledgement as exc:
            part.ack_error, part.ack_message = ErrorCode.invalid_request, str(exc)
            return None
    settings = share.settings
    now = _now_ms()
    changed = False
    for b in batches:
        try:
            share.state.acknowledge(
                member_id,
                b.first_offset,
                b.last_offset,
                b.acknowledge_types,
                settings.delivery_count_limit,
                settings.record_lock_duration_ms,
                now,
            )
            changed = True
            _count_acknowledgement(share, b.first_offset, b.last_offset, b.acknowledge_types)
        except InvalidRecordState as exc:
            part.ack_error, part.ack_message = ErrorCode.invalid_record_state, str(exc)
        except InvalidAcknowledgement as exc:
            part.ack_error, part.ack_message = ErrorCode.invalid_request, str(exc)
    if changed:
        share.changed()
        share.schedule_expiry()  # a renew may have moved the earliest deadline
        share.wake()  # released records may be available to others now
    return share if changed else None


def _count_acknowledgement(share: SharePartition, first: int, last: int, types: Any) -> None:
    if len(types) == 1:
        share.metrics.acknowledged.labels(ACK_TYPE_NAMES[types[0]]).inc(last - first + 1)
        return
    for t, n in Counter(types).items():
        share.metrics.acknowledged.labels(ACK_TYPE_NAMES[t]).inc(n)


async def _persist(shares: list[tuple[_Part, SharePartition]]) -> None:
    """Acknowledgements are answered only once durable."""

    async def one(part: _Part, share: SharePartition) -> None:
        try:
            await share.persist()
        except ShareStateFenced:
            part.ack_error = ErrorCode.not_leader_or_follower
        except Exception as exc:
            log.warning("persisting share state of %s failed: %s", share.key, exc)
            part.ack_error, part.ack_message = ErrorCode.kafka_storage_error, f"share state not written: {exc}"

    if shares:
        await asyncio.gather(*(one(p, s) for p, s in shares))


async def _acquire(
    part: _Part,
    member_id: str,
    budget_bytes: int,
    budget_records: int,
    strict_records: bool = False,
) -> tuple[int, int]:
    """Read and lock records for the member; returns (bytes, records) taken."""
    share = part.share
    if share is None or share.fenced or share.closed:
        return 0, 0
    partition = share.partition
    state = share.state
    settings = share.settings
    committed = settings.isolation_level == "read_committed"
    try:
        hw = _readable_end(share)
        if state.start_offset < partition.log_start_offset:
            state.move_start(partition.log_start_offset)
            share.changed()
        start = state.first_acquirable(hw, settings.partition_max_record_locks)
        if start is None:
            return 0, 0
        # a fetch takes max_records records, not max_bytes of them: read no more than
        # READ_CAP_BYTES per partition (the first batch is returned whole however big)
        result = await partition.read(start, max(min(budget_bytes, READ_CAP_BYTES), 1), hw)
    except (NotLeaderError, StreamClosedError):
        part.error = ErrorCode.not_leader_or_follower
        return 0, 0
    except Exception:
        log.exception("share fetch of %s-%d failed", part.topic, part.index)
        part.error = ErrorCode.kafka_storage_error
        return 0, 0
    batches = result.batches
    if not batches or share.closed:
        return 0, 0
    read_end = batches[-1].next_offset
    if not strict_records:
        # batch-optimized acquisition (Kafka's default mode): max_records may be exceeded up to
        # the end of the batch it falls in, so a batch is never split between two fetches
        # (the client would be sent the same batch again for its remaining records)
        for b in batches:
            if b.next_offset - start >= budget_records:
                read_end = b.next_offset
                break
        budget_records = max(budget_records, read_end - start)
    acquired = state.acquire(
        member_id,
        read_end,
        budget_records,
        settings.partition_max_record_locks,
        settings.record_lock_duration_ms,
        _now_ms(),
        from_offset=start,
    )
    if not acquired:
        return 0, 0
    if committed:
        acquired = _drop_uncommitted(
            share, member_id, batches, acquired, partition.aborted_transactions(start, read_end)
        )
        if not acquired:
            return 0, 0
    share.schedule_expiry()
    first = sum(last - f + 1 for f, last, c in acquired if c == 1)
    total = sum(last - f + 1 for f, last, _c in acquired)
    if first:
        share.metrics.delivered.labels("first").inc(first)
    if total > first:
        share.metrics.delivered.labels("redelivery").inc(total - first)
    # only the batches holding acquired records travel (the client skips the rest of a batch)
    payloads = []
    size = 0
    ai = 0
    for b in batches:
        while ai < len(acquired) and acquired[ai][1] < b.base_offset:
            ai += 1
        if ai == len(acquired):
            break
        if acquired[ai][0] < b.next_offset:
            payloads.append(b.payload)
            size += len(b.payload)
    part.payloads, part.size = payloads, size
    part.acquired = acquired
    return size, total


def _readable_end(share: SharePartition) -> int:
    """Where acquisition stops: the high watermark, or for read_committed the last stable
    offset (nothing at or past the first offset of an open transaction)."""
    partition = share.partition
    if share.settings.isolation_level == "read_committed":
        return partition.last_stable_offset
    return partition.high_watermark


def _acquirable(share: SharePartition) -> bool:
    return share.state.first_acquirable(_readable_end(share), share.settings.partition_max_record_locks) is not None


def _drop_uncommitted(
    share: SharePartition,
    member_id: str,
    batches: list,
    acquired: list[tuple[int, int, int]],
    aborted: list,
) -> list[tuple[int, int, int]]:
    """read_committed: records of aborted transactions and transaction markers are archived
    as they are acquired, never handed out (Kafka's share-partition leader does the same).
    One header parse per batch, and only for transactional batches."""
    skip: list[tuple[int, int]] = []
    for b in batches:
        head = records.parse_header(b.payload)
        if not head.attributes & records.TRANSACTIONAL_BIT:
            continue
        last = b.base_offset + head.last_offset_delta
        if head.attributes & records.CONTROL_BIT or any(
            a.producer_id == head.producer_id and a.first_offset <= b.base_offset <= a.last_offset for a in aborted
        ):
            skip.append((b.base_offset, last))
    if not skip:
        return acquired
    limit = share.settings.delivery_count_limit
    kept: list[tuple[int, int, int]] = []
    for first, last, count in acquired:
        pos = first
        for s_first, s_last in skip:
            lo, hi = max(s_first, pos), min(s_last, last)
            if lo > hi:
                continue
            if lo > pos:
                kept.append((pos, lo - 1, count))
            share.state.acknowledge(member_id, lo, hi, [REJECT], limit, 0, 0)
            pos = hi + 1
        if pos <= last:
            kept.append((pos, last, count))
    share.changed()
    return kept


def _leader(ctx: RequestContext, part: _Part, leaders: set[int]) -> tuple[int, int]:
    if part.share is not None and part.error == ErrorCode.none:
        return ctx.broker.node_id, part.share.partition.leader_epoch
    if part.topic is None:
        return _NO_LEADER
    hint = ctx.broker.leader_of(part.topic, part.index)
    if hint is None:
        return _NO_LEADER
    if part.error == ErrorCode.not_leader_or_follower and hint[0] != ctx.broker.node_id:
        leaders.add(hint[0])
    return hint


def _top_level(ctx: RequestContext, error: ErrorCode, message: str | None = None) -> Any:
    return codec.build(
        ctx.response_class,
        throttle_time=codec.ZERO_THROTTLE,
        error_code=error,
        error_message=message,
        acquisition_lock_timeout=codec.ZERO_THROTTLE,
        responses=(),
        node_endpoints=(),
    )


def _session_for(
    ctx: RequestContext, group_id: str, member_id: str, epoch: int, *, opening_allowed: bool
) -> tuple[ShareSession | None, ErrorCode]:
    sessions = ctx.broker.share_sessions
    if epoch == INITIAL_EPOCH:
        if not opening_allowed:
            return None, ErrorCode.invalid_share_session_epoch
        session, evicted = sessions.create(group_id, member_id)
        if evicted is not None:
            _release(ctx, evicted)
        if session is not None:
            _bind(ctx, session)
        return session, (ErrorCode.none if session is not None else ErrorCode.share_session_limit_reached)
    session = sessions.get(group_id, member_id)
    if session is None:
        return None, ErrorCode.share_session_not_found
    if epoch == FINAL_EPOCH:
        return session, ErrorCode.none
    if epoch != session.epoch:
        return None, ErrorCode.invalid_share_session_epoch
    session.next_epoch()
    _bind(ctx, session)
    return session, ErrorCode.none


def _bind(ctx: RequestContext, session: ShareSession) -> None:
    """Tie the session to the connection it is used on: a consumer that dies (or loses its
    connection) gets its records released at once instead of when their locks expire."""
    connection = ctx.on_close
    if connection is None or session.connection is connection:
        return
    session.connection = connection
    sessions = ctx.broker.share_sessions

    def closed() -> None:
        if session.connection is connection and sessions.get(session.group_id, session.member_id) is session:
            _close_session(ctx, session)

    connection[("share-session", session.group_id, session.member_id)] = closed


def _close_session(ctx: RequestContext, session: ShareSession) -> None:
    ctx.broker.share_sessions.remove(session.group_id, session.member_id)
    _release(ctx, session)


def _release(ctx: RequestContext, session: ShareSession) -> None:
    released = _manager(ctx).release_member(session.group_id, session.member_id, list(session.partitions))
    if released:
        log.debug("share session %s/%s closed: %d records released", session.group_id, session.member_id, released)


def _lock_of(parts: Any) -> int:
    return max((p.share.settings.record_lock_duration_ms for p in parts if p.share is not None), default=30_000)


def _time_ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


@handles(SHARE_FETCH)
async def share_fetch(request, ctx: RequestContext):
    manager = _manager(ctx)
    group_id, member_id = request.group_id, request.member_id
    error = _check_group(ctx, group_id, member_id)
    if error != ErrorCode.none:
        return _top_level(ctx, error)
    assert group_id is not None and member_id is not None
    epoch = request.share_session_epoch
    has_acks = any(p.acknowledgement_batches for t in request.topics for p in t.partitions)
    if epoch == INITIAL_EPOCH and has_acks:
        return _top_level(ctx, ErrorCode.invalid_request, "a share session opens without acknowledgements")
    session, error = _session_for(ctx, group_id, member_id, epoch, opening_allowed=True)
    if error != ErrorCode.none or session is None:
        return _top_level(ctx, error)

    # ---- the request's partitions: acknowledgements, and additions to the session
    parts: dict[tuple[str | None, int], _Part] = {}
    extra: list[_Part] = []  # partitions answered once (unknown topic, no authorization)
    to_persist: list[tuple[_Part, SharePartition]] = []
    for t in request.topics:
        name, terr, count = _resolve(ctx, t.topic_id)
        for p in t.partitions:
            error = terr
            if error == ErrorCode.none and not 0 <= p.partition_index < count:
                # answered once, never kept in the session (a client cannot grow it at will)
                error = ErrorCode.unknown_topic_or_partition
            part = _Part(name, t.topic_id, p.partition_index, error=error)
            if error == ErrorCode.none and epoch != FINAL_EPOCH:
                session.partitions[(name, p.partition_index)] = t.topic_id  # type: ignore[index]
                parts[(name, p.partition_index)] = part
            else:
                extra.append(part)
            if p.acknowledgement_batches:
                share = await _acknowledge(manager, group_id, member_id, part, p.acknowledgement_batches)
                if share is not None:
                    to_persist.append((part, share))
    for forgotten in request.forgotten_topics_data:
        info = ctx.broker.partitions.topic_by_id(forgotten.topic_id)
        if info is not None:
            for index in forgotten.partitions:
                session.partitions.pop((info.name, index), None)
                parts.pop((info.name, index), None)
    # the acknowledgements are made durable while the new records are read and acquired; the
    # answer waits for both
    persisting = asyncio.ensure_future(_persist(to_persist)) if to_persist else None

    if epoch == FINAL_EPOCH:
        if persisting is not None:
            await persisting
        _close_session(ctx, session)
        return _respond(ctx, list(parts.values()) + extra, 0, full=True)
    if getattr(request, "is_renew_ack", False):
        # v2: a request that only renews locks fetches nothing
        if persisting is not None:
            await persisting
        return _respond(ctx, list(parts.values()) + extra, _lock_of(parts.values()), full=False)

    # ---- every partition of the session is fetched
    for (name, index), added_as in list(session.partitions.items()):
        if (name, index) not in parts:
            info = ctx.broker.partitions.topic(name)
            current = topic_uuid(info.topic_id) if info is not None else None
            if added_as is not None and current != added_as:
                # the topic the client added was deleted (perhaps recreated under its name):
                # answered once under the id the client knows, then gone from the session;
                # records of the new topic would reach a client that never asked for them
                session.partitions.pop((name, index), None)
                extra.append(_Part(name, added_as, index, error=ErrorCode.unknown_topic_id))
                continue
            parts[(name, index)] = _Part(name, current, index)
    fetching = list(parts.values())
    for part in fetching:
        if part.share is None:
            part.share = await _share_of(manager, group_id, part)
    lock_ms = max((p.share.settings.record_lock_duration_ms for p in fetching if p.share), default=30_000)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + _time_ms(request.max_wait) / 1000
    # MaxBytes 0 acquires nothing (Kafka answers such a fetch empty once max_wait elapses;
    # librdkafka's fetch.max.bytes=0 relies on it): reading "at least one batch" would hand out
    # and lock records the consumer said it has no room for
    nothing_fits = request.max_bytes <= 0
    max_bytes = max(request.max_bytes, 1)
    max_records = max(request.max_records, 1) if request.max_records > 0 else 500
    strict = getattr(request, "share_acquire_mode", 0) == 1  # v2 record_limit: never more than max_records
    rechecked = False
    while True:
        total_bytes = total_records = 0
        for part in fetching:
            if nothing_fits or total_records >= max_records or (total_bytes >= max_bytes and total_bytes > 0):
                break
            if part.acquired or part.error != ErrorCode.none:
                continue
            taken_bytes, taken = await _acquire(
                part,
                member_id,
                max_bytes - total_bytes,
                max_records - total_records,
                strict_records=strict,
            )
            total_bytes += taken_bytes
            total_records += taken
        total_bytes = sum(p.size for p in fetching)
        remaining = deadline - loop.time()
        if (total_bytes >= request.min_bytes and total_bytes > 0) or remaining <= 0:
            break
        if any(p.error != ErrorCode.none for p in fetching) or not fetching or to_persist:
            break  # errors and acknowledgement results go back at once
        waiter: asyncio.Future[None] = loop.create_future()
        shares = [p.share for p in fetching if p.share is not None]
        for s in shares:
            s.partition.add_waiter(waiter)
            s.add_waiter(waiter)
        try:
            # records may have become acquirable since the read; look again once, then wait
            # (never loop without awaiting: an acquisition can come back empty)
            if not rechecked and any(_acquirable(s) for s in shares):
                rechecked = True
                continue
            rechecked = False
            await asyncio.wait_for(waiter, remaining)
        except TimeoutError:
            pass
        finally:
            for s in shares:
                s.partition.remove_waiter(waiter)
                s.remove_waiter(waiter)
        if total_bytes > 0:
            break
    if persisting is not None:
        await persisting
        for part in fetching:
            if part.acquired and part.share is not None and part.share.fenced:
                # another leader took the state over meanwhile: these locks mean nothing
                part.acquired, part.payloads, part.size = [], [], 0
                part.error = ErrorCode.not_leader_or_follower
    for part in fetching:
        if part.size:
            ctx.broker.metrics.record_fetch(part.topic or "", part.index, part.size)
    return _respond(ctx, fetching + extra, lock_ms, full=epoch == INITIAL_EPOCH)


def _respond(ctx: RequestContext, parts: list[_Part], lock_ms: int, *, full: bool) -> Any:
    cls = ctx.response_class
    part_cls = codec.nested(cls, "PartitionData")
    topic_cls = codec.nested(cls, "ShareFetchableTopicResponse")
    acquired_cls = codec.nested(cls, "AcquiredRecords")
    leader_cls = codec.nested(cls, "LeaderIdAndEpoch")
    leaders: set[int] = set()
    by_topic: dict[Any, list] = {}
    for part in parts:
        if not full and not (part.size or part.acquired or part.error != ErrorCode.none or part.acked):
            continue  # incremental answers leave out partitions with nothing new
        leader = _leader(ctx, part, leaders)
        payloads = part.payloads
        data = codec.RecordSet(payloads) if len(payloads) > 1 else (payloads[0] if payloads else b"")
        by_topic.setdefault(part.topic_id, []).append(
            codec.build(
                part_cls,
                partition_index=part.index,
                error_code=part.error,
                error_message=part.message,
                acknowledge_error_code=part.ack_error,
                acknowledge_error_message=part.ack_message,
                current_leader=leader_cls(leader_id=leader[0], leader_epoch=leader[1]),
                records=data,
                acquired_records=tuple(
                    acquired_cls(first_offset=f, last_offset=last, delivery_count=c) for f, last, c in part.acquired
                ),
            )
        )
    return codec.build(
        cls,
        throttle_time=codec.ZERO_THROTTLE,
        error_code=ErrorCode.none,
        acquisition_lock_timeout=_td(lock_ms),
        responses=tuple(codec.build(topic_cls, topic_id=tid, partitions=tuple(ps)) for tid, ps in by_topic.items()),
        node_endpoints=node_endpoints(ctx.broker, cls, leaders, ctx.listener),
    )


def _td(ms: int) -> timedelta:
    return timedelta(milliseconds=ms)


@handles(SHARE_ACKNOWLEDGE)
async def share_acknowledge(request, ctx: RequestContext):
    manager = _manager(ctx)
    group_id, member_id = request.group_id, request.member_id
    error = _check_group(ctx, group_id, member_id)
    if error != ErrorCode.none:
        return _top_level(ctx, error)
    assert group_id is not None and member_id is not None
    epoch = request.share_session_epoch
    session, error = _session_for(ctx, group_id, member_id, epoch, opening_allowed=False)
    if error != ErrorCode.none or session is None:
        return _top_level(ctx, error)
    parts: list[_Part] = []
    to_persist: list[tuple[_Part, SharePartition]] = []
    for t in request.topics:
        name, terr, _count = _resolve(ctx, t.topic_id)
        for p in t.partitions:
            part = _Part(name, t.topic_id, p.partition_index, error=terr)
            parts.append(part)
            share = await _acknowledge(manager, group_id, member_id, part, p.acknowledgement_batches)
            if share is not None:
                to_persist.append((part, share))
    await _persist(to_persist)
    if epoch == FINAL_EPOCH:
        _close_session(ctx, session)
    lock_ms = max((s.settings.record_lock_duration_ms for _p, s in to_persist), default=30_000)
    cls = ctx.response_class
    part_cls = codec.nested(cls, "PartitionData")
    topic_cls = codec.nested(cls, "ShareAcknowledgeTopicResponse")
    leader_cls = codec.nested(cls, "LeaderIdAndEpoch")
    leaders: set[int] = set()
    by_topic: dict[Any, list] = {}
    for part in parts:
        part.error = part.ack_error if part.ack_error != ErrorCode.none else part.error
        leader = _leader(ctx, part, leaders)
        by_topic.setdefault(part.topic_id, []).append(
            codec.build(
                part_cls,
                partition_index=part.index,
                error_code=part.error,
                error_message=part.ack_message,
                current_leader=leader_cls(leader_id=leader[0], leader_epoch=leader[1]),
            )
        )
    return codec.build(
        cls,
        throttle_time=codec.ZERO_THROTTLE,
        error_code=ErrorCode.none,
        acquisition_lock_timeout=_td(lock_ms),
        responses=tuple(codec.build(topic_cls, topic_id=tid, partitions=tuple(ps)) for tid, ps in by_topic.items()),
        node_endpoints=node_endpoints(ctx.broker, cls, leaders, ctx.listener),
    )
