"""End-to-end behaviour of the storage engine through the Stream API."""

from __future__ import annotations

import asyncio

import pytest

from automq.broker.storage.api import OffsetOutOfRangeError, StreamClosedError


def payload(stream_id: int, base: int, size: int) -> bytes:
    head = f"{stream_id}:{base}:".encode()
    return (head * (size // len(head) + 1))[:size]


async def read_all(stream, start: int, end: int) -> list[tuple[int, int, bytes]]:
    out = []
    pos = start
    while pos < end:
        result = await stream.fetch(pos, end, 1 << 20)
        assert result.batches, f"no progress at {pos}"
        for b in result.batches:
            if b.next_offset <= pos:
                continue
            out.append((b.base_offset, b.record_count, bytes(b.payload)))
            pos = b.next_offset
    return out


async def test_append_fetch_from_log_cache(engines):
    engine = await engines.start()
    sid = await engine.create_stream({"topic": "t"})
    stream = await engine.open_stream(sid, 0)
    bases = [await stream.append(payload(sid, i * 10, 1000), 10) for i in range(5)]
    assert bases == [0, 10, 20, 30, 40]
    assert stream.confirm_offset == 50
    result = await stream.fetch(15, 50, 1 << 20)
    assert result.source == "log_cache"
    assert [b.base_offset for b in result.batches] == [10, 20, 30, 40]
    assert bytes(result.batches[0].payload) == payload(sid, 10, 1000)


async def test_offsets_reserved_before_first_await(engines):
    engine = await engines.start()
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    tasks = [asyncio.ensure_future(stream.append(payload(sid, i, 100), 3)) for i in range(20)]
    assert stream.end_offset == 0  # nothing ran yet
    bases = await asyncio.gather(*tasks)
    assert bases == [3 * i for i in range(20)]
    assert stream.end_offset == stream.confirm_offset == 60


async def test_fetch_bounds_and_max_bytes(engines):
    engine = await engines.start()
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    for i in range(4):
        await stream.append(payload(sid, i, 1000), 1)
    with pytest.raises(OffsetOutOfRangeError):
        await stream.fetch(5, 10, 100)
    assert (await stream.fetch(4, 10, 100)).batches == []
    one = await stream.fetch(0, 4, 10)  # smaller than a batch: still one batch
    assert [b.base_offset for b in one.batches] == [0]
    two = await stream.fetch(0, 4, 2500)
    assert [b.base_offset for b in two.batches] == [0, 1]
    await stream.trim(2)
    with pytest.raises(OffsetOutOfRangeError):
        await stream.fetch(1, 4, 100)


async def test_restart_reads_from_objects(engines):
    engine = await engines.start()
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    expected = []
    for i in range(200):
        data = payload(sid, i * 2, 3000)
        base = await stream.append(data, 2)
        expected.append((base, 2, data))
    await engine.close()
    engine2 = await engines.start()
    stream2 = await engine2.open_stream(sid, 1)
    assert stream2.end_offset == 400
    got = await read_all(stream2, 0, 400)
    assert got == expected
    # appends continue at the committed end
    assert await stream2.append(b"x" * 10, 1) == 400


async def test_crash_without_close_recovers_from_wal(engines):
    engine = await engines.start(storage=engines.config.storage.model_copy(update={"upload_interval_ms": 3_600_000}))
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    expected = []
    for i in range(50):
        data = payload(sid, i, 500)
        expected.append((await stream.append(data, 1), 1, data))
    # simulate a crash: no close, no upload; drop the engine and start another on the same WAL
    engine.uploader._task.cancel()
    await engine.wal.close()
    engines.engines.remove(engine)
    engine2 = await engines.start()
    meta = (await engines.metadata.get_streams([sid]))[0]
    assert meta.end_offset == 50
    stream2 = await engine2.open_stream(sid, 1)
    assert await read_all(stream2, 0, 50) == expected


async def test_stale_epoch_is_fenced(engines):
    engine = await engines.start()
    sid = await engine.create_stream()
    await engine.open_stream(sid, 3)
    with pytest.raises(Exception) as info:
        await engine.open_stream(sid, 2)
    assert "fenced" in str(info.value).lower()


async def test_closed_stream_rejects_appends(engines):
    engine = await engines.start()
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    await stream.append(b"abc", 1)
    await stream.close()
    with pytest.raises(StreamClosedError):
        await stream.append(b"abc", 1)
    meta = (await engines.metadata.get_streams([sid]))[0]
    assert (meta.state, meta.end_offset) == ("closed", 1)


async def test_engine_and_streams_implement_the_api(engines):
    from automq.broker.storage.api import Stream, StreamClient

    engine = await engines.start()
    assert isinstance(engine, StreamClient)
    stream = await engine.open_stream(await engine.create_stream(), 0)
    assert isinstance(stream, Stream)


async def test_hostile_arguments(engines):
    engine = await engines.start()
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    with pytest.raises(ValueError):
        await stream.append(b"x", 0)
    with pytest.raises(OffsetOutOfRangeError):
        await stream.fetch(-1, 10, 100)
    with pytest.raises(OffsetOutOfRangeError):
        await stream.trim(5)  # past the end
    assert stream.end_offset == 0  # a refused append reserved nothing


async def test_delete_stream_drops_unuploaded_data(engines):
    engine = await engines.start()
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    await stream.append(b"gone", 1)
    await engine.delete_stream(sid, 0)
    with pytest.raises(StreamClosedError):
        await stream.append(b"more", 1)
    assert await engines.metadata.get_streams([sid]) == []
    await engine.uploader.flush()  # nothing to commit for a deleted stream, and no error


async def test_batch_too_large_for_the_wal_is_refused_without_a_gap(engines):
    from automq.broker.storage.api import StreamError

    engine = await engines.start()
    stream = await engine.open_stream(await engine.create_stream(), 0)
    await stream.append(b"a", 1)
    with pytest.raises(StreamError, match="does not fit"):
        await stream.append(b"x" * (3 << 20), 1)  # the test WAL holds 4 MiB
    assert await stream.append(b"b", 1) == 1  # the stream goes on, offsets stay dense


async def test_torn_wal_tail_is_counted_and_not_served(engines):
    from automq.broker.storage.wal.volume import DATA_START, RECORD_HEADER_SIZE

    engine = await engines.start(storage=engines.config.storage.model_copy(update={"upload_interval_ms": 3_600_000}))
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    for i in range(3):
        await stream.append(bytes([i]) * 1000, 1)
    engine.uploader._task.cancel()
    await engine.wal.close()
    engines.engines.remove(engine)
    # the third record was never acknowledged in this story: tear it
    with open(engines.config.data_path(engines.config.wal.path), "r+b") as f:
        f.seek(DATA_START + 2 * (RECORD_HEADER_SIZE + 1000) + RECORD_HEADER_SIZE + 999)
        f.write(b"\x99")
    engine2 = await engines.start()
    assert engine2.metrics.registry.get_sample_value("automq_storage_wal_damaged_records_total") == 1
    assert engine2.metrics.registry.get_sample_value("automq_storage_wal_recovered_records_total") == 2
    stream2 = await engine2.open_stream(sid, 1)
    assert stream2.end_offset == 2
    r = await stream2.fetch(0, 2, 1 << 20)
    assert [bytes(b.payload) for b in r.batches] == [bytes([0]) * 1000, bytes([1]) * 1000]


async def test_full_wal_forces_uploads_instead_of_overwriting(engines):
    # a 128 KiB ring, uploads only when something forces them
    engine = await engines.start(
        wal=engines.config.wal.model_copy(update={"capacity": 128 << 10, "path": "small-wal"}),
        storage=engines.config.storage.model_copy(
            update={"upload_interval_ms": 3_600_000, "upload_block_bytes": 64 << 20}
        ),
    )
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    expected = [bytes([i % 256]) * 10_000 for i in range(100)]  # ~1 MB through a 128 KiB ring
    bases = await asyncio.gather(*(stream.append(p, 1) for p in expected))
    assert bases == list(range(100))
    assert engine.metrics.registry.get_sample_value("automq_storage_wal_full_total") > 0
    assert engine.wal.bytes_pending_trim <= 128 << 10
    await engine.uploader.flush()
    engine.log_cache.drop_stream(sid)  # read it all back from objects
    got = await read_all(stream, 0, 100)
    assert [p for _, _, p in got] == expected


async def test_cancelled_append_keeps_offsets_dense(engines):
    engine = await engines.start()
    stream = await engine.open_stream(await engine.create_stream(), 0)
    first = asyncio.ensure_future(stream.append(b"a" * 100, 1))
    await asyncio.sleep(0)  # enqueued in the WAL
    first.cancel()
    assert await stream.append(b"b" * 100, 1) == 1
    assert stream.confirm_offset == 2  # the cancelled caller's batch was written anyway
    r = await stream.fetch(0, 2, 1 << 20)
    assert [bytes(b.payload) for b in r.batches] == [b"a" * 100, b"b" * 100]
    assert first.cancelled()
