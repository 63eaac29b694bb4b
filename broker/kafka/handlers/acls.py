"""CreateAcls, DescribeAcls, DeleteAcls.

Bindings live in the controller's metadata (durable, pushed to every broker with the image);
creations and deletions go to the controller, descriptions are answered from this broker's
image as Kafka answers them from its authorizer's copy. Without an authorizer each API
answers SECURITY_DISABLED, as a Java broker does. Creating and deleting need ALTER on the
cluster, describing needs DESCRIBE on it (CLUSTER_AUTHORIZATION_FAILED otherwise).
After a change the handler waits (up to a few seconds) for this broker's image to show it,
so a describe right after a create on the same broker sees the new binding.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.controller.acls import AclBinding, AclFilter, InvalidAclError, PatternType, validate_filter
from automq.broker.kafka import authorizer as authz
from automq.broker.kafka.codec import ZERO_THROTTLE, build, nested
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.registry import handles

log = logging.getLogger(__name__)

DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
PROPAGATION_WAIT_S = 5.0
CONTROLLER_TIMEOUT_S = 30.0

_DISABLED = "No Authorizer is configured on the broker (kafka.authorizer_class_name)"


def _code(name: str | None) -> ErrorCode:
    if name is None:
        return ErrorCode.none
    return ErrorCode.__members__.get(name.lower(), ErrorCode.unknown_server_error)


def _failure(exc: Exception) -> tuple[ErrorCode, str]:
    code = getattr(exc, "code", None)
    if isinstance(exc, TimeoutError):
        return ErrorCode.request_timed_out, "the controller did not answer in time"
    return _code(str(code)) if code else ErrorCode.unknown_server_error, str(exc) or type(exc).__name__


async def _await_image(ctx: RequestContext, predicate) -> None:
    await ctx.broker.partitions.wait_for_image(predicate, PROPAGATION_WAIT_S)


@handles(CREATE_ACLS)
async def create_acls(request: Any, ctx: RequestContext) -> Any:
    Result = nested(ctx.response_class, "AclCreationResult")
    n = len(request.creations)

    def all_failed(code: ErrorCode, message: str) -> Any:
        results = tuple(build(Result, error_code=code, error_message=message) for _ in range(n))
        return build(ctx.response_class, throttle_time=ZERO_THROTTLE, results=results)

    if ctx.broker.authorizer is None:
        return all_failed(ErrorCode.security_disabled, _DISABLED)
    if not authz.cluster_allowed(ctx, authz.Op.ALTER):
        return all_failed(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    bindings = [
        AclBinding(
            int(c.resource_type),
            c.resource_name,
            int(getattr(c, "resource_pattern_type", PatternType.LITERAL)),
            c.principal,
            c.host,
            int(c.operation),
            int(c.permission_type),
        )
        for c in request.creations
    ]
    try:
        answers = await asyncio.wait_for(ctx.broker.cluster.create_acls(bindings), CONTROLLER_TIMEOUT_S)
    except Exception as exc:
        code, message = _failure(exc)
        return all_failed(code, message)
    stored = [b for b, (code, _) in zip(bindings, answers, strict=True) if code is None]
    if stored:
        keys = {b.key() for b in stored}
        await _await_image(ctx, lambda img: keys <= {a.key() for a in img.acls})
        log.info("ACLs created for %s (%s): %s", ctx.principal, ctx.peer, stored)
    results = tuple(build(Result, error_code=_code(code), error_message=message) for code, message in answers)
    return build(ctx.response_class, throttle_time=ZERO_THROTTLE, results=results)


def _filter(f: Any) -> AclFilter:
    return AclFilter(
        int(f.resource_type_filter),
        f.resource_name_filter,
        int(getattr(f, "pattern_type_filter", PatternType.LITERAL)),
        f.principal_filter,
        f.host_filter,
        int(f.operation),
        int(f.permission_type),
    )


@handles(DESCRIBE_ACLS)
async def describe_acls(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class

    def failed(code: ErrorCode, message: str) -> Any:
        return build(cls, throttle_time=ZERO_THROTTLE, error_code=code, error_message=message, resources=())

    if ctx.broker.authorizer is None:
        return failed(ErrorCode.security_disabled, _DISABLED)
    if not authz.cluster_allowed(ctx, authz.Op.DESCRIBE):
        return failed(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    flt = _filter(request)
    try:
        validate_filter(flt)
    except InvalidAclError as exc:
        return failed(ErrorCode.invalid_request, str(exc))
    image = ctx.broker.metadata
    matched = [b for b in (image.acls if image is not None else ()) if flt.matches(b)]
    Resource = nested(cls, "DescribeAclsResource")
    Description = nested(cls, "AclDescription")
    grouped: dict[tuple[int, str, int], list[AclBinding]] = {}
    for b in matched:
        grouped.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(b)
    resources = tuple(
        build(
            Resource,
            resource_type=rtype,
            resource_name=name,
            pattern_type=ptype,
            acls=tuple(
                build(
                    Description,
                    principal=b.principal,
                    host=b.host,
                    operation=b.operation,
                    permission_type=b.permission,
                )
                for b in bindings
            ),
        )
        for (rtype, name, ptype), bindings in grouped.items()
    )
    return build(cls, throttle_time=ZERO_THROTTLE, error_code=ErrorCode.none, error_message=None, resources=resources)


@handles(DELETE_ACLS)
async def delete_acls(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    FilterResult = nested(cls, "DeleteAclsFilterResult")
    Matching = nested(cls, "DeleteAclsMatchingAcl")
    n = len(request.filters)

    def all_failed(code: ErrorCode, message: str) -> Any:
        results = tuple(build(FilterResult, error_code=code, error_message=message, matching_acls=()) for _ in range(n))
        return build(cls, throttle_time=ZERO_THROTTLE, filter_results=results)

    if ctx.broker.authorizer is None:
        return all_failed(ErrorCode.security_disabled, _DISABLED)
    if not authz.cluster_allowed(ctx, authz.Op.ALTER):
        return all_failed(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    filters = [_filter(f) for f in request.filters]
    try:
        answers = await asyncio.wait_for(ctx.broker.cluster.delete_acls(filters), CONTROLLER_TIMEOUT_S)
    except Exception as exc:
        code, message = _failure(exc)
        return all_failed(code, message)
    gone = {b.key() for _, matched in answers for b in matched}
    if gone:
        await _await_image(ctx, lambda img: not gone & {a.key() for a in img.acls})
        log.info("ACLs deleted for %s (%s): %d", ctx.principal, ctx.peer, len(gone))
    results = []
    for (failure, failure_message), matched in answers:
        results.append(
            build(
                FilterResult,
                error_code=_code(failure),
                error_message=failure_message,
                matching_acls=tuple(
                    build(
                        Matching,
                        error_code=ErrorCode.none,
                        error_message=None,
                        resource_type=b.resource_type,
                        resource_name=b.resource_name,
                        pattern_type=b.pattern_type,
                        principal=b.principal,
                        host=b.host,
                        operation=b.operation,
                        permission_type=b.permission,
                    )
                    for b in matched
                ),
            )
        )
    return build(cls, throttle_time=ZERO_THROTTLE, filter_results=tuple(results))
