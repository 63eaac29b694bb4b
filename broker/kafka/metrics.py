"""Prometheus metrics of the Kafka layer: one object, registered in the broker's registry.

Per broker and per topic bytes in/out and messages in, request count and latency by API,
led partitions, open connections. The storage engine registers its own metrics in the same
registry (passed to StorageEngine), so /metrics shows both.

Per partition bytes in/out and messages in use the names Kafka's JMX exporter gives
BrokerTopicMetrics (`kafka_server_brokertopicmetrics_bytesin_total`, with `topic` and
`partition` labels), so dashboards built for Kafka sum them by topic. A partition's series
exist exactly while this broker leads it: created at zero when it opens here, removed when it
moves away or is deleted. The load balancer (automq.broker.balancer) relies on that: a
broker's scrape names the partitions it leads. Network bytes are counted per socket read and
per response written, never per record (docs/metrics.md lists every name).
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
        self.partition_bytes_in = Counter(
            "kafka_server_brokertopicmetrics_bytesin",
            "Record batch bytes appended by produce requests, per led partition",
            ["topic", "partition"],
            registry=registry,
        )
        self.partition_bytes_out = Counter(
            "kafka_server_brokertopicmetrics_bytesout",
            "Record batch bytes returned by fetch requests, per led partition",
            ["topic", "partition"],
            registry=registry,
        )
        self.partition_messages_in = Counter(
            "kafka_server_brokertopicmetrics_messagesin",
            "Records appended by produce requests, per led partition",
            ["topic", "partition"],
            registry=registry,
        )
        self.network_in = Counter(
            "kafka_server_socket_server_metrics_incoming_byte",
            "Bytes read from client connections (all listeners)",
            registry=registry,
        )
        self.network_out = Counter(
            "kafka_server_socket_server_metrics_outgoing_byte",
            "Bytes written to client connections (all listeners)",
            registry=registry,
        )

        # labelled children cached: `labels()` costs more than the increment on hot paths
        self._topic_in: dict[str, tuple] = {}
        self._topic_out: dict[str, object] = {}
        self._api: dict[str, tuple] = {}
        # (topic, partition) -> (bytes in, messages in, bytes out) children of a led partition
        self._partition: dict[tuple[str, int], tuple] = {}

    def record_produce(self, topic: str, partition: int, nbytes: int, nrecords: int) -> None:
        self.bytes_in.inc(nbytes)
        self.messages_in.inc(nrecords)
        children = self._topic_in.get(topic)
        if children is None:
            children = self._topic_in[topic] = (self.topic_bytes_in.labels(topic), self.topic_messages_in.labels(topic))
        children[0].inc(nbytes)
        children[1].inc(nrecords)
        part = self._partition.get((topic, partition))
        if part is not None:  # absent once the partition moved away (a late append must not revive it)
            part[0].inc(nbytes)
            part[1].inc(nrecords)

    def record_fetch(self, topic: str, partition: int, nbytes: int) -> None:
        self.bytes_out.inc(nbytes)
        child = self._topic_out.get(topic)
        if child is None:
            child = self._topic_out[topic] = self.topic_bytes_out.labels(topic)
        child.inc(nbytes)  # type: ignore[attr-defined]
        part = self._partition.get((topic, partition))
        if part is not None:
            part[2].inc(nbytes)

    def partition_opened(self, topic: str, partition: int) -> None:
        """This broker leads the partition now: its series appear, at zero."""
        key = (topic, partition)
        if key not in self._partition:
            label = str(partition)
            self._partition[key] = (
                self.partition_bytes_in.labels(topic, label),
                self.partition_messages_in.labels(topic, label),
                self.partition_bytes_out.labels(topic, label),
            )

    def partition_closed(self, topic: str, partition: int) -> None:
        """Moved away or deleted: its series go (a scrape names only led partitions)."""
        if self._partition.pop((topic, partition), None) is None:
            return
        for metric in (self.partition_bytes_in, self.partition_messages_in, self.partition_bytes_out):
            try:
                metric.remove(topic, str(partition))
            except KeyError:
                pass

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
