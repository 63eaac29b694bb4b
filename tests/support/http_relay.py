"""What the S3 fault tests' proxies share: relaying a client connection to the real server,
and answering a request with S3's throttling error instead."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


async def relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    port: int,
    head: bytes = b"",
    drop_reply: Callable[[bytes], bool] | None = None,
) -> None:
    """Send `head` (bytes already read from the client) and then everything else the client
    sends to 127.0.0.1:`port`, and the server's bytes back, until either side closes. A
    server chunk for which `drop_reply` is true is not relayed: the client's connection is
    cut instead (a reply lost on the way)."""
    upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
    if head:
        upstream_writer.write(head)

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, replies: bool) -> None:
        try:
            while data := await src.read(65536):
                if replies and drop_reply is not None and drop_reply(data):
                    writer.transport.abort()
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    await asyncio.gather(pump(reader, upstream_writer, False), pump(upstream_reader, writer, True))


async def slow_down(writer: asyncio.StreamWriter) -> None:
    """Answer with 503 SlowDown (what S3 sends when throttling) and close."""
    writer.write(
        b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(SLOW_DOWN), SLOW_DOWN)
    )
    await writer.drain()
    writer.close()
