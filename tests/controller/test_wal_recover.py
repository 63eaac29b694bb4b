"""`recover_lost_wal` (the core of `automq wal recover`) and `broker_sessions` against a real
controller and a real volume WAL file."""

from __future__ import annotations

import asyncio

import pytest

from automq.broker.controller.client import ControllerClient
from automq.broker.controller.process import ControllerService
from automq.broker.controller.protocol import Endpoint
from automq.broker.controller.wal_recover import WalRecoverError, recover_lost_wal
from automq.broker.objectstore import open_object_store
from automq.broker.storage.metadata import NodeFencedError
from automq.broker.storage.wal.base import WalRecord
from automq.broker.storage.wal.volume import VolumeWal

EP = [Endpoint("PLAINTEXT", "127.0.0.1", 9092)]


async def test_rerun_after_a_crash_mid_way_finishes_and_rerun_after_completion_does_nothing(
    file_url: str, make_config, tmp_path
) -> None:
    svc = ControllerService(make_config(file_url))
    await svc.start()
    await svc.controller.wait_leader(10)
    client = ControllerClient([svc.url], retry_deadline_s=5)
    store = open_object_store(file_url)
    try:
        e1 = await client.register_broker(1, EP, None)
        await client.register_broker(2, EP, None)
        topic = await client.create_topic("t", 2, {})
        p1 = next(p for p in topic.partitions if p.leader == 1)
        await client.open_stream(p1.stream_id, p1.leader_epoch, 1, e1)
        # Broker 1's WAL: three acknowledged (durable) records of its open stream.
        wal_path = tmp_path / "wal"
        wal = VolumeWal(wal_path, 1 << 20, 1, e1)
        await wal.recover()
        await wal.start(0)
        payload = b"x" * 100
        for offset in range(3):
            await wal.append(WalRecord(p1.stream_id, p1.leader_epoch, offset, 1, payload))
        await wal.close()

        with pytest.raises(WalRecoverError, match="not fenced"):
            await recover_lost_wal(client, store, 1, wal_path)
        await client.fence_broker(1)
        with pytest.raises(WalRecoverError, match="no WAL at"):
            await recover_lost_wal(client, store, 1, tmp_path / "not-mounted")

        # A first run that crashed right after its claim: the rerun claims the same job again.
        (job,) = await client.list_wal_recovery_jobs()
        first_epoch = await client.claim_wal_recovery(job.job_id)
        outcome = await recover_lost_wal(client, store, 1, wal_path)
        assert (outcome.job_id, outcome.recovery_epoch, outcome.records) == (job.job_id, first_epoch, 3)
        image = await client.watch_metadata(-1, 0)
        assert image.wal_recovery_jobs == ()
        moved = image.topics[0].partitions[p1.partition]
        assert moved.leader == 2 and moved.state == "online"
        # The data is committed: the new leader opens the stream at offset 3.
        e2 = next(b.node_epoch for b in image.brokers if b.node_id == 2)
        assert (await client.open_stream(p1.stream_id, moved.leader_epoch, 2, e2)).end_offset == 3

        again = await recover_lost_wal(client, store, 1, wal_path)
        assert again.job_id is None and "nothing to do" in again.summary()
        # The zombie (node 1 under its old epoch) can neither heartbeat nor open a stream.
        with pytest.raises(NodeFencedError):
            await client.heartbeat(1, e1)
        with pytest.raises(NodeFencedError):
            await client.open_stream(p1.stream_id, moved.leader_epoch + 1, 1, e1)
    finally:
        await client.close()
        await store.close()
        await svc.stop()


async def test_broker_sessions_report_heartbeat_age_and_state(file_url: str, make_config) -> None:
    svc = ControllerService(make_config(file_url))
    await svc.start()
    await svc.controller.wait_leader(10)
    client = ControllerClient([svc.url], retry_deadline_s=5)
    try:
        e1 = await client.register_broker(1, EP, None)
        await client.register_broker(2, EP, None)
        await asyncio.sleep(0.3)
        await client.heartbeat(1, e1)
        sessions = await client.broker_sessions()
        by_id = {b["node_id"]: b for b in sessions["brokers"]}
        assert sessions["session_timeout_ms"] == svc.controller.session_timeout_ms
        assert by_id[1]["state"] == "active" and by_id[2]["state"] == "active"
        # Broker 2 has been silent longer than broker 1, which just heartbeated.
        assert by_id[2]["heartbeat_age_ms"] >= 300 > by_id[1]["heartbeat_age_ms"]
        await client.fence_broker(2)
        by_id = {b["node_id"]: b for b in (await client.broker_sessions())["brokers"]}
        assert by_id[2]["state"] == "fenced"
    finally:
        await client.close()
        await svc.stop()


async def test_a_broker_back_under_a_newer_epoch_is_left_to_recover_itself(
    file_url: str, make_config, tmp_path
) -> None:
    svc = ControllerService(make_config(file_url))
    await svc.start()
    await svc.controller.wait_leader(10)
    client = ControllerClient([svc.url], retry_deadline_s=5)
    store = open_object_store(file_url)
    try:
        e1 = await client.register_broker(1, EP, None)
        p = (await client.create_topic("t", 1, {})).partitions[0]
        await client.open_stream(p.stream_id, p.leader_epoch, 1, e1)
        await client.fence_broker(1)
        # Its replacement pod got the volume first: it registered again (the job is cancelled).
        await client.register_broker(1, EP, None)
        (tmp_path / "wal").write_bytes(b"")
        outcome = await recover_lost_wal(client, store, 1, tmp_path / "wal", fenced_epoch=e1)
        assert outcome.job_id is None and "recovers its own WAL" in outcome.summary()
        with pytest.raises(WalRecoverError, match="not fenced"):  # without the epoch: refused
            await recover_lost_wal(client, store, 1, tmp_path / "wal")
    finally:
        await client.close()
        await store.close()
        await svc.stop()
