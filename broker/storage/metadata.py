"""The contract between the storage engine and whoever keeps stream/object metadata.

The storage engine (WAL, caches, uploader, readers) never decides who owns a stream or
which objects exist: it asks a `StreamManager` and an `ObjectManager`. The controller
implements both (over its HTTP API, `automq.broker.controller.client`); the storage
engine ships an in-process implementation backed by the object store for tests and
single-process use. Both must enforce the same rules, listed on each method.

Epochs and fencing
------------------
- A node (broker) has `node_id` and a `node_epoch` that grows on every registration.
  Requests carrying an older node epoch fail with `NodeFencedError`.
- A stream has an `epoch`. `open_stream(id, epoch)` with epoch >= current makes the caller
  the owner and closes the previous owner's range; an older epoch fails with
  `StreamFencedError`. Appends/commits/trims carry the epoch and are rejected when stale.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

# --------------------------------------------------------------------------- errors


class MetadataError(Exception):
    """Base class. `code` is stable and travels over the controller API."""

    code = "METADATA_ERROR"


class NodeFencedError(MetadataError):
    """The request carried a node epoch older than the registered one (a zombie broker)."""

    code = "NODE_FENCED"


class StreamFencedError(MetadataError):
    """The request carried a stream epoch older than the stream's current epoch."""

    code = "STREAM_FENCED"


class StreamNotFoundError(MetadataError):
    code = "STREAM_NOT_FOUND"


class StreamNotOpenError(MetadataError):
    """The stream is not open by the caller (closed, or opened by another node)."""

    code = "STREAM_NOT_OPEN"


class OffsetMismatchError(MetadataError):
    """A commit's ranges do not continue the stream's committed end offset."""

    code = "OFFSET_MISMATCH"


class ObjectNotPreparedError(MetadataError):
    """Committing an object id that was never prepared, already committed, or expired."""

    code = "OBJECT_NOT_PREPARED"


class NotControllerError(MetadataError):
    """This controller is not (or no longer) the active one; retry against the leader."""

    code = "NOT_CONTROLLER"


ERRORS_BY_CODE: dict[str, type[MetadataError]] = {
    cls.code: cls
    for cls in (
        MetadataError,
        NodeFencedError,
        StreamFencedError,
        StreamNotFoundError,
        StreamNotOpenError,
        OffsetMismatchError,
        ObjectNotPreparedError,
        NotControllerError,
    )
}


# --------------------------------------------------------------------------- data


class ObjectType(enum.IntEnum):
    STREAM_SET = 1  # many streams' data blocks in one object (one per upload)
    STREAM = 2  # one stream's data, split out when it is large, or produced by compaction


@dataclass(frozen=True, slots=True)
class StreamOffsetRange:
    """Offsets [start_offset, end_offset) of one stream held by an object."""

    stream_id: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class ObjectStreamRange:
    """What an upload wrote for one stream: the range plus the epoch it was written under."""

    stream_id: int
    epoch: int
    start_offset: int
    end_offset: int
    size: int  # bytes of this stream's data in the object


@dataclass(frozen=True, slots=True)
class StreamObject:
    """An object holding one stream's consecutive range."""

    object_id: int
    object_size: int
    stream_id: int
    start_offset: int
    end_offset: int
    # object ids this one replaces (compaction); empty for a fresh upload
    source_object_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CommitStreamSetObjectRequest:
    """One upload's commit: a stream-set object (may be absent, object_id = -1, when every
    stream went to its own stream object) plus the stream objects split off it."""

    node_id: int
    node_epoch: int
    object_id: int
    object_size: int
    stream_ranges: tuple[ObjectStreamRange, ...]
    stream_objects: tuple[StreamObject, ...] = ()
    # stream-set objects this one replaces (compaction); empty for a fresh upload
    compacted_object_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ObjectMetadata:
    """A committed object as readers see it."""

    object_id: int
    object_size: int
    object_type: ObjectType
    ranges: tuple[StreamOffsetRange, ...]
    committed_at_ms: int = 0
    node_id: int = -1  # uploader, for stream-set objects

    @property
    def key(self) -> str:
        return object_key(self.object_id)


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    stream_id: int
    epoch: int
    start_offset: int
    end_offset: int  # committed end: data below it is in objects; above it may be in a WAL
    owner_node_id: int = -1
    state: str = "closed"  # "open" | "closed"
    tags: dict[str, str] = field(default_factory=dict)  # e.g. {"topic": "t", "partition": "0"}
    # (epoch, start offset) of every owner range in order: a partition's leader-epoch history
    # (stream epoch == leader epoch). Empty from metadata stores that keep no ranges.
    epochs: tuple[tuple[int, int], ...] = ()


def object_key(object_id: int) -> str:
    """Where an object id lives in the bucket. A hashed prefix spreads keys across S3
    partitions (S3 scales request rates per prefix), the id keeps keys unique."""
    prefix = hashlib.md5(str(object_id).encode(), usedforsecurity=False).hexdigest()[:8]
    return f"objects/{prefix}/{object_id}"


# --------------------------------------------------------------------------- interfaces


@runtime_checkable
class StreamManager(Protocol):
    async def create_stream(self, tags: dict[str, str] | None = None) -> int:
        """Allocate a new stream id (epoch 0, offsets 0..0, closed)."""

    async def open_stream(self, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> StreamMetadata:
        """Become the owner under `epoch` (>= current). Returns the metadata with the committed
        end offset; the caller then recovers anything past it from the previous owner's WAL
        before serving. Raises StreamFencedError / NodeFencedError / StreamNotFoundError."""

    async def close_stream(self, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> None:
        """Give up ownership. Idempotent for the current owner."""

    async def trim_stream(
        self, stream_id: int, epoch: int, new_start_offset: int, node_id: int, node_epoch: int
    ) -> None:
        """Move the start offset forward (never backward). Objects wholly below it become garbage."""

    async def delete_stream(self, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> None:
        """Remove the stream; all its data becomes garbage."""

    async def get_streams(self, stream_ids: list[int]) -> list[StreamMetadata]:
        """Current metadata for each id that exists (missing ids are left out)."""


@runtime_checkable
class ObjectManager(Protocol):
    async def prepare_objects(self, count: int, ttl_ms: int) -> int:
        """Reserve `count` consecutive object ids; returns the first. Uncommitted ids expire
        after ttl_ms and whatever was written under them is deleted."""

    async def commit_stream_set_object(self, request: CommitStreamSetObjectRequest) -> None:
        """Atomically record an upload. Each range must start at the stream's committed end
        offset (OffsetMismatchError), be written under the stream's current epoch by its
        current owner (StreamFencedError / StreamNotOpenError), and the node epoch must be
        current (NodeFencedError). For compaction (`compacted_object_ids`) the new objects
        replace the old ones, which are marked for deletion."""

    async def commit_stream_object(self, obj: StreamObject, node_id: int, node_epoch: int) -> None:
        """Record a stream object produced by compaction (replacing `source_object_ids`)."""

    async def get_objects(self, stream_id: int, start_offset: int, end_offset: int, limit: int) -> list[ObjectMetadata]:
        """Committed objects covering [start_offset, end_offset) of a stream, ordered by offset,
        at most `limit`. end_offset = -1 means up to the committed end."""

    async def get_stream_set_objects(self, node_id: int | None = None) -> list[ObjectMetadata]:
        """Committed stream-set objects (optionally only one uploader's), for compaction."""
