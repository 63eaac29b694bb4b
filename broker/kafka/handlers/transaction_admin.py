"""Looking at transactions (KIP-664): ListTransactions and DescribeTransactions from the
transaction coordinator's state, DescribeProducers from a partition leader's producer state.

As in Kafka, ListTransactions answers for the transactional ids this broker coordinates (admin
clients ask every broker), filtered by state names (Kafka's: Empty, Ongoing, PrepareCommit,
PrepareAbort, CompleteCommit, CompleteAbort, Dead, PrepareEpochFence; unknown names are echoed
in unknown_state_filters), producer ids and, from v1, a minimum running time. With an
authorizer, ids the client may not DESCRIBE are left out (ListTransactions) or answered
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (DescribeTransactions); DescribeProducers needs READ on
the topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka.codec import ZERO_THROTTLE, build, nested
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.partitions import NotLeaderError, UnknownPartitionError
from automq.broker.kafka.transactions.state import TxnState

DESCRIBE_PRODUCERS = 61
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66

_STATES = {s.kafka_name: s for s in TxnState}


@handles(LIST_TRANSACTIONS, max_version=1)
async def list_transactions(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    state_cls = nested(cls, "TransactionState")
    coordinator = ctx.broker.transactions
    # (a null array decodes as None: no filter, as an empty one)
    state_filters = [s for s in request.state_filters or () if s is not None]
    wanted_states = {_STATES[s] for s in state_filters if s in _STATES}
    unknown = tuple(s for s in state_filters if s not in _STATES)
    pids = set(request.producer_id_filters or ())
    min_duration = getattr(request, "duration_filter", -1)
    now = int(time.time() * 1000)
    error = ErrorCode.coordinator_load_in_progress if coordinator.loading else ErrorCode.none
    out = []
    for tid, md in sorted(coordinator.txns.items()):
        if wanted_states and md.state not in wanted_states:
            continue
        if pids and md.producer_id not in pids:
            continue
        if min_duration >= 0 and (md.start_ms < 0 or now - md.start_ms < min_duration):
            continue
        if not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TRANSACTIONAL_ID, tid):
            continue
        out.append(
            build(state_cls, transactional_id=tid, producer_id=md.producer_id, transaction_state=md.state.kafka_name)
        )
    return build(
        cls, throttle_time=ZERO_THROTTLE, error_code=error, unknown_state_filters=unknown, transaction_states=tuple(out)
    )


@handles(DESCRIBE_TRANSACTIONS)
async def describe_transactions(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    state_cls = nested(cls, "TransactionState")
    topic_cls = nested(cls, "TopicData")
    coordinator = ctx.broker.transactions
    out = []
    for tid in request.transactional_ids or ():
        md = None
        if tid is None:  # a null string inside the array (hostile): no such id
            tid, error = "", ErrorCode.invalid_request
        elif not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TRANSACTIONAL_ID, tid):
            error = ErrorCode.transactional_id_authorization_failed
        else:
            error = coordinator.coordinator_error(tid) or ErrorCode.none
            if error == ErrorCode.none:
                md = coordinator.describe(tid)
                if md is None:
                    error = ErrorCode.transactional_id_not_found
        topics: dict[str, list[int]] = {}
        if md is not None:
            for topic, index in sorted(md.partitions):
                topics.setdefault(topic, []).append(index)
        out.append(
            build(
                state_cls,
                error_code=error,
                transactional_id=tid,
                transaction_state=md.state.kafka_name if md is not None else "",
                transaction_timeout=datetime.timedelta(milliseconds=md.timeout_ms if md is not None else 0),
                transaction_start_time=datetime.datetime.fromtimestamp(
                    (md.start_ms if md is not None else -1) / 1000, datetime.UTC
                ),
                producer_id=md.producer_id if md is not None else -1,
                producer_epoch=md.producer_epoch if md is not None else -1,
                topics=tuple(build(topic_cls, topic=t, partitions=tuple(ps)) for t, ps in topics.items()),
            )
        )
    return build(cls, throttle_time=ZERO_THROTTLE, transaction_states=tuple(out))


@handles(DESCRIBE_PRODUCERS)
async def describe_producers(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    topic_cls = nested(cls, "TopicResponse")
    partition_cls = nested(cls, "PartitionResponse")
    producer_cls = nested(cls, "ProducerState")
    topics = []
    for t in request.topics:
        parts = []
        readable = authz.allowed(ctx, authz.Op.READ, authz.TOPIC, t.name)
        for index in t.partition_indexes or ():
            error, message, producers = ErrorCode.none, None, []
            try:
                if not readable:
                    raise PermissionError
                partition = ctx.broker.partitions.get(t.name, index)
                state = partition.producer_state
                ongoing = partition.txns.ongoing
                entries = state.entries() if state is not None else []
                producers = [
                    build(
                        producer_cls,
                        producer_id=e.producer_id,
                        producer_epoch=e.epoch,
                        last_sequence=e.last_seq,
                        last_timestamp=e.last_timestamp_ms,
                        coordinator_epoch=-1,
                        current_txn_start_offset=ongoing.get(e.producer_id, -1),
                    )
                    for e in entries
                ]
            except PermissionError:
                error = ErrorCode.topic_authorization_failed
            except NotLeaderError:
                error = ErrorCode.not_leader_or_follower
            except UnknownPartitionError:
                error = ErrorCode.unknown_topic_or_partition
                message = f"unknown partition {t.name}-{index}"
            parts.append(
                build(
                    partition_cls,
                    partition_index=index,
                    error_code=error,
                    error_message=message,
                    active_producers=tuple(producers),
                )
            )
        topics.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
    return build(cls, throttle_time=ZERO_THROTTLE, topics=tuple(topics))
