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
- a request frame not complete request_frame_timeout_ms after its first byte → close (a
  client trickling a byte now and then is never idle, but never finishes either);
- more than max_connections connections, or than max_connections_per_ip (and its per-host
  overrides) from one address → the new connection is closed at once (Kafka instead leaves it
  in the listen backlog for max_connections; closing tells the client now);
- a client that does not read its responses: reading pauses when the write buffer is full;
- unfinished frames of all connections holding more than queued_max_request_bytes: a
  connection holding one pauses reading until memory is freed (as Kafka mutes channels when
  its request memory pool is empty), except the last one still reading, so one frame always
  progresses and a frame larger than the budget still completes.

Memory per connection: nothing is buffered for a connection between frames. The socket is
read into one receive buffer shared by all connections of the server (get_buffer and
buffer_updated run back to back on the loop thread); complete frames are cut from it and
only the bytes of an unfinished frame are kept, in a buffer of exactly what arrived. A large
frame gets its own buffer that the socket fills directly: its full size once a second read
of it arrives (up to WHOLE_FRAME_BYTES, and when that fits the memory budget), else grown as
its bytes arrive (never to the declared size up front). After a flood of connections closes, glibc is asked to
return freed memory to the system (malloc_trim).
A handler that raises answers its request with UNKNOWN_SERVER_ERROR; the connection stays.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import functools
import logging
import mmap
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from automq.broker import malloc
from automq.broker.config import Listener
from automq.broker.kafka import codec, quotas
from automq.broker.kafka.auth_session import ConnectionSession
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers import registry
from automq.broker.kafka.output import PacedOutput
from automq.broker.security.principal import PrincipalMapper, PrincipalMappingError, subject_dn
from automq.broker.security.scram import SaslAuthenticationError
from automq.broker.security.tls import ReloadingContext

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
CONCURRENT_APIS = frozenset({0, 1, 2, 3, 18})
QUOTA_GATED_APIS = frozenset({0, 1})  # byte-rate quotas: held while the connection is muted
MAX_IN_FLIGHT = 100  # per connection; reading pauses beyond this (Kafka: queued.max.requests)
WRITE_HIGH_WATER = 8 << 20


@dataclass(slots=True)
class _Slot:
    correlation_id: int
    done: bool = False
    payload: list[bytes | bytearray | memoryview] | None = (
        None  # response chunks (header + body), without the size prefix
    )
    close_after: bool = False


SCRATCH_BYTES = 256 << 10  # the server's shared receive buffer
LARGE_FRAME_BYTES = 64 << 10  # larger frames get their own buffer, filled by the socket
FRAME_CHUNK_BYTES = 64 << 10  # a large frame's buffer grows by this or by doubling, when bytes arrive
WHOLE_FRAME_BYTES = 4 << 20  # a frame up to this size gets its full buffer once its second read arrives
TRIM_AFTER_CLOSED = 256  # connections closed since the last malloc_trim that warrant another
SLAB_BYTES = 1 << 20  # Produce frames up to SLAB_FRAME_MAX are packed into slabs of this size
SLAB_FRAME_MAX = 256 << 10  # larger buffers are mmapped by malloc anyway (broker/malloc.py)
SLAB_SCAN = 64  # retired slabs looked at for free ones when no idle slab is left (~3 us)
SLAB_IDLE_S = 10.0  # no slab taken for this long: the idle ones go back to the system
SLAB_READY_LOW = 4  # with no idle slab, fewer fresh ones than this ready: make more ...
SLAB_READY_HIGH = 16  # ... up to this many, in a worker thread
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault a range in, writable, in one call


class FrameSlabs:
    """Produce frames of up to SLAB_FRAME_MAX, copied out of the shared receive buffer (or
    received in pieces straight into their region) one after another in 1 MiB slabs
    (anonymous mmaps) instead of one heap buffer each. Their record batches stay writable
    views of the slab all the way into the log cache (no kio copy per partition), and a slab
    is free again as one piece once the log cache has dropped every batch in it; a heap of
    per-request buffers freed in eviction order instead kept tens of MiB freed but resident
    (memory_bench's breakdown: 44-95 MiB "heap free" at 10 MiB/s).

    New memory is what costs: each 4 KiB page of a new mapping faults and is zeroed on first
    touch. On this project's VMs a new 1 MiB slab took 4.3-5.1 ms at the median on a broker's
    event loop at 10 MiB/s (~9 a second while the log cache fills, each a loop stall; at
    250 MiB/s of Produce a third of the loop's samples), a reused one 0.01 ms; letting a free
    one go costs ~0.1 ms, 64 at a time after each eviction. So:

    - a full slab is remembered; when a new one is needed, an idle slab is taken, or, with
      none left, the oldest remembered ones are looked at and those nothing refers to any more
      (no view of it alive anywhere: the log cache, the WAL, an upload, a Fetch response)
      become idle. What a region held before is never seen: a frame is decoded only once
      every byte of its region was written;
    - when no slab is free (the log cache is still filling: a fresh broker, or one that just
      took over partitions), fresh slabs come ready made: a worker thread maps them and faults
      their pages in (madvise MADV_POPULATE_WRITE, without the GIL), so the loop only maps one
      itself if that thread falls behind;
    - idle slabs are kept up to `max_idle` (the server passes one upload block's worth, what
      one log-cache eviction frees: the next Produce requests take them back), beyond that let
      go in a worker thread, and all let go SLAB_IDLE_S after the last slab was taken (Produce
      stopped). They are memory the log cache just gave up, so cache and idle slabs together
      stay near `storage.log_cache_bytes`, as before."""

    __slots__ = ("_expiry", "_fresh", "_idle", "_last_take", "_refill", "_retired", "_slab", "_used", "max_idle")

    def __init__(self, max_idle: int = 64) -> None:
        self._slab: mmap.mmap | None = None
        self._used = 0
        self._retired: collections.deque[mmap.mmap] = collections.deque()
        self._idle: list[mmap.mmap] = []
        self._fresh: list[mmap.mmap] = []  # made ahead, never used
        self._refill: asyncio.Future[list[mmap.mmap]] | None = None
        self.max_idle = max_idle
        self._last_take = 0.0
        self._expiry: asyncio.TimerHandle | None = None

    @property
    def idle(self) -> int:
        return len(self._idle) + len(self._fresh)

    def reserve(self, n: int) -> memoryview:
        """A writable region of `n` <= SLAB_FRAME_MAX bytes in the current slab (or a new one)."""
        if self._slab is None or self._used + n > len(self._slab):
            # (no local holding the full slab meanwhile: the scan would see it as in use)
            self._slab = self._next_slab()
            self._used = 0
        slab = self._slab
        start = self._used
        self._used = start + n
        return memoryview(slab)[start : start + n]

    def _next_slab(self) -> mmap.mmap:
        retired = self._retired
        if self._slab is not None:
            retired.append(self._slab)
            self._slab = None
        idle = self._idle
        if not idle:
            doomed = []
            for _ in range(min(len(retired), SLAB_SCAN)):
                slab = retired.popleft()
                # 2: `slab` here and getrefcount's argument. Every view of a slab holds it through
                # its memoryview's buffer, so 2 means no batch, write or response uses it.
                if sys.getrefcount(slab) > 2:
                    retired.append(slab)  # still in use: look again later
                elif len(idle) < self.max_idle:
                    idle.append(slab)
                else:
                    doomed.append(slab)
            _let_go(doomed)
        loop = _running_loop()
        if loop is not None:
            self._taken(loop)
        if idle:
            return idle.pop()
        if loop is not None and len(self._fresh) < SLAB_READY_LOW and self._refill is None:
            self._refill = loop.run_in_executor(None, _fresh_slabs, SLAB_READY_HIGH - len(self._fresh))
            self._refill.add_done_callback(self._refilled)
        return self._fresh.pop() if self._fresh else mmap.mmap(-1, SLAB_BYTES)

    def _refilled(self, future: asyncio.Future[list[mmap.mmap]]) -> None:
        self._refill = None
        if not future.cancelled() and future.exception() is None:
            self._fresh.extend(future.result())

    def _taken(self, loop: asyncio.AbstractEventLoop) -> None:
        self._last_take = loop.time()
        if self._expiry is None:
            self._expiry = loop.call_later(SLAB_IDLE_S, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_take < SLAB_IDLE_S:
            self._expiry = loop.call_at(self._last_take + SLAB_IDLE_S, self._expire)
            return
        doomed = self._idle + self._fresh
        self._idle, self._fresh = [], []
        _let_go(doomed)

    def copy(self, data: memoryview) -> memoryview:
        view = self.reserve(len(data))
        view[:] = data
        return view


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # used without a loop (tests): no refill, no expiry
        return None


def _let_go(slabs: list[mmap.mmap]) -> None:
    """Unmapping a slab takes ~0.1 ms: done in a worker thread when there is a loop."""
    if not slabs:
        return
    loop = _running_loop()
    if loop is not None:
        loop.run_in_executor(None, slabs.clear)
    else:
        slabs.clear()


def _fresh_slabs(n: int) -> list[mmap.mmap]:
    """In a worker thread: `n` new slabs, their pages faulted in without holding the GIL
    (ctypes lets it go for the call), so the loop never pays for them."""
    libc = malloc.libc()
    slabs = []
    for _ in range(n):
        slab = mmap.mmap(-1, SLAB_BYTES)
        area = (ctypes.c_char * SLAB_BYTES).from_buffer(slab)
        address = ctypes.addressof(area)
        if libc is None or libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(SLAB_BYTES), _MADV_POPULATE_WRITE):
            ctypes.memset(address, 0, SLAB_BYTES)  # an older kernel: touch every page instead
        del area
        slabs.append(slab)
    return slabs


class KafkaConnection(asyncio.BufferedProtocol):
    """Reads through the server's shared receive buffer (BufferedProtocol): small frames are
    cut from it, a large frame (a produce batch) gets its own bytearray that the socket fills
    directly, so its bytes are not copied again before they are decoded."""

    __slots__ = (
        "_closing",
        "_closing_gracefully",
        "_counted",
        "_frame",
        "_frame_filled",
        "_frame_size",
        "_frame_started",
        "_head",
        "_held",
        "_last_activity",
        "_last_produce",
        "_last_serial",
        "_memory_wait",
        "_output",
        "_quota_gate",
        "_reading_paused",
        "_slots",
        "_tasks",
        "_throttled",
        "_timer",
        "_unmute",
        "broker",
        "ip",
        "listener",
        "on_close",
        "peer",
        "server",
        "session",
        "transport",
    )

    def __init__(self, server: KafkaServer, listener: Listener | None = None) -> None:
        self.server = server
        self.listener = listener if listener is not None else server.config.listeners[0]
        self.session: ConnectionSession | None = None  # set on TLS / SASL listeners only
        assert server.broker is not None, "connections are accepted only once the broker is attached"
        self.broker: Broker = server.broker
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.ip = "?"
        self._head: bytearray | None = None  # the received part of an unfinished small frame
        self._frame: bytearray | memoryview | None = None  # a large frame being filled
        self._frame_filled = 0
        self._frame_size = 0
        self._frame_started = 0.0  # monotonic time of the unfinished frame's first byte; 0: none
        self._held = 0  # bytes of unfinished frames held, counted in server.buffered_bytes
        self._memory_wait = False  # reading paused: unfinished frames hold the whole budget
        self._slots: collections.deque[_Slot] = collections.deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_serial: asyncio.Task[None] | None = None  # last non-concurrent request
        self._last_produce: asyncio.Future[None] | None = None  # the last Produce's turn (context.py)
        self._last_activity = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._reading_paused = False
        self._output: PacedOutput | None = None
        self._throttled = False  # muted while a client quota's throttle time runs (KIP-219)
        self._unmute: asyncio.TimerHandle | None = None
        # while muted for a quota: Produce/Fetch read before the mute wait on it (resolved at
        # unmute, waking them in request order), as Kafka serves nothing more from a muted channel
        self._quota_gate: asyncio.Future[None] | None = None
        self._closing = False
        self._closing_gracefully = False  # shutting down: read nothing more, answer what is in flight
        self._counted = False  # in the server's connection counts
        # handlers' callbacks for when this connection closes, one per key (share sessions)
        self.on_close: dict[object, Callable[[], None]] = {}

    # ---------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._output = PacedOutput(self.transport, self._update_reading)  # type: ignore[arg-type]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.ip = peer[0]
            self.peer = f"{peer[0]}:{peer[1]}"
        else:
            self.ip = self.peer = str(peer)
        refusal = self.server.admit(self)
        if refusal is not None:
            self._abort(refusal[0], refusal[1])
            return
        if self.listener.security_protocol != "PLAINTEXT":
            try:
                self.session = self.server.new_session(self.listener, self.ip, transport)
            except PrincipalMappingError as exc:
                self.server.release(self)
                self._abort("ssl_principal", str(exc))
                return
        self._counted = True
        self.broker.metrics.connections.inc()
        self._arm(self.server.idle_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._head = self._frame = None
        if self._output is not None:
            self._output.discard()
        if self._memory_wait:
            self._memory_wait = False
            self.server.waiting.pop(self, None)
        self._account()
        if self._counted:
            self._counted = False
            self.server.release(self)
            self.broker.metrics.connections.dec()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._unmute is not None:
            self._unmute.cancel()
            self._unmute = None
        self._open_gate()
        for task in self._tasks:
            task.cancel()
        callbacks, self.on_close = list(self.on_close.values()), {}
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a connection-close callback failed")

    def pause_writing(self) -> None:
        if self._output is not None:
            self._output.transport_full()
        self._update_reading()

    def resume_writing(self) -> None:
        if self._output is not None:
            self._output.transport_drained()
        self._update_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        frame = self._frame
        if frame is not None:
            if self._frame_filled == len(frame):
                # grow with what arrives: a client declaring a large frame and sending nothing
                # more holds only what it sent, not socket_request_max_bytes
                server = self.server
                over = server.over_budget()
                rest = self._frame_size - len(frame)
                if self._frame_size <= WHOLE_FRAME_BYTES and server.buffered_bytes + rest <= server.max_buffered:
                    # more of it came: one buffer of its full size now, rather than a doubling
                    # series whose every step zero-fills and copies (profiled: 38 % of a
                    # producing broker's loop at 1 MB requests went to that)
                    whole: bytearray | memoryview
                    if self._frame_size <= SLAB_FRAME_MAX and self._is_produce(frame):
                        whole = server.slabs.reserve(self._frame_size)  # below malloc's mmap threshold
                    else:
                        whole = bytearray(self._frame_size)
                    whole[: self._frame_filled] = frame
                    frame = self._frame = whole
                    self._account()  # counted now: the next connection's read sees it
                else:
                    assert isinstance(frame, bytearray)  # a slab region is whole from the start
                    step = FRAME_CHUNK_BYTES if over else max(len(frame), FRAME_CHUNK_BYTES)
                    grow = min(rest, step)
                    try:
                        frame += bytes(grow)
                    except BufferError:  # a view of it is still alive: move to a new buffer
                        frame = self._frame = frame + bytes(grow)
            return memoryview(frame)[self._frame_filled :]
        return self.server.scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._closing:
            return
        now = self._last_activity = time.monotonic()
        self.broker.metrics.network_in.inc(nbytes)
        if self._frame is not None:
            self._frame_filled += nbytes
            if self._frame_filled == self._frame_size:
                frame, self._frame = self._frame, None
                self._frame_started = 0.0
                self._account()
                self._on_frame(frame)
            else:
                self._account()
        else:
            self._take(self.server.scratch[:nbytes], now)
            self._account()
        self._check_budget()
        self._update_reading()

    def _take(self, data: memoryview, now: float) -> None:
        """Cut the frames out of `data` (just received into the shared buffer); keep a copy of
        only the unfinished frame's bytes."""
        position, end = 0, len(data)
        head = self._head
        if head is not None:
            if len(head) < 4:
                take = min(4 - len(head), end)
                head += data[:take]
                position = take
                if len(head) < 4:
                    return
                if not self._size_ok(head):
                    return
            (size,) = _SIZE.unpack_from(head, 0)
            if size > LARGE_FRAME_BYTES:
                # only now is the size known (a head holds no body of a large frame): this
                # read may hold all of it, and what follows it
                self._head = None
                if end - position < size:
                    self._start_large(size, data[position:], b"")
                    return
                self._frame_started = 0.0
                self._on_frame(self._small_frame(data[position : position + size]))
                position += size
                if self._closing:
                    return
                head = None
        if head is not None:
            take = min(4 + size - len(head), end - position)
            head += data[position : position + take]
            position += take
            if len(head) < 4 + size:
                return
            self._head = None
            self._frame_started = 0.0
            self._on_frame(self._small_frame(memoryview(head)[4:]))
            if self._closing:
                return
        while end - position >= 4:
            if not self._size_ok(data[position : position + 4]):
                return
            (size,) = _SIZE.unpack_from(data, position)
            if end - position - 4 >= size:
                self._on_frame(self._small_frame(data[position + 4 : position + 4 + size]))  # a copy: shared buffer
                position += 4 + size
                if self._closing:
                    return
                continue
            if size > LARGE_FRAME_BYTES:
                self._frame_started = now
                self._start_large(size, data[position + 4 :], b"")
                return
            break
        if position < end:
            self._head = bytearray(data[position:])
            self._frame_started = now
            self._arm_frame_deadline(now)

    def _is_produce(self, frame: bytes | bytearray | memoryview) -> bool:
        """The frame starts with api key 0 (Produce) and is not a raw SASL token."""
        if len(frame) >= 2 and frame[0] == 0 and frame[1] == 0:
            session = self.session
            return session is None or not session.raw_tokens
        return False

    def _small_frame(self, data: memoryview) -> bytes | memoryview:
        """A copy of a complete frame that arrived in one read of the shared buffer (at most
        SCRATCH_BYTES): Produce into a slab, anything else a `bytes` of its own."""
        if len(data) <= SLAB_FRAME_MAX and self._is_produce(data):
            return self.server.slabs.copy(data)
        return bytes(data)

    def _size_ok(self, size_bytes) -> bool:
        (size,) = _SIZE.unpack_from(size_bytes, 0)
        max_frame = self.server.max_frame
        if size < 0 or size > max_frame:
            self._abort("oversized", f"request size {size} is outside 0..{max_frame} (socket_request_max_bytes)")
            return False
        return True

    def _start_large(self, size: int, first: memoryview, second) -> None:
        available = len(first) + len(second)
        frame = bytearray(available)  # what arrived; get_buffer grows it when more does
        frame[: len(first)] = first
        frame[len(first) : available] = second
        self._frame, self._frame_filled, self._frame_size = frame, available, size
        if not self._frame_started:
            self._frame_started = time.monotonic()
        self._arm_frame_deadline(self._frame_started)

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

    def _on_raw_token(self, session: ConnectionSession, frame: bytes | bytearray | memoryview) -> None:
        """A raw SASL token after SaslHandshake v0: answered with a raw token, in order."""
        server = session.server
        assert server is not None
        try:
            answer = server.step(bytes(frame))
        except SaslAuthenticationError as exc:
            self._abort(
                "sasl_authentication_failed",
                f"SASL {session.mechanism} authentication failed: {exc}",
                level=logging.INFO,
            )
            return
        if server.complete:
            session.raw_tokens = False
            error, _ = session.finish(server, self.server.config.security.connections_max_reauth_ms)
            if error is not None:
                self._abort("sasl_authentication_failed", error, level=logging.INFO)
                return
        self._slots.append(_Slot(-1, done=True, payload=[answer]))
        self._flush()

    def _on_frame(self, frame: bytes | bytearray | memoryview) -> None:
        session = self.session
        if session is not None and session.raw_tokens and session.server is not None:
            self._on_raw_token(session, frame)
            return
        try:
            decoded = codec.decode_request(frame, self.server.served)
        except codec.UnsupportedVersionError as exc:
            if exc.api_key == codec.API_VERSIONS_KEY:
                self._answer_unsupported_api_versions(exc.correlation_id)
            else:
                self._abort(
                    "unsupported_version",
                    f"{codec.api_name(exc.api_key)} v{exc.api_version} is not supported (served: {self.server.served.get(exc.api_key)})",
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
            client_host=self.ip,
            listener=self.listener.name,
            on_close=self.on_close,
        )
        session = self.session
        if session is not None:
            ctx.security_protocol = session.security_protocol
            ctx.session = session
        loop = asyncio.get_running_loop()
        if header.api_key == 0:
            last = self._last_produce
            if last is not None and not last.done():
                ctx.produce_after = last
            ctx.produce_turn = self._last_produce = loop.create_future()
        concurrent = header.api_key in CONCURRENT_APIS
        if concurrent:
            waits_for = [self._last_serial] if self._last_serial is not None and not self._last_serial.done() else []
        else:
            waits_for = [t for t in self._tasks if not t.done()]
        task = loop.create_task(self._handle(decoded, ctx, slot, waits_for, len(frame)))
        if ctx.produce_turn is not None:
            # refused, failed or cancelled before its appends: the connection's next Produce goes
            task.add_done_callback(ctx.produce_scheduled)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        if not concurrent:
            self._last_serial = task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._update_reading()

    async def _handle(
        self,
        decoded: codec.DecodedRequest,
        ctx: RequestContext,
        slot: _Slot,
        waits_for: list[asyncio.Task[None]],
        size: int = 0,
    ) -> None:
        if waits_for:
            await asyncio.gather(*waits_for, return_exceptions=True)
        after = ctx.produce_after
        if after is not None and not after.done():
            await asyncio.shield(after)  # a cancelled wait must not cancel the other request's turn
        session = self.session
        if session is not None:
            # decided only now: the SaslAuthenticate requests before this one have finished
            refusal = session.refusal(ctx.api_key)
            if refusal is not None:
                self._abort("sasl_required", refusal, level=logging.INFO)
                return
            ctx.principal = session.principal
        reg = registry.lookup(ctx.api_key)
        api = codec.api_name(ctx.api_key)
        metrics = self.broker.metrics
        started = time.perf_counter()
        payload: list[bytes | bytearray | memoryview] | None
        limits = self.broker.quotas
        spent = [0.0]
        if limits.active and ctx.api_key in QUOTA_GATED_APIS:
            await self._quota_admission(ctx, size)
        try:
            if limits.request_quotas:
                response = await quotas.timed(reg.handler(decoded.request, ctx), spent)  # type: ignore[union-attr]
            else:
                response = await reg.handler(decoded.request, ctx)  # type: ignore[union-attr]
            if response is codec.CLOSE_CONNECTION:
                slot.close_after = True
                payload = None
            else:
                payload = None if response is None else codec.encode_response_chunks(ctx.correlation_id, response)
                if limits.active:
                    payload = quotas.throttle_response(limits, ctx, response, payload, spent[0])
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
        if ctx.throttle_ms and not quotas.client_throttles(ctx.api_key, ctx.api_version):
            await asyncio.sleep(ctx.throttle_ms / 1000)  # an old client does not throttle itself: answer late
        if session is not None and session.close_after_response:
            session.close_after_response = False
            slot.close_after = True
        slot.payload = payload
        slot.done = True
        self._flush()
        if ctx.throttle_ms and quotas.client_throttles(ctx.api_key, ctx.api_version):
            self._mute(ctx.throttle_ms / 1000)

    async def _quota_admission(self, ctx: RequestContext, size: int) -> None:
        """Before a Produce or Fetch runs: wait while the connection is muted for a quota, and
        count a Produce's bytes now rather than when it is answered. Kafka reads one request of
        a connection at a time, so a throttle stops the next one; here up to MAX_IN_FLIGHT
        pipelined requests may already be read, and without this they would all be appended
        before the first throttle is known (measured: 3x the quota). Admission goes in request
        order (the gate wakes its waiters in the order they came), so the offsets a Produce
        reserves keep the request order."""
        while (gate := self._quota_gate) is not None:  # the one woken first may have muted it again
            await gate
        if ctx.api_key != 0:
            return
        limits = self.broker.quotas
        throttle = limits.record(quotas.PRODUCE, quotas.user_of(ctx.principal), ctx.client_id or "", size)
        if throttle > 0:
            ctx.throttle_ms = max(ctx.throttle_ms, throttle)
            self._mute(throttle / 1000)  # until its response is sent, then again (below)

    def _mute(self, seconds: float) -> None:
        """Read nothing from this client for `seconds` (Kafka mutes a throttled channel), and
        hold back its Produce / Fetch requests already read."""
        loop = asyncio.get_running_loop()
        if self._unmute is not None:
            if self._unmute.when() >= loop.time() + seconds:
                return  # already muted at least that long
            self._unmute.cancel()
        self._throttled = True
        if self._quota_gate is None:
            self._quota_gate = loop.create_future()
        self._unmute = loop.call_later(seconds, self._end_mute)
        self._update_reading()

    def _end_mute(self) -> None:
        self._unmute = None
        self._throttled = False
        self._open_gate()
        self._update_reading()

    def _open_gate(self) -> None:
        gate, self._quota_gate = self._quota_gate, None
        if gate is not None and not gate.done():
            gate.set_result(None)

    def _answer_unsupported_api_versions(self, correlation_id: int) -> None:
        from kio.schema.api_versions.v0.response import ApiVersionsResponse

        from automq.broker.kafka.handlers.api_versions import api_versions_response

        response = api_versions_response(ApiVersionsResponse, ErrorCode.unsupported_version, self.server.served)
        slot = _Slot(correlation_id, done=True, payload=codec.encode_response_chunks(correlation_id, response))
        self._slots.append(slot)
        self._flush()

    def _flush(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        output = self._output
        assert output is not None
        while self._slots and self._slots[0].done:
            slot = self._slots.popleft()
            if slot.payload is not None:
                self.broker.metrics.network_out.inc(output.write_frame(slot.payload))
                self._last_activity = time.monotonic()
            if slot.close_after:
                output.close_when_written()
                return
        if self._closing_gracefully and not self._slots:
            output.close_when_written()

    # ---------------------------------------------------------------- flow control, idle, close

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        should_pause = (
            (self._output is not None and self._output.pending >= WRITE_HIGH_WATER)
            or self._memory_wait
            or self._throttled
            or len(self._tasks) >= MAX_IN_FLIGHT
            or self._closing_gracefully
        )
        if should_pause and not self._reading_paused:
            transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            transport.resume_reading()
            self._reading_paused = False

    def _account(self) -> None:
        """Keep server.buffered_bytes equal to the bytes of unfinished frames held."""
        held = (len(self._head) if self._head is not None else 0) + (len(self._frame) if self._frame is not None else 0)
        if held != self._held:
            before, self._held = self._held, held
            self.server.held_changed(before, held)

    def _check_budget(self) -> None:
        """Over queued_max_request_bytes, a connection holding an unfinished frame stops
        reading until memory is freed, unless it is the last holder still reading (so one
        frame always makes progress, and a frame larger than the budget still completes)."""
        server = self.server
        if self._held and not self._memory_wait and server.over_budget() and server.reading_holders() > 1:
            self._memory_wait = True
            server.waiting[self] = None

    def resume_for_memory(self) -> None:
        self._memory_wait = False
        self._update_reading()

    def _arm(self, delay: float) -> None:
        """(Re)schedule the one timer of this connection: idle time and frame deadline."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if delay > 0:
            self._timer = asyncio.get_running_loop().call_later(delay, self._check_timers)

    def _arm_frame_deadline(self, started: float) -> None:
        deadline = started + self.server.frame_timeout_s
        if self._timer is None or self._timer.when() > deadline + 0.001:
            self._arm(max(deadline - time.monotonic(), 0.0))

    def _check_timers(self) -> None:
        self._timer = None
        if self._closing:
            return
        now = time.monotonic()
        frame_s, idle_s = self.server.frame_timeout_s, self.server.idle_s
        if self._frame_started:
            waited = now - self._frame_started
            if waited >= frame_s:
                self._abort(
                    "frame_timeout",
                    f"request frame unfinished {waited:.1f}s after its first byte (request_frame_timeout_ms)",
                    level=logging.INFO,
                )
                return
        idle = now - self._last_activity
        if idle_s > 0 and idle >= idle_s and not self._tasks:
            self._abort("idle", f"idle for {idle:.0f}s (connections_max_idle_ms)", level=logging.INFO)
            return
        delays = []
        if idle_s > 0:
            delays.append(max(idle_s - idle, 0.05) if not self._tasks else idle_s)
        if self._frame_started:
            delays.append(max(self._frame_started + frame_s - now, 0.0))
        if delays:
            self._arm(min(delays))

    def _abort(self, reason: str, message: str, level: int = logging.WARNING) -> None:
        log.log(level, "closing connection from %s: %s", self.peer, message)
        self.broker.metrics.connections_closed.labels(reason).inc()
        self._closing = True
        self._frame = None
        if self.transport is not None:
            # what was answered already goes out first (e.g. ApiVersions before a bad frame)
            self._flush_done_only()
            if self._output is not None:
                self._output.write_all_now()
            self.transport.close()

    def _flush_done_only(self) -> None:
        output = self._output  # set with the transport (connection_made)
        while self._slots and self._slots[0].done and output is not None:
            slot = self._slots.popleft()
            if slot.payload is not None:
                self.broker.metrics.network_out.inc(output.write_frame(slot.payload))

    async def drain_and_close(self, timeout: float) -> None:
        """Graceful shutdown: read nothing more, answer what is in flight, then close."""
        self._closing_gracefully = True
        self._update_reading()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)
        self._flush()
        if self._output is not None:
            self._output.write_all_now()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def release_free_memory() -> bool:
    """glibc keeps freed heap for reuse; after a flood of connections that can be hundreds of
    MiB the process never needs again. malloc_trim hands it back. False where unsupported
    (not glibc: musl, macOS)."""
    trim = getattr(malloc.libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True


class KafkaServer:
    """Listens on every configured listener; `served` is the api → version range table.

    `bind()` opens the sockets first (so port 0 resolves to a real port that can be
    advertised when registering with the controller); `start()` begins accepting."""

    def __init__(self, broker: Broker | None = None, config=None) -> None:
        self.broker = broker
        self.config = config if config is not None else broker.config  # type: ignore[union-attr]
        self.connections: set[KafkaConnection] = set()
        self.served = registry.served_ranges(self.config)
        kafka = self.config.kafka
        self.scratch = memoryview(bytearray(SCRATCH_BYTES))  # shared by every connection's reads
        storage = self.config.storage
        # one log-cache eviction's worth of idle slabs: about one upload block
        self.slabs = FrameSlabs(max(1, min(storage.upload_block_bytes, storage.log_cache_bytes // 4) // SLAB_BYTES))
        self.max_frame = kafka.socket_request_max_bytes
        self.idle_s = kafka.connections_max_idle_ms / 1000.0
        self.frame_timeout_s = kafka.request_frame_timeout_ms / 1000.0
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._ip_limits: dict[str, int] = {}
        self._refusals: dict[str, list] = {}  # reason -> [refused since last log line, last log time]
        self._closed_since_trim = 0
        self._trim: asyncio.TimerHandle | None = None
        self.max_buffered = kafka.queued_max_request_bytes
        self.buffered_bytes = 0  # bytes of unfinished request frames held by all connections
        self.holders = 0  # connections holding such bytes
        self.waiting: dict[KafkaConnection, None] = {}  # paused for memory, in pause order
        self._servers: list[asyncio.AbstractServer] = []
        self._sockets: dict[str, socket.socket] = {}
        self.bound_ports: dict[str, int] = {}
        # One context per client-certificate rule (tls.client_auth, or a listener's own
        # ssl_client_auth), shared by the SSL / SASL_SSL listeners with that rule: a "required"
        # listener refuses a client without a certificate at the handshake even when a SASL_SSL
        # listener of the same broker asks for none. Built here so a bad certificate stops the start.
        self.tls_contexts: dict[str, ReloadingContext] = {}
        for lst in self.config.listeners:
            rule = self.client_auth(lst)
            if lst.security_protocol.endswith("SSL") and rule not in self.tls_contexts:
                self.tls_contexts[rule] = ReloadingContext(self.config.tls.model_copy(update={"client_auth": rule}))
        self._principals = PrincipalMapper(self.config.tls.principal_mapping_rules)
        self._tls_reload: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------- TLS and principals

    def new_session(self, listener: Listener, ip: str, transport: asyncio.BaseTransport) -> ConnectionSession:
        """The auth state of a connection on a non-PLAINTEXT listener. On SSL, a verified
        client certificate names the principal (mapping rules); on SASL_*, SASL will."""
        protocol = listener.security_protocol
        session = ConnectionSession(listener.name, protocol, ip, sasl=protocol.startswith("SASL"))
        if protocol == "SSL":
            ssl_object = transport.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            if der:
                session.principal = "User:" + self._principals.name_for(subject_dn(der))
        return session

    def client_auth(self, listener: Listener) -> str:
        return listener.ssl_client_auth or self.config.tls.client_auth

    def _check_tls(self) -> None:
        self._tls_reload = None
        if not self.tls_contexts:
            return
        for context in self.tls_contexts.values():
            context.check()
        interval = self.config.tls.reload_check_interval_ms / 1000.0
        if interval > 0:
            self._tls_reload = asyncio.get_running_loop().call_later(interval, self._check_tls)

    # ---------------------------------------------------------------- connection limits

    def _resolve_overrides(self) -> None:
        """max_connections_per_ip_overrides keys are IPs or host names (resolved once, at start)."""
        limits: dict[str, int] = {}
        for host, limit in self.config.kafka.max_connections_per_ip_overrides.items():
            try:
                infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("max_connections_per_ip_overrides: cannot resolve %r (%s); ignored", host, exc)
                continue
            for info in infos:
                limits[str(info[4][0])] = limit
        self._ip_limits = limits

    def admit(self, conn: KafkaConnection) -> tuple[str, str] | None:
        """Count a new connection in, or (reason, message) why it must be closed."""
        kafka = self.config.kafka
        if len(self.connections) >= kafka.max_connections:
            return self._refuse("max_connections", f"{len(self.connections)} connections open (max_connections)")
        limit = self._ip_limits.get(conn.ip, kafka.max_connections_per_ip)
        if self._per_ip[conn.ip] >= limit:
            return self._refuse(
                "max_connections_per_ip",
                f"{conn.ip} has {self._per_ip[conn.ip]} connections open (max_connections_per_ip"
                f"{'_overrides' if conn.ip in self._ip_limits else ''}: {limit})",
            )
        limits = self.broker.quotas if self.broker is not None else None
        if limits is not None and limits.ip_active and not limits.connection_allowed(conn.ip):
            return self._refuse(
                "connection_creation_rate",
                f"{conn.ip} opens connections faster than its connection_creation_rate quota",
            )
        self.connections.add(conn)
        self._per_ip[conn.ip] += 1
        return None

    def _refuse(self, reason: str, message: str) -> tuple[str, str]:
        # a flood would log a line per connection: one line per reason every 10 s, with a count
        state = self._refusals.setdefault(reason, [0, 0.0])
        state[0] += 1
        now = time.monotonic()
        if now - state[1] >= 10.0:
            log.warning("refusing connections: %s (%d refused since the last such line)", message, state[0])
            state[0], state[1] = 0, now
        return reason, message

    def release(self, conn: KafkaConnection) -> None:
        self.connections.discard(conn)
        left = self._per_ip[conn.ip] - 1
        if left > 0:
            self._per_ip[conn.ip] = left
        else:
            del self._per_ip[conn.ip]
        self._closed_since_trim += 1
        if self._closed_since_trim >= TRIM_AFTER_CLOSED and self._trim is None:
            # after a flood: once the closing settles, give the freed heap back to the system
            self._trim = asyncio.get_running_loop().call_later(1.0, self._malloc_trim)

    # ---------------------------------------------------------------- memory of unfinished frames

    def over_budget(self) -> bool:
        return self.buffered_bytes > self.max_buffered

    def reading_holders(self) -> int:
        return self.holders - len(self.waiting)

    def held_changed(self, before: int, after: int) -> None:
        self.buffered_bytes += after - before
        if not before:
            self.holders += 1
        elif not after:
            self.holders -= 1
        if after < before and self.waiting:
            if not self.over_budget():
                waiting, self.waiting = self.waiting, {}
                for conn in waiting:
                    conn.resume_for_memory()
            elif self.reading_holders() == 0:
                # still over, and nobody left reading: the longest waiting goes on alone
                conn = next(iter(self.waiting))
                del self.waiting[conn]
                conn.resume_for_memory()

    def _malloc_trim(self) -> None:
        self._trim = None
        self._closed_since_trim = 0
        release_free_memory()

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
        self._resolve_overrides()
        loop = asyncio.get_running_loop()
        by_name = {listener.name: listener for listener in self.config.listeners}
        if self.tls_contexts and self._tls_reload is None:
            self._check_tls()
        for name, sock in self._sockets.items():
            listener = by_name[name]
            tls = listener.security_protocol.endswith("SSL")
            server = await loop.create_server(
                functools.partial(KafkaConnection, self, listener),
                sock=sock,
                ssl=self.tls_contexts[self.client_auth(listener)].context if tls else None,
                ssl_handshake_timeout=self.config.tls.handshake_timeout_ms / 1000.0 if tls else None,
            )
            self._servers.append(server)
            log.info("Kafka listener %s (%s) on %s", name, listener.security_protocol, sock.getsockname())
        return dict(self.bound_ports)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, finish in-flight requests (up to timeout), close connections."""
        if self._trim is not None:
            self._trim.cancel()
            self._trim = None
        if self._tls_reload is not None:
            self._tls_reload.cancel()
            self._tls_reload = None
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
