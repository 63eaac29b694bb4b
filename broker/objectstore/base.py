"""The ObjectStore interface: the only way any part of the system touches object storage.

Two backends implement it, chosen by URL (see `automq.broker.objectstore.open_object_store`):
`s3://bucket?endpoint=...&region=...&path_style=true` and `file:///path` (the embedded
default). Everything above this layer (WAL, uploader, block cache, controller metadata log,
Spark jobs) depends only on this module.

All methods are coroutines and must never block the event loop.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class ObjectStoreError(Exception):
    """Base class of every object-store failure. `key` names the object when there is one."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ObjectNotFound(ObjectStoreError):
    """The key does not exist (or the requested range starts past its end)."""


class PreconditionFailed(ObjectStoreError):
    """A conditional write lost: If-None-Match found an existing object, or If-Match a
    different ETag. The caller lost a race; retrying the same write will fail again."""


class BucketNotFound(ObjectStoreError):
    """The configured bucket (or local root directory) does not exist."""


class AccessDenied(ObjectStoreError):
    """Credentials are missing, invalid, or not allowed to perform the operation."""


class ObjectStoreUnavailable(ObjectStoreError):
    """The store did not answer in time or kept failing after retries (network, 5xx, throttling)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    last_modified: float = 0.0  # seconds since the epoch


@dataclass(frozen=True, slots=True)
class PutResult:
    key: str
    etag: str
    size: int


@dataclass(slots=True)
class ObjectStoreStats:
    """Counters a backend keeps; exported as Prometheus metrics by whoever owns the store."""

    puts: int = 0
    gets: int = 0
    bytes_put: int = 0
    bytes_got: int = 0
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)


MAX_KEY_BYTES = 1024


def validate_key(key: str) -> str:
    """Reject keys that are not portable across both backends (ValueError naming why).

    A key is 1..1024 UTF-8 bytes of '/'-separated non-empty segments, none of them '.' or
    '..', without a leading '/', backslashes or control characters. S3 would accept more,
    but these keys could escape a local root, collide as files, break S3 XML listings, or be
    rewritten by the server (SeaweedFS turns '\\' into '/').
    """
    if not isinstance(key, str):
        raise ValueError(f"object key must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError("object key must not be empty")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise ValueError(f"object key longer than {MAX_KEY_BYTES} bytes: {key[:64]!r}...")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F or 0xD800 <= ord(ch) <= 0xDFFF for ch in key):
        raise ValueError(f"object key contains a control character or lone surrogate: {key!r}")
    if "\\" in key:
        raise ValueError(f"object key must not contain a backslash: {key!r}")
    if key.startswith("/"):
        raise ValueError(f"object key must not start with '/': {key!r}")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"object key has an empty, '.' or '..' segment: {key!r}")
    return key


def validate_range(start: int, end: int | None) -> None:
    if start < 0:
        raise ValueError(f"range start must be >= 0, got {start}")
    if end is not None and end < start:
        raise ValueError(f"range end {end} is before start {start}")


async def iterate_parts(
    parts: AsyncIterator[bytes | memoryview] | Iterable[bytes | memoryview],
) -> AsyncIterator[bytes | memoryview]:
    """The parts given to `put_multipart`, whether a list or an async iterator."""
    if isinstance(parts, AsyncIterator):
        async for part in parts:
            yield part
    else:
        for part in parts:
            yield part


class WritePace(Protocol):
    """How fast a paced write may go: the writing thread calls `take` after each piece it
    wrote, and `take` sleeps as long as the pace asks (thread-safe; may be called from
    several writing threads, which then share the rate)."""

    def take(self, nbytes: int) -> None: ...


class ObjectStore(abc.ABC):
    """Object storage with the guarantees the rest of the system relies on.

    - `put` is atomic: readers see the whole new object or the old state, never a prefix.
    - `put(..., if_none_match=True)` creates only if absent; exactly one of two racing
      writers succeeds, the other gets PreconditionFailed. The controller's metadata log
      depends on this. Racing writers must put DISTINCT bytes: the S3 backend answers a 412
      whose object holds exactly the caller's bytes as a success, because its own PUT may have
      been re-sent after a lost reply (aiohttp does this) and the two cases look the same;
      the local backend would tell the second writer PreconditionFailed. With distinct
      payloads (the metadata log carries a nonce per entry) both backends agree.
    - `put(..., if_match=etag)` replaces only if the current ETag matches (a missing object
      is PreconditionFailed too). ETags are content hashes: a writer that puts bytes equal
      to the current object keeps the ETag, so a second writer holding it still matches
      (ABA). Make payloads unique (e.g. carry an epoch or sequence) when that matters.
    - ETags are opaque strings without quotes (md5 hex for single PUTs); if_match accepts
      them quoted or not.
    - `get(key, start, end)` reads bytes [start, end) (end exclusive, None = to the end);
      a range past the end is clipped, a start past the end raises ObjectNotFound
      ("past the end" = start >= size while start > 0, as S3 answers 416 there; start 0
      always works, so an empty object reads as b"").
    - `delete_many` ignores keys that do not exist.
    """

    url: str
    # put_parts writes the parts without joining them into one buffer (no second copy of an
    # uploaded block in memory): the uploader then hands it objects of any size that way.
    writes_parts_unjoined = False
    # get_into reads into the caller's buffer without a buffer of its own: the reader then
    # reads its read-ahead groups into buffers it reuses (automq.broker.storage.read.buffers).
    reads_into_buffers = False
    # Several PUTs at once get done sooner (their latencies overlap: S3). A store on one local
    # disk sets False: writes at once only contend there and for the CPU, so an uploader
    # writes one object after another.
    writes_in_parallel = True
    # get_into reads straight from the device (no page cache) when its range starts on a
    # multiple of this and its buffer is aligned and a multiple of it long; 0: no such reads.
    # A reader that can (its own aligned buffers) asks for such supersets of what it needs.
    read_alignment = 0

    @abc.abstractmethod
    async def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> PutResult: ...

    @abc.abstractmethod
    async def put_multipart(
        self, key: str, parts: AsyncIterator[bytes | memoryview] | list[bytes | memoryview]
    ) -> PutResult:
        """Upload a large object in parts (each but the last >= 5 MiB for S3). Atomic like put.
        The parts are read until this returns: a caller must not change a part it handed over."""

    async def put_parts(
        self, key: str, parts: Sequence[bytes | memoryview], *, pace: WritePace | None = None
    ) -> PutResult:
        """`put` of the parts' concatenation (an uploader's object: many batches). Joined off
        the event loop here; a store that can write the parts as they are overrides it.
        `pace`: background work that should not crowd out the caller's foreground; a store
        whose writes compete with it (the file store: the WAL's disk, the broker's CPU) writes
        at the pace's rate, the others ignore it."""
        return await self.put(key, await asyncio.to_thread(b"".join, parts))

    @abc.abstractmethod
    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes: ...

    async def get_into(self, key: str, start: int, buffer: memoryview) -> int:
        """`get(key, start, start + len(buffer))` into `buffer`; returns the bytes read (fewer
        at the object's end). Here a copy of `get`'s answer; a store that reads straight into
        the buffer overrides it and sets `reads_into_buffers`."""
        data = await self.get(key, start, start + len(buffer))
        buffer[: len(data)] = data
        return len(data)

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectInfo:
        """Raises ObjectNotFound when absent."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """All objects whose key starts with prefix, in lexicographic key order."""

    @abc.abstractmethod
    async def delete_many(self, keys: builtins.list[str]) -> None: ...

    async def delete(self, key: str) -> None:
        await self.delete_many([key])

    async def exists(self, key: str) -> bool:
        try:
            await self.head(key)
        except ObjectNotFound:
            return False
        return True

    async def close(self) -> None:  # noqa: B027 - optional hook: stores without connections need nothing
        """Release connections. Safe to call twice."""

    async def __aenter__(self) -> ObjectStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
