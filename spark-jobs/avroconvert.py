"""Schema-registry value conversions of table topics: `by_schema_id` and `by_latest_schema`.

`by_schema_id`: each value is in Confluent's wire format (byte 0 = magic 0, bytes 1-4 = the
schema id, big-endian, then the Avro binary body), the writer schema comes from the schema
registry by id. `by_latest_schema`: values are plain Avro bodies written with the latest
schema of the subject `automq.table.topic.convert.value.subject` (default `<topic>-value`),
which the driver looks up once per run.

Schemas are fetched over the registry's REST API (`GET /schemas/ids/{id}`) and cached per
process, so an executor asks once per id. The controller serves the registry (docs/
schema-registry.md), so the default registry URL is the cluster's controller; the
controller token (`AUTOMQ_CONTROLLER_TOKEN_FILE`) and CA (`AUTOMQ_CONTROLLER_CA_FILE`) are
used when set. A registry that cannot be reached fails the run (the records are fine; a
dead letter would lose them); an id the registry does not know, a bad magic byte or a body
that does not decode is a bad record (errors.tolerance).

Avro types become Arrow (then Iceberg) types: records -> structs, arrays -> lists, maps ->
maps (string keys), `["null", T]` unions -> nullable T, enums -> strings, fixed -> fixed-size
binary, bytes -> binary, int/long/float/double/boolean/string as themselves; logical types
decimal -> decimal(p, s), date -> date, time-millis/micros -> time (us), timestamp-millis/
micros -> timestamptz (us), local-timestamp-* -> timestamp (us), uuid -> string. Records of
several schema ids in one run land in one table whose schema is the union of theirs (a field
a version added is a new column; int -> long and float -> double are promoted). Not
representable, so their records are bad records: unions of two or more non-null types and
recursive records.

Ids whose schema is a JSON Schema (Confluent's JSON Schema serializer: the header, then JSON
text) are decoded with `json` and typed by jsonschematypes.py; values that do not fit those
types are bad records. Ids whose schema is Protobuf (Confluent's Protobuf serializer: the
header, the message indexes, then the message) are fetched in the serialized form
(`?format=serialized`, with their references) and decoded by protoconvert.py. The registry's
`schemaType` of the id decides which, here and nowhere else.

Decoding is per record (fastavro, json); building the columns is one Arrow call per batch.
"""

from __future__ import annotations

import io
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fastavro
import pyarrow as pa

from automq.broker.controller.schema_registry.protobuf import InvalidSchema as InvalidProtobuf
from automq.broker.security.controller_auth import ControllerClientAuth
from automq.spark import jsonschematypes, protoconvert

MAGIC = 0
HEADER = 5
TIMEOUT_S = 30.0


class RegistryUnavailable(Exception):
    """The schema registry could not answer (not: it said the id is unknown)."""


class UnknownSchema(Exception):
    """The registry does not know this schema id / subject."""


class UnsupportedSchema(Exception):
    """A valid Avro schema with no table representation (a message says why)."""


@dataclass(frozen=True, slots=True)
class WriterSchema:
    schema_id: int
    parsed: Any  # for fastavro.schemaless_reader (AVRO), a protoconvert.ProtoSchema (PROTOBUF)
    arrow: pa.DataType | None  # None: unsupported (see `problem`); PROTOBUF: per message, see protoconvert
    problem: str = ""
    kind: str = "AVRO"  # or JSON (JSON text after the header), PROTOBUF (message indexes, then the message)


_CACHE: dict[tuple[str, int], WriterSchema] = {}
# ids the registry said it does not know: records carrying random ids cost one request per id
_UNKNOWN: set[tuple[str, int]] = set()


def _request(urls: str, path: str, query: str = "") -> dict[str, Any]:
    auth = ControllerClientAuth.from_env()
    failures = []
    for base in (u.strip() for u in urls.split(",") if u.strip()):
        req = urllib.request.Request(base.rstrip("/") + path + query, headers=auth.headers())
        context = (
            auth.ssl if auth.ssl is not None else (ssl.create_default_context() if base.startswith("https") else None)
        )
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S, context=context) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                body = {}
            if exc.code == 404 and body.get("error_code") in (40401, 40402, 40403):
                raise UnknownSchema(body.get("message", "not found")) from None
            failures.append(f"{base}: HTTP {exc.code} {body.get('message', '')}".strip())
        except (OSError, ValueError) as exc:
            failures.append(f"{base}: {exc}")
    raise RegistryUnavailable(
        f"schema registry unreachable ({'; '.join(failures) or 'no URL'}); set --schema-registry-url"
    )


def writer_schema(urls: str, schema_id: int) -> WriterSchema:
    """The registry's schema `schema_id`, parsed and mapped (cached per process)."""
    cached = _CACHE.get((urls, schema_id))
    if cached is not None:
        return cached
    if (urls, schema_id) in _UNKNOWN:
        raise UnknownSchema(f"schema {schema_id} not found")
    try:
        body = _request(urls, f"/schemas/ids/{schema_id}")
    except UnknownSchema:
        _UNKNOWN.add((urls, schema_id))
        raise
    schema_type = body.get("schemaType", "AVRO")
    if schema_type == "JSON":
        result = build_json(schema_id, body["schema"])
    elif schema_type == "PROTOBUF":
        result = build_protobuf(urls, schema_id)
    elif schema_type != "AVRO":
        result = WriterSchema(schema_id, None, None, f"schema {schema_id} is {schema_type}, not AVRO, JSON or PROTOBUF")
    else:
        refs = [_referenced(urls, r) for r in body.get("references") or []]
        result = build(schema_id, body["schema"], refs)
    _CACHE[(urls, schema_id)] = result
    return result


def _referenced(urls: str, ref: dict[str, Any]) -> str:
    subject = urllib.parse.quote(str(ref["subject"]), safe="")
    return str(_request(urls, f"/subjects/{subject}/versions/{ref['version']}")["schema"])


def build_protobuf(urls: str, schema_id: int) -> WriterSchema:
    """A Protobuf schema in its serialized form, with its references (theirs first)."""
    body = _request(urls, f"/schemas/ids/{schema_id}", "?format=serialized")
    try:
        imports = _protobuf_imports(urls, body.get("references") or [], 0)
        parsed = protoconvert.build(schema_id, body["schema"], imports)
    except (InvalidProtobuf, UnknownSchema, RecursionError) as exc:
        return WriterSchema(schema_id, None, None, f"Protobuf schema {schema_id}: {exc}", kind="PROTOBUF")
    return WriterSchema(schema_id, parsed, pa.null(), kind="PROTOBUF")


def _protobuf_imports(urls: str, references: list[dict[str, Any]], depth: int) -> list[tuple[str, str]]:
    if depth > 32:
        raise UnknownSchema("references nested deeper than 32")
    found: list[tuple[str, str]] = []
    for ref in references:
        subject = urllib.parse.quote(str(ref["subject"]), safe="")
        body = _request(urls, f"/subjects/{subject}/versions/{ref['version']}", "?format=serialized")
        found += _protobuf_imports(urls, body.get("references") or [], depth + 1)
        found.append((str(ref["name"]), str(body["schema"])))
    return found


def latest_schema_id(urls: str, subject: str) -> int:
    """The id of `subject`'s latest version (the driver, once per run)."""
    quoted = urllib.parse.quote(subject, safe="")
    try:
        return int(_request(urls, f"/subjects/{quoted}/versions/latest")["id"])
    except UnknownSchema:
        raise UnknownSchema(
            f"subject {subject!r} has no schema in the registry (automq.table.topic.convert.value.subject)"
        ) from None


def build(schema_id: int, text: str, references: Sequence[str] = ()) -> WriterSchema:
    named: dict[str, Any] = {}
    try:
        for ref in references:
            fastavro.parse_schema(_plain_uuids(json.loads(ref)), named_schemas=named)
        parsed = fastavro.parse_schema(_plain_uuids(json.loads(text)), named_schemas=named)
    except Exception as exc:  # another registry may hold what fastavro cannot parse
        return WriterSchema(schema_id, None, None, f"schema {schema_id} does not parse: {type(exc).__name__}: {exc}")
    try:
        arrow = to_arrow(json.loads(text), _names(references))
    except (UnsupportedSchema, RecursionError) as exc:
        return WriterSchema(schema_id, parsed, None, f"schema {schema_id}: {exc or 'nested too deeply'}")
    return WriterSchema(schema_id, parsed, arrow)


def build_json(schema_id: int, text: str) -> WriterSchema:
    try:
        arrow = jsonschematypes.to_arrow(json.loads(text))
    except (jsonschematypes.UnsupportedSchema, ValueError, RecursionError) as exc:
        return WriterSchema(schema_id, None, None, f"JSON schema {schema_id}: {exc}", kind="JSON")
    return WriterSchema(schema_id, None, arrow, kind="JSON")


def _plain_uuids(doc: Any) -> Any:
    """The schema with uuid logical types dropped: fastavro then returns the strings as they
    are on the wire (a uuid column is a string column here)."""
    if isinstance(doc, dict):
        out = {k: _plain_uuids(v) for k, v in doc.items()}
        if out.get("logicalType") == "uuid":
            out.pop("logicalType")
        return out
    if isinstance(doc, list):
        return [_plain_uuids(x) for x in doc]
    return doc


# --------------------------------------------------------------------------- Avro -> Arrow

_PRIMITIVE = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_LOGICAL = {
    "date": pa.date32(),
    "time-millis": pa.time64("us"),
    "time-micros": pa.time64("us"),
    "timestamp-millis": pa.timestamp("us", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("us"),
    "local-timestamp-micros": pa.timestamp("us"),
    "uuid": pa.string(),
}


def _fullname(doc: dict[str, Any], namespace: str) -> tuple[str, str]:
    name = doc["name"]
    if "." in name:
        return name, name.rsplit(".", 1)[0]
    ns = doc.get("namespace", namespace)
    return (f"{ns}.{name}" if ns else name), ns


def _names(references: Sequence[str]) -> dict[str, Any]:
    """Named types of the referenced schemas (full name -> definition and namespace)."""
    names: dict[str, Any] = {}
    for ref in references:
        _collect(json.loads(ref), "", names)
    return names


def _collect(doc: Any, namespace: str, names: dict[str, Any]) -> None:
    if isinstance(doc, list):
        for x in doc:
            _collect(x, namespace, names)
    elif isinstance(doc, dict) and doc.get("type") in ("record", "error", "enum", "fixed"):
        full, ns = _fullname(doc, namespace)
        names[full] = (doc, ns)
        for f in doc.get("fields", ()):
            _collect(f["type"], ns, names)
    elif isinstance(doc, dict):
        for key in ("items", "values", "type"):
            if isinstance(doc.get(key), (dict, list)):
                _collect(doc[key], namespace, names)


def to_arrow(doc: Any, names: dict[str, Any], namespace: str = "", stack: tuple[str, ...] = ()) -> pa.DataType:
    if isinstance(doc, str):
        if doc in _PRIMITIVE:
            return _PRIMITIVE[doc]
        if doc == "null":
            return pa.null()
        full = doc if "." in doc or doc in names else (f"{namespace}.{doc}" if namespace else doc)
        if full not in names:
            full = doc
        if full in stack:
            raise UnsupportedSchema(f"recursive record {full} has no table representation")
        if full not in names:
            raise UnsupportedSchema(f"unknown named type {doc}")
        definition, ns = names[full]
        return to_arrow(definition, names, ns, stack)
    if isinstance(doc, list):
        branches = [b for b in doc if b != "null"]
        if len(branches) != 1:
            raise UnsupportedSchema(f'union {json.dumps(doc)} has no table representation (only ["null", T])')
        return to_arrow(branches[0], names, namespace, stack)
    kind = doc["type"]
    logical = doc.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(doc["precision"]), int(doc.get("scale", 0))
        if precision > 38:
            raise UnsupportedSchema(f"decimal({precision}, {scale}): Iceberg decimals hold at most 38 digits")
        if kind == "fixed":
            full, _ = _fullname(doc, namespace)
            names[full] = (doc, namespace)
        return pa.decimal128(precision, scale)
    if logical in _LOGICAL and kind in ("int", "long", "string"):
        return _LOGICAL[logical]
    if kind in _PRIMITIVE or kind == "null":
        return to_arrow(kind, names, namespace, stack)
    if kind == "array":
        return pa.list_(to_arrow(doc["items"], names, namespace, stack))
    if kind == "map":
        return pa.map_(pa.string(), to_arrow(doc["values"], names, namespace, stack))
    if kind in ("record", "error", "enum", "fixed"):
        full, ns = _fullname(doc, namespace)
        names[full] = (doc, ns)
        if kind == "enum":
            return pa.string()
        if kind == "fixed":
            return pa.binary(int(doc["size"]))
        inner = (*stack, full)
        return pa.struct([pa.field(f["name"], to_arrow(f["type"], names, ns, inner)) for f in doc["fields"]])
    if isinstance(kind, (dict, list)):
        return to_arrow(kind, names, namespace, stack)
    raise UnsupportedSchema(f"unknown Avro type {kind!r}")


# --------------------------------------------------------------------------- decoding


@dataclass(slots=True)
class Decoded:
    fields: pa.Table  # one row per good record, in order
    good: list[bool]  # per input value
    errors: list[str]  # per bad value, in order


def decode(values: list[bytes | None], registry_url: str, latest_id: int | None, message: str = "") -> Decoded:
    """Values -> a table of their fields. `latest_id`: by_latest_schema (no wire header; for
    Protobuf, values of the message `message`, "" for the schema's first)."""
    records: list[dict[str, Any] | None] = []
    positions: list[int] = []  # the value each record came from
    types: dict[Any, pa.DataType] = {}  # per schema id (and Protobuf message)
    errors: dict[int, str] = {}
    latest = writer_schema(registry_url, latest_id) if latest_id is not None else None
    for i, value in enumerate(values):
        if value is None:
            records.append(None)
            positions.append(i)
            continue
        if latest is not None:
            schema, body = latest, value
        else:
            if len(value) < HEADER or value[0] != MAGIC:
                errors[i] = (
                    f"value is not in the schema registry wire format (magic byte {value[:1].hex() or 'missing'})"
                )
                continue
            schema_id = int.from_bytes(value[1:HEADER], "big")
            try:
                schema = writer_schema(registry_url, schema_id)
            except UnknownSchema:
                errors[i] = f"schema id {schema_id} is not in the schema registry"
                continue
            body = value[HEADER:]
        if schema.arrow is None:
            errors[i] = schema.problem
            continue
        key: Any = schema.schema_id
        if schema.kind == "PROTOBUF":
            record, reader, problem = protoconvert.read(schema.parsed, body, latest is None, message)
            arrow, key = (reader.arrow, (schema.schema_id, reader.name)) if reader is not None else (None, key)
        else:
            (record, problem), arrow = _read(schema, body), schema.arrow
        if problem or arrow is None:
            errors[i] = problem
            continue
        if not pa.types.is_struct(arrow):
            record = {"value": record}  # a schema that is not a record/object: one column named value
            types.setdefault(key, pa.struct([pa.field("value", arrow)]))
        elif isinstance(record, dict):
            types.setdefault(key, arrow)
        else:
            errors[i] = f"value is JSON {type(record).__name__}, not the object schema {schema.schema_id} describes"
            continue
        records.append(record)
        positions.append(i)
    fields = pa.table({})
    if types:  # else no record with fields (only null values, or none good)
        struct = pa.struct(
            list(pa.unify_schemas([pa.schema(list(t)) for t in types.values()], promote_options="permissive"))
        )
        try:
            array = pa.array(records, type=struct)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            # JSON values need not match their schema's types: find the ones that do not
            keep = []
            for record, i in zip(records, positions, strict=True):
                try:
                    pa.array([record], type=struct)
                    keep.append((record, i))
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
                    errors[i] = f"value does not fit its schema's column types: {exc}"
            records, positions = [r for r, _ in keep], [i for _, i in keep]
            array = pa.array(records, type=struct)
        fields = pa.Table.from_struct_array(array)
    good = [i not in errors for i in range(len(values))]
    return Decoded(fields, good, [errors[i] for i in sorted(errors)])


def _read(schema: WriterSchema, body: bytes) -> tuple[Any, str]:
    """(the decoded value, "") or (None, why it does not decode)."""
    if schema.kind == "JSON":
        try:
            return json.loads(body), ""
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return None, f"value is not JSON (schema {schema.schema_id}): {exc}"
    buf = io.BytesIO(body)
    try:
        record = fastavro.schemaless_reader(buf, schema.parsed, None)
    except Exception as exc:  # fastavro raises many types on a truncated or foreign body
        return None, f"value does not decode with schema {schema.schema_id}: {type(exc).__name__}: {exc}"
    if buf.tell() != len(body):
        return None, f"value does not decode with schema {schema.schema_id}: {len(body) - buf.tell()} bytes left over"
    return record, ""
