"""The raw GET path (`http_get`) against hand-written servers: replies it must take, replies
it must refuse with a clear error, and connections that die or go stale."""

from __future__ import annotations

import asyncio

import pytest

from automq.broker.objectstore.http_get import HEAD_LIMIT, HttpGetPool, HttpProtocolError


async def serve(replies, one_per_connection=False):
    """A server answering each request (read up to its blank line) with the next of
    `replies` (bytes, or a callable taking the writer); returns (server, origin, requests)."""
    requests: list[bytes] = []
    queue = list(replies)

    async def handle(reader, writer):
        served = 0
        try:
            while queue and not (one_per_connection and served):
                head = await reader.readuntil(b"\r\n\r\n")
                requests.append(head)
                reply = queue.pop(0)
                if callable(reply):
                    await reply(writer)
                    return
                writer.write(reply)
                await writer.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", requests


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def test_body_lands_in_the_buffer_and_the_connection_is_kept():
    server, origin, requests = await serve([ok(b"hello world"), ok(b"again")])
    pool = HttpGetPool(origin, idle_max=2)
    seen = []
    try:
        buffer = bytearray(b"\xee" * 16)
        status, headers, n, body = await pool.get(
            "/b/k?sig=1", {"Range": "bytes=0-15"}, memoryview(buffer), lambda s, h: seen.append(s)
        )
        assert (status, n, body, bytes(buffer[:n]), bytes(buffer[n:])) == (206, 11, b"", b"hello world", b"\xee" * 5)
        assert headers["content-length"] == "11" and seen == [206]
        status, _, n, _ = await pool.get("/b/k", {}, memoryview(buffer))
        assert bytes(buffer[:n]) == b"again"
        assert len(requests) == 2  # both on the one kept-alive connection
        assert requests[0].startswith(b"GET /b/k?sig=1 HTTP/1.1\r\n") and b"Range: bytes=0-15\r\n" in requests[0]
    finally:
        pool.close()
        server.close()


async def test_an_error_reply_returns_its_status_and_body():
    xml = b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>"
    server, origin, _ = await serve([b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(xml), xml)])
    pool = HttpGetPool(origin, idle_max=2)
    try:
        status, _, _, body = await pool.get("/k", {}, memoryview(bytearray(4)))
        assert (status, body) == (404, xml)
    finally:
        pool.close()
        server.close()


@pytest.mark.parametrize(
    "reply, problem",
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "chunked"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100, "100-byte body for a 8-byte buffer"),
        (b"HTTP/1.1 200 OK\r\n\r\nhello", "without a Content-Length"),
        (b"SPDY/9 200 OK\r\nContent-Length: 1\r\n\r\nx", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\nContent-Length: 1\r\n\r\nx", "malformed header"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * HEAD_LIMIT + b"\r\n\r\n", "longer than"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabcdef", "more bytes than"),
    ],
)
async def test_replies_it_does_not_handle_are_clear_errors(reply, problem):
    server, origin, _ = await serve([reply])
    pool = HttpGetPool(origin, idle_max=2)
    try:
        with pytest.raises(HttpProtocolError, match=problem):
            await asyncio.wait_for(pool.get("/k", {}, memoryview(bytearray(8))), 5)
    finally:
        pool.close()
        server.close()


async def test_a_connection_cut_mid_body_is_an_error_and_nothing_lands_afterwards():
    async def cut(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        writer.transport.abort()

    server, origin, _ = await serve([cut])
    pool = HttpGetPool(origin, idle_max=2)
    try:
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(pool.get("/k", {}, memoryview(bytearray(16))), 5)
    finally:
        pool.close()
        server.close()


async def test_a_stale_kept_alive_connection_is_replaced_once():
    """The server closes a kept-alive connection between requests (its idle timeout): the
    next request notices before any reply began and goes out on a new connection."""
    first, origin, requests = await serve([ok(b"one"), ok(b"two")], one_per_connection=True)
    pool = HttpGetPool(origin, idle_max=2)
    try:
        buffer = bytearray(8)
        await pool.get("/k", {}, memoryview(buffer))
        await asyncio.sleep(0.1)  # the server closed it after its only reply
        status, _, n, _ = await pool.get("/k", {}, memoryview(buffer))
        assert (status, bytes(buffer[:n])) == (206, b"two")  # on a new connection
        assert len(requests) == 2
    finally:
        pool.close()
        first.close()


async def test_a_cancelled_get_stops_receiving_into_the_buffer():
    async def slow(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc")
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.write(b"def")
        await writer.drain()

    server, origin, _ = await serve([slow])
    pool = HttpGetPool(origin, idle_max=2)
    try:
        buffer = bytearray(b"\x00" * 6)
        task = asyncio.ensure_future(pool.get("/k", {}, memoryview(buffer)))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        buffer[:] = b"\x00" * 6
        await asyncio.sleep(0.4)
        assert buffer == b"\x00" * 6
    finally:
        pool.close()
        server.close()


def test_origin_must_be_http():
    with pytest.raises(ValueError, match="origin"):
        HttpGetPool("ftp://x", 1)
