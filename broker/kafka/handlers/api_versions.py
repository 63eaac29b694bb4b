"""ApiVersions: the version range of every API this broker serves (those with a handler)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.registry import handles, served_ranges

API_KEY = 18


def api_versions_response(
    response_class: type, error_code: ErrorCode = ErrorCode.none, served: dict[int, tuple[int, int]] | None = None
):
    api_version = codec.nested(response_class, "ApiVersion")
    ranges = served if served is not None else served_ranges()
    keys = tuple(api_version(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in ranges.items())
    return codec.build(response_class, error_code=error_code, api_keys=keys, throttle_time=codec.ZERO_THROTTLE)


@handles(API_KEY)
async def api_versions(request, ctx: RequestContext):
    # v3+ carries client software name/version; Kafka validates their pattern and answers
    # INVALID_REQUEST, but every real client sends valid ones and an empty name is common
    # from tools, so they are only used for logs.
    return api_versions_response(ctx.response_class, served=served_ranges(ctx.broker.config))
