"""Object compaction (`automq spark compact`): many small objects -> few large stream objects.

Every upload leaves a stream-set object (many streams, small). Cold reads then pay one GET
per small object. This job:

1. plans on the driver from the controller's metadata: per stream, runs of consecutive
   objects that are stream-set objects or small stream objects, older than `min_age`,
   cut at `target_bytes` (each candidate stream-set object's index is read once to know
   how many bytes each stream holds in it);
2. prepares one object id per run at the controller, rewrites each run on an executor into
   ONE stream object (ranged GETs of the sources' blocks, `ObjectWriter`, a multipart upload
   above `MULTIPART_BYTES`), batches copied byte for byte;
3. commits each new object with `commit_stream_object(source_object_ids=...)`. The
   controller checks the sources are still live and that the new range neither drops nor
   invents an offset; the sources (or, for a stream-set object, this stream's part of it)
   are then obsolete and deleted after the controller's grace period, so readers that
   listed them just before still finish.

Why it is safe with everything else going on:
- brokers keep uploading: the plan only takes objects below each stream's committed end;
  new uploads are new objects the run never touches;
- retention trims: batches wholly below the log start are not copied; a trim that makes a
  source dead before the commit makes the controller refuse it (OBJECT_CONFLICT): the run
  reports `lost` and its written object expires with its prepared id;
- a second compaction racing on the same sources: the first commit wins, the other gets
  OBJECT_CONFLICT the same way;
- reassignments: compaction commits carry no stream epoch (node id -1), ownership is untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from automq.broker.controller.client import ControllerClient
from automq.broker.controller.protocol import ObjectConflictError
from automq.broker.objectstore import ObjectStore, open_object_store
from automq.broker.storage.metadata import MetadataError, ObjectMetadata, ObjectType, StreamObject, object_key
from automq.broker.storage.objects.format import ObjectWriter
from automq.spark.cluster import ClusterLocation, ClusterView
from automq.spark.reader import ObjectSlice, read_index, read_slice_batches

log = logging.getLogger(__name__)

MULTIPART_BYTES = 32 << 20
PART_BYTES = 8 << 20
PREPARE_TTL_MS = 2 * 3_600_000  # a run must commit within this, or its objects are garbage


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    min_age_ms: int = 5 * 60_000  # leave young objects alone (they may still be read from cache)
    small_object_bytes: int = 16 << 20  # stream objects below this are merged
    target_bytes: int = 256 << 20  # size of the objects written
    force_split_age_ms: int = 2 * 3_600_000  # a lone stream-set object older than this is split anyway
    max_objects: int = 500  # source objects per run
    block_bytes: int = 512 << 10  # data block size inside the new objects


@dataclass(frozen=True, slots=True)
class Source:
    object_id: int
    object_size: int
    start_offset: int
    end_offset: int
    stream_bytes: int  # bytes of this stream in the object
    stream_set: bool


@dataclass(frozen=True, slots=True)
class CompactionTask:
    stream_id: int
    topic: str
    partition: int
    floor: int  # log start at planning: batches wholly below are not copied
    sources: tuple[Source, ...]

    @property
    def bytes(self) -> int:
        return sum(s.stream_bytes for s in self.sources)


@dataclass(slots=True)
class Rewritten:
    task: CompactionTask
    object_id: int
    object_size: int
    start_offset: int
    end_offset: int


@dataclass(slots=True)
class CompactionReport:
    planned: int = 0
    committed: int = 0
    lost: int = 0
    source_objects: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    key_stats: dict[str, int] = field(default_factory=dict)  # key compaction: keyclean.CleanStats summed


# --------------------------------------------------------------------------- planning


async def _stream_bytes(store: ObjectStore, obj: ObjectMetadata) -> dict[int, int]:
    """Bytes per stream in an object, from its index (one ranged GET)."""
    out: dict[int, int] = {}
    for e in (await read_index(store, object_key(obj.object_id), obj.object_size)).entries:
        out[e.stream_id] = out.get(e.stream_id, 0) + e.size
    return out


async def plan_async(
    location: ClusterLocation, settings: CompactionSettings, now_ms: int | None = None
) -> list[CompactionTask]:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    view = await ClusterView.load_async(location)
    candidates: dict[int, ObjectMetadata] = {}

    def candidate(obj: ObjectMetadata) -> bool:
        if now_ms - obj.committed_at_ms < settings.min_age_ms:
            return False
        return obj.object_type == ObjectType.STREAM_SET or obj.object_size < settings.small_object_bytes

    for t in view.topics.values():
        for p in t.partitions:
            for obj in p.objects:
                if candidate(obj):
                    candidates[obj.object_id] = obj
    store = open_object_store(location.object_store_url)
    try:
        sem = asyncio.Semaphore(16)

        async def sized(obj: ObjectMetadata) -> tuple[int, dict[int, int]]:
            if obj.object_type == ObjectType.STREAM:
                return obj.object_id, {rg.stream_id: obj.object_size for rg in obj.ranges}
            async with sem:
                return obj.object_id, await _stream_bytes(store, obj)

        sizes = dict(await asyncio.gather(*(sized(o) for o in candidates.values())))
    finally:
        await store.close()

    tasks: list[CompactionTask] = []
    budget = [settings.max_objects]
    for t in sorted(view.topics.values(), key=lambda t: t.name):
        for p in t.partitions:
            sources = []
            for obj in p.objects:
                rg = next((r for r in obj.ranges if r.stream_id == p.stream_id), None)
                if rg is None:
                    continue
                stream_bytes = sizes.get(obj.object_id, {}).get(p.stream_id, obj.object_size)
                src = Source(
                    obj.object_id,
                    obj.object_size,
                    rg.start_offset,
                    rg.end_offset,
                    stream_bytes,
                    obj.object_type == ObjectType.STREAM_SET,
                )
                sources.append((src, candidates.get(obj.object_id)))
            for run in _runs(sources, settings, now_ms, budget):
                tasks.append(CompactionTask(p.stream_id, t.name, p.partition, p.start_offset, tuple(run)))
    return tasks


def _runs(
    sources: list[tuple[Source, ObjectMetadata | None]], settings: CompactionSettings, now_ms: int, budget: list[int]
) -> list[list[Source]]:
    """Runs of contiguous candidate sources (candidate: its metadata is given), each at most
    target_bytes; a run is worth it with 2+ sources, or one old stream-set object to split.
    `budget` counts down the source objects this job may still take: a run is cut where the
    budget ends (its first sources are still contiguous), never skipped for being longer, or a
    backlog of more small objects than one job's budget would never be compacted at all."""
    out: list[list[Source]] = []
    run: list[tuple[Source, ObjectMetadata]] = []

    def close() -> None:
        take = run[: budget[0]]
        lone_old_set = (
            len(take) == 1
            and take[0][0].stream_set
            and now_ms - take[0][1].committed_at_ms >= settings.force_split_age_ms
        )
        if len(take) >= 2 or lone_old_set:
            out.append([src for src, _ in take])
            budget[0] -= len(take)
        run.clear()

    for src, meta in sources:
        contiguous = not run or run[-1][0].end_offset == src.start_offset
        if meta is None or not contiguous:
            close()
            if meta is None:
                continue
        if run and (
            sum(s.stream_bytes for s, _ in run) + src.stream_bytes > settings.target_bytes or len(run) >= budget[0]
        ):
            close()
        run.append((src, meta))
    close()
    return out


# --------------------------------------------------------------------------- rewriting (executors)


def rewrite(object_store_url: str, task: CompactionTask, object_id: int, block_bytes: int) -> Rewritten:
    """Copy the task's batches into one new stream object under `object_id`."""
    return asyncio.run(_rewrite(object_store_url, task, object_id, block_bytes))


async def _rewrite(object_store_url: str, task: CompactionTask, object_id: int, block_bytes: int) -> Rewritten:
    store = open_object_store(object_store_url)
    try:
        writer = ObjectWriter(block_bytes)
        for src in task.sources:
            sl = ObjectSlice(src.object_id, src.object_size, task.stream_id, src.start_offset, src.end_offset)
            async for base, count, payload in read_slice_batches(store, sl):
                if base + count <= task.floor:
                    continue  # trimmed by retention: not worth copying
                writer.add_batch(task.stream_id, base, count, bytes(payload))
        [summary] = writer.streams
        parts = writer.finish()
        key = object_key(object_id)
        size = writer.total_size
        if size > MULTIPART_BYTES:
            await store.put_multipart(key, chunks(parts, PART_BYTES))
        else:
            await store.put(key, b"".join(parts))
        return Rewritten(task, object_id, size, summary.start_offset, summary.end_offset)
    finally:
        await store.close()


def chunks(parts: list[bytes | memoryview], size: int) -> list[bytes | memoryview]:
    out: list[bytes | memoryview] = []
    buf = bytearray()
    for p in parts:
        buf += p
        if len(buf) >= size:
            out.append(bytes(buf))
            buf.clear()
    if buf:
        out.append(bytes(buf))
    return out


# --------------------------------------------------------------------------- the job


async def prepare_ids(location: ClusterLocation, count: int) -> int:
    async with ControllerClient(list(location.controller_urls)) as client:
        return await client.prepare_objects(count, PREPARE_TTL_MS)


async def commit_all(location: ClusterLocation, results: list[Rewritten], report: CompactionReport) -> None:
    async with ControllerClient(list(location.controller_urls)) as client:
        for r in results:
            obj = StreamObject(
                r.object_id,
                r.object_size,
                r.task.stream_id,
                r.start_offset,
                r.end_offset,
                tuple(s.object_id for s in r.task.sources),
            )
            try:
                await client.commit_stream_object(obj, -1, -1)
            except ObjectConflictError as exc:
                # another compaction or a trim won; the written object expires with its id
                report.lost += 1
                log.info("compaction of stream %d lost: %s", r.task.stream_id, exc)
            except MetadataError as exc:
                report.errors.append(f"stream {r.task.stream_id}: {exc}")
            else:
                report.committed += 1
                report.source_objects += len(r.task.sources)
                report.bytes_written += r.object_size


def compact(
    spark,
    location: ClusterLocation,
    settings: CompactionSettings = CompactionSettings(),
    *,
    tasks: list[CompactionTask] | None = None,
) -> CompactionReport:
    """Plan (unless `tasks` are given), rewrite on executors, commit. Needs a controller."""
    if not location.controller_urls:
        raise ValueError("compaction commits through the controller: pass --controller (or a running --data-dir)")
    started = time.monotonic()
    if tasks is None:
        tasks = asyncio.run(plan_async(location, settings))
    report = CompactionReport(planned=len(tasks))
    if not tasks:
        report.seconds = time.monotonic() - started
        return report
    first = asyncio.run(prepare_ids(location, len(tasks)))
    url, block = location.object_store_url, settings.block_bytes
    jobs = [(first + i, t) for i, t in enumerate(tasks)]
    parallelism = max(1, min(len(jobs), spark.sparkContext.defaultParallelism * 2))
    results = (
        spark.sparkContext.parallelize(jobs, parallelism).map(lambda job: rewrite(url, job[1], job[0], block)).collect()
    )
    asyncio.run(commit_all(location, results, report))
    report.seconds = time.monotonic() - started
    return report
