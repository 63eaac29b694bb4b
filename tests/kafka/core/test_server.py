"""The TCP server against hostile and pipelined clients, over real sockets.

The broker here has no controller or storage behind it: these tests exercise framing,
ordering, limits and error answers (ApiVersions, unknown keys, unsupported versions, garbage,
oversized and truncated frames, idle clients), which never reach storage.
"""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v13.request import MetadataRequest as MetadataV13

from automq.broker.config import parse_config
from automq.broker.kafka import codec
from automq.broker.kafka.broker import Broker
from automq.broker.kafka.handlers import registry
from automq.broker.kafka.server import KafkaServer


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, correlation_id: int, request, client_id: str | None = "test") -> None:
        frame = codec.encode_request(correlation_id, request, client_id)
        self.writer.write(struct.pack(">i", len(frame)) + frame)

    async def receive(self, request_cls):
        size = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), 10))[0]
        return codec.decode_response(await asyncio.wait_for(self.reader.readexactly(size), 10), request_cls)

    async def closed_by_server(self) -> bool:
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), 10)
        except ConnectionResetError:
            return True
        return data == b""

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def server(tmp_path):
    config = parse_config(
        {
            "node_id": 1,
            "data_dir": str(tmp_path),
            "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 0}],
            "kafka": {"socket_request_max_bytes": 4096, "connections_max_idle_ms": 300},
        }
    )
    broker = Broker(config, node_epoch=1, cluster=None, storage=None)  # nothing here reaches them
    srv = KafkaServer(broker)
    await srv.start()
    yield srv
    await srv.stop(timeout=1)


def port_of(srv: KafkaServer) -> int:
    return srv.bound_ports["PLAINTEXT"]


async def assert_still_serving(srv: KafkaServer) -> None:
    client = await Client.connect(port_of(srv))
    client.send(1, ApiVersionsRequest(client_software_name="probe", client_software_version="1"))
    _, response = await client.receive(ApiVersionsRequest)
    assert response.error_code == ErrorCode.none
    client.close()


async def test_api_versions_lists_only_served_apis(server):
    client = await Client.connect(port_of(server))
    client.send(7, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    correlation_id, response = await client.receive(ApiVersionsRequest)
    assert correlation_id == 7
    ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert ranges == registry.served_ranges()
    assert ranges[0] == (3, 13) and ranges[18] == (0, 4)
    client.close()


async def test_unsupported_api_versions_version_gets_v0_error_with_ranges(server):
    client = await Client.connect(port_of(server))
    frame = bytearray(
        codec.encode_request(9, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    )
    frame[2:4] = struct.pack(">h", 99)  # a future ApiVersions version
    client.send_raw(struct.pack(">i", len(frame)) + frame)
    correlation_id, response = await client.receive(ApiVersionsV0)
    assert correlation_id == 9
    assert response.error_code == ErrorCode.unsupported_version
    assert any(k.api_key == 18 and k.max_version == 4 for k in response.api_keys)
    # the connection stays usable: the client retries with a version we serve
    client.send(10, ApiVersionsV0())
    _, ok = await client.receive(ApiVersionsV0)
    assert ok.error_code == ErrorCode.none
    client.close()


async def test_unsupported_version_of_other_api_closes(server):
    client = await Client.connect(port_of(server))
    frame = bytearray(
        codec.encode_request(
            3, MetadataRequest(topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        )
    )
    frame[2:4] = struct.pack(">h", 77)
    client.send_raw(struct.pack(">i", len(frame)) + frame)
    assert await client.closed_by_server()
    await assert_still_serving(server)


async def test_unknown_api_key_closes_only_that_connection(server):
    bystander = await Client.connect(port_of(server))
    client = await Client.connect(port_of(server))
    frame = bytearray(codec.encode_request(3, ApiVersionsV0()))
    frame[0:2] = struct.pack(">h", 999)
    client.send_raw(struct.pack(">i", len(frame)) + frame)
    assert await client.closed_by_server()
    bystander.send(4, ApiVersionsV0())
    _, response = await bystander.receive(ApiVersionsV0)
    assert response.error_code == ErrorCode.none
    bystander.close()


@pytest.mark.parametrize("size", [4097, 1 << 30, -1, -(1 << 31)])
async def test_oversized_or_negative_frame_size_closes(server, size):
    client = await Client.connect(port_of(server))
    client.send_raw(struct.pack(">i", size) + b"\x00" * 16)
    assert await client.closed_by_server()
    await assert_still_serving(server)


async def test_truncated_body_closes(server):
    client = await Client.connect(port_of(server))
    frame = codec.encode_request(1, ApiVersionsRequest(client_software_name="abc", client_software_version="1"))
    cut = frame[:-3]
    client.send_raw(struct.pack(">i", len(cut)) + cut)
    assert await client.closed_by_server()
    await assert_still_serving(server)


async def test_idle_and_half_sent_clients_are_closed(server):
    silent = await Client.connect(port_of(server))
    partial = await Client.connect(port_of(server))
    partial.send_raw(struct.pack(">i", 100) + b"\x00\x12")  # promises 100 bytes, sends 2
    assert await silent.closed_by_server()
    assert await partial.closed_by_server()
    assert server.broker.metrics.connections_closed.labels("idle")._value.get() >= 2
    await assert_still_serving(server)


async def test_pipelined_requests_are_answered_in_order(server):
    client = await Client.connect(port_of(server))
    batch = b""
    for cid in range(50):
        frame = codec.encode_request(
            cid,
            ApiVersionsV0() if cid % 2 else ApiVersionsRequest(client_software_name="p", client_software_version="1"),
        )
        batch += struct.pack(">i", len(frame)) + frame
    client.send_raw(batch)  # one write: all frames arrive together
    for cid in range(50):
        correlation_id, _ = await client.receive(ApiVersionsV0 if cid % 2 else ApiVersionsRequest)
        assert correlation_id == cid
    client.close()


async def test_failing_handler_answers_unknown_server_error_and_keeps_connection(server, monkeypatch):
    async def broken(request, ctx):
        raise RuntimeError("boom")

    monkeypatch.setitem(registry._HANDLERS, 3, registry.Registration(3, broken, None, None))
    client = await Client.connect(port_of(server))
    client.send(5, MetadataV13(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    correlation_id, response = await client.receive(MetadataV13)
    assert correlation_id == 5
    assert response.error_code == ErrorCode.unknown_server_error
    client.send(6, ApiVersionsV0())
    _, ok = await client.receive(ApiVersionsV0)
    assert ok.error_code == ErrorCode.none
    client.close()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(garbage=st.binary(min_size=1, max_size=512))
async def test_random_bytes_never_take_the_server_down(server, garbage):
    client = await Client.connect(port_of(server))
    client.send_raw(garbage)
    await client.writer.drain()
    client.close()
    await assert_still_serving(server)


async def test_large_frames_grow_with_the_bytes_that_arrive(tmp_path):
    config = parse_config(
        {
            "node_id": 1,
            "data_dir": str(tmp_path),
            "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 0}],
            "kafka": {"socket_request_max_bytes": "16MiB"},
        }
    )
    srv = KafkaServer(Broker(config, node_epoch=1, cluster=None, storage=None))
    await srv.start()
    try:
        # a frame declaring 12 MiB with a few bytes sent holds a small buffer, not 12 MiB
        idle = await Client.connect(port_of(srv))
        idle.send_raw(struct.pack(">i", 12 << 20) + codec.encode_request(1, ApiVersionsV0()))
        await idle.writer.drain()
        for _ in range(100):
            pending = [c._frame for c in srv.connections if c._frame is not None]
            if pending:
                break
            await asyncio.sleep(0.01)
        assert pending and len(pending[0]) <= 2 << 20

        # a 5 MiB request (ApiVersions + ignored trailing bytes) sent in pieces is answered
        client = await Client.connect(port_of(srv))
        frame = codec.encode_request(2, ApiVersionsV0()) + b"\x00" * (5 << 20)
        data = struct.pack(">i", len(frame)) + frame
        for i in range(0, len(data), 100_000):
            client.send_raw(data[i : i + 100_000])
            await client.writer.drain()
        correlation_id, response = await client.receive(ApiVersionsV0)
        assert correlation_id == 2 and response.error_code == ErrorCode.none
        client.close()
        idle.close()
    finally:
        await srv.stop(timeout=1)


def test_frame_slabs_are_reused_only_once_nothing_refers_to_them():
    from automq.broker.kafka.server import SLAB_BYTES, SLAB_SCAN, FrameSlabs

    slabs = FrameSlabs()
    frame = 200 << 10  # five of them fill a 1 MiB slab
    held = []
    for i in range(20):  # 4 slabs, every region kept alive (as the log cache keeps batches)
        held.append(slabs.copy(memoryview(bytes([i]) * frame)))
    first = {id(v.obj) for v in held}
    assert len(first) == 4 and all(len(v.obj) == SLAB_BYTES for v in held)
    for i in range(20, 30):  # still referenced: new slabs, the old bytes untouched
        slabs.copy(memoryview(bytes([i]) * frame))
    assert all(bytes(v) == bytes([i]) * frame for i, v in enumerate(held))
    # the first slab's views are all dropped (evicted after upload): it is taken again
    reused = id(held[0].obj)
    del held[:5]
    later = [slabs.copy(memoryview(bytes([99]) * frame)) for _ in range(10)]
    assert any(id(v.obj) == reused for v in later)
    assert all(bytes(v) == bytes([i + 5]) * frame for i, v in enumerate(held))  # the rest intact
    # every slab freed at once (a deleted topic, an eviction): they become idle, up to
    # max_idle, and the next slabs needed are those, not new mappings; the rest are let go
    known = {id(slab) for slab in slabs._retired} | {id(slabs._slab)}
    del held[:], later[:]
    slabs.max_idle = 3
    retired = len(slabs._retired)
    assert retired > slabs.max_idle
    while len(slabs._retired) >= retired:  # fill the current slab until the next one is taken
        slabs.copy(memoryview(bytes(frame)))
    # the scan looked at every retired slab (fewer than SLAB_SCAN), all free: 3 kept idle,
    # one of them taken now, the others let go
    assert retired + 1 <= SLAB_SCAN
    assert len(slabs._retired) == 0 and slabs.idle == 2
    taken = [id(slabs._slab)]
    for _ in range(2):  # the next two slabs are the idle ones
        while id(slabs._slab) == taken[-1]:
            slabs.copy(memoryview(bytes(frame)))
        taken.append(id(slabs._slab))
    assert set(taken) <= known and len(set(taken)) == 3 and slabs.idle == 0


async def test_idle_frame_slabs_are_let_go_once_produce_stops(monkeypatch):
    from automq.broker.kafka import server

    monkeypatch.setattr(server, "SLAB_IDLE_S", 0.05)
    slabs = server.FrameSlabs(max_idle=8)
    frame = 200 << 10
    views = [slabs.copy(memoryview(bytes(frame))) for _ in range(20)]  # 4 slabs
    del views
    for _ in range(5):  # the next slab: the scan finds the 4 full ones free
        slabs.copy(memoryview(bytes(frame)))
    assert len(slabs._idle) == 3
    await asyncio.sleep(0.02)
    assert len(slabs._idle) == 3  # a slab was taken less than SLAB_IDLE_S ago
    await asyncio.sleep(0.1)
    assert slabs.idle == 0  # the idle ones and the fresh ones made ahead


async def test_fresh_frame_slabs_are_made_ahead_in_a_worker_thread():
    """While no slab is free (the log cache filling), new ones come from a worker thread with
    their pages already faulted in: the loop does not map and fault them itself."""
    import threading

    from automq.broker.kafka import server

    made_in: list[str] = []
    real = server._fresh_slabs

    def fresh(n):
        made_in.append(threading.current_thread().name)
        return real(n)

    server._fresh_slabs, saved = fresh, server._fresh_slabs
    try:
        slabs = server.FrameSlabs()
        frame = 200 << 10
        held = [slabs.copy(memoryview(bytes([i % 251]) * frame)) for i in range(10)]  # 2 slabs, kept
        while slabs._refill is not None:
            await asyncio.sleep(0.01)
        ready = {id(slab) for slab in slabs._fresh}
        assert len(ready) >= server.SLAB_READY_HIGH - 2 and made_in and threading.main_thread().name not in made_in
        held += [slabs.copy(memoryview(bytes([7]) * frame)) for _ in range(10)]  # 2 more slabs
        assert {id(v.obj) for v in held[10:]} <= ready  # taken from those made ahead
        assert all(bytes(v) == bytes([i % 251]) * frame for i, v in enumerate(held[:10]))
        with memoryview(held[0].obj) as whole:  # a ready slab is an ordinary writable mapping
            assert len(whole) == server.SLAB_BYTES and not whole.readonly
    finally:
        server._fresh_slabs = saved
