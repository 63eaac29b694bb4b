"""The S3 WAL: bulk objects, ordered acks, fencing by a newer epoch (tombstones created
conditionally where the old writer's next PUT would go), damage detection.
Runs on file:// and on SeaweedFS (marked s3)."""

from __future__ import annotations

import asyncio

import pytest

from automq.broker.objectstore import PreconditionFailed, open_object_store
from automq.broker.storage.wal.base import WalClosedError, WalCorruptionError, WalFencedError, WalRecord
from automq.broker.storage.wal.objectstore import ObjectStoreWal, data_key, data_prefix, encode_bulk


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


async def bulks(store) -> list[str]:
    """Data objects that are not tombstones (empty: never deleted)."""
    return [info.key async for info in store.list(data_prefix(4)) if info.size]


async def tombstones(store) -> list[str]:
    return [info.key async for info in store.list(data_prefix(4)) if not info.size]


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


class GatedStore:
    """A real store whose WAL PUTs can be held back one by one (a slow or stuck PUT), so
    bulks complete out of order; and whose delete_many can stop half way (a crash in the
    middle of a trim)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.gates: dict[int, asyncio.Event] = {}  # n-th data PUT (0-based) -> released when set
        self.started: list[str] = []
        self.completed: list[str] = []
        self.delete_only_after_first = False

    async def put(self, key, data, **kw):
        gate = None
        if key.startswith(data_prefix(4)):
            gate = self.gates.get(len(self.started))
            self.started.append(key)
        if gate is not None:
            await gate.wait()
        result = await self.inner.put(key, data, **kw)
        if key.startswith(data_prefix(4)):
            self.completed.append(key)
        return result

    async def delete_many(self, keys):
        if self.delete_only_after_first and len(keys) > 1:
            await self.inner.delete_many(keys[1:])
            raise OSError("crashed in the middle of a batched delete")
        await self.inner.delete_many(keys)

    async def delete(self, key):
        await self.delete_many([key])

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def until(predicate, what: str) -> None:
    for _ in range(3000):  # generous for a loaded machine; never a timing assertion
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def crash(wal: ObjectStoreWal) -> None:
    """Stop the writer as kill -9 would: nothing more is PUT, nothing is cleaned up."""
    tasks = [t for t in [wal._task, *wal._put_tasks] if t is not None]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def ids(records) -> list[int]:
    return [r.base_offset for r in records]


def append_tracked(wal: ObjectStoreWal, n: int) -> tuple[list[asyncio.Future[int]], list[int]]:
    """Appends records 0..n-1 at once; returns their futures and the list their acks land in."""
    acked: list[int] = []
    futures = []
    for i in range(n):
        f = wal.append(rec(i))
        f.add_done_callback(lambda f, i=i: acked.append(i))
        futures.append(f)
    return futures, acked


async def release_first_and_replay(gated, wal: ObjectStoreWal, store, futures, acked: list[int]) -> None:
    """Lets the held first PUT finish: every append is acknowledged, in order, and the next
    epoch replays them all."""
    gated.gates[0].set()
    await asyncio.gather(*futures)
    assert acked == list(range(len(futures)))
    await wal.close()
    _, got = await started(store, 2)
    assert ids(got) == list(range(len(futures)))


async def test_idle_wal_puts_at_once_and_groups_what_arrives_meanwhile(store):
    gated = GatedStore(store)
    gated.gates[0] = asyncio.Event()
    # a one-minute interval: only the "nothing in flight" rule can start these bulks
    wal, _ = await started(gated, 1, bulk_interval_ms=60_000)
    first = wal.append(rec(0))
    await until(lambda: len(gated.started) == 1, "the first append started a PUT")
    rest = [wal.append(rec(i)) for i in range(1, 10)]
    await asyncio.sleep(0.05)
    assert len(gated.started) == 1 and not first.done()  # grouped while one is in flight
    gated.gates[0].set()
    ends = await asyncio.gather(first, *rest)
    assert ends == sorted(ends)
    assert len(gated.started) == 2  # the nine that waited went out together
    await wal.close()
    _, got = await started(store, 2)
    assert ids(got) == list(range(10))


async def test_out_of_order_puts_ack_in_order_and_replay_stops_at_a_hole(store):
    gated = GatedStore(store)
    gated.gates[1] = asyncio.Event()  # the second bulk's PUT hangs
    wal, _ = await started(gated, 1, bulk_interval_ms=60_000, bulk_bytes=1100, max_inflight=4)
    futures = [wal.append(rec(i)) for i in range(3)]  # bulk 0, PUT at once
    await asyncio.gather(*futures)
    more = [wal.append(rec(i)) for i in range(3, 12)]  # bulks 1..3 (3 records of 344 B each)
    await until(lambda: len(gated.completed) == 3, "bulks 0, 2 and 3 completed")
    assert len(gated.started) == 4
    await asyncio.sleep(0.05)
    assert not any(f.done() for f in more)  # 2 and 3 are stored, but wait for 1
    await crash(wal)
    recovering = ObjectStoreWal(store, 4, 2)
    got = await recovering.recover()
    # the acknowledged bulk 0 is replayed; bulks 2 and 3 hold no acknowledged append and
    # would leave offsets 3..5 missing in their streams: dropped, and deleted by start()
    assert ids(got) == [0, 1, 2]
    assert any("dropped unacknowledged bulk" in d for d in recovering.report.details)
    await recovering.start(recovering.report.end_position)
    assert await bulks(store) == []
    # the hole (bulk 1's position) holds the tombstone that fences the dead writer
    assert await tombstones(store) == [gated.started[1]]
    await recovering.close()


async def test_late_put_completing_releases_later_acks_in_order(store):
    gated = GatedStore(store)
    gated.gates[0] = asyncio.Event()
    wal, _ = await started(gated, 1, bulk_interval_ms=60_000, bulk_bytes=1000, max_inflight=3, max_unacked=3)
    futures, acked = append_tracked(wal, 30)
    await until(lambda: len(gated.completed) == 2, "bulks 1 and 2 completed while 0 hangs")
    await asyncio.sleep(0.05)
    assert len(gated.started) == 3 and acked == []  # the window (3) is full: no fourth bulk yet
    await release_first_and_replay(gated, wal, store, futures, acked)


async def test_a_slow_put_does_not_idle_the_other_put_slots(store):
    """Two PUTs at once, eight bulks unacknowledged: while bulk 0 hangs, the other slot keeps
    PUTting bulks 1..7 (one at a time, as each ends); the ninth waits for the window, and the
    acknowledgements wait for bulk 0."""
    gated = GatedStore(store)
    gated.gates[0] = asyncio.Event()
    wal, _ = await started(gated, 1, bulk_interval_ms=60_000, bulk_bytes=1000, max_inflight=2, max_unacked=8)
    futures, acked = append_tracked(wal, 40)  # 2 records of 344 B per bulk: 20 bulks' worth
    await until(lambda: len(gated.completed) == 7, "bulks 1..7 completed behind the hanging bulk 0")
    await asyncio.sleep(0.05)
    assert len(gated.started) == 8 and acked == []  # window full (8 cut), nothing acknowledged
    await release_first_and_replay(gated, wal, store, futures, acked)


async def test_a_trim_interrupted_half_way_loses_no_acknowledged_append(store):
    gated = GatedStore(store)
    wal, _ = await started(gated, 1, bulk_interval_ms=60_000)
    ends = [await wal.append(rec(i)) for i in range(6)]  # one bulk each (nothing in flight)
    assert len(gated.completed) == 6
    gated.delete_only_after_first = True
    with pytest.raises(OSError):
        await wal.trim(ends[2])  # deletes bulks 1 and 2, "crashes" before bulk 0
    assert len(await keys(store, data_prefix(4))) == 4
    # bulk 0 is still there, 1 and 2 are not: a hole, but below the trim marker, so it is
    # not mistaken for a PUT that never completed; 3..5 are replayed
    recovering = ObjectStoreWal(store, 4, 2)
    assert ids(await recovering.recover()) == [3, 4, 5]
    # had the writer lived, its next trim would have deleted what the failed one left
    gated.delete_only_after_first = False
    await wal.trim(ends[2])
    assert len(await bulks(store)) == 3
    with pytest.raises(WalFencedError):  # the recovery's tombstone stops the writer
        await wal.append(rec(6))
    await crash(wal)
    await recovering.start(recovering.report.end_position)
    assert await bulks(store) == []
    await recovering.close()


async def test_a_put_landing_after_its_epoch_was_recovered_is_never_replayed(store):
    gated = GatedStore(store)
    gated.gates[0] = asyncio.Event()
    wal, _ = await started(gated, 1, bulk_interval_ms=60_000)
    stuck = wal.append(rec(0))  # the writer's first PUT hangs in the store...
    await until(lambda: len(gated.started) == 1, "the PUT started")
    await crash(wal)  # ...and the writer dies; nothing was acknowledged
    assert isinstance(stuck.exception(), WalClosedError)  # never acknowledged
    second, got = await started(store, 2)  # recovery finds no bulk: nothing to replay
    assert got == []
    await second.close()
    # the dead writer's PUT reaches the store only now (a request the server finished late):
    # its key holds the recovery's tombstone, so the conditional create loses
    encoded = encode_bulk(4, 1, [rec(0)])
    with pytest.raises(PreconditionFailed):
        await store.put(data_key(4, 1, 0), encoded, if_none_match=True)
    # a leftover of the previous key layout (which a writer PUT unconditionally) is dropped too
    await store.put(f"{data_prefix(4)}{1:010d}/{0:020d}-{len(encoded):020d}", encoded)
    recovering = ObjectStoreWal(store, 4, 3)
    assert await recovering.recover() == []  # epoch 1 was recovered by epoch 2: not replayed
    assert any("recovered before" in d for d in recovering.report.details)
    await recovering.start(recovering.report.end_position)
    assert await bulks(store) == []
    assert await tombstones(store) == [data_key(4, 1, 0)]
    await recovering.close()


class RecovererGate:
    """The recoverer's view of the same store, held just before it creates a tombstone
    (its listing is done by then), so a test can let the old writer's PUT land first."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.at_tombstone = asyncio.Event()
        self.release = asyncio.Event()

    async def put(self, key, data, **kw):
        if key.startswith(data_prefix(4)) and not data:
            self.at_tombstone.set()
            await self.release.wait()
        return await self.inner.put(key, data, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_a_put_landing_after_the_recoverers_listing_is_replayed_if_acknowledged(store):
    """The race the tombstone closes: the old writer's PUT completes after the recoverer
    listed the WAL. Without a LIST after each PUT, the writer acknowledges it; the
    recoverer's tombstone create then loses, and it replays that bulk."""
    gated = GatedStore(store)
    gated.gates[3] = asyncio.Event()
    old, _ = await started(gated, 1, bulk_interval_ms=60_000)
    for i in range(3):
        await old.append(rec(i))
    late = old.append(rec(3))
    await until(lambda: len(gated.started) == 4, "the fourth PUT started")
    view = RecovererGate(store)
    recovering = asyncio.create_task(ObjectStoreWal(view, 4, 2).recover())
    await view.at_tombstone.wait()  # listed: bulks 0..2 only
    gated.gates[3].set()
    assert await late > 0  # acknowledged: the writer did not wait for any LIST
    view.release.set()
    replayed = await recovering
    assert ids(replayed) == [0, 1, 2, 3]  # the acknowledged append is not lost
    with pytest.raises(WalFencedError, match="fenced by epoch 2"):
        await old.append(rec(4))  # the next position holds the tombstone
    await old.close()


async def test_a_put_landing_after_the_tombstone_is_never_acknowledged(store):
    gated = GatedStore(store)
    gated.gates[3] = asyncio.Event()
    old, _ = await started(gated, 1, bulk_interval_ms=60_000, bulk_bytes=300)
    for i in range(3):
        await old.append(rec(i))
    late = old.append(rec(3))
    more = old.append(rec(4))  # its own bulk (a full one is due at once), PUT while the fourth hangs
    await until(lambda: len(gated.completed) == 4, "the fifth PUT completed")
    recovering = ObjectStoreWal(store, 4, 2)
    replayed = await recovering.recover()
    assert ids(replayed) == [0, 1, 2]  # a hole at the fourth bulk: the tombstone goes there
    gated.gates[3].set()
    with pytest.raises(WalFencedError):
        await late
    with pytest.raises(WalFencedError):
        await more  # stored, but after the fenced one: never acknowledged
    await old.close()
    await recovering.start(recovering.report.end_position)
    await recovering.close()
    # the next recovery sees exactly what the first one replayed, and nothing of epoch 1
    again, got = await started(store, 3)
    assert got == []
    assert await bulks(store) == []
    await again.close()


class PauseAfterListing:
    """The recoverer's view of the store, held right after it listed the data objects."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.listed = asyncio.Event()
        self.release = asyncio.Event()

    async def list(self, prefix: str = ""):
        async for info in self.inner.list(prefix):
            yield info
        if prefix == data_prefix(4):
            self.listed.set()
            await self.release.wait()

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_a_writer_closing_cleanly_while_being_recovered_loses_nothing(store):
    """A clean close needs no tombstone only if the recoverer saw it before listing the data:
    appends acknowledged after the listing, then a close, must still be replayed."""
    old, _ = await started(store, 1, bulk_interval_ms=60_000)
    await old.append(rec(0))
    view = PauseAfterListing(store)
    recovering = asyncio.create_task(ObjectStoreWal(view, 4, 2).recover())
    await view.listed.wait()  # the listing holds bulk 0 only
    await old.append(rec(1))  # acknowledged after the listing
    await old.close()  # writes its `closed` marker
    view.release.set()
    assert ids(await recovering) == [0, 1]
