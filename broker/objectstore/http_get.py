"""HTTP/1.1 GETs whose reply body is received straight into the caller's buffer.

aiohttp hands a body over as `bytes`: the event loop makes one per socket read, the HTTP
parser slices it, the stream reader may slice it again, and the caller copies it into its
own buffer. For the S3 store's catch-up reads (groups of up to 32 MiB) that was the broker's
event loop's main cost: a 2 GiB catch-up from SeaweedFS took 1.3 million page faults on the
loop thread, at ~3.3 ms of loop CPU per MiB (the file store, which `preadv`s into the
buffer: ~1.2 ms per MiB for the whole broker).

This module speaks just enough HTTP/1.1 for a GET answered with a Content-Length body: the
request goes out on a kept-alive connection, the reply's head is parsed from a small scratch
buffer, and from then on the socket receives (`recv_into`, through asyncio's
BufferedProtocol) into the caller's memoryview. Anything else (chunked replies, a body longer
than the buffer, a head over 64 KiB) is an error, never a guess. A connection whose exchange
failed or was cancelled is aborted at once: after `HttpGetPool.get` returns or raises, nothing more
is written into the buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

HEAD_LIMIT = 64 << 10
ERROR_BODY_LIMIT = 1 << 20


class HttpProtocolError(ConnectionError):
    """The server's reply is not what this client handles; the connection is dropped."""


class _Exchange(asyncio.BufferedProtocol):
    """One connection; one request/reply exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._scratch = bytearray(HEAD_LIMIT)
        self._head_len = 0
        self._target: memoryview | None = None  # set once the head is parsed
        self._got = 0
        self._view: memoryview | None = None
        self._on_head: Callable[[int, dict[str, str]], None] | None = None
        self._done: asyncio.Future[tuple[int, dict[str, str], int, bytes]] | None = None
        self._status = 0
        self._headers: dict[str, str] = {}
        self._error_body: bytearray | None = None

    # -- asyncio callbacks --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(exc or ConnectionResetError("the server closed the connection mid-reply"))

    def eof_received(self) -> bool:
        return False  # close; connection_lost reports an unfinished reply

    def get_buffer(self, sizehint: int) -> memoryview:
        # never empty (uvloop asks before every receive, also between exchanges)
        if self._done is None or self._done.done():
            return memoryview(self._scratch)  # idle: whatever arrives is an error
        if self._target is not None:
            return self._target[self._got :]  # not yet full, else the exchange would be done
        return memoryview(self._scratch)[self._head_len :]  # short of HEAD_LIMIT, else failed

    def buffer_updated(self, nbytes: int) -> None:
        if self._done is None or self._done.done():
            self._fail(HttpProtocolError("bytes from the server with no request waiting"))
            return
        if self._target is not None:
            self._got += nbytes
        else:
            self._head_len += nbytes
            end = self._scratch.find(b"\r\n\r\n", 0, self._head_len)
            if end < 0:
                if self._head_len >= HEAD_LIMIT:
                    self._fail(HttpProtocolError(f"reply head longer than {HEAD_LIMIT} bytes"))
                return
            try:
                self._start_body(end)
            except HttpProtocolError as exc:
                self._fail(exc)
                return
        if self._target is not None and self._got >= len(self._target):
            self._finish()

    # -- the exchange -------------------------------------------------------------------------

    def _start_body(self, end: int) -> None:
        lines = bytes(self._scratch[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        self._status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise HttpProtocolError(f"malformed header line {line[:100]!r}")
            headers[name.strip().lower()] = value.strip()
        self._headers = headers
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise HttpProtocolError("chunked reply bodies are not handled here")
        length_text = headers.get("content-length", "")
        if not length_text.isdigit():
            raise HttpProtocolError(f"reply without a Content-Length (got {length_text!r})")
        length = int(length_text)
        assert self._view is not None
        if 200 <= self._status < 300:
            if length > len(self._view):
                raise HttpProtocolError(f"a {length}-byte body for a {len(self._view)}-byte buffer")
            self._target = self._view[:length]
        else:
            if length > ERROR_BODY_LIMIT:
                raise HttpProtocolError(f"a {length}-byte error body")
            self._error_body = bytearray(length)
            self._target = memoryview(self._error_body)
        if self._on_head is not None:
            self._on_head(self._status, headers)
        leftover = memoryview(self._scratch)[end + 4 : self._head_len]
        if len(leftover) > len(self._target):
            raise HttpProtocolError("more bytes than the reply's Content-Length")
        self._target[: len(leftover)] = leftover
        self._got = len(leftover)

    def _finish(self) -> None:
        assert self._done is not None and self._target is not None
        body = bytes(self._error_body) if self._error_body is not None else b""
        self._done.set_result((self._status, self._headers, len(self._target), body))

    def _fail(self, exc: BaseException) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    async def exchange(
        self,
        request: bytes,
        view: memoryview,
        on_head: Callable[[int, dict[str, str]], None] | None,
    ) -> tuple[int, dict[str, str], int, bytes]:
        """Send `request`; the reply's status, headers (lower-case names), the body bytes
        received into `view` (2xx) and the body of an error reply."""
        self._scratch_reset()
        if self.lost or self.transport is None:
            raise ConnectionResetError("the server closed this kept-alive connection")
        self._view, self._on_head = view, on_head
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self._done

    def _scratch_reset(self) -> None:
        self._head_len, self._target, self._got, self._error_body = 0, None, 0, None
        self._status, self._headers = 0, {}

    def reusable(self) -> bool:
        connection = self._headers.get("connection", "").lower()
        return not self.lost and connection != "close" and self.transport is not None


class HttpGetPool:
    """Kept-alive connections to one origin (scheme://host:port), at most `idle_max` idle."""

    def __init__(self, origin: str, idle_max: int, ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) origin: {origin!r}")
        self.scheme, self.host = parts.scheme, parts.hostname
        default_port = 443 if parts.scheme == "https" else 80
        self.port = parts.port or default_port
        self._ssl = (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        self._idle: list[_Exchange] = []
        self._idle_max = idle_max
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal (hostname drops the brackets)
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"

    async def _connect(self) -> _Exchange:
        loop = asyncio.get_running_loop()
        _transport, protocol = await loop.create_connection(_Exchange, self.host, self.port, ssl=self._ssl)
        return protocol

    async def get(
        self,
        target: str,
        headers: dict[str, str],
        view: memoryview,
        on_head: Callable[[int, dict[str, str]], None] | None = None,
    ) -> tuple[int, dict[str, str], int, bytes]:
        """GET `target` (path and query) into `view`. A kept-alive connection the server
        closed meanwhile is replaced once, when the reply had not begun."""
        lines = [f"GET {target} HTTP/1.1", f"Host: {self.host_header}", "Accept-Encoding: identity"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        while True:
            self._idle = [c for c in self._idle if not c.lost]  # closed by the server while idle
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            try:
                result = await conn.exchange(request, view, on_head)
            except (ConnectionError, OSError) as exc:
                conn._fail(exc)
                if reused and conn._target is None and not isinstance(exc, HttpProtocolError):
                    continue  # a stale kept-alive connection: no reply had started
                raise
            except BaseException as exc:  # cancelled or timed out: stop receiving at once
                conn._fail(exc if isinstance(exc, Exception) else ConnectionAbortedError("cancelled"))
                raise
            if conn.reusable() and len(self._idle) < self._idle_max:
                self._idle.append(conn)
            elif conn.transport is not None:
                conn.transport.close()
            return result

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                # a pool left behind by a finished event loop: its sockets went with the loop
                with contextlib.suppress(RuntimeError):
                    conn.transport.close()
        self._idle.clear()
