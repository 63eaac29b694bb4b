"""Prometheus metrics of share groups on the partition side (KIP-932), in the broker's registry.

Counted per acquisition, acknowledgement batch and state write, never per record: a counter
adds the length of a range at once. Kafka's SharePartitionMetrics and share-group-metrics
have the same quantities (in-flight records, acknowledgements by type, lock timeouts).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ACK_TYPE_NAMES = {0: "gap", 1: "accept", 2: "release", 3: "reject", 4: "renew"}


class ShareMetrics:
    def __init__(
        self, registry: CollectorRegistry, in_flight: Callable[[], float], loaded: Callable[[], float]
    ) -> None:
        self.delivered = Counter(
            "kafka_share_records_delivered",
            "Records handed to share-group members; delivery=redelivery for the second and later deliveries",
            ["delivery"],
            registry=registry,
        )
        self.acknowledged = Counter(
            "kafka_share_records_acknowledged",
            "Records acknowledged by share-group members, by acknowledge type",
            ["type"],
            registry=registry,
        )
        self.lock_expired = Counter(
            "kafka_share_records_lock_expired",
            "Records whose acquisition lock timed out (available again, or archived at the delivery limit)",
            registry=registry,
        )
        self.released = Counter(
            "kafka_share_records_released_on_close",
            "Records released because their member's share session closed or was evicted",
            registry=registry,
        )
        self.state_write_seconds = Histogram(
            "kafka_share_state_write_seconds",
            "Latency of one durable write of a share-partition's state (acknowledgements wait for it)",
            buckets=_WRITE_BUCKETS,
            registry=registry,
        )
        self.state_write_failures = Counter(
            "kafka_share_state_write_failures",
            "Share-partition state writes that failed (fenced by a newer leader, or the object store)",
            registry=registry,
        )
        self.in_flight = Gauge(
            "kafka_share_records_in_flight",
            "Records between the share-partition start and end offsets, over the share-partitions led here",
            registry=registry,
        )
        self.in_flight.set_function(in_flight)
        self.share_partitions = Gauge(
            "kafka_share_partitions", "Share-partitions (group, partition) loaded on this broker", registry=registry
        )
        self.share_partitions.set_function(loaded)
