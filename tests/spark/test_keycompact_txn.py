"""Key compaction of a topic idempotent and transactional producers write (confluent-kafka),
on a real cluster whose objects are in SeaweedFS: aborted records go, markers stay until safe,
nothing from the open transaction on is cleaned, read_committed readers (confluent-kafka,
kafka-python, aiokafka) see the compaction of what they saw before, and after the broker is
killed and rebuilds producer state from the compacted log, the same producers carry on."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from automq.broker import local
from automq.spark.cluster import ClusterLocation
from automq.spark.keycompact import compact_keys

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.s3]

Row = tuple[int, bytes | None, bytes | None]


def _read(bootstrap: str, topic: str, isolation: str) -> list[Row]:
    """Everything up to the end a reader of that isolation sees (HW or LSO), from offset 0."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex[:6]}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[Row] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return out
                continue
            out.append((msg.offset(), msg.key(), msg.value()))
    finally:
        c.close()
    raise AssertionError(f"no end of partition within 60 s ({len(out)} read)")


def _kafka_python(bootstrap: str, topic: str, n: int) -> list[Row]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
    )
    c.assign([KTP(topic, 0)])
    c.seek(KTP(topic, 0), 0)
    out: list[Row] = []
    try:
        for m in c:
            out.append((m.offset, m.key, m.value))
            if len(out) >= n:
                break
    finally:
        c.close()
    return out


async def _aiokafka(bootstrap: str, topic: str, n: int) -> list[Row]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as ATP

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    await c.start()
    out: list[Row] = []
    try:
        c.assign([ATP(topic, 0)])
        c.seek(ATP(topic, 0), 0)
        deadline = time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=500)
            for msgs in batch.values():
                out += [(m.offset, m.key, m.value) for m in msgs]
    finally:
        await c.stop()
    return out


def _compacted(rows: list[Row]) -> list[Row]:
    latest: dict[bytes | None, Row] = {}
    for r in rows:
        latest[r[1]] = r
    return sorted(latest.values())


def _until(read, expected: list[Row], timeout: float = 60) -> list[Row]:
    """The leader drops its cached pre-compaction batches when the swap reaches it (a metadata
    long-poll): read until the answer is the expected one, or time out with the last one."""
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def _compact_keys(spark, data_dir) -> dict:
    """Key compaction in the shared Spark session (its Python workers have the S3 credentials
    from the environment, as a CronJob pod does); the counters `automq spark compact --keys` prints."""
    report = compact_keys(spark, ClusterLocation.resolve(data_dir=data_dir), min_age_ms=0)
    return {"committed": report.committed, "errors": report.errors, **report.key_stats}


def test_transactional_topic_compacts_like_kafkas_cleaner(spark, s3_url, sh, tmp_path):
    cluster = sh.start_cluster(tmp_path / "cluster", object_store_url=s3_url)
    try:
        _scenario(spark, cluster, sh)
    finally:
        sh.stop_cluster(cluster)


def _send(p: Producer, topic: str, kvs: list[tuple[str, str]]) -> None:
    errors: list[str] = []
    for k, v in kvs:
        p.produce(
            topic, key=k.encode(), value=v.encode(), partition=0, on_delivery=lambda e, _m: e and errors.append(e)
        )
    assert p.flush(60) == 0
    assert not errors, errors


def _scenario(spark, cluster, sh) -> None:
    bootstrap = cluster.bootstrap
    topic = sh.topic_name("ctxn")
    sh.create_topic(bootstrap, topic, configs={"cleanup.policy": "compact", "delete.retention.ms": "0"})
    base = {"bootstrap.servers": bootstrap, "linger.ms": 20}
    idem = Producer({**base, "enable.idempotence": True})
    idem2 = Producer({**base, "enable.idempotence": True})
    plain = Producer(base)
    txn = Producer({**base, "transactional.id": f"{topic}-t", "transaction.timeout.ms": 300_000})
    opened = Producer({**base, "transactional.id": f"{topic}-o", "transaction.timeout.ms": 300_000})
    txn.init_transactions(60)
    opened.init_transactions(60)

    def transaction(kvs: list[tuple[str, str]], commit: bool) -> None:
        txn.begin_transaction()
        _send(txn, topic, kvs)
        (txn.commit_transaction if commit else txn.abort_transaction)(60)

    _send(idem, topic, [(f"k{i}", "i1") for i in range(5)])  # idem's one batch: k4 survives
    _send(idem2, topic, [("k8", "j1"), ("k9", "j1")])  # idem2's one batch: nothing survives
    _send(plain, topic, [(f"k{i}", "p1") for i in range(4)] + [("k8", "p1"), ("k9", "p1")])
    transaction([("k1", "t1"), ("k5", "t1")], commit=True)  # all superseded below
    transaction([("k0", "aborted"), ("k6", "aborted")], commit=False)
    transaction([("k2", "t3")], commit=True)
    _send(plain, topic, [("k1", "p2"), ("k5", "p2")])
    opened.begin_transaction()
    _send(opened, topic, [("k3", "open")])  # stays open: the cut
    _send(plain, topic, [("k4", "after")])  # above the cut: supersedes nothing yet

    hw = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    end = hw.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    hw.close()
    cluster.wait_uploaded(topic, {0: end})
    rc_before = _read(bootstrap, topic, "read_committed")
    ru_before = _read(bootstrap, topic, "read_uncommitted")
    cut = next(o for o, k, v in ru_before if v == b"open")
    assert [v for _o, _k, v in rc_before].count(b"aborted") == 0 and all(o < cut for o, _k, _v in rc_before)
    assert [v for _o, _k, v in ru_before].count(b"aborted") == 2

    stats = _compact_keys(spark, cluster.data_dir)
    assert stats["committed"] >= 1 and not stats["errors"], stats  # the internal topics are compacted too
    assert stats["aborted_batches_removed"] == 1 and stats["markers_stamped"] >= 1 and stats["empty_batches"] >= 1, (
        stats
    )

    rc_expected = _compacted(rc_before)
    ru_expected = rc_expected + [r for r in ru_before if r[0] >= cut]
    assert _until(lambda: _read(bootstrap, topic, "read_committed"), rc_expected) == rc_expected
    assert _read(bootstrap, topic, "read_uncommitted") == ru_expected
    assert (b"k4", b"i1") in [(k, v) for _o, k, v in rc_expected]  # the idempotent batch's survivor
    assert _kafka_python(bootstrap, topic, len(rc_expected)) == rc_expected
    assert asyncio.run(_aiokafka(bootstrap, topic, len(rc_expected))) == rc_expected

    # the second run removes the commit marker whose transaction has no data left (horizon passed)
    stats = _compact_keys(spark, cluster.data_dir)
    assert stats["committed"] >= 1 and stats["markers_removed"] >= 1, stats
    assert _until(lambda: _read(bootstrap, topic, "read_uncommitted"), ru_expected) == ru_expected
    assert _read(bootstrap, topic, "read_committed") == rc_expected

    # kill the broker: no final producer snapshot, so it rebuilds producer state (sequences,
    # epochs, open transaction) from the compacted log; the same producers carry on
    [broker] = [n for n in cluster.nodes if n.role == "broker"]
    broker.process.kill()
    broker.process.wait(30)
    local.spawn(broker)
    deadline = time.monotonic() + 120
    while not local.is_ready(broker):
        assert broker.process.poll() is None and time.monotonic() < deadline, local.log_tail(broker, 40)
        time.sleep(0.3)
    _send(idem, topic, [("k7", "i2")])  # OUT_OF_ORDER_SEQUENCE if its last sequence were lost
    _send(idem2, topic, [("k9", "j2")])
    transaction([("k6", "t4")], commit=True)
    opened.commit_transaction(60)
    for p in (idem, idem2, plain, txn, opened):
        p.flush(10)
    final = _read(bootstrap, topic, "read_committed")
    assert final[: len(ru_expected)] == ru_expected  # the open transaction committed: all of it visible
    assert [(k, v) for _o, k, v in final[len(ru_expected) :]] == [(b"k7", b"i2"), (b"k9", b"j2"), (b"k6", b"t4")]
