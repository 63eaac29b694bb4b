"""S3-only: `get_into` reads a long range as parallel ranged GETs into the caller's buffer.

The parts must land where they belong, never mix two versions of a key, stay within
`read_concurrency`, and never write into the buffer after `get_into` has returned or raised
(the reader lends it to the next read at once)."""

from __future__ import annotations

import asyncio
import os
import random

import pytest
from http_relay import relay as relay_to
from http_relay import slow_down

from automq.broker.objectstore import ObjectNotFound, ObjectStoreError, ObjectStoreUnavailable, open_object_store

pytestmark = pytest.mark.s3
KiB, MiB = 1 << 10, 1 << 20
PARTS = f"&read_part_size={64 * KiB}&read_concurrency=3"


async def test_ranges_read_in_parts_match_slicing(s3_url):
    data = os.urandom(MiB + 777)
    rng = random.Random(7)
    async with open_object_store(s3_url + PARTS) as store:
        await store.put("big", data)
        cases = [(0, len(data)), (0, len(data) + 5000), (1, 96 * KiB), (1, 96 * KiB + 1), (len(data) - 1, 300 * KiB)]
        cases += [(rng.randrange(len(data)), rng.randrange(1, 400 * KiB)) for _ in range(40)]
        for start, length in cases:
            buffer = bytearray(b"\xee") * length
            gets = store.stats.gets
            n = await store.get_into("big", start, memoryview(buffer))
            assert n == min(length, len(data) - start)
            assert buffer[:n] == data[start : start + n]
            assert buffer[n:] == b"\xee" * (length - n)
            # one GET when the range is within 1.5 parts, else one per 64 KiB part
            first = length if length <= 96 * KiB else 64 * KiB
            expected = 1 if n <= first else 1 + -(-(n - first) // (64 * KiB))
            assert store.stats.gets - gets == expected, (start, length)
        with pytest.raises(ObjectNotFound):
            await store.get_into("big", len(data), memoryview(bytearray(200 * KiB)))
        with pytest.raises(ObjectNotFound):
            await store.get_into("missing", 0, memoryview(bytearray(200 * KiB)))
        await store.put("empty", b"")
        assert await store.get_into("empty", 0, memoryview(bytearray(200 * KiB))) == 0


async def test_an_object_replaced_between_parts_is_an_error_not_a_mix(s3_url):
    """The later parts ask for the first part's ETag; an object replaced meanwhile (by a
    writer that breaks the write-once rule) fails the read instead of mixing versions."""
    old, new = os.urandom(512 * KiB), os.urandom(512 * KiB)
    async with open_object_store(s3_url + PARTS) as store:
        await store.put("k", old)
        get_part = store._get_part
        replaced = False

        async def replacing(key, offset, view, if_match, learned):
            nonlocal replaced
            if if_match is not None and not replaced:
                replaced = True
                await store.put("k", new)
            return await get_part(key, offset, view, if_match, learned)

        store._get_part = replacing
        with pytest.raises(ObjectStoreError, match="replaced while it was read"):
            await store.get_into("k", 0, memoryview(bytearray(len(old))))
        assert replaced
        buffer = bytearray(len(new))
        assert await store.get_into("k", 0, memoryview(buffer)) == len(new)
        assert buffer == new


async def test_parts_in_flight_stay_within_read_concurrency(s3_url):
    data = os.urandom(2 * MiB)
    async with open_object_store(s3_url + PARTS) as store:
        await store.put("k", data)
        call = store._call
        in_flight = peak = 0

        async def counting(op, key, attempt, on_precondition=None):
            nonlocal in_flight, peak
            if op != "get":
                return await call(op, key, attempt, on_precondition)
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                await asyncio.sleep(0.01)  # long enough for every waiting part to try
                return await call(op, key, attempt, on_precondition)
            finally:
                in_flight -= 1

        store._call = counting
        buffers = [bytearray(len(data)) for _ in range(3)]
        # three reads at once share the store's three read slots
        counts = await asyncio.gather(*(store.get_into("k", 0, memoryview(b)) for b in buffers))
        assert counts == [len(data)] * 3
        assert all(b == data for b in buffers)
        assert peak == 3


def stalling_proxy(target_port: int, faults: dict[str, bytes], stall_s: float):
    """Relays to the real server, except that a GET whose Range starts with faults["stall"]
    waits `stall_s` before it is relayed, and one whose Range starts with faults["fail"] gets
    503 SlowDown (while they are set)."""

    async def relay(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            ranges = [line for line in head.split(b"\r\n") if line.lower().startswith(b"range:")]
            wanted = ranges[0].split(b"=", 1)[1] if ranges else b""
            if faults.get("fail") and wanted.startswith(faults["fail"]):
                await slow_down(writer)
                return
            if faults.get("stall") and wanted.startswith(faults["stall"]):
                await asyncio.sleep(stall_s)
            # one request per connection, so that every request passes the checks above
            lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
            await relay_to(reader, writer, target_port, b"\r\n".join([*lines[:-2], b"Connection: close", b"", b""]))
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass

    return relay


@pytest.mark.parametrize("how", ["a part fails", "the caller is cancelled"])
async def test_no_part_writes_into_the_buffer_after_get_into_is_done(seaweedfs, s3_url, how):
    """One part is held back by the server; another fails for good (or the caller gives
    up). get_into raises, and only after every part has stopped: nothing lands in the
    buffer afterwards, when the reader may already have lent it to another read."""
    data = os.urandom(512 * KiB)
    async with open_object_store(s3_url) as direct:
        await direct.put("k", data)
    target_port = int(seaweedfs.endpoint.rsplit(":", 1)[1])
    faults = {"stall": b"%d-" % (64 * KiB)}
    if how == "a part fails":
        faults["fail"] = b"%d-" % (128 * KiB)
    proxy = await asyncio.start_server(stalling_proxy(target_port, faults, 0.5), "127.0.0.1", 0)
    url = s3_url.replace(seaweedfs.endpoint, f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}")
    try:
        async with open_object_store(url + PARTS + "&max_attempts=2&backoff_ms=10") as store:
            buffer = bytearray(len(data))
            read = asyncio.ensure_future(store.get_into("k", 0, memoryview(buffer)))
            if how == "a part fails":
                with pytest.raises(ObjectStoreUnavailable, match="SlowDown"):
                    await read
            else:
                await asyncio.sleep(0.2)  # the held-back part is in flight
                read.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await read
            buffer[:] = b"\x00" * len(buffer)
            await asyncio.sleep(0.6)  # past the held-back part's release
            assert buffer == b"\x00" * len(buffer)
            # and the store reads normally once the server does
            faults.clear()
            again = bytearray(len(data))
            assert await store.get_into("k", 0, memoryview(again)) == len(data)
            assert again == data
    finally:
        proxy.close()
        await proxy.wait_closed()


def test_parts_land_in_the_buffer_under_uvloop(s3_url):
    """The broker runs on uvloop, whose transports receive into a BufferedProtocol's buffer
    themselves (and are not asyncio.Transport subclasses)."""
    import uvloop

    data = os.urandom(3 * MiB + 5)

    async def main() -> None:
        async with open_object_store(s3_url + f"&read_part_size={MiB}") as store:
            await store.put("k", data)
            for _ in range(2):  # the second time over kept-alive connections
                buffer = bytearray(4 * MiB)
                assert await store.get_into("k", 1, memoryview(buffer)) == len(data) - 1
                assert buffer[: len(data) - 1] == data[1:]

    uvloop.run(main())


async def test_a_refused_presigned_url_is_signed_again_next_time(s3_url):
    """URLs are signed once per few minutes; one the server refuses (credentials expired
    since it was signed) is an AccessDenied now and not used again."""
    from automq.broker.objectstore import AccessDenied

    async with open_object_store(s3_url + PARTS) as store:
        await store.put("k", b"v" * 1000)
        buffer = bytearray(1000)
        assert await store.get_into("k", 0, memoryview(buffer)) == 1000
        url, until = store._presigned["k"]
        assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url  # SigV4: AWS regions since 2014 refuse v2
        store._presigned["k"] = (url.replace("X-Amz-Signature=", "X-Amz-Signature=0"), until)
        with pytest.raises(AccessDenied):
            await store.get_into("k", 0, memoryview(buffer))
        assert await store.get_into("k", 0, memoryview(buffer)) == 1000
        assert buffer == b"v" * 1000


def test_one_store_read_from_one_event_loop_after_another(s3_url):
    """A store outlives event loops (asyncio.run per Spark task, per test): the kept-alive
    connections of a loop that has finished are dropped, not used or closed through it."""
    data = os.urandom(300 * KiB)
    store = open_object_store(s3_url + PARTS)

    async def read() -> bytes:
        buffer = bytearray(len(data))
        assert await store.get_into("k", 0, memoryview(buffer)) == len(data)
        return bytes(buffer)

    async def first() -> bytes:
        await store.put("k", data)
        return await read()

    assert asyncio.run(first()) == data
    assert asyncio.run(read()) == data  # the first loop is closed by now

    async def last() -> bytes:
        try:
            return await read()
        finally:
            await store.close()

    assert asyncio.run(last()) == data
