"""The transaction APIs: AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and TxnOffsetCommit from
producers, WriteTxnMarkers between brokers. The work is the coordinators' (transactions/,
groups/); this module translates every version's request and response.

Errors as a Kafka 4.x broker gives them: requests for a transactional id this broker does not
coordinate get NOT_COORDINATOR (COORDINATOR_LOAD_IN_PROGRESS while it replays); an unknown
topic or partition in AddPartitionsToTxn gets UNKNOWN_TOPIC_OR_PARTITION and the request's
other partitions OPERATION_NOT_ATTEMPTED; PRODUCER_FENCED (KIP-588) is sent as
INVALID_PRODUCER_EPOCH to clients of the versions before it existed.

With an authorizer, Kafka's rules: WRITE on the transactional id for AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn and TxnOffsetCommit (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), WRITE on
each topic added (TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED), READ on the
group for AddOffsetsToTxn and TxnOffsetCommit (GROUP_AUTHORIZATION_FAILED), READ on the topics
of TxnOffsetCommit, CLUSTER_ACTION for WriteTxnMarkers (CLUSTER_AUTHORIZATION_FAILED).

Versions: EndTxn up to v4 and TxnOffsetCommit up to v4 (v5 belongs to KIP-890 part 2, the epoch
bump per transaction, not implemented); AddPartitionsToTxn v0-v5 (v4+ is the inter-broker form:
batched transactions, verify_only for KIP-890 part 1 verification by partition leaders,
CLUSTER_ACTION required, TRANSACTION_ABORTABLE from v5 and INVALID_TXN_STATE before).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka.codec import ZERO_THROTTLE, build, nested
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.groups.coordinator import OFFSETS_TOPIC
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.partitions import PartitionError
from automq.broker.kafka.transactions import markers
from automq.broker.kafka.transactions.coordinator import TransactionCoordinator
from automq.broker.kafka.transactions.verification import txn_offset_commit_error

log = logging.getLogger(__name__)

ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
WRITE_TXN_MARKERS = 27
TXN_OFFSET_COMMIT = 28


def fenced_for_version(error: ErrorCode, version: int, first_with_fenced: int) -> ErrorCode:
    if error == ErrorCode.producer_fenced and version < first_with_fenced:
        return ErrorCode.invalid_producer_epoch
    return error


def _may_write_txn(ctx: RequestContext, transactional_id: str) -> bool:
    return authz.allowed(ctx, authz.Op.WRITE, authz.TRANSACTIONAL_ID, transactional_id)


def _txn(ctx: RequestContext) -> TransactionCoordinator:
    return ctx.broker.transactions


def _known(ctx: RequestContext, topic: str, partition: int) -> bool:
    info = ctx.broker.partitions.topic(topic)
    return info is not None and 0 <= partition < len(info.partitions)


async def _add_partitions(
    ctx: RequestContext, tid: str, pid: int, epoch: int, topics: Any, verify_only: bool, *, from_broker: bool = False
) -> dict[tuple[str, int], ErrorCode]:
    """`from_broker`: v4+, already authorized by CLUSTER_ACTION (the broker asks on behalf of a
    producer whose own rights it checked), so no per-id or per-topic checks, as in Kafka."""
    # (a null primitive array decodes as None: hostile requests are answered, not crashed on)
    wanted = [(t.name, p) for t in topics or () for p in t.partitions or ()]
    if not from_broker and not _may_write_txn(ctx, tid):
        return dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
    refused = [] if from_broker else [tp for tp in wanted if not authz.allowed(ctx, authz.Op.WRITE, authz.TOPIC, tp[0])]
    if refused:
        return {
            tp: ErrorCode.topic_authorization_failed if tp in refused else ErrorCode.operation_not_attempted
            for tp in wanted
        }
    unknown = [tp for tp in wanted if not _known(ctx, *tp)]
    if unknown:
        return {
            tp: ErrorCode.unknown_topic_or_partition if tp in unknown else ErrorCode.operation_not_attempted
            for tp in wanted
        }
    coordinator = _txn(ctx)
    if verify_only:
        return coordinator.verify(tid, pid, epoch, wanted)
    error = await coordinator.add_partitions(tid, pid, epoch, wanted)
    return dict.fromkeys(wanted, fenced_for_version(error, ctx.api_version, 2))


def _topic_results(cls: type, errors: dict[tuple[str, int], ErrorCode]) -> tuple[Any, ...]:
    topic_cls = nested(cls, "AddPartitionsToTxnTopicResult")
    partition_cls = nested(cls, "AddPartitionsToTxnPartitionResult")
    by_topic: dict[str, list[Any]] = {}
    for (topic, index), error in errors.items():
        by_topic.setdefault(topic, []).append(build(partition_cls, partition_index=index, partition_error_code=error))
    return tuple(build(topic_cls, name=t, results_by_partition=tuple(ps)) for t, ps in by_topic.items())


@handles(ADD_PARTITIONS_TO_TXN)
async def add_partitions_to_txn(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    if ctx.api_version < 4:
        errors = await _add_partitions(
            ctx,
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            request.v3_and_below_topics,
            False,
        )
        return build(cls, throttle_time=ZERO_THROTTLE, results_by_topic_v3_and_below=_topic_results(cls, errors))
    # v4+ come from brokers (a partition leader verifying or adding for a producer, KIP-890)
    if not authz.cluster_allowed(ctx, authz.Op.CLUSTER_ACTION):
        return build(
            cls,
            throttle_time=ZERO_THROTTLE,
            error_code=ErrorCode.cluster_authorization_failed,
            results_by_transaction=(),
        )
    result_cls = nested(cls, "AddPartitionsToTxnResult")
    results = []
    for txn in request.transactions or ():
        errors = await _add_partitions(
            ctx,
            txn.transactional_id,
            txn.producer_id,
            txn.producer_epoch,
            txn.topics,
            txn.verify_only,
            from_broker=True,
        )
        if ctx.api_version < 5:  # TRANSACTION_ABORTABLE is new in v5
            errors = {
                tp: ErrorCode.invalid_txn_state if e == ErrorCode.transaction_abortable else e
                for tp, e in errors.items()
            }
        results.append(
            build(result_cls, transactional_id=txn.transactional_id, topic_results=_topic_results(cls, errors))
        )
    return build(cls, throttle_time=ZERO_THROTTLE, error_code=ErrorCode.none, results_by_transaction=tuple(results))


@handles(ADD_OFFSETS_TO_TXN)
async def add_offsets_to_txn(request: Any, ctx: RequestContext) -> Any:
    index = ctx.broker.groups.partition_for(request.group_id)
    if not _may_write_txn(ctx, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    elif not authz.allowed(ctx, authz.Op.READ, authz.GROUP, request.group_id):
        error = ErrorCode.group_authorization_failed
    elif await ctx.broker.ensure_topic(OFFSETS_TOPIC) is None:
        error = ErrorCode.coordinator_not_available
    else:
        error = await _txn(ctx).add_partitions(
            request.transactional_id, request.producer_id, request.producer_epoch, [(OFFSETS_TOPIC, index)]
        )
    return build(
        ctx.response_class, throttle_time=ZERO_THROTTLE, error_code=fenced_for_version(error, ctx.api_version, 2)
    )


@handles(END_TXN, max_version=4)
async def end_txn(request: Any, ctx: RequestContext) -> Any:
    if not _may_write_txn(ctx, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    else:
        error = await _txn(ctx).end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch, bool(request.committed)
        )
    return build(
        ctx.response_class, throttle_time=ZERO_THROTTLE, error_code=fenced_for_version(error, ctx.api_version, 2)
    )


@handles(WRITE_TXN_MARKERS)
async def write_txn_markers(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    marker_cls = nested(cls, "WritableTxnMarkerResult")
    topic_cls = nested(cls, "WritableTxnMarkerTopicResult")
    partition_cls = nested(cls, "WritableTxnMarkerPartitionResult")
    allowed = authz.cluster_allowed(ctx, authz.Op.CLUSTER_ACTION)

    async def write(marker: Any, topic: str, index: int) -> ErrorCode:
        if not allowed:
            return ErrorCode.cluster_authorization_failed
        return await markers.write_local(
            ctx.broker,
            topic,
            index,
            marker.producer_id,
            marker.producer_epoch,
            bool(marker.transaction_result),
            marker.coordinator_epoch,
        )

    # every partition at once (their appends share WAL syncs); answered in request order
    jobs = [(m, t.name, i) for m in request.markers for t in m.topics for i in t.partition_indexes or ()]
    errors = iter(await asyncio.gather(*(write(m, t, i) for m, t, i in jobs)))
    out = []
    for marker in request.markers:
        topics = []
        for t in marker.topics:
            parts = [
                build(partition_cls, partition_index=i, error_code=next(errors)) for i in t.partition_indexes or ()
            ]
            topics.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
        out.append(build(marker_cls, producer_id=marker.producer_id, topics=tuple(topics)))
    return build(cls, markers=tuple(out))


async def _verify_offsets(ctx: RequestContext, request: Any) -> tuple[ErrorCode, object | None]:
    """KIP-890 part 1 for TxnOffsetCommit: is the group's `__consumer_offsets` partition in the
    producer's transaction (AddOffsetsToTxn)? Asked before the offsets are written."""
    try:
        led = ctx.broker.partitions.get(OFFSETS_TOPIC, ctx.broker.groups.partition_for(request.group_id))
    except PartitionError:
        return ErrorCode.none, None  # not led here: the group coordinator answers NOT_COORDINATOR
    return await ctx.broker.txn_verifier.verify_offsets(
        led, request.transactional_id, request.producer_id, request.producer_epoch, ctx.api_version
    )


@handles(TXN_OFFSET_COMMIT, max_version=4)
async def txn_offset_commit(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    topic_cls = nested(cls, "TxnOffsetCommitResponseTopic")
    partition_cls = nested(cls, "TxnOffsetCommitResponsePartition")
    order = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    groups = ctx.broker.groups
    error = groups.coordinator_error(request.group_id) if request.group_id else None
    if not _may_write_txn(ctx, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    elif not authz.allowed(ctx, authz.Op.READ, authz.GROUP, request.group_id):
        error = ErrorCode.group_authorization_failed
    errors: dict[tuple[str, int], ErrorCode]
    if error is not None:
        errors = dict.fromkeys(order, error)
    else:
        errors = {
            tp: ErrorCode.topic_authorization_failed
            for tp in order
            if not authz.allowed(ctx, authz.Op.READ, authz.TOPIC, tp[0])
        }
        errors.update(
            {tp: ErrorCode.unknown_topic_or_partition for tp in order if tp not in errors and not _known(ctx, *tp)}
        )
        offsets = [
            (
                t.name,
                p.partition_index,
                p.committed_offset,
                getattr(p, "committed_leader_epoch", -1),
                p.committed_metadata,
            )
            for t in request.topics
            for p in t.partitions
            if (t.name, p.partition_index) not in errors
        ]
        verified, guard = ErrorCode.none, None
        if offsets:
            verified, guard = await _verify_offsets(ctx, request)
        if verified != ErrorCode.none:
            errors.update({(t, p): verified for t, p, *_ in offsets})
        elif offsets:
            committed = await groups.txn_commit(
                group_id=request.group_id,
                producer_id=request.producer_id,
                producer_epoch=request.producer_epoch,
                generation_id=getattr(request, "generation_id", -1),
                member_id=getattr(request, "member_id", ""),
                group_instance_id=getattr(request, "group_instance_id", None),
                offsets=offsets,
                verification_guard=guard,
            )
            # (INVALID_TXN_STATE: the transaction ended while it was verified)
            ended = txn_offset_commit_error(ErrorCode.invalid_txn_state, ctx.api_version)
            errors.update({tp: ended if e == ErrorCode.invalid_txn_state else e for tp, e in committed.items()})
    by_topic: dict[str, list[Any]] = {}
    for name, index in order:
        e = fenced_for_version(errors.get((name, index), ErrorCode.none), ctx.api_version, 3)
        by_topic.setdefault(name, []).append(build(partition_cls, partition_index=index, error_code=e))
    return build(
        cls,
        throttle_time=ZERO_THROTTLE,
        topics=tuple(build(topic_cls, name=n, partitions=tuple(ps)) for n, ps in by_topic.items()),
    )
