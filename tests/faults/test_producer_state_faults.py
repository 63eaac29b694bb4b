"""Idempotent dedupe survives kill -9 of the leader however much followed the batch (issue
17 item 4): the retried batch is answered with its original offset by whoever leads after
the crash, from the producer snapshot in the object store plus the replayed tail.

Real processes (ProcessCluster: volume WALs, SeaweedFS behind the fault proxy); the batch is
sent with raw Produce requests so the very same bytes can be retried."""

from __future__ import annotations

import time
import uuid

from faultkit import ProcessCluster, end_offset, idempotent_batch, raw_produce
from kio.schema.errors import ErrorCode

PRODUCER_ID = 777_000


def _produce_until_ok(cluster: ProcessCluster, topic: str, batch: bytes, timeout: float = 90.0) -> tuple[int, int]:
    """Retry like a client: ask the current leader until the answer is not a retriable error."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        leader = cluster.leaders(topic, 1)[0]
        try:
            code, offset = raw_produce(f"127.0.0.1:{cluster.broker(leader).kafka_port}", topic, 0, batch)
        except OSError as exc:
            last = exc
            time.sleep(0.3)
            continue
        if code in (ErrorCode.none, ErrorCode.out_of_order_sequence_number, ErrorCode.invalid_producer_epoch):
            return code, offset
        last = ErrorCode(code)
        time.sleep(0.3)
    raise AssertionError(f"produce kept failing: {last}\n{cluster.log_tail(lines=20)}")


def test_retry_after_leader_kill9_with_12000_records_after_the_batch(tmp_path_factory, proxied_bucket) -> None:
    overrides = {"session_timeout_ms": 4_000, "heartbeat_interval_ms": 500}
    with ProcessCluster(tmp_path_factory.mktemp("pstate"), proxied_bucket, brokers=2, overrides=overrides) as cluster:
        topic = f"pstate-{uuid.uuid4().hex[:6]}"
        leader = cluster.create_topic(topic, 1)[0]
        batch = idempotent_batch(5, PRODUCER_ID, 0, 0)
        assert _produce_until_ok(cluster, topic, batch) == (ErrorCode.none, 0)
        for i in range(12):
            filler = idempotent_batch(1_000, PRODUCER_ID + 1, 0, i * 1_000)  # another producer's data
            assert _produce_until_ok(cluster, topic, filler)[0] == ErrorCode.none
        end = end_offset(cluster.bootstrap, topic, 0)
        assert end == 12_005

        t0 = time.monotonic()
        cluster.kill9(f"broker-{leader}")  # restarted by the supervisor; its WAL is replayed
        code, offset = _produce_until_ok(cluster, topic, batch)
        print(f"\n[faults] leader kill -9 -> retry answered after {time.monotonic() - t0:.2f}s")
        assert code == ErrorCode.none
        assert offset == 0, "the retry was appended again instead of answered with its original offset"
        assert end_offset(cluster.bootstrap, topic, 0) == end
        # the producer continues in sequence; the other one too
        assert _produce_until_ok(cluster, topic, idempotent_batch(2, PRODUCER_ID, 0, 5)) == (ErrorCode.none, end)
