"""Produce without copies: record batches stay views of the received buffer, rewritten in place
by the produce path."""

from __future__ import annotations

import datetime
import struct
import uuid
from dataclasses import dataclass

from automq.broker.kafka.codec._common import _INT16, _INT32, _LengthError
from automq.broker.kafka.codec.lengths import _skip_tagged_fields, _uvarint

# ----- Produce without copies


@dataclass(slots=True)
class ProducePartitionView:
    index: int
    records: memoryview | None  # writable view into the request frame


@dataclass(slots=True)
class ProduceTopicView:
    name: str | None  # v0-v12
    partition_data: list[ProducePartitionView]
    topic_id: uuid.UUID | None = None  # v13+ (KIP-516): topics are named by id only


@dataclass(slots=True)
class ProduceRequestView:
    """Produce v3-v13 with kio's attribute names; records are views of the frame."""

    transactional_id: str | None
    acks: int
    timeout: datetime.timedelta
    topic_data: list[ProduceTopicView]


def decode_produce_in_place(
    buf: bytearray | memoryview, position: int, flexible: bool, topic_ids: bool = False
) -> ProduceRequestView:
    """Decode a Produce request body (lengths already checked by _check_lengths); `topic_ids`:
    v13+, where each topic is a 16-byte UUID instead of a name."""
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
        name: str | None = None
        topic_id: uuid.UUID | None = None
        if topic_ids:
            if position + 16 > len(buf):
                raise _LengthError("topic id runs past the frame")
            raw = bytes(view[position : position + 16])
            topic_id = uuid.UUID(bytes=raw) if raw != _ZERO_UUID else None  # as kio reads it
            position += 16
        else:
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
        topics.append(ProduceTopicView(name, partitions, topic_id))
    return ProduceRequestView(transactional_id, acks, datetime.timedelta(milliseconds=timeout_ms), topics)


_ACKS_TIMEOUT = struct.Struct(">hi")
_ZERO_UUID = bytes(16)
