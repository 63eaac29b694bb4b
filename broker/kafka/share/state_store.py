"""Durable share-partition state: one object per (share group, partition stream).

Why the object store and not an internal topic: the state belongs to the partition's leader
(it changes with every acknowledgement), the leader may be any broker, and every broker
already reaches the object store the streams live in. One small object per share-partition,
replaced atomically on every change, needs no second coordinator and no inter-broker call
on the acknowledgement path, and any broker can read it (DescribeShareGroupOffsets, a new
leader after a move or a crash).

Fencing: every write is conditional on the ETag the writer last saw (If-Match; If-None-Match
for the first one). A new leader loads the object and immediately rewrites it under its own
leader epoch, so a deposed leader's next write loses (PreconditionFailed) and it stops
serving that share-partition instead of overwriting newer acknowledgements.

Key: `share-state/<md5(group)[:8]>/<group>/<stream id>` where <group> is the group id's UTF-8
bytes in hex (or `h-<sha256>` for very long ids; the id itself is inside the object), so a
group's partitions list under one prefix (DeleteGroups).

Format (big-endian):

    magic "AQSS" | version u16 | flags u16 | crc32c u32 (of everything after it)
    stream_id i64 | leader_epoch i32 | write_seq i64 | written_ms i64 | start_offset i64
    | group_len u16 | group utf-8 | range_count u32
    range: first i64 | last i64 | state i8 | delivery_count i16

Ranges are partition_state.durable_ranges(): only what a new leader could not infer
(acknowledged, archived, and released records with their delivery counts).
"""

from __future__ import annotations

import hashlib
import struct
import time
from dataclasses import dataclass, field

import crc32c

from automq.broker.objectstore import ObjectNotFound, ObjectStore

MAGIC = b"AQSS"
VERSION = 1
KEY_PREFIX = "share-state/"
_HEAD = struct.Struct(">4sHHI")
_BODY = struct.Struct(">qiqqqH")
_COUNT = struct.Struct(">I")
_RANGE = struct.Struct(">qqbh")
_HEX_GROUP_MAX = 200  # hex chars; local-disk file names stop at 255 bytes


class ShareStateFormatError(Exception):
    """Bytes that are not a share-state object this code can read."""


@dataclass(slots=True)
class ShareStateSnapshot:
    group_id: str
    stream_id: int
    start_offset: int
    ranges: list[tuple[int, int, int, int]] = field(default_factory=list)  # (first, last, state, count)
    leader_epoch: int = -1
    write_seq: int = 0
    written_ms: int = 0


def group_prefix(group_id: str) -> str:
    raw = group_id.encode()
    spread = hashlib.md5(raw).hexdigest()[:8]
    name = raw.hex()
    if not name or len(name) > _HEX_GROUP_MAX:
        name = "h-" + hashlib.sha256(raw).hexdigest()
    return f"{KEY_PREFIX}{spread}/{name}/"


def state_key(group_id: str, stream_id: int) -> str:
    return f"{group_prefix(group_id)}{stream_id}"


def encode(s: ShareStateSnapshot) -> bytes:
    group = s.group_id.encode()
    parts = [
        _BODY.pack(
            s.stream_id,
            s.leader_epoch,
            s.write_seq,
            s.written_ms or int(time.time() * 1000),
            s.start_offset,
            len(group),
        ),
        group,
        _COUNT.pack(len(s.ranges)),
    ]
    parts.extend(_RANGE.pack(first, last, state, min(count, 0x7FFF)) for first, last, state, count in s.ranges)
    body = b"".join(parts)
    return _HEAD.pack(MAGIC, VERSION, 0, crc32c.crc32c(body)) + body


def decode(data: bytes | memoryview) -> ShareStateSnapshot:
    data = memoryview(data)
    if len(data) < _HEAD.size + _BODY.size:
        raise ShareStateFormatError(f"share state of {len(data)} bytes is shorter than its header")
    magic, version, _flags, crc = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise ShareStateFormatError(f"not a share-state object (magic {bytes(magic)!r})")
    if version != VERSION:
        raise ShareStateFormatError(f"share-state version {version} is not supported (this broker reads {VERSION})")
    body = data[_HEAD.size :]
    if crc32c.crc32c(body) != crc:
        raise ShareStateFormatError("share-state CRC mismatch")
    try:
        stream_id, epoch, seq, written, start, glen = _BODY.unpack_from(body, 0)
        pos = _BODY.size
        group = bytes(body[pos : pos + glen]).decode()
        pos += glen
        (count,) = _COUNT.unpack_from(body, pos)
        pos += _COUNT.size
        ranges = []
        for _ in range(count):
            ranges.append(_RANGE.unpack_from(body, pos))
            pos += _RANGE.size
    except (struct.error, UnicodeDecodeError) as exc:
        raise ShareStateFormatError(f"share state is truncated: {exc}") from None
    if pos != len(body):
        raise ShareStateFormatError(f"share state has {len(body) - pos} trailing bytes")
    return ShareStateSnapshot(group, stream_id, start, ranges, epoch, seq, written)


class ShareStateStore:
    """Loads, conditionally writes and deletes share-partition state objects."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    async def load(self, group_id: str, stream_id: int) -> tuple[ShareStateSnapshot, str] | None:
        """(state, ETag), or None when the group never consumed this partition.
        An unreadable object raises ShareStateFormatError (never silently restarts the group)."""
        key = state_key(group_id, stream_id)
        try:
            info = await self._store.head(key)
            data = await self._store.get(key)
        except ObjectNotFound:
            return None
        snapshot = decode(data)
        if snapshot.group_id != group_id or snapshot.stream_id != stream_id:
            raise ShareStateFormatError(
                f"{key} holds group {snapshot.group_id!r} stream {snapshot.stream_id}, not {group_id!r} {stream_id}"
            )
        # The ETag of what we read: a write between head and get makes the next
        # conditional write fail, which is the safe direction.
        return snapshot, info.etag

    async def write(self, snapshot: ShareStateSnapshot, etag: str | None) -> str:
        """Replace the object if it still has `etag` (create it when None); returns the new
        ETag. Raises objectstore.PreconditionFailed when someone else wrote in between."""
        key = state_key(snapshot.group_id, snapshot.stream_id)
        data = encode(snapshot)
        if etag is None:
            result = await self._store.put(key, data, if_none_match=True)
        else:
            result = await self._store.put(key, data, if_match=etag)
        return result.etag

    async def delete(self, group_id: str, stream_id: int) -> None:
        await self._store.delete(state_key(group_id, stream_id))

    async def streams_of_group(self, group_id: str) -> list[int]:
        """Stream ids of every partition the group has state for."""
        prefix = group_prefix(group_id)
        out = []
        async for info in self._store.list(prefix):
            tail = info.key[len(prefix) :]
            if tail.isdigit():
                out.append(int(tail))
        return sorted(out)
