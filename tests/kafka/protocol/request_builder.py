"""Valid and deliberately broken Kafka requests of any API and version, built from kio's schemas.

- `minimal(cls)`: a valid instance with one element in every array of structs (so every nested
  field exists on the wire) and short non-empty strings;
- `null_paths(cls)`: every non-tagged field the protocol declares non-nullable but that has a
  null encoding on the wire (strings, bytes, records, arrays), at any depth;
- `encode_with_null(cid, request, path)`: the request frame with that one field encoded null
  (legacy length -1, compact length 0), everything else as kio writes it.
"""

from __future__ import annotations

import datetime
import io
import struct
import uuid
from dataclasses import MISSING, fields
from typing import Any

from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)
from kio.serial._serialize import get_field_writer

Path = tuple[str, ...]

_NULLABLE_ON_WIRE = {"string", "bytes", "records"}


def _primitive(kafka_type: str, name: str) -> Any:
    if kafka_type == "string":
        return "x"
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=1)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    if kafka_type == "float64":
        return 0.0
    if kafka_type == "error_code":
        from kio.schema.errors import ErrorCode

        return ErrorCode.none
    return 0


def minimal(cls: type) -> Any:
    values = {}
    for f in fields(cls):
        if get_field_tag(f) is not None:
            # left at its default: encode_with_null omits tagged fields
            values[f.name] = f.default if f.default is not MISSING else get_tagged_field_default(f)
            continue
        kind = classify_field(f)
        if isinstance(kind, PrimitiveField):
            values[f.name] = _primitive(f.metadata.get("kafka_type"), f.name)
        elif isinstance(kind, PrimitiveTupleField):
            values[f.name] = ()
        elif isinstance(kind, EntityTupleField):
            values[f.name] = (minimal(kind.type_),)
        elif isinstance(kind, EntityField):
            values[f.name] = minimal(kind.type_)
    return cls(**values)


def null_paths(cls: type, prefix: Path = ()) -> list[Path]:
    out: list[Path] = []
    for f in fields(cls):
        if get_field_tag(f) is not None:
            continue
        kind = classify_field(f)
        path = (*prefix, f.name)
        nullable = is_optional(f)
        if isinstance(kind, (PrimitiveTupleField, EntityTupleField)):
            if not nullable:
                out.append(path)
        elif isinstance(kind, PrimitiveField) and not nullable and f.metadata.get("kafka_type") in _NULLABLE_ON_WIRE:
            out.append(path)
        if isinstance(kind, (EntityTupleField, EntityField)):
            out.extend(null_paths(kind.type_, path))
    return out


def _write_null(buf: io.BytesIO, f, flexible: bool) -> None:
    if flexible:
        buf.write(b"\x00")  # compact length 0 = null
    elif isinstance(classify_field(f), PrimitiveField) and f.metadata.get("kafka_type") == "string":
        buf.write(struct.pack(">h", -1))
    else:
        buf.write(struct.pack(">i", -1))


def _write(buf: io.BytesIO, entity: Any, path: Path) -> None:
    cls = type(entity)
    flexible = cls.__flexible__
    for f in fields(cls):
        if get_field_tag(f) is not None:
            continue  # tagged fields are optional: omitted
        value = getattr(entity, f.name)
        if path and path[0] == f.name:
            kind = classify_field(f)
            if len(path) == 1:
                _write_null(buf, f, flexible)
                continue
            if isinstance(kind, EntityTupleField):
                first = value[0] if value else minimal(kind.type_)
                if flexible:
                    buf.write(b"\x02")  # compact length 1 + 1
                else:
                    buf.write(struct.pack(">i", 1))
                _write(buf, first, path[1:])
                continue
            if isinstance(kind, EntityField):
                if is_optional(f):
                    buf.write(b"\x01")
                _write(buf, value if value is not None else minimal(kind.type_), path[1:])
                continue
        get_field_writer(f, flexible, False, get_field_tag(f) is not None)(buf, value)
    if flexible:
        buf.write(b"\x00")  # no tagged fields


def header(api_key: int, api_version: int, correlation_id: int, flexible: bool, client_id: bytes = b"fuzz") -> bytes:
    out = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id)) + client_id
    return out + (b"\x00" if flexible else b"")


def encode_with_null(correlation_id: int, request: Any, path: Path) -> bytes:
    """The request frame (without size prefix) with the field at `path` encoded as null."""
    buf = io.BytesIO()
    buf.write(header(request.__api_key__, request.__version__, correlation_id, request.__flexible__))
    _write(buf, request, path)
    return buf.getvalue()
