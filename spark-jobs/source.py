"""The `automq` PySpark data source: topics read straight from the object store.

    spark.dataSource.register(AutoMQDataSource)        # automq.spark.session does this
    df = (spark.read.format("automq")
          .option("topic", "orders")                    # or "topics": "a,b"
          .option("controller", "http://127.0.0.1:9093")  # or "dataDir", or only "objectStore"
          .option("objectStore", "s3://bucket?endpoint=...")
          .option("startingOffsets", '{"orders": {"0": 100}}')  # default: earliest
          .load())

Columns: topic, partition, offset, timestamp, timestamp_type, key, value, headers.

The driver plans from the controller's metadata (or the metadata log in the store when no
controller is given): one input partition per group of object slices, each slice an offset
range of one stream in one object. Executors fetch them with ranged GETs through
`automq.broker.objectstore` and decode batches into Arrow record batches.

Only data committed to objects is visible: what brokers hold only in their WAL (at most one
upload interval of recent records) appears on a later read. Offsets below a partition's log
start (retention) are not returned.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from automq.broker.objectstore import open_object_store
from automq.broker.storage.objects.format import ObjectIndex
from automq.spark.cluster import ClusterLocation, ClusterView, PartitionView
from automq.spark.reader import ROW_DDL, ObjectSlice, read_stream_arrow

DEFAULT_MAX_BYTES_PER_PARTITION = 64 << 20


class SourceOptionError(ValueError):
    """A bad option of the automq data source; the message names it."""


LOOKAHEAD_SLICES = 1024  # a task looks this far past its range for its transactions' markers


@dataclass(frozen=True)
class SliceGroup(InputPartition):
    object_store_url: str
    slices: tuple[ObjectSlice, ...]
    # per stream of the group: the planned slices after the group's last one of that stream
    lookahead: tuple[tuple[int, tuple[ObjectSlice, ...]], ...] = ()
    report_open: bool = False


def parse_offsets(text: str | None, name: str) -> dict[str, dict[int, int]] | str:
    """Kafka-source style offsets: "earliest" | "latest" | {"topic": {"0": 12, "1": -2}}
    (-2 = earliest, -1 = latest)."""
    if text is None:
        return "earliest" if name == "startingOffsets" else "latest"
    text = text.strip()
    if text in ("earliest", "latest"):
        return text
    try:
        raw = json.loads(text)
        return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in raw.items()}
    except (ValueError, AttributeError, TypeError):
        raise SourceOptionError(
            f'option {name}: expected "earliest", "latest" or JSON like {{"topic": {{"0": 42}}}}, got {text!r}'
        ) from None


def _bound(spec: dict[str, dict[int, int]] | str, p: PartitionView, default: str) -> int:
    value: int | str = spec if isinstance(spec, str) else spec.get(p.topic, {}).get(p.partition, default)
    if value in ("earliest", -2):
        return p.start_offset
    if value in ("latest", -1):
        return p.end_offset
    return min(max(int(value), p.start_offset), p.end_offset)


def plan_slices(
    view: ClusterView,
    topics: list[str],
    starting: dict[str, dict[int, int]] | str = "earliest",
    ending: dict[str, dict[int, int]] | str = "latest",
) -> list[ObjectSlice]:
    """Object slices covering each partition's [start, end) in offset order."""
    out = []
    for name in topics:
        for p in view.topic(name).partitions:
            lo, hi = _bound(starting, p, "earliest"), _bound(ending, p, "latest")
            for obj, start, end in p.ranges():
                start, end = max(start, lo), min(end, hi)
                if start < end:
                    out.append(
                        ObjectSlice(obj.object_id, obj.object_size, p.stream_id, start, end, p.topic, p.partition)
                    )
    return out


def group_slices(slices: list[ObjectSlice], max_bytes: int) -> list[list[ObjectSlice]]:
    """The slices packed into tasks of about `max_bytes` (object size is the cost estimate: the
    index does not say how much of a stream-set object one stream holds), cut by object, so a
    task fetches and parses each object's tail once for all the partitions it holds (see
    `by_object`)."""
    return by_object(slices, lambda sizes: _pack(sizes, max_bytes))


def _pack(sizes: list[int], max_bytes: int) -> list[int]:
    """The task of each item: consecutive items, a new task once `max_bytes` would be passed."""
    out = []
    task, size = -1, 0
    for s in sizes:
        if task < 0 or size + s > max_bytes:
            task, size = task + 1, 0
        out.append(task)
        size += s
    return out


def by_object(slices: list[ObjectSlice], cut: Callable[[list[int]], list[int]]) -> list[list[ObjectSlice]]:
    """The slices in tasks, every slice of an object in the same task: `cut` maps the objects'
    sizes, in id (upload) order, to their task numbers (non-decreasing).

    A stream-set object holds slices of several partitions; the task that reads it reads all
    of them and fetches its tail once (`read_group` shares a task's parsed indexes), rather
    than once per partition. Each stream's slices must stay consecutive in its offset order
    across the tasks (transaction markers are looked for in the slices that follow a task's
    own, and ingestion drops later tasks' files past a last stable offset), so a plan whose
    objects' ids are not in offset order for every stream (compaction made objects out of
    order) is cut slice by slice in plan order instead."""
    if not slices:
        return []
    sizes: dict[int, int] = {}
    for sl in slices:
        sizes.setdefault(sl.object_id, sl.object_size)
    order = sorted(sizes)
    group_of = dict(zip(order, cut([sizes[o] for o in order]), strict=True))
    last: dict[int, int] = {}
    for sl in slices:
        g = group_of[sl.object_id]
        if g < last.get(sl.stream_id, 0):
            return _assign(slices, cut([sl.object_size for sl in slices]))
        last[sl.stream_id] = g
    return _assign(slices, [group_of[sl.object_id] for sl in slices])


def _assign(slices: list[ObjectSlice], at: list[int]) -> list[list[ObjectSlice]]:
    """Groups of the slices by task number, each in plan order."""
    groups: list[list[ObjectSlice]] = [[] for _ in range(max(at) + 1)]
    for sl, g in zip(slices, at, strict=True):
        groups[g].append(sl)
    return [g for g in groups if g]


def with_lookahead(groups: list[list[ObjectSlice]], slices: list[ObjectSlice]) -> list[tuple]:
    """For each group, per stream: the planned slices of that stream that follow the group's
    last slice of it (`slices`: the plan, each stream's slices in offset order)."""
    by_stream: dict[int, list[ObjectSlice]] = {}
    position: dict[int, int] = {}
    for sl in slices:
        mine = by_stream.setdefault(sl.stream_id, [])
        position[id(sl)] = len(mine)
        mine.append(sl)
    out = []
    for group in groups:
        last: dict[int, int] = {}
        for sl in group:
            last[sl.stream_id] = position[id(sl)]
        out.append(tuple((sid, tuple(by_stream[sid][i + 1 : i + 1 + LOOKAHEAD_SLICES])) for sid, i in last.items()))
    return out


def _runs(slices: tuple[ObjectSlice, ...]) -> list[list[ObjectSlice]]:
    runs: list[list[ObjectSlice]] = []
    for sl in slices:
        if runs and runs[-1][-1].stream_id == sl.stream_id:
            runs[-1].append(sl)
        else:
            runs.append([sl])
    return runs


def read_group(
    object_store_url: str,
    slices: tuple[ObjectSlice, ...],
    lookahead: tuple[tuple[int, tuple[ObjectSlice, ...]], ...] = (),
    report_open: bool = False,
) -> Iterator:
    """Arrow record batches of the slices, in order (drives the async store from sync code)."""
    loop = asyncio.new_event_loop()
    store = open_object_store(object_store_url)
    ahead = dict(lookahead)
    indexes: dict[int, ObjectIndex] = {}  # the streams of a group share objects: one tail read each
    try:
        for run in _runs(slices):
            gen = read_stream_arrow(
                store, run, ahead.get(run[0].stream_id, ()), report_open=report_open, indexes=indexes
            )
            while True:
                try:
                    batch = loop.run_until_complete(gen.__anext__())
                except StopAsyncIteration:
                    break
                yield batch
    finally:
        loop.run_until_complete(store.close())
        loop.close()


class AutoMQReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = {k.lower(): v for k, v in options.items()}  # Spark options are case-insensitive

    def _location(self) -> ClusterLocation:
        o = self.options
        return ClusterLocation.resolve(
            data_dir=o.get("datadir"), controller=o.get("controller"), object_store=o.get("objectstore")
        )

    def _topics(self) -> list[str]:
        raw = self.options.get("topic") or self.options.get("topics") or ""
        topics = [t.strip() for t in raw.split(",") if t.strip()]
        if not topics:
            raise SourceOptionError('the automq data source needs option "topic" (or "topics": "a,b")')
        return topics

    def partitions(self) -> list[InputPartition]:
        o = self.options
        location = self._location()
        topics = self._topics()
        starting = parse_offsets(o.get("startingoffsets"), "startingOffsets")
        ending = parse_offsets(o.get("endingoffsets"), "endingOffsets")
        try:
            max_bytes = int(o.get("maxbytesperpartition") or DEFAULT_MAX_BYTES_PER_PARTITION)
        except ValueError:
            raise SourceOptionError("option maxBytesPerPartition must be a number of bytes") from None
        view = ClusterView.load(location, topics)
        missing = [t for t in topics if t not in view.topics]
        if missing:
            raise SourceOptionError(f"topic(s) {', '.join(missing)} do not exist")
        report_open = (o.get("reportopentransactions") or "false").lower() == "true"
        slices = plan_slices(view, topics, starting, ending)
        groups = group_slices(slices, max_bytes)
        # Spark needs at least one partition; an empty one reads nothing
        return [
            SliceGroup(location.object_store_url, tuple(g), ahead, report_open)
            for g, ahead in zip(groups, with_lookahead(groups, slices), strict=True)
        ] or [SliceGroup(location.object_store_url, ())]

    def read(self, partition: InputPartition) -> Iterator:
        assert isinstance(partition, SliceGroup)
        yield from read_group(partition.object_store_url, partition.slices, partition.lookahead, partition.report_open)


class AutoMQDataSource(DataSource):
    """`spark.read.format("automq")`: see the module docstring for options."""

    @classmethod
    def name(cls) -> str:
        return "automq"

    def schema(self) -> str:
        return ROW_DDL

    def reader(self, schema) -> DataSourceReader:
        return AutoMQReader(dict(self.options))
