"""The length pre-check: kio's native reader sizes arrays from the declared length before
reading them, so a hostile length could abort the process on allocation; every declared length
(and every null where Kafka forbids one) is checked against the frame first."""

from __future__ import annotations

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

from automq.broker.kafka.codec._common import (
    _INT16,
    _INT32,
    Buffer,
    _LengthError,
    _memo,
)

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
            plan[tag] = (
                _PRIM_ARRAY,
                _FIXED_SIZES.get(str(f.metadata.get("kafka_type"))),
                is_optional(f),
                name,
            )
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
    op: int,
    arg: Any,
    nullable: bool,
    name: str,
    flexible: bool,
    buf: Buffer,
    position: int,
    end: int,
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
