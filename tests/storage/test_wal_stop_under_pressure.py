"""A stopping (or fenced) broker blocked in the volume WAL's back-pressure wait stops at
once (issue 17 item 3): close() fails the appends that cannot be written without a trim
(they were never acknowledged) instead of waiting for an upload that will not come."""

from __future__ import annotations

import asyncio

import pytest

from automq.broker.storage.wal.base import WalClosedError, WalRecord
from automq.broker.storage.wal.volume import RECORD_HEADER_SIZE, VolumeWal

CAP = 64 << 10


async def full_wal(path) -> tuple[VolumeWal, list[asyncio.Future], asyncio.Event]:
    wal = VolumeWal(path, CAP, node_id=1, node_epoch=1)
    await wal.recover()
    await wal.start(0)
    pressure = asyncio.Event()
    wal.set_pressure_handler(pressure.set)  # nobody uploads: the ring stays full
    size = 4000
    fits = CAP // (RECORD_HEADER_SIZE + size)
    written = [wal.append(WalRecord(7, 1, i, 1, b"x" * size)) for i in range(fits)]
    await asyncio.gather(*written)
    blocked = [wal.append(WalRecord(7, 1, fits + i, 1, b"y" * size)) for i in range(3)]
    await asyncio.wait_for(pressure.wait(), 10)
    await asyncio.sleep(0.05)
    assert not any(f.done() for f in blocked), "the appends should wait for space"
    return wal, blocked, pressure


async def test_close_does_not_wait_for_a_trim_that_never_comes(tmp_path):
    wal, blocked, _ = await full_wal(tmp_path / "wal")
    loop = asyncio.get_running_loop()
    started = loop.time()
    # the old writer waited for the trim for 30 s before close gave up on it
    await asyncio.wait_for(wal.close(), 10)
    print(f"close of a full WAL took {loop.time() - started:.3f}s")
    for f in blocked:
        with pytest.raises(WalClosedError):
            f.result()


async def test_written_records_survive_a_close_under_pressure(tmp_path):
    """What was acknowledged before the close is replayed; what was refused is not."""
    wal, _blocked, _ = await full_wal(tmp_path / "wal")
    durable = wal.durable_position
    await asyncio.wait_for(wal.close(), 10)
    again = VolumeWal(tmp_path / "wal", CAP, node_id=1, node_epoch=2)
    records = await again.recover()
    await again.close()
    assert records and records[-1].wal_end == durable
    assert all(bytes(r.payload[:1]) == b"x" for r in records)
