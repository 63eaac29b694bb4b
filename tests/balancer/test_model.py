"""The load model from broker metric samples: rates, and 'incomplete' instead of partial data."""

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from automq.broker.balancer.model import (
    DRAINING,
    FENCED,
    BrokerMeta,
    BrokerSample,
    ClusterMetadata,
    Incomplete,
    LoadModel,
    MetricsFormatError,
    build_model,
    parse_metrics,
)
from automq.broker.controller.protocol import (
    METRICS_LISTENER,
    BrokerInfo,
    Endpoint,
    MetadataImage,
    PartitionInfo,
    TopicInfo,
)
from automq.broker.kafka.metrics import KafkaMetrics


def exposition(metrics: KafkaMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_broker_metrics_parse_per_partition_and_disappear_when_moved():
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    m = KafkaMetrics(registry)
    m.partition_opened("orders", 0)
    m.partition_opened("orders", 1)
    m.record_produce("orders", 0, 1000, 10)
    m.record_produce("orders", 0, 500, 5)
    m.record_fetch("orders", 0, 3000)
    m.network_in.inc(2000)
    m.network_out.inc(4000)
    text = exposition(m)
    assert 'kafka_server_brokertopicmetrics_bytesin_total{partition="0",topic="orders"} 1500.0' in text
    sample = parse_metrics(text, at=5.0)
    assert sample.partitions[("orders", 0)] == (1500.0, 3000.0, 15.0)
    assert sample.partitions[("orders", 1)] == (0.0, 0.0, 0.0)  # led, idle: present at zero
    assert sample.network_in == 2000 and sample.network_out == 4000
    assert sample.cpu_seconds is not None and sample.start_time is not None
    m.partition_closed("orders", 0)
    m.record_produce("orders", 0, 100, 1)  # a late append after the move must not revive it
    assert ("orders", 0) not in parse_metrics(exposition(m), at=6.0).partitions
    assert "orders" in exposition(m)  # per-topic series stay until the topic is deleted


def test_garbage_is_a_format_error():
    with pytest.raises(MetricsFormatError):
        parse_metrics('kafka_server_brokertopicmetrics_bytesin_total{topic="a",partition="x"} 1\n', 0.0)


def cluster(leaders, states=None):
    brokers = {b: BrokerMeta(b, None, (states or {}).get(b, "active"), f"http://b{b}") for b in (1, 2)}
    return ClusterMetadata(brokers, leaders)


def sample(at, parts, cpu=0.0, start=100.0):
    return BrokerSample(at, parts, cpu, 0.0, 0.0, start)


def test_rates_over_the_window():
    c = cluster({("t", 0): 1, ("t", 1): 2})
    history = {
        1: [sample(0.0, {("t", 0): (0, 0, 0)}, cpu=1.0), sample(10.0, {("t", 0): (10_000, 20_000, 100)}, cpu=6.0)],
        2: [sample(0.0, {("t", 1): (0, 0, 0)}), sample(10.0, {("t", 1): (0, 0, 0)})],
    }
    m = build_model(c, history, now=11.0)
    assert isinstance(m, LoadModel)
    assert m.partitions[("t", 0)].bytes_in == 1000 and m.partitions[("t", 0)].bytes_out == 2000
    assert m.brokers[1].bytes_in == 1000 and m.brokers[1].messages_in == 10 and m.brokers[1].cpu == 0.5
    assert m.brokers[2].bytes_in == 0 and m.brokers[2].partitions == 1
    assert m.window_s == 10.0


def test_a_series_left_on_a_broker_that_no_longer_leads_is_ignored():
    c = cluster({("t", 0): 2})
    history = {
        1: [sample(0.0, {("t", 0): (0, 0, 0)}), sample(10.0, {("t", 0): (9e9, 0, 0)})],
        2: [sample(0.0, {("t", 0): (0, 0, 0)}), sample(10.0, {("t", 0): (100, 0, 0)})],
    }
    m = build_model(c, history, now=10.0)
    assert m.partitions[("t", 0)].leader == 2 and m.brokers[1].bytes_in == 0


@pytest.mark.parametrize(
    ("history", "errors", "now", "why"),
    [
        ({1: [sample(0.0, {})]}, {}, 1.0, "1 scrape"),
        ({1: [sample(0.0, {}), sample(5.0, {})]}, {1: "connection refused"}, 6.0, "connection refused"),
        ({1: [sample(0.0, {}), sample(5.0, {})]}, {}, 500.0, "old"),
        ({1: [sample(0.0, {}, start=1.0), sample(5.0, {}, start=2.0)]}, {}, 6.0, "restarted"),
        ({1: [sample(0.0, {("t", 0): (5, 0, 0)}), sample(5.0, {("t", 0): (1, 0, 0)})]}, {}, 6.0, "backwards"),
        ({1: [sample(0.0, {}), sample(5.0, {("t", 0): (1, 0, 0)})]}, {}, 6.0, "only one sample"),
        ({1: [sample(0.0, {}), sample(5.0, {})]}, {}, 6.0, "does not report it"),
    ],
)
def test_missing_or_stale_data_of_one_broker_is_incomplete_naming_it(history, errors, now, why):
    c = cluster({("t", 0): 1, ("t", 1): 2})
    history = {**history, 2: [sample(now - 6, {("t", 1): (0, 0, 0)}), sample(now - 1, {("t", 1): (0, 0, 0)})]}
    result = build_model(c, history, now=now, errors=errors)
    assert isinstance(result, Incomplete), result
    assert result.brokers == [1]
    assert why in str(result) and "broker 1" in str(result)


def test_fenced_broker_is_not_scraped_and_its_partitions_count_as_unplaced_load():
    c = cluster({("t", 0): 1, ("t", 1): 2}, states={1: FENCED})
    history = {2: [sample(0.0, {("t", 1): (0, 0, 0)}), sample(5.0, {("t", 1): (50, 0, 0)})]}
    m = build_model(c, history, now=6.0)
    assert isinstance(m, LoadModel)
    assert m.partitions[("t", 0)].leader == 1 and m.brokers[1].state == FENCED


def test_from_controller_image_keeps_states_and_moves():
    image = MetadataImage(
        7,
        "c",
        0,
        (
            BrokerInfo(1, 1, (), "a", "active"),
            BrokerInfo(
                2, 1, (Endpoint("PLAINTEXT", "h2", 9092), Endpoint(METRICS_LISTENER, "h2", 9094)), "b", DRAINING
            ),
        ),
        (TopicInfo("t", "id", (PartitionInfo("t", 0, 0, 1, 3), PartitionInfo("t", 1, 1, 2, 3, "moving", 1))),),
    )
    c = ClusterMetadata.from_image(image, {1: "http://x/metrics"}, not_ready=[1])
    assert c.brokers[1].state == "not-ready" and c.brokers[1].metrics_url == "http://x/metrics"
    assert c.brokers[2].state == DRAINING and c.brokers[2].rack == "b"
    assert c.brokers[2].metrics_url == "http://h2:9094/metrics"  # registered with the controller
    assert c.moving == {("t", 1): 1}
    history = {b: [sample(0.0, {}), sample(5.0, {("t", 0): (0, 0, 0)} if b == 1 else {})] for b in (1, 2)}
    result = build_model(c, history, now=6.0)
    assert isinstance(result, Incomplete) and "moving" in str(result)


@pytest.mark.parametrize("state", [DRAINING, "not-ready"])
def test_a_leaving_broker_without_metrics_does_not_block_emptying_it(state):
    from automq.broker.balancer.planner import EVACUATE, plan

    c = cluster({("t", 0): 1, ("t", 1): 2}, states={1: state})
    history = {2: [sample(0.0, {("t", 1): (0, 0, 0)}), sample(5.0, {("t", 1): (50, 0, 0)})]}
    m = build_model(c, history, now=6.0, errors={1: "connection refused"})
    assert isinstance(m, LoadModel), m
    assert "connection refused" in m.unmeasured[1]
    assert m.partitions[("t", 0)].bytes_in == 0 and m.partitions[("t", 1)].bytes_in == 10
    moves = plan(m).moves
    assert [(mv.key, mv.target, mv.goal) for mv in moves] == [(("t", 0), 2, EVACUATE)]
    # an active broker missing the same way still blocks every decision
    assert isinstance(build_model(cluster(c.leaders), history, now=6.0, errors={1: "connection refused"}), Incomplete)
