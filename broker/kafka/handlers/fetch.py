"""Fetch: whole stored batches, concatenated as they are, long-polled, with fetch sessions.

- Long poll: if fewer than min_bytes are available the request waits up to max_wait for an
  append to any of its partitions to become durable (a future per request, woken by the
  partitions; no polling), then reads again.
- Only durable data is served: reads stop at the high watermark (= the stream's confirm
  offset). isolation_level read_committed (1) stops at the last stable offset (the first
  offset of the oldest open transaction) and reports the aborted transactions overlapping the
  data returned, so the client drops their batches (and skips the control batches, as every
  client does). read_uncommitted serves everything and reports no aborted transactions.
- OFFSET_OUT_OF_RANGE below the log start offset or past the log end offset (an offset
  between the high watermark and the log end is a normal wait, as in Kafka).
- partition_max_bytes and the response max_bytes bound the data, except that the first
  batch found is always returned whole (KIP-74) so a consumer can always make progress.
- Fetch sessions (KIP-227, v7+): see fetch_sessions.py. v13+ names topics by topic id. In an
  incremental session a partition that returned data moves to the end of the session's order
  (as in Kafka), so when max_bytes cannot hold every partition's data, the others come first
  next time instead of starving behind it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka import codec
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.fetch_sessions import FINAL_EPOCH, INITIAL_EPOCH, FetchSession, SessionPartition
from automq.broker.kafka.handlers.leader_epochs import leader_epoch_error
from automq.broker.kafka.handlers.metadata import topic_uuid
from automq.broker.kafka.handlers.produce import node_endpoints
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.partitions import NotLeaderError, Partition, UnknownPartitionError
from automq.broker.storage.api import OffsetOutOfRangeError, StreamClosedError

log = logging.getLogger(__name__)

API_KEY = 1
# KIP-951: the errors whose answer names the current leader, so the client skips a metadata round
_LEADER_HINT_ERRORS = frozenset((ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch))


@dataclass(slots=True)
class _Read:
    """One partition's answer being assembled."""

    target: SessionPartition
    topic_id: uuid.UUID | None
    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    log_start_offset: int = -1
    last_stable_offset: int = -1
    aborted: list | None = None  # read_committed: [(producer id, first offset)]
    payloads: list = field(default_factory=list)
    size: int = 0
    partition: Partition | None = None
    diverging: tuple[int, int] | None = None  # (epoch, end offset) where the client's log diverges


def _resolve_topic(broker, ctx_version: int, topic) -> tuple[str | None, uuid.UUID | None]:
    if ctx_version >= 13:
        topic_id = topic.topic_id
        info = broker.partitions.topic_by_id(topic_id)
        return (info.name if info is not None else None), topic_id
    name = topic.topic
    info = broker.partitions.topic(name)
    return name, (topic_uuid(info.topic_id) if info is not None else None)


async def _read_partition(read: _Read, max_bytes: int, committed: bool = False) -> None:
    """Fill `read` with up to max_bytes of batches (at least one if any) or an error;
    `committed`: read_committed (stop at the last stable offset, report aborted ranges)."""
    partition = read.partition
    if partition is None:
        return
    target = read.target
    try:
        hw = partition.high_watermark
        lso = partition.last_stable_offset
        read.high_watermark = hw
        read.last_stable_offset = lso
        read.log_start_offset = partition.log_start_offset
        if committed:
            read.aborted = []
        offset = target.fetch_offset
        if offset < read.log_start_offset or offset > partition.log_end_offset:
            read.error = ErrorCode.offset_out_of_range
            return
        end = lso if committed else hw
        if offset >= end or max_bytes <= 0:
            return
        result = await partition.read(offset, max_bytes, end)
        read.payloads = [b.payload for b in result.batches]
        read.size = sum(len(p) for p in read.payloads)
        read.high_watermark = partition.high_watermark
        read.last_stable_offset = partition.last_stable_offset
        read.log_start_offset = partition.log_start_offset
        if committed and result.batches:
            upper = result.batches[-1].next_offset
            read.aborted = [(a.producer_id, a.first_offset) for a in partition.aborted_transactions(offset, upper)]
    except OffsetOutOfRangeError as exc:
        read.error = ErrorCode.offset_out_of_range
        read.log_start_offset = exc.start_offset
    except (NotLeaderError, StreamClosedError):
        read.error = ErrorCode.not_leader_or_follower
    except Exception:
        log.exception("fetch of %s-%d at %d failed", target.topic, target.partition, target.fetch_offset)
        read.error = ErrorCode.kafka_storage_error


@handles(API_KEY)
async def fetch(request, ctx: RequestContext):
    broker = ctx.broker
    version = ctx.api_version
    cls = ctx.response_class
    sessions = broker.fetch_sessions

    # ---- what to read: the request's partitions, or the session's (KIP-227)
    requested: list[tuple[SessionPartition, uuid.UUID | None, ErrorCode]] = []
    for topic in request.topics:
        name, topic_id = _resolve_topic(broker, version, topic)
        for p in topic.partitions:
            sp = SessionPartition(
                topic=name or "",
                partition=p.partition,
                fetch_offset=p.fetch_offset,
                max_bytes=p.partition_max_bytes,
                current_leader_epoch=getattr(p, "current_leader_epoch", -1),
                last_fetched_epoch=getattr(p, "last_fetched_epoch", -1),
            )
            missing = (
                ErrorCode.none
                if name is not None
                else (ErrorCode.unknown_topic_id if version >= 13 else ErrorCode.unknown_topic_or_partition)
            )
            if (
                name is not None
                and broker.authorizer is not None
                and not authz.allowed(ctx, authz.Op.READ, authz.TOPIC, name)
            ):
                missing = ErrorCode.topic_authorization_failed  # answered once, never joins a session
            requested.append((sp, topic_id, missing))

    session: FetchSession | None = None
    response_session_id = 0
    incremental = False
    session_id = getattr(request, "session_id", 0)
    epoch = getattr(request, "session_epoch", FINAL_EPOCH)
    if version >= 7:
        if epoch == FINAL_EPOCH:
            if session_id:
                sessions.remove(session_id)
        elif epoch == INITIAL_EPOCH:
            if session_id:
                sessions.remove(session_id)
            session = sessions.create()
            if session is not None:
                response_session_id = session.session_id
                for sp, _tid, err in requested:
                    if err == ErrorCode.none:
                        session.partitions[(sp.topic, sp.partition)] = sp
        else:
            session = sessions.get(session_id)
            if session is None:
                return _top_level_error(cls, ErrorCode.fetch_session_id_not_found)
            if session.epoch != epoch:
                return _top_level_error(cls, ErrorCode.invalid_fetch_session_epoch)
            incremental = True
            response_session_id = session.session_id
            for sp, _tid, err in requested:
                key = (sp.topic, sp.partition)
                old = session.partitions.get(key)
                if old is not None:
                    old.fetch_offset = sp.fetch_offset
                    old.max_bytes = sp.max_bytes
                    old.current_leader_epoch = sp.current_leader_epoch
                    old.last_fetched_epoch = sp.last_fetched_epoch
                elif err == ErrorCode.none:
                    session.partitions[key] = sp
            for forgotten in getattr(request, "forgotten_topics_data", ()):
                if version >= 13:
                    info = broker.partitions.topic_by_id(forgotten.topic_id)
                    fname = info.name if info is not None else None
                else:
                    fname = forgotten.topic
                if fname is None:
                    continue  # a topic unknown here is in no session
                for index in forgotten.partitions:
                    session.partitions.pop((fname, index), None)
        if incremental:
            assert session is not None  # incremental means an existing session
            session.next_epoch()  # a new session already expects epoch 1

    reads: list[_Read] = []
    if incremental:
        assert session is not None
        for sp in session.partitions.values():
            info = broker.partitions.topic(sp.topic)
            reads.append(_Read(sp, topic_uuid(info.topic_id) if info is not None else None))
        # partitions of unknown topics never join the session; they are answered once
        reads.extend(_Read(sp, tid, error=err) for sp, tid, err in requested if err != ErrorCode.none)
    else:
        reads = [_Read(sp, tid, error=err) for sp, tid, err in requested]

    for read in reads:
        if read.error != ErrorCode.none:
            continue
        if broker.authorizer is not None and not authz.allowed(ctx, authz.Op.READ, authz.TOPIC, read.target.topic):
            read.error = ErrorCode.topic_authorization_failed  # ACLs changed while in a session
            continue
        try:
            read.partition = broker.partitions.get(read.target.topic, read.target.partition)
            # KIP-320: a client whose metadata is behind or ahead of this leader refreshes it
            read.error = leader_epoch_error(read.partition, read.target.current_leader_epoch)
            if read.error == ErrorCode.none:
                read.diverging = _diverging_epoch(read.partition, read.target)
            if read.error != ErrorCode.none or read.diverging is not None:
                read.high_watermark = read.partition.high_watermark
                read.last_stable_offset = read.partition.last_stable_offset
                read.log_start_offset = read.partition.log_start_offset
                read.partition = None  # nothing to read: an error, or the client must truncate first
        except NotLeaderError:
            read.error = ErrorCode.not_leader_or_follower
        except UnknownPartitionError:
            read.error = ErrorCode.unknown_topic_or_partition

    # ---- read, long-poll until min_bytes or max_wait
    max_bytes = getattr(request, "max_bytes", 0x7FFFFFFF)
    if ctx.broker.quotas.active:  # as Kafka: a fetch brings at most what the consumer's quota window holds
        max_bytes = min(max_bytes, ctx.broker.quotas.max_fetch_bytes(ctx.principal, ctx.client_id or ""))
    committed = getattr(request, "isolation_level", 0) == 1
    min_bytes = min(request.min_bytes, max_bytes)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request.max_wait.total_seconds()
    while True:
        await _read_all(reads, max_bytes, committed)
        total = sum(r.size for r in reads)
        any_error = any(r.error != ErrorCode.none for r in reads)
        remaining = deadline - loop.time()
        if total >= min_bytes or total >= max_bytes or any_error or remaining <= 0 or not reads:
            break
        waiter: asyncio.Future[None] = loop.create_future()
        led = [r.partition for r in reads if r.partition is not None]
        for p in led:
            p.add_waiter(waiter)
        try:
            # an append may have landed between the read and registering the waiter
            if any(p.high_watermark > r.high_watermark for r in reads if (p := r.partition) is not None):
                continue
            await asyncio.wait_for(waiter, remaining)
        except TimeoutError:
            pass
        finally:
            for p in led:
                p.remove_waiter(waiter)
        if loop.time() >= deadline:
            await _read_all(reads, max_bytes, committed)
            break

    # ---- answer
    metrics = broker.metrics
    partition_cls = codec.nested(cls, "PartitionData")
    topic_cls = codec.nested(cls, "FetchableTopicResponse")
    aborted_cls = codec.nested(cls, "AbortedTransaction")
    topics: list = []
    leaders: set[int] = set()
    current_key: Any = None  # topic name, or topic id (v13+)
    current_parts: list = []
    for read in reads:
        sp = read.target
        if (
            incremental
            and read.size == 0
            and read.error == ErrorCode.none
            and read.diverging is None
            and read.high_watermark == sp.last_high_watermark
            and read.log_start_offset == sp.last_log_start_offset
            and read.last_stable_offset == sp.last_stable_offset
        ):
            continue  # nothing new for this partition: incremental responses leave it out
        sp.last_high_watermark = read.high_watermark
        sp.last_log_start_offset = read.log_start_offset
        sp.last_stable_offset = read.last_stable_offset
        payloads = read.payloads
        data = codec.RecordSet(payloads) if len(payloads) > 1 else (payloads[0] if payloads else b"")
        if read.size:
            metrics.record_fetch(sp.topic, sp.partition, read.size)
            if incremental and session is not None and (sp.topic, sp.partition) in session.partitions:
                # as Kafka's incremental sessions do: a partition that got data goes to the end
                # of the session's order, so partitions after it get the next response's room
                session.partitions.move_to_end((sp.topic, sp.partition))
        extra: dict[str, Any] = {}
        if read.diverging is not None:
            extra["diverging_epoch"] = codec.nested(cls, "EpochEndOffset")(
                epoch=read.diverging[0], end_offset=read.diverging[1]
            )
        if read.error in _LEADER_HINT_ERRORS and codec.has_field(partition_cls, "current_leader"):
            hint = broker.leader_of(sp.topic, sp.partition)
            if hint is not None and (hint[0] != broker.node_id or read.error != ErrorCode.not_leader_or_follower):
                extra["current_leader"] = codec.nested(cls, "LeaderIdAndEpoch")(leader_id=hint[0], leader_epoch=hint[1])
                leaders.add(hint[0])
        part = codec.build(
            partition_cls,
            **extra,
            partition_index=sp.partition,
            error_code=read.error,
            high_watermark=read.high_watermark,
            last_stable_offset=read.last_stable_offset,
            log_start_offset=read.log_start_offset,
            aborted_transactions=(
                tuple(aborted_cls(producer_id=pid, first_offset=first) for pid, first in read.aborted)
                if read.aborted is not None and read.error == ErrorCode.none
                else None
            ),
            preferred_read_replica=-1,
            records=data,
        )
        topic_key = read.topic_id if version >= 13 else sp.topic
        if topic_key != current_key or (not topics and not current_parts):
            if current_parts:
                topics.append((current_key, current_parts))
            current_key, current_parts = topic_key, []
        current_parts.append(part)
    if current_parts:
        topics.append((current_key, current_parts))
    if version >= 13:
        responses = tuple(codec.build(topic_cls, topic_id=k, partitions=tuple(ps)) for k, ps in topics)
    else:
        responses = tuple(codec.build(topic_cls, topic=k, partitions=tuple(ps)) for k, ps in topics)
    return codec.build(
        cls,
        throttle_time=codec.ZERO_THROTTLE,
        error_code=ErrorCode.none,
        session_id=response_session_id,
        responses=responses,
        node_endpoints=node_endpoints(broker, cls, leaders, ctx.listener),
    )


async def _read_all(reads: list[_Read], max_bytes: int, committed: bool) -> None:
    """Read every partition that has nothing yet, in request order and never more than the
    response can carry; then cut to the response's max_bytes in request order, keeping at
    least the first batch found.

    Partitions are read concurrently in passes: a pass takes the next partitions whose
    limits (each its partition_max_bytes, the last one cut to what is left) fill the budget
    left, and the next pass spends what partitions that held less than their limit left
    over. A consumer asking for 16 MiB from each of 8 partitions and 64 MiB in all so reads
    64 MiB (from objects, through the block cache), not 128 MiB of which half is dropped."""
    pending = [r for r in reads if r.partition is not None and r.size == 0 and r.error == ErrorCode.none]
    budget = max_bytes - sum(r.size for r in reads)
    while pending and budget > 0:
        batch: list[tuple[_Read, int]] = []
        planned = 0
        for r in pending:
            if planned >= budget:
                break
            limit = min(r.target.max_bytes, budget - planned)
            batch.append((r, limit))
            planned += limit
        if len(batch) == 1:
            await _read_partition(batch[0][0], batch[0][1], committed)
        else:
            await asyncio.gather(*(_read_partition(r, limit, committed) for r, limit in batch))
        pending = pending[len(batch) :]
        budget -= sum(r.size for r, _ in batch)
    for r in pending:  # no room left: their offsets and watermarks only, as Kafka answers them
        await _read_partition(r, 0, committed)
    budget = max_bytes
    first = True
    for r in reads:
        if not r.payloads:
            continue
        kept: list[bytes | memoryview] = []
        size = 0
        for payload in r.payloads:
            if size + len(payload) > budget and not (first and not kept):
                break
            kept.append(payload)
            size += len(payload)
        first = False
        r.payloads, r.size = kept, size
        budget -= size


def _diverging_epoch(partition: Partition, target: SessionPartition) -> tuple[int, int] | None:
    """Fetch v12+ (KIP-595's check, answered to any fetcher that sends last_fetched_epoch):
    when the epoch of the last record the client has ended before its fetch offset here, or is
    unknown, the client's log diverges and it must truncate to (epoch, end offset) first."""
    if target.last_fetched_epoch < 0:
        return None
    epoch, end_offset = partition.epoch_end_offset(target.last_fetched_epoch)
    if epoch < target.last_fetched_epoch or end_offset < target.fetch_offset:
        return epoch, end_offset
    return None


def _top_level_error(cls, error: ErrorCode):
    return codec.build(cls, throttle_time=codec.ZERO_THROTTLE, error_code=error, session_id=0, responses=())
