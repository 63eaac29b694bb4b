"""Failover: another process recovers a dead node's WAL (S3 or volume) with recover_wal,
fencing the dead writer; then a new owner reads every acknowledged batch. Plus the engine
on the S3 WAL end to end, and the engine's Prometheus metrics."""

from __future__ import annotations

import asyncio

import pytest
from engine_setup import node_config
from prometheus_client import CollectorRegistry

from automq.broker.objectstore import open_object_store
from automq.broker.storage.api import StreamError
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata
from automq.broker.storage.recovery import recover_wal


async def read_all(stream) -> list[tuple[int, bytes]]:
    out, pos = [], stream.start_offset
    while pos < stream.confirm_offset:
        r = await stream.fetch(pos, stream.confirm_offset, 1 << 20)
        out += [(b.base_offset, bytes(b.payload)) for b in r.batches]
        pos = r.batches[-1].next_offset
    return out


def abandon(engine: StorageEngine) -> None:
    """The node dies: no close, no upload, no WAL trim (tasks just stop)."""
    engine.uploader._task.cancel()
    task = getattr(engine.wal, "_task", None) or getattr(engine.wal, "_writer", None)
    task.cancel()


@pytest.mark.parametrize("kind", ["volume", pytest.param("s3", marks=pytest.mark.s3)])
async def test_recover_dead_nodes_wal_then_new_owner_reads_everything(tmp_path, request, kind):
    url = request.getfixturevalue("file_url" if kind == "volume" else "s3_url")
    store = open_object_store(url)
    meta = InProcessMetadata(store)
    config = node_config(
        tmp_path / "dead", url, wal={"kind": kind, "s3_bulk_interval_ms": 10}, storage={"upload_interval_ms": 3_600_000}
    )
    dead = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
    await dead.start()
    sid = await dead.create_stream()
    stream = await dead.open_stream(sid, 0)
    acked = []
    for i in range(30):
        data = bytes([i]) * (100 + i)
        acked.append((await stream.append(data, 2), data))
    assert (await meta.get_streams([sid]))[0].end_offset == 0  # nothing uploaded yet
    if kind == "s3":
        # keep the zombie's WAL alive to prove a fenced writer acknowledges nothing more
        dead.uploader._task.cancel()
    else:
        abandon(dead)

    recovery_epoch = await meta.register_node(1)  # the controller fences node 1
    report = await recover_wal(
        object_store=store,
        streams=meta,
        objects=meta,
        node_id=1,
        node_epoch=recovery_epoch,
        kind=kind,
        volume_path=config.data_path(config.wal.path),
    )
    assert report.records == 30
    assert (await meta.get_streams([sid]))[0].end_offset == 60
    if kind == "s3":
        with pytest.raises(StreamError):
            await stream.append(b"zombie", 1)
        await dead.wal.close()
    # recovering again is harmless
    again = await recover_wal(
        object_store=store,
        streams=meta,
        objects=meta,
        node_id=1,
        node_epoch=recovery_epoch + 1,
        kind=kind,
        volume_path=config.data_path(config.wal.path),
    )
    assert again.records == 0
    # a new owner on another node reads every acknowledged batch
    other = StorageEngine(
        node_config(tmp_path / "other", url).model_copy(update={"node_id": 2}),
        store,
        meta,
        meta,
        2,
        await meta.register_node(2),
    )
    await other.start()
    moved = await other.open_stream(sid, 1)
    assert await read_all(moved) == acked
    await other.close()
    await store.close()


@pytest.mark.s3
async def test_engine_on_s3_wal_survives_restart(tmp_path, s3_url):
    store = open_object_store(s3_url)
    meta = InProcessMetadata(store)
    config = node_config(
        tmp_path / "n", s3_url, wal={"kind": "s3", "s3_bulk_interval_ms": 20}, storage={"upload_interval_ms": 3_600_000}
    )
    engine = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
    await engine.start()
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    bases = await asyncio.gather(*(stream.append(bytes([i]) * 500, 1) for i in range(50)))
    assert bases == list(range(50))
    abandon(engine)  # crash: data only in the S3 WAL
    engine2 = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
    await engine2.start()
    stream2 = await engine2.open_stream(sid, 1)
    assert await read_all(stream2) == [(i, bytes([i]) * 500) for i in range(50)]
    await engine2.close()
    await store.close()


async def test_metrics_are_exported(tmp_path, file_url):
    store = open_object_store(file_url)
    meta = InProcessMetadata(store)
    registry = CollectorRegistry()
    engine = StorageEngine(
        node_config(tmp_path, file_url), store, meta, meta, 1, await meta.register_node(1), registry=registry
    )
    await engine.start()
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    for _i in range(20):
        await stream.append(b"x" * 1000, 1)
    await stream.fetch(0, 20, 1 << 20)
    await engine.uploader.flush()
    value = registry.get_sample_value
    assert value("automq_storage_append_seconds_count") == 20
    assert value("automq_storage_append_bytes_total") == 20_000
    assert value("automq_storage_wal_bytes_written_total") >= 20_000
    assert value("automq_storage_cache_requests_total", {"cache": "log_cache", "result": "hit"}) == 1
    assert value("automq_storage_upload_bytes_total") == 20_000
    assert value("automq_storage_objects_committed_total", {"type": "stream_set"}) >= 1
    assert value("automq_storage_upload_seconds_count") >= 1
    await engine.close()
    await store.close()


async def test_recovering_a_missing_volume_wal_is_an_error(tmp_path, file_url):
    store = open_object_store(file_url)
    meta = InProcessMetadata(store)
    with pytest.raises(FileNotFoundError, match="no WAL"):
        await recover_wal(
            object_store=store,
            streams=meta,
            objects=meta,
            node_id=3,
            node_epoch=1,
            kind="volume",
            volume_path=tmp_path / "nope",
        )
    assert not (tmp_path / "nope").exists()
    with pytest.raises(ValueError, match="kind"):
        await recover_wal(object_store=store, streams=meta, objects=meta, node_id=3, node_epoch=1, kind="tape")
    await store.close()


async def test_two_engines_can_share_one_registry(tmp_path, file_url):
    store = open_object_store(file_url)
    meta = InProcessMetadata(store)
    registry = CollectorRegistry()
    for i in range(2):  # a broker restarted inside one process keeps its /metrics registry
        engine = StorageEngine(
            node_config(tmp_path, file_url), store, meta, meta, 1, await meta.register_node(1), registry=registry
        )
        await engine.start()
        stream = await engine.open_stream(0 if i else await engine.create_stream(), i)
        await stream.append(b"x", 1)
        await engine.close()
    assert registry.get_sample_value("automq_storage_append_seconds_count") == 2
    await store.close()
