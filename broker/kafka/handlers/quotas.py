"""AlterClientQuotas and DescribeClientQuotas.

Quotas live in the controller's metadata; alterations go there (each entry judged on its own,
INVALID_REQUEST with a reason for a bad one) and descriptions are answered from this
broker's image. Altering needs ALTER_CONFIGS on the cluster, describing DESCRIBE_CONFIGS
(CLUSTER_AUTHORIZATION_FAILED otherwise, when an authorizer runs). Enforcement: kafka/quotas.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.controller.quotas import CLIENT_ID, IP, USER, filter_matches
from automq.broker.kafka import authorizer as authz
from automq.broker.kafka.codec import ZERO_THROTTLE, build, nested
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.registry import handles

DESCRIBE_CLIENT_QUOTAS = 48
ALTER_CLIENT_QUOTAS = 49
CONTROLLER_TIMEOUT_S = 30.0
PROPAGATION_WAIT_S = 5.0


@handles(ALTER_CLIENT_QUOTAS)
async def alter_client_quotas(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    Entry = nested(cls, "EntryData")
    Entity = nested(cls, "EntityData")

    def answer(codes: list[tuple[ErrorCode, str | None]]) -> Any:
        return build(
            cls,
            throttle_time=ZERO_THROTTLE,
            entries=tuple(
                build(
                    Entry,
                    error_code=code,
                    error_message=message,
                    entity=tuple(
                        build(Entity, entity_type=e.entity_type, entity_name=e.entity_name) for e in entry.entity
                    ),
                )
                for (code, message), entry in zip(codes, request.entries, strict=True)
            ),
        )

    n = len(request.entries)
    if not authz.cluster_allowed(ctx, authz.Op.ALTER_CONFIGS):
        return answer([(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")] * n)
    entries = [
        (
            [(e.entity_type, e.entity_name) for e in entry.entity],
            {op.key: (None if op.remove else float(op.value)) for op in entry.ops},
        )
        for entry in request.entries
    ]
    try:
        results = await asyncio.wait_for(
            ctx.broker.cluster.alter_client_quotas(entries, bool(request.validate_only)), CONTROLLER_TIMEOUT_S
        )
    except TimeoutError:
        return answer([(ErrorCode.request_timed_out, "the controller did not answer in time")] * n)
    except Exception as exc:
        code = ErrorCode.__members__.get(str(getattr(exc, "code", "")).lower(), ErrorCode.unknown_server_error)
        return answer([(code, str(exc))] * n)
    if not request.validate_only and any(code is None for code, _ in results):
        wanted = {
            tuple(sorted(pairs)): ops
            for (pairs, ops), (code, _) in zip(entries, results, strict=True)
            if code is None and ops
        }

        def applied(img) -> bool:
            table = {q.entity: q.values for q in img.client_quotas}
            return all(all((table.get(e, {}).get(k) == v) for k, v in ops.items()) for e, ops in wanted.items())

        await ctx.broker.partitions.wait_for_image(applied, PROPAGATION_WAIT_S)
    return answer(
        [
            (ErrorCode.none, None)
            if code is None
            else (ErrorCode.__members__.get(code.lower(), ErrorCode.invalid_request), message)
            for code, message in results
        ]
    )


@handles(DESCRIBE_CLIENT_QUOTAS)
async def describe_client_quotas(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class

    def failed(code: ErrorCode, message: str) -> Any:
        return build(cls, throttle_time=ZERO_THROTTLE, error_code=code, error_message=message, entries=None)

    if not authz.cluster_allowed(ctx, authz.Op.DESCRIBE_CONFIGS):
        return failed(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    components = []
    seen = set()
    for c in request.components:
        if c.entity_type not in (USER, CLIENT_ID, IP):
            return failed(ErrorCode.invalid_request, f"Unknown entity type {c.entity_type!r}")
        if c.entity_type in seen:
            return failed(ErrorCode.invalid_request, f"Duplicate {c.entity_type} in the filter")
        seen.add(c.entity_type)
        if c.match_type not in (0, 1, 2):
            return failed(ErrorCode.invalid_request, f"Unknown match type {c.match_type}")
        if c.match_type == 0 and c.match is None:
            return failed(ErrorCode.invalid_request, "An exact match needs a name")
        components.append((c.entity_type, int(c.match_type), c.match))
    Entry = nested(cls, "EntryData")
    Entity = nested(cls, "EntityData")
    Value = nested(cls, "ValueData")
    image = ctx.broker.metadata
    entries = tuple(
        build(
            Entry,
            entity=tuple(build(Entity, entity_type=t, entity_name=n) for t, n in q.entity),
            values=tuple(build(Value, key=k, value=v) for k, v in sorted(q.values.items())),
        )
        for q in (image.client_quotas if image is not None else ())
        if filter_matches(q.entity, components, bool(request.strict))
    )
    return build(cls, throttle_time=ZERO_THROTTLE, error_code=ErrorCode.none, error_message=None, entries=entries)
