"""LogCache: WAL-ordered blocks, per-stream reads, FIFO eviction of uploaded blocks only,
byte accounting through removals."""

from __future__ import annotations

from automq.broker.storage.cache.log_cache import LogCache


def fill(cache: LogCache, blocks: int, per_block: int = 3) -> None:
    pos = 0
    for blk in range(blocks):
        for i in range(per_block):
            base = blk * per_block + i
            for sid in (1, 2):
                pos += 100
                cache.put(sid, 0, base, 1, bytes([sid]) * 100, pos)
        cache.seal()


def test_reads_follow_each_stream_across_blocks():
    cache = LogCache(max_bytes=1 << 20)
    fill(cache, 3)
    got = cache.get(1, 2, 8, 1 << 20)
    assert [b.base_offset for b in got] == [2, 3, 4, 5, 6, 7]
    assert [b.base_offset for b in cache.get(2, 4, 100, 250)] == [4, 5]  # max_bytes after the first
    assert cache.get(3, 0, 10, 100) == []
    assert cache.first_offset(2) == 0 and cache.first_offset(3) is None


def test_only_uploaded_blocks_are_evicted_oldest_first():
    cache = LogCache(max_bytes=700)
    fill(cache, 3)  # 3 blocks of 600 bytes
    assert cache.size == 1800 and cache.unuploaded_bytes == 1800
    blocks = cache.sealed_blocks()
    cache.mark_uploaded(blocks[1])  # not the oldest: nothing can go yet
    assert cache.size == 1800 and cache.first_offset(1) == 0
    cache.mark_uploaded(blocks[0])
    assert cache.size == 600 and cache.unuploaded_bytes == 600
    assert cache.first_offset(1) == 6 and cache.get(1, 0, 10, 1 << 20) == []
    assert [b.base_offset for b in cache.get(1, 6, 10, 1 << 20)] == [6, 7, 8]


def test_removals_keep_the_byte_counts_right():
    cache = LogCache(max_bytes=0)
    fill(cache, 2)
    first, second = cache.sealed_blocks()
    cache.keep_from(first, 1, 2)  # offsets 0, 1 of stream 1 committed already
    cache.remove_slice(first, 2)
    assert first.size == 100 and cache.unuploaded_bytes == 700
    assert cache.first_offset(1) == 2 and cache.first_offset(2) == 3
    cache.drop_stream(2)
    assert cache.first_offset(2) is None and cache.unuploaded_bytes == 400
    cache.mark_uploaded(first)
    cache.mark_uploaded(second)
    assert cache.size == 0 and cache.unuploaded_bytes == 0 and cache.first_offset(1) is None


def test_a_new_epoch_starts_a_new_block():
    cache = LogCache(max_bytes=1 << 20)
    cache.put(1, 0, 0, 1, b"a", 10)
    cache.put(1, 1, 1, 1, b"b", 20)
    [old] = cache.sealed_blocks()
    assert old.streams[1].epoch == 0 and cache.open_block.streams[1].epoch == 1
    assert [b.payload for b in cache.get(1, 0, 2, 100)] == [b"a", b"b"]


def test_a_compacted_range_is_no_longer_served_from_the_cache():
    cache = LogCache(max_bytes=1 << 20)
    fill(cache, 3)  # stream 1: offsets 0..8, blocks [0,3) [3,6) [6,9)
    first, second, third = cache.sealed_blocks()
    cache.mark_uploaded(first)
    cache.mark_uploaded(second)  # the third block is still with the uploader
    size = cache.size
    cache.invalidate_below(1, 5)
    # the uploaded slice wholly below the floor is freed; the straddling one stays, hidden
    assert cache.size == size - 300
    assert cache.first_offset(1) == 5
    assert cache.get(1, 0, 9, 1 << 20) == [] and cache.get(1, 4, 9, 1 << 20) == []
    assert [b.base_offset for b in cache.get(1, 5, 9, 1 << 20)] == [5, 6, 7, 8]
    assert cache.first_offset(2) == 0  # other streams untouched
    cache.invalidate_below(1, 2)  # an older compaction arriving late lowers nothing
    assert cache.first_offset(1) == 5
    cache.invalidate_below(1, 8)  # the floor may hide unuploaded blocks too: never freed
    assert cache.first_offset(1) == 8 and third.streams[1].bases == [6, 7, 8]
    cache.invalidate_below(1, 100)
    assert cache.first_offset(1) is None
    cache.drop_stream(1)
    cache.put(1, 1, 0, 1, b"x", 10_000)  # a recreated stream id starts without a floor
    assert cache.first_offset(1) == 0
