"""`automq spark ...`: the Spark jobs from the command line (and from the CronJobs, whose
pods run `spark-submit` on this module's `main`).

    automq spark ingest  --data-dir .automq-local                  # a local-up cluster
    automq spark ingest  --controller http://c:9093 --object-store s3://... --catalog sqlite:///lake/catalog.db
    automq spark compact --data-dir .automq-local --min-age 5m

Heavy imports (pyspark, pyiceberg) happen inside the commands, so `automq --help` stays fast.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer

from automq.broker.logs import configure_logging

spark_app = typer.Typer(help="Spark jobs: lake ingestion into Iceberg, object compaction.", no_args_is_help=True)

_DATA_DIR = typer.Option(None, "--data-dir", help="An `automq local up` data dir (finds controller and store).")
_CONTROLLER = typer.Option(None, "--controller", help="Controller URL(s), comma-separated.")
_OBJECT_STORE = typer.Option(None, "--object-store", help="Object store URL (s3://bucket?endpoint=... or file://...).")
_MASTER = typer.Option(None, "--master", help="Spark master (default: $AUTOMQ_SPARK_MASTER or local[*]).")


def _location(data_dir: Path | None, controller: str | None, object_store: str | None):
    from automq.spark.cluster import ClusterLocation, ClusterLocationError

    try:
        return ClusterLocation.resolve(data_dir=data_dir, controller=controller, object_store=object_store)
    except ClusterLocationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@spark_app.command("ingest")
def ingest_command(
    data_dir: Path | None = _DATA_DIR,
    controller: str | None = _CONTROLLER,
    object_store: str | None = _OBJECT_STORE,
    topic: list[str] | None = typer.Option(
        None,
        "--topic",
        "-t",
        help="Also ingest this topic (repeatable); topics with automq.table.topic.enable=true always are.",
    ),
    catalog: str | None = typer.Option(
        None,
        "--catalog",
        envvar="AUTOMQ_SPARK_CATALOG",
        help="Iceberg catalog: sqlite:///path.db (default: <data-dir>/lake/catalog.db), a SQLAlchemy URL, or http(s):// (REST).",
    ),
    catalog_property: list[str] | None = typer.Option(
        None,
        "--catalog-property",
        help="KEY=VALUE passed to the pyiceberg catalog (repeatable), e.g. s3.endpoint=http://minio:9000.",
    ),
    warehouse: str | None = typer.Option(
        None, "--warehouse", help="Warehouse location (default: next to a sqlite catalog)."
    ),
    only: bool = typer.Option(False, "--only", help="Only the --topic topics, not every table-enabled one."),
    force: bool = typer.Option(False, "--force", help="Ignore automq.table.topic.commit.interval.ms."),
    expire_snapshots: str | None = typer.Option(
        None,
        "--expire-snapshots-older-than",
        help="After committing, drop table snapshots older than this, e.g. 168h (the current one always stays).",
    ),
    compact_files_below: str | None = typer.Option(
        None,
        "--compact-files-below",
        help="After committing, rewrite each table's data files smaller than this (e.g. 32MiB) into large ones.",
    ),
    remove_orphans: str | None = typer.Option(
        None,
        "--remove-orphans-older-than",
        help="After committing, delete files under each table's location that no snapshot references and are "
        "older than this, e.g. 72h (keep it well above the longest run: a run's files are unreferenced until it commits).",
    ),
    schema_registry_url: str | None = typer.Option(
        None,
        "--schema-registry-url",
        envvar="AUTOMQ_SCHEMA_REGISTRY_URL",
        help="Schema registry URL(s), comma-separated, for by_schema_id / by_latest_schema topics (AutoMQ's "
        "automq.table.topic.schema.registry.url); default: the controller, which serves one.",
    ),
    master: str | None = _MASTER,
) -> None:
    """Write table topics to Iceberg, exactly once (offsets live in the tables' snapshots)."""
    from automq.spark.iceberg import CatalogError, open_catalog
    from automq.spark.ingest import ingest
    from automq.spark.session import spark_session

    configure_logging(logging.INFO, process="spark")
    location = _location(data_dir, controller, object_store)
    expire_ms = _duration_ms(expire_snapshots, "--expire-snapshots-older-than") if expire_snapshots else None
    small_bytes = _size(compact_files_below, "--compact-files-below") if compact_files_below else None
    orphans_ms = _duration_ms(remove_orphans, "--remove-orphans-older-than") if remove_orphans else None
    if catalog is None:
        if data_dir is None:
            typer.echo("error: pass --catalog (or --data-dir for the embedded sqlite catalog)", err=True)
            raise typer.Exit(2)
        catalog = f"sqlite:///{(data_dir / 'lake' / 'catalog.db').resolve()}"
    properties = {}
    for item in catalog_property or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            typer.echo(f"error: --catalog-property {item!r}: expected KEY=VALUE", err=True)
            raise typer.Exit(2)
        properties[key] = value
    try:
        cat = open_catalog(catalog, warehouse, properties)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except CatalogError as exc:  # a server that is down or refuses us: not a usage error
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    spark = spark_session(master, app_name="automq-ingest")
    results = ingest(
        spark,
        location,
        cat,
        topic or None,
        force=force,
        enabled_topics=not only,
        expire_snapshots_ms=expire_ms,
        compact_files_below=small_bytes,
        remove_orphans_ms=orphans_ms,
        schema_registry_url=schema_registry_url,
    )
    for r in results:
        typer.echo(
            json.dumps(
                {
                    "topic": r.topic,
                    "table": r.table,
                    "status": r.status,
                    "records": r.records,
                    "dead_letters": r.dead_letters,
                    "offsets": r.offsets,
                    "expired_snapshots": r.expired_snapshots,
                    "compacted_files": r.compacted_files,
                    "removed_files": r.removed_files,
                    "message": r.message,
                }
            )
        )
    if not results:
        typer.echo("no topics to ingest: set automq.table.topic.enable=true on a topic or pass --topic")
    if any(r.status == "failed" for r in results):
        raise typer.Exit(1)


def _duration_ms(text: str, option: str) -> int:
    from automq.broker.config import parse_duration_ms

    try:
        return parse_duration_ms(text)
    except ValueError as exc:
        typer.echo(f"error: {option}: {exc}", err=True)
        raise typer.Exit(2) from None


def _size(text: str, option: str) -> int:
    from automq.broker.config import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        typer.echo(f"error: {option}: {exc}", err=True)
        raise typer.Exit(2) from None


@spark_app.command("compact")
def compact_command(
    data_dir: Path | None = _DATA_DIR,
    controller: str | None = _CONTROLLER,
    object_store: str | None = _OBJECT_STORE,
    min_age: str = typer.Option("5m", "--min-age", help="Leave objects younger than this alone."),
    target_size: str = typer.Option("256MiB", "--target-size", help="Size of the objects written."),
    small_size: str = typer.Option("16MiB", "--small-size", help="Stream objects below this are merged."),
    force_split_age: str = typer.Option(
        "2h", "--force-split-age", help="Split a lone stream-set object older than this."
    ),
    max_objects: int = typer.Option(500, "--max-objects", min=2, help="Source objects per run."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan, change nothing."),
    keys: bool = typer.Option(
        False, "--keys", help="Key compaction of cleanup.policy=compact topics (latest record per key) instead."
    ),
    master: str | None = _MASTER,
) -> None:
    """Rewrite small objects into large per-stream objects and commit the swap at the controller."""
    from automq.spark.compact import CompactionSettings, compact, plan_async

    configure_logging(logging.INFO, process="spark")
    location = _location(data_dir, controller, object_store)
    if not location.controller_urls:
        typer.echo("error: compaction commits through the controller: pass --controller or a --data-dir", err=True)
        raise typer.Exit(2)
    settings = CompactionSettings(
        min_age_ms=_duration_ms(min_age, "--min-age"),
        small_object_bytes=_size(small_size, "--small-size"),
        target_bytes=_size(target_size, "--target-size"),
        force_split_age_ms=_duration_ms(force_split_age, "--force-split-age"),
        max_objects=max_objects,
    )
    if keys:
        from automq.spark.keycompact import compact_keys, plan_keys

        if dry_run:
            for kt in plan_keys(location, settings.min_age_ms):
                typer.echo(
                    json.dumps(
                        {
                            "topic": kt.task.topic,
                            "partition": kt.task.partition,
                            "sources": [s.object_id for s in kt.task.sources],
                        }
                    )
                )
            return
        from automq.spark.session import spark_session

        report = compact_keys(spark_session(master, app_name="automq-compact-keys"), location, settings.min_age_ms)
        typer.echo(
            json.dumps(
                {
                    "planned": report.planned,
                    "committed": report.committed,
                    "lost": report.lost,
                    "source_objects": report.source_objects,
                    "bytes_written": report.bytes_written,
                    "seconds": round(report.seconds, 3),
                    "errors": report.errors,
                    **report.key_stats,
                }
            )
        )
        if report.errors:
            raise typer.Exit(1)
        return
    if dry_run:
        import asyncio

        for t in asyncio.run(plan_async(location, settings)):
            typer.echo(
                json.dumps(
                    {
                        "topic": t.topic,
                        "partition": t.partition,
                        "stream_id": t.stream_id,
                        "sources": [s.object_id for s in t.sources],
                        "bytes": t.bytes,
                    }
                )
            )
        return
    from automq.spark.session import spark_session

    report = compact(spark_session(master, app_name="automq-compact"), location, settings)
    typer.echo(
        json.dumps(
            {
                "planned": report.planned,
                "committed": report.committed,
                "lost": report.lost,
                "source_objects": report.source_objects,
                "bytes_written": report.bytes_written,
                "seconds": round(report.seconds, 3),
                "errors": report.errors,
            }
        )
    )
    if report.errors:
        raise typer.Exit(1)
