"""Durability points of files, the same meaning on every platform the broker runs on.

Linux: `os.fdatasync`/`os.fsync` return once the data (and, for fsync, the metadata) is on
stable storage, volatile drive caches included. macOS: `fsync` hands the data to the drive,
which may still hold it in its cache when the power goes; only `fcntl(F_FULLFSYNC)` asks the
drive to flush it. CPython has no `os.fdatasync` there at all (it exists only where the C
library has it), so calling it would fail the first WAL sync. Every durability point of the
WAL and the file:// object store goes through `datasync` (data) or `fullsync` (data and
metadata, e.g. a directory after a rename).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable

_F_FULLFSYNC: int | None = getattr(fcntl, "F_FULLFSYNC", None)
# Filesystems that do not take F_FULLFSYNC (network mounts, some FUSE): plain fsync there.
_NO_FULLFSYNC = (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOTTY)


def _fullfsync(fd: int) -> None:
    try:
        fcntl.fcntl(fd, _F_FULLFSYNC)  # type: ignore[arg-type]
    except OSError as exc:
        if exc.errno not in _NO_FULLFSYNC:
            raise
        os.fsync(fd)


def _pick() -> tuple[Callable[[int], None], Callable[[int], None]]:
    if _F_FULLFSYNC is not None:
        return _fullfsync, _fullfsync
    return getattr(os, "fdatasync", os.fsync), os.fsync


datasync, fullsync = _pick()


def reserve(fd: int, size: int) -> bool:
    """Allocates `size` bytes of `fd` without writing them (posix_fallocate); False where the
    platform or filesystem cannot (macOS has no posix_fallocate): the caller writes zeros."""
    allocate = getattr(os, "posix_fallocate", None)
    if allocate is None:
        return False
    try:
        allocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        return False
    return True
