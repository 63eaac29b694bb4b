"""Protobuf values of table topics (`by_schema_id`, `by_latest_schema`): decoding and the
Protobuf -> Arrow (then Iceberg) type mapping.

Confluent's Protobuf wire format is byte 0 = magic 0, bytes 1-4 = the schema id, then the
message indexes (a zigzag varint count, then that many zigzag varint indexes: the path from
the file's top-level messages through nested ones to the value's message; a count of 0 means
[0], the first message), then the serialized message. The schema is the registry's
FileDescriptorProto (`?format=serialized`), built into a descriptor pool with its references
and the runtime's well-known types (`automq.broker.controller.schema_registry.protobuf`), and
messages are parsed by the protobuf runtime (upb).

Types: int32/sint32/sfixed32 -> int, int64/sint64/sfixed64 -> long, uint32/fixed32 -> long,
uint64/fixed64 -> decimal(20, 0) (Iceberg has no unsigned types; a long would turn values
from 2^63 on negative), float, double, bool, string, bytes -> binary, enums -> string (the
value's name; a number the schema does not name -> its decimal text), messages -> structs,
repeated -> lists, map<K, V> -> maps, google.protobuf.Timestamp -> timestamptz (us),
wrappers (google.protobuf.Int32Value, StringValue, ...) -> their nullable scalar. Presence:
fields with presence (message fields, proto3 `optional`, oneof members, proto2 optional) are
null when not set; proto3 scalars without `optional` hold their value, the default (0, "",
false, the first enum value) when it was not written, as a Protobuf reader sees them. A
field of a message with no fields (google.protobuf.Empty) is not a column. Recursive messages
(google.protobuf.Struct and Value among them) have no table representation: their records
are bad records, as is a body that does not parse or indexes naming no message.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor as FD
from google.protobuf.descriptor_pb2 import DescriptorProto, FileDescriptorProto
from google.protobuf.message import DecodeError, Message

from automq.broker.controller.schema_registry import protobuf

_SCALARS: dict[int, pa.DataType] = {
    FD.TYPE_INT32: pa.int32(),
    FD.TYPE_SINT32: pa.int32(),
    FD.TYPE_SFIXED32: pa.int32(),
    FD.TYPE_INT64: pa.int64(),
    FD.TYPE_SINT64: pa.int64(),
    FD.TYPE_SFIXED64: pa.int64(),
    FD.TYPE_UINT32: pa.int64(),
    FD.TYPE_FIXED32: pa.int64(),
    FD.TYPE_UINT64: pa.decimal128(20, 0),
    FD.TYPE_FIXED64: pa.decimal128(20, 0),
    FD.TYPE_FLOAT: pa.float32(),
    FD.TYPE_DOUBLE: pa.float64(),
    FD.TYPE_BOOL: pa.bool_(),
    FD.TYPE_STRING: pa.string(),
    FD.TYPE_BYTES: pa.binary(),
}
_WRAPPERS = {
    f"google.protobuf.{name}Value"
    for name in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
}
MAX_INDEXES = 64

Convert = Callable[[Any], Any]


class UnsupportedMessage(Exception):
    """A valid message type with no table representation (a message says why)."""


@dataclass(frozen=True, slots=True)
class MessageReader:
    """One message type of a schema: its class, its column types and its row converter."""

    name: str  # the message's full name
    message_class: type[Message] | None
    arrow: pa.DataType | None  # None: no table representation (`problem`)
    convert: Convert | None
    problem: str = ""


@dataclass(slots=True)
class ProtoSchema:
    """A registry schema's file, built; readers per message path, made on first use."""

    schema_id: int
    file: descriptor.FileDescriptor
    proto: FileDescriptorProto  # its declaration order is what message indexes count
    readers: dict[tuple[int, ...] | str, MessageReader] = field(default_factory=dict)

    def reader(self, path: tuple[int, ...] | str) -> MessageReader:
        """The reader of the message at `path` (message indexes) or of that full name."""
        found = self.readers.get(path)
        if found is None:
            found = self.readers[path] = _reader(self.schema_id, _message(self.file, self.proto, path))
        return found


def build(schema_id: int, serialized: str, imports: Sequence[tuple[str, str]] = ()) -> ProtoSchema:
    """The schema (base64 FileDescriptorProto) with its references' (import name, base64),
    dependencies first. protobuf.InvalidSchema when it does not build."""
    fdp = protobuf.decode(serialized)
    pool: descriptor_pool.DescriptorPool = protobuf.build(fdp, [(n, protobuf.decode(t)) for n, t in imports])
    return ProtoSchema(schema_id, pool.FindFileByName(protobuf.MAIN_NAME), fdp)


def _message(
    file: descriptor.FileDescriptor, proto: FileDescriptorProto, path: tuple[int, ...] | str
) -> descriptor.Descriptor | str:
    """The descriptor at `path` (message indexes: positions in the declarations, map entries
    counted, as Confluent's serializers count them), or why there is none."""
    if isinstance(path, tuple):
        level: Sequence[DescriptorProto] = proto.message_type
        names = [proto.package] if proto.package else []
        for i in path:
            if not 0 <= i < len(level):
                return f"message indexes {list(path)} name no message of schema"
            names.append(level[i].name)
            level = level[i].nested_type
        path = ".".join(names)
    try:
        return file.pool.FindMessageTypeByName(path)
    except KeyError:
        return f"message {path} is not in schema"


def _reader(schema_id: int, desc: descriptor.Descriptor | str) -> MessageReader:
    if isinstance(desc, str):
        return MessageReader("", None, None, None, f"{desc} {schema_id}")
    try:
        arrow, convert = _struct(desc, ())
    except (UnsupportedMessage, RecursionError) as exc:
        problem = f"schema {schema_id} message {desc.full_name}: {exc or 'nested too deeply'}"
        return MessageReader(desc.full_name, None, None, None, problem)
    return MessageReader(desc.full_name, message_factory.GetMessageClass(desc), arrow, convert)


def _struct(desc: descriptor.Descriptor, stack: tuple[str, ...]) -> tuple[pa.DataType, Convert]:
    if desc.full_name in stack:
        raise UnsupportedMessage(f"recursive message {desc.full_name} has no table representation")
    inner = (*stack, desc.full_name)
    columns: list[pa.Field] = []
    getters: list[tuple[str, Convert]] = []
    for f in desc.fields:
        typed = _field(f, inner)
        if typed is not None:
            columns.append(pa.field(f.name, typed[0]))
            getters.append((f.name, typed[1]))

    def convert(m: Message) -> dict[str, Any]:
        return {name: get(m) for name, get in getters}

    return pa.struct(columns), convert


def _field(f: FD, stack: tuple[str, ...]) -> tuple[pa.DataType, Convert] | None:
    """(column type, message -> column value) of a field; None: no column (an empty message)."""
    name = f.name
    get = operator.attrgetter(name)
    if f.is_repeated and f.message_type is not None and f.message_type.GetOptions().map_entry:
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        key_type, _ = _element(key, stack) or (pa.null(), None)
        element = _element(value, stack)
        if element is None:
            return None
        value_type, value_conv = element
        if value_conv is None:
            return pa.map_(key_type, value_type), lambda m: list(get(m).items())
        return pa.map_(key_type, value_type), lambda m: [(k, value_conv(v)) for k, v in get(m).items()]
    element = _element(f, stack)
    if element is None:
        return None
    arrow, conv = element
    if f.is_repeated:
        if conv is None:
            return pa.list_(arrow), lambda m: list(get(m))
        return pa.list_(arrow), lambda m: [conv(v) for v in get(m)]
    if f.has_presence:
        if conv is None:
            return arrow, lambda m: get(m) if m.HasField(name) else None
        return arrow, lambda m: conv(get(m)) if m.HasField(name) else None
    if conv is None:
        return arrow, get
    return arrow, lambda m: conv(get(m))


def _element(f: FD, stack: tuple[str, ...]) -> tuple[pa.DataType, Convert | None] | None:
    """(type, converter or None for as-is) of one value of the field."""
    if f.type in _SCALARS:
        return _SCALARS[f.type], None
    if f.type == FD.TYPE_ENUM:
        names = {v.number: v.name for v in f.enum_type.values}
        return pa.string(), lambda v: names.get(v) or str(v)
    if f.type != FD.TYPE_MESSAGE:
        raise UnsupportedMessage(f"field {f.full_name} of type {f.type} has no column type")
    msg = f.message_type
    if msg.full_name == "google.protobuf.Timestamp":
        return pa.timestamp("us", tz="UTC"), lambda v: v.seconds * 1_000_000 + v.nanos // 1_000
    if msg.full_name in _WRAPPERS:
        return _SCALARS[msg.fields_by_name["value"].type], operator.attrgetter("value")
    arrow, convert = _struct(msg, stack)
    if arrow.num_fields == 0:
        return None
    return arrow, convert


def message_indexes(body: bytes) -> tuple[tuple[int, ...], int]:
    """The message indexes after the schema id and where the message starts; ValueError when
    they are not there."""
    if body[:1] == b"\x00":  # [0], what nearly every value carries: no varint decoding
        return (0,), 1
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= len(body) or shift > 63:
                raise ValueError("truncated message indexes")
            b = body[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return (result >> 1) ^ -(result & 1)  # zigzag
            shift += 7

    count = varint()
    if count == 0:
        return (0,), pos
    if not 0 < count <= MAX_INDEXES:
        raise ValueError(f"{count} message indexes")
    return tuple(varint() for _ in range(count)), pos


def read(schema: ProtoSchema, body: bytes, framed: bool, message: str = "") -> tuple[Any, MessageReader | None, str]:
    """(row, the reader of its message (`arrow`: the row's type), "") or (None, None, why not). `framed`: `body` starts with the message
    indexes (by_schema_id); else it is the bare message of type `message` (a full name; ""
    for the file's first message: by_latest_schema)."""
    path: tuple[int, ...] | str = message or (0,)
    start = 0
    if framed:
        try:
            path, start = message_indexes(body)
        except ValueError as exc:
            return None, None, f"value does not decode with schema {schema.schema_id}: {exc}"
    reader = schema.reader(path)
    if reader.message_class is None or reader.convert is None:
        return None, None, reader.problem
    try:
        msg = reader.message_class.FromString(body[start:])
    except (DecodeError, RuntimeError, ValueError) as exc:
        return None, None, f"value does not decode with schema {schema.schema_id} message {reader.name}: {exc}"
    return reader.convert(msg), reader, ""
