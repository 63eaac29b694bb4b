"""Broker sessions, fencing and WAL recovery jobs, and object garbage collection against a
real controller and real object stores."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from automq.broker.controller.client import ControllerClient
from automq.broker.controller.process import ControllerService
from automq.broker.controller.protocol import Endpoint, MetadataImage, WalRecoveryJobError, WalRecoveryPendingError
from automq.broker.objectstore import open_object_store
from automq.broker.storage.metadata import (
    CommitStreamSetObjectRequest,
    NodeFencedError,
    ObjectNotPreparedError,
    ObjectStreamRange,
    StreamFencedError,
    StreamObject,
    object_key,
)

EP = [Endpoint("PLAINTEXT", "127.0.0.1", 9092)]


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store_url(request) -> str:
    return request.getfixturevalue("file_url" if request.param == "file" else "s3_url")


@contextlib.asynccontextmanager
async def running(config):
    svc = ControllerService(config)
    await svc.start()
    await svc.controller.wait_leader(10)
    client = ControllerClient([svc.url], retry_deadline_s=5)
    try:
        yield svc, client
    finally:
        await client.close()
        await svc.stop()


async def _heartbeats(client: ControllerClient, node_id: int, epoch: int) -> None:
    while True:
        await client.heartbeat(node_id, epoch)
        await asyncio.sleep(0.05)


async def _wait_image(client: ControllerClient, pred, timeout: float = 20) -> MetadataImage:
    version, deadline = -1, time.monotonic() + timeout
    while time.monotonic() < deadline:
        image = await client.watch_metadata(version, 500)
        if pred(image):
            return image
        version = image.version
    raise AssertionError("metadata never reached the expected state")


async def test_fenced_broker_wal_is_recovered_before_partitions_reopen(file_url: str, make_config) -> None:
    # broker 2 heartbeats every 50 ms, 40 times per session: only broker 1 (silent) expires
    async with running(make_config(file_url, session_timeout_ms=2_000)) as (_svc, client):
        e1 = await client.register_broker(1, EP, None)
        e2 = await client.register_broker(2, EP, None)
        keepalive = asyncio.create_task(_heartbeats(client, 2, e2))
        try:
            topic = await client.create_topic("t", 2, {})
            p1 = next(p for p in topic.partitions if p.leader == 1)
            await client.open_stream(p1.stream_id, p1.leader_epoch, 1, e1)
            oid = await client.prepare_objects(3, 60_000)
            await client.commit_stream_set_object(
                CommitStreamSetObjectRequest(
                    1, e1, oid, 10, (ObjectStreamRange(p1.stream_id, p1.leader_epoch, 0, 5, 10),)
                )
            )
            # broker 1 stops heartbeating: fenced after the session timeout, its WAL needs recovery
            image = await _wait_image(client, lambda im: {b.node_id: b.state for b in im.brokers}.get(1) == "fenced")
            (job,) = image.wal_recovery_jobs
            assert (job.node_id, job.node_epoch, job.state, job.stream_ids) == (1, e1, "pending", (p1.stream_id,))
            part = image.topics[0].partitions[p1.partition]
            assert (part.leader, part.state) == (-1, "offline")
            assert await client.list_wal_recovery_jobs() == [job]

            # the zombie cannot commit or heartbeat; nobody can take the stream before recovery
            with pytest.raises(NodeFencedError):
                await client.commit_stream_set_object(
                    CommitStreamSetObjectRequest(
                        1, e1, oid + 1, 10, (ObjectStreamRange(p1.stream_id, p1.leader_epoch, 5, 8, 10),)
                    )
                )
            with pytest.raises(NodeFencedError):
                await client.heartbeat(1, e1)
            with pytest.raises(StreamFencedError):
                await client.open_stream(p1.stream_id, p1.leader_epoch + 1, 2, e2)
            with pytest.raises(WalRecoveryPendingError):
                await client.reassign_partition("t", p1.partition, 2)
            with pytest.raises(WalRecoveryJobError):
                await client.complete_wal_recovery(job.job_id, 2, e2)  # not claimed yet

            # broker 2 claims the job, replays broker 1's WAL and commits as broker 1 under the
            # recovery epoch (what storage.recovery.recover_wal does)
            recovery_epoch = await client.claim_wal_recovery(job.job_id, 2, e2)
            assert recovery_epoch > e1
            assert await client.claim_wal_recovery(job.job_id, 2, e2) == recovery_epoch  # idempotent for the claimer
            with pytest.raises(WalRecoveryJobError):
                await client.claim_wal_recovery(job.job_id)  # someone else (the operator) cannot take it over
            with pytest.raises(NodeFencedError):  # the zombie is still fenced
                await client.commit_stream_set_object(
                    CommitStreamSetObjectRequest(
                        1, e1, oid + 1, 10, (ObjectStreamRange(p1.stream_id, p1.leader_epoch, 5, 8, 10),)
                    )
                )
            with pytest.raises(NodeFencedError):  # the recovery epoch commits, it does not heartbeat
                await client.heartbeat(1, recovery_epoch)
            await client.commit_stream_set_object(
                CommitStreamSetObjectRequest(
                    1, recovery_epoch, oid + 1, 10, (ObjectStreamRange(p1.stream_id, p1.leader_epoch, 5, 8, 10),)
                )
            )
            await client.complete_wal_recovery(job.job_id, 2, e2)
            image = await _wait_image(client, lambda im: im.topics[0].partitions[p1.partition].state == "online")
            moved = image.topics[0].partitions[p1.partition]
            assert (moved.leader, moved.leader_epoch) == (2, p1.leader_epoch + 1)
            assert image.wal_recovery_jobs == ()
            opened = await client.open_stream(p1.stream_id, moved.leader_epoch, 2, e2)
            assert opened.end_offset == 8  # recovered data is kept
            with pytest.raises(WalRecoveryJobError):
                await client.claim_wal_recovery(job.job_id, 2, e2)
        finally:
            keepalive.cancel()


async def test_restarted_broker_recovers_its_own_wal(file_url: str, make_config) -> None:
    async with running(make_config(file_url)) as (_svc, client):
        e1 = await client.register_broker(1, EP, None)
        p = (await client.create_topic("t", 1, {})).partitions[0]
        await client.open_stream(p.stream_id, p.leader_epoch, 1, e1)
        await client.fence_broker(1)  # e.g. the operator saw its node die
        image = await client.watch_metadata(-1, 0)
        assert len(image.wal_recovery_jobs) == 1
        e1b = await client.register_broker(1, EP, None)  # same node id: same WAL
        image = await client.watch_metadata(-1, 0)
        assert image.wal_recovery_jobs == ()
        back = image.topics[0].partitions[0]
        assert (back.leader, back.leader_epoch, back.state) == (1, p.leader_epoch + 1, "online")
        # recovery commits under the old stream epoch, then the stream reopens under the new one
        oid = await client.prepare_objects(1, 60_000)
        await client.commit_stream_set_object(
            CommitStreamSetObjectRequest(1, e1b, oid, 10, (ObjectStreamRange(p.stream_id, p.leader_epoch, 0, 3, 10),))
        )
        reopened = await client.open_stream(p.stream_id, back.leader_epoch, 1, e1b)
        assert (reopened.epoch, reopened.end_offset) == (back.leader_epoch, 3)


async def test_operator_claims_and_completes_a_recovery(file_url: str, make_config) -> None:
    async with running(make_config(file_url)) as (_svc, client):
        e1 = await client.register_broker(1, EP, None)
        e2 = await client.register_broker(2, EP, None)
        topic = await client.create_topic("t", 2, {})
        p1 = next(p for p in topic.partitions if p.leader == 1)
        await client.open_stream(p1.stream_id, p1.leader_epoch, 1, e1)
        await client.fence_broker(1)
        (job,) = await client.list_wal_recovery_jobs()
        recovery_epoch = await client.claim_wal_recovery(job.job_id)  # node -1: the operator
        (claimed,) = await client.list_wal_recovery_jobs()
        assert (claimed.state, claimed.claimed_by, claimed.recovery_epoch) == ("claimed", -1, recovery_epoch)
        oid = await client.prepare_objects(1, 60_000)
        await client.commit_stream_set_object(
            CommitStreamSetObjectRequest(
                1, recovery_epoch, oid, 10, (ObjectStreamRange(p1.stream_id, p1.leader_epoch, 0, 4, 10),)
            )
        )
        with pytest.raises(WalRecoveryJobError):
            await client.complete_wal_recovery(job.job_id, 2, e2)  # only the claimer completes
        await client.complete_wal_recovery(job.job_id)
        image = await client.watch_metadata(-1, 0)
        part = image.topics[0].partitions[p1.partition]
        assert (part.leader, part.leader_epoch) == (2, p1.leader_epoch + 1)
        assert (await client.open_stream(p1.stream_id, part.leader_epoch, 2, e2)).end_offset == 4
        with pytest.raises(NodeFencedError):  # recovery is over: the recovery epoch commits no more
            oid2 = await client.prepare_objects(1, 60_000)
            await client.commit_stream_set_object(
                CommitStreamSetObjectRequest(
                    1, recovery_epoch, oid2, 10, (ObjectStreamRange(p1.stream_id, part.leader_epoch, 4, 5, 10),)
                )
            )


async def test_operator_can_abandon_a_lost_wal(file_url: str, make_config) -> None:
    async with running(make_config(file_url)) as (_svc, client):
        e1 = await client.register_broker(1, EP, None)
        await client.register_broker(2, EP, None)
        topic = await client.create_topic("t", 2, {})
        p1 = next(p for p in topic.partitions if p.leader == 1)
        await client.open_stream(p1.stream_id, p1.leader_epoch, 1, e1)
        await client.fence_broker(1)
        (job,) = await client.list_wal_recovery_jobs()
        await client.abandon_wal_recovery(job.job_id)
        image = await client.watch_metadata(-1, 0)
        assert image.topics[0].partitions[p1.partition].leader == 2


async def test_gc_deletes_garbage_after_retention_and_never_a_live_object(store_url: str, make_config) -> None:
    async with running(make_config(store_url, gc_retention_ms=3_600_000)) as (svc, client):
        store = open_object_store(store_url)
        try:
            e1 = await client.register_broker(1, EP, None)
            p = (await client.create_topic("t", 1, {})).partitions[0]
            await client.open_stream(p.stream_id, p.leader_epoch, 1, e1)
            first = await client.prepare_objects(6, 3_600_000)
            for oid in range(first, first + 6):
                await store.put(object_key(oid), b"x" * 16)
            a, b, c, compacted, spare1, spare2 = range(first, first + 6)
            for oid, (start, end) in ((a, (0, 10)), (b, (10, 20)), (c, (20, 30))):
                await client.commit_stream_set_object(
                    CommitStreamSetObjectRequest(
                        1, e1, oid, 16, (ObjectStreamRange(p.stream_id, p.leader_epoch, start, end, 16),)
                    )
                )
            # compaction: b + c -> one stream object; then a trim makes a garbage
            await client.commit_stream_object(StreamObject(compacted, 16, p.stream_id, 10, 30, (b, c)), -1, -1)
            await client.trim_stream(p.stream_id, p.leader_epoch, 12, 1, e1)
            expired = await client.prepare_objects(1, 1)  # written, never committed
            await store.put(object_key(expired), b"partial upload")
            await asyncio.sleep(0.01)  # its 1 ms TTL is over

            # within the retention nothing is deleted: readers may still hold a, b, c
            assert await svc.controller.collect_garbage() == 0
            for oid in (a, b, c, expired):
                assert await store.exists(object_key(oid))
            with pytest.raises(ObjectNotPreparedError):
                await client.commit_stream_object(StreamObject(expired, 1, p.stream_id, 30, 31), 1, e1)

            svc.controller.gc_retention_ms = 0  # the retention has passed
            assert await svc.controller.collect_garbage() == 4  # a, b, c and the expired upload
            for oid in (a, b, c, expired):
                assert not await store.exists(object_key(oid)), oid
            for oid in (compacted, spare1, spare2):  # live, or prepared and not expired
                assert await store.exists(object_key(oid)), oid
            live = await client.get_objects(p.stream_id, 0, -1, 100)
            assert [o.object_id for o in live] == [compacted]
            assert not any(o in svc.controller.state.objects for o in (a, b, c, expired))
            assert await svc.controller.collect_garbage() == 0
        finally:
            await store.close()
