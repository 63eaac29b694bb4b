"""The object format: how stream data is laid out inside one object in the object store.

    [data block]* [index] [footer]

- A *data block* holds consecutive batches of ONE stream, each framed as
  `base_offset u64 | record_count u32 | size u32 | payload`. Blocks are cut at
  `object_block_bytes` (a batch is never split, so a block may be larger).
- The *index* has one 36-byte entry per block: stream id u64, start offset u64,
  end-offset delta u32, record count u32, position u64, size u32. Entries are sorted by
  (stream id, start offset), so a reader binary-searches it.
- The *footer* is fixed-size and last: index position u64, index length u32, index CRC-32C
  u32, format version u16, flags u16, reserved, magic u64. A reader fetches the tail (footer +
  index, usually) with one ranged GET and then only the blocks it needs.

The version field lets the format evolve: a reader rejects versions it does not know instead
of misreading them. Batches stay opaque bytes; nothing here looks inside a Kafka batch.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import crc32c

FORMAT_VERSION = 1
FOOTER_MAGIC = 0x4155544F4D513031  # "AUTOMQ01"
FOOTER = struct.Struct(">QIIHH20sQ")  # 48 bytes
INDEX_ENTRY = struct.Struct(">QQIIQI")  # 36 bytes
BATCH_HEADER = struct.Struct(">QII")  # 16 bytes
# The reader's first GET takes this much of the tail: footer plus, usually, the whole index
# (1,800 entries), so most opens cost exactly one request.
TAIL_READ_BYTES = 64 << 10


class ObjectFormatError(Exception):
    """The bytes are not a valid object of a known version (truncated, corrupt, foreign)."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


@dataclass(frozen=True, slots=True)
class IndexEntry:
    stream_id: int
    start_offset: int
    end_offset: int
    record_count: int
    position: int
    size: int


@dataclass(slots=True)
class StreamDataSummary:
    """What an object holds for one stream (for the commit request)."""

    stream_id: int
    start_offset: int
    end_offset: int
    size: int


class ObjectWriter:
    """Builds one object in memory from batches appended stream by stream, in offset order.

    `parts()` returns the pieces to upload without joining them (payloads are not copied
    until the object store sends them)."""

    def __init__(self, block_bytes: int) -> None:
        self._block_bytes = block_bytes
        self._parts: list[bytes | memoryview] = []
        self._position = 0
        self._index: list[IndexEntry] = []
        self._summaries: dict[int, StreamDataSummary] = {}
        # open block
        self._block_stream = -1
        self._block_start = 0
        self._block_end = 0
        self._block_records = 0
        self._block_pos = 0
        self._block_size = 0
        self._finished: list[bytes | memoryview] | None = None

    def add_batch(self, stream_id: int, base_offset: int, record_count: int, payload: bytes | memoryview) -> None:
        if self._finished is not None:
            raise RuntimeError("object already finished")
        if stream_id != self._block_stream or self._block_size >= self._block_bytes:
            previous = self._block_stream
            self._cut_block()
            if stream_id in self._summaries and stream_id != previous:
                raise ValueError(f"stream {stream_id} data must be contiguous within one object")
            self._block_stream = stream_id
            self._block_start = base_offset
            self._block_end = base_offset
            self._block_pos = self._position
        elif base_offset != self._block_end:
            raise ValueError(f"stream {stream_id}: batch at {base_offset} does not continue {self._block_end}")
        header = BATCH_HEADER.pack(base_offset, record_count, len(payload))
        self._parts.append(header)
        self._parts.append(payload)
        n = len(header) + len(payload)
        self._position += n
        self._block_size += n
        self._block_records += record_count
        self._block_end = base_offset + record_count
        summary = self._summaries.get(stream_id)
        if summary is None:
            self._summaries[stream_id] = StreamDataSummary(stream_id, base_offset, self._block_end, n)
        else:
            if summary.end_offset != base_offset:
                raise ValueError(f"stream {stream_id}: batch at {base_offset} does not continue {summary.end_offset}")
            summary.end_offset = self._block_end
            summary.size += n

    def _cut_block(self) -> None:
        if self._block_stream >= 0 and self._block_size:
            self._index.append(
                IndexEntry(
                    self._block_stream,
                    self._block_start,
                    self._block_end,
                    self._block_records,
                    self._block_pos,
                    self._block_size,
                )
            )
        self._block_stream = -1
        self._block_size = 0
        self._block_records = 0

    @property
    def size(self) -> int:
        return self._position

    @property
    def streams(self) -> list[StreamDataSummary]:
        return list(self._summaries.values())

    def finish(self) -> list[bytes | memoryview]:
        """Close the object; returns its parts in order (their total is `total_size`)."""
        if self._finished is None:
            self._cut_block()
            index = b"".join(
                INDEX_ENTRY.pack(
                    e.stream_id, e.start_offset, e.end_offset - e.start_offset, e.record_count, e.position, e.size
                )
                for e in self._index
            )
            footer = FOOTER.pack(
                self._position, len(index), crc32c.crc32c(index), FORMAT_VERSION, 0, b"\0" * 20, FOOTER_MAGIC
            )
            self._finished = [*self._parts, index, footer]
            self._position += len(index) + len(footer)
        return self._finished

    @property
    def total_size(self) -> int:
        self.finish()
        return self._position


@dataclass(slots=True)
class ObjectIndex:
    """A parsed index: entries sorted by (stream id, start offset)."""

    entries: list[IndexEntry]
    object_size: int
    _keys: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._keys = [(e.stream_id, e.start_offset) for e in self.entries]

    def blocks(self, stream_id: int, start_offset: int, end_offset: int) -> list[IndexEntry]:
        """The blocks of `stream_id` overlapping [start_offset, end_offset), in order."""
        i = bisect.bisect_right(self._keys, (stream_id, start_offset)) - 1
        if i < 0 or self.entries[i].stream_id != stream_id or self.entries[i].end_offset <= start_offset:
            i += 1
        out = []
        while i < len(self.entries):
            e = self.entries[i]
            if e.stream_id != stream_id or e.start_offset >= end_offset:
                break
            if e.end_offset > start_offset:
                out.append(e)
            i += 1
        return out

    def stream_blocks_after(self, entry: IndexEntry) -> list[IndexEntry]:
        """Blocks of the same stream following `entry` (for read-ahead)."""
        i = bisect.bisect_right(self._keys, (entry.stream_id, entry.start_offset))
        out = []
        while i < len(self.entries) and self.entries[i].stream_id == entry.stream_id:
            out.append(self.entries[i])
            i += 1
        return out


def parse_tail(tail: bytes | memoryview, object_size: int, *, key: str | None = None) -> tuple[int, int, int]:
    """Parse the footer from the last bytes of an object: (index position, index length, crc)."""
    if len(tail) < FOOTER.size:
        raise ObjectFormatError(f"object of {object_size} bytes is shorter than the {FOOTER.size}-byte footer", key=key)
    index_pos, index_len, index_crc, version, _flags, _reserved, magic = FOOTER.unpack_from(
        tail, len(tail) - FOOTER.size
    )
    if magic != FOOTER_MAGIC:
        raise ObjectFormatError(f"bad footer magic {magic:#x}", key=key)
    if version != FORMAT_VERSION:
        raise ObjectFormatError(
            f"unsupported object format version {version} (this reader knows {FORMAT_VERSION})", key=key
        )
    if index_pos + index_len + FOOTER.size != object_size or index_len % INDEX_ENTRY.size:
        raise ObjectFormatError(
            f"footer points to index [{index_pos}, +{index_len}) inconsistent with size {object_size}", key=key
        )
    return index_pos, index_len, index_crc


def parse_index(index: bytes | memoryview, crc: int, object_size: int, *, key: str | None = None) -> ObjectIndex:
    if crc32c.crc32c(index) != crc:
        raise ObjectFormatError("index CRC mismatch", key=key)
    entries = []
    for sid, start, delta, count, pos, size in INDEX_ENTRY.iter_unpack(index):
        entries.append(IndexEntry(sid, start, start + delta, count, pos, size))
    return ObjectIndex(entries, object_size)


def iter_block_batches(block: bytes | memoryview, *, key: str | None = None) -> Iterator[tuple[int, int, memoryview]]:
    """Yield (base_offset, record_count, payload memoryview) for each batch in a data block,
    without copying payloads."""
    view = memoryview(block)
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < BATCH_HEADER.size:
            raise ObjectFormatError(f"truncated batch header at block position {pos}", key=key)
        base, count, size = BATCH_HEADER.unpack_from(view, pos)
        pos += BATCH_HEADER.size
        if pos + size > end:
            raise ObjectFormatError(f"batch at offset {base} overruns its block", key=key)
        yield base, count, view[pos : pos + size]
        pos += size


def open_object(data: bytes | memoryview, *, key: str | None = None) -> ObjectIndex:
    """Parse the index of a whole object held in memory (compaction, lake ingestion)."""
    view = memoryview(data)
    index_pos, index_len, crc = parse_tail(
        view[-FOOTER.size :] if len(view) >= FOOTER.size else view, len(view), key=key
    )
    return parse_index(view[index_pos : index_pos + index_len], crc, len(view), key=key)


def iter_object_batches(
    data: bytes | memoryview, stream_id: int | None = None, *, key: str | None = None
) -> Iterator[tuple[int, int, int, memoryview]]:
    """Yield (stream_id, base_offset, record_count, payload) for every batch of a whole
    object (optionally one stream's), in index order, without copying payloads."""
    view = memoryview(data)
    for e in open_object(view, key=key).entries:
        if stream_id is not None and e.stream_id != stream_id:
            continue
        for base, count, payload in iter_block_batches(view[e.position : e.position + e.size], key=key):
            yield e.stream_id, base, count, payload
