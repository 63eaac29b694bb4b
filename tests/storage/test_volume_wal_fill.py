"""A fresh volume WAL reserves its blocks at open and writes the ring's zeros only once it
serves, between record groups, never over records (broker start-up: issue 14 goal 6)."""

from __future__ import annotations

import asyncio
import errno
import os

import pytest

from automq.broker.storage.wal.base import WalRecord
from automq.broker.storage.wal.volume import DATA_START, VolumeWal

CAP = 4 << 20


def rec(i: int, size: int = 100_000) -> WalRecord:
    return WalRecord(7, 1, i, 1, bytes([i % 251 + 1]) * size)


def _summary(records: list[WalRecord]) -> list[tuple[int, bytes]]:
    return [(r.base_offset, bytes(r.payload)) for r in records]


async def test_a_fresh_wal_is_reserved_at_open_and_zeroed_after_serving(tmp_path, monkeypatch):
    path = tmp_path / "wal"
    zeroed: list[tuple[int, int]] = []
    real_chunk = VolumeWal._zero_chunk

    def chunk(self: VolumeWal, start: int, end: int) -> None:
        zeroed.append((start, end))
        real_chunk(self, start, end)

    monkeypatch.setattr(VolumeWal, "_zero_chunk", chunk)
    wal = VolumeWal(path, CAP, node_id=1, node_epoch=1)
    assert await wal.recover() == []
    st = os.stat(path)
    assert st.st_size == DATA_START + CAP and st.st_blocks * 512 >= DATA_START + CAP  # blocks reserved
    assert zeroed == []  # nothing written yet: opening (start-up) does not wait for the zeros
    await wal.start(0)
    ends = await asyncio.gather(*(wal.append(rec(i)) for i in range(8)))
    assert wal._filler is not None
    await wal._filler
    assert zeroed and zeroed[0][0] == DATA_START and zeroed[-1][1] == DATA_START + CAP
    await wal.close()

    again = VolumeWal(path, CAP, node_id=1, node_epoch=2)
    assert _summary(await again.recover()) == _summary([rec(i) for i in range(8)])  # no record zeroed
    assert again.report.end_position == ends[-1]
    with open(path, "rb") as f:  # the rest of the ring: zeros
        f.seek(DATA_START + ends[-1])
        assert not any(f.read())
    await again.close()


async def test_a_late_zero_chunk_never_overwrites_records(tmp_path):
    path = tmp_path / "wal"
    wal = VolumeWal(path, CAP, node_id=1, node_epoch=1)
    await wal.recover()
    await wal.start(0)
    await wal._filler  # type: ignore[misc]
    ends = await asyncio.gather(*(wal.append(rec(i)) for i in range(3)))
    # a chunk that was queued before these records were written, run after them
    await asyncio.get_running_loop().run_in_executor(wal._executor, wal._zero_chunk, DATA_START, DATA_START + CAP)
    await wal.close()
    again = VolumeWal(path, CAP, node_id=1, node_epoch=2)
    assert _summary(await again.recover()) == _summary([rec(i) for i in range(3)])
    assert again.report.end_position == ends[-1]
    await again.close()


async def test_close_during_the_fill_stops_it_and_the_wal_reopens(tmp_path):
    path = tmp_path / "wal"
    wal = VolumeWal(path, 64 << 20, node_id=1, node_epoch=1)
    await wal.recover()
    await wal.start(0)
    await wal.append(rec(1))
    await wal.close()  # the fill (64 chunks) is cut short
    assert wal._filler is None
    again = VolumeWal(path, 64 << 20, node_id=1, node_epoch=2)
    assert _summary(await again.recover()) == _summary([rec(1)])
    await again.close()


@pytest.mark.parametrize("platform", ["refused by the filesystem", "no posix_fallocate (macOS)"])
async def test_without_fallocate_the_zeros_are_written_at_open(tmp_path, monkeypatch, platform):
    def refused(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    if platform.startswith("refused"):
        monkeypatch.setattr(os, "posix_fallocate", refused)
    else:
        monkeypatch.delattr(os, "posix_fallocate")
    path = tmp_path / "wal"
    wal = VolumeWal(path, CAP, node_id=1, node_epoch=1)
    await wal.recover()
    assert os.stat(path).st_size == DATA_START + CAP
    await wal.start(0)
    assert wal._filler is None  # nothing left to fill
    await wal.append(rec(1))
    await wal.close()
