"""The Kafka protocol TCP server: framing, per-connection pipelining, limits, idle clients.

One `KafkaConnection` (an asyncio Protocol) per client. Frames are `[int32 size][request]`.
Requests are decoded as they arrive and each runs as its own task, so a Produce waiting for
the WAL sync does not stop a Fetch behind it from being parsed and served; responses are
written strictly in request order (Kafka's per-connection ordering guarantee).

Which requests may overlap: Produce, Fetch, ListOffsets, Metadata and ApiVersions run
concurrently with each other (Produce appends still reserve offsets in request order, because
tasks start in creation order and a produce reserves before its first await). Any other API
(group, admin, producer id...) waits for everything before it and holds back everything after
it, which is how a Java broker treats every request (it mutes the channel while one is in
flight).

Hostile input, as a Java broker answers it:
- a size < 0 or > socket_request_max_bytes → close (InvalidReceiveException);
- an unknown api key, a body that does not decode → log, close (InvalidRequestException);
- an unsupported version: ApiVersions is answered (v0 body, UNSUPPORTED_VERSION, with our
  ranges) per KIP-511; any other api → close;
- nothing received for connections_max_idle_ms (and nothing in flight) → close;
- a client that does not read its responses: reading pauses when the write buffer is full.
A handler that raises answers its request with UNKNOWN_SERVER_ERROR; the connection stays.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers import registry

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
CONCURRENT_APIS = frozenset({0, 1, 2, 3, 18})
MAX_IN_FLIGHT = 100  # per connection; reading pauses beyond this (Kafka: queued.max.requests)
WRITE_HIGH_WATER = 8 << 20


@dataclass(slots=True)
class _Slot:
    correlation_id: int
    done: bool = False
    payload: list | None = None  # response chunks (header + body), without the size prefix
    close_after: bool = False


SCRATCH_BYTES = 256 << 10  # frames up to half of this are cut from a shared receive buffer
FRAME_CHUNK_BYTES = 2 << 20  # a large frame's buffer starts at this and doubles as bytes arrive


class KafkaConnection(asyncio.BufferedProtocol):
    """Reads straight into buffers (BufferedProtocol): small frames are sliced out of a
    scratch buffer, a large frame (a produce batch) gets its own bytearray that the socket
    fills directly, so its bytes are not copied again before they are decoded."""

    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        self.broker = server.broker
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._scratch = bytearray(SCRATCH_BYTES)
        self._have = 0  # bytes of _scratch holding received data
        self._frame: bytearray | None = None  # a large frame being filled
        self._frame_filled = 0
        self._frame_size = 0
        self._slots: collections.deque[_Slot] = collections.deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_serial: asyncio.Task[None] | None = None  # last non-concurrent request
        self._since_serial: list[asyncio.Task[None]] = []  # concurrent requests after it
        self._last_activity = time.monotonic()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._closing = False
        self._closing_gracefully = False  # shutting down: read nothing more, answer what is in flight
        self._max_frame = self.broker.config.kafka.socket_request_max_bytes
        self._idle_s = self.broker.config.kafka.connections_max_idle_ms / 1000.0
        self._served = server.served

    # ---------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        self.server.connections.add(self)
        self.broker.metrics.connections.inc()
        self._schedule_idle_check(self._idle_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.server.connections.discard(self)
        self.broker.metrics.connections.dec()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        for task in self._tasks:
            task.cancel()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        frame = self._frame
        if frame is not None:
            if self._frame_filled == len(frame):
                # grow with what arrives: a client declaring a large frame and sending nothing
                # more holds only what it sent, not socket_request_max_bytes
                grow = min(self._frame_size - len(frame), max(len(frame), FRAME_CHUNK_BYTES))
                try:
                    frame += bytes(grow)
                except BufferError:  # a view of it is still alive: move to a new buffer
                    frame = self._frame = frame + bytes(grow)
            return memoryview(frame)[self._frame_filled :]
        return memoryview(self._scratch)[self._have :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._closing:
            return
        self._last_activity = time.monotonic()
        self.broker.metrics.network_in.inc(nbytes)
        if self._frame is not None:
            self._frame_filled += nbytes
            if self._frame_filled == self._frame_size:
                frame, self._frame = self._frame, None
                self._on_frame(frame)
                self._update_reading()
            return
        self._have += nbytes
        scratch = self._scratch
        position, have = 0, self._have
        while have - position >= 4:
            (size,) = _SIZE.unpack_from(scratch, position)
            if size < 0 or size > self._max_frame:
                self._abort(
                    "oversized", f"request size {size} is outside 0..{self._max_frame} (socket_request_max_bytes)"
                )
                return
            available = have - position - 4
            if available >= size:
                frame = bytes(scratch[position + 4 : position + 4 + size])  # a copy: scratch is reused
                position += 4 + size
                self._on_frame(frame)
                if self._closing:
                    return
                continue
            if size > SCRATCH_BYTES // 2:
                # a large frame: its own buffer, filled by the socket from now on
                frame = bytearray(min(size, max(available, FRAME_CHUNK_BYTES)))
                frame[:available] = scratch[position + 4 : have]
                self._frame, self._frame_filled, self._frame_size = frame, available, size
                position = have
            break
        if position:
            remaining = have - position
            if remaining:
                scratch[:remaining] = scratch[position:have]
            self._have = remaining
        self._update_reading()

    # kept for transports that only speak the plain Protocol interface
    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._closing:
            target = self.get_buffer(len(view))
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            self.buffer_updated(n)

    # ---------------------------------------------------------------- requests

    def _on_frame(self, frame: bytes | bytearray) -> None:
        try:
            decoded = codec.decode_request(frame, self._served)
        except codec.UnsupportedVersionError as exc:
            if exc.api_key == codec.API_VERSIONS_KEY:
                self._answer_unsupported_api_versions(exc.correlation_id)
            else:
                self._abort(
                    "unsupported_version",
                    f"{codec.api_name(exc.api_key)} v{exc.api_version} is not supported (served: {self._served.get(exc.api_key)})",
                )
            return
        except codec.UnknownApiKeyError as exc:
            self._abort("unknown_api_key", f"unknown api key {exc.api_key}")
            return
        except codec.FrameError as exc:
            self._abort("invalid_request", str(exc))
            return
        header = decoded.header
        slot = _Slot(header.correlation_id)
        self._slots.append(slot)
        ctx = RequestContext(
            api_key=header.api_key,
            api_version=header.api_version,
            correlation_id=header.correlation_id,
            client_id=header.client_id,
            peer=self.peer,
            response_class=decoded.response_class,
            broker=self.broker,
        )
        concurrent = header.api_key in CONCURRENT_APIS
        if concurrent:
            waits_for = [self._last_serial] if self._last_serial is not None and not self._last_serial.done() else []
        else:
            waits_for = [t for t in self._tasks if not t.done()]
        task = asyncio.get_running_loop().create_task(self._handle(decoded, ctx, slot, waits_for))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        if not concurrent:
            self._last_serial = task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._update_reading()

    async def _handle(
        self, decoded: codec.DecodedRequest, ctx: RequestContext, slot: _Slot, waits_for: list[asyncio.Task[None]]
    ) -> None:
        if waits_for:
            await asyncio.gather(*waits_for, return_exceptions=True)
        reg = registry.lookup(ctx.api_key)
        api = codec.api_name(ctx.api_key)
        metrics = self.broker.metrics
        started = time.perf_counter()
        payload: bytes | None
        try:
            response = await reg.handler(decoded.request, ctx)  # type: ignore[union-attr]
            if response is codec.CLOSE_CONNECTION:
                slot.close_after = True
                payload = None
            else:
                payload = None if response is None else codec.encode_response_chunks(ctx.correlation_id, response)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "%s v%d from %s (client %s) failed; answering UNKNOWN_SERVER_ERROR",
                api,
                ctx.api_version,
                ctx.peer,
                ctx.client_id,
            )
            metrics.request_errors.labels(api).inc()
            try:
                payload = codec.encode_response_chunks(
                    ctx.correlation_id, codec.error_response(ctx.response_class, ErrorCode.unknown_server_error)
                )
            except Exception:
                log.exception(
                    "cannot even encode an error response for %s v%d; closing %s", api, ctx.api_version, ctx.peer
                )
                slot.close_after = True
                payload = None
        metrics.record_request(api, time.perf_counter() - started)
        slot.payload = payload
        slot.done = True
        self._flush()

    def _answer_unsupported_api_versions(self, correlation_id: int) -> None:
        from kio.schema.api_versions.v0.response import ApiVersionsResponse

        from automq.broker.kafka.handlers.api_versions import api_versions_response

        response = api_versions_response(ApiVersionsResponse, ErrorCode.unsupported_version)
        slot = _Slot(correlation_id, done=True, payload=codec.encode_response_chunks(correlation_id, response))
        self._slots.append(slot)
        self._flush()

    def _flush(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        while self._slots and self._slots[0].done:
            slot = self._slots.popleft()
            if slot.payload is not None:
                self.broker.metrics.network_out.inc(_write_frame(transport, slot.payload))
                self._last_activity = time.monotonic()
            if slot.close_after:
                transport.close()
                return
        if self._closing_gracefully and not self._slots:
            transport.close()

    # ---------------------------------------------------------------- flow control, idle, close

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        should_pause = self._writing_paused or len(self._tasks) >= MAX_IN_FLIGHT or self._closing_gracefully
        if should_pause and not self._reading_paused:
            transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            transport.resume_reading()
            self._reading_paused = False

    def _schedule_idle_check(self, delay: float) -> None:
        if self._idle_s <= 0:
            return
        self._idle_timer = asyncio.get_running_loop().call_later(delay, self._idle_check)

    def _idle_check(self) -> None:
        if self._closing:
            return
        idle = time.monotonic() - self._last_activity
        if idle >= self._idle_s and not self._tasks:
            self._abort("idle", f"idle for {idle:.0f}s (connections_max_idle_ms)", level=logging.INFO)
            return
        self._schedule_idle_check(max(self._idle_s - idle, 0.05) if not self._tasks else self._idle_s)

    def _abort(self, reason: str, message: str, level: int = logging.WARNING) -> None:
        log.log(level, "closing connection from %s: %s", self.peer, message)
        self.broker.metrics.connections_closed.labels(reason).inc()
        self._closing = True
        self._frame = None
        if self.transport is not None:
            # what was answered already goes out first (e.g. ApiVersions before a bad frame)
            self._flush_done_only()
            self.transport.close()

    def _flush_done_only(self) -> None:
        transport = self.transport
        while self._slots and self._slots[0].done and transport is not None:
            slot = self._slots.popleft()
            if slot.payload is not None:
                self.broker.metrics.network_out.inc(_write_frame(transport, slot.payload))

    async def drain_and_close(self, timeout: float) -> None:
        """Graceful shutdown: read nothing more, answer what is in flight, then close."""
        self._closing_gracefully = True
        self._update_reading()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)
        self._flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def _write_frame(transport: asyncio.Transport, chunks: list) -> int:
    """Writes one size-prefixed frame; returns the bytes handed to the transport."""
    size = 0
    for chunk in chunks:
        size += len(chunk)
    if len(chunks) == 1:
        transport.write(_SIZE.pack(size) + chunks[0])
    else:
        transport.writelines([_SIZE.pack(size), *chunks])
    return size + 4


class KafkaServer:
    """Listens on every configured listener; `served` is the api → version range table.

    `bind()` opens the sockets first (so port 0 resolves to a real port that can be
    advertised when registering with the controller); `start()` begins accepting."""

    def __init__(self, broker: Broker | None = None, config=None) -> None:
        self.broker = broker
        self.config = config if config is not None else broker.config  # type: ignore[union-attr]
        self.connections: set[KafkaConnection] = set()
        self.served = registry.served_ranges()
        self._servers: list[asyncio.AbstractServer] = []
        self._sockets: dict[str, socket.socket] = {}
        self.bound_ports: dict[str, int] = {}

    def bind(self) -> dict[str, int]:
        for listener in self.config.listeners:
            if listener.name in self._sockets:
                continue
            host = listener.host or None
            sock = socket.create_server((host or "", listener.port), backlog=1024, reuse_port=False)
            sock.setblocking(False)
            self._sockets[listener.name] = sock
            self.bound_ports[listener.name] = sock.getsockname()[1]
        return dict(self.bound_ports)

    async def start(self) -> dict[str, int]:
        if self.broker is None:
            raise RuntimeError("KafkaServer.start needs a broker")
        self.bind()
        loop = asyncio.get_running_loop()
        for name, sock in self._sockets.items():
            server = await loop.create_server(lambda: KafkaConnection(self), sock=sock)
            self._servers.append(server)
            log.info("Kafka listener %s on %s", name, sock.getsockname())
        return dict(self.bound_ports)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, finish in-flight requests (up to timeout), close connections."""
        for server in self._servers:
            server.close()
        for _name, sock in self._sockets.items():
            if not self._servers:
                sock.close()
        await asyncio.gather(*(c.drain_and_close(timeout) for c in list(self.connections)), return_exceptions=True)
        for server in self._servers:
            try:
                await asyncio.wait_for(server.wait_closed(), 1.0)
            except TimeoutError:
                pass
