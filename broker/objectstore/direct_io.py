"""Object data written and read around the page cache (O_DIRECT), for the file:// store.

The broker caches what it serves itself (the log cache for tail reads, the block cache for
cold ones), so a second copy of every uploaded object in the kernel's page cache buys little,
and it costs: each write copies the object into page-cache pages that are new memory. On
this project's VMs new memory is dear (a page is faulted in from the host on first touch):
writing 1 GiB through the page cache, in the store's 256 KiB write-back steps, took 3.7 s of
CPU (211 MiB/s); the same GiB written with O_DIRECT from a reused buffer 0.06 s (1277
MiB/s). At a broker's peak those copies were 46 % of its CPU samples (perf, uploader
threads in `copy_folio_from_iter_atomic`; docs/benchmarks.md). Reading them back cold
through the page cache costs the same again (453 MiB/s, 2.2 s of CPU per GiB), with O_DIRECT
0.07 s (918 MiB/s one read at a time, 1.3 GiB/s with four).

O_DIRECT wants the file offset, the length and the memory of every request aligned to the
device's logical block; `ALIGN` (4 KiB) satisfies every common one. Writes go through an
aligned staging buffer (reused, one per writing thread); the last partial block is written
padded and the file truncated to its size before the sealing fsync, which makes the data
and the size durable as before. Reads are direct only when the caller's range and memory are
aligned (the read path asks for aligned supersets: `ObjectStore.read_alignment`); anything
else is read through the page cache, which stays coherent with direct writes. A filesystem
that refuses O_DIRECT (some FUSE mounts, tmpfs before Linux 6.6) gets the page-cache path for
everything.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path

ALIGN = 4096
STAGING_BYTES = 1 << 20  # what one direct write carries
# What one direct read asks the device for. A catch-up's read-ahead asks for up to 32 MiB at
# a time; in one preadv the kernel queues all of it (4 MiB requests here) at once, and a WAL
# fdatasync issued meanwhile waits behind it on a shared disk. A bound on the chunks all the
# store's threads have at the device at once (2 or 4, a process-wide semaphore) did not move
# the 1 GiB catch-up's produce p99 (median of 4 runs 20.6 / 39.8 ms against 17.9 unbounded);
# its read ran at 287 / 304 MiB/s against 299: docs/benchmarks.md, stop 36.
READ_CHUNK_BYTES = 1 << 20
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)  # Linux; macOS has none (F_NOCACHE is another thing)


def supported(probe: Path) -> bool:
    """Whether a file created at `probe` (a temp name of the caller's, removed again) can be
    written with O_DIRECT: what every file of its directory's filesystem can."""
    if not _O_DIRECT:
        return False
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        with _staging.borrow() as buf:
            os.pwrite(fd, memoryview(buf)[:ALIGN], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def is_aligned(view: memoryview) -> bool:
    """The memory of a writable buffer starts on an ALIGN boundary."""
    if view.readonly or not view.contiguous:
        return False
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) % ALIGN == 0


class _StagingPool:
    """Aligned buffers (anonymous mmaps are page-aligned), reused: new memory is what costs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[mmap.mmap] = []

    def borrow(self) -> _Borrowed:
        with self._lock:
            buf = self._free.pop() if self._free else mmap.mmap(-1, STAGING_BYTES)
        return _Borrowed(self, buf)

    def give_back(self, buf: mmap.mmap) -> None:
        with self._lock:
            if len(self._free) < 8:
                self._free.append(buf)


class _Borrowed:
    __slots__ = ("buf", "pool")

    def __init__(self, pool: _StagingPool, buf: mmap.mmap) -> None:
        self.pool, self.buf = pool, buf

    def __enter__(self) -> mmap.mmap:
        return self.buf

    def __exit__(self, *exc: object) -> None:
        self.pool.give_back(self.buf)


_staging = _StagingPool()


class DirectWriter:
    """Sequential writes to an O_DIRECT descriptor through one staging buffer. `written(n)`
    is called after each direct write of n bytes (the upload pace)."""

    def __init__(self, fd: int, written: Callable[[int], None] | None = None) -> None:
        self.fd = fd
        self._written = written
        self._borrowed: _Borrowed | None = _staging.borrow()
        self._buf = memoryview(self._borrowed.buf)
        self._used = 0  # bytes staged
        self._offset = 0  # file offset of the staging buffer's first byte

    def write(self, data: memoryview) -> None:
        buf, room = self._buf, STAGING_BYTES
        while data:
            n = min(len(data), room - self._used)
            buf[self._used : self._used + n] = data[:n]
            self._used += n
            data = data[n:]
            if self._used == room:
                self._write_out(room)

    def _write_out(self, length: int) -> None:
        view = self._buf[:length]
        done = 0
        while done < length:
            n = os.pwrite(self.fd, view[done:], self._offset + done)
            if n <= 0 or (done + n < length and n % ALIGN):
                raise OSError(errno.EIO, f"short direct write: {n} of {length - done} bytes")
            done += n
        self._offset += length
        self._used = 0
        if self._written is not None:
            self._written(length)

    def finish(self) -> int:
        """Writes the staged rest (its last block padded) and truncates the file to the bytes
        written; returns them. The caller makes it durable (fsync)."""
        size = self._offset + self._used
        if self._used:
            padded = -(-self._used // ALIGN) * ALIGN
            self._buf[self._used : padded] = bytes(padded - self._used)
            self._write_out(padded)
            os.ftruncate(self.fd, size)
        self.release()
        return size

    def release(self) -> None:
        if self._borrowed is not None:
            self._buf.release()
            self._borrowed.__exit__()
            self._borrowed = None


def open_for_writing(path: Path) -> int:
    """A new file opened for direct writes (O_EXCL: a temp name of the caller's)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_DIRECT, 0o644)


def read_into(fd: int, start: int, buffer: memoryview, want: int) -> int:
    """Reads up to `want` bytes at `start` of the open file into `buffer` around the page
    cache; returns how many it read directly, from `start` on (0: none: the request cannot be
    direct, unaligned or refused). The caller reads the rest, if any, through the page
    cache. `buffer` may be longer than `want` (up to an ALIGN multiple: a direct read moves
    whole blocks)."""
    length = -(-want // ALIGN) * ALIGN
    if not _O_DIRECT or start % ALIGN or len(buffer) < length or not is_aligned(buffer):
        return 0
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            return 0
        raise
    done = 0
    try:
        while done < want:
            try:
                n = os.preadv(fd, [buffer[done : min(length, done + READ_CHUNK_BYTES)]], start + done)
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # refused after all: the page cache reads the rest
                    break
                raise
            if not n:
                break
            done += n
            if n % ALIGN:
                break  # the end of the file, or a short read: the caller goes on from here
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return min(done, want)
