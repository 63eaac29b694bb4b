"""The tolerant slow path: kio's native reader raises on a tagged field it does not know, while
the protocol (KIP-482) says to skip it; this pure-Python reader over kio's own field metadata
skips unknown tags."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any

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
from kio.serial.readers import (
    read_compact_array_length,
    read_int8,
    read_legacy_array_length,
    read_unsigned_varint,
)

from automq.broker.kafka.codec._common import Buffer

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
