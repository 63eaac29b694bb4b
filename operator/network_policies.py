"""NetworkPolicies of one AutoMQCluster (pure: spec in, manifests out).

Two policies, one per role, each allowing only what the role serves:

    demo-broker      Kafka listeners: from `kafkaFrom` peers (everyone when absent; clients
                     authenticate on the listener); REPLICATION (broker-to-broker, no
                     credentials, only rendered when every internal listener is OAUTHBEARER):
                     from this cluster's brokers only; HTTP port (/metrics,
                     /healthz, /readyz): from `metricsFrom` peers (everyone when absent) and from
                     the operator (the balancer and autoscaler read broker metrics).
    demo-controller  controller API: from this cluster's brokers and controllers, its Spark job
                     pods, and the operator; also from `metricsFrom` peers when given and the API
                     requires a token (they then reach only its open paths: /metrics, probes).

Only ingress is restricted: nodes reach the object store, the Kubernetes API (Leases) and each
other, and an egress policy would have to know the object store's address. Kubelet probes come
from the node and are not subject to NetworkPolicies in the common CNIs. A policy is enforced
only by a CNI that implements NetworkPolicy (Calico, Cilium, ...); with others it is inert.
"""

from __future__ import annotations

from typing import Any

from automq.operator.builders import (
    BROKER_HTTP_PORT,
    CONTROLLER_PORT,
    ClusterRef,
    Role,
    _metadata,
    broker_listeners,
    selector_labels,
)
from automq.operator.spec import REPLICATION_LISTENER, AutoMQClusterSpec

OPERATOR_POD_LABELS = {"app.kubernetes.io/component": "operator", "app.kubernetes.io/part-of": "automq"}
SPARK_JOB_COMPONENT = "spark-job"


def policy_name(ref: ClusterRef, role: Role) -> str:
    return f"{ref.name}-{role}"


def _operator_peer(spec: AutoMQClusterSpec) -> dict[str, Any]:
    namespace = spec.security.network_policies.operator_namespace
    peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}
    if namespace:
        peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    else:
        peer["namespaceSelector"] = {}  # any namespace: the operator usually runs in its own
    return peer


def _pods(ref: ClusterRef, role: str) -> dict[str, Any]:
    labels = selector_labels(ref)
    labels["app.kubernetes.io/component"] = role
    return {"podSelector": {"matchLabels": labels}}


def _rule(port: int, peers: list[dict[str, Any]] | None) -> dict[str, Any]:
    rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": port}]}
    if peers is not None:
        rule["from"] = [dict(p) for p in peers]  # absent "from": every source
    return rule


def network_policies(spec: AutoMQClusterSpec, ref: ClusterRef) -> list[dict[str, Any]]:
    if not spec.network_policies():
        return []
    settings = spec.security.network_policies
    brokers, controllers, spark = _pods(ref, "broker"), _pods(ref, "controller"), _pods(ref, SPARK_JOB_COMPONENT)
    operator = _operator_peer(spec)
    metrics_from = settings.metrics_from
    broker_rules = []
    for listener in broker_listeners(spec):
        if listener.name == REPLICATION_LISTENER:
            broker_rules.append(_rule(listener.port, [brokers]))
        else:
            broker_rules.append(_rule(listener.port, settings.kafka_from))
    broker_rules.append(_rule(BROKER_HTTP_PORT, None if metrics_from is None else [*metrics_from, operator]))
    controller_peers = [brokers, controllers, spark, operator]
    controller_rules = [_rule(CONTROLLER_PORT, controller_peers)]
    if metrics_from:
        controller_rules.append(_rule(CONTROLLER_PORT, metrics_from))
    # the registry-only port (no controller API there) is for the Kafka clients' serializers
    registry = (
        []
        if spec.controller.schema_registry_port is None
        else [_rule(spec.controller.schema_registry_port, settings.kafka_from)]
    )
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata(ref, policy_name(ref, "broker"), "broker"),
            "spec": {
                "podSelector": {"matchLabels": selector_labels(ref, "broker")},
                "policyTypes": ["Ingress"],
                "ingress": broker_rules,
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata(ref, policy_name(ref, "controller"), "controller"),
            "spec": {
                "podSelector": {"matchLabels": selector_labels(ref, "controller")},
                "policyTypes": ["Ingress"],
                # With a token on the API, metrics scrapers reach only its open paths; without
                # one the API is as open as the port, so only the cluster's own pods get in.
                "ingress": (controller_rules if spec.controller_token() else [_rule(CONTROLLER_PORT, controller_peers)])
                + registry,
            },
        },
    ]
