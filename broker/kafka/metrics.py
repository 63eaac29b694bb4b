"""Prometheus metrics of the Kafka layer: one object, registered in the broker's registry.

Per broker and per topic bytes in/out and messages in, request count and latency by API,
led partitions, open connections. The storage engine registers its own metrics in the same
registry (passed to StorageEngine), so /metrics shows both.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class KafkaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.bytes_in = Counter(
            "kafka_server_bytes_in", "Record batch bytes appended by produce requests", registry=registry
        )
        self.bytes_out = Counter(
            "kafka_server_bytes_out", "Record batch bytes returned by fetch requests", registry=registry
        )
        self.messages_in = Counter(
            "kafka_server_messages_in", "Records appended by produce requests", registry=registry
        )
        self.topic_bytes_in = Counter(
            "kafka_topic_bytes_in", "Record batch bytes appended, per topic", ["topic"], registry=registry
        )
        self.topic_bytes_out = Counter(
            "kafka_topic_bytes_out", "Record batch bytes fetched, per topic", ["topic"], registry=registry
        )
        self.topic_messages_in = Counter(
            "kafka_topic_messages_in", "Records appended, per topic", ["topic"], registry=registry
        )
        self.requests = Counter("kafka_requests", "Requests handled, by API", ["api"], registry=registry)
        self.request_errors = Counter(
            "kafka_request_errors", "Requests that failed with an unexpected error, by API", ["api"], registry=registry
        )
        self.request_latency = Histogram(
            "kafka_request_latency_seconds",
            "Time from request parsed to response queued, by API",
            ["api"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.partitions = Gauge("kafka_partitions_led", "Partitions this broker leads", registry=registry)
        self.connections = Gauge("kafka_connections", "Open client connections", registry=registry)
        self.connections_closed = Counter(
            "kafka_connections_closed_by_broker",
            "Connections closed by the broker, by reason",
            ["reason"],
            registry=registry,
        )
        self.fetch_sessions = Gauge("kafka_fetch_sessions", "Incremental fetch sessions cached", registry=registry)

        # labelled children cached: `labels()` costs more than the increment on hot paths
        self._topic_in: dict[str, tuple] = {}
        self._topic_out: dict[str, object] = {}
        self._api: dict[str, tuple] = {}

    def record_produce(self, topic: str, nbytes: int, nrecords: int) -> None:
        self.bytes_in.inc(nbytes)
        self.messages_in.inc(nrecords)
        children = self._topic_in.get(topic)
        if children is None:
            children = self._topic_in[topic] = (self.topic_bytes_in.labels(topic), self.topic_messages_in.labels(topic))
        children[0].inc(nbytes)
        children[1].inc(nrecords)

    def record_fetch(self, topic: str, nbytes: int) -> None:
        self.bytes_out.inc(nbytes)
        child = self._topic_out.get(topic)
        if child is None:
            child = self._topic_out[topic] = self.topic_bytes_out.labels(topic)
        child.inc(nbytes)  # type: ignore[attr-defined]

    def record_request(self, api: str, seconds: float) -> None:
        children = self._api.get(api)
        if children is None:
            children = self._api[api] = (self.requests.labels(api), self.request_latency.labels(api))
        children[0].inc()
        children[1].observe(seconds)

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's series go away (and its cache entries with them)."""
        for cache, metrics in (
            (self._topic_in, (self.topic_bytes_in, self.topic_messages_in)),
            (self._topic_out, (self.topic_bytes_out,)),
        ):
            if cache.pop(topic, None) is not None:
                for metric in metrics:
                    try:
                        metric.remove(topic)
                    except KeyError:
                        pass
