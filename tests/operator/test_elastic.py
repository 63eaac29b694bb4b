"""The elastic loop's pure helpers: when the broker set counts as changing, where metrics are."""

from __future__ import annotations

from typing import Any

from automq.broker.balancer.model import BrokerLoad, LoadModel
from automq.broker.balancer.planner import Move
from automq.operator.builders import ClusterRef
from automq.operator.elastic import broker_load_summary, broker_pods, describe_move, metrics_url, scale_in_flight
from automq.operator.spec import AutoMQClusterSpec, parse_spec

REF = ClusterRef("demo", "ns", "uid")


def pod(ordinal: int, ready: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"demo-broker-{ordinal}", **extra},
        "status": {"podIP": f"10.1.0.{ordinal}", "conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def spec(replicas: int) -> AutoMQClusterSpec:
    return parse_spec({"objectStore": {"bucket": "bucket"}, "broker": {"replicas": replicas}})


def sts(replicas: int) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}}


def test_steady_broker_set_is_not_in_flight() -> None:
    pods = {0: pod(0), 1: pod(1)}
    assert scale_in_flight(spec(2), sts(2), pods, {}) is None


def test_each_kind_of_change_in_flight_is_named() -> None:
    pods = {0: pod(0), 1: pod(1)}
    assert scale_in_flight(spec(3), sts(2), pods, {}) == "brokers are being scaled from 2 to 3"
    assert scale_in_flight(spec(3), sts(3), pods, {}) == "broker 2 is not Ready"
    assert scale_in_flight(spec(2), sts(2), {0: pod(0), 1: pod(1, ready=False)}, {}) == "broker 1 is not Ready"
    deleting = {0: pod(0), 1: pod(1, deletionTimestamp="2026-01-01T00:00:00Z")}
    assert scale_in_flight(spec(2), sts(2), deleting, {}) == "broker 1 is not Ready"
    assert "drained" in str(scale_in_flight(spec(2), sts(2), pods, {"drainedBrokers": [1]}))
    assert "above spec.broker.replicas" in str(scale_in_flight(spec(1), sts(1), pods, {}))
    assert scale_in_flight(spec(1), None, {}, {}) == "the broker StatefulSet does not exist yet"


def test_metrics_url_follows_the_pod_annotation_and_ip() -> None:
    assert metrics_url(pod(0)) == "http://10.1.0.0:9094/metrics"
    annotated = pod(1, annotations={"prometheus.io/port": "9999", "prometheus.io/path": "/m"})
    assert metrics_url(annotated) == "http://10.1.0.1:9999/m"
    assert metrics_url({"metadata": {"name": "demo-broker-2"}, "status": {}}) is None


def test_broker_pods_are_this_clusters_ordinals_only() -> None:
    pods = [pod(0), pod(3), {"metadata": {"name": "demo-broker-config"}}, {"metadata": {"name": "demo2-broker-0"}}]
    assert sorted(broker_pods(pods, REF)) == [0, 3]


def test_a_move_is_described_with_its_numbers() -> None:
    text = describe_move(Move("orders", 3, 0, 2, "network", bytes_in=3 * 1024 * 1024, bytes_out=1024 * 1024))
    assert text == "orders-3: 0 -> 2 (network, in 3.00 MiB/s, out 1.00 MiB/s)"


def test_broker_load_summary_names_unmeasured_brokers() -> None:
    model = LoadModel(
        {
            0: BrokerLoad(0, bytes_in=2 * 1024 * 1024, partitions=3, leaders=3, cpu=0.5),
            1: BrokerLoad(1, state="draining"),
        },
        {},
        unmeasured={1: "last scrape failed: connection refused"},
    )
    summary = broker_load_summary(model)
    assert summary["0"] == "in 2.00 MiB/s, out 0.00 MiB/s, 3 partitions, cpu 50%"
    assert summary["1"].endswith("(unmeasured: last scrape failed: connection refused)")
