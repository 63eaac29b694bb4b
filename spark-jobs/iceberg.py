"""Iceberg catalogs and tables of the lake ingestion job (pyiceberg).

Catalogs by URI: `sqlite:///path/catalog.db` (the embedded default) or any SQLAlchemy URL
(`postgresql+psycopg://...`) -> pyiceberg's SQL catalog; `http(s)://...` -> a REST catalog.
The warehouse is a local directory or an object-store location pyiceberg can write
(`file:///...`, `s3://bucket/prefix`).

Exactly-once bookkeeping lives in the tables themselves: every commit's snapshot summary
carries `automq.offsets`, the next offset of each partition the table holds everything
below. Tables are created with `commit.retry.num-retries=0`: pyiceberg would otherwise
re-apply an append on top of a concurrent commit, which would write a range twice; the job
re-plans from the winner's offsets instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)

OFFSETS_PROPERTY = "automq.offsets"
TOPIC_PROPERTY = "automq.topic"
NO_RETRIES = {"commit.retry.num-retries": "0"}


class TableConfigError(Exception):
    """The topic's table settings do not fit its table (e.g. a partition column it lacks)."""


def open_catalog(uri: str, warehouse: str | None = None, properties: dict[str, str] | None = None) -> Catalog:
    props = dict(properties or {})
    if uri.startswith(("http://", "https://")):
        props.update(type="rest", uri=uri)
        if warehouse:
            props["warehouse"] = warehouse
        return load_catalog("automq", **props)
    if "://" not in uri:
        raise ValueError(f"catalog {uri!r}: use sqlite:///path.db, a SQLAlchemy URL, or http(s):// for REST")
    if warehouse is None:
        if not uri.startswith("sqlite:///"):
            raise ValueError("a SQL catalog other than sqlite needs --warehouse")
        warehouse = (Path(uri[len("sqlite:///") :]).parent / "warehouse").as_uri()
    elif "://" not in warehouse:
        warehouse = Path(warehouse).resolve().as_uri()
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    if warehouse.startswith("file://"):
        Path(warehouse[len("file://") :]).mkdir(parents=True, exist_ok=True)
    props.update(type="sql", uri=uri, warehouse=warehouse)
    return load_catalog("automq", **props)


def committed_offsets(table: Table) -> dict[int, int]:
    """{partition: next offset} the table's current snapshot holds everything below."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return {}
    raw = snapshot.summary.additional_properties.get(OFFSETS_PROPERTY) if snapshot.summary else None
    return {int(p): int(o) for p, o in json.loads(raw).items()} if raw else {}


def last_commit_ms(table: Table) -> int:
    snapshot = table.current_snapshot()
    return snapshot.timestamp_ms if snapshot is not None else 0


def load_table(catalog: Catalog, identifier: str) -> Table | None:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


def create_table(
    catalog: Catalog,
    identifier: str,
    schema: pa.Schema,
    topic: str,
    partition_by: tuple[tuple[str, str, int | None], ...] = (),
) -> Table:
    namespace = identifier.rsplit(".", 1)[0]
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    table = catalog.create_table_if_not_exists(
        identifier, schema=schema, properties={**NO_RETRIES, TOPIC_PROPERTY: topic}
    )
    if partition_by and table.spec().is_unpartitioned():
        names = {f.name for f in table.schema().fields}
        with table.update_spec() as spec:
            for transform, column, arg in partition_by:
                if column not in names:
                    raise TableConfigError(
                        f"automq.table.topic.partition.by: column {column!r} is not in table {identifier} "
                        f"(columns: {', '.join(sorted(names))})"
                    )
                spec.add_field(column, _transform(transform, arg), f"{column}_{transform}")
    return catalog.load_table(identifier)


def ensure_no_retries(table: Table) -> Table:
    if table.metadata.properties.get("commit.retry.num-retries") != "0":
        with table.transaction() as txn:
            txn.set_properties(NO_RETRIES)
    return table


def _transform(name: str, arg: int | None) -> Transform:
    simple: dict[str, Transform] = {
        "identity": IdentityTransform(),
        "year": YearTransform(),
        "month": MonthTransform(),
        "day": DayTransform(),
        "hour": HourTransform(),
        "void": VoidTransform(),
    }
    if name == "bucket":
        return BucketTransform(arg or 1)
    if name == "truncate":
        return TruncateTransform(arg or 1)
    return simple[name]


def expire_snapshots(table: Table, older_than_ms: int) -> int:
    """Drop snapshots older than `older_than_ms` (epoch ms) from the table's metadata; the
    current snapshot (which holds the offsets) is always kept. Data files are not deleted
    (pyiceberg does not clean files): readers of expired snapshots' files are rare, a
    warehouse cleanup can follow. Returns how many were expired."""
    from datetime import UTC, datetime

    current = table.current_snapshot()
    doomed = [
        s.snapshot_id
        for s in table.snapshots()
        if s.timestamp_ms < older_than_ms and (current is None or s.snapshot_id != current.snapshot_id)
    ]
    if doomed:
        table.maintenance.expire_snapshots().older_than(datetime.fromtimestamp(older_than_ms / 1000, UTC)).commit()
    return len(doomed)
