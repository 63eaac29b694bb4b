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
from collections.abc import Iterator
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

    def __init__(self, error_code: ErrorCode, message: str, record_errors: tuple[tuple[int, str], ...] = ()) -> None:
        super().__init__(message)
        self.error_code = error_code
        # KIP-467: (index in the batch, message) of each record that made the batch invalid;
        # clients fail those records with the error and the rest with INVALID_DIFFERENT_RECORD
        self.record_errors = record_errors


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


def iter_headers(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, BatchHeader]]:
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


def keyless_record_indices(
    batch: bytes | bytearray | memoryview, header: BatchHeader, limit: int | None = None
) -> list[int]:
    """Indices in the batch of the records with a null key (at most `limit` of them).

    Only produce to `cleanup.policy=compact` topics calls this (Kafka refuses keyless records
    there with INVALID_RECORD). It is the one produce check that must look at every record:
    the walk reads four varints per record and jumps over key, value and headers, with no
    object made per record. A compressed batch is decompressed first (Kafka's LogValidator
    does the same for compacted topics); the stored batch stays as the producer sent it.
    ValueError when the records section is malformed."""
    body = decompress_records(header.attributes & CODEC_MASK, memoryview(batch)[BATCH_HEADER_SIZE : header.size])
    buf = body if isinstance(body, bytes) else bytes(body)
    end = len(buf)
    pos = 0
    found: list[int] = []
    for index in range(header.record_count):
        # record: length, attributes (1 byte), timestampDelta, offsetDelta, keyLength, ...
        first = buf[pos]
        if first < 0x80:  # the usual one-byte length, decoded inline (no call per record)
            length = (first >> 1) ^ -(first & 1)
            pos += 1
        else:
            length, pos = read_varint(buf, pos)
        record_end = pos + length
        if length < 0 or record_end > end:
            raise ValueError("record overruns its batch")
        p = pos + 1
        # skip timestampDelta and offsetDelta without decoding them
        while buf[p] & 0x80:
            p += 1
        p += 1
        while buf[p] & 0x80:
            p += 1
        if buf[p + 1] == 0x01:  # zigzag varint -1: a null key (a one-byte varint)
            found.append(index)
            if limit is not None and len(found) >= limit:
                break
        pos = record_end
    return found


def keyless_record_index(batch: bytes | bytearray | memoryview, header: BatchHeader) -> int | None:
    """Index in the batch of the first record with a null key, or None when all have keys."""
    found = keyless_record_indices(batch, header, limit=1)
    return found[0] if found else None


def offset_of_max_timestamp(batch: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(offset, timestamp) of the first record of one stored batch carrying its max timestamp
    (ListOffsets MAX_TIMESTAMP answers a record, not a batch). A LogAppendTime batch stamps
    every record alike, so its first record. Only ListOffsets calls this, for one batch;
    compressed batches are decompressed. Falls back to the batch's last offset when the
    records cannot be read."""
    header = parse_header(batch)
    if header.attributes & TIMESTAMP_TYPE_BIT:
        return header.base_offset, header.max_timestamp
    try:
        body = decompress_records(header.attributes & CODEC_MASK, memoryview(batch)[BATCH_HEADER_SIZE : header.size])
        buf = body if isinstance(body, bytes) else bytes(body)
        pos = 0
        target = header.max_timestamp - header.base_timestamp
        for _ in range(header.record_count):
            length, pos = read_varint(buf, pos)
            ts_delta, after = read_varint(buf, pos + 1)
            if ts_delta == target:
                offset_delta, _ = read_varint(buf, after)
                return header.base_offset + offset_delta, header.max_timestamp
            pos += length
    except (ValueError, IndexError):
        pass
    return header.base_offset + header.last_offset_delta, header.max_timestamp


# --------------------------------------------------------------------------- record level
# Readers outside the broker (the Spark jobs, key compaction) need the records themselves:
# decompress a batch's records section and walk it. The broker's own hot paths never do.

CODEC_MASK = 0x07
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_BLOCK = struct.Struct(">i")


def _snappy(data: bytes | memoryview) -> bytes:
    """Kafka's Java client frames snappy as snappy-java's stream ("xerial": magic, version,
    then length-prefixed blocks); librdkafka and others send one raw snappy block. Both occur."""
    import snappy

    data = bytes(data)
    if not data.startswith(_XERIAL_MAGIC):
        raw: bytes = snappy.uncompress(data)
        return raw
    out = []
    position = 16  # magic (8) + version (4) + compatible version (4)
    while position + 4 <= len(data):
        (length,) = _XERIAL_BLOCK.unpack_from(data, position)
        position += 4
        if length < 0 or position + length > len(data):
            raise ValueError("truncated snappy-java block")
        out.append(snappy.uncompress(data[position : position + length]))
        position += length
    return b"".join(out)


def decompress_records(codec: int, data: bytes | memoryview) -> bytes | memoryview:
    """The uncompressed records section of a batch whose attributes name `codec`.
    ValueError for an unknown codec or bytes the codec cannot decode."""
    if codec == 0:
        return data
    try:
        if codec == 1:
            import zlib

            return zlib.decompress(bytes(data), wbits=47)  # gzip or zlib header, as Kafka writes
        if codec == 2:
            return _snappy(data)
        if codec == 3:
            import lz4.frame

            decompressed: bytes = lz4.frame.decompress(bytes(data))
            return decompressed
        if codec == 4:
            import zstandard

            # streaming: producers may omit the frame's content size
            return zstandard.ZstdDecompressor().decompressobj().decompress(bytes(data))
    except ValueError:
        raise
    except Exception as exc:  # each library has its own error class
        raise ValueError(f"{CODEC_NAMES[codec]}: cannot decompress records: {exc}") from exc
    raise ValueError(f"unknown compression codec {codec} in batch attributes")


# Record = (offset, timestamp, key, value, headers); key/value None for null, headers a list
# of (key str, value bytes | None).
Record = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def decode_records(batch: bytes | bytearray | memoryview, header: BatchHeader | None = None) -> list[Record]:
    """Every record of one stored batch, decompressed. LogAppendTime batches report maxTimestamp
    for every record, as consumers see them. ValueError when the batch is malformed."""
    h = header or parse_header(batch)
    view = memoryview(batch)[: h.size]
    body = decompress_records(h.attributes & CODEC_MASK, view[BATCH_HEADER_SIZE:])
    buf = bytes(body)
    log_append = bool(h.attributes & TIMESTAMP_TYPE_BIT)
    base_offset, base_ts = h.base_offset, h.base_timestamp
    out: list[Record] = []
    pos = 0
    end = len(buf)
    try:
        for _ in range(h.record_count):
            length, pos = read_varint(buf, pos)
            record_end = pos + length
            if record_end > end:
                raise ValueError("record overruns its batch")
            pos += 1  # attributes (unused in v2)
            ts_delta, pos = read_varint(buf, pos)
            off_delta, pos = read_varint(buf, pos)
            klen, pos = read_varint(buf, pos)
            if klen < 0:
                key = None
            else:
                key = buf[pos : pos + klen]
                pos += klen
            vlen, pos = read_varint(buf, pos)
            if vlen < 0:
                value = None
            else:
                value = buf[pos : pos + vlen]
                pos += vlen
            count, pos = read_varint(buf, pos)
            headers: list[tuple[str, bytes | None]] = []
            for _h in range(count):
                hklen, pos = read_varint(buf, pos)
                hkey = buf[pos : pos + hklen].decode("utf-8", "replace")
                pos += hklen
                hvlen, pos = read_varint(buf, pos)
                if hvlen < 0:
                    hvalue = None
                else:
                    hvalue = buf[pos : pos + hvlen]
                    pos += hvlen
                headers.append((hkey, hvalue))
            if pos != record_end:
                raise ValueError("record length does not match its fields")
            out.append(
                (base_offset + off_delta, h.max_timestamp if log_append else base_ts + ts_delta, key, value, headers)
            )
    except IndexError:
        raise ValueError("truncated record") from None
    return out


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]] = (),  # type: ignore[assignment]
) -> bytes:
    """One v2 record (length-prefixed), the inverse of what decode_records reads."""
    body = bytearray(b"\x00")
    body += write_varint(timestamp_delta)
    body += write_varint(offset_delta)
    for part in (key, value):
        if part is None:
            body += write_varint(-1)
        else:
            body += write_varint(len(part)) + part
    body += write_varint(len(headers))
    for hkey, hvalue in headers:
        raw = hkey.encode()
        body += write_varint(len(raw)) + raw
        body += write_varint(-1) if hvalue is None else write_varint(len(hvalue)) + hvalue
    return write_varint(len(body)) + bytes(body)


def build_batch(
    base_offset: int,
    records: list[bytes],
    *,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = 0,
) -> bytes:
    """An uncompressed v2 batch from encoded records (key compaction writes these: offset
    gaps are allowed, lastOffsetDelta keeps the batch's original offset span)."""
    body = b"".join(records)
    attributes &= ~CODEC_MASK
    head = HEADER.pack(
        base_offset,
        BATCH_HEADER_SIZE - LOG_OVERHEAD + len(body),
        partition_leader_epoch,
        2,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    batch = bytearray(head + body)
    _CRC.pack_into(batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


# ---------------------------------------------------------------- transaction markers (control batches)

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")  # version 0, type (0 abort, 1 commit)
_CONTROL_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch


def control_batch(
    producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timestamp_ms: int
) -> bytearray:
    """A transaction marker as Kafka writes it: a control + transactional batch of one record
    whose key says COMMIT or ABORT (baseOffset 0: assign_offsets sets the real one)."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    return bytearray(
        build_batch(
            0,
            [encode_record(0, 0, key, value)],
            last_offset_delta=0,
            base_timestamp=timestamp_ms,
            max_timestamp=timestamp_ms,
            attributes=TRANSACTIONAL_BIT | CONTROL_BIT,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
        )
    )


def control_type(batch: bytes | bytearray | memoryview, header: BatchHeader | None = None) -> int | None:
    """CONTROL_COMMIT / CONTROL_ABORT of a marker batch; None for anything else."""
    h = header or parse_header(batch)
    if not h.is_control or h.record_count < 1:
        return None
    try:
        records = decode_records(batch, h)
    except ValueError:
        return None
    key = records[0][2] if records else None
    if key is None or len(key) < _CONTROL_KEY.size:
        return None
    version, kind = _CONTROL_KEY.unpack_from(key, 0)
    return kind if version == 0 and kind in (CONTROL_ABORT, CONTROL_COMMIT) else None
