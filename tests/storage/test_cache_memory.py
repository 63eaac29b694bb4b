"""The caches' byte caps bound memory: what a cache accounts is what it keeps alive (measured
with tracemalloc), and it stays under its cap after more than the cap went in.

Batches are slices of bigger buffers, as in the broker: a Produce frame grown the way the
server grows a large one (bytearray +=, which over-allocates) holding several partitions'
batches; a read-ahead GET holding several blocks."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator

import pytest

from automq.broker.storage.cache.block_cache import BlockCache
from automq.broker.storage.cache.log_cache import LogCache
from automq.broker.storage.cache.retained import Retained

KiB = 1 << 10
STREAMS = 8
BATCH = 24 * KiB


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def live() -> int:
    """Bytes allocated now; also restarts the peak (`peak_since`)."""
    gc.collect()
    tracemalloc.reset_peak()
    return tracemalloc.get_traced_memory()[0]


def peak_since(before: int) -> int:
    return tracemalloc.get_traced_memory()[1] - before


def frame_batches(seq: int) -> list[memoryview]:
    """One Produce frame: a header, then one batch per stream; grown in steps like a large
    frame whose bytes arrive in several reads."""
    frame = bytearray(b"h" * 300)
    while len(frame) < 300 + STREAMS * BATCH:
        frame += bytes(min(64 * KiB, 300 + STREAMS * BATCH - len(frame)))
    view = memoryview(frame)
    return [view[300 + i * BATCH : 300 + (i + 1) * BATCH] for i in range(STREAMS)]


class Feeder:
    """Puts frames' batches into a log cache in WAL order, as the engine does."""

    def __init__(self, cache: LogCache) -> None:
        self.cache = cache
        self.next = [0] * STREAMS
        self.wal = 0
        self.seq = 0

    def frame(self) -> None:
        for sid, payload in enumerate(frame_batches(self.seq)):
            self.wal += len(payload)
            self.cache.put(sid, 0, self.next[sid], 1, payload, self.wal)
            self.next[sid] += 1
        self.seq += 1


def test_log_cache_accounts_the_frames_its_batches_keep_alive(traced):
    cache = LogCache(max_bytes=1 << 30)
    feeder = Feeder(cache)
    before = live()
    for _ in range(60):
        feeder.frame()
    kept = live() - before
    assert abs(cache.resident - kept) <= 0.01 * kept
    cache.seal()
    for block in cache.sealed_blocks():
        cache.mark_uploaded(block)
    cache.max_bytes = 0
    cache.evict()
    assert cache.resident == 0 and cache.size == 0
    assert live() - before < 64 * KiB


def test_log_cache_stays_under_its_cap_between_uploads(traced):
    cap = 4 << 20
    cache = LogCache(max_bytes=cap)
    feeder = Feeder(cache)
    before = live()
    for _ in range(20):  # 3.8 MiB of payload, uploaded
        feeder.frame()
    cache.seal()
    for block in cache.sealed_blocks():
        cache.mark_uploaded(block)
    for _ in range(60):  # no upload ends meanwhile: appends alone must push old blocks out
        feeder.frame()
        assert cache.resident <= cap or cache.unuploaded_bytes > 0.9 * cache.resident
    # what is left is the open, unuploaded block (never evicted) and nothing uploaded
    assert all(not b.uploaded for b in cache._blocks)
    assert live() - before <= cache.resident + 64 * KiB  # nothing evicted is still alive
    assert cache.get(0, 0, 10, 1 << 20) == []


def test_log_cache_cap_holds_while_uploads_keep_up(traced):
    cap = 4 << 20
    cache = LogCache(max_bytes=cap)
    feeder = Feeder(cache)
    before = live()
    for i in range(150):  # ~28 MiB through a 4 MiB cache
        feeder.frame()
        if i % 5 == 4:
            cache.seal()
            for block in cache.sealed_blocks():
                cache.mark_uploaded(block)
        assert cache.resident <= cap
    assert peak_since(before) <= cap + 2 * STREAMS * BATCH + 64 * KiB  # + the frame arriving, as it grows


def read_group(blocks: int, size: int) -> list[memoryview]:
    raw = memoryview(bytes(blocks * size))  # one ranged GET for a read-ahead group
    return [raw[i * size : (i + 1) * size] for i in range(blocks)]


def test_block_cache_accounts_the_read_buffers_its_blocks_keep_alive(traced):
    cache = BlockCache(1 << 30)
    before = live()
    for obj in range(20):
        for pos, block in enumerate(read_group(8, 64 * KiB)):
            cache.put(obj, pos, block, len(block))
    del block
    kept = live() - before
    assert abs(cache.resident - kept) <= 0.01 * kept
    for obj in range(20):
        cache.drop_object(obj)
    assert cache.resident == 0 and cache.size == 0 and live() - before < 64 * KiB


def test_block_cache_cap_holds_when_hot_blocks_pin_their_groups(traced):
    cap = 2 << 20
    cache = BlockCache(cap)
    before = live()
    for obj in range(40):  # 40 groups of 512 KiB through a 2 MiB cache
        for pos, block in enumerate(read_group(8, 64 * KiB)):
            cache.put(obj, pos, block, len(block))
        # a reader keeps coming back to the first block of the previous group: by block
        # lengths that is 64 KiB, but it holds the group's whole buffer
        if obj:
            cache.get(obj - 1, 0)
        assert cache.resident <= cap
    assert peak_since(before) <= cap + 640 * KiB  # + the group being put
    assert cache.get(39, 7) is not None  # the newest blocks are still served


def test_block_cache_makes_room_for_reads_in_flight(traced):
    cap = 2 << 20
    cache = BlockCache(cap)
    before = live()
    for obj in range(40):  # each 512 KiB group reserved before its GET, released before its put
        cache.reserve(512 * KiB)
        assert cache.resident + cache.reserved <= cap
        group = read_group(8, 64 * KiB)
        cache.release(512 * KiB)
        for pos, block in enumerate(group):
            cache.put(obj, pos, block, len(block))
        del group, block
    assert cache.reserved == 0 and cache.get(39, 7) is not None
    # the cache and the group landing together never held more than the cap (+ the GET's own
    # transient and the test's objects)
    assert peak_since(before) <= cap + 64 * KiB


def test_retained_counts_each_buffer_once():
    frame = bytearray(1000)
    view = memoryview(frame)
    held = Retained()
    added = held.hold(view[:10]) + held.hold(view[10:20]) + held.hold(bytes(5))
    assert added == held.bytes and len(held) == 2
    assert held.release(view[:10]) == 0  # the frame is still held by the other slice
    assert held.release(view[10:20]) > 1000 and len(held) == 1
