"""Relay one client connection to a real server: what the S3 fault tests' proxies do with
every request they let through."""

from __future__ import annotations

import asyncio


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, head: bytes = b"") -> None:
    """Send `head` (bytes already read from the client) and then everything else the client
    sends to 127.0.0.1:`port`, and the server's bytes back, until either side closes."""
    upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
    if head:
        upstream_writer.write(head)

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))
