"""Produce: validate each partition's v2 batch, assign offsets, answer once the WAL is durable.

acks=1 and acks=-1 (all) both wait for WAL durability: a partition has no followers, the WAL
and the object store are its replicas. acks=0 gets no response; as in Kafka, a failed acks=0
produce closes the connection so the client notices. Batches stay bytes: one copy into a
bytearray to rewrite baseOffset/partitionLeaderEpoch (and maxTimestamp for LogAppendTime
topics), never per-record work. Transactional batches are accepted (the partition notes the
transaction it opens: txn_state.py); one that would open a transaction in a partition is first
verified with the transaction coordinator (KIP-890, transactions/verification.py). Control
batches come only from the transaction coordinator (WriteTxnMarkers), so a client's is refused
with INVALID_RECORD, as in Kafka.

Ordering: every partition append is started as a task before the handler's first await, and
request handlers start in arrival order, so pipelined produce requests of one connection
reserve offsets in request order (what idempotent producers with 5 in-flight requests need).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka import codec, records
from automq.broker.kafka.broker import INTERNAL_TOPICS
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.partitions import AppendResult, NotLeaderError, UnknownPartitionError
from automq.broker.kafka.producers import ProducerStateError
from automq.broker.kafka.transactions.verification import FIRST_PRODUCE_ADDING
from automq.broker.storage.api import RecordTooLargeError

log = logging.getLogger(__name__)

# A produce to a partition this broker is still opening (just created or moved here) waits
# this long for the open rather than answering NOT_LEADER_OR_FOLLOWER to a client whose
# metadata is already right.
OPEN_WAIT_S = 5.0

API_KEY = 0
_NO_TXN_ID = "a transactional batch needs the request's transactional id"


def _error_of(exc: BaseException) -> tuple[ErrorCode, str | None]:
    if isinstance(exc, NotLeaderError):
        return ErrorCode.not_leader_or_follower, None
    if isinstance(exc, UnknownPartitionError):
        return ErrorCode.unknown_topic_or_partition, None
    if isinstance(exc, ProducerStateError):
        return exc.error_code, str(exc)
    if isinstance(exc, RecordTooLargeError):
        # never retriable: clients split the batch (Java) or fail it at once instead of
        # retrying until delivery.timeout.ms
        return ErrorCode.message_too_large, str(exc)
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return ErrorCode.request_timed_out, None
    return ErrorCode.kafka_storage_error, str(exc) or type(exc).__name__


def _check_keys(buf: Any, header: records.BatchHeader, topic: str, index: int) -> None:
    """A compacted topic keeps the latest value per key: a record without one cannot be
    compacted, so Kafka refuses the batch (INVALID_RECORD) and so do we."""
    try:
        keyless = records.keyless_record_indices(buf, header)
    except (ValueError, IndexError) as exc:
        raise records.InvalidBatchError(ErrorCode.corrupt_message, f"malformed records in batch: {exc}") from None
    if keyless:
        each = f"Compacted topic cannot accept message without key in topic partition {topic}-{index}."
        raise records.InvalidBatchError(
            ErrorCode.invalid_record,
            f"{len(keyless)} of the batch's {header.record_count} records have no key (first: record "
            f"{keyless[0]}); {each}",
            tuple((i, each) for i in keyless),
        )


def _record_errors(response_class: Any, errors: tuple[tuple[int, str], ...]) -> tuple[Any, ...]:
    if not errors or not codec.has_field(codec.nested(response_class, "PartitionProduceResponse"), "record_errors"):
        return ()  # Produce v0-v7 have no record errors: the whole batch fails with the code
    entry = codec.nested(response_class, "BatchIndexAndErrorMessage")
    return tuple(entry(batch_index=i, batch_index_error_message=m) for i, m in errors)


@handles(API_KEY)
async def produce(request, ctx: RequestContext):
    broker = ctx.broker
    acks = request.acks
    partitions = broker.partitions
    default_max = broker.config.kafka.message_max_bytes
    metrics = broker.metrics

    # the response's topic key (name, or id from v13), topic, index, the append task or
    # (error, message), the batch header (0 when refused before parsing)
    outcome: list[tuple[Any, str, int, Any, records.BatchHeader | int]] = []
    by_id = ctx.api_version >= codec.FIRST_PRODUCE_TOPIC_ID
    transactional_id = getattr(request, "transactional_id", None)
    txn_denied = (
        broker.authorizer is not None
        and transactional_id is not None
        and not authz.allowed(ctx, authz.Op.WRITE, authz.TRANSACTIONAL_ID, transactional_id)
    )
    verifier = broker.txn_verifier
    # (producer id, epoch) -> the coordinator's answer and the partitions it is asked about
    verifications: dict[tuple[int, int], tuple[asyncio.Future[Any], list[tuple[str, int]]]] = {}
    for topic_data in request.topic_data:
        if by_id:
            # KIP-516: an id this broker's image does not know (the zero id included) is answered
            # UNKNOWN_TOPIC_ID, as Kafka 4.1 does; it has no name to authorize or append to
            key = topic_data.topic_id
            info = partitions.topic_by_id(key)
            if info is None:
                for pdata in topic_data.partition_data:
                    outcome.append((key, "", pdata.index, (ErrorCode.unknown_topic_id, None), 0))
                continue
            topic = info.name
        else:
            topic = key = topic_data.name
        denied = broker.authorizer is not None and (
            txn_denied or not authz.allowed(ctx, authz.Op.WRITE, authz.TOPIC, topic)
        )
        for pdata in topic_data.partition_data:
            index = pdata.index
            if acks not in (0, 1, -1):
                outcome.append((key, topic, index, (ErrorCode.invalid_required_acks, None), 0))
                continue
            if denied:
                error = (
                    ErrorCode.transactional_id_authorization_failed
                    if txn_denied
                    else ErrorCode.topic_authorization_failed
                )
                outcome.append((key, topic, index, (error, None), 0))
                continue
            if topic in INTERNAL_TOPICS:
                # only the group coordinator writes there, and not through Produce (as in Kafka)
                outcome.append(
                    (
                        key,
                        topic,
                        index,
                        (ErrorCode.invalid_topic_exception, f"cannot produce to internal topic {topic}"),
                        0,
                    )
                )
                continue
            try:
                try:
                    partition = partitions.get(topic, index)  # the hot path stays synchronous
                except NotLeaderError:
                    partition = await partitions.get_when_open(topic, index, OPEN_WAIT_S)
                header = records.validate_produce_records(pdata.records, partition.max_message_bytes(default_max))
                if header.is_control:
                    raise records.InvalidBatchError(
                        ErrorCode.invalid_record, "control batches are written by the transaction coordinator only"
                    )
                if header.is_transactional and header.producer_id < 0:
                    raise records.InvalidBatchError(
                        ErrorCode.invalid_record, "a transactional batch must carry a producer id"
                    )
                if partition.is_compacted:
                    _check_keys(pdata.records, header, topic, index)
            except (NotLeaderError, UnknownPartitionError) as exc:
                outcome.append((key, topic, index, (_error_of(exc)[0], None), 0))
                continue
            except records.InvalidBatchError as exc:
                log.info("rejecting produce to %s-%d from %s: %s", topic, index, ctx.peer, exc)
                outcome.append((key, topic, index, (exc.error_code, str(exc), exc.record_errors), 0))
                continue
            records_buf = pdata.records
            if not (isinstance(records_buf, memoryview) and not records_buf.readonly):
                records_buf = bytearray(records_buf)  # kio decoded a small frame: private copy
            if header.is_transactional and verifier.needed(partition, header):
                # KIP-890: the batch would open a transaction here; the coordinator is asked first
                if transactional_id is None:
                    outcome.append(
                        (key, topic, index, (ErrorCode.transactional_id_authorization_failed, _NO_TXN_ID), 0)
                    )
                    continue
                producer = (header.producer_id, header.producer_epoch)
                if producer not in verifications:
                    verifications[producer] = (asyncio.get_running_loop().create_future(), [])
                answer, verify_tps = verifications[producer]
                verify_tps.append((topic, index))
                task = verifier.append(partition, records_buf, header, answer, ctx.api_version)
            else:
                task = asyncio.ensure_future(partition.append_batch(records_buf, header))
            outcome.append((key, topic, index, task, header))

    for (producer_id, producer_epoch), (answer, verify_tps) in verifications.items():
        assert transactional_id is not None
        verifier.verify(
            answer, transactional_id, producer_id, producer_epoch, verify_tps, ctx.api_version >= FIRST_PRODUCE_ADDING
        )
    ctx.produce_scheduled()  # every batch has its offsets (or waits on the coordinator)
    tasks = [o[3] for o in outcome if isinstance(o[3], asyncio.Future)]
    if tasks:
        timeout_s = request.timeout.total_seconds()
        if acks != 0 and timeout_s > 0:
            await asyncio.wait(tasks, timeout=timeout_s)
        else:
            await asyncio.wait(tasks)

    partition_cls = codec.nested(ctx.response_class, "PartitionProduceResponse")
    topic_cls = codec.nested(ctx.response_class, "TopicProduceResponse")
    by_topic: dict[Any, list] = {}
    failed = False
    leaders: set[int] = set()
    for key, topic, index, result, batch_header in outcome:
        base_offset, append_time, log_start, error, message = -1, None, -1, ErrorCode.none, None
        record_errors: tuple[tuple[int, str], ...] = ()
        if isinstance(result, asyncio.Future):
            if not result.done():
                # still waiting for the WAL past the request timeout; it may still complete
                error = ErrorCode.request_timed_out
                result.add_done_callback(_consume_exception)
            elif (failure := result.exception()) is not None:
                error, message = _error_of(failure)
                if error == ErrorCode.kafka_storage_error:
                    log.error("append to %s-%d failed: %r", topic, index, failure)
            else:
                appended: AppendResult = result.result()
                base_offset = appended.base_offset
                if appended.log_append_time_ms >= 0:
                    append_time = datetime.datetime.fromtimestamp(appended.log_append_time_ms / 1000, datetime.UTC)
                try:
                    log_start = partitions.get(topic, index).log_start_offset
                except (NotLeaderError, UnknownPartitionError):
                    log_start = -1
                if not appended.duplicate:
                    assert isinstance(batch_header, records.BatchHeader)
                    metrics.record_produce(topic, index, batch_header.size, batch_header.record_count)
        else:
            error, message = result[0], result[1]
            if len(result) > 2:
                record_errors = result[2]
        failed = failed or error != ErrorCode.none
        extra = {}
        if error == ErrorCode.not_leader_or_follower and codec.has_field(partition_cls, "current_leader"):
            # KIP-951: tell the client where the partition went, saving a metadata round trip
            hint = broker.leader_of(topic, index)
            if hint is not None and hint[0] != broker.node_id:
                extra["current_leader"] = codec.nested(ctx.response_class, "LeaderIdAndEpoch")(
                    leader_id=hint[0], leader_epoch=hint[1]
                )
                leaders.add(hint[0])
        by_topic.setdefault(key, []).append(
            codec.build(
                partition_cls,
                index=index,
                error_code=error,
                base_offset=base_offset,
                log_append_time=append_time,
                log_start_offset=log_start,
                record_errors=_record_errors(ctx.response_class, record_errors),
                error_message=message,
                **extra,
            )
        )
    if acks == 0:
        return codec.CLOSE_CONNECTION if failed else None
    key_field = "topic_id" if by_id else "name"
    responses = tuple(
        codec.build(topic_cls, partition_responses=tuple(ps), **{key_field: k}) for k, ps in by_topic.items()
    )
    return codec.build(
        ctx.response_class,
        responses=responses,
        throttle_time=codec.ZERO_THROTTLE,
        node_endpoints=node_endpoints(broker, ctx.response_class, leaders, ctx.listener),
    )


def node_endpoints(broker, response_class, leaders: set[int], listener: str | None = None) -> tuple:
    """KIP-951 NodeEndpoints for the leaders named in current_leader fields."""
    if not leaders or not codec.has_field(response_class, "node_endpoints"):
        return ()
    endpoint_cls = codec.nested(response_class, "NodeEndpoint")
    out = []
    for node_id in sorted(leaders):
        endpoint = broker.endpoint_of(node_id, listener)
        if endpoint is not None:
            out.append(endpoint_cls(node_id=node_id, host=endpoint[0], port=endpoint[1], rack=endpoint[2]))
    return tuple(out)


def _consume_exception(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("append that outlived its produce request failed: %r", task.exception())
