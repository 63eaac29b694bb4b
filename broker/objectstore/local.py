"""The embedded object store: objects as files under one root directory (`file:///path`).

A real backend for local mode and single-machine deployments, with the same guarantees as
S3 (see `base.ObjectStore`), including across processes sharing the directory:

- put: write a temp file in the target directory, fsync it, rename it over the target,
  fsync the directory. Readers see the old or the new file, never a prefix.
- conditional create: `os.link(temp, target)` fails with EEXIST if the target exists, so
  exactly one of any number of racing writers (threads or processes) wins.
- every change of a key's file (rename, link, unlink) happens under an `flock` on one lock
  file per directory, so If-Match can read the current ETag and replace it without another
  writer slipping in between. Only the rename is under the lock, never the data write/fsync.
- ETag = md5 hex of the content, stored in the `user.automq.etag` xattr of the temp file
  before the rename (so it is atomic with the content); computed from the data when the
  filesystem has no user xattrs. Objects written by `put_multipart`, and unconditional puts
  of at least 8 MiB (the uploader's objects), get `<crc32c>-<size>-c` instead when xattrs
  work (S3's multipart ETags are not the content's MD5 either): MD5 of every uploaded byte
  was the largest single CPU cost of a broker at peak on this store (docs/benchmarks.md,
  "Peak profile"); CRC-32C runs in hardware. Conditional writes (the metadata log's
  compare-and-swap objects) keep MD5. Tags are content-derived: the same bytes always get the
  same tag. A tool that copies objects without their xattrs turns such a tag into the MD5
  (an If-Match with the old tag then fails; it never falsely succeeds).

On-disk names: key "a/b/c" is stored as `<root>/a/b/c%obj`. Every '%' in a segment is
written as '%25', so the names we add ("…%obj" files, ".%tmp-…" temp files, "%lock") can
never collide with a directory or object of another key ("x" and "x/y" both exist in S3).
Segments are limited to what a file name can hold (~250 bytes).

Object data of 1 MiB and more is written around the page cache (O_DIRECT through a reused
aligned buffer), and ranged reads into aligned buffers are read the same way
(`direct_io.py`): the broker caches what it serves itself, and copying every uploaded byte
into new page-cache pages was most of a broker's CPU at peak on this project's VMs. Where the
filesystem refuses O_DIRECT, everything goes through the page cache as before: small steps
written back with sync_file_range, one fsync to seal.

Blocking file I/O runs in threads (`asyncio.to_thread`), at most `max_concurrency` at once.
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
import ctypes
import errno
import fcntl
import hashlib
import itertools
import os
import secrets
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

import crc32c

from automq.broker import diskio
from automq.broker.objectstore import direct_io
from automq.broker.objectstore.base import (
    BucketNotFound,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreStats,
    PreconditionFailed,
    PutResult,
    WritePace,
    iterate_parts,
    validate_key,
    validate_range,
)


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range (Linux; Python's os module has no wrapper), or None. ctypes
    releases the GIL for the call, so the event loop runs while a step is written back."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


OBJECT_SUFFIX = "%obj"
TEMP_PREFIX = ".%tmp-"
LOCK_NAME = "%lock"
ETAG_XATTR = "user.automq.etag"
FAST_TAG_BYTES = 8 << 20  # unconditional puts from this size on get a CRC-32C tag, not MD5
DIRECT_MIN_BYTES = 1 << 20  # objects from this size on are written around the page cache (direct_io.py)
_MAX_NAME_BYTES = 255
_COPY_CHUNK = 1 << 20
# Objects are written back in steps of this size (write, then start and wait for that range's
# write-back with sync_file_range) and made durable by one fsync in `seal`: a WAL fdatasync on
# the same disk then waits behind at most one small step. One write of tens of MiB and one
# fsync had it wait up to 35-43 ms. benchmarks/store_wal_contention_bench.py, median WAL
# fdatasync p99 while 64 MiB objects are written (busy machine, load 9-10): 23.9 ms with 4 MiB
# write+fdatasync steps, 14.2 ms with these, 10.8 ms with no store writes; twice as many WAL
# syncs complete meanwhile; the store writes ~25 % slower. I/O priority class idle on the
# store's threads (ioprio_set) did not help (17.2 ms): mq-deadline orders only requests waiting
# for a device tag, and this disk's 128 tags are not used up by these writes.
_WRITEBACK_STEP = 256 << 10
_FALLBACK_STEP = 4 << 20  # without sync_file_range: sync the data every 4 MiB (as before stop 25)
# Joined runs of an object's parts stay under malloc's mmap threshold (broker/malloc.py), so
# their memory is reused from the heap rather than mapped and faulted in afresh.
_JOIN_RUN = 192 << 10
_SYNC_FILE_RANGE_FLAGS = 1 | 2 | 4  # WAIT_BEFORE | WRITE | WAIT_AFTER
_sync_file_range = _load_sync_file_range()


def _write_back(fd: int, offset: int, length: int) -> None:
    """Write `length` bytes at `offset` of `fd` back to the device and wait for them (not a
    durability point: no cache flush, no metadata; `seal`'s fsync is). Where sync_file_range
    is missing (off Linux) or refused (some filesystems), a data sync each time the object
    crosses a `_FALLBACK_STEP` boundary instead: a sync per 256 KiB step would flush the
    drive's cache 256 times for a 64 MiB object (macOS's F_FULLFSYNC does)."""
    if _sync_file_range is not None:
        if _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_FLAGS) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ESPIPE):
            raise OSError(err, f"sync_file_range: {os.strerror(err)}")
    if (offset + length) // _FALLBACK_STEP != offset // _FALLBACK_STEP:
        diskio.datasync(fd)


def _joined_runs(parts: Sequence[bytes | memoryview], ends: list[int]) -> Iterator[bytes | memoryview]:
    """The parts as runs of consecutive small parts joined up to _JOIN_RUN bytes (a part of
    that size or more alone, not copied). `ends`: the parts' cumulative lengths."""
    i, done = 0, 0
    while i < len(parts):
        j = max(bisect.bisect_right(ends, done + _JOIN_RUN, i), i + 1)
        yield parts[i] if j == i + 1 else b"".join(parts[i:j])
        done = ends[j - 1]
        i = j


def _encode_segment(segment: str) -> str:
    encoded = segment.replace("%", "%25")
    if len((encoded + OBJECT_SUFFIX).encode("utf-8")) > _MAX_NAME_BYTES:
        raise ValueError(f"key segment too long for the local object store (max ~250 bytes): {segment[:40]!r}...")
    return encoded


def _is_encoded(name: str) -> bool:
    """True for names `_encode_segment` can produce: every '%' starts '%25'."""
    index = name.find("%")
    while index != -1:
        if not name.startswith("%25", index):
            return False
        index = name.find("%", index + 3)
    return True


def _decode_segment(name: str) -> str:
    return name.replace("%25", "%")


@dataclass(frozen=True, slots=True)
class _Stat:
    size: int
    etag: str
    mtime: float


class _TempObject:
    """A new object's content being written next to its final place: a `.%tmp-*` file that
    `seal()` tags with its ETag and fsyncs; the store then renames or links it into place."""

    def __init__(
        self,
        store: LocalObjectStore,
        directory: Path,
        *,
        fast_tag: bool = False,
        pace: WritePace | None = None,
        direct: bool = False,
    ) -> None:
        self.store = store
        self._pace = pace
        self.path = directory / f"{TEMP_PREFIX}{secrets.token_hex(8)}"
        # around the page cache (direct_io.py): the writer paces itself per direct write
        self._direct: direct_io.DirectWriter | None = None
        if direct:
            self.fd: int | None = direct_io.open_for_writing(self.path)
            self._direct = direct_io.DirectWriter(self.fd, pace.take if pace is not None else None)
        else:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.size = 0
        # A CRC-32C tag must be stored to be found again (without the xattr, readers compute
        # MD5): only when xattrs work.
        self._crc: int | None = 0 if fast_tag and store._xattrs else None
        self._digest = hashlib.md5(usedforsecurity=False) if self._crc is None else None

    def write(self, chunk: bytes | bytearray | memoryview) -> None:
        assert self.fd is not None
        view = memoryview(chunk).cast("B")
        if self._crc is not None:
            self._crc = crc32c.crc32c(view, self._crc)
        else:
            assert self._digest is not None
            self._digest.update(view)
        if self._direct is not None:
            self._direct.write(view)
            self.size += len(view)
            return
        step = _WRITEBACK_STEP if self.store._fsync else len(view)
        while view:
            piece = view[:step]
            start = self.size
            while piece:
                n = os.write(self.fd, piece)
                piece, view = piece[n:], view[n:]
                self.size += n
            if self.store._fsync:
                _write_back(self.fd, start, self.size - start)
            if self._pace is not None:
                self._pace.take(self.size - start)

    def seal(self) -> str:
        """Store the ETag (xattr), fsync, close; returns the ETag."""
        assert self.fd is not None
        if self._direct is not None:
            self._direct.finish()
        if self._crc is not None:
            etag = f"{self._crc:08x}-{self.size}-c"
        else:
            assert self._digest is not None
            etag = self._digest.hexdigest()
        if self.store._xattrs:
            try:
                os.setxattr(self.fd, ETAG_XATTR, etag.encode("ascii"))
            except OSError as exc:
                if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                self.store._xattrs = False
                if self._crc is not None:  # not storable: the tag readers will compute
                    etag = self.store._etag_of_fd(os.open(self.path, os.O_RDONLY), close=True)
        if self.store._fsync:
            diskio.fullsync(self.fd)
        os.close(self.fd)
        self.fd = None
        return etag

    def discard(self) -> None:
        if self._direct is not None:
            self._direct.release()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.path.unlink(missing_ok=True)


class LocalObjectStore(ObjectStore):
    writes_parts_unjoined = True
    writes_in_parallel = False
    reads_into_buffers = True

    def __init__(self, root: str | Path, *, max_concurrency: int = 16, fsync: bool = True) -> None:
        self.root = Path(root)
        self.url = f"file://{self.root}"
        self.stats = ObjectStoreStats()
        self._fsync = fsync
        self._max_concurrency = max_concurrency
        self._semaphore: asyncio.Semaphore | None = None
        self._semaphore_loop: asyncio.AbstractEventLoop | None = None
        self._root_checked = False
        self._paced = threading.Lock()  # paced puts, one at a time
        self._direct = False  # object data around the page cache: decided once the root exists
        # cleared the first time the filesystem refuses user xattrs; macOS's os module has none
        self._xattrs = hasattr(os, "setxattr")

    @classmethod
    def from_url(cls, url: str) -> LocalObjectStore:
        """`file:///abs/path[?fsync=false&max_concurrency=N]`; ValueError naming what is wrong."""
        parts = urlsplit(url)
        if parts.scheme != "file":
            raise ValueError(f"local object store URL {url!r}: scheme must be file://")
        if parts.netloc not in ("", "localhost"):
            raise ValueError(
                f"local object store URL {url!r}: host must be empty (file:///abs/path), got {parts.netloc!r}"
            )
        if not parts.path.startswith("/") or parts.path == "/":
            raise ValueError(f"local object store URL {url!r}: needs an absolute directory path other than /")
        if "\x00" in unquote(parts.path):
            raise ValueError(f"local object store URL {url!r}: path contains NUL")
        kwargs: dict[str, object] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name == "fsync":
                if value not in ("true", "false"):
                    raise ValueError(f"local object store URL {url!r}: fsync must be true or false, got {value!r}")
                kwargs["fsync"] = value == "true"
            elif name == "max_concurrency":
                try:
                    kwargs["max_concurrency"] = int(value)
                except ValueError:
                    raise ValueError(f"local object store URL {url!r}: max_concurrency must be an integer") from None
                if kwargs["max_concurrency"] < 1:  # type: ignore[operator]
                    raise ValueError(f"local object store URL {url!r}: max_concurrency must be >= 1")
            else:
                raise ValueError(
                    f"local object store URL {url!r}: unknown query parameter {name!r} (known: fsync, max_concurrency)"
                )
        store = cls(unquote(parts.path), **kwargs)  # type: ignore[arg-type]
        store.url = url
        return store

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(self, op: str, func, *args):
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._semaphore_loop is not loop:
            # asyncio primitives belong to one loop; a store may be reused from a new one.
            self._semaphore = asyncio.Semaphore(self._max_concurrency)
            self._semaphore_loop = loop
        async with self._semaphore:
            with self._errors(op):
                return await asyncio.to_thread(func, *args)

    @contextmanager
    def _errors(self, op: str) -> Iterator[None]:
        """Counts a failed operation in stats.errors by kind; an OSError becomes an
        ObjectStoreError naming the store."""
        try:
            yield
        except ObjectStoreError as exc:
            self.stats.errors[type(exc).__name__] = self.stats.errors.get(type(exc).__name__, 0) + 1
            raise
        except OSError as exc:
            self.stats.errors["OSError"] = self.stats.errors.get("OSError", 0) + 1
            raise ObjectStoreError(f"{op} failed on {self.root}: {exc}") from exc

    def _check_root(self) -> None:
        if self._root_checked:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise BucketNotFound(f"local object store root {self.root} exists but is not a directory") from None
        except NotADirectoryError:
            raise BucketNotFound(
                f"local object store root {self.root}: a parent path is a file, not a directory"
            ) from None
        if not self.root.is_dir():
            raise BucketNotFound(f"local object store root {self.root} exists but is not a directory")
        # probed under a temp name: a crash in between leaves what a crashed put leaves
        self._direct = direct_io.supported(self.root / f"{TEMP_PREFIX}direct-probe-{secrets.token_hex(8)}")
        self._root_checked = True

    @property
    def read_alignment(self) -> int:  # type: ignore[override]
        """Direct reads want ranges and buffers aligned to this (0 until known, or when this
        filesystem refuses O_DIRECT)."""
        return direct_io.ALIGN if self._direct else 0

    def _path(self, key: str) -> tuple[Path, str]:
        """(directory, file name) of a key's object file."""
        validate_key(key)
        segments = [_encode_segment(s) for s in key.split("/")]
        directory = self.root.joinpath(*segments[:-1])
        return directory, segments[-1] + OBJECT_SUFFIX

    def _ensure_dir(self, directory: Path) -> None:
        """Create `directory` (under root) durably: each new directory's parent is fsynced."""
        if directory.is_dir():
            return
        missing: list[Path] = []
        current = directory
        while not current.is_dir():
            missing.append(current)
            current = current.parent
        for path in reversed(missing):
            try:
                path.mkdir()
            except FileExistsError:
                if not path.is_dir():
                    raise ObjectStoreError(f"{path} is in the way of an object directory (not a directory)") from None
            self._fsync_dir(path.parent)

    def _fsync_dir(self, directory: Path) -> None:
        if not self._fsync:
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            diskio.fullsync(fd)
        finally:
            os.close(fd)

    @contextmanager
    def _dir_lock(self, directory: Path) -> Iterator[None]:
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _etag_of_fd(self, fd: int, *, close: bool = False) -> str:
        if close:
            try:
                return self._etag_of_fd(fd)
            finally:
                os.close(fd)
        if self._xattrs:
            try:
                return os.getxattr(fd, ETAG_XATTR).decode("ascii")
            except OSError as exc:
                if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
        digest = hashlib.md5(usedforsecurity=False)
        offset = 0
        while chunk := os.pread(fd, _COPY_CHUNK, offset):
            digest.update(chunk)
            offset += len(chunk)
        return digest.hexdigest()

    def _stat_fd(self, fd: int) -> _Stat:
        st = os.fstat(fd)
        return _Stat(size=st.st_size, etag=self._etag_of_fd(fd), mtime=st.st_mtime)

    def _current_etag(self, path: Path) -> str | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return self._etag_of_fd(fd)
        finally:
            os.close(fd)

    # -- writing ----------------------------------------------------------------------------

    def _new_temp(
        self, directory: Path, fast_tag: bool = False, pace: WritePace | None = None, direct: bool = False
    ) -> _TempObject:
        self._ensure_dir(directory)
        return _TempObject(self, directory, fast_tag=fast_tag, pace=pace, direct=direct and self._direct)

    def _commit(
        self,
        key: str,
        directory: Path,
        name: str,
        temp: Path,
        etag: str,
        size: int,
        if_none_match: bool,
        if_match: str | None,
    ) -> PutResult:
        target = directory / name
        try:
            with self._dir_lock(directory):
                if if_none_match:
                    try:
                        os.link(temp, target)  # atomic create-if-absent, also across processes
                    except FileExistsError:
                        raise PreconditionFailed(f"object {key!r} already exists", key=key) from None
                    except OSError as exc:
                        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                            raise
                        # No hard links here (some FUSE/SMB mounts): every change to this
                        # directory happens under its lock, so check-then-rename is atomic too.
                        if os.path.lexists(target):
                            raise PreconditionFailed(f"object {key!r} already exists", key=key) from None
                        os.rename(temp, target)
                    else:
                        os.unlink(temp)
                else:
                    if if_match is not None:
                        current = self._current_etag(target)
                        if current is None:
                            # S3 answers 404 for If-Match on a missing key; a lost race either way.
                            raise PreconditionFailed(f"object {key!r} does not exist (If-Match {if_match})", key=key)
                        if current != if_match.strip('"'):
                            raise PreconditionFailed(
                                f"object {key!r} has ETag {current}, not {if_match.strip(chr(34))}", key=key
                            )
                    os.rename(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self._fsync_dir(directory)
        return PutResult(key=key, etag=etag, size=size)

    def _write_object(
        self,
        key: str,
        chunks: Iterable[bytes | bytearray | memoryview],
        size: int,
        if_none_match: bool = False,
        if_match: str | None = None,
        pace: WritePace | None = None,
    ) -> PutResult:
        """The chunks, in order, as the object `key` (`size`: their total length)."""
        self._check_root()
        directory, name = self._path(key)
        fast = not (if_none_match or if_match is not None) and size >= FAST_TAG_BYTES
        temp = self._new_temp(directory, fast, pace, direct=size >= DIRECT_MIN_BYTES)
        try:
            for chunk in chunks:
                temp.write(chunk)
            etag = temp.seal()
        except BaseException:
            temp.discard()
            raise
        return self._commit(key, directory, name, temp.path, etag, temp.size, if_none_match, if_match)

    def _put_sync(
        self, key: str, data: bytes | bytearray | memoryview, if_none_match: bool, if_match: str | None
    ) -> PutResult:
        return self._write_object(key, (data,), memoryview(data).nbytes, if_none_match, if_match)

    async def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> PutResult:
        validate_key(key)
        if if_none_match and if_match is not None:
            raise ValueError("put: if_none_match and if_match are mutually exclusive")
        result = await self._run("put", self._put_sync, key, data, if_none_match, if_match)
        self.stats.puts += 1
        self.stats.bytes_put += result.size
        return result

    def _put_parts_sync(self, key: str, parts: Sequence[bytes | memoryview], pace: WritePace | None) -> PutResult:
        ends = list(itertools.accumulate(len(part) for part in parts))
        if pace is None:
            return self._write_object(key, _joined_runs(parts, ends), ends[-1] if ends else 0)
        with self._paced:
            return self._write_object(key, _joined_runs(parts, ends), ends[-1] if ends else 0, pace=pace)

    async def put_parts(
        self, key: str, parts: Sequence[bytes | memoryview], *, pace: WritePace | None = None
    ) -> PutResult:
        """The parts go to the file in runs joined to under malloc's mmap threshold: joining a
        whole 64 MiB object first cost a fresh 64 MiB buffer per upload (one page fault per
        4 KiB and a copy, ~250 faults per MiB uploaded) and as much memory while it lived.

        With a `pace`, each write-back step waits for it, and paced puts run one at a time:
        several at once only share the rate while handing the GIL around more (the broker's
        uploads, issue 14: a 64 MiB block's four objects written at once slowed every Produce
        in that half second, p50 1.1 -> 9 ms)."""
        validate_key(key)
        result = await self._run("put", self._put_parts_sync, key, parts, pace)
        self.stats.puts += 1
        self.stats.bytes_put += result.size
        return result

    async def put_multipart(
        self, key: str, parts: AsyncIterator[bytes | memoryview] | list[bytes | memoryview]
    ) -> PutResult:
        """Parts are appended to one temp file as they arrive, then committed like `put`."""
        validate_key(key)
        await self._run("put_multipart", self._check_root)
        directory, name = self._path(key)
        temp: _TempObject = await self._run("put_multipart", self._new_temp, directory, True, None, True)
        try:
            async for part in iterate_parts(parts):
                await self._run("put_multipart", temp.write, part)
            etag = await self._run("put_multipart", temp.seal)
            result = await self._run(
                "put_multipart", self._commit, key, directory, name, temp.path, etag, temp.size, False, None
            )
        except BaseException:
            temp.discard()
            raise
        self.stats.puts += 1
        self.stats.bytes_put += temp.size
        return result

    # -- reading ----------------------------------------------------------------------------

    def _open_object(self, key: str) -> int:
        self._check_root()
        directory, name = self._path(key)
        try:
            return os.open(directory / name, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(f"object {key!r} not found", key=key) from None

    @staticmethod
    def _range_length(fd: int, key: str, start: int, end: int | None) -> int:
        """Bytes of [start, end) the open object holds (clipped at its end); a start past the
        end raises ObjectNotFound, as S3 answers 416 there."""
        size = os.fstat(fd).st_size
        if start > 0 and start >= size:
            raise ObjectNotFound(f"range start {start} is past the end of {key!r} ({size} bytes)", key=key)
        stop = size if end is None else min(end, size)
        return max(0, stop - start)

    def _get_sync(self, key: str, start: int, end: int | None) -> bytes:
        fd = self._open_object(key)
        try:
            length = self._range_length(fd, key, start, end)
            chunks = []
            offset = start
            while length > 0:
                chunk = os.pread(fd, min(length, 64 << 20), offset)
                if not chunk:
                    break
                chunks.append(chunk)
                offset += len(chunk)
                length -= len(chunk)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            os.close(fd)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        validate_key(key)
        validate_range(start, end)
        return self._got(await self._run("get", self._get_sync, key, start, end))

    def _get_into_sync(self, key: str, start: int, buffer: memoryview) -> int:
        fd = self._open_object(key)
        try:
            want = self._range_length(fd, key, start, start + len(buffer))
            done = direct_io.read_into(fd, start, buffer, want) if self._direct and want else 0
            while done < want:
                n = os.preadv(fd, [buffer[done:want]], start + done)
                if not n:
                    break
                done += n
            return done
        finally:
            os.close(fd)

    async def get_into(self, key: str, start: int, buffer: memoryview) -> int:
        validate_key(key)
        validate_range(start, start + len(buffer))
        n = await self._run("get", self._get_into_sync, key, start, buffer)
        self.stats.gets += 1
        self.stats.bytes_got += n
        return n

    def get_blocking(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """`get` on the caller's thread, for a caller with a thread and an event loop of its own
        (a Spark task reading objects one after the other): handing each read to a thread and
        back cost those tasks ~20% of their time in GIL hand-offs (py-spy), more than the read.
        Never from a server's event loop: it blocks it."""
        validate_key(key)
        validate_range(start, end)
        with self._errors("get"):
            data = self._get_sync(key, start, end)
        return self._got(data)

    def _got(self, data: bytes) -> bytes:
        self.stats.gets += 1
        self.stats.bytes_got += len(data)
        return data

    def _head_sync(self, key: str) -> ObjectInfo:
        fd = self._open_object(key)
        try:
            st = self._stat_fd(fd)
        finally:
            os.close(fd)
        return ObjectInfo(key=key, size=st.size, etag=st.etag, last_modified=st.mtime)

    async def head(self, key: str) -> ObjectInfo:
        validate_key(key)
        return await self._run("head", self._head_sync, key)

    # -- listing ----------------------------------------------------------------------------

    def _scan_dir(self, directory: Path, key_prefix: str, prefix: str) -> list[tuple[bytes, str, ObjectInfo | None]]:
        """Sorted (sort key, key or key prefix, info for objects / None for directories) of
        one directory's entries that can match `prefix`. Directories sort as 'segment/' so a
        depth-first walk yields keys in S3's order (UTF-8 bytes). Objects are stat'ed here so
        a listing costs one thread hop per directory, not per object."""
        entries: list[tuple[bytes, str, ObjectInfo | None]] = []
        try:
            scanner = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return entries
        with scanner:
            for entry in scanner:
                name = entry.name
                if name.endswith(OBJECT_SUFFIX):
                    stem = name[: -len(OBJECT_SUFFIX)]
                    if not _is_encoded(stem):
                        continue
                    key = key_prefix + _decode_segment(stem)
                    if not key.startswith(prefix) or not entry.is_file(follow_symlinks=False):
                        continue
                    try:
                        fd = os.open(entry.path, os.O_RDONLY)
                    except FileNotFoundError:
                        continue  # deleted while we listed
                    try:
                        st = self._stat_fd(fd)
                    finally:
                        os.close(fd)
                    info = ObjectInfo(key=key, size=st.size, etag=st.etag, last_modified=st.mtime)
                    entries.append((key.encode("utf-8", "surrogatepass"), key, info))
                elif _is_encoded(name) and entry.is_dir(follow_symlinks=False):
                    sub = key_prefix + _decode_segment(name) + "/"
                    if sub.startswith(prefix) or prefix.startswith(sub):
                        entries.append((sub.encode("utf-8", "surrogatepass"), sub, None))
        entries.sort(key=lambda entry: entry[0])
        return entries

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        if not isinstance(prefix, str) or "\x00" in prefix:
            raise ValueError(f"list prefix must be a str without NUL: {prefix!r}")
        await self._run("list", self._check_root)
        # Depth-first walk; each stack frame is a directory's remaining entries, reversed.
        stack: list[tuple[Path, list[tuple[bytes, str, ObjectInfo | None]]]] = []
        root_entries = await self._run("list", self._scan_dir, self.root, "", prefix)
        stack.append((self.root, root_entries[::-1]))
        while stack:
            directory, pending = stack[-1]
            if not pending:
                stack.pop()
                continue
            _, name, info = pending.pop()
            if info is not None:
                yield info
            else:
                subdir = directory / _encode_segment(name[:-1].rsplit("/", 1)[-1])
                entries = await self._run("list", self._scan_dir, subdir, name, prefix)
                stack.append((subdir, entries[::-1]))

    # -- deleting ---------------------------------------------------------------------------

    def _delete_sync(self, keys: builtins.list[str]) -> None:
        self._check_root()
        by_directory: dict[Path, list[str]] = {}
        for key in keys:
            directory, name = self._path(key)
            by_directory.setdefault(directory, []).append(name)
        for directory, names in by_directory.items():
            if not directory.is_dir():
                continue
            removed = False
            with self._dir_lock(directory):
                for name in names:
                    try:
                        os.unlink(directory / name)
                        removed = True
                    except FileNotFoundError:
                        pass
            if removed:
                self._fsync_dir(directory)

    async def delete_many(self, keys: builtins.list[str]) -> None:
        if isinstance(keys, str):
            raise ValueError("delete_many takes a list of keys, not a str")
        keys = list(keys)
        for key in keys:
            validate_key(key)
        if keys:
            await self._run("delete_many", self._delete_sync, keys)


__all__ = ["LocalObjectStore"]
