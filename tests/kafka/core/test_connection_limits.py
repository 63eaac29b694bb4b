"""Connection floods, over real sockets: connection limits (max_connections,
max_connections_per_ip and its overrides), the deadline for completing a request frame, idle
connections, and what an idle or half-sent connection holds in memory.

Behaviour only: every wait below is bounded by the broker closing a socket or answering it.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import socket
import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from automq.broker.config import ConfigError, parse_config
from automq.broker.kafka import codec
from automq.broker.kafka.broker import Broker
from automq.broker.kafka.server import KafkaServer


async def start(tmp_path, **kafka) -> KafkaServer:
    config = parse_config(
        {
            "node_id": 1,
            "data_dir": str(tmp_path),
            "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 0}],
            "kafka": kafka,
        }
    )
    server = KafkaServer(Broker(config, node_epoch=1, cluster=None, storage=None))
    await server.start()
    return server


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, server: KafkaServer, source: str | None = None) -> Conn:
        port = server.bound_ports["PLAINTEXT"]
        local = (source, 0) if source else None
        return cls(*await asyncio.open_connection("127.0.0.1", port, local_addr=local))

    async def api_versions(self, correlation_id: int = 1) -> bool:
        """True when answered, False when the broker closed the connection instead."""
        frame = codec.encode_request(correlation_id, ApiVersionsRequest())
        try:
            self.writer.write(struct.pack(">i", len(frame)) + frame)
            size = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), 10))[0]
            payload = await asyncio.wait_for(self.reader.readexactly(size), 10)
        except (asyncio.IncompleteReadError, ConnectionError):
            return False
        got, response = codec.decode_response(payload, ApiVersionsRequest)
        return got == correlation_id and response.error_code == ErrorCode.none

    async def closed_by_broker(self) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(1 << 16), 10) == b""
        except ConnectionError:
            return True

    def close(self) -> None:
        self.writer.close()


def closed_count(server: KafkaServer, reason: str) -> float:
    return server.broker.metrics.connections_closed.labels(reason)._value.get()


async def test_max_connections_refuses_beyond_the_limit_and_frees_slots(tmp_path):
    server = await start(tmp_path, max_connections=3)
    try:
        conns = [await Conn.open(server) for _ in range(3)]
        assert all([await c.api_versions() for c in conns])
        extra = await Conn.open(server)
        assert await extra.closed_by_broker()
        assert closed_count(server, "max_connections") == 1
        conns[0].close()
        while len(server.connections) > 2:  # the broker sees the close
            await asyncio.sleep(0.01)
        again = await Conn.open(server)
        assert await again.api_versions()
        for c in [*conns[1:], again]:
            c.close()
    finally:
        await server.stop(timeout=1)


async def test_max_connections_per_ip_with_overrides(tmp_path):
    server = await start(tmp_path, max_connections_per_ip=2, max_connections_per_ip_overrides={"127.0.0.2": 3})
    try:
        default_ip = [await Conn.open(server, "127.0.0.1") for _ in range(2)]
        assert all([await c.api_versions() for c in default_ip])
        assert await (await Conn.open(server, "127.0.0.1")).closed_by_broker()
        overridden = [await Conn.open(server, "127.0.0.2") for _ in range(3)]
        assert all([await c.api_versions() for c in overridden])  # its own count, its own limit
        assert await (await Conn.open(server, "127.0.0.2")).closed_by_broker()
        assert closed_count(server, "max_connections_per_ip") == 2
        for c in default_ip + overridden:
            c.close()
    finally:
        await server.stop(timeout=1)


def test_connection_limit_config_is_checked():
    base = {"node_id": 1}
    with pytest.raises(ConfigError, match="kafka.max_connections"):
        parse_config({**base, "kafka": {"max_connections": 0}})
    with pytest.raises(ConfigError, match="max_connections_per_ip_overrides"):
        parse_config({**base, "kafka": {"max_connections_per_ip_overrides": {"10.0.0.1": -1}}})
    config = parse_config({**base, "kafka": {"max_connections_per_ip_overrides": {"10.0.0.1": 0}}})
    assert config.kafka.max_connections_per_ip_overrides == {"10.0.0.1": 0}  # 0: that host is refused


async def test_a_frame_trickled_slower_than_its_deadline_is_closed(tmp_path):
    # the byte-at-a-time client keeps the connection busy, so the idle timer alone never fires
    server = await start(tmp_path, request_frame_timeout_ms=500, connections_max_idle_ms=60_000)
    try:
        slow = await Conn.open(server)
        frame = struct.pack(">i", 100) + b"\x00" * 100
        closed = False
        for byte in frame:
            try:
                slow.writer.write(bytes([byte]))
                await slow.writer.drain()
            except ConnectionError:
                closed = True
                break
            if slow.reader.at_eof() or slow.writer.is_closing():
                closed = True
                break
            try:
                if await asyncio.wait_for(slow.reader.read(1), 0.1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        assert closed, "a 104-byte frame sent over 10 s was never cut off by a 0.5 s frame deadline"
        assert closed_count(server, "frame_timeout") == 1
        # a frame completed within the deadline is served, however it is split
        quick = await Conn.open(server)
        frame = codec.encode_request(4, ApiVersionsRequest())
        data = struct.pack(">i", len(frame)) + frame
        for i in range(len(data)):
            quick.writer.write(data[i : i + 1])
            await quick.writer.drain()
        size = struct.unpack(">i", await asyncio.wait_for(quick.reader.readexactly(4), 10))[0]
        assert codec.decode_response(await quick.reader.readexactly(size), ApiVersionsRequest)[0] == 4
        quick.close()
    finally:
        await server.stop(timeout=1)


async def test_idle_connections_are_closed_after_the_idle_time(tmp_path):
    server = await start(tmp_path, connections_max_idle_ms=300)
    try:
        used = await Conn.open(server)
        assert await used.api_versions()
        silent = await Conn.open(server)
        assert await used.closed_by_broker() and await silent.closed_by_broker()
        assert closed_count(server, "idle") == 2
        assert len(server.connections) == 0
    finally:
        await server.stop(timeout=1)


async def _python_heap_per_connection(server: KafkaServer, n: int, send: bytes) -> float:
    """Bytes of Python heap the broker holds per connection for n clients that sent `send`."""
    raw = []
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        loop = asyncio.get_running_loop()
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            await loop.sock_connect(s, ("127.0.0.1", server.bound_ports["PLAINTEXT"]))
            if send:
                await loop.sock_sendall(s, send)
            raw.append(s)
        while len(server.connections) < n:
            await asyncio.sleep(0.01)
        for _ in range(20):  # let the broker read what was sent
            await asyncio.sleep(0.01)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        for s in raw:
            s.close()
    return held / n


@pytest.mark.parametrize(
    "send",
    [b"", b"\x00\x00", struct.pack(">i", 99 << 20) + b"\x00" * 1000],
    ids=["idle", "half-a-size", "huge-frame-declared"],
)
async def test_connections_hold_no_buffers_beyond_what_they_sent(tmp_path, send):
    server = await start(tmp_path, socket_request_max_bytes="100MiB")
    try:
        per_connection = await _python_heap_per_connection(server, 200, send)
        # the clients' own sockets and transports are in this figure too
        assert per_connection < 20_000, f"{per_connection:.0f} bytes of Python heap per connection"
    finally:
        await server.stop(timeout=1)


async def _declare(server: KafkaServer, correlation_id: int, size: int, sent: int) -> tuple[Conn, bytes]:
    """A connection that declared an ApiVersions frame of `size` bytes (trailing zeros, which
    a Kafka parser ignores) and sent `sent` bytes of it; returns it and the unsent rest."""
    frame = codec.encode_request(correlation_id, ApiVersionsRequest())
    frame += b"\x00" * (size - len(frame))
    conn = await Conn.open(server)
    conn.writer.write(struct.pack(">i", size) + frame[:sent])
    await conn.writer.drain()
    return conn, frame[sent:]


async def _answered(conn: Conn, correlation_id: int) -> bool:
    size = struct.unpack(">i", await asyncio.wait_for(conn.reader.readexactly(4), 20))[0]
    got, response = codec.decode_response(await conn.reader.readexactly(size), ApiVersionsRequest)
    return got == correlation_id and response.error_code == ErrorCode.none


async def test_unfinished_frames_share_one_memory_budget(tmp_path):
    budget = 1 << 20
    server = await start(tmp_path, queued_max_request_bytes=budget, socket_request_max_bytes="8MiB")
    try:
        conns = []
        for i in range(6):  # 6 x 600 KiB of unfinished frames against a 1 MiB budget
            conns.append(await _declare(server, i, 4 << 20, 600 << 10))
        for _ in range(50):  # let the broker read whatever it will read
            await asyncio.sleep(0.02)
        # one read per connection may overshoot before it is paused, never the whole 3.6 MiB
        assert server.buffered_bytes <= budget + 6 * (256 << 10)
        assert server.buffered_bytes < 6 * (600 << 10)
        assert len(server.waiting) >= 3  # paused, waiting for memory
        # every frame completes once its client sends the rest: waiting connections resume
        for conn, rest in conns:
            conn.writer.write(rest)
        for i, (conn, _) in enumerate(conns):
            assert await _answered(conn, i)
            conn.close()
        assert server.buffered_bytes == 0
    finally:
        await server.stop(timeout=1)


async def test_a_frame_larger_than_the_budget_still_completes(tmp_path):
    server = await start(tmp_path, queued_max_request_bytes="64KiB", socket_request_max_bytes="8MiB")
    try:
        conn, rest = await _declare(server, 3, 2 << 20, 1000)
        conn.writer.write(rest)
        assert await _answered(conn, 3)
        conn.close()
    finally:
        await server.stop(timeout=1)


async def test_frames_split_anywhere_are_cut_correctly(tmp_path):
    # a size split across reads, then the rest of a large frame and a small one in one read
    server = await start(tmp_path, socket_request_max_bytes="1MiB")
    try:
        conn = await Conn.open(server)
        large = codec.encode_request(1, ApiVersionsRequest())
        large += b"\x00" * ((100 << 10) - len(large))  # trailing bytes a Kafka parser ignores
        small = codec.encode_request(2, ApiVersionsRequest())
        data = struct.pack(">i", len(large)) + large + struct.pack(">i", len(small)) + small
        conn.writer.write(data[:2])
        await conn.writer.drain()
        for _ in range(500):  # until the broker holds the 2 bytes
            if any(c._head for c in server.connections):
                break
            await asyncio.sleep(0.01)
        conn.writer.write(data[2:])
        assert await _answered(conn, 1)
        assert await _answered(conn, 2)
        conn.close()
    finally:
        await server.stop(timeout=1)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    pads=st.lists(
        st.sampled_from([0, 10, 1000, (64 << 10) - 20, 64 << 10, 70 << 10, 150 << 10]), min_size=1, max_size=5
    ),
    cuts=st.lists(st.integers(1, 400_000), max_size=8),
)
async def test_any_split_of_pipelined_frames_is_answered_in_order(tmp_path_factory, pads, cuts):
    server = await start(tmp_path_factory.mktemp("split"), socket_request_max_bytes="1MiB")
    try:
        conn = await Conn.open(server)
        data = b""
        for i, pad in enumerate(pads):
            frame = codec.encode_request(i, ApiVersionsRequest()) + b"\x00" * pad
            data += struct.pack(">i", len(frame)) + frame
        points = sorted({c % len(data) for c in cuts} | {0, len(data)})
        for start_at, end_at in itertools.pairwise(points):
            conn.writer.write(data[start_at:end_at])
            await conn.writer.drain()
            await asyncio.sleep(0.005)  # separate reads are likelier; correctness does not depend on it
        for i in range(len(pads)):
            assert await _answered(conn, i)
        conn.close()
    finally:
        await server.stop(timeout=1)
