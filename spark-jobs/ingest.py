"""Lake ingestion (`automq spark ingest`): topics -> Iceberg tables, exactly once.

Which topics: those with `automq.table.topic.enable=true`, plus any named explicitly. Each
topic becomes the table `<automq.table.topic.namespace>.<topic>` (dots and dashes of the
topic name become underscores).

One round per table:
1. load the table; its current snapshot's `automq.offsets` says where it stands;
2. plan from the controller: each partition from that offset (or its log start) up to the
   committed end offset of its stream;
3. Spark tasks read their planned object slices straight from the object store, convert
   them and write the table's Parquet data files themselves, returning only the files'
   metadata (lakewrite.py). JSON tables: each task infers the schema of its own records; the
   tasks that met columns the table lacks report them instead of writing, the driver widens
   the table once (creating it on the first run) and those tasks run again (lakeschema.py).
   Upserts (flatten_debezium with id.columns: the latest image of an id across the whole run
   wins, and the table's older rows of those ids are deleted) shuffle the rows by id, and
   tasks write the new files and rewrite the old files holding replaced ids (lakeupsert.py);
4. commit ONE Iceberg transaction with those files, whose snapshot summary holds the
   new next offsets. The commit carries the requirement that the table's main branch is
   still the snapshot of step 1, so of two racing runs one loses; the loser re-plans from
   the winner's offsets (nothing is written twice, nothing skipped); on the executor path
   it first deletes the files its tasks wrote. A schema widening is its own metadata commit
   (no snapshot): a run that finds another run's commit after it re-plans as well.

A run killed after writing data files but before the commit leaves only unreferenced files:
the table still says the old offsets and the rerun writes that range again, once; the
orphans go with the next `--remove-orphans-older-than` cleanup (lakefiles.py).
Dead letters (errors.tolerance=all) go to `<table>_dlq`, committed BEFORE the main table
with their own offsets, so a rerun after a crash between the two commits skips the dead
letters it already wrote.

Records still only in a broker's WAL are not in objects yet and wait for the next run.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import And, EqualTo, In, Or
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from automq.spark import avroconvert, iceberg, lakefiles, lakeschema, lakeupsert, lakewrite
from automq.spark.bulkread import read_range
from automq.spark.cluster import ClusterLocation, ClusterView, TopicView
from automq.spark.convert import DLQ_SCHEMA, META_PREFIX, REGISTRY_CONVERSIONS, Converted, TableSettings, convert
from automq.spark.lakecompact import compact_files
from automq.spark.reader import ROW_SCHEMA

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
REGISTRY_URL_ENV = "AUTOMQ_SCHEMA_REGISTRY_URL"


@dataclass(slots=True)
class TableResult:
    topic: str
    table: str
    status: str  # "committed" | "up-to-date" | "skipped" | "failed"
    records: int = 0
    dead_letters: int = 0
    offsets: dict[int, int] = field(default_factory=dict)
    attempts: int = 0
    expired_snapshots: int = 0
    compacted_files: int = 0  # small data files rewritten by --compact-files-below
    removed_files: int = 0  # files no snapshot needs any more, deleted (lakefiles.py)
    message: str = ""
    task_cpu_seconds: float = 0.0  # CPU the executor tasks spent reading, converting, writing


def table_name(topic: str, settings: TableSettings) -> str:
    return f"{settings.namespace}.{topic.replace('.', '_').replace('-', '_')}"


def with_registry(settings: TableSettings, topic: str, url: str) -> TableSettings:
    """A by_schema_id / by_latest_schema topic's settings with the registry (and, for
    by_latest_schema, the latest schema id of its subject, looked up once for the run)."""
    if settings.convert not in REGISTRY_CONVERSIONS:
        return settings
    if not url:
        raise ValueError(
            f"{topic}: automq.table.topic.convert.value.type={settings.convert} needs a schema registry: "
            f"--schema-registry-url or ${REGISTRY_URL_ENV} (default: the controller, which serves one)"
        )
    latest = None
    if settings.convert == "by_latest_schema":
        latest = avroconvert.latest_schema_id(url, settings.value_subject or f"{topic}-value")
    return replace(settings, registry_url=url, latest_schema_id=latest)


def select_topics(view: ClusterView, explicit: list[str] | None, enabled_topics: bool = True) -> list[TopicView]:
    chosen = []
    if enabled_topics:
        chosen = [t for t in view.topics.values() if TableSettings.from_topic_configs(t.configs).enabled]
    for name in explicit or []:
        t = view.topic(name)  # KeyError names a missing topic
        if t not in chosen:
            chosen.append(t)
    return sorted(chosen, key=lambda t: t.name)


def ingest(
    spark,
    location: ClusterLocation,
    catalog: Catalog,
    topics: list[str] | None = None,
    *,
    force: bool = False,
    enabled_topics: bool = True,
    expire_snapshots_ms: int | None = None,
    compact_files_below: int | None = None,
    remove_orphans_ms: int | None = None,
    before_commit: Callable[[str, Table], None] | None = None,
    schema_registry_url: str | None = None,
) -> list[TableResult]:
    """One ingestion run over the chosen topics. `before_commit(table_name, table)` runs
    after the data files are written and before the commit (tests crash there).
    `enabled_topics=False`: only the topics named in `topics`. `expire_snapshots_ms`: after
    each table's round, drop its snapshots older than that many ms (never the current one).
    `compact_files_below`: after each table's round, rewrite its data files smaller than that
    many bytes into large ones (automq.spark.lakecompact), offsets unchanged; this comes
    before the expiry, whose snapshots then take the replaced files with them: the files no
    snapshot reaches any more are deleted. `remove_orphans_ms`: then delete files under the
    table's location that nothing references and older than that many ms (automq.spark.lakefiles).
    `schema_registry_url` (comma-separated URLs; by_schema_id and by_latest_schema topics):
    default $AUTOMQ_SCHEMA_REGISTRY_URL, else the cluster's controllers, which serve one."""
    registry = schema_registry_url or os.environ.get(REGISTRY_URL_ENV) or ",".join(location.controller_urls)
    view = ClusterView.load(location, with_objects=False)
    results = []
    for t in select_topics(view, topics, enabled_topics):
        try:
            result = ingest_topic(
                spark, location, catalog, t, force=force, before_commit=before_commit, schema_registry_url=registry
            )
            if compact_files_below is not None and result.status != "failed":
                table = iceberg.load_table(catalog, result.table)
                if table is not None:
                    files = compact_files(table, compact_files_below)
                    result.compacted_files = files.files_before if files.status == "compacted" else 0
            if expire_snapshots_ms is not None and result.status != "failed":
                table = iceberg.load_table(catalog, result.table)
                if table is not None:
                    cutoff = int(time.time() * 1000) - expire_snapshots_ms
                    before = lakefiles.reachable_files(table)
                    result.expired_snapshots = iceberg.expire_snapshots(table, cutoff)
                    if result.expired_snapshots:
                        result.removed_files += lakefiles.remove_unreferenced(table, before).files
            if remove_orphans_ms is not None and result.status != "failed":
                table = iceberg.load_table(catalog, result.table)
                if table is not None:
                    cutoff = int(time.time() * 1000) - remove_orphans_ms
                    result.removed_files += lakefiles.remove_orphans(table, cutoff).files
            results.append(result)
        except Exception as exc:  # one table's failure must not stop the others
            log.exception("ingesting %s failed", t.name)
            settings = TableSettings.from_topic_configs(t.configs)
            results.append(TableResult(t.name, table_name(t.name, settings), "failed", message=str(exc)))
    return results


def ingest_topic(
    spark,
    location: ClusterLocation,
    catalog: Catalog,
    topic: TopicView,
    *,
    force: bool = False,
    before_commit: Callable[[str, Table], None] | None = None,
    schema_registry_url: str = "",
) -> TableResult:
    settings = with_registry(TableSettings.from_topic_configs(topic.configs), topic.name, schema_registry_url)
    name = table_name(topic.name, settings)
    result = TableResult(topic.name, name, "up-to-date")
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result.attempts = attempt
        table = iceberg.load_table(catalog, name)
        if table is not None:
            table = iceberg.ensure_no_retries(table)
            age = int(time.time() * 1000) - iceberg.last_commit_ms(table)
            if not force and settings.commit_interval_ms and age < settings.commit_interval_ms:
                result.status, result.message = "skipped", f"last commit {age} ms ago < commit.interval.ms"
                return result
        committed = iceberg.committed_offsets(table) if table is not None else {}
        # the executor path plans its reads from this same view (one metadata load, not two)
        view = ClusterView.load(location, [topic.name], with_objects=lakewrite.on_executors(settings))
        parts = view.topic(topic.name).partitions
        start = {p.partition: max(committed.get(p.partition, 0), p.start_offset) for p in parts}
        end = {p.partition: p.end_offset for p in parts}
        for p in parts:
            if committed.get(p.partition, 0) < p.start_offset:
                log.warning(
                    "%s-%d: offsets [%d, %d) were deleted by retention before ingestion",
                    topic.name,
                    p.partition,
                    committed.get(p.partition, 0),
                    p.start_offset,
                )
        if all(start[p] >= end[p] for p in end):
            result.offsets = {p: max(committed.get(p, 0), start[p]) for p in end}
            return result
        if lakewrite.on_executors(settings):
            try:
                records, dead, offsets, cpu, note = _write_and_commit(
                    spark,
                    location,
                    view,
                    catalog,
                    topic.name,
                    name,
                    settings,
                    table,
                    committed,
                    start,
                    end,
                    before_commit,
                )
            except CommitFailedException as exc:
                log.info("%s: lost a concurrent commit (%s); re-planning", name, exc)
                continue
            result.status, result.records, result.dead_letters, result.offsets = "committed", records, dead, offsets
            result.task_cpu_seconds, result.message = cpu, note
            return result
        t0 = time.perf_counter()
        rows = _read(spark, location, topic.name, start, end)
        rows, end = _stop_at_open_transactions(rows, end)
        _check_range(rows, start, end)
        t1 = time.perf_counter()
        converted = convert(rows, settings)
        offsets = {**committed, **{p: max(start[p], end[p]) for p in end}}
        t2 = time.perf_counter()
        try:
            dead = _commit_dead_letters(catalog, name, topic.name, converted.dead, offsets)
            table = table or _create_table(catalog, name, _initial_schema(converted), topic.name, settings)
            _commit(table, converted, settings, offsets, name, before_commit)
        except CommitFailedException as exc:
            log.info("%s: lost a concurrent commit (%s); re-planning", name, exc)
            continue
        log.info(
            "%s: %d records: read %.2fs, convert %.2fs, write and commit %.2fs",
            name,
            rows.num_rows,
            t1 - t0,
            t2 - t1,
            time.perf_counter() - t2,
        )
        result.status, result.records, result.dead_letters, result.offsets = (
            "committed",
            converted.rows.num_rows,
            dead,
            offsets,
        )
        return result
    result.status, result.message = "failed", f"lost {MAX_ATTEMPTS} concurrent commits in a row"
    return result


def _write_and_commit(
    spark,
    location: ClusterLocation,
    view: ClusterView,
    catalog: Catalog,
    topic: str,
    name: str,
    settings: TableSettings,
    table: Table | None,
    committed: dict[int, int],
    start: dict[int, int],
    end: dict[int, int],
    before_commit: Callable[[str, Table], None] | None,
) -> tuple[int, int, dict[int, int], float, str]:
    """The executors convert and write the data files (lakewrite.py); here: one commit of
    them with the offsets. Returns (records, dead letters, offsets, the tasks' CPU seconds,
    a note for the report)."""
    t0 = time.perf_counter()
    planned = _snapshot_id(table)
    created = False
    spec_pending = False  # JSON: partition.by names a column the records have yet to bring
    # JSON: the metadata columns (no rows, so no id columns to check)
    initial = _initial_schema(convert(ROW_SCHEMA.empty_table(), replace(settings, id_columns=())))

    def widen(schemas: list[pa.Schema]) -> Table:
        """JSON: the table made to hold what the tasks met (created by the first run)."""
        nonlocal table, created
        if table is None:
            table = _create_table(catalog, name, lakeschema.unify(schemas), topic, settings)
            created = True
        else:
            lakeschema.evolve(table, schemas)
            if _snapshot_id(table) != planned:  # the widening read the newest metadata: re-plan
                raise CommitFailedException(f"{name}: another run committed while this one widened the schema")
        return table

    try:
        if not settings.has_fields:
            # the schema is known before reading (raw, string), so the table exists before the
            # executors write into its location with its field ids
            if table is None:
                table = _create_table(catalog, name, initial, topic, settings)
                created = True
            elif any(f.name not in table.schema().column_names for f in initial):
                with table.update_schema() as update:  # a table an older version made
                    update.union_by_name(initial)
        if table is not None and not created:
            spec_pending = _evolve_spec(table, name, settings, planned)
        write_spec = table.metadata.default_spec_id if table is not None else None
        write_range = lakeupsert.write_range if lakeupsert.applies(settings) else lakewrite.write_range
        written = write_range(spark, location, topic, start, end, table, settings, view=view, widen=widen)
        table = written.table or table
        if table is None:  # JSON, and no task had a good record: the offsets still advance
            table = _create_table(catalog, name, initial, topic, settings)
            created = True
    except Exception:
        if created and table is not None and table.refresh().current_snapshot() is None:
            catalog.drop_table(name)  # nothing half-made: the run created it and wrote nothing
        raise
    offsets = {**committed, **{p: max(start[p], written.end[p]) for p in end}}
    t1 = time.perf_counter()
    try:
        # pyiceberg lists a commit's new files in one manifest of the table object's default
        # spec: if a concurrent run evolved the spec while this one widened the schema (which
        # reloaded `table`), files of two specs would be listed under one and misread
        if write_spec is not None and table.metadata.default_spec_id != write_spec:
            raise CommitFailedException(f"{name}: the partition spec changed while this run wrote its files")
        dead = _commit_dead_letters(catalog, name, topic, written.dead, offsets)
        _commit_files(table, written.files + written.rewritten, offsets, name, before_commit, written.replaced)
    except CommitFailedException:
        # no snapshot will ever reference them
        lakewrite.delete_files(table, written.files + written.rewritten)
        raise
    note = _evolve_spec_after_commit(table, name, settings) if spec_pending else ""
    log.info(
        "%s: %d records in %d files: read, convert and write on executors %.2fs (in %d tasks, %d run again "
        "after widening the schema: read %.2fs, convert %.2fs, write %.2fs; CPU %.2fs), commit %.2fs",
        name,
        written.records,
        len(written.files),
        t1 - t0,
        written.tasks,
        written.rerun_tasks,
        written.task_seconds["read"],
        written.task_seconds["convert"],
        written.task_seconds["write"],
        written.task_seconds["cpu"],
        time.perf_counter() - t1,
    )
    return written.records, dead, offsets, written.task_seconds["cpu"], note


def _evolve_spec(table: Table, name: str, settings: TableSettings, planned: int | None) -> bool:
    """The table's partition spec made what the topic's partition.by says, before any task
    writes (every file of one commit has one spec: pyiceberg writes a commit's new files in
    one manifest of the default spec). A metadata commit, like a schema widening: a run that
    finds another run's snapshot after it re-plans. Returns True when a JSON table lacks a
    partition column yet (the spec then changes after this run's commit)."""
    try:
        changed = iceberg.evolve_partition_spec(table, name, settings.partition_by)
    except iceberg.MissingPartitionColumn:
        if not settings.has_fields:
            raise
        return True
    if changed:
        log.info("%s: partition spec is now %s (automq.table.topic.partition.by)", name, table.spec())
        if _snapshot_id(table) != planned:
            raise CommitFailedException(f"{name}: another run committed while this one evolved the partition spec")
    return False


def _evolve_spec_after_commit(table: Table, name: str, settings: TableSettings) -> str:
    """JSON: the partition column may have arrived with this run's records; the next run's
    files then carry the new spec. Never fails the committed run: what is wrong is reported
    (and the next run fails on it before writing)."""
    try:
        if iceberg.evolve_partition_spec(table, name, settings.partition_by):
            log.info("%s: partition spec is now %s (automq.table.topic.partition.by)", name, table.spec())
        return ""
    except iceberg.TableConfigError as exc:
        log.warning("%s: %s; the partition spec stays as it is", name, exc)
        return f"{exc}; the partition spec stays as it is"
    except CommitFailedException as exc:  # a concurrent run changed it: the next run looks again
        log.info("%s: partition spec not changed after the commit (%s)", name, exc)
        return ""


def _snapshot_id(table: Table | None) -> int | None:
    snapshot = table.current_snapshot() if table is not None else None
    return snapshot.snapshot_id if snapshot is not None else None


def _create_table(catalog: Catalog, name: str, schema: pa.Schema, topic: str, settings: TableSettings) -> Table:
    """The topic's table, created by this run: one a concurrent run created AND committed to
    meanwhile would make this run commit a range twice, so that one means re-planning."""
    table = iceberg.create_table(catalog, name, schema, topic, settings.partition_by)
    if table.current_snapshot() is not None:
        raise CommitFailedException(f"{name}: created and committed to by another run meanwhile")
    return table


def _commit_files(
    table: Table,
    files: list[lakewrite.WrittenFile],
    offsets: dict[int, int],
    name: str,
    before_commit: Callable[[str, Table], None] | None,
    replaced: list[DataFile] | None = None,
) -> None:
    """`replaced`: data files of the table the commit takes out (upserts' copy-on-write)."""
    props = {iceberg.OFFSETS_PROPERTY: _offsets_json(offsets)}
    txn = table.transaction()
    # always a snapshot (maybe without files): the offsets must advance even when every
    # record went to the DLQ
    update = txn.update_snapshot(snapshot_properties=props)
    with update.overwrite() if replaced else update.fast_append() as change:
        for old in replaced or []:
            change.delete_data_file(old)
        for f in files:
            change.append_data_file(f.data_file)
    if before_commit is not None:
        before_commit(name, table)
    txn.commit_transaction()


def _read(spark, location: ClusterLocation, topic: str, start: dict[int, int], end: dict[int, int]) -> pa.Table:
    # The data source's plan and reader as plain tasks returning Arrow (bulkread.py): the rows
    # go to the driver without Spark SQL's conversions to JVM rows and back.
    table = read_range(spark, location, topic, start, end, report_open=True)
    return table.cast(ROW_SCHEMA) if table.num_rows else ROW_SCHEMA.empty_table()


def _stop_at_open_transactions(rows: pa.Table, end: dict[int, int]) -> tuple[pa.Table, dict[int, int]]:
    """Each partition up to its last stable offset: the first offset of a transaction with no
    marker yet. Records after it wait for the run after the transaction ends (as a
    read_committed consumer's do), so the offsets committed with the table never skip them."""
    rows, first_open = lakewrite.cut_at_open_transactions(rows)
    end = dict(end)
    for p, lso in first_open.items():
        if lso < end[p]:
            log.info("partition %d: a transaction is open at offset %d; ingesting up to it", p, lso)
            end[p] = lso
    return rows, end


def _check_range(rows: pa.Table, start: dict[int, int], end: dict[int, int]) -> None:
    """Every record read lies in its partition's planned range (a guard, not a filter)."""
    for p in end:
        mine = rows.filter(pc.equal(rows["partition"], p))
        if mine.num_rows:
            lo, hi = pc.min(mine["offset"]).as_py(), pc.max(mine["offset"]).as_py()
            if lo < start[p] or hi >= end[p]:
                raise RuntimeError(f"partition {p}: read offsets [{lo}, {hi}] outside the plan [{start[p]}, {end[p]})")


def _initial_schema(converted: Converted) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in converted.rows.schema])


def _commit(
    table: Table,
    converted: Converted,
    settings: TableSettings,
    offsets: dict[int, int],
    name: str,
    before_commit: Callable[[str, Table], None] | None,
) -> None:
    props = {iceberg.OFFSETS_PROPERTY: _offsets_json(offsets)}
    rows = converted.rows
    txn = table.transaction()
    if rows.num_rows:
        with txn.update_schema() as update:
            update.union_by_name(pa.schema([f.with_nullable(True) for f in rows.schema]))
        rows = lakewrite.align(rows, txn.table_metadata.schema().as_arrow())
    if converted.deletes is not None and converted.deletes.num_rows:
        txn.delete(_id_filter(converted.deletes, settings.id_columns), snapshot_properties=props)
        op = rows[f"{META_PREFIX}op"]
        rows = rows.filter(pc.fill_null(pc.not_equal(op, "d"), True))
    # always append (maybe nothing): the offsets must advance even when all records went to the DLQ
    txn.append(rows, snapshot_properties=props)
    if before_commit is not None:
        before_commit(name, table)
    txn.commit_transaction()


def _id_filter(ids: pa.Table, columns: tuple[str, ...]):
    if len(columns) == 1:
        return In(term=columns[0], literals=[v for v in ids[columns[0]].to_pylist() if v is not None])
    terms = [And(*[EqualTo(term=c, value=row[c]) for c in columns]) for row in ids.to_pylist()]
    return terms[0] if len(terms) == 1 else Or(*terms)


def _offsets_json(offsets: dict[int, int]) -> str:
    import json

    return json.dumps({str(p): o for p, o in sorted(offsets.items())})


def _commit_dead_letters(catalog: Catalog, name: str, topic: str, dead: pa.Table, offsets: dict[int, int]) -> int:
    """Dead letters first, with their own offsets: records already there are not added twice."""
    dlq_name = f"{name}_dlq"
    if not dead.num_rows:
        return 0
    table = iceberg.load_table(catalog, dlq_name)
    table = table or iceberg.create_table(catalog, dlq_name, DLQ_SCHEMA, topic)
    done = iceberg.committed_offsets(table)
    if done:
        keep = [
            o >= done.get(p, 0) for p, o in zip(dead["partition"].to_pylist(), dead["offset"].to_pylist(), strict=True)
        ]
        dead = dead.filter(pa.array(keep, pa.bool_()))
    if all(done.get(p, 0) >= o for p, o in offsets.items()):
        return 0
    txn = table.transaction()
    txn.append(dead.cast(DLQ_SCHEMA), snapshot_properties={iceberg.OFFSETS_PROPERTY: _offsets_json(offsets)})
    txn.commit_transaction()
    return dead.num_rows
