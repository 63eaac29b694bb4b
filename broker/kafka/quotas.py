"""Client quotas on the broker: measuring each client's rates and deciding throttle times.

The quota table comes from the controller with the metadata image (AlterClientQuotas stores
it there). Three quotas, as Kafka's:
- `producer_byte_rate`: Produce request bytes per second;
- `consumer_byte_rate`: Fetch response bytes per second;
- `controller_mutation_rate` (KIP-599): partitions created or deleted per second by
  CreateTopics, CreatePartitions and DeleteTopics; a recent request version over it gets
  THROTTLING_QUOTA_EXCEEDED for the topic, an older one is only throttled;
- `request_percentage`: time the broker spends on the client's requests, as a percentage of
  one thread (100 = one full core). Measured exactly: the handler coroutine is driven step
  by step (`timed()`) and only the time inside its steps counts, never its waits (a WAL sync,
  a long poll).

A connection's quota is resolved from its user (the principal's name, `ANONYMOUS` without
authentication) and client id by Kafka's precedence (`controller/quotas.resolve`); every
connection resolving to the same entity shares one rate. Rates are Kafka's: samples of
`quota_window_size_seconds`, `quota_window_num` of them, the elapsed time never counted below
num-1 windows; a client over its quota is throttled for (rate - quota) / quota x window,
at most the whole window. The throttle goes into the response's throttle_time_ms and the
server mutes the connection that long (KIP-219); requests of versions older than KIP-219
get their response delayed instead.

With no client quota defined anywhere `active` is False and the server does nothing more
per request than read that flag.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import ipaddress
import time
import types
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from prometheus_client import CollectorRegistry, Counter

from automq.broker.controller.quotas import (
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    IP,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ClientQuota,
    Entity,
    resolve,
)
from automq.broker.kafka import codec

if TYPE_CHECKING:
    from automq.broker.config import KafkaConfig

PRODUCE = "produce"
FETCH = "fetch"
REQUEST = "request"
MUTATION = "mutation"
CONNECTION = "connection"  # connection_creation_rate refusals (ip entities)
_KEY_OF = {
    PRODUCE: PRODUCER_BYTE_RATE,
    FETCH: CONSUMER_BYTE_RATE,
    REQUEST: REQUEST_PERCENTAGE,
    MUTATION: CONTROLLER_MUTATION_RATE,
}
CACHE_ENTRIES = 10_000


class Rate:
    """A sampled rate: per-sample totals over the last `num` windows, with their running sum."""

    __slots__ = ("num", "samples", "total", "window_s")

    def __init__(self, window_s: float, num: int) -> None:
        self.window_s = window_s
        self.num = num
        self.samples: collections.deque[list[float]] = collections.deque()  # [start, total]
        self.total = 0.0

    def record(self, value: float, now: float) -> None:
        samples = self.samples
        if samples and now < samples[-1][0] + self.window_s:
            samples[-1][1] += value
        else:
            samples.append([now, value])
            self._expire(now)
        self.total += value

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s * self.num
        samples = self.samples
        while samples and samples[0][0] + self.window_s <= horizon:
            self.total -= samples.popleft()[1]

    def measure(self, now: float) -> tuple[float, float]:
        """(rate per second, the window it was measured over in seconds)."""
        self._expire(now)
        if not self.samples:
            return 0.0, self.window_s * (self.num - 1)
        elapsed = max(now - self.samples[0][0], self.window_s * (self.num - 1))
        return self.total / elapsed, elapsed


def user_of(principal: str) -> str:
    return principal.partition(":")[2] or principal


class ClientQuotas:
    def __init__(self, config: KafkaConfig, registry: CollectorRegistry | None = None) -> None:
        self.window_s = float(config.quota_window_size_seconds)
        self.num = config.quota_window_num
        self.max_throttle_s = self.window_s * self.num
        self.entries: tuple[ClientQuota, ...] = ()
        self.table: dict[Entity, dict[str, float]] = {}
        self.active = False
        self.request_quotas = False  # any request_percentage: handlers are then timed
        self._resolved: dict[tuple[str, str, str], tuple[Entity, float] | None] = {}
        self._rates: dict[tuple[str, Entity], Rate] = {}
        self.ip_table: dict[str | None, float] = {}
        self.ip_active = False
        self._ip_rates: dict[str, Rate] = {}
        registry = registry if registry is not None else CollectorRegistry()
        self.throttled = Counter(
            "kafka_quota_throttled_requests",
            "Responses that carried a throttle time because a client quota was exceeded, by quota type",
            ["quota_type"],
            registry=registry,
        )
        self.throttle_seconds = Counter(
            "kafka_quota_throttle_seconds",
            "Throttle time handed to clients over their quota (seconds), by quota type",
            ["quota_type"],
            registry=registry,
        )

    def update(self, entries: tuple[ClientQuota, ...]) -> None:
        if entries == self.entries:
            return
        self.entries = entries
        self.table = {q.entity: dict(q.values) for q in entries if q.entity[0][0] != IP}
        self.active = any(self.table.values())
        self.request_quotas = any(REQUEST_PERCENTAGE in v for v in self.table.values())
        self._resolved = {}
        live = {(kind, e) for kind in _KEY_OF for e in self.table}
        self._rates = {k: v for k, v in self._rates.items() if k in live}
        # ip entities: connection_creation_rate per address (None: the default for every address)
        self.ip_table = {
            (None if q.entity[0][1] is None else ipaddress.ip_address(q.entity[0][1]).compressed): q.values[
                CONNECTION_CREATION_RATE
            ]
            for q in entries
            if q.entity[0][0] == IP and CONNECTION_CREATION_RATE in q.values
        }
        self.ip_active = bool(self.ip_table)

    def connection_allowed(self, ip: str, now: float | None = None) -> bool:
        """Count a new connection from `ip` against its connection_creation_rate (the address's
        own quota, else the default ip quota, each address measured on its own); False when
        it goes over, and the connection must be closed."""
        limit = self.ip_table.get(ip, self.ip_table.get(None))
        if limit is None:
            return True
        now = time.monotonic() if now is None else now
        rate = self._ip_rates.get(ip)
        if rate is None:
            if len(self._ip_rates) >= CACHE_ENTRIES:
                self._ip_rates.clear()  # a flood of addresses: start over rather than grow
            rate = self._ip_rates[ip] = Rate(self.window_s, self.num)
        rate.record(1, now)
        observed, _ = rate.measure(now)
        if observed <= limit:
            return True
        self.throttled.labels(CONNECTION).inc()
        return False

    def quota(self, kind: str, user: str, client_id: str) -> tuple[Entity, float] | None:
        key = (kind, user, client_id)
        try:
            return self._resolved[key]
        except KeyError:
            pass
        found = resolve(self.table, user, client_id, _KEY_OF[kind])
        if len(self._resolved) >= CACHE_ENTRIES:
            self._resolved = {}
        self._resolved[key] = found
        return found

    def max_fetch_bytes(self, principal: str, client_id: str) -> int:
        """Kafka's cap on one Fetch of a consumer with a consumer_byte_rate: what the quota allows
        over the rate window (quota x (num - 1) x window). Without it a fetch larger than that
        would be throttled every time it is tried and, answered empty, never get through."""
        found = self.quota(FETCH, user_of(principal), client_id)
        if found is None:
            return 0x7FFFFFFF
        return max(1, int(found[1] * (self.num - 1) * self.window_s))

    def record(self, kind: str, user: str, client_id: str, value: float, now: float | None = None) -> int:
        """Record `value` (bytes, or percent-seconds for REQUEST); the throttle time in ms."""
        found = self.quota(kind, user, client_id)
        if found is None:
            return 0
        entity, limit = found
        now = time.monotonic() if now is None else now
        rate = self._rates.get((kind, entity))
        if rate is None:
            rate = self._rates[(kind, entity)] = Rate(self.window_s, self.num)
        rate.record(value, now)
        observed, window = rate.measure(now)
        if observed <= limit:
            return 0
        throttle_s = min((observed - limit) / limit * window, self.max_throttle_s)
        self.throttled.labels(kind).inc()
        self.throttle_seconds.labels(kind).inc(throttle_s)
        return int(throttle_s * 1000)

    def mutate(self, user: str, client_id: str, partitions: int, strict: bool, now: float | None = None) -> int:
        """KIP-599: `partitions` created or deleted by one topic of CreateTopics / CreatePartitions /
        DeleteTopics against controller_mutation_rate. Returns -throttle_ms when refused (strict
        requests only, and only when the quota is exceeded already: one topic may overshoot),
        else the throttle time in ms (0 when under the quota)."""
        found = self.quota(MUTATION, user, client_id)
        if found is None:
            return 0
        entity, limit = found
        now = time.monotonic() if now is None else now
        rate = self._rates.get((MUTATION, entity))
        if rate is None:
            rate = self._rates[(MUTATION, entity)] = Rate(self.window_s, self.num)
        observed, window = rate.measure(now)
        if strict and observed > limit:
            throttle_s = min((observed - limit) / limit * window, self.max_throttle_s)
            self.throttled.labels(MUTATION).inc()
            self.throttle_seconds.labels(MUTATION).inc(throttle_s)
            return -max(1, int(throttle_s * 1000))
        rate.record(partitions, now)
        observed, window = rate.measure(now)
        if observed <= limit:
            return 0
        throttle_s = min((observed - limit) / limit * window, self.max_throttle_s)
        self.throttled.labels(MUTATION).inc()
        self.throttle_seconds.labels(MUTATION).inc(throttle_s)
        return int(throttle_s * 1000)


# KIP-599: from these versions a request over controller_mutation_rate is refused per topic
# (THROTTLING_QUOTA_EXCEEDED); older ones are accepted and only throttled.
STRICT_MUTATIONS_FROM = {19: 6, 20: 5, 37: 3}


def check_mutation(ctx: Any, partitions: int) -> bool:
    """For an admin handler, per topic: False when the topic must be refused with
    THROTTLING_QUOTA_EXCEEDED. Either way the throttle time lands in ctx.throttle_ms."""
    limits: ClientQuotas = ctx.broker.quotas
    if not limits.active:
        return True
    strict = ctx.api_version >= STRICT_MUTATIONS_FROM.get(ctx.api_key, 1 << 30)
    throttle = limits.mutate(user_of(ctx.principal), ctx.client_id or "", partitions, strict)
    ctx.throttle_ms = max(ctx.throttle_ms, abs(throttle))
    return throttle >= 0


# KIP-219: from these versions on the client throttles itself after a response carrying a
# throttle time; before them the broker delays the response. (APIs not listed: every version
# this broker serves is past the change.)
CLIENT_SIDE_THROTTLE_FROM = {
    **{0: 6, 1: 8, 2: 3, 3: 6, 8: 4, 9: 4, 10: 2, 11: 3, 12: 2, 13: 2, 14: 2, 15: 2, 16: 2, 18: 2},
    **{19: 3, 20: 2, 21: 1, 22: 1, 29: 1, 30: 1, 31: 1, 32: 2, 33: 1, 35: 1, 37: 1, 42: 1},
}
# never counted against request_percentage (Kafka exempts the handshake APIs)
REQUEST_QUOTA_EXEMPT = frozenset({17, 18, 36})


def client_throttles(api_key: int, api_version: int) -> bool:
    return api_version >= CLIENT_SIDE_THROTTLE_FROM.get(api_key, 0)


@types.coroutine
def timed(coro: Any, spent: list[float]) -> Generator[Any, Any, Any]:
    """Run `coro`, adding to spent[0] the seconds spent inside its steps (not its waits)."""
    send_value: Any = None
    error: BaseException | None = None
    clock = time.perf_counter
    while True:
        started = clock()
        try:
            yielded = coro.send(send_value) if error is None else coro.throw(error)
        except StopIteration as done:
            spent[0] += clock() - started
            return done.value
        except BaseException:
            spent[0] += clock() - started
            raise
        spent[0] += clock() - started
        try:
            send_value, error = (yield yielded), None
        except BaseException as exc:  # cancellation and the like go into the coroutine
            send_value, error = None, exc


def throttle_response(limits: ClientQuotas, ctx: Any, response: Any, payload: Any, spent_s: float) -> Any:
    """Record a request against the client's quotas (a Produce's bytes were counted when it was
    admitted, see KafkaConnection); when over one, put the throttle time in the response
    (re-encoded) and in ctx.throttle_ms. A throttled Fetch is answered empty, as Kafka: its data
    is not sent and its bytes are not counted (the client fetches the same offsets again once
    the throttle ends), so a consumer over its quota gets nothing until then."""
    user, client = user_of(ctx.principal), ctx.client_id or ""
    throttle = 0
    fetched = 0
    if ctx.api_key == 1 and payload is not None:
        fetched = sum(len(c) for c in payload)
        throttle = limits.record(FETCH, user, client, fetched)
    if limits.request_quotas and ctx.api_key not in REQUEST_QUOTA_EXEMPT:
        throttle = max(throttle, limits.record(REQUEST, user, client, spent_s * 100))
    throttle = max(throttle, ctx.throttle_ms)  # decided before (Produce bytes) or by a handler (mutations)
    if throttle <= 0:
        return payload
    ctx.throttle_ms = throttle
    if response is None or not codec.has_field(type(response), "throttle_time"):
        return payload
    values: dict[str, Any] = {"throttle_time": datetime.timedelta(milliseconds=throttle)}
    # (one batch larger than the quota window, which a fetch always carries whole, is sent with
    # its throttle instead: emptied, no fetch from that offset could ever get through)
    if fetched and fetched <= limits.max_fetch_bytes(ctx.principal, client):
        limits.record(FETCH, user, client, -fetched)
        values["responses"] = ()  # no partitions; the session id stays, an incremental session stays valid
        if codec.has_field(type(response), "error_code"):
            values["error_code"] = ErrorCode.none
    return codec.encode_response_chunks(ctx.correlation_id, dataclasses.replace(response, **values))
