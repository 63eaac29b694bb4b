"""Responses: framing with the right header version, encoding to chunks without joining record
sets, and building a response of any version from one set of values (`build`, `nested`,
`error_response`); also `encode_request`/`decode_response` for tools and tests."""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from kio.serial import entity_writer
from kio.serial._introspect import (
    EntityField,
    classify_field,
    is_optional,
)

from automq.broker.kafka.codec._common import (
    _INT16,
    _INT32,
    _PREFIX,
    ZERO_THROTTLE,
    _memo,
)
from automq.broker.kafka.codec.framing import _reader, response_class
from automq.broker.kafka.codec.lengths import _skip_tagged_fields

# --------------------------------------------------------------------------- responses


@_memo
def _writer(cls: type[Any]) -> Callable[..., None]:
    return entity_writer(cls)


class RecordSet:
    """Stored batches sent as one `records` field without joining them: the response is
    written as a list of chunks and large payloads go to the socket by reference."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list[bytes | memoryview]) -> None:
        self.parts = parts
        self.size = sum(len(p) for p in parts)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


class _ChunkWriter:
    """What kio's writers write into: small writes are gathered, large ones referenced."""

    LARGE = 16 << 10
    __slots__ = ("chunks", "current")

    def __init__(self) -> None:
        self.chunks: list[bytes | bytearray | memoryview] = []
        self.current = bytearray()

    def write(self, data: Any) -> None:
        if isinstance(data, RecordSet):
            for part in data.parts:
                self.write(part)
        elif len(data) >= self.LARGE:
            if self.current:
                self.chunks.append(self.current)
                self.current = bytearray()
            self.chunks.append(data)
        else:
            self.current += data

    def finish(self) -> list[bytes | bytearray | memoryview]:
        if self.current:
            self.chunks.append(self.current)
            self.current = bytearray()
        return self.chunks


def encode_response_chunks(correlation_id: int, response: Any) -> list[bytes | bytearray | memoryview]:
    """Response header (v0 or v1 as kio's schema says) + body as chunks, no size prefix."""
    out = _ChunkWriter()
    out.write(_INT32.pack(correlation_id))
    if response.__header_schema__.__flexible__:
        out.write(b"\x00")  # header v1: no tagged fields
    _writer(type(response))(out, response)
    return out.finish()


def encode_response(correlation_id: int, response: Any) -> bytes:
    """Response header + body as one bytes object, without the size prefix."""
    return b"".join(encode_response_chunks(correlation_id, response))


def encode_request(correlation_id: int, request: Any, client_id: str | None = "automq") -> bytes:
    """A request frame without size prefix (tests and tools speak to the broker with it)."""
    buf = io.BytesIO()
    buf.write(_PREFIX.pack(request.__api_key__, request.__version__, correlation_id))
    if client_id is None:
        buf.write(_INT16.pack(-1))
    else:
        raw = client_id.encode()
        buf.write(_INT16.pack(len(raw)))
        buf.write(raw)
    if request.__flexible__:
        buf.write(b"\x00")
    _writer(type(request))(buf, request)
    return buf.getvalue()


def decode_response(frame: bytes, request_cls: type[Any]) -> tuple[int, Any]:
    """(correlation_id, response) from a response frame without size prefix (tests/tools)."""
    cls = response_class(request_cls.__api_key__, request_cls.__version__)
    (correlation_id,) = _INT32.unpack_from(frame, 0)
    position = 4
    if cls.__header_schema__.__flexible__:
        position = _skip_tagged_fields(frame, position)
    response, _ = _reader(cls)(frame, position)
    return correlation_id, response


# ----- building responses of any version from one set of values


@_memo
def _field_names(cls: type[Any]) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def build(cls: type[Any], **values: Any) -> Any:
    """cls(**values) keeping only the fields this version of the message has."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def has_field(cls: type[Any], name: str) -> bool:
    return name in _field_names(cls)


@_memo
def is_nullable(cls: type[Any], name: str) -> bool:
    """Whether this version of the message may carry null in field `name`."""
    return any(f.name == name and is_optional(f) for f in fields(cls))


def nested(cls: type[Any], name: str) -> type[Any]:
    """A nested entity class (e.g. 'MetadataResponseBroker') of the same schema module/version."""
    found: type[Any] = getattr(importlib.import_module(cls.__module__), name)
    return found


# ----- error responses for any API (a handler failed unexpectedly)


def _default_for(f: dataclasses.Field[Any], error_code: Any) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    kafka_type = f.metadata.get("kafka_type")
    if kafka_type == "error_code":
        return error_code
    kind = classify_field(f)
    if kind.is_array:
        return ()
    if is_optional(f):
        return None
    if isinstance(kind, EntityField):
        return error_response(kind.type_, error_code)
    return {
        "string": "",
        "bytes": b"",
        "records": b"",
        "bool": False,
        "uuid": None,
        "timedelta_i32": ZERO_THROTTLE,
        "timedelta_i64": ZERO_THROTTLE,
        "datetime_i64": datetime.datetime.fromtimestamp(0, datetime.UTC),
        "float64": 0.0,
    }.get(str(kafka_type), -1 if kafka_type in ("int32", "int64") else 0)


def error_response(cls: type[Any], error_code: Any) -> Any:
    """A response of `cls` carrying error_code in every required error field, empty lists
    elsewhere: what a Java broker's `getErrorResponse` amounts to for unexpected failures."""
    return cls(
        **{
            f.name: _default_for(f, error_code)
            for f in fields(cls)
            if f.default is dataclasses.MISSING or f.metadata.get("kafka_type") == "error_code"
        }
    )
