"""Pure builders: every object valid for Kubernetes, owned, labelled, and saying what the spec says."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from automq.broker.config import ConfigError, parse_config
from automq.operator import builders
from automq.operator.builders import ClusterRef
from automq.operator.podconfig import main as podconfig_main
from automq.operator.podconfig import ordinal_of, render_pod_config
from automq.operator.rbac import CLUSTER_RULES
from automq.operator.spec import parse_spec

K8S_VERSION = "1.35"
REF = ClusterRef(name="demo", namespace="streaming", uid="0b7d7c1e-1111-4c4c-8888-000000000001")

SPECS: dict[str, dict[str, Any]] = {
    "minimal": {"objectStore": {"bucket": "automq-data"}},
    "production": {
        "controller": {
            "replicas": 3,
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        },
        "broker": {
            "replicas": 6,
            "resources": {"requests": {"cpu": 2, "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
            "rack": {"enabled": True},
            "wal": {"kind": "volume", "size": "20Gi", "storageClassName": "gp3"},
            "scheduling": {
                "nodeSelector": {"node.kubernetes.io/pool": "kafka"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "kafka", "effect": "NoSchedule"}],
                "priorityClassName": "high",
            },
            "config": {"kafka.num_partitions": "6"},
        },
        "objectStore": {"bucket": "prod-automq", "region": "eu-west-1", "credentialsSecret": {"name": "s3-creds"}},
        "listeners": [{"name": "PLAINTEXT", "port": 9092}, {"name": "REPLICATION_X", "port": 9095}],
        "config": {"storage.log_cache_bytes": "512MiB"},
        "imagePullSecrets": ["regcred"],
        "deletionPolicy": "Delete",
    },
    "s3-wal": {
        "broker": {"replicas": 2, "wal": {"kind": "s3"}},
        "objectStore": {"bucket": "b12", "endpoint": "http://seaweedfs:8333", "pathStyle": True},
        "metrics": {"enabled": False},
    },
    "no-brokers": {"objectStore": {"bucket": "automq-data"}, "broker": {"replicas": 0}},
    "schema-registry": {"objectStore": {"bucket": "automq-data"}, "controller": {"schemaRegistryPort": 8081}},
}


def build(name: str, **changes: Any) -> list[dict[str, Any]]:
    return builders.desired_objects(parse_spec({**SPECS[name], **changes}), REF)


def by_kind(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, (kind, name, [o["metadata"]["name"] for o in matches])
    return matches[0]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_object_is_valid_kubernetes(name: str) -> None:
    for obj in build(name):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_object_is_owned_and_labelled(name: str) -> None:
    objects = build(name)
    assert len({(o["kind"], o["metadata"]["name"]) for o in objects}) == len(objects)
    for obj in objects:
        meta = obj["metadata"]
        assert meta["namespace"] == REF.namespace
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "automq.io/v1alpha1",
                "kind": "AutoMQCluster",
                "name": "demo",
                "uid": REF.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"]["app.kubernetes.io/instance"] == "demo"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "automq-operator"
        assert meta["labels"]["app.kubernetes.io/name"] == "automq"


def test_config_map_holds_a_valid_node_config_per_role() -> None:
    objects = build("production")
    data = by_kind(objects, "ConfigMap")["data"]
    assert set(data) == {"broker.yaml", "controller.yaml"}
    broker = parse_config(yaml.safe_load(data["broker.yaml"]))
    controller = parse_config(yaml.safe_load(data["controller.yaml"]))
    assert broker.object_store_url == "s3://prod-automq?region=eu-west-1"
    assert (
        broker.controller_urls
        == controller.controller_urls
        == [f"https://demo-controller-{i}.demo-controllers.streaming.svc:9093" for i in range(3)]
    )
    assert broker.cluster_id == "streaming-demo"
    assert [(listener.name, listener.port) for listener in broker.listeners] == [
        ("PLAINTEXT", 9092),
        ("REPLICATION_X", 9095),
    ]
    assert broker.http_port == 9094 and controller.http_port == 9093
    assert broker.wal.kind == "volume" and broker.wal.path.startswith(builders.WAL_DIR)
    assert broker.wal.capacity == 18 * 1024**3  # 90 % of 20Gi, whole MiB
    assert broker.kafka.num_partitions == 6 and controller.kafka.num_partitions == 1  # broker-only override
    assert broker.storage.log_cache_bytes == controller.storage.log_cache_bytes == 512 << 20  # cluster-wide override
    assert controller.controller.leadership == "lease"
    assert (
        controller.controller.lease_name == "demo-controller" and controller.controller.lease_namespace == "streaming"
    )


def test_object_store_url_with_endpoint_and_path_style() -> None:
    broker = parse_config(yaml.safe_load(by_kind(build("s3-wal"), "ConfigMap")["data"]["broker.yaml"]))
    assert broker.object_store_url == "s3://b12?endpoint=http://seaweedfs:8333&region=us-east-1&path_style=true"
    assert broker.wal.kind == "s3"


def test_services() -> None:
    objects = build("production")
    bootstrap = by_kind(objects, "Service", "demo-bootstrap")["spec"]
    assert bootstrap["type"] == "ClusterIP"
    assert bootstrap["selector"]["app.kubernetes.io/component"] == "broker"
    assert [(p["name"], p["port"]) for p in bootstrap["ports"]] == [("plaintext", 9092), ("replication-x", 9095)]
    for role, ports in (("broker", {9092, 9095, 9094}), ("controller", {9093})):
        headless = by_kind(objects, "Service", f"demo-{role}s")["spec"]
        assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
        assert {p["port"] for p in headless["ports"]} == ports
        assert headless["selector"] == builders.selector_labels(REF, role)  # type: ignore[arg-type]


def test_rbac_is_leases_only() -> None:
    objects = build("minimal")
    assert by_kind(objects, "Role")["rules"] == CLUSTER_RULES
    binding = by_kind(objects, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "demo"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo", "namespace": "streaming"}]
    assert by_kind(objects, "ServiceAccount")["automountServiceAccountToken"] is False
    pods = {
        r: by_kind(objects, "StatefulSet", f"demo-{r}")["spec"]["template"]["spec"] for r in ("broker", "controller")
    }
    assert pods["controller"]["automountServiceAccountToken"] is True  # Leases
    assert pods["broker"]["automountServiceAccountToken"] is False


def test_pod_disruption_budgets() -> None:
    objects = build("production")
    for role in ("broker", "controller"):
        pdb = by_kind(objects, "PodDisruptionBudget", f"demo-{role}")["spec"]
        assert pdb == {"maxUnavailable": 1, "selector": {"matchLabels": builders.selector_labels(REF, role)}}  # type: ignore[arg-type]


def test_broker_statefulset_with_volume_wal() -> None:
    sts = by_kind(build("production"), "StatefulSet", "demo-broker")
    spec = sts["spec"]
    assert spec["replicas"] == 6
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["serviceName"] == "demo-brokers"
    assert spec["selector"]["matchLabels"] == builders.selector_labels(REF, "broker")
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "wal"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "20Gi"}},
        "storageClassName": "gp3",
    }
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/automq-py/automq:0.1.0"
    assert container["args"] == ["broker", "--config", "/config/node.yaml"]
    assert {"name": "wal", "mountPath": builders.WAL_DIR} in container["volumeMounts"]
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9094, "scheme": "HTTP"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["nodeSelector"] == {"node.kubernetes.io/pool": "kafka"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "kafka", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "high"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}
    # Zone awareness: the rack comes from the pod's zone label, brokers spread over zones.
    assert env["AUTOMQ_RACK"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['topology.kubernetes.io/zone']"
    zone_spread = [c for c in pod["topologySpreadConstraints"] if c["topologyKey"] == "topology.kubernetes.io/zone"]
    assert zone_spread and zone_spread[0]["whenUnsatisfiable"] == "DoNotSchedule"


def test_env_variables_are_defined_before_they_are_referenced() -> None:
    for sts in (o for o in build("production") if o["kind"] == "StatefulSet"):
        pod = sts["spec"]["template"]["spec"]
        for container in pod["initContainers"] + pod["containers"]:
            defined: set[str] = set()
            for var in container["env"]:
                for ref in __import__("re").findall(r"\$\((\w+)\)", var.get("value", "")):
                    assert ref in defined, (container["name"], var["name"], ref)
                defined.add(var["name"])


def test_broker_statefulset_with_s3_wal_has_no_volume() -> None:
    sts = by_kind(build("s3-wal"), "StatefulSet", "demo-broker")
    assert "volumeClaimTemplates" not in sts["spec"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert all(m["name"] != "wal" for m in container["volumeMounts"])
    env = {e["name"] for e in container["env"]}
    assert "AWS_ACCESS_KEY_ID" not in env and "AUTOMQ_RACK" in env  # the node's zone, even without spreading
    assert "prometheus.io/scrape" not in sts["spec"]["template"]["metadata"]["annotations"]


def test_controller_statefulset() -> None:
    sts = by_kind(build("production"), "StatefulSet", "demo-controller")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert "volumeClaimTemplates" not in sts["spec"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "controller"
    assert container["readinessProbe"]["httpGet"]["port"] == 9093
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AUTOMQ_NODE_ID_BASE"] == "1000" and env["AUTOMQ_ROLE"] == "controller"


def _template_hashes(spec: dict[str, Any]) -> dict[str, str]:
    parsed = parse_spec(spec)
    return {role: builders.template_hash(builders.statefulset(parsed, REF, role)) for role in builders.ROLES}


def test_template_hash_changes_exactly_when_pods_must_restart() -> None:
    base = SPECS["production"]
    before = _template_hashes(base)
    assert _template_hashes(base) == before  # deterministic
    # Scaling changes no pod.
    assert _template_hashes({**base, "broker": {**base["broker"], "replicas": 9}}) == before
    # A broker resource change restarts brokers only.
    more_cpu = {**base, "broker": {**base["broker"], "resources": {"requests": {"cpu": 3}}}}
    after = _template_hashes(more_cpu)
    assert after["broker"] != before["broker"] and after["controller"] == before["controller"]
    # A cluster-wide config change restarts both roles, through the config hash.
    config = _template_hashes({**base, "config": {"storage.log_cache_bytes": "1GiB"}})
    assert config["broker"] != before["broker"] and config["controller"] != before["controller"]
    # Adding a controller changes every node's controller_urls: everything restarts.
    assert _template_hashes({**base, "controller": {**base["controller"], "replicas": 5}})["broker"] != before["broker"]
    # A new image restarts both.
    image = _template_hashes({**base, "image": "ghcr.io/automq-py/automq:0.2.0"})
    assert image["broker"] != before["broker"] and image["controller"] != before["controller"]


def test_scale_in_override_keeps_the_template() -> None:
    spec = parse_spec(SPECS["production"])
    draining = builders.statefulset(spec, REF, "broker", replicas=7)
    assert draining["spec"]["replicas"] == 7
    assert builders.template_hash(draining) == builders.template_hash(builders.statefulset(spec, REF, "broker"))


def test_selector_and_bootstrap_strings() -> None:
    spec = parse_spec(SPECS["minimal"])
    assert (
        builders.broker_selector(REF)
        == "app.kubernetes.io/component=broker,app.kubernetes.io/instance=demo,app.kubernetes.io/name=automq"
    )
    assert builders.bootstrap_address(spec, REF) == "demo-bootstrap.streaming.svc:9092"


# ------------------------------------------------------------------------------------------
# podconfig: the init step that makes the role template this pod's config


def _template(role: str) -> dict[str, Any]:
    data = by_kind(build("production"), "ConfigMap")["data"]
    return yaml.safe_load(data[f"{role}.yaml"])


def test_pod_config_for_a_broker() -> None:
    env = {
        "POD_NAME": "demo-broker-4",
        "AUTOMQ_ROLE": "broker",
        "AUTOMQ_NODE_ID_BASE": "0",
        "AUTOMQ_ADVERTISED_HOST": "demo-broker-4.demo-brokers.streaming.svc",
        "AUTOMQ_RACK": "eu-west-1b",
    }
    config = render_pod_config(_template("broker"), env)
    assert config.node_id == 4 and config.rack == "eu-west-1b"
    assert {listener.advertised_host for listener in config.listeners} == {"demo-broker-4.demo-brokers.streaming.svc"}


def test_pod_config_for_a_controller() -> None:
    env = {
        "POD_NAME": "demo-controller-2",
        "AUTOMQ_ROLE": "controller",
        "AUTOMQ_NODE_ID_BASE": "1000",
        "AUTOMQ_ADVERTISED_HOST": "demo-controller-2.demo-controllers.streaming.svc",
    }
    config = render_pod_config(_template("controller"), env)
    assert config.node_id == 1002 and config.rack is None
    assert config.controller.advertised_url == "https://demo-controller-2.demo-controllers.streaming.svc:9093"


def test_pod_config_rejects_hostile_environment() -> None:
    with pytest.raises(ConfigError, match="POD_NAME"):
        render_pod_config(_template("broker"), {})
    with pytest.raises(ValueError, match="ordinal"):
        render_pod_config(_template("broker"), {"POD_NAME": "demo-broker"})
    with pytest.raises(ValueError, match="ordinal"):
        ordinal_of("demo-broker-x1")
    with pytest.raises(ConfigError, match="node_id"):
        render_pod_config(_template("broker"), {"POD_NAME": "demo-broker-1", "AUTOMQ_NODE_ID_BASE": "-5"})


def test_podconfig_command(tmp_path, monkeypatch, capsys) -> None:
    template = tmp_path / "broker.yaml"
    template.write_text(by_kind(build("minimal"), "ConfigMap")["data"]["broker.yaml"])
    out = tmp_path / "out" / "node.yaml"
    monkeypatch.setenv("POD_NAME", "demo-broker-7")
    assert podconfig_main(["--template", str(template), "--out", str(out)]) == 0
    assert parse_config(yaml.safe_load(out.read_text())).node_id == 7
    template.write_text("wal: {kind: tape}\n")
    assert podconfig_main(["--template", str(template), "--out", str(out)]) == 2
    assert "wal.kind" in capsys.readouterr().err


def test_default_resources_fill_only_what_the_spec_leaves_out() -> None:
    from automq.operator.builders import DEFAULT_RESOURCES, _resources
    from automq.operator.spec import Resources

    assert _resources(Resources(), "broker") == DEFAULT_RESOURCES["broker"]
    assert _resources(Resources(), "controller") == DEFAULT_RESOURCES["controller"]
    # A memory request alone is not capped by the default memory limit (request > limit is invalid).
    mine = _resources(Resources(requests={"memory": "4Gi"}), "broker")
    assert mine == {"requests": {"cpu": "500m", "memory": "4Gi"}}
    # A memory limit alone: no default request that could exceed it.
    assert _resources(Resources(limits={"memory": "512Mi"}), "broker") == {
        "requests": {"cpu": "500m"},
        "limits": {"memory": "512Mi"},
    }
    everything = Resources(requests={"cpu": "2", "memory": "8Gi"}, limits={"memory": "8Gi"})
    assert _resources(everything, "broker") == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}


def test_schema_registry_port() -> None:
    """controller.schemaRegistryPort: the node config, a container port, a Service port, and a
    NetworkPolicy rule that lets the Kafka clients (kafkaFrom) reach that port only."""
    from automq.operator import network_policies

    spec = parse_spec(SPECS["schema-registry"])
    objects = builders.desired_objects(spec, REF)
    controller = parse_config(yaml.safe_load(by_kind(objects, "ConfigMap")["data"]["controller.yaml"]))
    broker = parse_config(yaml.safe_load(by_kind(objects, "ConfigMap")["data"]["broker.yaml"]))
    assert controller.controller.schema_registry_port == 8081 and broker.controller.schema_registry_port is None
    service = by_kind(objects, "Service", "demo-controllers")["spec"]
    assert ("schema-registry", 8081) in [(p["name"], p["port"]) for p in service["ports"]]
    pod = by_kind(objects, "StatefulSet", "demo-controller")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "schema-registry", "containerPort": 8081, "protocol": "TCP"} in pod["ports"]
    assert spec.network_policies()
    policy = next(
        p for p in network_policies.network_policies(spec, REF) if p["metadata"]["name"].endswith("controller")
    )
    rules = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 8081]
    assert len(rules) == 1 and rules[0].get("from") == spec.security.network_policies.kafka_from
    with pytest.raises(ValueError, match="controller port"):
        parse_spec({**SPECS["minimal"], "controller": {"schemaRegistryPort": 9093}})
    without = builders.desired_objects(parse_spec(SPECS["minimal"]), REF)
    assert all(p["port"] != 8081 for p in by_kind(without, "Service", "demo-controllers")["spec"]["ports"])
