"""The uploader's pace: objects are written at a multiple of the rate their block filled at,
one after another on the file store, and unpaced whenever someone waits for them or the
uploader falls behind (broker/storage/upload/pace.py). Time is a fake clock here: nothing
asserts how long anything took."""

from __future__ import annotations

import asyncio

import pytest
from engine_setup import node_config

from automq.broker.objectstore import open_object_store
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata
from automq.broker.storage.upload.pace import BURST, MAX_SLEEP, UploadPace

MiB = 1 << 20


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def written(pace: UploadPace, t: FakeTime, total: int, step: int = 256 << 10) -> float:
    """Seconds of fake time for `total` bytes taken in `step`s."""
    start = t.now
    for _ in range(total // step):
        pace.take(step)
    return t.now - start


def test_a_block_is_written_at_speedup_times_its_fill_rate_never_below_the_floor():
    t = FakeTime()
    pace = UploadPace(speedup=4.0, floor=32 * MiB, clock=t.clock, sleep=t.sleep)
    pace.block_sealed(64 * MiB, 6.4)  # filled at 10 MiB/s: written at 40 MiB/s
    assert pace.rate == pytest.approx(40 * MiB)
    assert written(pace, t, 64 * MiB) == pytest.approx((64 * MiB - BURST) / (40 * MiB), rel=0.01)
    assert max(t.sleeps) <= MAX_SLEEP  # in short pieces, so a turn to urgent applies soon
    pace.block_sealed(8 * MiB, 60.0)  # a slow trickle sealed by age: the floor
    assert pace.rate == 32 * MiB
    pace.block_sealed(64 * MiB, 0.25)  # filled at 256 MiB/s: written at 1 GiB/s
    assert pace.rate == pytest.approx(1024 * MiB)


def test_a_pause_earns_only_a_small_burst():
    t = FakeTime()
    pace = UploadPace(clock=t.clock, sleep=t.sleep)
    pace.block_sealed(64 * MiB, 6.4)
    written(pace, t, 8 * MiB)
    t.now += 3600.0  # an hour without writes
    assert written(pace, t, 8 * MiB) == pytest.approx((8 * MiB - BURST) / pace.rate, rel=0.01)


def test_urgent_writes_are_not_paced_and_a_sleep_stops_when_it_turns_urgent():
    t = FakeTime()
    pace = UploadPace(clock=t.clock, sleep=t.sleep)
    pace.block_sealed(64 * MiB, 6.4)
    pace.urgent = True
    assert written(pace, t, 64 * MiB) == 0 and not t.sleeps
    pace.urgent = False

    def sleep_then_hurry(seconds: float) -> None:
        t.sleep(seconds)
        pace.urgent = True  # a flush arrives while a write waits

    pace._sleep = sleep_then_hurry
    pace.take(32 * MiB)  # due ~0.8 s later
    assert len(t.sleeps) == 1 and t.sleeps[0] == MAX_SLEEP


@pytest.fixture
async def engine(tmp_path, file_url):
    store = open_object_store(file_url)
    meta = InProcessMetadata(store)
    config = node_config(
        tmp_path,
        file_url,
        storage={"upload_interval_ms": 3_600_000, "upload_block_bytes": 400_000, "stream_split_bytes": 50_000},
    )
    engine = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
    await engine.start()
    yield engine
    await engine.close()
    await store.close()


def record_puts(engine, monkeypatch) -> list[tuple[str, object, bool, int]]:
    """(key, pace, pace urgent, puts in flight) of each put_parts, as it starts."""
    store = engine.uploader._store
    real = store.put_parts
    seen: list[tuple[str, object, bool, int]] = []
    in_flight = 0

    async def put_parts(key, parts, **kwargs):
        nonlocal in_flight
        pace = kwargs.get("pace")
        in_flight += 1
        seen.append((key, pace, pace is not None and pace.urgent, in_flight))
        try:
            await asyncio.sleep(0.01)  # a write in progress: a parallel one would overlap it
            return await real(key, parts, **kwargs)
        finally:
            in_flight -= 1

    monkeypatch.setattr(store, "put_parts", put_parts)
    return seen


async def test_a_full_block_is_uploaded_paced_one_object_after_another(engine, monkeypatch):
    seen = record_puts(engine, monkeypatch)
    streams = [await engine.open_stream(await engine.create_stream(), 0) for _ in range(3)]
    for _ in range(8):  # 3 x 8 x 20 kB: one block sealed at its size (400 kB), 3 stream objects
        for s in streams:
            await s.append(b"x" * 20_000, 1)
    while len(seen) < 3:
        await asyncio.sleep(0.01)
    assert all(pace is engine.uploader._pace for _, pace, _, _ in seen)
    assert [urgent for _, _, urgent, _ in seen] == [False] * 3  # sealed at its size: paced
    assert max(n for *_, n in seen) == 1  # the file store's objects are written one at a time


async def test_a_flush_or_pressure_uploads_unpaced(engine, monkeypatch):
    seen = record_puts(engine, monkeypatch)
    s = await engine.open_stream(await engine.create_stream(), 0)
    await s.append(b"y" * 1000, 1)
    await engine.uploader.flush()  # a partition moving or a shutdown waits for it
    assert seen and all(urgent for _, _, urgent, _ in seen)
    await s.append(b"z" * 1000, 1)
    engine.uploader.request_upload()  # WAL or log-cache pressure
    while len(seen) < 2:
        await asyncio.sleep(0.01)
    assert seen[-1][2] is True
