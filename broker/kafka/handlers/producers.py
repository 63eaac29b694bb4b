"""InitProducerId: producer ids for idempotent and transactional producers.

Without a transactional id (an idempotent producer), every call gets a fresh producer id with
epoch 0, as Kafka's coordinator does ("blindly accept and return a new producer id"), also
when the client passes its current id/epoch (v3+, KIP-360) to recover from an error: a new id
is always a safe answer for a producer that only needs idempotence.

With a transactional id the transaction coordinator answers (transactions/coordinator.py):
the id's producer id with a bumped epoch, fencing older instances. An empty transactional id
is INVALID_REQUEST, as in Kafka; PRODUCER_FENCED goes to clients before v4 as
INVALID_PRODUCER_EPOCH.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka.codec import ZERO_THROTTLE, build
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.producers import ProducerIdExhaustedError

log = logging.getLogger(__name__)

INIT_PRODUCER_ID = 22


def init_producer_id_answer(transactional_id: str | None, allocate) -> tuple[ErrorCode, int, int]:
    """(error, producer_id, producer_epoch) for a request without a transactional id;
    `allocate()` gives a new id."""
    if transactional_id is not None:
        return ErrorCode.invalid_request, -1, -1
    try:
        return ErrorCode.none, allocate(), 0
    except ProducerIdExhaustedError as exc:
        log.error("%s", exc)
        return ErrorCode.coordinator_load_in_progress, -1, -1  # retriable, like Kafka's id block fetch


def _denied(request: Any, ctx: RequestContext) -> ErrorCode | None:
    """Kafka: a transactional id needs WRITE on it; an idempotent producer needs
    IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679)."""
    tid = request.transactional_id
    if tid is not None:
        if not authz.allowed(ctx, authz.Op.WRITE, authz.TRANSACTIONAL_ID, tid):
            return ErrorCode.transactional_id_authorization_failed
        return None
    if authz.cluster_allowed(ctx, authz.Op.IDEMPOTENT_WRITE) or authz.allowed_on_any(ctx, authz.Op.WRITE, authz.TOPIC):
        return None
    return ErrorCode.cluster_authorization_failed


@handles(INIT_PRODUCER_ID)
async def init_producer_id(request: Any, ctx: RequestContext) -> Any:
    allocator = ctx.broker.producer_ids
    denied = _denied(request, ctx) if ctx.broker.authorizer is not None else None
    tid = request.transactional_id
    if denied is not None:
        error, pid, epoch = denied, -1, -1
    elif allocator is None:
        error, pid, epoch = ErrorCode.coordinator_not_available, -1, -1
    elif tid:
        try:
            error, pid, epoch = await ctx.broker.transactions.init_producer_id(
                tid,
                int(request.transaction_timeout.total_seconds() * 1000),
                getattr(request, "producer_id", -1),
                getattr(request, "producer_epoch", -1),
            )
        except ProducerIdExhaustedError as exc:
            log.error("%s", exc)
            error, pid, epoch = ErrorCode.coordinator_load_in_progress, -1, -1
        if error == ErrorCode.producer_fenced and ctx.api_version < 4:
            error = ErrorCode.invalid_producer_epoch
    else:
        error, pid, epoch = init_producer_id_answer(request.transactional_id, allocator.next_id)
    return build(
        ctx.response_class, throttle_time=ZERO_THROTTLE, error_code=error, producer_id=pid, producer_epoch=epoch
    )
