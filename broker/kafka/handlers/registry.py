"""Which coroutine answers which Kafka API: the dispatch table handler modules register into.

    @handles(ApiKey.METADATA)
    async def metadata(request, ctx: RequestContext) -> response: ...

A handler receives the kio request dataclass of the version the client sent and returns an
instance of `ctx.response_class` (or None for a request that gets no response, e.g. acks=0
Produce). Only APIs with a registered handler are advertised in ApiVersions; the advertised
range is the Kafka 4.x range (codec.KAFKA_4_VERSION_RANGES) cut to what kio can encode and,
optionally, to what the handler declares it supports.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from automq.broker.kafka.context import RequestContext

Handler = Callable[[Any, RequestContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Registration:
    api_key: int
    handler: Handler
    min_version: int | None  # None: no narrowing of the codec's range
    max_version: int | None


_HANDLERS: dict[int, Registration] = {}


def handles(
    api_key: int, *, min_version: int | None = None, max_version: int | None = None
) -> Callable[[Handler], Handler]:
    """Register `handler` for `api_key`. A second registration for the same key is a bug."""

    def register(handler: Handler) -> Handler:
        existing = _HANDLERS.get(int(api_key))
        if existing is not None and existing.handler is not handler:
            raise RuntimeError(
                f"api key {int(api_key)} already handled by {existing.handler.__module__}.{existing.handler.__qualname__}"
            )
        _HANDLERS[int(api_key)] = Registration(int(api_key), handler, min_version, max_version)
        return handler

    return register


def lookup(api_key: int) -> Registration | None:
    return _HANDLERS.get(api_key)


# KIP-932 share groups' APIs (ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch,
# ShareAcknowledge, the inter-broker share-state APIs, Describe/Alter/DeleteShareGroupOffsets):
# neither advertised nor served when kafka.group_share_enable is false (Kafka: share.version=0).
SHARE_GROUP_APIS = frozenset({76, 77, 78, 79, 83, 85, 86, 87, 90, 91, 92})


def served_ranges(config: Any = None) -> dict[int, tuple[int, int]]:
    """api key -> (min, max) version for every registered handler: what ApiVersions advertises
    and what the server accepts (anything else is answered as Kafka does). With the broker's
    `config`, APIs it turns off are left out."""
    from automq.broker.kafka.codec import supported_range

    disabled: frozenset[int] = frozenset()
    if config is not None and not config.kafka.group_share_enable:
        disabled = SHARE_GROUP_APIS
    served = {}
    for key, reg in sorted(_HANDLERS.items()):
        if key in disabled:
            continue
        span = supported_range(key, reg.min_version, reg.max_version)
        if span is not None:
            served[key] = span
    return served


def registrations() -> dict[int, Registration]:
    return dict(_HANDLERS)
