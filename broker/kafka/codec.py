"""The Kafka wire codec: frames ⇄ kio request/response dataclasses. Sans-I/O, no sockets here.

kio (schema-generated from Kafka's JSON message specs, native decoder) does the field work.
This module adds what a broker needs around it, and is the ONE place kio's gaps are patched:

- request header parsing by hand (api key, version, correlation id, client id, header tagged
  fields) so unknown keys and versions are recognised before any body decoding;
- unknown tagged fields: kio's native reader raises on a tag it does not know, while the
  protocol (KIP-482) says to skip them. On that error we decode again with a small pure-Python
  reader over kio's own field metadata that skips unknown tags (slow path, rare);
- response framing with the right header version (kio's `__header_schema__`: ApiVersions is
  always header v0, other flexible responses header v1 with an empty tagged-field section);
- the version table advertised in ApiVersions: Kafka 4.0's ranges, cut to the versions kio
  has schemas for;
- `build` / `nested`: construct a response of any version from one set of keyword values
  (fields the version lacks are dropped), so a handler is written once for all versions.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import io
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar, cast

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)
from kio.serial._parse import get_field_reader
from kio.serial.errors import DecodeError
from kio.serial.readers import read_compact_array_length, read_int8, read_legacy_array_length, read_unsigned_varint

ZERO_THROTTLE = datetime.timedelta(0)
# what the frame walkers read: a received frame, or a view of it
Buffer = bytes | bytearray | memoryview
_F = TypeVar("_F", bound=Callable[..., Any])


def _memo(fn: _F) -> _F:
    """functools.cache that keeps the function's signature for the type checker (kio's
    message classes are hashable, but typed as type[Any], which typeshed's cache refuses)."""
    return cast(_F, functools.cache(fn))


class _CloseConnection:
    """Returned by a handler instead of a response: send nothing and close the connection
    once earlier responses are out (Kafka does this for a failed acks=0 produce)."""

    def __repr__(self) -> str:
        return "CLOSE_CONNECTION"


CLOSE_CONNECTION = _CloseConnection()

# Kafka 4.0 broker ranges (KIP-896 removed the pre-2.1 versions). Only keys with a registered
# handler are advertised; kio's available versions cut these further (see supported_range).
KAFKA_4_VERSION_RANGES: dict[int, tuple[int, int]] = {
    0: (3, 12),  # Produce
    1: (4, 17),  # Fetch
    2: (1, 10),  # ListOffsets
    3: (0, 13),  # Metadata
    8: (2, 9),  # OffsetCommit
    9: (1, 9),  # OffsetFetch
    10: (0, 6),  # FindCoordinator
    11: (0, 9),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 6),  # DescribeGroups
    16: (0, 5),  # ListGroups
    17: (0, 1),  # SaslHandshake
    18: (0, 4),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 5),  # InitProducerId
    32: (1, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs
    35: (1, 4),  # DescribeLogDirs
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    44: (0, 1),  # IncrementalAlterConfigs
    45: (0, 0),  # AlterPartitionReassignments
    46: (0, 0),  # ListPartitionReassignments
    47: (0, 0),  # OffsetDelete
    60: (0, 2),  # DescribeCluster
}

API_VERSIONS_KEY = 18
PRODUCE_KEY = 0
_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


# --------------------------------------------------------------------------- errors


class FrameError(Exception):
    """A frame that cannot be a Kafka request (too short, bad header). Close the connection."""


class UnknownApiKeyError(FrameError):
    def __init__(self, api_key: int, correlation_id: int) -> None:
        super().__init__(f"unknown api key {api_key}")
        self.api_key = api_key
        self.correlation_id = correlation_id


class UnsupportedVersionError(FrameError):
    def __init__(self, api_key: int, api_version: int, correlation_id: int, client_id: str | None) -> None:
        super().__init__(f"unsupported version {api_version} of api key {api_key}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id


class RequestDecodeError(FrameError):
    """The header was fine but the body does not decode as that request version."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int, reason: str) -> None:
        super().__init__(f"cannot decode {api_name(api_key)} v{api_version} request: {reason}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


# --------------------------------------------------------------------------- versions


def api_name(api_key: int) -> str:
    name = api_key_map.get(api_key)
    return "".join(part.capitalize() for part in name.split("_")) if name else f"ApiKey{api_key}"


@_memo
def kio_versions(api_key: int) -> frozenset[int]:
    name = api_key_map.get(api_key)
    if name is None:
        return frozenset()
    return frozenset(schema_name_map.get(name, {}).keys())


def supported_range(
    api_key: int, min_version: int | None = None, max_version: int | None = None
) -> tuple[int, int] | None:
    """The contiguous version range served for api_key: Kafka 4.0's, within kio's schemas and
    the handler's own limits; None when nothing is left."""
    kafka = KAFKA_4_VERSION_RANGES.get(api_key)
    available = kio_versions(api_key)
    if kafka is None or not available:
        return None
    low = max(kafka[0], min_version if min_version is not None else kafka[0])
    high = min(kafka[1], max_version if max_version is not None else kafka[1])
    while low <= high and low not in available:
        low += 1
    v = low
    while v <= high and v in available:
        v += 1
    return (low, v - 1) if v - 1 >= low else None


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # bytes of the header in the frame; the body follows


def peek_header(frame: Buffer) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a frame; FrameError if it is too short."""
    if len(frame) < _PREFIX.size:
        raise FrameError(f"request frame of {len(frame)} bytes is shorter than a request header")
    return _PREFIX.unpack_from(frame, 0)


def parse_header(frame: Buffer, flexible: bool) -> RequestHeader:
    """Request header v1 (or v2 when flexible): client id is always a legacy nullable string."""
    api_key, api_version, correlation_id = peek_header(frame)
    position = _PREFIX.size
    if position + 2 > len(frame):
        raise FrameError("request header truncated before client id")
    (length,) = _INT16.unpack_from(frame, position)
    position += 2
    client_id: str | None = None
    if length >= 0:
        if position + length > len(frame):
            raise FrameError("request header client id runs past the frame")
        try:
            client_id = bytes(frame[position : position + length]).decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("request header client id is not UTF-8") from None
        position += length
    elif length != -1:
        raise FrameError(f"request header client id has length {length}")
    if flexible:
        try:
            position = _skip_tagged_fields(frame, position)
        except (_LengthError, IndexError) as exc:
            raise FrameError(f"request header tagged fields malformed: {exc or 'truncated'}") from None
    return RequestHeader(api_key, api_version, correlation_id, client_id, position)


@_memo
def request_class(api_key: int, api_version: int) -> type[Any]:
    return load_request_schema(api_key, api_version)


@_memo
def response_class(api_key: int, api_version: int) -> type[Any]:
    return load_response_schema(api_key, api_version)


@_memo
def _reader(cls: type[Any]) -> Callable[..., tuple[Any, int]]:
    return entity_reader(cls)


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    header: RequestHeader
    request: Any
    response_class: type[Any]


def decode_request(frame: Buffer, served: dict[int, tuple[int, int]]) -> DecodedRequest:
    """Decode one request frame (without its 4-byte size) for the api keys/ranges `served`.

    Raises UnknownApiKeyError, UnsupportedVersionError (ApiVersions callers answer it, others
    close), RequestDecodeError or FrameError."""
    writable = frame if isinstance(frame, bytearray) else None
    if writable is not None:
        frame = memoryview(writable).toreadonly()  # kio's native readers want read-only buffers
    api_key, api_version, correlation_id = peek_header(frame)
    span = served.get(api_key)
    if span is None:
        raise UnknownApiKeyError(api_key, correlation_id)
    if not span[0] <= api_version <= span[1]:
        client_id = None
        try:
            client_id = parse_header(frame, flexible=False).client_id
        except FrameError:
            pass
        raise UnsupportedVersionError(api_key, api_version, correlation_id, client_id)
    cls = request_class(api_key, api_version)
    header = parse_header(frame, cls.__flexible__)
    try:
        # kio's native reader sizes arrays from the declared length before reading them: a
        # hostile length aborts the process on allocation failure. Check every length first.
        _check_lengths(cls, frame, header.size)
    except (_LengthError, IndexError, struct.error) as exc:
        raise RequestDecodeError(api_key, api_version, correlation_id, str(exc) or "truncated") from None
    if api_key == PRODUCE_KEY and writable is not None:
        # large produce frames: record batches stay views of the received buffer (rewritten
        # in place by the produce path), no kio copy
        try:
            request = decode_produce_in_place(writable, header.size, cls.__flexible__)
        except (IndexError, struct.error, UnicodeDecodeError, _LengthError) as exc:
            raise RequestDecodeError(api_key, api_version, correlation_id, str(exc) or "truncated") from None
        return DecodedRequest(header, request, response_class(api_key, api_version))
    try:
        request, _size = _reader(cls)(frame, header.size)
    except KeyError as exc:
        # kio knows only the tags of its schema; unknown tags must be skipped (KIP-482)
        try:
            request, _end = _read_entity_tolerant(cls, frame, header.size)
        except (DecodeError, ValueError, KeyError, TypeError, UnicodeDecodeError) as inner:
            raise RequestDecodeError(api_key, api_version, correlation_id, str(inner)) from None
        del exc
    except (DecodeError, ValueError, TypeError, UnicodeDecodeError, OverflowError) as exc:
        raise RequestDecodeError(api_key, api_version, correlation_id, str(exc) or type(exc).__name__) from None
    # Trailing bytes after the body are ignored, as the Java broker's parser does.
    return DecodedRequest(header, request, response_class(api_key, api_version))


# ----- length pre-check (guards kio's native reader against hostile array/string lengths)


class _LengthError(Exception):
    pass


_FIXED_SIZES = {
    "int8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}
_SKIP, _STRING, _BYTES, _PRIM_ARRAY, _ENTITY_ARRAY, _ENTITY, _NULLABLE_ENTITY = range(7)


@_memo
def _plan(cls: type[Any]) -> tuple[tuple[tuple[Any, ...], ...], bool]:
    """Steps (op, arg, nullable, name) to walk one entity: runs of fixed-size fields merged
    into one skip."""
    steps: list[tuple[Any, ...]] = []
    pending = 0
    for f in fields(cls):
        if get_field_tag(f) is not None:
            continue  # tagged fields live in the tag section, skipped by size
        kind = classify_field(f)
        kafka_type = f.metadata.get("kafka_type")
        if isinstance(kind, PrimitiveField) and kafka_type in _FIXED_SIZES:
            pending += _FIXED_SIZES[kafka_type]
            continue
        if pending:
            steps.append((_SKIP, pending, False, None))
            pending = 0
        nullable = is_optional(f)
        name = f"{cls.__name__}.{f.name}"
        if isinstance(kind, PrimitiveField):
            steps.append((_STRING if kafka_type == "string" else _BYTES, None, nullable, name))
        elif isinstance(kind, PrimitiveTupleField):
            steps.append((_PRIM_ARRAY, _FIXED_SIZES.get(str(kafka_type)), nullable, name))  # None: array of strings
        elif isinstance(kind, EntityTupleField):
            steps.append((_ENTITY_ARRAY, kind.type_, nullable, name))
        elif isinstance(kind, EntityField):
            steps.append((_NULLABLE_ENTITY if nullable else _ENTITY, kind.type_, nullable, name))
    if pending:
        steps.append((_SKIP, pending, False, None))
    return tuple(steps), bool(cls.__flexible__)


def _uvarint(buf: Buffer, position: int) -> tuple[int, int]:
    """(value, next position) of an unsigned varint; at most 5 bytes, as Kafka's reader."""
    value = shift = 0
    while True:
        byte = buf[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
        if shift > 28:
            raise _LengthError("varint too long")


def _skip_tagged_fields(buf: Buffer, position: int) -> int:
    """Past a tagged-field section (header, body or nested struct) without reading it."""
    count, position = _uvarint(buf, position)
    for _ in range(count):
        _tag, position = _uvarint(buf, position)
        size, position = _uvarint(buf, position)
        position += size
        if position > len(buf):
            raise _LengthError("tagged field runs past the frame")
    return position


@_memo
def _tag_plan(cls: type[Any]) -> dict[int, tuple[int, Any, bool, str]]:
    """Known tagged fields that hold arrays or structs (checked inside their size)."""
    plan: dict[int, tuple[int, Any, bool, str]] = {}
    for f in fields(cls):
        tag = get_field_tag(f)
        if tag is None:
            continue
        kind = classify_field(f)
        name = f"{cls.__name__}.{f.name}"
        if isinstance(kind, EntityField):
            plan[tag] = (_ENTITY, kind.type_, False, name)
        elif isinstance(kind, EntityTupleField):
            plan[tag] = (_ENTITY_ARRAY, kind.type_, is_optional(f), name)
        elif isinstance(kind, PrimitiveTupleField):
            plan[tag] = (_PRIM_ARRAY, _FIXED_SIZES.get(str(f.metadata.get("kafka_type"))), is_optional(f), name)
    return plan


def _check_lengths(cls: type[Any], buf: Buffer, position: int) -> int:
    """Walk one encoded entity without building it; raise _LengthError (or IndexError /
    struct.error when truncated) if any declared length cannot fit in the frame."""
    steps, flexible = _plan(cls)
    end = len(buf)
    for op, arg, nullable, name in steps:
        position = _check_step(op, arg, nullable, name, flexible, buf, position, end)
    if flexible:
        count, position = _uvarint(buf, position)
        if count > end - position:
            raise _LengthError(f"{count} tagged fields in {end - position} remaining bytes")
        tags = _tag_plan(cls)
        for _ in range(count):
            tag, position = _uvarint(buf, position)
            size, position = _uvarint(buf, position)
            if position + size > end:
                raise _LengthError("tagged field runs past the frame")
            known = tags.get(tag)
            if known is not None:
                inner = memoryview(buf)[position : position + size]
                _check_step(*known, True, inner, 0, size)
            position += size
    return position


def _null(name: str, n: int) -> _LengthError:
    # Kafka's generated readers refuse these ("non-nullable field ... was serialized as null");
    # the request is unparseable and the Java broker closes the connection
    if n == -1:
        return _LengthError(f"non-nullable field {name} was serialized as null")
    return _LengthError(f"field {name} has negative length {n}")


def _check_step(
    op: int, arg: Any, nullable: bool, name: str, flexible: bool, buf: Buffer, position: int, end: int
) -> int:
    if op == _SKIP:
        position += arg
    elif op in (_STRING, _BYTES):
        if flexible:
            n, position = _uvarint(buf, position)
            n -= 1
        elif op == _STRING:
            (n,) = _INT16.unpack_from(buf, position)
            position += 2
        else:
            (n,) = _INT32.unpack_from(buf, position)
            position += 4
        if n > 0:
            position += n
        elif n < 0 and (n != -1 or not nullable):
            raise _null(name, n)
    elif op in (_ENTITY, _NULLABLE_ENTITY):
        if op == _NULLABLE_ENTITY:
            marker = buf[position]
            position += 1
            if marker == 0xFF:
                return position
        position = _check_lengths(arg, buf, position)
    else:
        if flexible:
            n, position = _uvarint(buf, position)
            n -= 1
        else:
            (n,) = _INT32.unpack_from(buf, position)
            position += 4
        if n < 0 and (n != -1 or not nullable):
            raise _null(name, n)
        if n <= 0:
            return position
        if n > end - position:
            raise _LengthError(f"array of {n} elements in {end - position} remaining bytes")
        if op == _PRIM_ARRAY:
            if arg is not None:
                position += n * arg
            else:
                for _ in range(n):
                    if flexible:
                        m, position = _uvarint(buf, position)
                        m -= 1
                    else:
                        (m,) = _INT16.unpack_from(buf, position)
                        position += 2
                    if m > 0:
                        position += m
                    elif m < 0:
                        raise _null(f"{name}[]", m)
        else:
            for _ in range(n):
                position = _check_lengths(arg, buf, position)
    if position > end:
        raise _LengthError("field runs past the frame")
    return position


# ----- Produce without copies


@dataclass(slots=True)
class ProducePartitionView:
    index: int
    records: memoryview | None  # writable view into the request frame


@dataclass(slots=True)
class ProduceTopicView:
    name: str
    partition_data: list[ProducePartitionView]


@dataclass(slots=True)
class ProduceRequestView:
    """Produce v3-v12 with kio's attribute names; records are views of the frame."""

    transactional_id: str | None
    acks: int
    timeout: datetime.timedelta
    topic_data: list[ProduceTopicView]


def decode_produce_in_place(buf: bytearray, position: int, flexible: bool) -> ProduceRequestView:
    """Decode a Produce request body (lengths already checked by _check_lengths)."""
    view = memoryview(buf)

    def string(pos: int, nullable: bool) -> tuple[str | None, int]:
        if flexible:
            n, pos = _uvarint(buf, pos)
            n -= 1
        else:
            (n,) = _INT16.unpack_from(buf, pos)
            pos += 2
        if n < 0:
            if not nullable:
                raise _LengthError("null string where one is required")
            return None, pos
        return bytes(view[pos : pos + n]).decode("utf-8"), pos + n

    def array_length(pos: int) -> tuple[int, int]:
        if flexible:
            n, pos = _uvarint(buf, pos)
            return n - 1, pos
        (n,) = _INT32.unpack_from(buf, pos)
        return n, pos + 4

    transactional_id, position = string(position, True)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(buf, position)
    position += _ACKS_TIMEOUT.size
    topics: list[ProduceTopicView] = []
    n_topics, position = array_length(position)
    for _ in range(max(n_topics, 0)):
        name, position = string(position, False)
        partitions: list[ProducePartitionView] = []
        n_parts, position = array_length(position)
        for _ in range(max(n_parts, 0)):
            (index,) = _INT32.unpack_from(buf, position)
            position += 4
            if flexible:
                size, position = _uvarint(buf, position)
                size -= 1
            else:
                (size,) = _INT32.unpack_from(buf, position)
                position += 4
            records = None
            if size >= 0:
                if position + size > len(buf):
                    raise _LengthError("records run past the frame")
                records = view[position : position + size]
                position += size
            if flexible:
                position = _skip_tagged_fields(buf, position)
            partitions.append(ProducePartitionView(index, records))
        if flexible:
            position = _skip_tagged_fields(buf, position)
        topics.append(ProduceTopicView(name, partitions))  # type: ignore[arg-type]
    return ProduceRequestView(transactional_id, acks, datetime.timedelta(milliseconds=timeout_ms), topics)


_ACKS_TIMEOUT = struct.Struct(">hi")


# ----- the tolerant slow path


def _read_entity_tolerant(cls: type[Any], buf: Buffer, position: int) -> tuple[Any, int]:
    values: dict[str, Any] = {}
    tagged: dict[int, dataclasses.Field[Any]] = {}
    for f in fields(cls):
        tag = get_field_tag(f)
        if tag is not None:
            tagged[tag] = f
            continue
        values[f.name], position = _read_field(cls, f, buf, position, is_tag=False)
    if cls.__flexible__:
        count, n = read_unsigned_varint(buf, position)
        position += n
        for _ in range(count):
            tag, n = read_unsigned_varint(buf, position)
            position += n
            size, n = read_unsigned_varint(buf, position)
            position += n
            tagged_field = tagged.get(tag)
            if tagged_field is not None:
                values[tagged_field.name], _ = _read_field(cls, tagged_field, buf, position, is_tag=True)
            position += size
            if position > len(buf):
                raise DecodeError("tagged field runs past the frame")
    return cls(**values), position


def _read_field(cls: type[Any], f: dataclasses.Field[Any], buf: Buffer, position: int, is_tag: bool) -> tuple[Any, int]:
    kind = classify_field(f)
    if isinstance(kind, (PrimitiveField, PrimitiveTupleField)):
        value, size = get_field_reader(cls, f, False, is_tag)(buf, position)  # kio returns sizes, not positions
        return value, position + size
    if isinstance(kind, EntityField):
        if is_optional(f) and not is_tag:
            marker, n = read_int8(buf, position)
            position += n
            if marker < 0:
                return None, position
        return _read_entity_tolerant(kind.type_, buf, position)
    if isinstance(kind, EntityTupleField):
        if cls.__flexible__:
            length, n = read_compact_array_length(buf, position)
        else:
            length, n = read_legacy_array_length(buf, position)
            length = None if length < 0 else length
        position += n
        if length is None:
            return None, position
        if length > len(buf) - position:
            raise DecodeError("array length runs past the frame")
        items = []
        for _ in range(length):
            item, position = _read_entity_tolerant(kind.type_, buf, position)
            items.append(item)
        return tuple(items), position
    raise TypeError(f"unsupported field {f.name} of {cls.__name__}")


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
