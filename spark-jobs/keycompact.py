"""Key compaction of `cleanup.policy=compact` topics (`automq spark compact --keys`).

Per partition (one Spark task each), over the stream's committed objects older than the
job's `min_age`:

- the latest offset of every key is taken from the WHOLE committed stream (a record newer
  than the cleanable part still supersedes older ones);
- a record survives if it is the latest of its key, has a null key (nothing to compare),
  or is younger than `min.compaction.lag.ms` (not cleanable yet);
- a surviving tombstone (null value) is dropped once its timestamp is older than
  `delete.retention.ms` (Kafka measures from when the cleaner first saw it; here from the
  record's own timestamp, which is never later);
- offsets are kept: each batch keeps its base offset and its offset span; records keep
  their offsets (gaps inside batches, as Kafka's cleaner writes them). A batch left with no
  records is folded into the next surviving batch's span (the first batch of a fold keeps
  its base offset; idempotence fields are cleared on folded batches: the producer state of
  data this old is no longer needed for deduplication);
- the result is one new stream object per partition, committed like object compaction
  (`commit_stream_object` with the sources), so the controller checks the offsets match.

`max.compaction.lag.ms` is met by scheduling: every run cleans everything cleanable, so a
record waits at most one schedule interval past its min lag. Data still only in a broker's
WAL (the active tail) is never touched. Consumers see the compacted log at once: the commit is
a visible metadata change and the leader's log cache drops its batches below it.

Transactional data is not handled yet: control batches (markers) are dropped and aborted
records are not left out when a key's latest value is chosen, so an aborted value can survive
as if committed (docs/spark.md says not to key-compact topics transactional producers write).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from automq.broker.kafka import records
from automq.broker.objectstore import open_object_store
from automq.broker.storage.metadata import object_key
from automq.broker.storage.objects.format import ObjectWriter
from automq.broker.topic_configs import TOPIC_CONFIGS
from automq.spark.cluster import ClusterLocation, ClusterView
from automq.spark.compact import CompactionReport, CompactionTask, Rewritten, Source, chunks, commit_all, prepare_ids
from automq.spark.reader import ObjectSlice, read_slice_batches

MULTIPART_BYTES = 32 << 20
OUTPUT_BATCH_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class KeyCompactionTask:
    task: CompactionTask  # the cleanable objects (replaced by the new one)
    tail: tuple[Source, ...]  # later committed objects: only read for the latest offsets
    now_ms: int
    min_lag_ms: int
    delete_retention_ms: int


def _config(configs: dict[str, str], name: str) -> int:
    return int(configs.get(name, TOPIC_CONFIGS[name].default))


def plan_keys(location: ClusterLocation, min_age_ms: int, now_ms: int | None = None) -> list[KeyCompactionTask]:
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
                    )
                )
    return out


async def _batches(store, stream_id: int, sources: tuple[Source, ...], floor: int):
    for src in sources:
        sl = ObjectSlice(src.object_id, src.object_size, stream_id, src.start_offset, src.end_offset)
        async for base, count, payload in read_slice_batches(store, sl):
            if base + count > floor:
                yield base, count, bytes(payload)


class _Output:
    """Surviving records -> batches that keep offsets and cover the input's offsets without gaps."""

    def __init__(self, writer: ObjectWriter, stream_id: int) -> None:
        self.writer = writer
        self.stream_id = stream_id
        self.pending: tuple[records.BatchHeader, int, list[records.Record]] | None = None  # header, span start, records
        self.fold_from: int | None = None  # start of dropped batches waiting to be folded in
        self._pending_end = 0

    def add(self, header: records.BatchHeader, kept: list[records.Record]) -> None:
        end = header.base_offset + header.last_offset_delta + 1
        if not kept:
            if self.pending is not None:  # extend the pending batch over the empty one
                self._pending_end = end
            elif self.fold_from is None:
                self.fold_from = header.base_offset
            return
        self.flush()
        start = self.fold_from if self.fold_from is not None else header.base_offset
        self.fold_from = None
        self.pending = (header, start, kept)
        self._pending_end = end

    def flush(self) -> None:
        if self.pending is None:
            return
        h, start, recs = self.pending
        end = self._pending_end
        folded = start != h.base_offset or end != h.base_offset + h.last_offset_delta + 1
        base_ts = min(r[1] for r in recs)
        encoded = [records.encode_record(o - start, ts - base_ts, k, v, hd) for o, ts, k, v, hd in recs]
        log_append = h.attributes & records.TIMESTAMP_TYPE_BIT
        batch = records.build_batch(
            start,
            encoded,
            last_offset_delta=end - start - 1,
            base_timestamp=base_ts,
            max_timestamp=h.max_timestamp if log_append else max(r[1] for r in recs),
            attributes=h.attributes & records.TIMESTAMP_TYPE_BIT,
            producer_id=-1 if folded else h.producer_id,
            producer_epoch=-1 if folded else h.producer_epoch,
            base_sequence=-1 if folded else h.base_sequence,
            partition_leader_epoch=h.partition_leader_epoch,
        )
        self.writer.add_batch(self.stream_id, start, end - start, batch)
        self.pending = None


def rewrite_keys(object_store_url: str, kt: KeyCompactionTask, object_id: int, block_bytes: int) -> Rewritten | None:
    return asyncio.run(_rewrite_keys(object_store_url, kt, object_id, block_bytes))


async def _rewrite_keys(object_store_url: str, kt: KeyCompactionTask, object_id: int, block_bytes: int):
    task = kt.task
    store = open_object_store(object_store_url)
    try:
        latest: dict[bytes, int] = {}
        for sources in (task.sources, kt.tail):
            async for _base, _count, batch in _batches(store, task.stream_id, sources, task.floor):
                header = records.parse_header(batch)
                if header.is_control:
                    continue
                for offset, _ts, key, _v, _h in records.decode_records(batch, header):
                    if key is not None:
                        latest[key] = offset
        lag_cut = kt.now_ms - kt.min_lag_ms
        tombstone_cut = kt.now_ms - kt.delete_retention_ms
        writer = ObjectWriter(block_bytes)
        out = _Output(writer, task.stream_id)
        survivors = 0
        async for _base, _count, batch in _batches(store, task.stream_id, task.sources, task.floor):
            header = records.parse_header(batch)
            kept = []
            for rec in records.decode_records(batch, header) if not header.is_control else []:
                offset, ts, key, value, _h = rec
                if (
                    ts > lag_cut
                    or key is None
                    or (latest.get(key) == offset and not (value is None and ts < tombstone_cut))
                ):
                    kept.append(rec)
            survivors += len(kept)
            out.add(header, kept)
        out.flush()
        if not survivors or not writer.streams:
            return None  # nothing survives: leave the objects as they are (rare; retention handles it)
        [summary] = writer.streams
        parts = writer.finish()
        name = object_key(object_id)
        if writer.total_size > MULTIPART_BYTES:
            await store.put_multipart(name, chunks(parts, 8 << 20))
        else:
            await store.put(name, b"".join(parts))
        return Rewritten(task, object_id, writer.total_size, summary.start_offset, summary.end_offset)
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
        asyncio.run(commit_all(location, [r for r in results if r is not None], report))
    report.seconds = time.monotonic() - started
    return report
