"""Durability points per platform (broker/diskio.py): Linux's fdatasync/fsync, macOS's
F_FULLFSYNC (where os.fdatasync does not exist), and fallocate where there is none."""

from __future__ import annotations

import errno
import fcntl
import os
import sys

import pytest

from automq.broker import diskio


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's own calls")
def test_linux_uses_fdatasync_and_fsync():
    assert diskio.datasync is os.fdatasync
    assert diskio.fullsync is os.fsync


def test_where_fcntl_has_full_fsync_both_syncs_ask_the_drive_to_flush(tmp_path, monkeypatch):
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(diskio, "_F_FULLFSYNC", 51)  # macOS's value
    monkeypatch.delattr(os, "fdatasync", raising=False)  # as on macOS
    monkeypatch.setattr(fcntl, "fcntl", lambda fd, cmd, *arg: calls.append(("fcntl", cmd)) or 0)
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", fd)))
    datasync, fullsync = diskio._pick()
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    try:
        datasync(fd)
        fullsync(fd)
    finally:
        os.close(fd)
    assert calls == [("fcntl", 51), ("fcntl", 51)]


def test_a_filesystem_refusing_full_fsync_gets_fsync_and_real_errors_are_raised(tmp_path, monkeypatch):
    calls: list[str] = []
    failure = [errno.ENOTSUP]

    def refusing(fd: int, cmd: int, *arg: object) -> int:
        raise OSError(failure[0], os.strerror(failure[0]))

    monkeypatch.setattr(diskio, "_F_FULLFSYNC", 51)
    monkeypatch.setattr(fcntl, "fcntl", refusing)
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync"))
    datasync, _ = diskio._pick()
    datasync(3)
    assert calls == ["fsync"]
    failure[0] = errno.EIO  # a failed flush is a failed write: never swallowed
    with pytest.raises(OSError) as raised:
        datasync(3)
    assert raised.value.errno == errno.EIO


def test_without_fdatasync_or_full_fsync_it_is_fsync(monkeypatch):
    monkeypatch.setattr(diskio, "_F_FULLFSYNC", None)
    monkeypatch.delattr(os, "fdatasync", raising=False)
    assert diskio._pick() == (os.fsync, os.fsync)


def test_reserve_says_when_it_could_not(tmp_path, monkeypatch):
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR)
    try:
        if hasattr(os, "posix_fallocate"):
            assert diskio.reserve(fd, 1 << 20)
            assert os.fstat(fd).st_size == 1 << 20
        monkeypatch.delattr(os, "posix_fallocate", raising=False)
        assert not diskio.reserve(fd, 2 << 20)
        assert os.fstat(fd).st_size <= 1 << 20  # nothing allocated: the caller writes zeros
    finally:
        os.close(fd)
