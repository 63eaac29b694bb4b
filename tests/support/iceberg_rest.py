"""A thin Iceberg REST catalog server for the tests: the subset of the REST catalog OpenAPI
spec that pyiceberg's RestCatalog uses, over a pyiceberg SQL catalog on sqlite.

Like Apache Iceberg's own REST test fixture (iceberg-rest-fixture, an HTTP adapter over a JDBC
catalog), it holds no catalog logic of its own: a commit's requirements are validated and its
updates applied by pyiceberg (`SqlCatalog.commit_table`: `TableRequirement.validate`,
`update_table_metadata`, then a compare-and-swap of the table's row), and the server writes the
new metadata JSON, as REST servers do. Data and manifest files are the client's. Errors are the
spec's bodies (`{"error": {"message", "type", "code"}}`): 404 NoSuchTableException /
NoSuchNamespaceException, 409 AlreadyExistsException / CommitFailedException /
NamespaceNotEmptyException, 400 BadRequestException, 401 NotAuthorizedException.

Not a production catalog: no OAuth token endpoint (a fixed bearer token, when given), no
credential vending, no views, no server-side scan planning, no multi-table transactions.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import ValidationError
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableRequest, Table
from pyiceberg.table.sorting import SortOrder
from sqlalchemy.exc import IntegrityError

NAMESPACE_SEPARATOR = "\x1f"  # the spec's default: %1F in paths

ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "POST /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "DELETE /v1/{prefix}/namespaces/{namespace}",
    "POST /v1/{prefix}/namespaces/{namespace}/properties",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "POST /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/tables/rename",
]

# pyiceberg exception -> (HTTP status, the spec's error type)
_ERRORS: dict[type[Exception], tuple[int, str]] = {
    NoSuchTableError: (404, "NoSuchTableException"),
    NoSuchNamespaceError: (404, "NoSuchNamespaceException"),
    TableAlreadyExistsError: (409, "AlreadyExistsException"),
    NamespaceAlreadyExistsError: (409, "AlreadyExistsException"),
    NamespaceNotEmptyError: (409, "NamespaceNotEmptyException"),
    CommitFailedException: (409, "CommitFailedException"),
}


class RestError(Exception):
    def __init__(self, code: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.code, self.kind = code, kind


class IcebergRestServer:
    """`with IcebergRestServer(root) as server:` serves `server.uri` on 127.0.0.1 (port 0: a
    free one) until the block ends. `token`: requests must carry `Authorization: Bearer <token>`.
    `commits` counts each table's answered commit requests by outcome ("ok", "conflict")."""

    def __init__(self, root: Path, port: int = 0, token: str | None = None) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.warehouse = root / "warehouse"
        self.warehouse.mkdir(exist_ok=True)
        self.catalog = SqlCatalog("rest", uri=f"sqlite:///{root / 'catalog.db'}", warehouse=self.warehouse.as_uri())
        self.token = token
        self.commits: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="iceberg-rest", daemon=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> IcebergRestServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)
        self.catalog.engine.dispose()

    def count_commit(self, table: str, outcome: str) -> None:
        with self._lock:
            per_table = self.commits.setdefault(table, {})
            per_table[outcome] = per_table.get(outcome, 0) + 1

    # --- routes: (method, path parts after /v1) -> (status, JSON body or None) ---

    def route(self, method: str, parts: list[str], query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if parts == ["config"] and method == "GET":
            return 200, {"defaults": {}, "overrides": {}, "endpoints": ENDPOINTS}
        if parts == ["tables", "rename"] and method == "POST":
            src, dst = body["source"], body["destination"]
            self.catalog.rename_table((*src["namespace"], src["name"]), (*dst["namespace"], dst["name"]))
            return 204, None
        if parts[:1] != ["namespaces"]:
            raise RestError(404, "NoSuchEndpointException", f"no route {method} /v1/{'/'.join(parts)}")
        if len(parts) == 1:
            return self._namespaces(method, query, body)
        namespace = tuple(unquote(parts[1]).split(NAMESPACE_SEPARATOR))
        rest = parts[2:]
        if not rest:
            return self._namespace(method, namespace)
        if rest == ["properties"] and method == "POST":
            summary = self.catalog.update_namespace_properties(
                namespace, set(body.get("removals") or ()), body.get("updates") or {}
            )
            return 200, {"removed": summary.removed, "updated": summary.updated, "missing": summary.missing}
        if rest[0] != "tables" or len(rest) > 2:
            raise RestError(404, "NoSuchEndpointException", f"no route {method} /v1/{'/'.join(parts)}")
        if len(rest) == 1:
            return self._tables(method, namespace, body)
        return self._table(method, (*namespace, unquote(rest[1])), query, body)

    def _namespaces(self, method: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if method == "GET":
            parent = query.get("parent", [""])[0]
            parent_ns = tuple(parent.split(NAMESPACE_SEPARATOR)) if parent else ()
            return 200, {"namespaces": [list(ns) for ns in self.catalog.list_namespaces(parent_ns)]}
        if method == "POST":
            namespace, props = tuple(body["namespace"]), body.get("properties") or {}
            try:
                self.catalog.create_namespace(namespace, props)
            except IntegrityError as exc:
                # SqlCatalog checks, then inserts: a concurrent create slipped in between
                raise NamespaceAlreadyExistsError(f"namespace {'.'.join(namespace)} already exists") from exc
            return 200, {"namespace": list(namespace), "properties": props}
        raise RestError(405, "BadRequestException", f"{method} not allowed on namespaces")

    def _namespace(self, method: str, namespace: tuple[str, ...]) -> tuple[int, Any]:
        if method == "GET":
            return 200, {"namespace": list(namespace), "properties": self.catalog.load_namespace_properties(namespace)}
        if method == "HEAD":
            if not self.catalog.namespace_exists(namespace):
                raise RestError(404, "NoSuchNamespaceException", f"namespace {'.'.join(namespace)} does not exist")
            return 204, None
        if method == "DELETE":
            self.catalog.drop_namespace(namespace)
            return 204, None
        raise RestError(405, "BadRequestException", f"{method} not allowed on a namespace")

    def _tables(self, method: str, namespace: tuple[str, ...], body: Any) -> tuple[int, Any]:
        if method == "GET":
            if not self.catalog.namespace_exists(namespace):
                raise NoSuchNamespaceError(f"namespace {'.'.join(namespace)} does not exist")
            return 200, {
                "identifiers": [
                    {"namespace": list(ident[:-1]), "name": ident[-1]} for ident in self.catalog.list_tables(namespace)
                ]
            }
        if method != "POST":
            raise RestError(405, "BadRequestException", f"{method} not allowed on tables")
        if not self.catalog.namespace_exists(namespace):
            raise NoSuchNamespaceError(f"namespace {'.'.join(namespace)} does not exist")
        identifier = (*namespace, body["name"])
        args: dict[str, Any] = {
            "schema": Schema.model_validate(body["schema"]),
            "location": body.get("location"),
            "properties": body.get("properties") or {},
        }
        if body.get("partition-spec"):
            args["partition_spec"] = PartitionSpec.model_validate(body["partition-spec"])
        if body.get("write-order"):
            args["sort_order"] = SortOrder.model_validate(body["write-order"])
        if body.get("stage-create"):
            if self.catalog.table_exists(identifier):
                raise TableAlreadyExistsError(f"table {'.'.join(identifier)} already exists")
            staged = self.catalog._create_staged_table(identifier, **args)
            return 200, _load_result(staged.metadata_location, staged, with_location=False)
        return 200, _load_result(None, self.catalog.create_table(identifier, **args))

    def _table(
        self, method: str, identifier: tuple[str, ...], query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any]:
        name = ".".join(identifier)
        if method == "GET":
            return 200, _load_result(None, self.catalog.load_table(identifier))
        if method == "HEAD":
            if not self.catalog.table_exists(identifier):
                raise NoSuchTableError(f"table {name} does not exist")
            return 204, None
        if method == "DELETE":
            if query.get("purgeRequested", ["false"])[0] == "true":
                self.catalog.purge_table(identifier)
            else:
                self.catalog.drop_table(identifier)
            return 204, None
        if method != "POST":
            raise RestError(405, "BadRequestException", f"{method} not allowed on a table")
        request = CommitTableRequest.model_validate(body)
        current: Table | Any
        try:
            current = self.catalog.load_table(identifier)
        except NoSuchTableError:
            # a staged create: only an assert-create requirement may commit to a missing table
            if not any(r.type == "assert-create" for r in request.requirements):
                raise
            current = _Named(identifier)
        try:
            response = self.catalog.commit_table(current, request.requirements, request.updates)
        except CommitFailedException:
            self.count_commit(name, "conflict")
            raise
        self.count_commit(name, "ok")
        return 200, {"metadata-location": response.metadata_location, "metadata": _dump(response.metadata)}


class _Named:
    """What SqlCatalog.commit_table needs of a table that does not exist yet: its name."""

    def __init__(self, identifier: tuple[str, ...]) -> None:
        self._identifier = identifier

    def name(self) -> tuple[str, ...]:
        return self._identifier


def _dump(model: Any) -> Any:
    return json.loads(model.model_dump_json(by_alias=True, exclude_none=True))


def _load_result(location: str | None, table: Table, with_location: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"metadata": _dump(table.metadata), "config": {}}
    if with_location:
        out["metadata-location"] = location or table.metadata_location
    return out


def _handler(server: IcebergRestServer) -> Callable[..., BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                if server.token is not None and self.headers.get("Authorization") != f"Bearer {server.token}":
                    raise RestError(401, "NotAuthorizedException", "missing or wrong bearer token")
                parts = [p for p in url.path.split("/") if p]
                if parts[:1] != ["v1"]:
                    raise RestError(404, "NoSuchEndpointException", f"no route {url.path}")
                try:
                    body = json.loads(raw) if raw else None
                except ValueError as exc:
                    raise RestError(400, "BadRequestException", f"malformed JSON: {exc}") from exc
                status, payload = server.route(method, parts[1:], parse_qs(url.query), body)
            except RestError as exc:
                status, payload = exc.code, _error(exc.code, exc.kind, str(exc))
            except (ValidationError, KeyError, TypeError, ValueError) as exc:
                status, payload = 400, _error(400, "BadRequestException", f"{type(exc).__name__}: {exc}")
            except Exception as exc:
                code, kind = next((v for k, v in _ERRORS.items() if isinstance(exc, k)), (500, "ServerErrorException"))
                status, payload = code, _error(code, kind, str(exc))
            data = b"" if payload is None or method == "HEAD" else json.dumps(payload).encode()
            self.send_response(status)
            if data:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if data:
                self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_HEAD(self) -> None:
            self._serve("HEAD")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

    return Handler


def _error(code: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}


@contextlib.contextmanager
def rest_catalog(root: Path, token: str | None = None) -> Iterator[IcebergRestServer]:
    with IcebergRestServer(root, token=token) as server:
        yield server
