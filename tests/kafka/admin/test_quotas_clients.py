"""Client quotas end to end: AlterClientQuotas / DescribeClientQuotas sent by kafka-python's
protocol layer (neither confluent-kafka 2.16 nor kafka-python's admin wraps them), and
throttling seen by librdkafka: a producer and a consumer over their byte rates receive
throttle times (confluent-kafka's throttle_cb), a client without a quota next to them does
not. Short quota windows (2 x 1 s) keep it quick; nothing here asserts a duration."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest, DescribeClientQuotasRequest

QUOTAS = {"brokers": 1, "kafka": {"quota_window_num": 2, "quota_window_size_seconds": 1}}


def alter(kadmin: KafkaAdminClient, entries: list[tuple[list[tuple[str, str | None]], dict[str, float | None]]]):
    Entry = AlterClientQuotasRequest.EntryData
    request = AlterClientQuotasRequest(
        entries=[
            Entry(
                entity=[Entry.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                ops=[Entry.OpData(key=k, value=0.0 if v is None else v, remove=v is None) for k, v in ops.items()],
            )
            for entity, ops in entries
        ],
        validate_only=False,
    )
    response = kadmin._manager.run(kadmin._manager.send, request)
    return [(e.error_code, e.error_message) for e in response.entries]


def describe(kadmin: KafkaAdminClient, components: list[tuple[str, int, str | None]], strict: bool = False):
    Component = DescribeClientQuotasRequest.ComponentData
    request = DescribeClientQuotasRequest(
        components=[Component(entity_type=t, match_type=m, match=n) for t, m, n in components], strict=strict
    )
    response = kadmin._manager.run(kadmin._manager.send, request)
    assert response.error_code == 0, response
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
        for entry in response.entries
    }


def produce(bootstrap: str, client_id: str, total: int, throttles: list) -> None:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 5,
            "throttle_cb": lambda event: throttles.append(event.throttle_time),
        }
    )
    chunk = b"x" * 10_000
    for _ in range(total // len(chunk)):
        while True:
            try:
                p.produce("quota-topic", chunk)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    assert p.flush(60) == 0
    p.poll(0.5)


@pytest.mark.parametrize("inprocess_cluster", [QUOTAS], indirect=True)
def test_quotas_are_managed_and_throttle_real_clients(inprocess_cluster) -> None:
    cluster = inprocess_cluster
    bs = cluster.bootstrap
    broker = cluster.brokers[0]
    kadmin = KafkaAdminClient(bootstrap_servers=bs, client_id="quota-admin")
    try:
        answers = alter(
            kadmin,
            [
                ([("client-id", "slow-producer")], {"producer_byte_rate": 100_000.0}),
                ([("client-id", "slow-consumer")], {"consumer_byte_rate": 100_000.0}),
                ([("user", None)], {"request_percentage": 400.0}),
                ([("client-id", "x")], {"no_such_quota": 1.0}),
                ([("user", "a"), ("ip", "10.0.0.1")], {"producer_byte_rate": 1.0}),
            ],
        )
        assert [code for code, _ in answers] == [0, 0, 0, 42, 42]  # INVALID_REQUEST, with a reason
        assert "no_such_quota" in answers[3][1]
        assert describe(kadmin, [("client-id", 2, None)]) == {
            (("client-id", "slow-consumer"),): {"consumer_byte_rate": 100_000.0},
            (("client-id", "slow-producer"),): {"producer_byte_rate": 100_000.0},
        }
        assert describe(kadmin, [("user", 1, None)], strict=True) == {(("user", None),): {"request_percentage": 400.0}}
        assert describe(kadmin, [("client-id", 0, "slow-producer")]) == {
            (("client-id", "slow-producer"),): {"producer_byte_rate": 100_000.0}
        }
    finally:
        kadmin.close()

    # 1 MB at 100 kB/s: librdkafka is told to back off; a client without a quota is not
    slow: list[int] = []
    produce(bs, "slow-producer", 1_000_000, slow)
    assert slow and max(slow) > 0
    fast: list[int] = []
    produce(bs, "fast-producer", 300_000, fast)
    assert not [t for t in fast if t > 0]
    assert broker.quotas.throttled.labels("produce")._value.get() > 0

    consumer_throttles: list[int] = []
    c = Consumer(
        {
            "bootstrap.servers": bs,
            "client.id": "slow-consumer",
            "group.id": "quota-group",
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 1_000_000,
            "throttle_cb": lambda event: consumer_throttles.append(event.throttle_time),
        }
    )
    c.subscribe(["quota-topic"])
    got = 0
    deadline = time.monotonic() + 60
    try:
        while got < 130 and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                got += 1
    finally:
        c.close()
    assert got == 130
    assert consumer_throttles and max(consumer_throttles) > 0
    assert broker.quotas.throttled.labels("fetch")._value.get() > 0

    # removing a quota ends the throttling
    kadmin = KafkaAdminClient(bootstrap_servers=bs, client_id="quota-admin")
    try:
        assert alter(kadmin, [([("client-id", "slow-producer")], {"producer_byte_rate": None})]) == [(0, None)]
        assert (("client-id", "slow-producer"),) not in describe(kadmin, [])
    finally:
        kadmin.close()


@pytest.mark.parametrize("inprocess_cluster", [1], indirect=True)  # Kafka's default windows: 11 x 1 s
def test_controller_mutation_rate_refuses_topic_creation_over_it(inprocess_cluster) -> None:
    from kafka.admin import NewTopic
    from kafka.errors import ThrottlingQuotaExceededError

    bs = inprocess_cluster.bootstrap
    kadmin = KafkaAdminClient(bootstrap_servers=bs, client_id="mutator")
    try:
        assert alter(kadmin, [([("client-id", "mutator")], {"controller_mutation_rate": 2.0})]) == [(0, None)]
        deadline = time.monotonic() + 10
        while not inprocess_cluster.brokers[0].quotas.active:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # under the quota before it: accepted (50 partitions in the 10 s window: 5/s, over 2/s);
        # kafka-python then honours the throttle time and pauses this connection itself
        kadmin.create_topics([NewTopic("burst", 50, 1)])
    finally:
        kadmin.close()
    # another connection of the same client id is refused by the broker while over the quota
    # (the burst stays in the 11-second window)
    again = KafkaAdminClient(bootstrap_servers=bs, client_id="mutator")
    try:
        with pytest.raises(ThrottlingQuotaExceededError):
            again.create_topics([NewTopic("one-more", 1, 1)])
    finally:
        again.close()
    topics = {t.name for t in inprocess_cluster.brokers[0].metadata.topics}
    assert "burst" in topics and "one-more" not in topics
    assert inprocess_cluster.brokers[0].quotas.throttled.labels("mutation")._value.get() >= 2


@pytest.mark.parametrize("inprocess_cluster", [QUOTAS], indirect=True)
def test_connection_creation_rate_closes_connections_over_it(inprocess_cluster) -> None:
    import socket

    kadmin = KafkaAdminClient(bootstrap_servers=inprocess_cluster.bootstrap, client_id="quota-admin")
    try:
        assert alter(kadmin, [([("ip", "127.0.0.1")], {"connection_creation_rate": 2.0})]) == [(0, None)]
    finally:
        kadmin.close()
    broker = inprocess_cluster.brokers[0]
    deadline = time.monotonic() + 10
    while not broker.quotas.ip_active:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    port = inprocess_cluster.ports[0]

    def closed_by_broker(sock: socket.socket, until: float) -> bool:
        sock.settimeout(max(0.05, until - time.monotonic()))
        try:
            return sock.recv(1) == b""
        except TimeoutError:
            return False  # still open: the broker waits for a request
        except ConnectionResetError:
            return True

    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    # every socket has until 2 s after the burst to be closed: one shared deadline, not 2 s per
    # socket one after the other (the kept sockets' waits only added up)
    until = time.monotonic() + 2.0
    try:
        closed = [closed_by_broker(s, until) for s in socks]
    finally:
        for s in socks:
            s.close()
    # a 2/s quota measured over at least 1 s: the first couple are kept, the burst beyond is closed
    assert not closed[0] and sum(closed) >= 10, closed
    assert broker.metrics.connections_closed.labels("connection_creation_rate")._value.get() >= 10
