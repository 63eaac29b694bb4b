"""Upserts (`flatten_debezium` with `automq.table.topic.id.columns`) on the executors: the
latest image of an id across the whole run wins, and the table's older rows of every id the
run met go. The driver never holds a row: it plans, widens the schema, and commits.

One run, as Spark work:
1. map tasks (one per slice group, `bulkread.task_groups`): read, convert (Debezium flatten,
   JSON inference per task), and split the rows into buckets by a hash of the id columns;
   dead letters, open transactions and each task's schema go to the driver (small). The
   map output is persisted, so the driver's look at these does not read twice.
2. the driver: each partition's last stable offset (open transactions), the table created
   or widened once to hold every task's columns, and the table's current data files whose
   id-column bounds overlap the run's ids (Iceberg file stats) as rewrite candidates.
3. one task per candidate file reads its id columns and sends (id, row position) to the
   id's bucket; a cogroup brings every bucket's new rows and old ids to one reduce task,
   which keeps each id's latest image (partition, offset order) below the last stable
   offsets, writes the new data files, and names the rows of the old files it replaces.
4. one task per affected old file rewrites it without those rows (copy-on-write: no
   delete files, so DuckDB over the snapshot's files and small-file compaction stay right).
5. the driver commits ONE overwrite snapshot (old files out, rewritten and new ones in) with
   the offsets, required to sit on the snapshot it planned from (ingest.py): a run killed
   before it leaves only unreferenced files, and of two racing runs one commit loses.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata

from automq.spark import iceberg, lakeschema
from automq.spark.cluster import ClusterLocation, ClusterView
from automq.spark.convert import DLQ_SCHEMA, META_PREFIX, ConversionError, TableSettings, convert
from automq.spark.lakewrite import (
    WriteResult,
    WrittenFile,
    align,
    cut_at_open_transactions,
    dead_below,
    from_ipc,
    last_stable_ends,
    to_ipc,
    write_partitions,
)
from automq.spark.reader import ROW_SCHEMA
from automq.spark.source import DEFAULT_MAX_BYTES_PER_PARTITION, SliceGroup, plan_slices, read_group, with_lookahead

log = logging.getLogger(__name__)

PARTITION, OFFSET, OP = f"{META_PREFIX}partition", f"{META_PREFIX}offset", f"{META_PREFIX}op"
_POS, _FILE = "__automq_pos", "__automq_file"


def applies(settings: TableSettings) -> bool:
    """Whether a table is an upsert table: only Debezium envelopes carry deletes and updates."""
    return bool(settings.id_columns) and settings.transform == "flatten_debezium"


def buckets(rows: pa.Table, id_columns: tuple[str, ...], n: int) -> pa.Array:
    """The bucket of each row: a hash of its ids' text form, the same in every task whatever
    type a task inferred for them (JSON 1 and 1.0 both read "1")."""
    text = pa.table([pc.cast(rows[c], pa.string()) for c in id_columns], names=list(id_columns))
    df = pl.from_arrow(text)
    assert isinstance(df, pl.DataFrame)
    return df.select(pl.struct(list(id_columns)).hash(seed=0) % n).to_series().to_arrow()


def _split(rows: pa.Table, id_columns: tuple[str, ...], n: int) -> Iterator[tuple[int, pa.Table]]:
    of = buckets(rows, id_columns, n)
    for b in pc.unique(of).to_pylist():
        yield b, rows.filter(pc.equal(of, b))


@dataclass(frozen=True, slots=True)
class MapTask:
    group: SliceGroup
    settings: TableSettings
    buckets: int


@dataclass(slots=True)
class MapSide:
    """What a map task tells the driver (never rows)."""

    dead: bytes = b""
    open_transactions: dict[int, int] = field(default_factory=dict)
    error: str = ""
    schema: bytes = b""
    bounds: tuple | None = None  # (min, max) of each id column, for pruning old files
    seconds: dict[str, float] = field(default_factory=dict)


def map_task(task: MapTask) -> Iterator[tuple]:
    """("rows", bucket, Arrow IPC) per bucket, then ("side", MapSide)."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    g, ids = task.group, task.settings.id_columns
    batches = list(read_group(g.object_store_url, g.slices, g.lookahead, g.report_open))
    rows = pa.Table.from_batches(batches, ROW_SCHEMA) if batches else ROW_SCHEMA.empty_table()
    rows, open_transactions = cut_at_open_transactions(rows)
    side = MapSide(open_transactions=open_transactions)
    side.seconds["read"] = time.perf_counter() - t0
    try:
        # no latest-per-id here: an image past a last stable offset found by another task
        # must not have replaced the one before it (the reduce tasks pick, after the cut).
        # Records whose image has no id go to the dead letters or fail, per errors.tolerance.
        converted = convert(rows, task.settings, merge_ids=False)
    except ConversionError as exc:
        side.error = str(exc)
        yield ("side", side)
        return
    if converted.dead.num_rows:
        side.dead = to_ipc(converted.dead.cast(DLQ_SCHEMA))
    good = converted.rows
    if good.num_rows:
        side.schema = good.schema.serialize().to_pybytes()
        side.bounds = tuple((b["min"], b["max"]) for b in (pc.min_max(good[c]).as_py() for c in ids))
        for b, part in _split(good, ids, task.buckets):
            yield ("rows", b, to_ipc(part))
    side.seconds["convert"] = time.perf_counter() - t0 - side.seconds["read"]
    side.seconds["cpu"] = time.process_time() - cpu0
    yield ("side", side)


def _read_file(metadata: TableMetadata, io_properties: dict[str, str], data_file: DataFile, columns=None) -> pa.Table:
    """A data file's rows in file order, in the table's current schema (or those columns)."""
    schema = metadata.schema()
    if columns is not None:
        schema = schema.select(*columns)
    io = load_file_io(io_properties, metadata.location)
    return ArrowScan(metadata, io, schema, AlwaysTrue()).to_table([FileScanTask(data_file)])


@dataclass(frozen=True, slots=True)
class OldIdsTask:
    index: int  # of the candidate file in the driver's plan
    data_file: DataFile
    metadata: TableMetadata
    io_properties: dict[str, str]
    id_columns: tuple[str, ...]
    buckets: int


def old_ids_task(task: OldIdsTask) -> Iterator[tuple[int, bytes]]:
    """(bucket, Arrow IPC of the ids, row positions and file index) of one old data file."""
    ids = _read_file(task.metadata, task.io_properties, task.data_file, task.id_columns)
    ids = ids.append_column(_POS, pa.array(range(ids.num_rows), pa.int64()))
    ids = ids.append_column(_FILE, pa.array([task.index] * ids.num_rows, pa.int32()))
    for c in task.id_columns:  # a null id replaces nothing (as a delete by id never matches null)
        ids = ids.filter(pc.is_valid(ids[c]))
    if ids.num_rows:
        for b, part in _split(ids, task.id_columns, task.buckets):
            yield b, to_ipc(part)


@dataclass(frozen=True, slots=True)
class ReduceParams:
    metadata: TableMetadata
    io_properties: dict[str, str]
    id_columns: tuple[str, ...]
    end: dict[int, int]  # per partition: rows at or past it are the next run's


def reduce_task(params: ReduceParams, item: tuple) -> list[tuple]:
    """One bucket: its ids' latest images written as data files ("file", WrittenFile, cpu) and
    the rows of old files they replace ("drop", file index, positions)."""
    cpu0 = time.process_time()
    _bucket, (new_blobs, old_blobs) = item
    schema = params.metadata.schema().as_arrow()
    pieces = [align(from_ipc(b), schema) for b in new_blobs]
    out: list[tuple] = []
    if not pieces:
        return out
    rows = pa.concat_tables(pieces)
    df = pl.from_arrow(rows)
    assert isinstance(df, pl.DataFrame)
    ends = pl.DataFrame({PARTITION: list(params.end), "__end": list(params.end.values())}).cast(
        {PARTITION: df.schema[PARTITION], "__end": pl.Int64}
    )
    df = df.join(ends, on=PARTITION, how="left").filter(pl.col(OFFSET) < pl.col("__end")).drop("__end")
    ids = list(params.id_columns)
    latest = df.sort(PARTITION, OFFSET).unique(subset=ids, keep="last", maintain_order=True)
    upserted = latest.filter(pl.col(OP).is_null() | (pl.col(OP) != "d")).to_arrow()
    io = load_file_io(params.io_properties, params.metadata.location)
    out += [("file", f) for f in write_partitions(params.metadata, io, upserted, schema, META_PREFIX)]
    met = latest.select(ids).drop_nulls()
    old_parts = [from_ipc(b) for b in old_blobs]
    if old_parts and met.height:
        old = pl.from_arrow(pa.concat_tables(old_parts))
        assert isinstance(old, pl.DataFrame)
        old = old.cast({c: met.schema[c] for c in ids}, strict=False)
        hit = old.join(met, on=ids, how="semi")
        for (index,), part in hit.group_by([_FILE]):
            out.append(("drop", int(index), sorted(part[_POS].to_list())))
    out.append(("cpu", time.process_time() - cpu0))
    return out


@dataclass(frozen=True, slots=True)
class RewriteTask:
    index: int
    data_file: DataFile
    drop: tuple[int, ...]  # row positions
    metadata: TableMetadata
    io_properties: dict[str, str]


def rewrite_task(task: RewriteTask) -> tuple[int, list[DataFile], float]:
    """The old file without the replaced rows, as new file(s) (none when nothing is left)."""
    cpu0 = time.process_time()
    rows = _read_file(task.metadata, task.io_properties, task.data_file)
    keep = pc.invert(pc.is_in(pa.array(range(rows.num_rows), pa.int64()), pa.array(task.drop, pa.int64())))
    kept = align(rows.filter(keep), task.metadata.schema().as_arrow())
    if not kept.num_rows:
        return task.index, [], time.process_time() - cpu0
    io = load_file_io(task.io_properties, task.metadata.location)
    files = list(_dataframe_to_data_files(task.metadata, kept, io, uuid.uuid4(), itertools.count()))
    return task.index, files, time.process_time() - cpu0


def candidate_files(table: Table | None, bounds: Iterable[tuple | None], id_columns: tuple[str, ...]) -> list[DataFile]:
    """The table's current data files that may hold ids of the run: by every id column's file
    bounds (Iceberg column stats), a file is a candidate only if, for each id column, its
    [lower, upper] overlaps the run's [min, max] of that column; the reduce tasks find the
    actual rows. `bounds`: each map task's ((min, max) per id column) or None."""
    if table is None or table.current_snapshot() is None:
        return []
    known = [b for b in bounds if b is not None]
    if not known:
        return []
    terms = []
    for i, column in enumerate(id_columns):
        try:
            lo, hi = min(b[i][0] for b in known), max(b[i][1] for b in known)
        except TypeError:  # typed apart across tasks (1 and "a"): this column does not prune
            log.info("%s: upsert candidates not pruned by %s (its ids are typed apart)", table.name(), column)
            continue
        terms += [GreaterThanOrEqual(term=column, value=lo), LessThanOrEqual(term=column, value=hi)]
    try:
        scan = table.scan(row_filter=And(*terms) if len(terms) > 1 else AlwaysTrue())
        return [t.file for t in scan.plan_files()]
    except Exception as exc:  # a bound the column's type does not take: no pruning, still right
        log.info("%s: upsert candidates not pruned by id bounds (%s)", table.name(), exc)
        return [t.file for t in table.scan().plan_files()]


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
    widen: Callable[[list[pa.Schema]], Table],
) -> WriteResult:
    """Executors upsert `topic`'s records in [start, end) into `table`'s location (see the
    module docstring); nothing is committed here. The result's `files` are the new rows'
    files, `rewritten` the old files' copies and `replaced` the old files they stand for."""
    from pyspark import StorageLevel

    from automq.spark import lakewrite

    view = view or ClusterView.load(location, [topic])
    slices = plan_slices(view, [topic], {topic: start}, {topic: end})
    if not slices:
        return WriteResult([], DLQ_SCHEMA.empty_table(), dict(end), table)
    sc = spark.sparkContext
    n = max(1, sc.defaultParallelism)
    cut = lakewrite.task_groups(slices, n, max_bytes)
    tasks = [
        MapTask(SliceGroup(location.object_store_url, tuple(g), ahead, True), settings, n)
        for g, ahead in zip(cut, with_lookahead(cut, slices), strict=True)
    ]
    mapped = sc.parallelize(tasks, len(tasks)).flatMap(map_task).persist(StorageLevel.MEMORY_AND_DISK)
    written: list[WrittenFile] = []
    rewritten: list[WrittenFile] = []
    t0 = time.perf_counter()
    try:
        sides: list[MapSide] = mapped.filter(lambda r: r[0] == "side").map(lambda r: r[1]).collect()
        result = WriteResult([], DLQ_SCHEMA.empty_table(), dict(end), table, len(tasks))
        for s in sides:
            for step, secs in s.seconds.items():
                result.task_seconds[step] += secs
        errors = [s.error for s in sides if s.error]
        if errors:
            raise ConversionError(errors[0])
        result.end = last_stable_ends(topic, end, (s.open_transactions for s in sides))
        result.dead = dead_below((s.dead for s in sides), result.end)
        schemas = [pa.ipc.read_schema(pa.py_buffer(s.schema)) for s in sides if s.schema]
        t1 = time.perf_counter()
        if not schemas:
            return result
        if table is None or any(lakeschema.needs_evolution(table.schema(), s) for s in schemas):
            table = widen(schemas)
        result.table = table
        old = candidate_files(table, (s.bounds for s in sides), settings.id_columns)
        metadata, io = table.metadata, iceberg.executor_io_properties(table)
        old_ids = sc.parallelize(
            # one Spark task per core, each reading its share of the files: a task per file
            # paid Spark's and a Python worker's per-task cost once per file (measured)
            [OldIdsTask(i, f, metadata, io, settings.id_columns, n) for i, f in enumerate(old)],
            max(1, min(len(old), n)),
        ).flatMap(old_ids_task)
        new_rows = mapped.filter(lambda r: r[0] == "rows").map(lambda r: (r[1], r[2]))
        params = ReduceParams(metadata, io, settings.id_columns, dict(result.end))
        reduced = new_rows.cogroup(old_ids, numPartitions=n).flatMap(lambda item: reduce_task(params, item)).collect()
        t2 = time.perf_counter()
        drops: dict[int, list[int]] = {}
        for kind, *rest in reduced:
            if kind == "file":
                written.append(rest[0])
            elif kind == "drop":
                drops.setdefault(rest[0], []).extend(rest[1])
            else:
                result.task_seconds["cpu"] += rest[0]
        result.files = written
        if drops:
            rewrites = [RewriteTask(i, old[i], tuple(sorted(p)), metadata, io) for i, p in sorted(drops.items())]
            for index, files, cpu in sc.parallelize(rewrites, min(len(rewrites), n)).map(rewrite_task).collect():
                rewritten += [WrittenFile(f, -1, -1, -1) for f in files]
                result.replaced.append(old[index])
                result.task_seconds["cpu"] += cpu
        result.rewritten = rewritten
        log.info(
            "%s: upsert: map %.2fs (%d tasks), shuffle and reduce %.2fs (%d old files read), rewrite %.2fs (%d files)",
            topic,
            t1 - t0,
            len(tasks),
            t2 - t1,
            len(old),
            time.perf_counter() - t2,
            len(drops),
        )
        return result
    except BaseException:
        lakewrite.delete_files(table, written + rewritten)
        raise
    finally:
        mapped.unpersist()
