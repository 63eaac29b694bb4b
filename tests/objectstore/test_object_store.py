"""One behavioural suite for every ObjectStore backend: the local directory store and S3
(against the real SeaweedFS server). Each test runs once per backend."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from automq.broker.objectstore import (
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    open_object_store,
)

MiB = 1 << 20


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("file_url" if request.param == "file" else "s3_url")


@pytest.fixture
async def store(store_url: str):
    async with open_object_store(store_url) as opened:
        yield opened


async def keys_of(store: ObjectStore, prefix: str = "") -> list[str]:
    return [info.key async for info in store.list(prefix)]


# -- basic operations --------------------------------------------------------------------------


async def test_put_get_head_exists_delete_round_trip(store):
    data = b"hello object store"
    result = await store.put("streams/1/object-1", data)
    assert result.key == "streams/1/object-1" and result.size == len(data)
    assert result.etag == hashlib.md5(data).hexdigest()
    assert await store.get("streams/1/object-1") == data
    info = await store.head("streams/1/object-1")
    assert (info.key, info.size, info.etag) == ("streams/1/object-1", len(data), result.etag)
    assert info.last_modified > 0
    assert await store.exists("streams/1/object-1")
    await store.delete("streams/1/object-1")
    assert not await store.exists("streams/1/object-1")
    with pytest.raises(ObjectNotFound) as missing:
        await store.get("streams/1/object-1")
    assert missing.value.key == "streams/1/object-1"
    with pytest.raises(ObjectNotFound):
        await store.head("streams/1/object-1")


async def test_overwrite_replaces_content_and_etag(store):
    first = await store.put("k", b"one")
    second = await store.put("k", b"two, longer")
    assert first.etag != second.etag
    assert await store.get("k") == b"two, longer"
    assert (await store.head("k")).etag == second.etag


async def test_empty_object(store):
    result = await store.put("empty", b"")
    assert result.size == 0
    assert await store.get("empty") == b""
    assert await store.get("empty", 0, 0) == b""
    assert await store.get("empty", 0, 10) == b""
    assert (await store.head("empty")).size == 0
    with pytest.raises(ObjectNotFound):
        await store.get("empty", 1)
    assert [(i.key, i.size) async for i in store.list()] == [("empty", 0)]


async def test_binary_data_and_buffer_types(store):
    data = bytes(range(256)) * 33
    await store.put("bin/bytes", data)
    await store.put("bin/bytearray", bytearray(data))
    await store.put("bin/memoryview", memoryview(data)[10:-10])
    assert await store.get("bin/bytes") == data
    assert await store.get("bin/bytearray") == data
    assert await store.get("bin/memoryview") == data[10:-10]


async def test_missing_keys_everywhere(store):
    with pytest.raises(ObjectNotFound):
        await store.get("nope")
    with pytest.raises(ObjectNotFound):
        await store.get("nope", 5, 10)
    with pytest.raises(ObjectNotFound):
        await store.get("nope", 3, 3)
    assert not await store.exists("no/such/dir/key")
    assert await keys_of(store) == []


async def test_stats_count_traffic(store):
    await store.put("a", b"12345")
    await store.get("a")
    await store.get("a", 1, 3)
    with pytest.raises(ObjectNotFound):
        await store.get("missing")
    stats = store.stats
    assert (stats.puts, stats.bytes_put, stats.gets, stats.bytes_got) == (1, 5, 2, 7)
    assert stats.errors.get("ObjectNotFound") == 1


# -- ranged reads ------------------------------------------------------------------------------


async def test_ranged_reads_at_edges(store):
    data = bytes(range(100))
    await store.put("r", data)
    assert await store.get("r", 0, 0) == b""
    assert await store.get("r", 50, 50) == b""
    assert await store.get("r", 99) == data[99:]
    assert await store.get("r", 99, 100) == data[99:]
    assert await store.get("r", 0, 1) == data[:1]
    assert await store.get("r", 90, 1000) == data[90:]  # clipped
    assert await store.get("r", 0) == data
    for start in (100, 101, 10_000):
        with pytest.raises(ObjectNotFound):
            await store.get("r", start)
        with pytest.raises(ObjectNotFound):
            await store.get("r", start, start + 5)
    with pytest.raises(ValueError):
        await store.get("r", -1)
    with pytest.raises(ValueError):
        await store.get("r", 10, 5)


def test_ranged_reads_match_python_slicing(store_url):
    """Property: get(start, end) is data[start:end], except a start at/after the end of a
    non-empty range raises ObjectNotFound (start 0 always works). get_into(start, buffer)
    reads the same bytes into the buffer's front and leaves the rest of it as it was."""
    objects = {"size-0": b"", "size-1": b"\x00", "size-777": os.urandom(777)}
    with asyncio.Runner() as runner:
        store = open_object_store(store_url)
        for key, data in objects.items():
            runner.run(store.put(key, data))

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(
            key=st.sampled_from(sorted(objects)),
            start=st.integers(0, 800),
            end=st.none() | st.integers(0, 900),
            delta=st.none() | st.integers(0, 3),
        )
        def check(key: str, start: int, end: int | None, delta: int | None) -> None:
            if end is not None and end < start:
                end = start + (delta or 0)
            data = objects[key]
            length = (end if end is not None else start + 900) - start
            buffer = bytearray(b"\xee") * length
            if start > 0 and start >= len(data):
                with pytest.raises(ObjectNotFound):
                    runner.run(store.get(key, start, end))
                with pytest.raises(ObjectNotFound):
                    runner.run(store.get_into(key, start, memoryview(buffer)))
            else:
                assert runner.run(store.get(key, start, end)) == data[start:end]
                n = runner.run(store.get_into(key, start, memoryview(buffer)))
                assert buffer[:n] == data[start : start + length]
                assert buffer[n:] == b"\xee" * (length - n)

        try:
            check()
        finally:
            runner.run(store.close())


# -- conditional writes ------------------------------------------------------------------------


async def test_conditional_create_racing_writers_exactly_one_wins(store_url):
    async with open_object_store(store_url) as first, open_object_store(store_url) as second:
        for round_number in range(2):
            key = f"metadata/log/{round_number:020d}"

            async def attempt(writer: int) -> int | None:
                try:
                    await (first if writer % 2 else second).put(key, b"writer-%d" % writer, if_none_match=True)
                except PreconditionFailed as lost:
                    assert lost.key == key
                    return None
                return writer

            outcomes = await asyncio.gather(*(attempt(writer) for writer in range(16)))
            winners = [writer for writer in outcomes if writer is not None]
            assert len(winners) == 1, f"round {round_number}: winners {winners}"
            assert await first.get(key) == b"writer-%d" % winners[0]


async def test_conditional_create_of_existing_and_after_delete(store):
    await store.put("c", b"v1", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await store.put("c", b"v2", if_none_match=True)
    assert await store.get("c") == b"v1"
    await store.delete("c")
    await store.put("c", b"v3", if_none_match=True)
    assert await store.get("c") == b"v3"


async def test_conditional_replace_by_etag(store):
    v1 = await store.put("cas", b"v1")
    v2 = await store.put("cas", b"v2", if_match=v1.etag)
    with pytest.raises(PreconditionFailed):
        await store.put("cas", b"stale", if_match=v1.etag)
    assert await store.get("cas") == b"v2"
    v3 = await store.put("cas", b"v3", if_match=f'"{v2.etag}"')  # quoted ETags are accepted too
    assert (await store.head("cas")).etag == v3.etag
    with pytest.raises(PreconditionFailed):
        await store.put("never-written", b"x", if_match=v1.etag)
    assert not await store.exists("never-written")
    with pytest.raises(ValueError):
        await store.put("cas", b"x", if_none_match=True, if_match=v3.etag)


# -- listing -----------------------------------------------------------------------------------


async def test_list_by_prefix_in_byte_order(store):
    keys = ["a", "a-c", "a/b", "a/b/c", "a0", "b", "b/\u00e9", "b/z", "%x/%obj", "a.b"]
    for key in keys:
        await store.put(key, key.encode())
    expected = sorted(keys, key=lambda k: k.encode())
    assert await keys_of(store) == expected
    assert await keys_of(store, "a") == [k for k in expected if k.startswith("a")]
    assert await keys_of(store, "a/") == ["a/b", "a/b/c"]
    assert await keys_of(store, "a/b") == ["a/b", "a/b/c"]
    assert await keys_of(store, "b/") == ["b/z", "b/\u00e9"]
    assert await keys_of(store, "zz") == []
    infos = {info.key: info async for info in store.list("a/")}
    assert infos["a/b"].size == 3 and infos["a/b"].etag == hashlib.md5(b"a/b").hexdigest()


async def test_list_many_keys_paginates_and_delete_many_clears(store):
    keys = [f"wal/node-1/{index:06d}" for index in range(1100)]
    limit = asyncio.Semaphore(32)

    async def put(key: str) -> None:
        async with limit:
            await store.put(key, key.encode())

    await asyncio.gather(*(put(key) for key in keys))
    await store.put("wal/node-2/000000", b"other node")
    assert await keys_of(store, "wal/node-1/") == keys
    await store.delete_many([*keys, "wal/node-1/missing"])
    assert await keys_of(store) == ["wal/node-2/000000"]


async def test_delete_missing_keys_is_not_an_error(store):
    await store.delete_many([])
    await store.delete_many(["nothing/here", "nothing"])
    await store.delete("never")
    await store.put("kept", b"1")
    await store.delete_many(["kept", "kept"])  # duplicates too
    assert not await store.exists("kept")
    with pytest.raises(ValueError):
        await store.delete_many("kept")  # type: ignore[arg-type]


# -- multipart ---------------------------------------------------------------------------------


async def test_multipart_round_trip_12_mib_in_5_mib_parts(store):
    data = os.urandom(12 * MiB)
    parts = [data[i : i + 5 * MiB] for i in range(0, len(data), 5 * MiB)]
    result = await store.put_multipart("big/object", parts)
    assert result.size == len(data)
    assert (await store.head("big/object")).size == len(data)
    assert await store.get("big/object") == data
    boundary = 5 * MiB
    assert await store.get("big/object", boundary - 3, boundary + 3) == data[boundary - 3 : boundary + 3]


async def test_multipart_from_async_iterator_and_small_total(store):
    async def chunks():
        for index in range(4):
            yield bytes([index]) * 1000

    result = await store.put_multipart("small", chunks())
    assert result.size == 4000
    assert await store.get("small") == b"".join(bytes([i]) * 1000 for i in range(4))
    assert (await store.put_multipart("none", [])).size == 0
    assert await store.get("none") == b""


async def test_multipart_failure_leaves_no_object(store):
    async def failing():
        yield os.urandom(6 * MiB)
        raise RuntimeError("producer died")

    with pytest.raises(RuntimeError, match="producer died"):
        await store.put_multipart("broken", failing())
    assert not await store.exists("broken")
    assert await keys_of(store) == []


async def test_large_put_is_atomic_and_readable(store):
    data = os.urandom(17 * MiB)  # above the S3 multipart threshold
    await store.put("large", data)
    assert await store.get("large") == data


# -- hostile keys ------------------------------------------------------------------------------

HOSTILE_KEYS = [
    "",
    "/abs",
    "../escape",
    "a/../../b",
    "a//b",
    "a/",
    "./a",
    "a/.",
    "a\x00b",
    "new\nline",
    "x" * 1025,
    "\ud800",
    "back\\slash",
]


async def test_hostile_keys_are_rejected_everywhere(store):
    for key in HOSTILE_KEYS:
        for operation in (
            lambda: store.put(key, b"x"),
            lambda: store.put(key, b"x", if_none_match=True),
            lambda: store.get(key),
            lambda: store.head(key),
            lambda: store.delete_many(["fine", key]),
            lambda: store.put_multipart(key, [b"x"]),
        ):
            with pytest.raises(ValueError):
                await operation()
    with pytest.raises(ValueError):
        await store.put(123, b"x")  # type: ignore[arg-type]
    assert await keys_of(store) == []


async def test_keys_with_url_and_filesystem_special_characters_round_trip(store):
    keys = [
        "a b",
        "a+b",
        "100%",
        "q?x=1&y=2",
        "h#f",
        "x%2Fy",
        "\u00fc/\u00e4",
        ".hidden",
        "..dots",
        "~tilde",
        "%25",
        "%obj",
        "%lock",
        ".%tmp-x",
        "emoji-\U0001f600",
    ]
    for key in keys:
        await store.put(key, key.encode())
    for key in keys:
        assert await store.get(key) == key.encode(), key
    assert await keys_of(store) == sorted(keys, key=lambda k: k.encode())


KEY_ALPHABET = "ab-./% +~\u00e9\U0001f600?#&=:@*!,;'()[]{}$^`|\"<>\t"


def _portable(key: str) -> bool:
    from automq.broker.objectstore.base import validate_key

    try:
        validate_key(key)
    except ValueError:
        return False
    return True


def test_arbitrary_valid_keys_round_trip_and_list_in_byte_order(store_url):
    """Property: any key validate_key accepts is stored under exactly that name (no server or
    filesystem rewriting) and listed in UTF-8 byte order."""
    keys_strategy = st.lists(
        st.text(alphabet=KEY_ALPHABET.replace("\t", ""), min_size=1, max_size=12).filter(_portable),
        min_size=1,
        max_size=6,
        unique=True,
    )
    with asyncio.Runner() as runner:
        store = open_object_store(store_url)
        round_number = iter(range(10_000))

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given(keys=keys_strategy)
        def check(keys: list[str]) -> None:
            base = f"r{next(round_number):04d}/"
            for key in keys:
                runner.run(store.put(base + key, key.encode()))
            listed = runner.run(keys_of(store, base))
            assert listed == sorted((base + k for k in keys), key=lambda k: k.encode())
            for key in keys:
                assert runner.run(store.get(base + key)) == key.encode()
            runner.run(store.delete_many([base + k for k in keys]))
            assert runner.run(keys_of(store, base)) == []

        try:
            check()
        finally:
            runner.run(store.close())


def test_one_store_serves_successive_event_loops(store_url):
    """Spark tasks and scripts call asyncio.run repeatedly with the same store object."""
    store = open_object_store(store_url)

    async def write_and_read(n: int) -> bytes:
        # more than max_concurrency at once, so the local store's semaphore really waits
        await asyncio.gather(*(store.put(f"loop-{n}/{i}", b"%d" % i) for i in range(40)))
        return await store.get(f"loop-{n}/3")

    for n in range(3):
        assert asyncio.run(write_and_read(n)) == b"3"
    asyncio.run(store.close())
    assert asyncio.run(keys_of(store, "loop-2/")) == sorted(f"loop-2/{i}" for i in range(40))
    asyncio.run(store.close())


async def test_conditional_replace_racing_writers_exactly_one_wins(store_url):
    async with open_object_store(store_url) as first, open_object_store(store_url) as second:
        current = await first.put("cas", b"start")
        for round_number in range(3):

            async def attempt(writer: int) -> tuple[int, str] | None:
                store = first if writer % 2 else second
                try:
                    # distinct payloads: equal bytes would keep the ETag (ABA), not a race
                    result = await store.put(
                        "cas", b"round-%d-writer-%d" % (round_number, writer), if_match=current.etag
                    )
                except PreconditionFailed:
                    return None
                return writer, result.etag

            outcomes = [o for o in await asyncio.gather(*(attempt(w) for w in range(12))) if o is not None]
            assert len(outcomes) == 1, f"round {round_number}: winners {outcomes}"
            winner, etag = outcomes[0]
            assert await first.get("cas") == b"round-%d-writer-%d" % (round_number, winner)
            current = await first.head("cas")
            assert current.etag == etag


async def test_put_parts_stores_the_concatenation_with_the_tag_put_gives(store, tmp_path):
    """The uploader's objects: many batches, written without joining them first (file://)."""
    small = [b"a" * 10, memoryview(b"xyz" * 1000)[5:], b"", bytes(range(256)) * 3]
    big = [os.urandom(n) for n in (1000, 300 << 10, 7, 64 << 10)] * 40  # > 8 MiB: a CRC tag on file://
    for name, parts in (("small", small), ("big", big), ("empty", [])):
        joined = b"".join(parts)
        result = await store.put_parts(f"parts/{name}", parts)
        assert result.size == len(joined)
        assert await store.get(f"parts/{name}") == joined
        assert (await store.head(f"parts/{name}")).etag == result.etag
        same = await store.put(f"whole/{name}", joined)
        assert same.etag == result.etag  # content-derived, however it was written
