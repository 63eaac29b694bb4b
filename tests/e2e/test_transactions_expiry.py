"""transactional.id.expiration.ms end to end: a real broker process started with Kafka's setting
names (`automq local up --set`) forgets an idle transactional id on its own timer, and the id
works again afterwards (a fresh producer id); an id whose transaction is open is kept."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def expiring_cluster(tmp_path_factory, e2e):
    cluster = e2e.LocalCluster(
        tmp_path_factory.mktemp("txn-expiry"),
        1,
        e2e.free_port_block(1),
        sets=[
            "group.initial.rebalance.delay.ms=0",
            "transactional.id.expiration.ms=5000",  # long enough that no step of a client idles so long
            "transaction.remove.expired.transaction.cleanup.interval.ms=500",
        ],
    ).start()
    try:
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            cluster.kill()


def test_idle_transactional_id_expires_and_can_be_used_again(expiring_cluster, e2e):
    c = expiring_cluster
    topic = e2e.topic_name("exp")
    e2e.create_topic(c.bootstrap, topic, partitions=1)
    idle = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": f"{topic}-idle"})
    idle.init_transactions(60)
    idle.begin_transaction()
    idle.produce(topic, value=b"one")
    idle.commit_transaction(60)
    # a second id keeps a transaction open the whole time (timeout 60 s): never expired
    busy = Producer(
        {"bootstrap.servers": c.bootstrap, "transactional.id": f"{topic}-busy", "transaction.timeout.ms": 60_000}
    )
    busy.init_transactions(60)
    busy.begin_transaction()
    busy.produce(topic, value=b"open")
    busy.flush(30)

    deadline = time.monotonic() + 60
    while "expired 1 transactional ids" not in c.grep_logs("transactional ids idle"):
        assert time.monotonic() < deadline, "the idle id was not expired:\n" + c.logs_tail()
        time.sleep(0.2)
    time.sleep(1.5)  # more cleanup runs (every 0.5 s): the open transaction's id must survive them
    assert "expired 2" not in c.grep_logs("transactional ids idle")
    busy.commit_transaction(60)  # still its coordinator's: the commit goes through

    again = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": f"{topic}-idle"})
    again.init_transactions(60)
    again.begin_transaction()
    again.produce(topic, value=b"two")
    again.commit_transaction(60)
    values = [m.value() for m in e2e.consume(c.bootstrap, topic, 3, **{"isolation.level": "read_committed"})]
    assert sorted(values) == [b"one", b"open", b"two"]
