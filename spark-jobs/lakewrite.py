"""Lake ingestion's data path on the executors: every Spark task reads its planned object
slices (the data source's reader), converts them (convert.py) and writes the table's Parquet
data files itself, with Iceberg field ids, into the table's location. Only the files'
metadata (path, size, record count, column stats, partition values, the Kafka offsets they
hold), the dead letters and the open transactions go back to the driver, which commits all
files in ONE snapshot with the offsets (ingest.py).

Why: a profile of the earlier path (driver collects every decoded row as Arrow, then writes
alone) put most of an ingestion run in shipping the rows from the Python workers through the
JVM to the driver, and left the write on one core (docs/benchmarks.md).

Every value conversion takes this path except upserts (`flatten_debezium` with
`id.columns`: the latest image of an id across the whole run wins and older rows of the
table are deleted), which lakeupsert.py runs on the executors with a shuffle. JSON tables infer their schema per task
(lakeschema.py): a task whose columns the table already has writes at once; the others
report their schema, the driver widens the table once and those tasks run again.

Every file holds rows of ONE Kafka partition, so the driver can still cut each partition at
its last stable offset after the fact: a task that meets a transaction with no marker up to
the planned end leaves out its own rows from that offset on and reports it; the driver drops
(and deletes) whole files of later tasks that start at or past it. Files written by a run
that dies or loses its commit are referenced by no snapshot: the run deletes them when it
loses, `lakefiles.remove_orphans` when it died.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import _dataframe_to_data_files  # pyiceberg's own writer (field ids, stats, partitions)
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from automq.spark import iceberg, lakeschema
from automq.spark.bulkread import task_groups
from automq.spark.cluster import ClusterLocation, ClusterView
from automq.spark.convert import DLQ_SCHEMA, META_PREFIX, ConversionError, TableSettings, convert
from automq.spark.reader import OPEN_TRANSACTION, ROW_SCHEMA
from automq.spark.source import (
    DEFAULT_MAX_BYTES_PER_PARTITION,
    SliceGroup,
    plan_slices,
    read_group,
    with_lookahead,
)

log = logging.getLogger(__name__)


def on_executors(settings: TableSettings) -> bool:
    """Whether a topic's rows are converted and written by the executors: all of them
    (upserts through lakeupsert.py); the driver path stays for comparison (spark_bench)."""
    return True


@dataclass(frozen=True, slots=True)
class WrittenFile:
    data_file: DataFile
    partition: int  # Kafka partition of every row in it
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class WriteTask:
    """What one Spark task does: read a slice group, convert it, write it into the table."""

    group: SliceGroup
    metadata: TableMetadata | None  # None: a JSON table not created yet (the task only infers)
    io_properties: dict[str, str]
    settings: TableSettings


@dataclass(slots=True)
class TaskOutput:
    files: list[WrittenFile] = field(default_factory=list)
    dead: bytes = b""  # DLQ_SCHEMA rows as an Arrow IPC stream (empty: none)
    open_transactions: dict[int, int] = field(default_factory=dict)  # partition -> first open offset
    error: str = ""  # a ConversionError's message (errors.tolerance=none)
    schema: bytes = b""  # JSON: the rows' Arrow schema, when the table must widen first (nothing written)
    seconds: dict[str, float] = field(default_factory=dict)  # read, convert, write (wall), cpu: for the log


@dataclass(slots=True)
class WriteResult:
    """What the executors wrote for a range, cut at each partition's last stable offset."""

    files: list[WrittenFile]
    dead: pa.Table  # DLQ_SCHEMA
    end: dict[int, int]  # the planned ends, lowered to open transactions
    table: Table | None = None  # the table written into (JSON: maybe created or widened on the way)
    tasks: int = 0
    rerun_tasks: int = 0  # JSON: tasks that met new columns and ran again after the widening
    task_seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("read", "convert", "write", "cpu"), 0.0)
    )
    # upserts (lakeupsert.py): copies of old data files without the replaced rows, and the
    # old files they replace in the commit
    rewritten: list[WrittenFile] = field(default_factory=list)
    replaced: list[DataFile] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(f.data_file.record_count for f in self.files)


def cut_at_open_transactions(rows: pa.Table) -> tuple[pa.Table, dict[int, int]]:
    """The rows without the open-transaction reports (reader.py) and without each reporting
    partition's rows from its first open offset on; and those offsets."""
    is_open = pc.equal(rows["timestamp_type"], OPEN_TRANSACTION)
    if not pc.any(is_open).as_py():
        return rows, {}  # the usual case: no copy of the rows
    opens = rows.filter(is_open)
    rows = rows.filter(pc.invert(is_open))
    first: dict[int, int] = {}
    for p, o in zip(opens["partition"].to_pylist(), opens["offset"].to_pylist(), strict=True):
        first[p] = min(o, first.get(p, o))
    for p, lso in first.items():
        rows = rows.filter(pc.or_(pc.not_equal(rows["partition"], p), pc.less(rows["offset"], lso)))
    return rows, first


def align(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """The rows with the table's columns in order (nulls for columns they lack)."""
    cols = []
    for f in schema:
        if f.name in rows.column_names:
            cols.append(rows[f.name].cast(f.type) if rows[f.name].type != f.type else rows[f.name])
        else:
            cols.append(pa.nulls(rows.num_rows, f.type))
    return pa.table(cols, schema=pa.schema([f.with_nullable(True) for f in schema]))


def by_partition(rows: pa.Table, column: str) -> list[tuple[int, pa.Table]]:
    """The rows of each Kafka partition. A task holds every partition of its objects
    (bulkread.task_groups) and reads them stream by stream, so each partition's rows are
    usually one run: zero-copy slices then, a filtering copy per partition otherwise."""
    if not rows.num_rows:
        return []
    runs = pc.run_end_encode(rows[column].combine_chunks())
    values, ends = runs.values.to_pylist(), runs.run_ends.to_pylist()
    if len(set(values)) == len(values):
        starts = [0, *ends[:-1]]
        return [(p, rows.slice(lo, hi - lo)) for p, lo, hi in zip(values, starts, ends, strict=True)]
    return [(p, rows.filter(pc.equal(rows[column], p))) for p in pc.unique(rows[column]).to_pylist()]


def to_ipc(table: pa.Table) -> bytes:
    """A table as Arrow IPC stream bytes: what tasks hand the driver (or each other)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(blob).read_all()


def write_partitions(
    metadata: TableMetadata, io, rows: pa.Table, schema: pa.Schema, prefix: str = ""
) -> list[WrittenFile]:
    """On an executor: the rows as data files of the table, one file set per Kafka partition
    (its `{prefix}partition` column), each with the partition's offset bounds."""
    out = []
    write_uuid, counter = uuid.uuid4(), itertools.count()
    for p, mine in by_partition(rows, f"{prefix}partition"):
        bounds = pc.min_max(mine[f"{prefix}offset"]).as_py()
        for data_file in _dataframe_to_data_files(metadata, align(mine, schema), io, write_uuid, counter):
            out.append(WrittenFile(data_file, p, bounds["min"], bounds["max"]))
    return out


def last_stable_ends(topic: str, end: dict[int, int], open_transactions: Iterable[dict[int, int]]) -> dict[int, int]:
    """`end` lowered, per partition, to the first offset of a transaction the tasks found open."""
    end = dict(end)
    for opens in open_transactions:
        for p, lso in opens.items():
            if lso < end[p]:
                log.info("%s-%d: a transaction is open at offset %d; ingesting up to it", topic, p, lso)
                end[p] = lso
    return end


def dead_below(blobs: Iterable[bytes], end: dict[int, int]) -> pa.Table:
    """The tasks' dead letters (Arrow IPC) of records below each partition's end (those past
    it are the next run's)."""
    parts = [from_ipc(b) for b in blobs if b]
    dead = pa.concat_tables(parts) if parts else DLQ_SCHEMA.empty_table()
    if dead.num_rows:
        below = [o < end[p] for p, o in zip(dead["partition"].to_pylist(), dead["offset"].to_pylist(), strict=True)]
        dead = dead.filter(pa.array(below, pa.bool_()))
    return dead


def run_task(task: WriteTask) -> TaskOutput:
    """On an executor: read, convert, write one file set per Kafka partition."""
    g = task.group
    t0, cpu0 = time.perf_counter(), time.process_time()
    batches = list(read_group(g.object_store_url, g.slices, g.lookahead, g.report_open))
    rows = pa.Table.from_batches(batches, ROW_SCHEMA) if batches else ROW_SCHEMA.empty_table()
    rows, open_transactions = cut_at_open_transactions(rows)
    out = TaskOutput(open_transactions=open_transactions)
    t1 = time.perf_counter()
    out.seconds["read"] = t1 - t0
    try:
        converted = convert(rows, task.settings)
    except ConversionError as exc:
        out.error = str(exc)
        return out
    t2 = time.perf_counter()
    out.seconds["convert"] = t2 - t1
    if converted.dead.num_rows:
        out.dead = to_ipc(converted.dead.cast(DLQ_SCHEMA))
    good = converted.rows
    if not good.num_rows:
        return out
    metadata = task.metadata
    if metadata is None or (task.settings.has_fields and lakeschema.needs_evolution(metadata.schema(), good.schema)):
        out.schema = good.schema.serialize().to_pybytes()
        out.seconds["cpu"] = time.process_time() - cpu0
        return out
    io = load_file_io(task.io_properties, metadata.location)
    # JSON tables' own fields take the plain names; their Kafka columns are prefixed
    prefix = META_PREFIX if task.settings.has_fields else ""
    out.files = write_partitions(metadata, io, good, metadata.schema().as_arrow(), prefix)
    out.seconds["write"] = time.perf_counter() - t2
    out.seconds["cpu"] = time.process_time() - cpu0
    return out


def spark_tasks(groups: int, parallelism: int) -> int:
    """How many Spark tasks run the groups: one per core, each taking its share of the groups
    one after the other. A group's memory is released before the next one starts, so a task
    holds one group (<= max_bytes) at a time, while the job pays Spark's per-task cost
    (~40 ms each, measured) once per core instead of once per group."""
    return max(1, min(groups, parallelism))


def write_range(
    spark,
    location: ClusterLocation,
    topic: str,
    start: dict[int, int],
    end: dict[int, int],
    table: Table | None,
    settings: TableSettings,
    *,
    view: ClusterView | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES_PER_PARTITION,
    widen: Callable[[list[pa.Schema]], Table] | None = None,
) -> WriteResult:
    """Executors write `topic`'s records in [start, end) into `table`'s location (read_committed,
    each partition up to its last stable offset); nothing is committed here. `view`: the
    cluster's metadata with objects, when the caller has it already. JSON tables: `table` is
    None when it does not exist yet, and `widen(schemas)` (required then) makes the table hold
    rows of the schemas tasks reported (creating it if need be) and returns it; the reporting
    tasks then run again (lakeschema.py)."""
    view = view or ClusterView.load(location, [topic])
    slices = plan_slices(view, [topic], {topic: start}, {topic: end})
    if not slices:
        return WriteResult([], DLQ_SCHEMA.empty_table(), dict(end), table)
    cut = task_groups(slices, spark.sparkContext.defaultParallelism, max_bytes)
    groups = [
        SliceGroup(location.object_store_url, tuple(g), ahead, True)
        for g, ahead in zip(cut, with_lookahead(cut, slices), strict=True)
    ]
    outputs = _run(spark, groups, table, settings)
    ran = list(outputs)  # both passes, for the task time report
    reported = [i for i, o in enumerate(outputs) if o.schema]
    if reported and not any(o.error for o in outputs):
        written = [f for o in outputs for f in o.files]
        try:
            if widen is None:
                raise RuntimeError(f"{topic}: tasks met columns the table lacks and nothing may widen it")
            table = widen([pa.ipc.read_schema(pa.py_buffer(outputs[i].schema)) for i in reported])
            log.info("%s: table widened for %d task(s); running them again", topic, len(reported))
            again = _run(spark, [groups[i] for i in reported], table, settings)
        except BaseException:
            delete_files(table, written)
            raise
        ran += again
        for i, o in zip(reported, again, strict=True):
            outputs[i] = o
        if any(o.schema for o in again):
            delete_files(table, [f for o in outputs for f in o.files])
            raise RuntimeError(f"{topic}: the widened table still lacks columns tasks met")
    written = [f for o in outputs for f in o.files]
    errors = [o.error for o in outputs if o.error]
    if errors:
        delete_files(table, written)
        raise ConversionError(errors[0])
    end = last_stable_ends(topic, end, (o.open_transactions for o in outputs))
    keep, drop = [], []
    for f in written:
        if f.first_offset >= end[f.partition]:
            drop.append(f)  # a later task's rows past the last stable offset: the next run's
        elif f.first_offset < start[f.partition] or f.last_offset >= end[f.partition]:
            delete_files(table, written)
            raise RuntimeError(
                f"partition {f.partition}: a task wrote offsets [{f.first_offset}, {f.last_offset}] "
                f"outside the plan [{start[f.partition]}, {end[f.partition]})"
            )
        else:
            keep.append(f)
    if drop:
        log.info("%s: dropped %d data file(s) past the last stable offset: the next run writes them", topic, len(drop))
        delete_files(table, drop)
    result = WriteResult(keep, dead_below((o.dead for o in outputs), end), end, table, len(groups), len(reported))
    for o in ran:
        for step, secs in o.seconds.items():
            result.task_seconds[step] += secs
    return result


def _run(spark, groups: list[SliceGroup], table: Table | None, settings: TableSettings) -> list[TaskOutput]:
    metadata, io = (table.metadata, iceberg.executor_io_properties(table)) if table is not None else (None, {})
    tasks = [WriteTask(g, metadata, io, settings) for g in groups]
    slots = spark_tasks(len(tasks), spark.sparkContext.defaultParallelism)
    return spark.sparkContext.parallelize(tasks, slots).map(run_task).collect()


def delete_files(table: Table | None, files: list[WrittenFile]) -> None:
    """Best effort: what is left behind is an orphan `lakefiles.remove_orphans` deletes later.
    (No table: nothing can have been written.)"""
    if table is None:
        return
    for f in files:
        try:
            table.io.delete(f.data_file.file_path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("%s: could not delete unused data file %s: %s", table.name(), f.data_file.file_path, exc)
