"""Prometheus metrics of the stream storage engine (one set per engine, in its registry)."""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class StorageMetrics:
    """One set per registry: a second engine on the same registry (a restart inside one
    process) shares the collectors instead of failing on duplicate names."""

    _by_registry: weakref.WeakKeyDictionary[CollectorRegistry, StorageMetrics] = weakref.WeakKeyDictionary()
    _initialized: bool

    def __new__(cls, registry: CollectorRegistry | None = None) -> StorageMetrics:
        if registry is not None and registry in cls._by_registry:
            return cls._by_registry[registry]
        self = super().__new__(cls)
        self._initialized = False
        if registry is not None:
            cls._by_registry[registry] = self
        return self

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if self._initialized:
            return
        self._initialized = True
        # A private registry by default so several engines in one process (tests) do not
        # collide; the broker passes the registry it serves on /metrics.
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.append_seconds = Histogram(
            "automq_storage_append_seconds",
            "Stream append latency until durable in the WAL",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.append_bytes = Counter("automq_storage_append_bytes", "Bytes appended to streams", registry=r)
        self.wal_sync_seconds = Histogram(
            "automq_storage_wal_sync_seconds",
            "WAL group write+sync (or bulk PUT) latency",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.wal_disk_seconds = Histogram(
            "automq_storage_wal_disk_seconds",
            "Volume WAL: the write and fdatasync system calls of a group alone, timed in the WAL "
            "thread (wal_sync_seconds adds the hand-offs to and from the event loop)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.wal_bytes_written = Counter(
            "automq_storage_wal_bytes_written", "Bytes written to the WAL (with framing)", registry=r
        )
        self.wal_bytes_pending = Gauge(
            "automq_storage_wal_bytes_pending", "WAL bytes not yet trimmed (not uploaded)", registry=r
        )
        self.wal_recovered_records = Counter(
            "automq_storage_wal_recovered_records", "Records replayed from the WAL at start", registry=r
        )
        self.wal_damaged_records = Counter(
            "automq_storage_wal_damaged_records",
            "Damaged (torn or corrupt) WAL records found at recovery and not served",
            registry=r,
        )
        self.wal_full = Counter("automq_storage_wal_full", "Times appends waited because the WAL was full", registry=r)
        self.ack_lease_waits = Counter(
            "automq_storage_ack_lease_waits",
            "Appends and fetches answered late because the acknowledgement lease had run out (no heartbeat answered in time)",
            registry=r,
        )
        self.cache_requests = Counter("automq_storage_cache_requests", "Cache lookups", ["cache", "result"], registry=r)
        self.cache_bytes = Gauge("automq_storage_cache_bytes", "Bytes held in a cache", ["cache"], registry=r)
        self.upload_seconds = Histogram(
            "automq_storage_upload_seconds",
            "Upload+commit latency of one cache block",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upload_bytes = Counter("automq_storage_upload_bytes", "Bytes uploaded in objects", registry=r)
        self.upload_failures = Counter("automq_storage_upload_failures", "Failed upload or commit attempts", registry=r)
        self.objects_committed = Counter("automq_storage_objects_committed", "Objects committed", ["type"], registry=r)
        self.object_read_seconds = Histogram(
            "automq_storage_object_read_seconds", "Ranged GET latency", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.object_read_bytes = Counter(
            "automq_storage_object_read_bytes", "Bytes read from the object store", registry=r
        )
        self.fetch_bytes = Counter("automq_storage_fetch_bytes", "Bytes returned by fetches", ["source"], registry=r)
        self.open_streams = Gauge("automq_storage_open_streams", "Streams open on this node", registry=r)
