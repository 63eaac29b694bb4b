"""The S3 WAL: bulk objects, ordered acks, fencing by a newer epoch, damage detection.
Runs on file:// and on SeaweedFS (marked s3)."""

from __future__ import annotations

import asyncio

import pytest

from automq.broker.objectstore import open_object_store
from automq.broker.storage.wal.base import WalClosedError, WalCorruptionError, WalFencedError, WalRecord
from automq.broker.storage.wal.objectstore import ObjectStoreWal, data_prefix


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
async def store(request):
    url = request.getfixturevalue("file_url" if request.param == "file" else "s3_url")
    s = open_object_store(url)
    yield s
    await s.close()


def rec(i: int, size: int = 300) -> WalRecord:
    return WalRecord(i % 3, 1, i, 1, bytes([i % 256]) * size)


async def keys(store, prefix: str) -> list[str]:
    return [info.key async for info in store.list(prefix)]


async def started(store, epoch: int, **kw) -> tuple[ObjectStoreWal, list[WalRecord]]:
    wal = ObjectStoreWal(store, 4, epoch, **kw)
    records = await wal.recover()
    await wal.start(wal.report.end_position)
    return wal, records


async def test_appends_are_acked_in_order_and_replayed_by_the_next_epoch(store):
    wal, got = await started(store, 1, bulk_interval_ms=20, bulk_bytes=2000)
    assert got == []
    acked: list[int] = []
    futures = []
    for i in range(40):
        f = wal.append(rec(i))
        f.add_done_callback(lambda f, i=i: acked.append(i))
        futures.append(f)
        if i % 7 == 0:
            await asyncio.sleep(0.005)
    ends = await asyncio.gather(*futures)
    assert acked == list(range(40)) and ends == sorted(ends)
    assert len(await keys(store, data_prefix(4))) > 1  # cut by size into several bulks
    await wal.close()

    wal2, got = await started(store, 2)
    assert [(r.stream_id, r.base_offset, bytes(r.payload)) for r in got] == [
        (r.stream_id, r.base_offset, bytes(r.payload)) for r in map(rec, range(40))
    ]
    assert await keys(store, data_prefix(4)) == []  # replayed objects are dropped by start()
    await wal2.close()


async def test_trim_deletes_uploaded_bulks(store):
    wal, _ = await started(store, 1, bulk_interval_ms=10)
    first = await wal.append(rec(0))
    await wal.append(rec(1))
    assert len(await keys(store, data_prefix(4))) == 2
    await wal.trim(first)
    assert len(await keys(store, data_prefix(4))) == 1
    await wal.close()
    _, got = await started(store, 2)
    assert [r.base_offset for r in got] == [1]


async def test_newer_epoch_fences_the_old_writer(store):
    old, _ = await started(store, 1, bulk_interval_ms=10)
    acked = [await old.append(rec(i)) for i in range(3)]
    assert len(acked) == 3
    # another node recovers node 4's WAL under epoch 2
    recoverer = ObjectStoreWal(store, 4, 2)
    replayed = await recoverer.recover()
    assert [r.base_offset for r in replayed] == [0, 1, 2]
    with pytest.raises(WalFencedError):
        await old.append(rec(3))
    # the zombie's later write is never acknowledged; a further append is refused outright
    with pytest.raises(WalClosedError, match="fenced by epoch 2"):
        await old.append(rec(4))
    await old.close()
    # an older epoch cannot even start any more
    with pytest.raises(WalFencedError):
        await ObjectStoreWal(store, 4, 1).recover()
    await recoverer.close()


async def test_corrupt_bulk_object_is_detected(store):
    wal, _ = await started(store, 1, bulk_interval_ms=10)
    await wal.append(rec(0, size=1000))
    await wal.close()
    [key] = await keys(store, data_prefix(4))
    data = bytearray(await store.get(key))
    data[-10] ^= 0xFF
    await store.put(key, bytes(data))
    with pytest.raises(WalCorruptionError, match="CRC"):
        await ObjectStoreWal(store, 4, 2).recover()
