"""Protobuf schemas for the registry (sans I/O): validation, the canonical form that decides
"same schema, same id", the `.proto` text rendered from it, and compatibility rules.

A Protobuf schema is stored as Confluent's serialized form: the base64 of a
`FileDescriptorProto` (what confluent-kafka's Python `ProtobufSerializer` registers and what
`?format=serialized` returns). `.proto` text (Java clients, curl) is compiled to that form by
`protoc.py` before it reaches the metadata log, and `render` turns a stored descriptor back
into `.proto` text, the default answer of a GET. The canonical form clears what does not
change the schema (the file's name, source locations, json names equal to protoc's default)
and is serialized deterministically, so one schema posted as text or as a descriptor gets one id.

Dependencies (`import "x.proto"`) resolve to the well-known types the protobuf runtime ships
(`google/protobuf/*.proto`) or to a reference (`{"name": "x.proto", "subject", "version"}`).

Compatibility (`incompatibility(reader, writer)`): every message the writer has must be in the
reader (by full name); fields are matched by number: a field kept must keep a wire-compatible
type (varint kinds int32/int64/uint32/uint64/bool/enum together, sint32/sint64, fixed32/
sfixed32, fixed64/sfixed64, string/bytes; messages and enums by name), its label (repeated or
not), and must not move into a oneof that already existed; a required (proto2) field of the
reader must be in the writer. Fields added or removed are fine (unknown fields are skipped,
missing ones read as defaults). The levels apply it as for Avro (`avro.check_compatibility`).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import (
    any_pb2,
    api_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    source_context_pb2,
    struct_pb2,
    text_encoding,
    text_format,
    timestamp_pb2,
    type_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F
from google.protobuf.descriptor_pb2 import FileDescriptorProto as FDP
from google.protobuf.message import DecodeError

# the runtime's own well-known types, in dependency order (type.proto needs any and source_context)
WELL_KNOWN: dict[str, bytes] = {
    m.DESCRIPTOR.name: m.DESCRIPTOR.serialized_pb
    for m in (
        any_pb2,
        source_context_pb2,
        type_pb2,
        api_pb2,
        descriptor_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )
}
CANONICAL_NAME = "schema.proto"
MAIN_NAME = "automq/registered/schema.proto"  # the schema's own name in a pool (never an import's)
MAX_ELEMENTS = 200_000  # messages, fields, enum values of one file: a bound on the work a GET renders

SCALAR_NAMES = {
    F.TYPE_DOUBLE: "double",
    F.TYPE_FLOAT: "float",
    F.TYPE_INT64: "int64",
    F.TYPE_UINT64: "uint64",
    F.TYPE_INT32: "int32",
    F.TYPE_FIXED64: "fixed64",
    F.TYPE_FIXED32: "fixed32",
    F.TYPE_BOOL: "bool",
    F.TYPE_STRING: "string",
    F.TYPE_BYTES: "bytes",
    F.TYPE_UINT32: "uint32",
    F.TYPE_SFIXED32: "sfixed32",
    F.TYPE_SFIXED64: "sfixed64",
    F.TYPE_SINT32: "sint32",
    F.TYPE_SINT64: "sint64",
}
_WIRE_GROUPS = [
    {F.TYPE_INT32, F.TYPE_INT64, F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_BOOL, F.TYPE_ENUM},
    {F.TYPE_SINT32, F.TYPE_SINT64},
    {F.TYPE_FIXED32, F.TYPE_SFIXED32},
    {F.TYPE_FIXED64, F.TYPE_SFIXED64},
    {F.TYPE_STRING, F.TYPE_BYTES},
]
_BASE64 = re.compile(r"^[A-Za-z0-9+/\s]*={0,2}\s*$")


class InvalidSchema(ValueError):
    """Not a valid Protobuf schema; the message says why (Confluent error 42201)."""


def is_serialized(text: str) -> bool:
    """Whether `text` is the serialized (base64) form rather than `.proto` text, which always
    holds characters base64 has not (spaces between keywords, `;`, quotes)."""
    return bool(text.strip()) and _BASE64.match(text) is not None and " " not in text.strip()


def decode(text: str) -> FDP:
    """The FileDescriptorProto of a base64 schema; InvalidSchema naming what is wrong."""
    try:
        raw = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidSchema(f"Invalid schema: not base64 of a FileDescriptorProto: {exc}") from None
    fdp = FDP()
    try:
        fdp.ParseFromString(raw)
    except (DecodeError, RecursionError) as exc:
        raise InvalidSchema(f"Invalid schema: not a serialized FileDescriptorProto: {exc or 'truncated'}") from None
    _check_shape(fdp)
    return fdp


def _check_shape(fdp: FDP) -> None:
    if fdp.syntax not in ("", "proto2", "proto3"):
        raise InvalidSchema(f'Invalid schema: syntax "{fdp.syntax}" is not supported here (proto2 and proto3 are)')
    count = 0
    stack = list(fdp.message_type)
    while stack:
        m = stack.pop()
        count += 1 + len(m.field) + sum(len(e.value) for e in m.enum_type)
        if any(f.type == F.TYPE_GROUP for f in m.field):
            raise InvalidSchema(f"Invalid schema: message {m.name} has a group field; groups are not supported")
        stack.extend(m.nested_type)
        if count > MAX_ELEMENTS:
            raise InvalidSchema(f"Invalid schema: more than {MAX_ELEMENTS} messages, fields and enum values")


def _default_json_name(name: str) -> str:
    out, upper = [], False
    for c in name:
        if c == "_":
            upper = True
        else:
            out.append(c.upper() if upper else c)
            upper = False
    return "".join(out)


def _messages(messages: Iterable[descriptor_pb2.DescriptorProto]) -> Iterable[descriptor_pb2.DescriptorProto]:
    for m in messages:
        yield m
        yield from _messages(m.nested_type)


def normalized(fdp: FDP) -> FDP:
    out = FDP()
    out.CopyFrom(fdp)
    out.name = CANONICAL_NAME
    out.ClearField("source_code_info")
    for m in _messages(out.message_type):
        for f in m.field:
            if f.json_name == _default_json_name(f.name):
                f.ClearField("json_name")
    return out


def encode(fdp: FDP) -> str:
    return base64.standard_b64encode(fdp.SerializeToString(deterministic=True)).decode("ascii")


def canonical(text: str) -> str:
    """The stored form of a base64 schema: normalized, deterministic, base64."""
    return encode(normalized(decode(text)))


def build(fdp: FDP, imports: Sequence[tuple[str, FDP]] = ()) -> descriptor_pool.DescriptorPool:
    """A pool holding the well-known types the files import, `imports` (name, descriptor;
    dependencies first) and `fdp` (named MAIN_NAME): InvalidSchema when it does not build (an
    unknown type or import, a duplicate field number, ...). Only the well-known files imported
    go in, so a well-known file registered as a schema of its own (confluent-kafka's
    serializer with skip.known.types=false) does not clash with the runtime's copy."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    wanted = [d for _, dep in imports for d in dep.dependency] + list(fdp.dependency)
    for name in _well_known_closure(wanted):
        pool.AddSerializedFile(WELL_KNOWN[name])
        added.add(name)
    for name, dep in imports:
        if name in added:
            continue
        added.add(name)
        _add(pool, dep, name)
    missing = [d for d in fdp.dependency if d not in added]
    if missing:
        raise InvalidSchema(f"Invalid schema: import(s) {missing} are neither well-known types nor given as references")
    _add(pool, fdp, MAIN_NAME)
    return pool


def _well_known_closure(names: Iterable[str]) -> list[str]:
    """The well-known files among `names` and those they import, dependencies first."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in WELL_KNOWN and name not in order:
            for dep in FDP.FromString(WELL_KNOWN[name]).dependency:
                visit(dep)
            order.append(name)

    for name in names:
        visit(name)
    return order


def _add(pool: descriptor_pool.DescriptorPool, fdp: FDP, name: str) -> None:
    named = FDP()
    named.CopyFrom(fdp)
    named.name = name
    try:
        pool.AddSerializedFile(named.SerializeToString())
    except (TypeError, ValueError, KeyError) as exc:
        what = "the schema" if name == MAIN_NAME else f"reference {name}"
        raise InvalidSchema(f"Invalid schema: {what} does not build: {exc}") from None


def parse(text: str, imports: Sequence[tuple[str, str]] = ()) -> FDP:
    """Validate a base64 schema against its references' (name, base64 text), dependencies
    first: the FileDescriptorProto."""
    fdp = decode(text)
    build(fdp, [(name, decode(dep)) for name, dep in imports])
    return fdp


# --------------------------------------------------------------------------- .proto text


def render(fdp: FDP) -> str:
    """`.proto` text of a descriptor (type names fully qualified). Custom options (extensions
    of the options messages) are not rendered: the serialized form keeps them."""
    syntax = fdp.syntax or "proto2"
    out = [f'syntax = "{syntax}";']
    if fdp.package:
        out.append(f"package {fdp.package};")
    for i, dep in enumerate(fdp.dependency):
        kind = "public " if i in fdp.public_dependency else "weak " if i in fdp.weak_dependency else ""
        out.append(f'import {kind}"{dep}";')
    out += [f"option {o};" for o in _options(fdp.options)]
    for m in fdp.message_type:
        _message(m, out, "", syntax, f".{fdp.package}" if fdp.package else "")
    for e in fdp.enum_type:
        _enum(e, out, "")
    _extensions(fdp.extension, out, "", syntax)
    for s in fdp.service:
        out.append(f"service {s.name} {{")
        out += [f"  option {o};" for o in _options(s.options)]
        for rpc in s.method:
            ins = "stream " if rpc.client_streaming else ""
            outs = "stream " if rpc.server_streaming else ""
            opts = _options(rpc.options)
            body = " {" + "".join(f" option {o};" for o in opts) + " }" if opts else ";"
            out.append(f"  rpc {rpc.name}({ins}{rpc.input_type}) returns ({outs}{rpc.output_type}){body}")
        out.append("}")
    return "\n".join(out) + "\n"


def _value(field: Any, value: Any) -> str:
    if field.type == field.TYPE_BOOL:
        return "true" if value else "false"
    if field.type == field.TYPE_ENUM:
        return str(field.enum_type.values_by_number[value].name)
    if field.type == field.TYPE_STRING:
        return '"' + text_encoding.CEscape(value, as_utf8=True) + '"'
    if field.type == field.TYPE_BYTES:
        return '"' + text_encoding.CEscape(value, as_utf8=False) + '"'
    if field.type == field.TYPE_MESSAGE:
        return "{ " + text_format.MessageToString(value, as_one_line=True) + " }"
    return repr(value)


def _options(options: Any, skip: tuple[str, ...] = ()) -> list[str]:
    found = []
    for field, value in options.ListFields():
        if field.name in skip or field.name == "uninterpreted_option" or field.is_extension:
            continue
        values = value if field.is_repeated else [value]
        found += [f"{field.name} = {_value(field, v)}" for v in values]
    return found


def _ranges(ranges: Iterable[Any], inclusive_end: bool) -> str:
    parts = []
    for r in ranges:
        end = r.end if inclusive_end else r.end - 1
        if r.start == end:
            parts.append(str(r.start))
        else:
            parts.append(f"{r.start} to {'max' if end >= 536870911 or end == 2147483647 else end}")
    return ", ".join(parts)


def _type(f: F) -> str:
    return SCALAR_NAMES.get(f.type) or f.type_name


def _field(f: F, syntax: str, maps: dict[str, descriptor_pb2.DescriptorProto], in_oneof: bool) -> str:
    opts = []
    if f.HasField("default_value"):
        if f.type == F.TYPE_STRING:
            default = '"' + text_encoding.CEscape(f.default_value, as_utf8=True) + '"'
        elif f.type == F.TYPE_BYTES:
            default = '"' + f.default_value + '"'  # already C-escaped in the descriptor
        else:
            default = f.default_value
        opts.append(f"default = {default}")
    if f.HasField("json_name") and f.json_name != _default_json_name(f.name):
        opts.append(f'json_name = "{text_encoding.CEscape(f.json_name, as_utf8=True)}"')
    opts += _options(f.options)
    suffix = f" [{', '.join(opts)}]" if opts else ""
    entry = maps.get(f.type_name) if f.type == F.TYPE_MESSAGE else None
    if entry is not None and f.label == F.LABEL_REPEATED:
        key, value = entry.field[0], entry.field[1]
        return f"map<{_type(key)}, {_type(value)}> {f.name} = {f.number}{suffix};"
    if f.label == F.LABEL_REPEATED:
        label = "repeated "
    elif f.label == F.LABEL_REQUIRED:
        label = "required "
    elif in_oneof:
        label = ""
    elif syntax == "proto2" or f.proto3_optional:
        label = "optional "
    else:
        label = ""
    return f"{label}{_type(f)} {f.name} = {f.number}{suffix};"


def _message(m: descriptor_pb2.DescriptorProto, out: list[str], indent: str, syntax: str, scope: str) -> None:
    full = f"{scope}.{m.name}"
    inner = indent + "  "
    out.append(f"{indent}message {m.name} {{")
    out += [f"{inner}option {o};" for o in _options(m.options, skip=("map_entry",))]
    maps = {f"{full}.{n.name}": n for n in m.nested_type if n.options.map_entry}
    real_oneofs = {f.oneof_index for f in m.field if f.HasField("oneof_index") and not f.proto3_optional}
    done: set[int] = set()
    for f in m.field:
        if f.HasField("oneof_index") and f.oneof_index in real_oneofs:
            if f.oneof_index in done:
                continue
            done.add(f.oneof_index)
            decl = m.oneof_decl[f.oneof_index]
            out.append(f"{inner}oneof {decl.name} {{")
            out += [f"{inner}  option {o};" for o in _options(decl.options)]
            for g in m.field:
                if g.HasField("oneof_index") and g.oneof_index == f.oneof_index:
                    out.append(f"{inner}  {_field(g, syntax, maps, True)}")
            out.append(f"{inner}}}")
        else:
            out.append(f"{inner}{_field(f, syntax, maps, False)}")
    for n in m.nested_type:
        if not n.options.map_entry:
            _message(n, out, inner, syntax, full)
    for e in m.enum_type:
        _enum(e, out, inner)
    _extensions(m.extension, out, inner, syntax)
    if m.extension_range:
        out.append(f"{inner}extensions {_ranges(m.extension_range, False)};")
    _reserved(m, False, out, inner)
    out.append(f"{indent}}}")


def _reserved(declared: Any, inclusive_end: bool, out: list[str], indent: str) -> None:
    """A message's or enum's reserved numbers (ranges end-exclusive in messages) and names."""
    if declared.reserved_range:
        out.append(f"{indent}reserved {_ranges(declared.reserved_range, inclusive_end)};")
    if declared.reserved_name:
        out.append(f"{indent}reserved {', '.join(f'{chr(34)}{n}{chr(34)}' for n in declared.reserved_name)};")


def _enum(e: descriptor_pb2.EnumDescriptorProto, out: list[str], indent: str) -> None:
    inner = indent + "  "
    out.append(f"{indent}enum {e.name} {{")
    out += [f"{inner}option {o};" for o in _options(e.options)]
    for v in e.value:
        opts = _options(v.options)
        suffix = f" [{', '.join(opts)}]" if opts else ""
        out.append(f"{inner}{v.name} = {v.number}{suffix};")
    _reserved(e, True, out, inner)
    out.append(f"{indent}}}")


def _extensions(fields: Iterable[F], out: list[str], indent: str, syntax: str) -> None:
    by_extendee: dict[str, list[F]] = {}
    for f in fields:
        by_extendee.setdefault(f.extendee, []).append(f)
    for extendee, group in by_extendee.items():
        out.append(f"{indent}extend {extendee} {{")
        out += [f"{indent}  {_field(f, 'proto2', {}, False)}" for f in group]
        out.append(f"{indent}}}")


# --------------------------------------------------------------------------- compatibility


def _index(fdp: FDP) -> dict[str, descriptor_pb2.DescriptorProto]:
    found: dict[str, descriptor_pb2.DescriptorProto] = {}

    def walk(messages: Iterable[descriptor_pb2.DescriptorProto], scope: str) -> None:
        for m in messages:
            name = f"{scope}.{m.name}" if scope else m.name
            found[name] = m
            walk(m.nested_type, name)

    walk(fdp.message_type, fdp.package)
    return found


def _wire_compatible(a: F, b: F) -> bool:
    if a.type == b.type:
        return a.type not in (F.TYPE_MESSAGE, F.TYPE_ENUM) or a.type_name == b.type_name
    return any(a.type in g and b.type in g for g in _WIRE_GROUPS)


def _oneof(m: descriptor_pb2.DescriptorProto, f: F) -> str | None:
    if f.HasField("oneof_index") and not f.proto3_optional:
        return m.oneof_decl[f.oneof_index].name
    return None


def incompatibility(reader: FDP, writer: FDP) -> str | None:
    """Why a reader of `reader`'s messages cannot read data written with `writer`, or None."""
    if (reader.syntax or "proto2") != (writer.syntax or "proto2"):
        return f"syntax {writer.syntax or 'proto2'} changed to {reader.syntax or 'proto2'}"
    readers = _index(reader)
    for name, wm in _index(writer).items():
        rm = readers.get(name)
        if rm is None:
            return f"{name}: message removed"
        rfields = {f.number: f for f in rm.field}
        wfields = {f.number: f for f in wm.field}
        into: dict[str, int] = {}
        writer_oneofs = {d.name for d in wm.oneof_decl}
        for number, rf in rfields.items():
            wf = wfields.get(number)
            where = f"{name}.{rf.name} (field {number})"
            if wf is None:
                if rf.label == F.LABEL_REQUIRED:
                    return f"{where}: required field added"
                continue
            if (rf.label == F.LABEL_REPEATED) != (wf.label == F.LABEL_REPEATED):
                return f"{where}: changed between repeated and singular"
            if not _wire_compatible(rf, wf):
                return f"{where}: type {_type(wf)} changed to {_type(rf)}"
            r_oneof, w_oneof = _oneof(rm, rf), _oneof(wm, wf)
            if r_oneof is not None and w_oneof is None:
                if r_oneof in writer_oneofs:
                    return f"{where}: moved into the existing oneof {r_oneof}"
                into[r_oneof] = into.get(r_oneof, 0) + 1
        for oneof, moved in into.items():
            if moved > 1:
                return f"{name}: {moved} existing fields moved into the new oneof {oneof}"
    return None
