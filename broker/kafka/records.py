"""Kafka v2 record batches at the header level: parse, validate, assign offsets. Never per record.

Batch layout (all big-endian), offsets in bytes:

     0 baseOffset int64          27 baseTimestamp int64
     8 batchLength int32         35 maxTimestamp int64
    12 partitionLeaderEpoch i32  43 producerId int64
    16 magic int8                51 producerEpoch int16
    17 crc uint32 (CRC-32C of    53 baseSequence int32
       bytes 21..end)            57 recordCount int32
    21 attributes int16          61 records...
    23 lastOffsetDelta int32

`batchLength` counts the bytes after itself, so a batch is 12 + batchLength bytes. Only
baseOffset, partitionLeaderEpoch and (for LogAppendTime topics) maxTimestamp + the timestamp
type attribute bit are rewritten; the first two lie outside the CRC, the last two need it
recomputed (one native CRC-32C over the batch body, no decompression).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
from kio.schema.errors import ErrorCode

BATCH_HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
TIMESTAMP_TYPE_BIT = 0x08  # attributes bit 3: 0 = CreateTime, 1 = LogAppendTime
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_EPOCH = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
_TIMESTAMP = struct.Struct(">q")
assert HEADER.size == BATCH_HEADER_SIZE


class InvalidBatchError(Exception):
    """A produce batch Kafka would reject; `error_code` is what the partition response carries."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)


def parse_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    return BatchHeader(*HEADER.unpack_from(buf, position))


def validate_produce_records(buf: bytes | memoryview | None, max_batch_bytes: int) -> BatchHeader:
    """The records of one partition in a Produce v3+ request: exactly one valid v2 batch.

    Mirrors Kafka's checks and error codes: a missing/empty record set, more than one batch
    or a magic other than 2 → INVALID_RECORD (ProduceRequest.validateRecords); a batch larger
    than max.message.bytes → MESSAGE_TOO_LARGE; a length that does not match the bytes or a
    wrong CRC → CORRUPT_MESSAGE; a record count that is not positive or does not match
    lastOffsetDelta → INVALID_RECORD.
    """
    if not buf:
        raise InvalidBatchError(
            ErrorCode.invalid_record, "produce requests v3+ must have exactly one record batch per partition"
        )
    total = len(buf)
    if total > MAGIC_OFFSET and buf[MAGIC_OFFSET] != 2:
        raise InvalidBatchError(
            ErrorCode.invalid_record,
            f"produce requests v3+ only accept record batches with magic 2, got magic {buf[MAGIC_OFFSET]}",
        )
    if total < BATCH_HEADER_SIZE:
        raise InvalidBatchError(
            ErrorCode.corrupt_message,
            f"record batch of {total} bytes is shorter than the {BATCH_HEADER_SIZE}-byte v2 header",
        )
    header = parse_header(buf)
    if header.size > max_batch_bytes:
        raise InvalidBatchError(
            ErrorCode.message_too_large,
            f"record batch of {header.size} bytes exceeds the maximum of {max_batch_bytes} (max.message.bytes)",
        )
    if header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD or header.size > total:
        raise InvalidBatchError(
            ErrorCode.corrupt_message,
            f"record batch length {header.batch_length} does not fit the {total} bytes received",
        )
    if header.size < total:
        raise InvalidBatchError(
            ErrorCode.invalid_record, "produce requests v3+ must have exactly one record batch per partition"
        )
    computed = crc32c.crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:])
    if computed != header.crc:
        raise InvalidBatchError(
            ErrorCode.corrupt_message,
            f"record batch CRC mismatch: stored {header.crc:#010x}, computed {computed:#010x}",
        )
    if header.record_count <= 0:
        raise InvalidBatchError(ErrorCode.invalid_record, f"record batch has {header.record_count} records")
    if header.last_offset_delta != header.record_count - 1:
        raise InvalidBatchError(
            ErrorCode.invalid_record,
            f"record count {header.record_count} does not match lastOffsetDelta {header.last_offset_delta}",
        )
    return header


def assign_offsets(
    batch: bytearray | memoryview, base_offset: int, leader_epoch: int, log_append_time_ms: int = -1
) -> None:
    """Rewrite baseOffset and partitionLeaderEpoch in place; with a LogAppendTime, also set
    maxTimestamp and the timestamp-type bit and recompute the CRC."""
    _OFFSET_AND_EPOCH.pack_into(batch, 0, base_offset)
    _EPOCH.pack_into(batch, 12, leader_epoch)
    if log_append_time_ms >= 0:
        (attributes,) = _ATTRIBUTES.unpack_from(batch, ATTRIBUTES_OFFSET)
        _ATTRIBUTES.pack_into(batch, ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_BIT)
        _TIMESTAMP.pack_into(batch, MAX_TIMESTAMP_OFFSET, log_append_time_ms)
        _CRC.pack_into(batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))


def iter_headers(buf: bytes | bytearray | memoryview):
    """Headers of the complete batches in a concatenation (as stored), with their positions."""
    position = 0
    total = len(buf)
    while position + BATCH_HEADER_SIZE <= total:
        header = parse_header(buf, position)
        if header.batch_length <= 0 or position + header.size > total:
            return
        yield position, header
        position += header.size


def producer_entries(buf: bytes | bytearray | memoryview) -> list[tuple[int, int, int, int, int, int]]:
    """(producer_id, epoch, base_sequence, record_count, base_offset, max_timestamp) of the
    idempotent batches in `buf`, for rebuilding producer state on partition open."""
    return [
        (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, h.base_offset, h.max_timestamp)
        for _, h in iter_headers(buf)
        if h.producer_id >= 0 and not h.is_control
    ]


def find_offset_for_timestamp(buf: bytes | bytearray | memoryview, timestamp_ms: int) -> tuple[int, int] | None:
    """(base_offset, max_timestamp) of the first batch whose maxTimestamp >= timestamp_ms.

    Batch granularity, as the header scan allows: the batch's first offset is returned, the
    record-level answer may lie later in the batch (clients then skip within the batch)."""
    for _, h in iter_headers(buf):
        if h.max_timestamp >= timestamp_ms:
            return h.base_offset, h.max_timestamp
    return None


def max_timestamp(buf: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(offset, timestamp) of the batch with the largest maxTimestamp (first one on ties)."""
    best: tuple[int, int] | None = None
    for _, h in iter_headers(buf):
        if best is None or h.max_timestamp > best[1]:
            best = (h.base_offset + h.last_offset_delta, h.max_timestamp)
    return best


def read_varint(buf: bytes | bytearray | memoryview, position: int) -> tuple[int, int]:
    """(value, next position) of the zigzag varint at `position` (the record-level integers of
    v2 batches). ValueError when the buffer ends inside it or it is longer than 64 bits."""
    value = shift = 0
    while True:
        if position >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), position
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def write_varint(value: int) -> bytes:
    """The zigzag varint encoding of a signed 64-bit value (inverse of read_varint)."""
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def first_record_at_or_after(batch: bytes | bytearray | memoryview, timestamp_ms: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of one stored batch with timestamp >= timestamp_ms.

    Only ListOffsets uses this, for the single batch a timestamp search ends in. Compressed
    batches are not decompressed: their base offset and max timestamp are the answer (a
    consumer seeking there skips the earlier records itself). LogAppendTime batches carry one
    timestamp for every record."""
    header = parse_header(batch)
    if header.max_timestamp < timestamp_ms:
        return None
    if header.attributes & 0x07 or header.attributes & TIMESTAMP_TYPE_BIT:
        return header.base_offset, header.max_timestamp
    position = BATCH_HEADER_SIZE
    end = min(len(batch), header.size)
    try:
        for _ in range(header.record_count):
            length, position = read_varint(batch, position)
            record_end = position + length
            ts_position = position + 1  # attributes
            ts_delta, ts_position = read_varint(batch, ts_position)
            offset_delta, _ = read_varint(batch, ts_position)
            if header.base_timestamp + ts_delta >= timestamp_ms:
                return header.base_offset + offset_delta, header.base_timestamp + ts_delta
            position = record_end
            if position > end:
                break
    except (IndexError, ValueError):
        pass
    return header.base_offset, header.max_timestamp
