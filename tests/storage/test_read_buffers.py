"""Read-ahead groups land in reused buffers: a buffer is used again only once no view of it
is left (block cache entries, batches handed to a Fetch), never while one is."""

from __future__ import annotations

import asyncio

from test_read_path import CountingStore, fill

from automq.broker.storage.cache.block_cache import BlockCache
from automq.broker.storage.read.buffers import GRANULE, ReadBuffers, capacity
from automq.broker.storage.read.reader import ObjectReader

MiB = 1 << 20


async def test_a_buffer_is_used_again_only_once_no_view_of_it_is_left():
    pool = ReadBuffers(max_idle=8 * MiB, cache=BlockCache(64 * MiB))
    buf = pool.take(MiB)
    buf[0] = 7
    block = memoryview(buf)[: MiB // 2].toreadonly()[10:20]  # what the cache would hold
    del buf
    other = pool.take(MiB)  # the block still reads the first one
    assert other[0] == 0 and pool.allocated == 2
    del block
    again = pool.take(MiB)
    assert again[0] == 7 and len(again) == MiB and pool.allocated == 2


async def test_a_view_of_a_view_keeps_its_buffer_lent():
    pool = ReadBuffers(max_idle=8 * MiB, cache=BlockCache(64 * MiB))
    buf = pool.take(MiB)
    outer = memoryview(buf)
    inner = memoryview(outer[5:9])
    del buf, outer
    pool.take(MiB)
    assert pool.allocated == 2
    del inner
    pool.take(MiB)
    assert pool.allocated == 2


async def test_reads_of_near_sizes_share_a_buffer_at_most_a_quarter_bigger():
    pool = ReadBuffers(max_idle=64 * MiB, cache=BlockCache(64 * MiB))
    sizes = (1, GRANULE, GRANULE + 1, 3 * MiB, 4 * MiB, 4 * MiB + 1, 17 * MiB)
    assert [len(pool.take(n)) for n in sizes] == [
        GRANULE,
        GRANULE,
        GRANULE * 5 // 4,
        3 * MiB,
        4 * MiB,
        5 * MiB,
        20 * MiB,
    ]
    for size in (1, 1000, GRANULE + 1, 5 * MiB + 3, 17 * MiB, 31 * MiB + 5, 100 * MiB):
        assert size <= capacity(size) <= max(GRANULE, size * 5 // 4)
    pool = ReadBuffers(max_idle=64 * MiB, cache=BlockCache(64 * MiB))
    pool.take(17 * MiB)  # a read of 17 MiB, done (nothing holds its buffer)
    assert len(pool.take(19 * MiB)) == 20 * MiB and pool.allocated == 1  # the same class
    assert len(pool.take(8 * MiB)) == 8 * MiB and pool.allocated == 2  # another


async def test_idle_buffers_count_against_the_block_cache_and_beyond_the_bound_are_let_go():
    cache = BlockCache(64 * MiB)
    pool = ReadBuffers(max_idle=2 * MiB, cache=cache)
    held = [pool.take(MiB) for _ in range(4)]
    del held
    pool.take(10 * MiB)  # reclaims all four; two stay idle
    assert pool.idle_bytes == 2 * MiB and cache.reserved == 2 * MiB
    assert pool.lent_bytes == 10 * MiB
    pool.take(MiB)  # one of them, lent again
    assert pool.idle_bytes == MiB and cache.reserved == MiB


async def test_catch_up_reads_reuse_buffers_and_never_change_data_still_in_use(tmp_path, file_url):
    sid, meta, store = await fill(tmp_path, file_url, batches=600, size=4096)  # ~2.4 MiB
    groups = 0
    get_into = store.get_into

    async def counted(key, start, buffer):
        nonlocal groups
        groups += 1
        return await get_into(key, start, buffer)

    store.get_into = counted
    cache = BlockCache(600 << 10)  # a quarter of the data: groups are evicted and read again
    reader = ObjectReader(store, meta, cache, read_ahead_initial=64 << 10, read_ahead_max=256 << 10)
    assert reader._buffers is not None

    def expected(offset: int) -> bytes:
        return offset.to_bytes(4, "big") * 1024

    held = []  # batches an answer still holds (a Fetch response being sent)
    for rounds in range(3):
        pos = 0
        while pos < 600:
            batches, _ = await reader.read(sid, pos, 600, 64 << 10)
            for b in batches:
                assert b.payload == expected(b.base_offset)
            if rounds == 0 and pos < 100:
                held.extend(batches)
            pos = batches[-1].next_offset
    await asyncio.gather(*reader._prefetching)
    # the early batches kept their buffers lent through every later read
    assert held
    for b in held:
        assert b.payload == expected(b.base_offset)
    # and buffers were used again: far fewer made than groups read
    assert groups > 20
    assert reader._buffers.allocated < groups / 2


async def test_a_store_that_cannot_read_into_buffers_is_read_as_before(tmp_path, file_url):
    sid, meta, store = await fill(tmp_path, file_url, batches=50, size=4096)
    reader = ObjectReader(CountingStore(store), meta, BlockCache(8 * MiB))
    assert reader._buffers is None
    batches, _ = await reader.read(sid, 0, 50, MiB)
    assert [b.base_offset for b in batches] == list(range(50))


async def test_after_the_last_read_idle_buffers_are_let_go():
    cache = BlockCache(64 * MiB)
    pool = ReadBuffers(max_idle=8 * MiB, cache=cache, idle_s=0.05)
    pool.take(MiB)
    held = memoryview(pool.take(2 * MiB))  # a cached block still reads this one
    pool.take(4 * MiB)  # the first buffer, done with, goes idle here
    assert pool.idle_bytes == MiB and cache.reserved == MiB
    await asyncio.sleep(0.3)
    assert pool.idle_bytes == 0 and cache.reserved == 0
    assert pool.lent_bytes == 2 * MiB  # the one still read stays lent
    del held
    await asyncio.sleep(0.3)
    assert pool.lent_bytes == 0 and pool.idle_bytes == 0
