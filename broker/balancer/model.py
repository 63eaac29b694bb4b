"""The load model: what each partition and each broker carries, from brokers' own metrics.

Pure (no I/O): `scrape.py` fetches brokers' /metrics and hands the samples here. One
`LoadModel` feeds both the balancer (planner.py) and the operator's autoscaler, so they
decide from the same numbers.

Rates are per second over a window of two or more scrapes. The model is all or nothing:
a broker that did not answer its last scrape, answered too long ago, restarted inside the
window, or leads a partition it has fewer than two samples of makes the result `Incomplete`
(naming the broker and why) instead of a model built on part of the cluster. A decision made
on partial data would move partitions towards a broker only because its numbers were missing.

Partition metrics (names in docs/metrics.md) exist on a broker exactly while it leads the
partition, so a scrape tells both what a broker leads and how much each partition carries.
The controller's metadata (`ClusterMetadata`) is the truth for who leads what; a series
left on a broker the metadata no longer names as leader is ignored.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from automq.broker.controller.protocol import METRICS_LISTENER, BrokerInfo, MetadataImage

PartitionKey = tuple[str, int]

BYTES_IN = "kafka_server_brokertopicmetrics_bytesin_total"
BYTES_OUT = "kafka_server_brokertopicmetrics_bytesout_total"
MESSAGES_IN = "kafka_server_brokertopicmetrics_messagesin_total"
NETWORK_IN = "kafka_server_socket_server_metrics_incoming_byte_total"
NETWORK_OUT = "kafka_server_socket_server_metrics_outgoing_byte_total"
CPU_SECONDS = "process_cpu_seconds_total"
START_TIME = "process_start_time_seconds"
_PARTITION_COLUMN = {BYTES_IN: 0, BYTES_OUT: 1, MESSAGES_IN: 2}

# Broker states. Only ACTIVE brokers receive partitions; the others are drained by goal (a).
ACTIVE = "active"
DRAINING = "draining"
FENCED = "fenced"
NOT_READY = "not-ready"


class MetricsFormatError(ValueError):
    """A /metrics body that is not the Prometheus text format."""


# --------------------------------------------------------------------------- cluster metadata


@dataclass(frozen=True, slots=True)
class BrokerMeta:
    broker_id: int
    rack: str | None = None
    state: str = ACTIVE  # ACTIVE | DRAINING | FENCED | NOT_READY
    metrics_url: str | None = None


@dataclass(frozen=True)
class ClusterMetadata:
    """Who leads what, and each broker's rack, state and metrics URL."""

    brokers: Mapping[int, BrokerMeta]
    leaders: Mapping[PartitionKey, int]  # -1: no leader right now
    moving: Mapping[PartitionKey, int] = field(default_factory=dict)  # partition -> move target

    @classmethod
    def from_image(
        cls,
        image: MetadataImage,
        metrics_urls: Mapping[int, str] | None = None,
        not_ready: Collection[int] = (),
    ) -> ClusterMetadata:
        """From the controller's metadata image (which knows draining and fenced brokers).
        Metrics URLs: `metrics_urls` where given, else the HTTP endpoint each broker
        registered (listener METRICS_LISTENER). `not_ready`: brokers the caller knows are not
        Ready (e.g. their pod)."""
        urls = {b.node_id: url for b in image.brokers if (url := registered_metrics_url(b)) is not None}
        urls.update(metrics_urls or {})
        brokers = {
            b.node_id: BrokerMeta(
                b.node_id,
                b.rack,
                NOT_READY if b.node_id in not_ready and b.state == ACTIVE else b.state,
                urls.get(b.node_id),
            )
            for b in image.brokers
        }
        leaders: dict[PartitionKey, int] = {}
        moving: dict[PartitionKey, int] = {}
        for t in image.topics:
            for p in t.partitions:
                leaders[(t.name, p.partition)] = p.leader
                if p.state == "moving":
                    moving[(t.name, p.partition)] = p.target
        return cls(brokers, leaders, moving)


def registered_metrics_url(broker: BrokerInfo) -> str | None:
    e = next((e for e in broker.endpoints if e.listener == METRICS_LISTENER), None)
    if e is None:
        return None
    host = f"[{e.host}]" if ":" in e.host else e.host
    return f"http://{host}:{e.port}/metrics"


# --------------------------------------------------------------------------- samples


@dataclass(frozen=True, slots=True)
class BrokerSample:
    """One scrape of one broker's /metrics (counter values, not rates)."""

    at: float  # seconds, monotonic clock of the scraper
    partitions: Mapping[PartitionKey, tuple[float, float, float]]  # bytes in, bytes out, messages in
    cpu_seconds: float | None = None
    network_in: float = 0.0
    network_out: float = 0.0
    start_time: float | None = None  # process start: a change means the broker restarted


def parse_metrics(text: str, at: float) -> BrokerSample:
    """The counters the load model needs from a Prometheus text exposition."""
    partitions: dict[PartitionKey, list[float]] = {}
    cpu = start = None
    net_in = net_out = 0.0
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                column = _PARTITION_COLUMN.get(s.name)
                if column is not None:
                    key = (s.labels["topic"], int(s.labels["partition"]))
                    partitions.setdefault(key, [0.0, 0.0, 0.0])[column] = float(s.value)
                elif s.name == CPU_SECONDS:
                    cpu = float(s.value)
                elif s.name == START_TIME:
                    start = float(s.value)
                elif s.name == NETWORK_IN:
                    net_in += float(s.value)
                elif s.name == NETWORK_OUT:
                    net_out += float(s.value)
    except (ValueError, KeyError, TypeError) as exc:
        raise MetricsFormatError(f"not Prometheus text format: {exc}") from exc
    return BrokerSample(
        at,
        {k: (v[0], v[1], v[2]) for k, v in partitions.items()},
        cpu,
        net_in,
        net_out,
        start,
    )


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True, slots=True)
class PartitionLoad:
    topic: str
    partition: int
    leader: int
    bytes_in: float = 0.0  # bytes/s
    bytes_out: float = 0.0
    messages_in: float = 0.0

    @property
    def key(self) -> PartitionKey:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class BrokerLoad:
    broker_id: int
    rack: str | None = None
    state: str = ACTIVE
    bytes_in: float = 0.0  # sum over the partitions it leads, bytes/s
    bytes_out: float = 0.0
    messages_in: float = 0.0
    cpu: float | None = None  # cores busy (CPU seconds per second); None when unknown
    network_in: float = 0.0  # all socket bytes, bytes/s
    network_out: float = 0.0
    partitions: int = 0
    leaders: int = 0  # one replica per partition: equals `partitions`


@dataclass(frozen=True)
class LoadModel:
    brokers: Mapping[int, BrokerLoad]
    partitions: Mapping[PartitionKey, PartitionLoad]
    window_s: float = 0.0  # the span the rates were computed over (shortest of the brokers')
    taken_at: float = 0.0  # the scraper's clock at the newest sample
    # brokers that are leaving (draining, not Ready) and could not be measured: their
    # partitions count with zero load, so a dead broker can still be emptied
    unmeasured: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def from_partitions(
        cls,
        brokers: Mapping[int, BrokerMeta] | Collection[int],
        partitions: Collection[PartitionLoad],
        window_s: float = 0.0,
        taken_at: float = 0.0,
    ) -> LoadModel:
        """Per-broker totals summed from partitions (synthetic models in tests, and the scraper)."""
        metas = brokers if isinstance(brokers, Mapping) else {b: BrokerMeta(b) for b in brokers}
        sums: dict[int, list[float]] = {b: [0.0, 0.0, 0.0, 0.0] for b in metas}
        for p in partitions:
            acc = sums.get(p.leader)
            if acc is not None:
                acc[0] += p.bytes_in
                acc[1] += p.bytes_out
                acc[2] += p.messages_in
                acc[3] += 1
        loads = {
            b: BrokerLoad(b, m.rack, m.state, s[0], s[1], s[2], partitions=int(s[3]), leaders=int(s[3]))
            for (b, m), s in ((item, sums[item[0]]) for item in metas.items())
        }
        return cls(loads, {p.key: p for p in partitions}, window_s, taken_at)

    def total(self, resource: str) -> float:
        return sum(getattr(b, resource) for b in self.brokers.values())


@dataclass(frozen=True, slots=True)
class MissingData:
    broker_id: int
    reason: str

    def __str__(self) -> str:
        return f"broker {self.broker_id}: {self.reason}"


@dataclass(frozen=True)
class Incomplete:
    """No model this cycle: some broker's data is missing or stale (never decide on part)."""

    problems: tuple[MissingData, ...]

    @property
    def brokers(self) -> list[int]:
        return sorted({p.broker_id for p in self.problems})

    def __str__(self) -> str:
        return "load data incomplete: " + "; ".join(str(p) for p in self.problems)


def _window(samples: Sequence[BrokerSample], window_s: float) -> list[BrokerSample]:
    """The samples the rates use: the newest and every one within window_s before it; at
    least the one just before the newest even when scrapes are further apart than that."""
    newest = samples[-1]
    used = [s for s in samples if newest.at - s.at <= window_s]
    if len(used) < 2 and len(samples) >= 2:
        used = list(samples[-2:])
    return used


def build_model(
    cluster: ClusterMetadata,
    history: Mapping[int, Sequence[BrokerSample]],
    *,
    now: float,
    window_s: float = 60.0,
    stale_after_s: float = 120.0,
    errors: Mapping[int, str] | None = None,
) -> LoadModel | Incomplete:
    """Rates per partition and per broker from each broker's samples (oldest first).

    `errors`: brokers whose latest scrape failed, with why. Fenced brokers are not scraped
    (they are gone); the partitions they still lead count with zero load. The same for a
    draining or not-Ready broker whose data is missing (named in `LoadModel.unmeasured`): it
    is being emptied, and a dead one must not block that. Only an active broker's missing data
    makes the result Incomplete."""
    errors = errors or {}
    problems: list[MissingData] = []
    rates: dict[int, dict[PartitionKey, tuple[float, float, float]]] = {}
    broker_rates: dict[int, tuple[float | None, float, float]] = {}
    spans: list[float] = []
    newest_at = 0.0
    soft: dict[int, str] = {}

    def report(bid: int, reason: str) -> None:
        if cluster.brokers[bid].state == ACTIVE:
            problems.append(MissingData(bid, reason))
        else:
            soft.setdefault(bid, reason)

    for bid, meta in sorted(cluster.brokers.items()):
        if meta.state == FENCED:
            continue
        if bid in errors:
            report(bid, f"last scrape failed: {errors[bid]}")
            continue
        samples = history.get(bid, ())
        if len(samples) < 2:
            report(bid, f"{len(samples)} scrape(s) so far; rates need 2")
            continue
        newest = samples[-1]
        if now - newest.at > stale_after_s:
            report(bid, f"newest scrape is {now - newest.at:.0f}s old (limit {stale_after_s:.0f}s)")
            continue
        used = _window(samples, window_s)
        first = used[0]
        span = newest.at - first.at
        if span <= 0:
            report(bid, "scrapes have no time between them")
            continue
        if first.start_time is not None and newest.start_time is not None and first.start_time != newest.start_time:
            report(bid, "restarted within the window (counters reset)")
            continue
        per_partition: dict[PartitionKey, tuple[float, float, float]] = {}
        for key, last in newest.partitions.items():
            earliest = next((s for s in used if key in s.partitions), newest)
            if earliest is newest:
                continue  # judged below, only if the metadata says this broker leads it
            dt = newest.at - earliest.at
            start = earliest.partitions[key]
            delta = tuple(b - a for a, b in zip(start, last, strict=True))
            if min(delta) < 0:
                report(bid, f"counters of {key[0]}-{key[1]} went backwards (reopened)")
                continue
            per_partition[key] = (delta[0] / dt, delta[1] / dt, delta[2] / dt)
        rates[bid] = per_partition
        cpu = None
        if first.cpu_seconds is not None and newest.cpu_seconds is not None:
            cpu = max(0.0, (newest.cpu_seconds - first.cpu_seconds) / span)
        broker_rates[bid] = (
            cpu,
            max(0.0, (newest.network_in - first.network_in) / span),
            max(0.0, (newest.network_out - first.network_out) / span),
        )
        spans.append(span)
        newest_at = max(newest_at, newest.at)

    for key, target in sorted(cluster.moving.items()):
        problems.append(MissingData(target, f"{key[0]}-{key[1]} is moving here; waiting for moves to finish"))

    partitions: list[PartitionLoad] = []
    for key, leader in sorted(cluster.leaders.items()):
        leader_meta = cluster.brokers.get(leader)
        if leader < 0 or leader_meta is None or leader_meta.state == FENCED or key in cluster.moving:
            # no live leader: nothing carries it now, the controller places it
            partitions.append(PartitionLoad(key[0], key[1], leader))
            continue
        per = rates.get(leader)
        if leader in soft or (per is not None and key not in per and leader_meta.state != ACTIVE):
            partitions.append(PartitionLoad(key[0], key[1], leader))  # leaving and unmeasured: zero
            continue
        if per is None:
            continue  # that broker's problem is reported already
        r = per.get(key)
        if r is None:
            if not any(p.broker_id == leader for p in problems):
                seen = key in history[leader][-1].partitions
                problems.append(
                    MissingData(
                        leader,
                        f"leads {key[0]}-{key[1]} but "
                        + ("has only one sample of it (just moved or created)" if seen else "does not report it yet")
                        + "; the next scrape completes it",
                    )
                )
            continue
        partitions.append(PartitionLoad(key[0], key[1], leader, *r))
    if problems:
        return Incomplete(tuple(_dedupe(problems)))
    model = LoadModel.from_partitions(cluster.brokers, partitions, min(spans) if spans else 0.0, newest_at)
    brokers = dict(model.brokers)
    for bid, (cpu, net_in, net_out) in broker_rates.items():
        b = brokers[bid]
        brokers[bid] = BrokerLoad(
            b.broker_id,
            b.rack,
            b.state,
            b.bytes_in,
            b.bytes_out,
            b.messages_in,
            cpu,
            net_in,
            net_out,
            b.partitions,
            b.leaders,
        )
    return LoadModel(brokers, model.partitions, model.window_s, model.taken_at, soft)


def _dedupe(problems: list[MissingData]) -> list[MissingData]:
    """At most three reasons per broker (a broker missing 500 partitions says so once or thrice)."""
    out: list[MissingData] = []
    count: dict[int, int] = {}
    for p in problems:
        n = count.get(p.broker_id, 0)
        count[p.broker_id] = n + 1
        if n < 3:
            out.append(p)
        elif n == 3:
            out.append(MissingData(p.broker_id, "(more problems not shown)"))
    return out
