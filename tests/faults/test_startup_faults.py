"""A restarting broker whose WAL recovery waits on a slow object store for longer than the
session timeout must not be fenced for it (found by benchmarks/fault_soak.py: the broker
registered, spent longer than the session uploading its WAL, was fenced, failed to start,
and was restarted only to go through the same again).

The controller reaches the store directly; the broker goes through a FaultProxy that stalls
while the broker replays its WAL."""

from __future__ import annotations

import time
import uuid

from faultkit import FaultProxy, ProcessCluster, SequenceProducer, verify

SESSION_TIMEOUT_MS = 3_000


def test_wal_recovery_longer_than_the_session_timeout_does_not_fence(
    tmp_path_factory, seaweedfs, healed: FaultProxy
) -> None:
    bucket = seaweedfs.create_bucket()
    overrides = {
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "heartbeat_interval_ms": 500,
        # nothing is uploaded before the kill: the restart has the whole WAL to upload
        "storage": {"upload_interval_ms": 600_000},
    }
    with ProcessCluster(
        tmp_path_factory.mktemp("startup"),
        healed.url_for(bucket),
        brokers=1,
        overrides=overrides,
        node_overrides={"controller": {"object_store_url": seaweedfs.url_for(bucket)}},
    ) as cluster:
        topic = f"startup-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, 2)
        with SequenceProducer(cluster.bootstrap, topic, 2, rate=300) as producer:
            assert producer.wait_acked(500, timeout=60) >= 500
        cluster.kill9("broker-1", restart=False)
        healed.stall()
        t0 = time.monotonic()
        cluster.restart("broker-1", wait=False)
        time.sleep(3 * SESSION_TIMEOUT_MS / 1000)  # recovery's upload waits on the stalled store
        healed.heal()
        cluster.wait_ready("broker-1")
        print(f"\n[faults] broker ready {time.monotonic() - t0:.2f}s after its restart behind a stalled store")
        fenced = cluster.grep_logs("missed its session")
        assert not fenced, f"the recovering broker was fenced: {fenced}"
        assert cluster.nodes["broker-1"].restarts == 1, "the broker had to be restarted again"
        verdict = verify(producer)
        assert verdict.ok and verdict.acked >= 500, verdict.summary()
