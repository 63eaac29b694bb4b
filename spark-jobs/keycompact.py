"""Key compaction of `cleanup.policy=compact` topics (`automq spark compact --keys`).

Per partition (one Spark task each), over the stream's committed objects older than the
job's `min_age`:

- pass 1 reads the WHOLE committed stream (`keyclean.LogScan`): the latest offset of every
  key as a read_committed consumer sees it (a record newer than the cleanable part still
  supersedes older ones; aborted records never do), the aborted transactions, the first offset
  of the oldest open transaction (nothing from there on is cleaned), each producer's last batch;
- pass 2 rewrites the cleanable objects (`keyclean.KeyCleaner`): a record survives if it is
  the latest of its key, has a null key (nothing to compare), or is younger than
  `min.compaction.lag.ms`; a surviving tombstone (null value) is dropped once its timestamp is
  older than `delete.retention.ms` (Kafka measures from when the cleaner first saw it; here
  from the record's own timestamp, which is never later); aborted transactional batches go;
  transaction markers stay until safe to drop; every active producer's last batch keeps its
  producer fields (see keyclean.py for the transaction rules);
- offsets are kept: each batch keeps its base offset and its offset span; records keep
  their offsets (gaps inside batches, as Kafka's cleaner writes them);
- the result is one new stream object per partition, committed like object compaction
  (`commit_stream_object` with the sources), so the controller checks the offsets match.

`max.compaction.lag.ms` is met by scheduling: every run cleans everything cleanable, so a
record waits at most one schedule interval past its min lag. Data still only in a broker's
WAL (the active tail) is never touched. Consumers see the compacted log at once: the commit is
a visible metadata change and the leader's log cache drops its batches below it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

from automq.broker.config import KafkaConfig
from automq.broker.kafka.producer_snapshots import ProducerSnapshotStore
from automq.broker.objectstore import open_object_store
from automq.broker.storage.metadata import object_key
from automq.broker.storage.objects.format import ObjectWriter
from automq.broker.topic_configs import TOPIC_CONFIGS
from automq.spark.cluster import ClusterLocation, ClusterView
from automq.spark.compact import CompactionReport, CompactionTask, Rewritten, Source, chunks, commit_all, prepare_ids
from automq.spark.keyclean import CleanStats, KeyCleaner, LogScan
from automq.spark.reader import ObjectSlice, read_slice_batches

MULTIPART_BYTES = 32 << 20
# the brokers' producer.id.expiration.ms default: a producer idle longer is forgotten by them too
PRODUCER_ID_EXPIRATION_MS = KafkaConfig.model_fields["producer_id_expiration_ms"].default


@dataclass(frozen=True, slots=True)
class KeyCompactionTask:
    task: CompactionTask  # the cleanable objects (replaced by the new one)
    tail: tuple[Source, ...]  # later committed objects: only read for the latest offsets
    now_ms: int
    min_lag_ms: int
    delete_retention_ms: int
    producer_expiration_ms: int


def _config(configs: dict[str, str], name: str) -> int:
    return int(configs.get(name, TOPIC_CONFIGS[name].default))


def plan_keys(
    location: ClusterLocation,
    min_age_ms: int,
    now_ms: int | None = None,
    producer_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS,
) -> list[KeyCompactionTask]:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    view = ClusterView.load(location)
    out = []
    for t in sorted(view.topics.values(), key=lambda t: t.name):
        if "compact" not in t.configs.get("cleanup.policy", "delete").split(","):
            continue
        for p in t.partitions:
            cleanable: list[Source] = []
            tail: list[Source] = []
            for obj, _start, _end in p.ranges():
                rg = next(r for r in obj.ranges if r.stream_id == p.stream_id)
                src = Source(obj.object_id, obj.object_size, rg.start_offset, rg.end_offset, obj.object_size, False)
                if not tail and now_ms - obj.committed_at_ms >= min_age_ms:
                    cleanable.append(src)
                else:
                    tail.append(src)
            if cleanable:
                out.append(
                    KeyCompactionTask(
                        CompactionTask(p.stream_id, t.name, p.partition, p.start_offset, tuple(cleanable)),
                        tuple(tail),
                        now_ms,
                        _config(t.configs, "min.compaction.lag.ms"),
                        _config(t.configs, "delete.retention.ms"),
                        producer_expiration_ms,
                    )
                )
    return out


async def _batches(store, stream_id: int, sources: tuple[Source, ...], floor: int):
    for src in sources:
        sl = ObjectSlice(src.object_id, src.object_size, stream_id, src.start_offset, src.end_offset)
        async for base, count, payload in read_slice_batches(store, sl):
            if base + count > floor:
                yield base, count, bytes(payload)


def rewrite_keys(object_store_url: str, kt: KeyCompactionTask, object_id: int, block_bytes: int) -> KeyRewritten | None:
    return asyncio.run(_rewrite_keys(object_store_url, kt, object_id, block_bytes))


@dataclass(slots=True)
class KeyRewritten:
    rewritten: Rewritten | None  # None: nothing survives, the objects stay as they are
    stats: CleanStats


async def _rewrite_keys(object_store_url: str, kt: KeyCompactionTask, object_id: int, block_bytes: int):
    task = kt.task
    store = open_object_store(object_store_url)
    try:
        scan = LogScan()
        for sources in (task.sources, kt.tail):
            async for _base, _count, batch in _batches(store, task.stream_id, sources, task.floor):
                scan.add(batch)
        # a broker that loads a producer snapshot replays the markers above it: those stay
        snapshots = await ProducerSnapshotStore(store).offsets(task.stream_id)
        writer = ObjectWriter(block_bytes)
        cleaner = KeyCleaner(
            scan.result(),
            lambda start, count, batch: writer.add_batch(task.stream_id, start, count, batch),
            now_ms=kt.now_ms,
            min_lag_ms=kt.min_lag_ms,
            delete_retention_ms=kt.delete_retention_ms,
            producer_expiration_ms=kt.producer_expiration_ms,
            marker_floor=snapshots[0] if snapshots else None,
        )
        async for _base, _count, batch in _batches(store, task.stream_id, task.sources, task.floor):
            cleaner.add(batch)
        cleaner.finish()
        stats = cleaner.stats
        if not writer.streams or (not stats.records_out and stats.batches_out == stats.empty_batches):
            return KeyRewritten(None, stats)  # nothing survives: leave the objects (retention handles it)
        [summary] = writer.streams
        parts = writer.finish()
        name = object_key(object_id)
        if writer.total_size > MULTIPART_BYTES:
            await store.put_multipart(name, chunks(parts, 8 << 20))
        else:
            await store.put(name, b"".join(parts))
        return KeyRewritten(
            Rewritten(task, object_id, writer.total_size, summary.start_offset, summary.end_offset), stats
        )
    finally:
        await store.close()


def compact_keys(spark, location: ClusterLocation, min_age_ms: int = 5 * 60_000, block_bytes: int = 512 << 10):
    if not location.controller_urls:
        raise ValueError("key compaction commits through the controller: pass --controller (or a running --data-dir)")
    started = time.monotonic()
    tasks = plan_keys(location, min_age_ms)
    report = CompactionReport(planned=len(tasks))
    if tasks:
        first = asyncio.run(prepare_ids(location, len(tasks)))
        url = location.object_store_url
        jobs = [(first + i, kt) for i, kt in enumerate(tasks)]
        results = (
            spark.sparkContext.parallelize(jobs, max(1, min(len(jobs), spark.sparkContext.defaultParallelism * 2)))
            .map(lambda job: rewrite_keys(url, job[1], job[0], block_bytes))
            .collect()
        )
        for r in results:
            for name, value in asdict(r.stats).items():
                report.key_stats[name] = report.key_stats.get(name, 0) + value
        asyncio.run(commit_all(location, [r.rewritten for r in results if r.rewritten is not None], report))
    report.seconds = time.monotonic() - started
    return report
