"""Leader epochs with real processes, through a reassignment and then a kill -9 of the new
leader (its WAL recovered when it restarts): the move gives the partition a newer leader epoch,
which consumers validate their position against (librdkafka, kafka-python, offset resets
disabled); the restarted leader keeps the partition under an epoch that never goes back. Each
consumer goes on from where it was: no false truncation, nothing skipped, nothing read twice."""

import os
import signal
import time

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory, e2e):
    with e2e.running_cluster(tmp_path_factory.mktemp("epochs")) as c:
        yield c


def _epoch(admin, topic: str) -> tuple[int, int]:
    (t,) = admin.describe_topic_partitions([topic])["topics"]
    (p,) = t["partitions"]
    return p["leader_id"], p["leader_epoch"]


def test_consumers_continue_after_the_leader_is_killed(own_cluster, e2e):
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTP
    from kafka.admin import KafkaAdminClient

    cluster = own_cluster
    topic = e2e.topic_name("epk9")
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)
    e2e.produce(cluster.bootstrap, topic, [b"%d" % i for i in range(50)])
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30_000)
    leader, epoch = _epoch(admin, topic)

    rd = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "epk9",
            "auto.offset.reset": "error",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    rd.assign([TopicPartition(topic, 0, 0)])
    tp = KpTP(topic, 0)
    kp = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap,
        auto_offset_reset="none",
        enable_auto_commit=False,
        metadata_max_age_ms=1000,
    )
    kp.assign([tp])
    kp.seek(tp, 0)

    def read(count: int) -> tuple[list[int], list[int]]:
        got_rd: list[int] = []
        got_kp: list[int] = []
        deadline = time.monotonic() + 120
        while (len(got_rd) < count or len(got_kp) < count) and time.monotonic() < deadline:
            for m in rd.consume(100, 0.2):
                err = m.error()
                assert err is None or err.code() == -191, f"librdkafka: {err}"  # only _PARTITION_EOF
                if err is None:
                    got_rd.append(m.offset())
            for records in kp.poll(timeout_ms=200).values():  # raises on a truncation or a reset
                got_kp.extend(r.offset for r in records)
        return got_rd, got_kp

    try:
        assert read(50) == (list(range(50)), list(range(50)))
        target = 2 if leader == 1 else 1
        result = admin.alter_partition_reassignments({tp: [target]})
        assert result[tp] is None, result
        deadline = time.monotonic() + 120
        while _epoch(admin, topic)[0] != target:
            assert time.monotonic() < deadline, "the move did not finish"
            time.sleep(0.3)
        moved_leader, moved_epoch = _epoch(admin, topic)
        assert moved_epoch > epoch
        e2e.produce(cluster.bootstrap, topic, [b"%d" % i for i in range(50, 100)])
        assert read(50) == (list(range(50, 100)), list(range(50, 100)))

        pid = cluster.pids()[f"broker-{moved_leader}"]
        os.kill(pid, signal.SIGKILL)
        cluster.wait_restarted(f"broker-{moved_leader}", pid)
        e2e.wait_for_leaders(cluster.bootstrap, topic, 1)
        e2e.produce(cluster.bootstrap, topic, [b"%d" % i for i in range(100, 150)])
        assert _epoch(admin, topic)[1] >= moved_epoch
        assert read(50) == (list(range(100, 150)), list(range(100, 150)))
    finally:
        rd.close()
        kp.close()
        admin.close()
