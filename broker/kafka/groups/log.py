"""What the group coordinator writes to `__consumer_offsets`, and reading it back.

Records use Kafka's own key and value layouts (non-flexible versions), so Kafka's tooling
could decode them:

  key v1 (offset commit):   int16 version=1, string group, string topic, int32 partition
  key v2 (group metadata):  int16 version=2, string group
  offset value v3:          int16 version=3, int64 offset, int32 leader_epoch, string metadata,
                            int64 commit_timestamp
  offset value v1 (with an explicit expiry, OffsetCommit v2-v4 retention_time):
                            int16 version=1, int64 offset, string metadata,
                            int64 commit_timestamp, int64 expire_timestamp
  group value v3:           int16 version=3, string protocol_type, int32 generation,
                            nullable string protocol, nullable string leader,
                            int64 current_state_timestamp,
                            array of members: string member_id, nullable string instance_id,
                            string client_id, string client_host, int32 rebalance_timeout,
                            int32 session_timeout, bytes subscription, bytes assignment

  key 1000 (KIP-848 consumer group, this project's own): int16 version=1000, string group;
  its value is the group's whole state as versioned JSON (groups/consumer.py). Kafka splits
  that state over several record types (keys 3-8); one record per group keeps replay and
  checkpoints simple. The key version lies outside Kafka's range so Kafka's tools skip it
  instead of misreading it.
  key 1001 (KIP-932 share group, this project's own): the same, for a share group's members,
  epochs and target assignment (groups/share.py).

A null value is a tombstone (offset deleted / group deleted). Records travel in plain
(uncompressed) v2 record batches, built here; reading accepts only what this module writes
and skips, with a log line, anything else a misbehaving client may have put there.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

from automq.broker.kafka.records import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    CONTROL_BIT,
    CRC_OFFSET,
    HEADER,
    LOG_OVERHEAD,
    TRANSACTIONAL_BIT,
    read_varint,
    write_varint,
)

log = logging.getLogger(__name__)

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
CONSUMER_GROUP_KEY_VERSION = 1000
SHARE_GROUP_KEY_VERSION = 1001


class RecordFormatError(ValueError):
    pass


# ---------------------------------------------------------------- primitive writers/readers


def _str(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _nstr(value: str | None) -> bytes:
    return struct.pack(">h", -1) if value is None else _str(value)


def _bytes(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise RecordFormatError("truncated record")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return struct.unpack(">h", self.take(2))[0]

    def int32(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def int64(self) -> int:
        return struct.unpack(">q", self.take(8))[0]

    def nstr(self) -> str | None:
        n = self.int16()
        return None if n == -1 else self.take(n).decode()

    def str(self) -> str:
        value = self.nstr()
        if value is None:
            raise RecordFormatError("null string where one is required")
        return value

    def bytes(self) -> bytes:
        n = self.int32()
        return b"" if n == -1 else self.take(n)


# ---------------------------------------------------------------- keys and values


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group_id: str
    topic: str
    partition: int

    def encode(self) -> bytes:
        return (
            struct.pack(">h", OFFSET_KEY_VERSION)
            + _str(self.group_id)
            + _str(self.topic)
            + struct.pack(">i", self.partition)
        )


@dataclass(frozen=True, slots=True)
class GroupKey:
    group_id: str

    def encode(self) -> bytes:
        return struct.pack(">h", GROUP_KEY_VERSION) + _str(self.group_id)


@dataclass(frozen=True, slots=True)
class ConsumerGroupKey:
    group_id: str

    def encode(self) -> bytes:
        return struct.pack(">h", CONSUMER_GROUP_KEY_VERSION) + _str(self.group_id)


@dataclass(frozen=True, slots=True)
class ShareGroupKey:
    group_id: str

    def encode(self) -> bytes:
        return struct.pack(">h", SHARE_GROUP_KEY_VERSION) + _str(self.group_id)


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int | None = None

    def encode(self) -> bytes:
        if self.expire_timestamp_ms is not None:
            return (
                struct.pack(">hq", 1, self.offset)
                + _str(self.metadata)
                + struct.pack(">qq", self.commit_timestamp_ms, self.expire_timestamp_ms)
            )
        return (
            struct.pack(">hqi", 3, self.offset, self.leader_epoch)
            + _str(self.metadata)
            + struct.pack(">q", self.commit_timestamp_ms)
        )

    @classmethod
    def decode(cls, buf: bytes) -> OffsetValue:
        r = _Reader(buf)
        version = r.int16()
        if version in (0, 1):
            offset, metadata, ts = r.int64(), r.str(), r.int64()
            expire = r.int64() if version == 1 else None
            return cls(offset, -1, metadata, ts, expire)
        if version == 3:
            return cls(r.int64(), r.int32(), r.str(), r.int64())
        raise RecordFormatError(f"unsupported offset value version {version}")


@dataclass(frozen=True, slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupValue:
    protocol_type: str
    generation_id: int
    protocol_name: str | None
    leader_id: str | None
    state_timestamp_ms: int
    members: tuple[MemberValue, ...]

    def encode(self) -> bytes:
        parts = [
            struct.pack(">h", 3),
            _str(self.protocol_type),
            struct.pack(">i", self.generation_id),
            _nstr(self.protocol_name),
            _nstr(self.leader_id),
            struct.pack(">qi", self.state_timestamp_ms, len(self.members)),
        ]
        for m in self.members:
            parts += [
                _str(m.member_id),
                _nstr(m.group_instance_id),
                _str(m.client_id),
                _str(m.client_host),
                struct.pack(">ii", m.rebalance_timeout_ms, m.session_timeout_ms),
                _bytes(m.subscription),
                _bytes(m.assignment),
            ]
        return b"".join(parts)

    @classmethod
    def decode(cls, buf: bytes) -> GroupValue:
        r = _Reader(buf)
        version = r.int16()
        if version != 3:
            raise RecordFormatError(f"unsupported group value version {version}")
        protocol_type, generation, protocol, leader, ts = r.str(), r.int32(), r.nstr(), r.nstr(), r.int64()
        count = r.int32()
        if count < 0 or count > len(buf):
            raise RecordFormatError(f"bad member count {count}")
        members = tuple(
            MemberValue(r.str(), r.nstr(), r.str(), r.str(), r.int32(), r.int32(), r.bytes(), r.bytes())
            for _ in range(count)
        )
        return cls(protocol_type, generation, protocol, leader, ts, members)


def decode_key(buf: bytes) -> OffsetKey | GroupKey | ConsumerGroupKey | ShareGroupKey:
    r = _Reader(buf)
    version = r.int16()
    if version in (0, OFFSET_KEY_VERSION):
        return OffsetKey(r.str(), r.str(), r.int32())
    if version == GROUP_KEY_VERSION:
        return GroupKey(r.str())
    if version == CONSUMER_GROUP_KEY_VERSION:
        return ConsumerGroupKey(r.str())
    if version == SHARE_GROUP_KEY_VERSION:
        return ShareGroupKey(r.str())
    raise RecordFormatError(f"unsupported key version {version}")


# ---------------------------------------------------------------- v2 record batches


def encode_batch(
    records: list[tuple[bytes, bytes | None]],
    timestamp_ms: int,
    base_offset: int = 0,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
) -> bytes:
    """A plain v2 batch of (key, value) records; value None is a tombstone. With a producer
    id it is a transactional batch (TxnOffsetCommit: the offsets count once the producer's
    transaction commits)."""
    if not records:
        raise ValueError("a batch needs at least one record")
    body = bytearray()
    for delta, (key, value) in enumerate(records):
        rec = bytearray(b"\x00")  # attributes
        rec += write_varint(0)  # timestamp delta
        rec += write_varint(delta)
        rec += write_varint(len(key)) + key
        rec += write_varint(-1) if value is None else write_varint(len(value)) + value
        rec += write_varint(0)  # headers
        body += write_varint(len(rec)) + rec
    attributes = TRANSACTIONAL_BIT if producer_id >= 0 else 0
    header = HEADER.pack(
        base_offset,
        0,
        -1,
        2,
        0,
        attributes,
        len(records) - 1,
        timestamp_ms,
        timestamp_ms,
        producer_id,
        producer_epoch,
        -1,
        len(records),
    )
    batch = bytearray(header) + body
    struct.pack_into(">i", batch, 8, len(batch) - LOG_OVERHEAD)
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c.crc32c(batch[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


def decode_batches(buf: bytes | memoryview) -> Iterator[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of each record in a run of batches written by encode_batch.
    Corrupt or foreign (compressed, control) batches are skipped with a warning."""
    buf = memoryview(buf)
    pos = 0
    while pos + BATCH_HEADER_SIZE <= len(buf):
        (base_offset, length, _epoch, magic, crc, attributes, _lod, _bts, _mts, _pid, _pep, _bseq, count) = (
            HEADER.unpack_from(buf, pos)
        )
        end = pos + LOG_OVERHEAD + length
        if length < BATCH_HEADER_SIZE - LOG_OVERHEAD or end > len(buf):
            log.warning("__consumer_offsets: truncated batch at offset %d; ignoring the rest", base_offset)
            return
        if magic != 2 or crc32c.crc32c(buf[pos + ATTRIBUTES_OFFSET : end]) != crc:
            log.warning("__consumer_offsets: corrupt batch at offset %d skipped", base_offset)
        elif attributes & 0x07 or attributes & CONTROL_BIT:
            log.warning("__consumer_offsets: compressed or control batch at offset %d skipped", base_offset)
        else:
            try:
                yield from _decode_records(buf[pos + BATCH_HEADER_SIZE : end], base_offset, count)
            except ValueError as exc:  # RecordFormatError, or a bad varint (records.read_varint)
                log.warning("__consumer_offsets: bad records in batch at offset %d skipped: %s", base_offset, exc)
        pos = end


def _decode_records(buf: memoryview, base_offset: int, count: int) -> Iterator[tuple[int, bytes, bytes | None]]:
    out = []
    pos = 0
    for _ in range(count):
        length, pos = read_varint(buf, pos)
        end = pos + length
        if length < 0 or end > len(buf):
            raise RecordFormatError("record overruns its batch")
        pos += 1  # attributes
        _ts, pos = read_varint(buf, pos)
        delta, pos = read_varint(buf, pos)
        klen, pos = read_varint(buf, pos)
        if klen < 0 or pos + klen > end:
            raise RecordFormatError("bad key length")
        key = bytes(buf[pos : pos + klen])
        pos += klen
        vlen, pos = read_varint(buf, pos)
        value = None
        if vlen >= 0:
            if pos + vlen > end:
                raise RecordFormatError("bad value length")
            value = bytes(buf[pos : pos + vlen])
        out.append((base_offset + delta, key, value))
        pos = end
    # all-or-nothing per batch: a half-decoded batch must not half-apply
    yield from out
