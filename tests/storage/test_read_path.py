"""The catch-up read path: one ranged GET for an object's tail, only the blocks needed,
read-ahead that grows while a reader keeps missing, a bounded block cache."""

from __future__ import annotations

import asyncio

import pytest
from engine_setup import node_config

from automq.broker.objectstore import ObjectStore, open_object_store
from automq.broker.storage.cache.block_cache import BlockCache
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata
from automq.broker.storage.read.reader import ObjectReader


class CountingStore(ObjectStore):
    """The real store, with every ranged GET recorded."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.gets: list[tuple[str, int, int | None]] = []

    async def put(self, key, data, *, if_none_match=False, if_match=None):
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def put_multipart(self, key, parts):
        return await self.inner.put_multipart(key, parts)

    async def get(self, key, start=0, end=None):
        self.gets.append((key, start, end))
        return await self.inner.get(key, start, end)

    async def head(self, key):
        return await self.inner.head(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)

    async def delete_many(self, keys):
        await self.inner.delete_many(keys)

    async def close(self):
        await self.inner.close()


async def started_engine(tmp_path, url, **storage) -> tuple[StorageEngine, InProcessMetadata, ObjectStore]:
    """A started engine writing 16 KiB object blocks, with these storage settings."""
    store = open_object_store(url)
    meta = InProcessMetadata(store)
    config = node_config(tmp_path / "w", url, storage={"object_block_bytes": 16 << 10, **storage})
    engine = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
    await engine.start()
    return engine, meta, store


async def fill(tmp_path, url, batches: int, size: int) -> tuple[int, InProcessMetadata, ObjectStore]:
    engine, meta, store = await started_engine(tmp_path, url, upload_block_bytes=256 << 10, stream_split_bytes=64 << 20)
    sid = await engine.create_stream()
    other = await engine.create_stream()
    s = await engine.open_stream(sid, 0)
    o = await engine.open_stream(other, 0)
    for i in range(batches):
        await s.append(i.to_bytes(4, "big") * (size // 4), 1)
        await o.append(b"o" * 100, 1)  # a second stream in the same stream-set objects
    await engine.close()
    return sid, meta, store


async def test_reader_fetches_tail_once_and_grows_read_ahead(tmp_path, file_url):
    sid, meta, store = await fill(tmp_path, file_url, batches=400, size=4096)  # ~1.6 MiB, several objects
    counting = CountingStore(store)
    cache = BlockCache(64 << 20)
    reader = ObjectReader(counting, meta, cache, read_ahead_initial=16 << 10, read_ahead_max=128 << 10)
    pos = 0
    while pos < 400:
        batches, _ = await reader.read(sid, pos, 400, 64 << 10)
        assert batches and batches[0].base_offset == pos
        for b in batches:
            assert bytes(b.payload) == b.base_offset.to_bytes(4, "big") * 1024
        pos = batches[-1].next_offset
    objects = {k for k, _, _ in counting.gets}
    # each object's index came from exactly one GET that ended at the object's end
    sizes = {o.key: o.object_size for o in await meta.get_objects(sid, 0, -1, 100)}
    assert sorted(k for k, s, e in counting.gets if e == sizes[k]) == sorted(objects)
    data_gets = [(k, s, e) for k, s, e in counting.gets if e != sizes[k]]
    # read-ahead: the data GETs grow (misses make the window larger) up to the maximum
    lengths = [e - s for _, s, e in data_gets]
    assert max(lengths) > min(lengths) and max(lengths) <= (128 << 10)
    # a second pass is served from the block cache without touching the store
    before = len(counting.gets)
    batches, from_cache = await reader.read(sid, 0, 400, 1 << 20)
    assert from_cache and len(counting.gets) == before


async def test_block_cache_stays_within_its_bound(tmp_path, file_url):
    sid, meta, store = await fill(tmp_path, file_url, batches=300, size=4096)
    cache = BlockCache(100 << 10)
    reader = ObjectReader(store, meta, cache, read_ahead_initial=16 << 10, read_ahead_max=64 << 10)
    pos = 0
    while pos < 300:
        batches, _ = await reader.read(sid, pos, 300, 32 << 10)
        pos = batches[-1].next_offset
        assert cache.resident <= 100 << 10 or len(cache._entries) == 1
    assert cache.misses > 0


class OverlappingStore(CountingStore):
    """Every data GET (not an object's tail) takes a little while, so concurrent readers'
    GETs overlap; records the largest number of data bytes requested at once."""

    def __init__(self, inner: ObjectStore, sizes: dict[str, int]) -> None:
        super().__init__(inner)
        self.sizes = sizes
        self.in_flight = 0
        self.peak = 0
        self.cache: BlockCache | None = None
        self.peak_with_cache = 0

    async def get(self, key, start=0, end=None):
        if end == self.sizes.get(key):
            return await super().get(key, start, end)
        self.in_flight += end - start
        self.peak = max(self.peak, self.in_flight)
        if self.cache is not None:  # what the cache keeps alive plus everything landing
            self.peak_with_cache = max(self.peak_with_cache, self.cache.resident + self.in_flight)
        try:
            await asyncio.sleep(0.005)
            return await super().get(key, start, end)
        finally:
            self.in_flight -= end - start


async def six_streams(tmp_path, url) -> tuple[InProcessMetadata, ObjectStore, list[int], dict[str, int]]:
    """Six streams of 300 4 KiB batches (stream n's batch i: n four times, then i), uploaded
    2 MiB at a time as stream objects of ~340 KiB each (room for long read-ahead groups).
    Returns the metadata, the store, the stream ids and every object's size by key."""
    engine, meta, store = await started_engine(tmp_path, url, upload_block_bytes=2 << 20, stream_split_bytes=64 << 10)
    sids = [await engine.create_stream() for _ in range(6)]
    streams = [await engine.open_stream(sid, 0) for sid in sids]
    for i in range(300):
        for n, s in enumerate(streams):
            await s.append(bytes([n]) * 4 + i.to_bytes(4, "big") * 1023, 1)
    await engine.close()
    objects = {o.key: o.object_size for sid in sids for o in await meta.get_objects(sid, 0, -1, 1000)}
    return meta, store, sids, objects


async def test_many_streams_catching_up_at_once_share_one_read_ahead_budget(tmp_path, file_url):
    meta, store, sids, objects = await six_streams(tmp_path, file_url)
    overlapping = OverlappingStore(store, objects)
    cache = BlockCache(512 << 10)  # read-ahead budget: a quarter, 128 KiB
    overlapping.cache = cache
    reader = ObjectReader(overlapping, meta, cache, read_ahead_initial=64 << 10, read_ahead_max=256 << 10)

    async def catch_up(n: int, sid: int) -> None:
        pos = 0
        while pos < 300:
            batches, _ = await reader.read(sid, pos, 300, 16 << 10)
            assert batches and batches[0].base_offset == pos
            for b in batches:
                assert bytes(b.payload) == bytes([n]) * 4 + b.base_offset.to_bytes(4, "big") * 1023
            pos = batches[-1].next_offset

    await asyncio.gather(*(catch_up(n, sid) for n, sid in enumerate(sids)))
    # each reader's GET always includes the block it needs now (at most one 16 KiB block plus
    # a batch that overhangs it); everything read ahead beyond that shares the 128 KiB
    assert overlapping.peak <= (128 << 10) + 6 * (24 << 10), overlapping.peak
    # reads in flight count against the cache's bound: it makes room before a GET starts
    # (slack: indexes are put without a reservation, one 24 KiB block each)
    assert overlapping.peak_with_cache <= (512 << 10) + 6 * (24 << 10), overlapping.peak_with_cache
    # and the streams did read ahead: fewer data GETs than blocks
    data_gets = [g for g in overlapping.gets if g[2] != objects[g[0]]]
    assert len(data_gets) < 6 * 300 * 4096 // (16 << 10)


async def test_streams_catching_up_together_do_not_evict_each_others_read_ahead(tmp_path, file_url):
    # One consumer catching up 6 partitions in turn (as a Kafka fetch of many partitions does),
    # each stream's groups growing to 256 KiB, with a 512 KiB cache: six full groups would not fit,
    # and a group evicted before its reader gets to it is read again.
    meta, store, sids, objects = await six_streams(tmp_path, file_url)
    counting = CountingStore(store)
    cache = BlockCache(512 << 10)
    reader = ObjectReader(counting, meta, cache, read_ahead_initial=16 << 10, read_ahead_max=256 << 10)
    positions = dict.fromkeys(sids, 0)
    while any(p < 300 for p in positions.values()):
        for n, sid in enumerate(sids):
            if positions[sid] < 300:
                batches, _ = await reader.read(sid, positions[sid], 300, 16 << 10)
                assert batches and batches[0].base_offset == positions[sid]
                assert bytes(batches[0].payload) == bytes([n]) * 4 + positions[sid].to_bytes(4, "big") * 1023
                positions[sid] = batches[-1].next_offset
        await asyncio.sleep(0)  # let the prefetches land, as between a consumer's fetches
    await asyncio.gather(*reader._prefetching)
    data_read = sum(e - s for k, s, e in counting.gets if e != objects[k])
    stored = 6 * 300 * (4096 + 70)  # the batches' bytes in the objects, headers included
    # every block was read once; a re-read of evicted groups would push this far above 1
    assert data_read <= 1.05 * stored, (data_read, stored)


async def test_a_store_that_reads_direct_gets_aligned_supersets_of_the_groups(tmp_path, monkeypatch):
    """The catch-up read path asks a store with a read alignment for the aligned superset of
    each read-ahead group, so the groups (which start anywhere in an object) come straight
    from the device, and hands out exactly the group's bytes."""
    from automq.broker.objectstore import direct_io

    if not direct_io.supported(tmp_path / "probe"):
        pytest.skip(f"{tmp_path} is on a filesystem without O_DIRECT: nothing direct to test here")
    direct_dir = tmp_path
    MiB = 1 << 20
    url = f"file://{direct_dir}/objects"
    store = open_object_store(url)
    meta = InProcessMetadata(store)
    config = node_config(
        direct_dir / "node",
        url,
        storage={"object_block_bytes": 16 << 10, "upload_block_bytes": 2 * MiB, "stream_split_bytes": 64 * MiB},
    )
    engine = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
    await engine.start()
    sid = await engine.create_stream()
    s = await engine.open_stream(sid, 0)
    for i in range(600):
        await s.append(i.to_bytes(4, "big") * 1001, 1)  # 4004-byte batches: blocks start unaligned
    await engine.close()
    reads: list = []
    real = direct_io.read_into

    def read_into(*args):
        reads.append((args, real(*args)))
        return reads[-1][1]

    monkeypatch.setattr(direct_io, "read_into", read_into)
    reader = ObjectReader(store, meta, BlockCache(8 * MiB), read_ahead_initial=64 << 10, read_ahead_max=MiB)
    pos = 0
    while pos < 600:
        batches, _ = await reader.read(sid, pos, 600, 256 << 10)
        for b in batches:
            assert bytes(b.payload) == b.base_offset.to_bytes(4, "big") * 1001
        pos = batches[-1].next_offset
    direct = [result for (_fd, start, _buf, _want), result in reads if result]
    assert direct and all(start % direct_io.ALIGN == 0 for (_fd, start, _b, _w), _r in reads)
    await store.close()
