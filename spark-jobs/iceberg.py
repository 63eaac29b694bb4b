"""Iceberg catalogs and tables of the lake ingestion job (pyiceberg).

Catalogs by URI: `sqlite:///path/catalog.db` (the embedded default) or any SQLAlchemy URL
(`postgresql+psycopg://...`; a plain libpq `postgresql://` URL uses psycopg 3 too) ->
pyiceberg's SQL catalog; `http(s)://...` -> a REST catalog. The warehouse is a local directory
or an object-store location pyiceberg can write (`file:///...`, `s3://bucket/prefix`).

A SQL catalog on a server (PostgreSQL) is opened with `pool_pre_ping`: a run holds its pooled
connection idle for as long as its Spark tasks write, and servers, proxies and firewalls close
idle connections; the commit after that must get a live one. Jobs that start at the same time
on a fresh database all try to create the catalog's tables; the losers open the catalog again.
A catalog that cannot be opened raises CatalogError, whose message masks the URI's password.

Exactly-once bookkeeping lives in the tables themselves: every commit's snapshot summary
carries `automq.offsets`, the next offset of each partition the table holds everything
below. Tables are created with `commit.retry.num-retries=0`: pyiceberg would otherwise
re-apply an append on top of a concurrent commit, which would write a range twice; the job
re-plans from the winner's offsets instead.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
from pydantic import ValidationError
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, RESTError
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
from pyiceberg.typedef import RecursiveDict
from pyiceberg.utils.config import Config, merge_config
from requests import PreparedRequest, RequestException, Response, Session, Timeout
from requests.adapters import HTTPAdapter
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, ProgrammingError, SQLAlchemyError

CATALOG_NAME = "automq"
OFFSETS_PROPERTY = "automq.offsets"
TOPIC_PROPERTY = "automq.topic"
NO_RETRIES = {"commit.retry.num-retries": "0"}
# SQLAlchemy's bare postgresql:// means psycopg2; the project ships psycopg 3 (the `spark` extra)
_LIBPQ_SCHEMES = ("postgresql://", "postgres://")
CATALOG_INIT_ATTEMPTS = 5
# libpq waits for the kernel's TCP timeout (minutes) on an unreachable host; a URL's own
# connect_timeout wins
CONNECT_TIMEOUT_S = 10
REST_CONNECT_TIMEOUT = "rest.client.connection-timeout-ms"
REST_READ_TIMEOUT = "rest.client.socket-timeout-ms"
# a commit's answer waits for the server to write the new metadata (to S3, often)
REST_READ_TIMEOUT_S = 120


class CatalogError(Exception):
    """The catalog cannot be opened (unreachable server, refused login, ...); the message names
    the URI with its password masked."""


class TableConfigError(Exception):
    """The topic's table settings do not fit its table (e.g. a partition column it lacks)."""


class MissingPartitionColumn(TableConfigError):
    """`partition.by` names a column the table does not have (yet)."""


def open_catalog(uri: str, warehouse: str | None = None, properties: dict[str, str] | None = None) -> Catalog:
    props = dict(properties or {})
    if uri.startswith(("http://", "https://")):
        props.update(uri=uri)
        if warehouse:
            props["warehouse"] = warehouse
        # pyiceberg's own configuration of the catalog named `automq` comes first, as
        # load_catalog would merge it: PYICEBERG_CATALOG__AUTOMQ__TOKEN (a Secret's token in
        # the job's environment, never on its command line) or ~/.pyiceberg.yaml
        conf = merge_config(Config().get_catalog_config(CATALOG_NAME) or {}, cast(RecursiveDict, props))
        conf.pop("type", None)
        try:
            # the catalog asks the server for its config (GET /v1/config) right away
            return RestCatalogWithTimeouts(CATALOG_NAME, **cast(dict[str, str], conf))
        except (RequestException, RESTError) as exc:
            raise CatalogError(f"catalog {masked(uri)}: {_rest_reason(exc)}") from exc
        except ValidationError as exc:  # a 200 that is not a REST catalog's config
            raise CatalogError(
                f"catalog {masked(uri)}: not an Iceberg REST catalog (GET /v1/config: {exc.errors()[0]['msg']})"
            ) from exc
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
    else:
        props.setdefault("pool_pre_ping", "true")
    if warehouse.startswith("file://"):
        Path(warehouse[len("file://") :]).mkdir(parents=True, exist_ok=True)
    props.update(type="sql", uri=sql_url(uri), warehouse=warehouse)
    for attempt in range(1, CATALOG_INIT_ATTEMPTS + 1):
        try:
            return load_catalog(CATALOG_NAME, **props)
        except (IntegrityError, ProgrammingError) as exc:
            # PostgreSQL: another job created the catalog's tables between this one's check and
            # its CREATE TABLE (duplicate pg_type row, or "relation already exists"); they exist now
            if attempt == CATALOG_INIT_ATTEMPTS:
                raise CatalogError(f"catalog {masked(uri)}: {_reason(exc)}") from exc
            time.sleep(0.05 * attempt)
        except SQLAlchemyError as exc:
            raise CatalogError(f"catalog {masked(uri)}: {_reason(exc)}") from exc
    raise AssertionError("unreachable")


class _TimeoutAdapter(HTTPAdapter):
    """Gives every request without a timeout of its own this one (requests has none)."""

    def __init__(self, timeout: tuple[float, float]) -> None:
        super().__init__()
        self.timeout = timeout

    def send(self, request: PreparedRequest, *args: Any, **kwargs: Any) -> Response:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.timeout
        return super().send(request, *args, **kwargs)


class RestCatalogWithTimeouts(RestCatalog):
    """pyiceberg's REST catalog with connect and read timeouts: it sets none, so a server that
    accepts the connection and never answers (a hung pod, a black-holing proxy) would hold the
    run until its deadline. The settings are Iceberg Java's REST client's:
    `rest.client.connection-timeout-ms` and `rest.client.socket-timeout-ms` (the longest wait
    for the next byte of an answer)."""

    def _create_session(self) -> Session:
        session = super()._create_session()
        connect_ms = int(self.properties.get(REST_CONNECT_TIMEOUT, CONNECT_TIMEOUT_S * 1000))
        read_ms = int(self.properties.get(REST_READ_TIMEOUT, REST_READ_TIMEOUT_S * 1000))
        adapter = _TimeoutAdapter((connect_ms / 1000, read_ms / 1000))
        # a more specific mount (pyiceberg's SigV4 adapter, on the catalog's URI) still wins
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session


def sql_url(uri: str) -> str:
    """The SQLAlchemy URL of a SQL catalog URI: `postgresql://` and `postgres://` (libpq's
    forms, what a Secret usually holds) select psycopg 3; URLs naming a driver stay as given.
    psycopg URLs get a connect timeout unless they set one."""
    for scheme in _LIBPQ_SCHEMES:
        if uri.startswith(scheme):
            uri = "postgresql+psycopg://" + uri[len(scheme) :]
    if uri.startswith("postgresql+psycopg://") and "connect_timeout=" not in uri:
        uri += f"{'&' if '?' in uri else '?'}connect_timeout={CONNECT_TIMEOUT_S}"
    return uri


# query parameters that carry a secret: libpq's password/sslpassword, a REST token or credential
_SECRET_PARAM = re.compile(r"([?&][^=&#]*(?:pass|token|secret|credential|key)[^=&#]*=)[^&#]*", re.IGNORECASE)


def masked(uri: str) -> str:
    """The URI for messages and logs: its password, and the values of query parameters that
    name a secret (`?password=`, `?token=`, ...), replaced by ***."""
    try:
        shown = make_url(uri).render_as_string(hide_password=True)
    except ArgumentError:  # unparsable: show none of it
        return uri.split("://", 1)[0] + "://***"
    return _SECRET_PARAM.sub(r"\1***", shown)


def _rest_reason(exc: Exception) -> str:
    """The server's error (`NotAuthorizedException: ...`) or the connection failure, one line."""
    if isinstance(exc, RequestException):
        cause = exc.args[0] if exc.args else exc
        reason = getattr(cause, "reason", cause)  # urllib3's MaxRetryError wraps the socket error
        verb = "no answer from the server" if isinstance(exc, Timeout) else "cannot reach the server"
        return f"{verb}: {reason}".strip().splitlines()[0]
    return str(exc).strip().splitlines()[0]


def _reason(exc: SQLAlchemyError) -> str:
    """The driver's message (first line), without SQLAlchemy's statement and link."""
    orig = getattr(exc, "orig", None)
    return str(orig or exc).strip().splitlines()[0]


# Catalog connection settings pyiceberg copies into every table's FileIO properties (a SQL
# catalog's `uri` holds its password; a REST catalog's `credential`, `token`, `header.*` and
# `auth` hold secrets, and its `auth.manager` is the live object holding the token); executors
# only read and write files
_CATALOG_ONLY_KEYS = frozenset(
    {
        "uri",
        "type",
        "warehouse",
        "credential",
        "token",
        "pool_pre_ping",
        "echo",
        "init_catalog_tables",
        "auth",
        "auth.manager",
        "oauth2-server-uri",
        "scope",
        "audience",
        "resource",
        "prefix",
    }
)
_CATALOG_ONLY_PREFIXES = ("header.", "rest.")


def executor_io_properties(table: Table) -> dict[str, str]:
    """The table's FileIO settings for Spark tasks, without the catalog's URI and credentials:
    those would travel to every executor (pods, with Spark on Kubernetes) in each task. Only
    string settings: FileIO takes nothing else, and a REST catalog adds its auth objects."""
    return {
        k: v
        for k, v in table.io.properties.items()
        if isinstance(v, str) and k not in _CATALOG_ONLY_KEYS and not k.startswith(_CATALOG_ONLY_PREFIXES)
    }


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
    except IntegrityError:
        # SQL catalog: a concurrent run inserted the namespace after this one checked for it
        if not catalog.namespace_exists(namespace):
            raise
    table = catalog.create_table_if_not_exists(
        identifier, schema=schema, properties={**NO_RETRIES, TOPIC_PROPERTY: topic}
    )
    if partition_by and table.spec().is_unpartitioned() and table.current_snapshot() is None:
        evolve_partition_spec(table, identifier, partition_by)
    return catalog.load_table(identifier)


def ensure_no_retries(table: Table) -> Table:
    if table.metadata.properties.get("commit.retry.num-retries") != "0":
        with table.transaction() as txn:
            txn.set_properties(NO_RETRIES)
    return table


def evolve_partition_spec(
    table: Table,
    identifier: str,
    partition_by: tuple[tuple[str, str, int | None], ...],
) -> bool:
    """Make the table's default partition spec what `automq.table.topic.partition.by` says:
    fields it lists that the spec lacks are added, fields it no longer lists are removed, in
    ONE metadata commit (`table` is refreshed to it). Data files keep the spec they were
    written with (Iceberg readers plan each file by its own spec), so nothing is rewritten.
    Returns whether the spec changed.

    Every item is checked against the table before anything is committed: a column the table
    lacks, or a transform its type does not take, raises TableConfigError naming the setting,
    and the table is left as it was (MissingPartitionColumn for a column it lacks: a JSON
    table may get that column from the very records the run is about to ingest)."""
    setting = "automq.table.topic.partition.by"
    schema = table.schema()
    wanted: dict[tuple[int, str], tuple[str, str, int | None, Transform]] = {}
    for name, column, arg in partition_by:
        try:
            source = schema.find_field(column)
        except ValueError:
            columns = ", ".join(sorted(f.name for f in schema.fields))
            raise MissingPartitionColumn(
                f"{setting}: column {column!r} is not in table {identifier} (columns: {columns})"
            ) from None
        transform = _transform(name, arg)
        if not transform.can_transform(source.field_type):
            raise TableConfigError(
                f"{setting}: {name}({column}{f', {arg}' if arg else ''}) cannot partition column {column!r} "
                f"of type {source.field_type} in table {identifier}"
            )
        key = (source.field_id, repr(transform))
        if key in wanted:
            raise TableConfigError(f"{setting}: {name}({column}) is listed twice")
        wanted[key] = (name, column, arg, transform)
    current = {(f.source_id, repr(f.transform)): f for f in table.spec().fields}
    remove = [f.name for key, f in current.items() if key not in wanted]
    add = [w for key, w in wanted.items() if key not in current]
    if not remove and not add:
        return False
    taken = {f.name for spec in table.specs().values() for f in spec.fields}
    try:
        update = table.update_spec()
        for field_name in remove:
            update.remove_field(field_name)
        for name, column, arg, transform in add:
            update.add_field(column, transform, _field_name(table, column, name, arg, transform, taken))
        update.commit()
    except ValueError as exc:  # pyiceberg's own checks (two time transforms of one column, ...)
        raise TableConfigError(f"{setting}: cannot partition table {identifier} that way: {exc}") from exc
    return True


def _field_name(
    table: Table, column: str, name: str, arg: int | None, transform: Transform, taken: set[str]
) -> str | None:
    """A partition field's name: an earlier spec's field of the same column and transform
    lends its name (and field id: pyiceberg reuses both when given None); a new one is
    `column_transform`, with the argument or a counter appended if an earlier spec used that."""
    for spec in table.specs().values():
        for f in spec.fields:
            if repr(f.transform) == repr(transform) and table.schema().find_column_name(f.source_id) == column:
                return None
    base = f"{column}_{name}"
    candidates = [base, *([f"{base}_{arg}"] if arg else []), *(f"{base}_{i}" for i in range(2, 100))]
    return next(c for c in candidates if c not in taken)


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
