"""Uploads: a failed commit never trims the WAL; a commit whose answer was lost is not
committed twice; big streams get their own stream objects."""

from __future__ import annotations

import asyncio

import pytest
from engine_setup import node_config

from automq.broker.objectstore import open_object_store
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata
from automq.broker.storage.metadata import ObjectType


class FlakyCommits(InProcessMetadata):
    """The real metadata; commits can be made to fail before or after taking effect."""

    fail_before = 0
    fail_after = 0
    attempts = 0

    async def commit_stream_set_object(self, request):
        self.attempts += 1
        if self.fail_before:
            self.fail_before -= 1
            raise ConnectionError("controller unreachable")
        await super().commit_stream_set_object(request)
        if self.fail_after:
            self.fail_after -= 1
            raise ConnectionError("answer lost")


@pytest.fixture
async def setup(tmp_path, file_url):
    store = open_object_store(file_url)
    meta = FlakyCommits(store)
    config = node_config(tmp_path, file_url, storage={"upload_interval_ms": 3_600_000, "stream_split_bytes": 50_000})
    engine = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
    await engine.start()
    yield engine, meta
    await engine.close()
    await store.close()


async def test_failed_commit_never_trims_then_retry_succeeds(setup):
    engine, meta = setup
    sid = await engine.create_stream()
    s = await engine.open_stream(sid, 0)
    for _i in range(10):
        await s.append(b"x" * 1000, 1)
    pending = engine.wal.bytes_pending_trim
    trim_before = engine.wal._header.trim
    meta.fail_before = 1_000_000  # the controller is down
    engine.uploader.request_upload()
    while meta.attempts < 3:
        await asyncio.sleep(0.05)
    assert engine.wal._header.trim == trim_before and engine.wal.bytes_pending_trim >= pending
    meta.fail_before = 0  # it is back
    await engine.uploader.flush()  # a retry goes through
    assert meta.attempts >= 4
    assert engine.wal._header.trim > trim_before
    assert (await meta.get_streams([sid]))[0].end_offset == 10


async def test_commit_with_lost_answer_is_not_committed_twice(setup):
    engine, meta = setup
    sid = await engine.create_stream()
    s = await engine.open_stream(sid, 0)
    for i in range(5):
        await s.append(bytes([i]) * 100, 2)
    meta.fail_after = 1
    await engine.uploader.flush()
    objs = await meta.get_objects(sid, 0, -1, 10)
    assert meta.attempts == 1  # the retry saw the range committed and dropped it
    assert [(r.start_offset, r.end_offset) for o in objs for r in o.ranges if r.stream_id == sid] == [(0, 10)]
    assert (await meta.get_streams([sid]))[0].end_offset == 10
    await s.append(b"z", 1)
    await engine.uploader.flush()
    assert (await meta.get_streams([sid]))[0].end_offset == 11


async def test_big_streams_get_their_own_stream_object(setup):
    engine, meta = setup
    big, small = await engine.create_stream(), await engine.create_stream()
    b = await engine.open_stream(big, 0)
    sm = await engine.open_stream(small, 0)
    for _ in range(20):
        await b.append(b"B" * 5000, 1)  # 100 KB > stream_split_bytes
        await sm.append(b"s" * 100, 1)
    await engine.uploader.flush()
    [big_obj] = await meta.get_objects(big, 0, -1, 10)
    [small_obj] = await meta.get_objects(small, 0, -1, 10)
    assert big_obj.object_type == ObjectType.STREAM and small_obj.object_type == ObjectType.STREAM_SET
    assert [(r.stream_id, r.start_offset, r.end_offset) for r in big_obj.ranges] == [(big, 0, 20)]
    # both read back from objects once the log cache forgets them
    engine.log_cache.drop_stream(big)
    r = await b.fetch(0, 20, 1 << 20)
    assert r.source != "log_cache" and [bytes(x.payload) for x in r.batches] == [b"B" * 5000] * 20


async def _from_objects(engine, sid: int, stream, end: int) -> list[bytes]:
    """The stream's payloads [0, end), read from the objects (its log cache slices dropped)."""
    engine.log_cache.drop_stream(sid)
    got: list[bytes] = []
    offset = 0
    while offset < end:
        r = await stream.fetch(offset, end, 1 << 20)
        assert r.source != "log_cache" and r.batches
        got += [bytes(x.payload) for x in r.batches]
        offset = r.batches[-1].next_offset
    return got


async def test_objects_laid_out_in_slices_while_appends_continue(setup, monkeypatch):
    # The uploader gives the event loop back every few batches while it lays out a block;
    # appends that run meanwhile go to the next block and the object still holds exactly
    # the sealed block's batches, in order.
    from automq.broker.storage.upload import uploader

    monkeypatch.setattr(uploader, "BATCHES_PER_SLICE", 7)
    engine, _meta = setup
    sids = [await engine.create_stream(), await engine.create_stream()]
    streams = [await engine.open_stream(sid, 0) for sid in sids]
    for i in range(40):
        for n, s in enumerate(streams):
            await s.append(bytes([n]) * (200 + i), 1)
    flushing = asyncio.ensure_future(engine.uploader.flush())
    for i in range(40, 60):
        for n, s in enumerate(streams):
            await s.append(bytes([n]) * (200 + i), 1)
    await flushing
    await engine.uploader.flush()
    for n, (sid, s) in enumerate(zip(sids, streams, strict=True)):
        assert await _from_objects(engine, sid, s, 60) == [bytes([n]) * (200 + i) for i in range(60)]


async def test_object_store_outage_holds_data_in_the_wal_until_it_returns(tmp_path, file_url):
    from automq.broker.objectstore import ObjectStoreUnavailable

    store = open_object_store(file_url)
    real_put_parts = store.put_parts
    down = True

    async def put_parts(key, parts, **kwargs):  # the real store, with data uploads failing while "down"
        if down and key.startswith("objects/"):
            raise ObjectStoreUnavailable("injected outage", key=key)
        return await real_put_parts(key, parts, **kwargs)

    store.put_parts = put_parts
    meta = InProcessMetadata(store)
    config = node_config(
        tmp_path,
        file_url,
        wal={"capacity": 256 << 10},
        storage={"upload_interval_ms": 50, "upload_block_bytes": 16 << 10},
    )
    engine = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
    await engine.start()
    sid = await engine.create_stream()
    s = await engine.open_stream(sid, 0)
    for i in range(50):  # ~100 KB: fits the ring, so appends are still acknowledged
        await s.append(bytes([i]) * 2000, 1)
    failures = "automq_storage_upload_failures_total"
    while engine.metrics.registry.get_sample_value(failures) < 2:  # the uploader tried, and retried
        await asyncio.sleep(0.05)
    assert engine.wal._header.trim == 0 and (await meta.get_streams([sid]))[0].end_offset == 0
    down = False
    await engine.uploader.flush()
    assert (await meta.get_streams([sid]))[0].end_offset == 50
    assert engine.wal._header.trim > 0
    await engine.close()
    await store.close()


async def test_parallel_object_writes_still_commit_in_block_order(setup):
    engine, meta = setup
    sid = await engine.create_stream()
    s = await engine.open_stream(sid, 0)
    store = engine.object_store
    real_put_parts = store.put_parts
    calls, events = [], []
    second_started = asyncio.Event()

    async def put_parts(key, parts, **kwargs):  # the first block's object is slow, the second's fast
        if not key.startswith("objects/"):
            return await real_put_parts(key, parts, **kwargs)
        calls.append(key)
        n = len(calls)
        events.append(("start", n))
        if n == 2:
            second_started.set()
        if n == 1:  # hold the first block's PUT until the second block's begins (if it ever does)
            try:
                await asyncio.wait_for(second_started.wait(), timeout=30)
            except TimeoutError:
                pass
        result = await real_put_parts(key, parts, **kwargs)
        events.append(("end", n))
        return result

    store.put_parts = put_parts
    commits = []
    real_commit = meta.commit_stream_set_object

    async def commit(request):
        commits.append([(r.start_offset, r.end_offset) for r in request.stream_ranges])
        await real_commit(request)

    meta.commit_stream_set_object = commit
    for part in range(2):
        for _i in range(5):
            await s.append(bytes([part]) * 100, 1)
        engine.log_cache.seal()
    await engine.uploader.flush()
    assert len(calls) == 2 and commits == [[(0, 5)], [(5, 10)]]
    assert events.index(("start", 2)) < events.index(("end", 1))  # the second PUT did not wait
    assert engine.metrics.registry.get_sample_value("automq_storage_upload_failures_total") == 0
    store.put_parts = real_put_parts


async def test_big_objects_go_to_the_store_in_pieces_joined_one_at_a_time(setup, monkeypatch):
    # An object above MULTIPART_THRESHOLD is never joined whole (a second copy of the block
    # in memory): the store gets pieces of about MULTIPART_PART, and the object reads back.
    from automq.broker.storage.upload import uploader

    monkeypatch.setattr(uploader, "MULTIPART_THRESHOLD", 20_000)
    monkeypatch.setattr(uploader, "MULTIPART_PART", 8_000)
    engine, _meta = setup
    store = engine.uploader._store
    # the path of a store that joins what it is given (S3); the file:// store takes the parts
    monkeypatch.setattr(store, "writes_parts_unjoined", False)
    pieces: list[int] = []
    whole_puts: list[int] = []
    real_multipart, real_put = store.put_multipart, store.put

    async def put_multipart(key, parts):
        async def seen():
            async for p in parts:
                pieces.append(len(p))
                yield p

        return await real_multipart(key, seen())

    async def put(key, data, **kw):
        whole_puts.append(len(data))
        return await real_put(key, data, **kw)

    monkeypatch.setattr(store, "put_multipart", put_multipart)
    monkeypatch.setattr(store, "put", put)
    sid = await engine.create_stream()
    s = await engine.open_stream(sid, 0)
    payloads = [bytes([i]) * (1000 + i) for i in range(40)]  # ~41 KB: one object
    for p in payloads:
        await s.append(p, 1)
    await engine.uploader.flush()
    assert len(pieces) >= 5 and max(pieces) < 8_000 + 2 * 1040 + 4096  # a piece: ~PART, plus a part
    assert all(n <= 20_000 for n in whole_puts)
    assert await _from_objects(engine, sid, s, 40) == payloads


async def test_the_file_store_takes_a_big_object_as_its_parts(setup, monkeypatch):
    # file:// writes the parts in small runs itself: no 8 MiB pieces joined for it either
    from automq.broker.storage.upload import uploader

    monkeypatch.setattr(uploader, "MULTIPART_THRESHOLD", 20_000)
    engine, _meta = setup
    store = engine.uploader._store
    assert store.writes_parts_unjoined
    taken: list[int] = []
    real_put_parts = store.put_parts

    async def put_parts(key, parts, **kwargs):
        if key.startswith("objects/"):
            taken.append(sum(len(p) for p in parts))
        return await real_put_parts(key, parts, **kwargs)

    async def no_multipart(key, parts):
        raise AssertionError("the file store was handed joined pieces")

    monkeypatch.setattr(store, "put_parts", put_parts)
    monkeypatch.setattr(store, "put_multipart", no_multipart)
    sid = await engine.create_stream()
    s = await engine.open_stream(sid, 0)
    payloads = [bytes([i]) * (1000 + i) for i in range(40)]
    for p in payloads:
        await s.append(p, 1)
    await engine.uploader.flush()
    assert len(taken) == 1 and taken[0] > 20_000
    assert engine.metrics.registry.get_sample_value("automq_storage_upload_failures_total") == 0
    engine.log_cache.drop_stream(sid)
    r = await s.fetch(0, 40, 1 << 20)
    assert r.source != "log_cache" and [bytes(x.payload) for x in r.batches] == payloads
