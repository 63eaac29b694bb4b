"""The controller's https listener, which answers a plain-HTTP request with a clear error
(or, while a cluster switches schemes, serves it).

aiohttp's own TLS site hands every connection to the TLS handshake, so a caller still using
`http://` (a node config from before TLS was turned on, a curl without the scheme) sees only
"server disconnected". Here each accepted socket is peeked at first: a TLS ClientHello starts
with the handshake record type 0x16 and goes on to the TLS handshake and the API; anything else
gets one `400` naming the setting (`CONTROLLER_AUTHENTICATION_FAILED`, which `ControllerClient`
raises at once instead of retrying until its deadline) and is closed. Nothing of the API,
probes included, is served in clear text on this port.

Unless `plain_http` (`security.controller_plain_http`): then a connection that does not start
with a TLS record goes to the same API unencrypted. That is the transition phase of a rolling
switch between http and https (automq.operator.controller_scheme): the controllers accept both
on their one port while their clients are restarted with the other scheme, so no client ever
speaks a scheme its controller does not serve. The first byte decides: an HTTP request starts
with a method name (ASCII letters), never with 0x16.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
from typing import Any

log = logging.getLogger(__name__)

TLS_HANDSHAKE_RECORD = 0x16
PEEK_TIMEOUT_S = 10.0  # a connection that sends nothing this long is closed
DRAIN_TIMEOUT_S, DRAIN_MAX_BYTES = 1.0, 65536  # what is read of a refused plain-HTTP request


def plain_http_refusal() -> bytes:
    body = json.dumps(
        {
            "error": "CONTROLLER_AUTHENTICATION_FAILED",
            "message": "this controller serves its API over https only (security.controller_tls): "
            "call it with an https:// URL and trust the cluster CA (security.controller_ca_file or "
            "AUTOMQ_CONTROLLER_CA_FILE)",
        }
    ).encode()
    head = (
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class TlsOnlySite:
    """Accepts on (host, port), sends TLS connections to `protocol_factory` (aiohttp's server)."""

    def __init__(
        self,
        protocol_factory: Any,
        host: str,
        port: int,
        context: ssl.SSLContext,
        handshake_timeout_s: float,
        *,
        plain_http: bool = False,
    ) -> None:
        self._factory = protocol_factory
        self.plain_http = plain_http
        self._context = context
        self._handshake_timeout_s = handshake_timeout_s
        self._sock = socket.create_server((host, port), backlog=1024, reuse_port=False)
        self._sock.setblocking(False)
        self._accepting: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def start(self) -> None:
        self._accepting = asyncio.get_running_loop().create_task(self._accept(), name="controller-https-accept")

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        for task in list(self._pending):
            task.cancel()
        self._sock.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and the like: keep the listener alive
                log.warning("controller https listener: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            task = loop.create_task(self._serve(conn))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            first = await asyncio.wait_for(self._peek(conn), PEEK_TIMEOUT_S)
            if first and first[0] == TLS_HANDSHAKE_RECORD:
                await loop.connect_accepted_socket(
                    self._factory, conn, ssl=self._context, ssl_handshake_timeout=self._handshake_timeout_s
                )
                return
            if first and self.plain_http:
                await loop.connect_accepted_socket(self._factory, conn)
                return
            if first:
                await loop.sock_sendall(conn, plain_http_refusal())
                conn.shutdown(socket.SHUT_WR)
                # Read what the client sent before closing: a socket closed with unread bytes
                # sends a reset, which can destroy the answer before the client reads it.
                await asyncio.wait_for(self._drain(conn), DRAIN_TIMEOUT_S)
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            log.debug("controller https listener: connection dropped: %s", exc)
        conn.close()

    @staticmethod
    async def _drain(conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        left = DRAIN_MAX_BYTES
        while left > 0 and (chunk := await loop.sock_recv(conn, min(left, 16384))):
            left -= len(chunk)

    @staticmethod
    async def _peek(conn: socket.socket) -> bytes:
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()
        fd = conn.fileno()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, ready)
        try:
            await readable
        finally:
            loop.remove_reader(fd)
        return conn.recv(1, socket.MSG_PEEK)
