"""The volume WAL on a real file with real fdatasync: framing, replay, damage, the ring."""

from __future__ import annotations

import asyncio
import os

import pytest

from automq.broker.storage.wal.base import WalCorruptionError, WalFencedError, WalRecord, WalRecordTooLargeError
from automq.broker.storage.wal.volume import DATA_START, RECORD_HEADER_SIZE, SLOT_SIZE, VolumeWal

CAP = 64 << 10


def rec(i: int, size: int = 1000, stream: int = 7) -> WalRecord:
    return WalRecord(stream, 1, i, 1, bytes([i % 251]) * size)


async def open_wal(path, epoch: int, cap: int = CAP) -> tuple[VolumeWal, list[WalRecord]]:
    wal = VolumeWal(path, cap, node_id=1, node_epoch=epoch)
    records = await wal.recover()
    return wal, records


async def write(wal: VolumeWal, recs: list[WalRecord]) -> list[int]:
    return list(await asyncio.gather(*(wal.append(r) for r in recs)))


def summary(records: list[WalRecord]) -> list[tuple[int, int, bytes]]:
    return [(r.stream_id, r.base_offset, bytes(r.payload)) for r in records]


async def test_roundtrip_and_generation_hides_stale_records(tmp_path):
    path = tmp_path / "wal"
    wal, got = await open_wal(path, 1)
    assert got == [] and wal.report.stop_reason == "empty"
    await wal.start(0)
    ends = await write(wal, [rec(i) for i in range(5)])
    assert ends == sorted(ends) and ends[-1] == wal.durable_position == 5 * (RECORD_HEADER_SIZE + 1000)
    await wal.close()

    wal, got = await open_wal(path, 2)
    assert summary(got) == summary([rec(i) for i in range(5)])
    assert wal.report.stop_reason == "end"
    # recovered data uploaded: trim everything, write one smaller record over the old ones
    await wal.start(wal.report.end_position)
    await write(wal, [rec(100, size=10)])
    await wal.close()

    wal, got = await open_wal(path, 3)
    assert summary(got) == summary([rec(100, size=10)])  # old records past it are not replayed
    await wal.close()


async def test_ring_wraps_and_back_pressure_waits_for_trim(tmp_path):
    path = tmp_path / "wal"
    wal, _ = await open_wal(path, 1)
    await wal.start(0)
    pressure = asyncio.Event()
    wal.set_pressure_handler(pressure.set)
    durable: list[WalRecord] = []
    wal.on_durable = durable.extend
    recs = [rec(i, size=7000) for i in range(30)]  # ~210 KiB through a 64 KiB ring
    trimmed_to = 0

    async def uploader():  # on pressure, "upload" all durable records but the newest one
        nonlocal trimmed_to
        while True:
            await pressure.wait()
            pressure.clear()
            assert wal.bytes_pending_trim <= CAP
            target = durable[-2].wal_end if len(durable) > 1 else durable[-1].wal_end
            if target > trimmed_to:
                await wal.trim(target)
                trimmed_to = target

    task = asyncio.create_task(uploader())
    futures = [wal.append(r) for r in recs]
    await asyncio.wait_for(asyncio.gather(*futures), timeout=30)
    task.cancel()
    assert trimmed_to > 0  # the ring did fill up
    assert [f.result() for f in futures] == [r.wal_end for r in recs]
    assert summary(durable) == summary(recs)
    await wal.close()
    wal, got = await open_wal(path, 2)
    untrimmed = [r for r in recs if r.wal_end > trimmed_to]
    assert summary(got) == summary(untrimmed)
    await wal.close()


async def test_torn_tail_is_reported_not_served(tmp_path):
    path = tmp_path / "wal"
    wal, _ = await open_wal(path, 1)
    await wal.start(0)
    await write(wal, [rec(i) for i in range(4)])
    await wal.close()
    # tear the last record: its payload half written
    last = DATA_START + 3 * (RECORD_HEADER_SIZE + 1000)
    with open(path, "r+b") as f:
        f.seek(last + RECORD_HEADER_SIZE + 500)
        f.write(b"\0" * 500)
    wal, got = await open_wal(path, 2)
    assert summary(got) == summary([rec(i) for i in range(3)])
    assert wal.report.stop_reason == "torn"
    assert wal.report.damaged_position == 3 * (RECORD_HEADER_SIZE + 1000)
    assert "CRC" in wal.report.details[0]
    await wal.close()


async def test_torn_header_is_reported(tmp_path):
    path = tmp_path / "wal"
    wal, _ = await open_wal(path, 1)
    await wal.start(0)
    await write(wal, [rec(i) for i in range(3)])
    await wal.close()
    with open(path, "r+b") as f:
        f.seek(DATA_START + 2 * (RECORD_HEADER_SIZE + 1000) + 20)
        f.write(b"\xff\xff")
    wal, got = await open_wal(path, 2)
    assert len(got) == 2 and wal.report.stop_reason == "torn"
    await wal.close()


async def test_corruption_before_valid_records_raises(tmp_path):
    path = tmp_path / "wal"
    wal, _ = await open_wal(path, 1)
    await wal.start(0)
    await write(wal, [rec(i) for i in range(5)])
    await wal.close()
    with open(path, "r+b") as f:
        f.seek(DATA_START + 1 * (RECORD_HEADER_SIZE + 1000) + RECORD_HEADER_SIZE + 10)
        f.write(b"corrupt!")
    wal = VolumeWal(path, CAP, node_id=1, node_epoch=2)
    with pytest.raises(WalCorruptionError, match="offset 1 .*valid records follow"):
        await wal.recover()
    await wal.close()


async def test_damaged_newest_header_slot_falls_back_to_the_other(tmp_path):
    path = tmp_path / "wal"
    wal, _ = await open_wal(path, 1)
    await wal.start(0)
    ends = await write(wal, [rec(i) for i in range(4)])
    await wal.trim(ends[1])  # newest slot says trim = after record 1
    seq = wal._header.sequence
    await wal.close()
    with open(path, "r+b") as f:
        f.seek((seq % 2) * SLOT_SIZE + 8)
        f.write(b"\x12\x34")
    wal, got = await open_wal(path, 2)
    # the older slot (trim 0) wins: more is replayed, nothing is lost
    assert [r.base_offset for r in got] == [0, 1, 2, 3]
    await wal.close()


async def test_both_header_slots_damaged_is_an_error(tmp_path):
    path = tmp_path / "wal"
    wal, _ = await open_wal(path, 1)
    await wal.close()
    with open(path, "r+b") as f:
        f.write(os.urandom(DATA_START))
    wal = VolumeWal(path, CAP, node_id=1, node_epoch=2)
    with pytest.raises(WalCorruptionError, match="neither header slot"):
        await wal.recover()
    await wal.close()


async def test_older_node_epoch_is_fenced(tmp_path):
    path = tmp_path / "wal"
    wal, _ = await open_wal(path, 5)
    await wal.start(0)
    await wal.close()
    wal = VolumeWal(path, CAP, node_id=1, node_epoch=4)
    with pytest.raises(WalFencedError):
        await wal.recover()
    await wal.close()


async def test_record_larger_than_half_the_ring_is_refused(tmp_path):
    wal, _ = await open_wal(tmp_path / "wal", 1)
    await wal.start(0)
    with pytest.raises(WalRecordTooLargeError):
        wal.append(rec(0, size=CAP // 2))
    await wal.close()


async def test_group_commit_shares_one_sync_among_queued_appends(tmp_path):
    from automq.broker.storage.metrics import StorageMetrics

    metrics = StorageMetrics()
    wal = VolumeWal(tmp_path / "wal", CAP, node_id=1, node_epoch=1, metrics=metrics)
    await wal.recover()
    await wal.start(0)
    ends = await write(wal, [rec(i, size=100) for i in range(40)])  # all queued before the first sync
    syncs = metrics.registry.get_sample_value("automq_storage_wal_sync_seconds_count")
    assert ends == sorted(ends) and syncs == 1  # all 40 were queued before the writer ran
    # the group's system calls alone are timed too, inside what the loop saw of the group
    disk = metrics.registry.get_sample_value("automq_storage_wal_disk_seconds_count")
    disk_s = metrics.registry.get_sample_value("automq_storage_wal_disk_seconds_sum")
    sync_s = metrics.registry.get_sample_value("automq_storage_wal_sync_seconds_sum")
    assert disk == 1 and 0 < disk_s <= sync_s
    await wal.close()


async def test_appends_queued_during_a_sync_are_written_without_the_event_loop(tmp_path, monkeypatch):
    """The WAL thread takes what queued while it synced and writes it at once: a loop that is
    busy (here: blocked) when the first sync returns does not hold the second group back."""
    import threading
    import time

    from automq.broker import diskio

    real = diskio.datasync
    first_sync = threading.Event()
    second_sync = threading.Event()
    syncs: list[float] = []

    def slow_first(fd: int) -> None:
        if not syncs:
            first_sync.set()
            time.sleep(0.2)
        real(fd)
        syncs.append(time.monotonic())
        if len(syncs) == 2:
            second_sync.set()

    wal, _ = await open_wal(tmp_path / "wal", 1)
    await wal.close()  # a fresh ring writes its zeros on the WAL thread once started: not now
    wal, _ = await open_wal(tmp_path / "wal", 2)
    await wal.start(0)
    await write(wal, [rec(0)])
    monkeypatch.setattr(diskio, "datasync", slow_first)
    first = wal.append(rec(1))
    while not first_sync.is_set():
        await asyncio.sleep(0.005)
    later = [wal.append(rec(i)) for i in range(2, 5)]  # queued during the first sync
    # The loop stays blocked (busy) while the first sync returns and until the second one is
    # done: only the WAL thread can have written and synced the second group. Waiting on the
    # event rather than a fixed sleep keeps a slow disk or a loaded machine from failing it.
    assert second_sync.wait(60)  # both groups were synced by the WAL thread alone
    assert len(syncs) == 2
    assert not first.done()  # acknowledged on the loop, not before
    ends = await asyncio.wait_for(asyncio.gather(first, *later), 10)
    assert ends == sorted(ends) and wal.durable_position == ends[-1]
    await wal.close()
    wal, got = await open_wal(tmp_path / "wal", 3)
    assert summary(got) == summary([rec(i) for i in range(5)])
    await wal.close()


async def test_a_failed_sync_fails_its_appends_and_every_later_one(tmp_path, monkeypatch):
    """After an fdatasync error nothing of the group may be acknowledged (its bytes may never
    reach the disk): the appends fail at once with the error, and so does every later append."""
    import errno

    from automq.broker import diskio
    from automq.broker.storage.wal.base import WalClosedError

    wal, _ = await open_wal(tmp_path / "wal", 1)
    await wal.start(0)
    await write(wal, [rec(0)])

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(diskio, "datasync", eio)
    pending = [wal.append(rec(i)) for i in range(1, 4)]
    results = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 10)
    assert all(isinstance(r, WalClosedError) and "Input/output error" in str(r) for r in results)
    with pytest.raises(WalClosedError, match="Input/output error"):
        wal.append(rec(4))
    assert wal.durable_position == RECORD_HEADER_SIZE + 1000  # only the first record
    await wal.close()


@pytest.fixture
def loop_device(tmp_path):
    """A real block device (a loop device over a file), where the machine allows it."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("losetup") is None or not os.path.exists("/dev/loop-control"):
        pytest.skip("needs root and losetup for a loop block device")
    backing = tmp_path / "device.img"
    with open(backing, "wb") as f:
        f.truncate(2 << 20)
    try:
        dev = subprocess.run(
            ["losetup", "-f", "--show", str(backing)], check=True, capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"loop devices unavailable here: {exc}")
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False, timeout=30)


async def test_block_device_wal(loop_device):
    wal, got = await open_wal(loop_device, 1, cap=CAP)  # capacity comes from the device
    assert got == [] and wal.capacity == (2 << 20) - DATA_START
    await wal.start(0)
    await write(wal, [rec(i, size=3000) for i in range(20)])
    await wal.close()
    wal, got = await open_wal(loop_device, 2, cap=CAP)
    assert summary(got) == summary([rec(i, size=3000) for i in range(20)])
    await wal.close()
