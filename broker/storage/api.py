"""The stream API the Kafka layer uses: what a partition's log looks like from above.

A partition's log is a stream of opaque Kafka v2 record batches with dense offsets. The
engine never looks inside a batch (no per-record Python work): the Kafka layer validates a
batch, rewrites its baseOffset, and hands over the bytes with the record count.

Offset assignment is synchronous: `append` reserves [end_offset, end_offset + count) before
its first await, so a caller that reads `stream.end_offset` and calls `append` without
awaiting in between knows the base offset in advance (to rewrite baseOffset) and can pipeline
several appends to one stream without holding a lock across the WAL sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from automq.broker.objectstore import ObjectStore


class StreamError(Exception):
    pass


class RecordTooLargeError(StreamError):
    """The payload can never be appended (larger than the WAL can hold); retrying cannot help."""


class StreamClosedError(StreamError):
    """The stream was closed (or fenced by a newer owner); reopen it to continue."""


class OffsetOutOfRangeError(StreamError):
    """A fetch below the start offset or above the confirmed end offset."""

    def __init__(self, message: str, *, start_offset: int, end_offset: int) -> None:
        super().__init__(message)
        self.start_offset = start_offset
        self.end_offset = end_offset


@dataclass(frozen=True, slots=True)
class RecordBatchData:
    """One appended unit: the bytes as appended and the offsets they were given."""

    base_offset: int
    record_count: int
    payload: bytes | memoryview

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


@dataclass(frozen=True, slots=True)
class FetchResult:
    batches: list[RecordBatchData]
    # where the data came from, for metrics: "log_cache" | "block_cache" | "object_store" | "mixed"
    source: str = "log_cache"

    @property
    def size(self) -> int:
        return sum(len(b.payload) for b in self.batches)

    @property
    def next_offset(self) -> int | None:
        return self.batches[-1].next_offset if self.batches else None


@runtime_checkable
class Stream(Protocol):
    stream_id: int
    epoch: int
    epochs: tuple[tuple[int, int], ...]  # (epoch, start offset) of each owner range, from the open

    @property
    def start_offset(self) -> int:
        """First offset still readable (moved by trim)."""

    @property
    def end_offset(self) -> int:
        """Next offset `append` will assign."""

    @property
    def confirm_offset(self) -> int:
        """Every offset below this is durable (acknowledged). Fetch never reads past it:
        consumers must not see data a crash could lose (Kafka's high watermark)."""

    async def append(self, payload: bytes | memoryview, record_count: int) -> int:
        """Durably append one batch; returns its base offset once the WAL says it is durable.
        Raises StreamClosedError if the stream was closed or fenced."""

    async def fetch(self, start_offset: int, end_offset: int, max_bytes: int) -> FetchResult:
        """Batches overlapping [start_offset, min(end_offset, confirm_offset)). The first batch
        may begin before start_offset (whole batches only; clients skip). At least one batch
        is returned when any is available, even if larger than max_bytes; after the first,
        batches that would exceed max_bytes are left out. Raises OffsetOutOfRangeError when
        start_offset < start_offset or > confirm_offset."""

    async def trim(self, new_start_offset: int) -> None:
        """Drop data below new_start_offset (retention, DeleteRecords)."""

    def invalidate_cached_below(self, offset: int) -> None:
        """Data below `offset` was rewritten in the object store (a compaction): stop serving
        cached copies of it; later fetches of that range read the objects."""

    async def close(self) -> None:
        """Flush, upload what is pending for this stream, release ownership."""


@runtime_checkable
class StreamClient(Protocol):
    """The storage engine as a broker uses it."""

    # The object store the streams live in: the Kafka layer keeps per-stream companions
    # there too (producer-state snapshots).
    object_store: ObjectStore

    async def create_stream(self, tags: dict[str, str] | None = None) -> int: ...

    async def open_stream(self, stream_id: int, epoch: int) -> Stream:
        """Take ownership under epoch (fencing older owners), recover what the previous
        owner left in its WAL, and return a stream ready for appends and fetches."""

    async def release_stream(self, stream_id: int, epoch: int) -> None:
        """Upload what this node holds of the stream and release it under `epoch`, even if
        it is not open here (e.g. after a restart replayed the WAL into it)."""

    async def delete_stream(self, stream_id: int, epoch: int) -> None: ...
