"""Failover end to end with the real storage engine: a broker with an S3-style WAL (objects
in the store) acknowledges appends nobody uploaded yet, it is fenced, a live broker's
WalRecoveryWorker replays that WAL and commits as the dead node, and only then does the
partition reopen on the live broker under a new epoch, with every acknowledged record."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from automq.broker.config import NodeConfig
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.process import ControllerService
from automq.broker.controller.protocol import Endpoint, WalRecoveryPendingError
from automq.broker.controller.recovery_worker import WalRecoveryWorker
from automq.broker.objectstore import open_object_store
from automq.broker.storage.engine import StorageEngine

EP = [Endpoint("PLAINTEXT", "127.0.0.1", 9092)]


def engine_config(node_id: int, url: str, tmp_path) -> NodeConfig:
    return NodeConfig(
        node_id=node_id,
        object_store_url=url,
        data_dir=str(tmp_path / f"node{node_id}"),
        wal={"kind": "s3", "s3_bulk_interval_ms": 10},
        storage={"upload_interval_ms": 3_600_000, "upload_block_bytes": 64 << 20},  # nothing uploads by itself
    )


def payload(i: int) -> bytes:
    return f"record-{i:04d}|".encode() * 20


async def test_live_broker_recovers_a_fenced_brokers_wal(tmp_path, file_url: str, make_config) -> None:
    async with contextlib.AsyncExitStack() as stack:
        svc = ControllerService(make_config(file_url))
        await svc.start()
        stack.push_async_callback(svc.stop)
        await svc.controller.wait_leader(10)
        client = ControllerClient([svc.url], retry_deadline_s=10)
        stack.push_async_callback(client.close)
        store = open_object_store(file_url)
        stack.push_async_callback(store.close)

        e1 = await client.register_broker(1, EP, None)
        p = (await client.create_topic("t", 1, {})).partitions[0]
        assert p.leader == 1
        e2 = await client.register_broker(2, EP, None)

        dead = StorageEngine(engine_config(1, file_url, tmp_path), store, client, client, 1, e1)
        await dead.start()

        async def close_zombie() -> None:
            with contextlib.suppress(Exception):
                await dead.close()  # the zombie's own close cannot commit any more

        stack.push_async_callback(close_zombie)
        stream = await dead.open_stream(p.stream_id, p.leader_epoch)
        for i in range(30):
            assert await stream.append(payload(i), 2) == 2 * i  # acknowledged: durable in its WAL
        assert await client.get_objects(p.stream_id, 0, -1, 10) == []  # ... and nowhere else

        await client.fence_broker(1)  # its node died (the operator, or a missed session)
        image = await client.watch_metadata(-1, 0)
        (job,) = image.wal_recovery_jobs
        assert image.topics[0].partitions[0].leader == -1
        live = StorageEngine(engine_config(2, file_url, tmp_path), store, client, client, 2, e2)
        await live.start()
        stack.push_async_callback(live.close)
        with pytest.raises(WalRecoveryPendingError):
            await client.reassign_partition("t", 0, 2)

        # broker 2's worker follows the metadata, sees the job, recovers, completes
        worker = WalRecoveryWorker(client, store, 2, e2, watch_timeout_ms=1_000)
        running = asyncio.create_task(worker.run())
        try:
            version, deadline = image.version, time.monotonic() + 60
            while image.topics[0].partitions[0].state != "online":
                assert time.monotonic() < deadline, "the WAL was never recovered"
                image = await client.watch_metadata(version, 1_000)
                version = image.version
        finally:
            running.cancel()
        assert worker.recovered == [job.job_id]
        part = image.topics[0].partitions[0]
        assert (part.leader, part.leader_epoch, part.state) == (2, p.leader_epoch + 1, "online")
        assert image.wal_recovery_jobs == ()
        reopened = await live.open_stream(p.stream_id, part.leader_epoch)
        assert reopened.end_offset == 60
        got = []
        pos = 0
        while pos < 60:
            result = await reopened.fetch(pos, 60, 1 << 20)
            assert result.batches
            for b in result.batches:
                got.append(bytes(b.payload))
                pos = b.next_offset
        assert got == [payload(i) for i in range(30)]
        # the next record continues after the recovered ones
        assert await reopened.append(payload(30), 2) == 60
