"""The operator's security slice as pure functions and against a fake API: spec.listeners and
spec.security (pydantic and the CRD's CEL rules, evaluated by cel-python), what they render
(node config, Services, pod volumes, NetworkPolicies, cert-manager resources; every object
validated by kubernetes-validate), the secure-defaults pin, the operator's CAs and certificates
(issue, renew, rotate the CA; a real TLS handshake checks the names), and podconfig's external
addresses. The end-to-end proof with real processes is tests/e2e/test_operator_security.py."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime as dt
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from automq.broker.config import NodeConfig
from automq.operator import builders, certificates, network_policies, security, sparkjobs
from automq.operator.builders import ClusterRef
from automq.operator.crd import CRD_FILE
from automq.operator.podconfig import render_pod_config
from automq.operator.spec import InvalidSpec, parse_spec

REF = ClusterRef("demo", "kafka", "uid-1")
MINIMAL = {"objectStore": {"bucket": "demo-bucket"}}
NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


def spec_with(**extra: Any) -> Any:
    return parse_spec({**MINIMAL, **extra})


def broker_config(spec: Any) -> NodeConfig:
    return NodeConfig.model_validate(yaml.safe_load(builders.config_map(spec, REF)["data"]["broker.yaml"]))


# ------------------------------------------------------------------------------ defaults


def test_a_new_cluster_is_secure_by_default() -> None:
    spec = spec_with()
    config = broker_config(spec)
    assert [(lst.name, lst.port, lst.security_protocol) for lst in config.listeners] == [("INTERNAL", 9092, "SASL_SSL")]
    # Brokers call each other on INTERNAL as their own SCRAM user, a super user (WriteTxnMarkers
    # needs CLUSTER_ACTION once an authorizer is on); no unauthenticated port anywhere.
    assert config.kafka.inter_broker_listener_name == "INTERNAL"
    assert config.security.sasl_mechanism_inter_broker_protocol == "SCRAM-SHA-512"
    assert config.security.sasl_inter_broker_jaas_config_file == "/etc/automq-broker-credentials/inter-broker.jaas"
    assert config.kafka.super_users == "User:__automq-broker"
    assert config.security.sasl_enabled_mechanisms == ["SCRAM-SHA-512"]
    assert config.tls.cert_file == "/etc/automq-tls/tls.crt" and config.tls.client_auth == "none"
    assert config.security.controller_token_file == "/etc/automq-token/token"
    assert spec.controller_token() and spec.network_policies()
    # The bootstrap Service fronts the client listener only; REPLICATION is on the headless one.
    bootstrap, headless, _ = builders.services(spec, REF)[:3]
    assert [p["port"] for p in bootstrap["spec"]["ports"]] == [9092]
    assert [p["port"] for p in headless["spec"]["ports"]] == [9092, 9094]


def test_broker_to_broker_listener_and_credentials() -> None:
    from automq.operator.spec import inter_broker_listener

    def inter(*listeners: dict[str, Any]) -> str | None:
        found = inter_broker_listener(spec_with(listeners=list(listeners)).listeners)
        return found.name if found else None

    scram = {"name": "S", "port": 9092, "tls": True, "authentication": {"type": "scram-sha-256"}}
    mtls = {"name": "M", "port": 9093, "tls": True, "authentication": {"type": "tls"}}
    plain = {"name": "P", "port": 9095}
    assert inter(scram, mtls, plain) == "P" and inter(scram, mtls) == "M" and inter(scram) == "S"
    # A SCRAM-SHA-256 listener: the brokers' stored credential is SCRAM-SHA-256 too.
    spec = spec_with(listeners=[scram])
    assert security.broker_scram_mechanism(spec) == "SCRAM-SHA-256"
    kube = FakeKube()
    password = asyncio.run(security.ensure_broker_credentials(kube, spec, REF))
    assert password and asyncio.run(security.ensure_broker_credentials(kube, spec, REF)) == password  # kept
    jaas = _data(kube, "demo-broker-credentials")["inter-broker.jaas"].decode()
    assert jaas == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="__automq-broker" password="{password}";'
    )
    # spec.config's super users are kept; the brokers' principal is added.
    config = broker_config(spec_with(listeners=[scram], config={"kafka.super_users": "User:admin"}))
    assert config.kafka.super_users == "User:admin;User:__automq-broker"
    assert asyncio.run(security.ensure_broker_credentials(FakeKube(), spec_with(listeners=[mtls]), REF)) is None


def test_a_legacy_cluster_keeps_plaintext_and_its_config_is_unchanged() -> None:
    legacy = parse_spec(MINIMAL, legacy=True)
    explicit = spec_with(
        listeners=[{"name": "PLAINTEXT", "port": 9092}],
        security={"controllerApi": {"authentication": "none", "tls": False}, "networkPolicies": {"enabled": False}},
    )
    assert not legacy.controller_token() and not legacy.network_policies() and not legacy.controller_tls()
    assert builders.controller_urls(legacy, REF) == ["http://demo-controller-0.demo-controllers.kafka.svc:9093"]
    # Same node config and pod template as an explicitly plaintext cluster: upgrading the operator
    # rolls no pod of a cluster that predates the secure defaults.
    assert builders.config_map(legacy, REF) == builders.config_map(explicit, REF)
    assert builders.pod_template(legacy, REF, "broker") == builders.pod_template(explicit, REF, "broker")
    config = broker_config(legacy)
    assert [(lst.name, lst.security_protocol) for lst in config.listeners] == [("PLAINTEXT", "PLAINTEXT")]
    assert config.kafka.inter_broker_listener_name is None and config.security.controller_token_file is None
    assert network_policies.network_policies(legacy, REF) == []


class FakeKube:
    """get / create / merge-patch / delete / list of whole objects, as the API server does them."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[str] = []

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, name)))

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = (obj["kind"], obj["metadata"]["name"])
        assert key not in self.objects
        self.objects[key] = copy.deepcopy(obj)
        self.writes.append(f"create {key}")
        return obj

    async def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any], sub: str | None = None) -> Any:
        def merge(into: dict[str, Any], p: dict[str, Any]) -> None:
            for k, v in p.items():
                if v is None:
                    into.pop(k, None)
                elif isinstance(v, dict) and isinstance(into.get(k), dict):
                    merge(into[k], v)
                else:
                    into[k] = copy.deepcopy(v)

        merge(self.objects.setdefault((kind, name), {"kind": kind, "metadata": {"name": name}}), patch)
        self.writes.append(f"patch {(kind, name)}")
        return self.objects[(kind, name)]


def test_the_pin_is_decided_once_from_what_exists() -> None:
    kube = FakeKube()
    new = {"metadata": {"name": "demo"}}
    assert asyncio.run(security.pin_security_defaults(kube, new, REF)) == (False, True)
    assert kube.objects[("AutoMQCluster", "demo")]["metadata"]["annotations"] == {
        "automq.io/security-defaults": "secure"
    }
    assert asyncio.run(security.pin_security_defaults(kube, new, REF)) == (False, False)  # sticky

    kube = FakeKube()
    kube.objects[("ConfigMap", "demo-config")] = {"kind": "ConfigMap"}  # reconciled by an older operator
    old = {"metadata": {"name": "demo"}}
    assert asyncio.run(security.pin_security_defaults(kube, old, REF)) == (True, True)
    assert old["metadata"]["annotations"]["automq.io/security-defaults"] == "legacy"


def test_clusters_whose_nodes_call_controllers_over_http_keep_http_by_default() -> None:
    """An operator upgrade must not flip running nodes to https controllers: brokers would roll
    to https URLs while the controllers (rolled last) still serve http, and the roll would stall."""
    from automq.operator.spec import parse_cluster

    kube = FakeKube()
    kube.objects[("AutoMQCluster", "demo")] = {"metadata": {"name": "demo"}}
    new = {"metadata": {"name": "demo"}}
    assert asyncio.run(security.pin_controller_scheme(kube, new, REF)) is False
    assert new["metadata"]["annotations"]["automq.io/controller-api-scheme"] == "https"
    assert parse_cluster({**new, "spec": MINIMAL}).controller_tls()

    kube = FakeKube()
    kube.objects[("AutoMQCluster", "demo")] = {"metadata": {"name": "demo"}}
    old_config = builders.config_map(spec_with(security={"controllerApi": {"tls": False}}), REF)
    kube.objects[("ConfigMap", "demo-config")] = old_config
    old = {"metadata": {"name": "demo"}}
    assert asyncio.run(security.pin_controller_scheme(kube, old, REF)) is True
    assert kube.objects[("AutoMQCluster", "demo")]["metadata"]["annotations"] == {
        "automq.io/controller-api-scheme": "http"
    }
    assert not parse_cluster({**old, "spec": MINIMAL}).controller_tls()
    explicit = {**old, "spec": {**MINIMAL, "security": {"controllerApi": {"tls": True}}}}
    assert parse_cluster(explicit).controller_tls()  # opting in is the spec's to say
    kube.objects[("ConfigMap", "demo-config")] = builders.config_map(spec_with(), REF)
    assert asyncio.run(security.pin_controller_scheme(kube, old, REF)) is True  # sticky


# ------------------------------------------------------------------------------ validation

LISTENER_ITEM = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
    "spec"
]["properties"]["listeners"]["items"]


def cel_failures(item: dict[str, Any]) -> list[str]:
    """The CRD's rules on one listener, evaluated as the API server does (after defaulting)."""
    env = celpy.Environment()
    obj = copy.deepcopy(item)
    for name, prop in LISTENER_ITEM["properties"].items():
        if name not in obj and "default" in prop:
            obj[name] = prop["default"]
    failures = []
    nodes = [(LISTENER_ITEM, obj)]
    if "authentication" in obj:
        nodes.append((LISTENER_ITEM["properties"]["authentication"], obj["authentication"]))
    for schema, value in nodes:
        for rule in schema.get("x-kubernetes-validations", []):
            result = env.program(env.compile(rule["rule"])).evaluate({"self": celpy.json_to_cel(value)})
            assert not isinstance(result, celpy.CELEvalError), (rule, result)
            if not result:
                failures.append(rule["message"])
    return failures


@pytest.mark.parametrize(
    ("listener", "mentions"),
    [
        ({"name": "A", "port": 9092, "authentication": {"type": "tls"}}, "needs tls: true"),
        ({"name": "A", "port": 9092, "type": "nodeport"}, "nodePortBase"),
        ({"name": "A", "port": 9092, "type": "loadbalancer"}, "advertisedHostTemplate"),
        ({"name": "A", "port": 9092, "nodePortBase": 31000}, "only apply"),
        (
            {"name": "A", "port": 9092, "authentication": {"type": "scram-sha-512", "jwksSecret": {"name": "idp"}}},
            "only apply to oauthbearer",
        ),
    ],
)
def test_listener_rules_in_pydantic_and_cel(listener: dict[str, Any], mentions: str) -> None:
    with pytest.raises(InvalidSpec) as exc:
        spec_with(listeners=[{"name": "IN", "port": 9093}, listener])
    assert mentions in str(exc.value)
    assert any(mentions in failure for failure in cel_failures(listener)), cel_failures(listener)


def test_oauthbearer_listener_mounts_the_jwks_secret() -> None:
    oauth = {
        "name": "OAUTH",
        "port": 9092,
        "tls": True,
        "authentication": {
            "type": "oauthbearer",
            "jwksSecret": {"name": "idp-keys", "key": "keys.json"},
            "expectedIssuer": "https://idp.example.com",
            "expectedAudience": "kafka",
        },
    }
    assert cel_failures(oauth) == []
    spec = spec_with(listeners=[oauth])
    config = broker_config(spec)
    assert config.security.sasl_enabled_mechanisms == ["OAUTHBEARER"]
    assert config.security.sasl_oauthbearer_jwks_file == "/etc/automq-oauth/keys.json"
    assert config.security.sasl_oauthbearer_expected_issuer == "https://idp.example.com"
    assert config.security.sasl_oauthbearer_expected_audience == "kafka"
    pod = builders.pod_template(spec, REF, "broker")["spec"]
    assert {"name": "oauth-jwks", "secret": {"secretName": "idp-keys", "defaultMode": 0o440}} in pod["volumes"]
    # OAUTHBEARER only: the brokers cannot authenticate to each other, REPLICATION is added.
    assert [lst.name for lst in config.listeners] == ["OAUTH", "REPLICATION"]
    kubernetes_validate.validate(builders.statefulset(spec, REF, "broker"), "1.31", strict=True)

    without_keys = {**oauth, "authentication": {"type": "oauthbearer"}}
    with pytest.raises(InvalidSpec, match="jwksSecret"):
        spec_with(listeners=[without_keys])
    spec_with(listeners=[without_keys], config={"security.sasl_oauthbearer_allow_unsecured": "true"})
    other = {
        **oauth,
        "name": "OTHER",
        "port": 9093,
        "authentication": {**oauth["authentication"], "expectedAudience": "x"},
    }
    with pytest.raises(InvalidSpec, match="same jwksSecret"):
        spec_with(listeners=[oauth, other])


def test_valid_listeners_pass_cel() -> None:
    for listener in (
        {"name": "IN", "port": 9092, "tls": True, "authentication": {"type": "tls"}},
        {"name": "EXT", "port": 9095, "type": "nodeport", "nodePortBase": 31000},
        {"name": "LB", "port": 9096, "type": "loadbalancer", "advertisedHostTemplate": "k-{ordinal}.example.com"},
    ):
        assert cel_failures(listener) == []


@pytest.mark.parametrize(
    ("extra", "mentions"),
    [
        ({"listeners": [{"name": "E", "port": 9095, "type": "nodeport", "nodePortBase": 31000}]}, "type internal"),
        (
            {
                "listeners": [{"name": "IN", "port": 9091, "tls": True, "authentication": {"type": "oauthbearer"}}],
                "config": {"security.sasl_oauthbearer_allow_unsecured": "true"},
            },
            "REPLICATION",
        ),
        (
            {
                "listeners": [
                    {"name": "IN", "port": 9092},
                    {"name": "E", "port": 9095, "type": "nodeport", "nodePortBase": 32767},
                ],
                "broker": {"replicas": 2},
            },
            "32767",
        ),
        (
            {
                "listeners": [
                    {"name": "LB", "port": 9095, "type": "loadbalancer", "advertisedHostTemplate": "k.example.com"}
                ]
            },
            "{ordinal}",
        ),
        ({"security": {"certificates": {"validityDays": 30, "renewalDays": 30}}}, "renewalDays"),
        ({"security": {"controllerApi": {"authentication": "basic"}}}, "authentication"),
    ],
)
def test_invalid_security_specs_name_the_field(extra: dict[str, Any], mentions: str) -> None:
    with pytest.raises(InvalidSpec) as exc:
        spec_with(**extra)
    assert mentions in str(exc.value)


# ------------------------------------------------------------------------------ rendering

MIXED = {
    "listeners": [
        {"name": "INTERNAL", "port": 9092, "tls": True, "authentication": {"type": "scram-sha-512"}},
        {"name": "MTLS", "port": 9093, "tls": True, "authentication": {"type": "tls"}},
        {
            "name": "EXTERNAL",
            "port": 9095,
            "type": "nodeport",
            "nodePortBase": 31000,
            "tls": True,
            "authentication": {"type": "scram-sha-256"},
        },
        {
            "name": "CLOUD",
            "port": 9096,
            "type": "loadbalancer",
            "advertisedHostTemplate": "kafka-{ordinal}.example.com",
            "tls": True,
            "authentication": {"type": "plain"},
            "annotations": {"external-dns.alpha.kubernetes.io/ttl": "60"},
        },
    ],
    "broker": {"replicas": 2},
    "security": {
        "networkPolicies": {
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        }
    },
}


def test_mixed_listeners_render_protocols_services_and_addresses() -> None:
    spec = spec_with(**MIXED)
    config = broker_config(spec)
    assert {lst.name: lst.security_protocol for lst in config.listeners} == {
        "INTERNAL": "SASL_SSL",
        "MTLS": "SSL",
        "EXTERNAL": "SASL_SSL",
        "CLOUD": "SASL_SSL",
    }
    # Client certificates win for broker-to-broker calls: the broker presents its own.
    assert config.kafka.inter_broker_listener_name == "MTLS"
    assert config.security.sasl_inter_broker_jaas_config_file is None
    assert config.kafka.super_users == "User:CN=demo-broker,O=automq-cluster"
    # Each TLS listener has its own client-certificate rule: MTLS requires one, SASL_SSL asks for none.
    assert {lst.name: lst.ssl_client_auth for lst in config.listeners} == {
        "INTERNAL": "none",
        "MTLS": "required",
        "EXTERNAL": "none",
        "CLOUD": "none",
    }
    assert config.tls.client_auth == "none"
    assert config.security.sasl_enabled_mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    services = {s["metadata"]["name"]: s for s in builders.services(spec, REF)}
    assert set(services) == {
        "demo-bootstrap",
        "demo-brokers",
        "demo-controllers",
        "demo-external-bootstrap",
        "demo-external-0",
        "demo-external-1",
        "demo-cloud-bootstrap",
        "demo-cloud-0",
        "demo-cloud-1",
    }
    assert [p["port"] for p in services["demo-bootstrap"]["spec"]["ports"]] == [9092, 9093]
    assert services["demo-external-1"]["spec"]["ports"][0]["nodePort"] == 31001
    assert services["demo-external-1"]["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == "demo-broker-1"
    assert services["demo-cloud-0"]["spec"]["type"] == "LoadBalancer"
    assert services["demo-cloud-0"]["metadata"]["annotations"] == {"external-dns.alpha.kubernetes.io/ttl": "60"}

    # What the init container makes of it in pod demo-broker-1 on a node with IP 10.0.0.7.
    template = yaml.safe_load(builders.config_map(spec, REF)["data"]["broker.yaml"])
    env = {
        e["name"]: e.get("value", "")
        for e in builders.pod_template(spec, REF, "broker")["spec"]["containers"][0]["env"]
    }
    env.update(
        POD_NAME="demo-broker-1",
        AUTOMQ_HOST_IP="10.0.0.7",
        AUTOMQ_ADVERTISED_HOST="demo-broker-1.demo-brokers.kafka.svc",
    )
    pod = render_pod_config(template, env)
    advertised = {lst.name: (lst.advertised_host, lst.advertised_port) for lst in pod.listeners}
    assert advertised == {
        "INTERNAL": ("demo-broker-1.demo-brokers.kafka.svc", 9092),
        "MTLS": ("demo-broker-1.demo-brokers.kafka.svc", 9093),
        "EXTERNAL": ("10.0.0.7", 31001),
        "CLOUD": ("kafka-1.example.com", 9096),
    }
    assert builders.listener_status(spec, REF) == [
        {
            "name": "INTERNAL",
            "type": "internal",
            "securityProtocol": "SASL_SSL",
            "saslMechanism": "SCRAM-SHA-512",
            "service": "demo-bootstrap",
            "bootstrapServers": "demo-bootstrap.kafka.svc:9092",
            "caSecret": "demo-cluster-ca-cert",
        },
        {
            "name": "MTLS",
            "type": "internal",
            "securityProtocol": "SSL",
            "service": "demo-bootstrap",
            "bootstrapServers": "demo-bootstrap.kafka.svc:9093",
            "caSecret": "demo-cluster-ca-cert",
        },
        {
            "name": "EXTERNAL",
            "type": "nodeport",
            "securityProtocol": "SASL_SSL",
            "saslMechanism": "SCRAM-SHA-256",
            "service": "demo-external-bootstrap",
            "caSecret": "demo-cluster-ca-cert",
        },
        {
            "name": "CLOUD",
            "type": "loadbalancer",
            "securityProtocol": "SASL_SSL",
            "saslMechanism": "PLAIN",
            "service": "demo-cloud-bootstrap",
            "bootstrapServers": "kafka-0.example.com:9096,kafka-1.example.com:9096",
            "caSecret": "demo-cluster-ca-cert",
        },
    ]
    names = security.broker_dns_names(spec, REF)
    assert {
        "*.demo-brokers.kafka.svc",
        "demo-bootstrap.kafka.svc",
        "kafka-0.example.com",
        "kafka-1.example.com",
    } <= set(names)


def test_every_rendered_object_is_valid_kubernetes() -> None:
    for extra in ({}, MIXED, {"security": {"certificates": {"issuer": "cert-manager"}}}):
        spec = spec_with(**extra)
        objects = builders.desired_objects(spec, REF) + builders.services(spec, REF)[3:]
        objects += network_policies.network_policies(spec, REF)
        for obj in objects:
            kubernetes_validate.validate(obj, "1.31", strict=True)
    pod = builders.pod_template(spec_with(), REF, "broker")["spec"]
    assert {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"] if "secret" in v} == {
        "tls": "demo-broker-certs",
        "broker-credentials": "demo-broker-credentials",
        "controller-token": "demo-controller-token",
        "controller-ca": "demo-controller-certs",
    }
    assert next(v for v in pod["volumes"] if v["name"] == "controller-ca")["secret"] == {
        "secretName": "demo-controller-certs",
        "defaultMode": 0o440,
        "items": [{"key": "ca.crt", "path": "ca.crt"}],  # never the controllers' key
    }
    controller = builders.pod_template(spec_with(), REF, "controller")["spec"]
    assert [v["name"] for v in controller["volumes"] if "secret" in v] == ["controller-token", "controller-tls"]


def test_the_controller_api_is_https_by_default() -> None:
    spec = spec_with()
    assert spec.controller_tls() and spec.needs_certificates()
    urls = builders.controller_urls(spec, REF)
    assert urls == ["https://demo-controller-0.demo-controllers.kafka.svc:9093"]
    controller = NodeConfig.model_validate(yaml.safe_load(builders.config_map(spec, REF)["data"]["controller.yaml"]))
    assert controller.security.controller_tls and controller.tls.cert_file == "/etc/automq-controller-tls/tls.crt"
    assert controller.tls.key_file == "/etc/automq-controller-tls/tls.key"
    assert controller.security.controller_ca_file == "/etc/automq-controller-tls/ca.crt"
    broker = broker_config(spec)
    assert broker.controller_urls == urls and not broker.security.controller_tls
    assert broker.security.controller_ca_file == "/etc/automq-controller-ca/ca.crt"
    assert broker.tls.endpoint_identification_algorithm == "https"  # host names are checked
    # each pod advertises its https URL (NOT_CONTROLLER answers name it)
    pod = render_pod_config(
        yaml.safe_load(builders.config_map(spec, REF)["data"]["controller.yaml"]),
        {"POD_NAME": "demo-controller-1", "AUTOMQ_ROLE": "controller", "AUTOMQ_ADVERTISED_HOST": "h.svc"},
    )
    assert pod.controller.advertised_url == "https://h.svc:9093"
    template = builders.pod_template(spec, REF, "controller")
    main = template["spec"]["containers"][0]
    assert {main[p]["httpGet"]["scheme"] for p in ("readinessProbe", "livenessProbe", "startupProbe")} == {"HTTPS"}
    assert template["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    assert {"name": "controller-tls", "mountPath": "/etc/automq-controller-tls", "readOnly": True} in main[
        "volumeMounts"
    ]
    broker_main = builders.pod_template(spec, REF, "broker")["spec"]["containers"][0]
    assert broker_main["readinessProbe"]["httpGet"]["scheme"] == "HTTP"  # brokers' HTTP is health/metrics only
    # plain http only when asked for (or on a legacy cluster)
    plain = spec_with(security={"controllerApi": {"tls": False}})
    assert builders.controller_urls(plain, REF)[0].startswith("http://") and not plain.controller_tls()
    plain_controller = builders.pod_template(plain, REF, "controller")["spec"]
    assert "controller-tls" not in [v["name"] for v in plain_controller["volumes"]]


def test_network_policies_let_in_only_what_each_port_serves() -> None:
    broker, controller = network_policies.network_policies(spec_with(**MIXED), REF)
    rules = {r["ports"][0]["port"]: r.get("from") for r in broker["spec"]["ingress"]}
    brokers = {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "automq",
                "app.kubernetes.io/instance": "demo",
                "app.kubernetes.io/component": "broker",
            }
        }
    }
    assert rules[9092] is None and rules[9095] is None  # clients authenticate on the listener
    assert 9091 not in rules  # no REPLICATION listener: brokers authenticate on MTLS
    oauth_only = spec_with(
        listeners=[{"name": "IN", "port": 9092, "tls": True, "authentication": {"type": "oauthbearer"}}],
        config={"security.sasl_oauthbearer_allow_unsecured": "true"},
    )
    [oauth_broker, _] = network_policies.network_policies(oauth_only, REF)
    oauth_rules = {r["ports"][0]["port"]: r.get("from") for r in oauth_broker["spec"]["ingress"]}
    assert oauth_rules[9091] == [brokers]  # REPLICATION (no credentials): brokers only
    assert rules[9094][0] == MIXED["security"]["networkPolicies"]["metricsFrom"][0]
    assert rules[9094][1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    api_peers = controller["spec"]["ingress"][0]["from"]
    assert [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in api_peers] == [
        "broker",
        "controller",
        "spark-job",
        "operator",
    ]
    assert controller["spec"]["ingress"][1]["from"] == MIXED["security"]["networkPolicies"]["metricsFrom"]
    assert spec_with(security={"networkPolicies": {"enabled": False}}).network_policies() is False


def test_cert_manager_renders_a_ca_chain_or_uses_the_given_issuer() -> None:
    own = security.cert_manager_objects(spec_with(security={"certificates": {"issuer": "cert-manager"}}), REF)
    assert [(o["kind"], o["metadata"]["name"]) for o in own] == [
        ("Issuer", "demo-selfsigned"),
        ("Certificate", "demo-cluster-ca"),
        ("Issuer", "demo-cluster-ca"),
        ("Certificate", "demo-broker-certs"),
        ("Certificate", "demo-controller-certs"),
    ]
    controller = own[-1]["spec"]
    assert controller["secretName"] == "demo-controller-certs" and controller["issuerRef"]["name"] == "demo-cluster-ca"
    assert controller["dnsNames"] == builders.controller_dns_names(REF)
    assert "server auth" in controller["usages"]
    broker = own[-2]["spec"]
    assert broker["secretName"] == "demo-broker-certs" and "*.demo-brokers.kafka.svc" in broker["dnsNames"]
    assert broker["renewBefore"] == "720h" and broker["issuerRef"]["name"] == "demo-cluster-ca"
    given = security.cert_manager_objects(
        spec_with(
            security={
                "certificates": {
                    "issuer": "cert-manager",
                    "certManager": {"issuerRef": {"name": "corp", "kind": "ClusterIssuer"}},
                }
            }
        ),
        REF,
    )
    assert [o["kind"] for o in given] == ["Certificate", "Certificate"]
    assert given[0]["spec"]["issuerRef"] == {"name": "corp", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert security.cert_manager_objects(spec_with(), REF) == []  # operator-issued by default


def test_spark_jobs_mount_the_controller_token() -> None:
    spec = spec_with(compaction={"enabled": True})
    job = sparkjobs.desired_cron_jobs(spec, REF)["compaction"]
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["AUTOMQ_CONTROLLER_TOKEN_FILE"] == "/etc/automq-token/token"
    assert env["AUTOMQ_CONTROLLER_CA_FILE"] == "/etc/automq-controller-ca/ca.crt"
    assert builders.controller_ca_volume(REF) in pod["volumes"]
    assert {"name": "controller-ca", "mountPath": "/etc/automq-controller-ca", "readOnly": True} in pod["containers"][
        0
    ]["volumeMounts"]
    assert {"name": "controller-token", "secret": {"secretName": "demo-controller-token", "defaultMode": 0o440}} in pod[
        "volumes"
    ]
    kubernetes_validate.validate(job, "1.31", strict=True)


# ------------------------------------------------------------------------------ certificates


def _data(kube: FakeKube, name: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in kube.objects[("Secret", name)]["data"].items()}


def test_operator_ca_issues_renews_and_rotates() -> None:
    # the broker certificate's life (the controllers' follows the same code, _ensure_leaf)
    no_controller_tls = {**MIXED, "security": {**MIXED["security"], "controllerApi": {"tls": False}}}
    spec = spec_with(**no_controller_tls)
    kube = FakeKube()
    notes = asyncio.run(security.ensure_certificates(kube, spec, REF, NOW))
    assert notes == [
        "cluster CA created (no CA yet)",
        "clients CA created (no CA yet)",
        "broker certificate issued (no certificate yet)",
    ]
    broker = _data(kube, "demo-broker-certs")
    leaf = certificates.load_chain(broker["tls.crt"])[0]
    assert sorted(certificates.subject_alt_names(leaf)) == sorted(security.broker_dns_names(spec, REF))
    # ca.crt: the cluster CA (servers) and the clients CA (client certificates) both.
    assert [c.subject.rfc4514_string() for c in certificates.load_chain(broker["ca.crt"])] == [
        "CN=kafka-demo-cluster-ca,O=automq-cluster",
        "CN=kafka-demo-clients-ca,O=automq-cluster",
    ]
    assert "ca.key" not in _data(kube, "demo-cluster-ca-cert")

    kube.writes.clear()
    assert asyncio.run(security.ensure_certificates(kube, spec, REF, NOW + dt.timedelta(days=300))) == []
    assert kube.writes == []  # nothing due: nothing written

    # 340 days on: the leaf (365 days) is within its 30-day renewal window.
    later = NOW + dt.timedelta(days=340)
    assert asyncio.run(security.ensure_certificates(kube, spec, REF, later)) == [
        "broker certificate issued (it expires in 25.0 days (renewal 30 days before))"
    ]
    # A new broker Service name (scale-out of the loadbalancer listener) re-issues at once.
    bigger = spec_with(**{**no_controller_tls, "broker": {"replicas": 3}})
    assert asyncio.run(security.ensure_certificates(kube, bigger, REF, later)) == [
        "broker certificate issued (its names changed)"
    ]

    # Two renewal windows before the CA's end (5 years): a new CA, the old one still trusted,
    # and the broker keeps its certificate from the old CA until that falls due itself, so
    # clients have a whole window to pick up the new ca.crt before a broker presents it.
    old_ca = _data(kube, "demo-cluster-ca")["ca.crt"]
    asyncio.run(security.ensure_certificates(kube, bigger, REF, NOW + dt.timedelta(days=1825 - 80)))  # fresh leaf
    before = _data(kube, "demo-broker-certs")["tls.crt"]
    rotate = NOW + dt.timedelta(days=1825 - 55)
    notes = asyncio.run(security.ensure_certificates(kube, bigger, REF, rotate))
    assert [n.split(" (")[0] for n in notes] == ["cluster CA created", "clients CA created"]  # no new leaf yet
    trusted = certificates.load_chain(_data(kube, "demo-cluster-ca-cert")["ca.crt"])
    assert len(trusted) == 2 and trusted[1] == certificates.load_chain(old_ca)[0]
    assert _data(kube, "demo-broker-certs")["tls.crt"] == before
    assert certificates.load_chain(_data(kube, "demo-broker-certs")["ca.crt"])[1] == trusted[1]
    # The old leaf is capped at the old CA's end: due 30 days before it, re-signed by the new CA.
    notes = asyncio.run(security.ensure_certificates(kube, bigger, REF, rotate + dt.timedelta(days=26)))
    assert notes == ["broker certificate issued (it expires in 29.0 days (renewal 30 days before))"]
    leaf = certificates.load_chain(_data(kube, "demo-broker-certs")["tls.crt"])[0]
    assert leaf.issuer == trusted[0].subject and trusted[0] != trusted[1]


def _handshake(server_pem: tuple[bytes, bytes], trust: bytes, name: str, tmp: Path) -> str | None:
    """A real TLS handshake on loopback: None when the client accepts the server as `name`."""
    (tmp / "s.crt").write_bytes(server_pem[0])
    (tmp / "s.key").write_bytes(server_pem[1])
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp / "s.crt", tmp / "s.key")
    client_ctx = ssl.create_default_context(cadata=trust.decode())
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with socket.create_connection(listener.getsockname()) as raw, client_ctx.wrap_socket(raw, server_hostname=name):
            return None
    except ssl.SSLCertVerificationError as exc:
        return exc.verify_message
    finally:
        thread.join(5)
        listener.close()


def test_broker_certificate_verifies_under_every_pod_and_service_name(tmp_path: Path) -> None:
    spec = spec_with(**MIXED)
    kube = FakeKube()
    asyncio.run(security.ensure_certificates(kube, spec, REF, dt.datetime.now(dt.UTC)))
    broker = _data(kube, "demo-broker-certs")
    trust = _data(kube, "demo-cluster-ca-cert")["ca.crt"]
    pem = (broker["tls.crt"], broker["tls.key"])
    for name in (
        "demo-broker-7.demo-brokers.kafka.svc",
        "demo-broker-0.demo-brokers.kafka.svc.cluster.local",
        "demo-bootstrap.kafka.svc",
        "demo-external-bootstrap.kafka.svc",
        "kafka-1.example.com",
    ):
        assert _handshake(pem, trust, name, tmp_path) is None, name
    assert "mismatch" in (_handshake(pem, trust, "demo-broker-0.other.kafka.svc", tmp_path) or "")
    other = certificates.new_ca("other", dt.datetime.now(dt.UTC), 10).cert_pem
    assert _handshake(pem, other, "demo-bootstrap.kafka.svc", tmp_path) is not None


def test_controller_certificate_verifies_under_its_urls_and_the_operator_trusts_only_it(tmp_path: Path) -> None:
    spec = spec_with(controller={"replicas": 3})
    kube = FakeKube()
    notes = asyncio.run(security.ensure_certificates(kube, spec, REF, dt.datetime.now(dt.UTC)))
    assert "controller certificate issued (no certificate yet)" in notes
    controller = _data(kube, "demo-controller-certs")
    # what brokers and jobs mount of it: the cluster CA only (not the clients CA)
    assert controller["ca.crt"] == _data(kube, "demo-cluster-ca-cert")["ca.crt"]
    pem = (controller["tls.crt"], controller["tls.key"])
    hosts = [url.split("//")[1].rsplit(":", 1)[0] for url in builders.controller_urls(spec, REF)]
    for name in (*hosts, "demo-controllers.kafka.svc", "demo-controller-2.demo-controllers.kafka.svc.cluster.local"):
        assert _handshake(pem, controller["ca.crt"], name, tmp_path) is None, name
    assert "mismatch" in (_handshake(pem, controller["ca.crt"], "demo-broker-0.demo-brokers.kafka.svc", tmp_path) or "")
    # the broker certificate is not a controller certificate
    broker = _data(kube, "demo-broker-certs")
    assert "mismatch" in (
        _handshake((broker["tls.crt"], broker["tls.key"]), controller["ca.crt"], hosts[0], tmp_path) or ""
    )
    # a second pass keeps it
    assert not [
        n
        for n in asyncio.run(security.ensure_certificates(kube, spec, REF, dt.datetime.now(dt.UTC)))
        if "controller" in n
    ]
    auth = asyncio.run(security.operator_controller_auth(kube, spec, REF))
    assert auth is not None and auth.ssl is not None and auth.ssl.check_hostname
    assert [c["subject"] for c in auth.ssl.get_ca_certs()] == [
        ((("organizationName", "automq-cluster"),), (("commonName", "kafka-demo-cluster-ca"),))
    ]  # exactly the cluster CA, no system store


def test_controller_tls_alone_gets_a_ca_and_the_jobs_get_its_ca() -> None:
    """A PLAINTEXT cluster with an https controller API: a cluster CA and the controllers'
    certificate only; the WAL recovery Job (a controller client) carries token and CA."""
    from automq.operator import nodeloss

    spec = spec_with(listeners=[{"name": "PLAIN", "port": 9092}])
    assert not spec.needs_tls() and spec.needs_certificates()
    kube = FakeKube()
    asyncio.run(security.ensure_certificates(kube, spec, REF, dt.datetime.now(dt.UTC)))
    assert ("Secret", "demo-controller-certs") in kube.objects and ("Secret", "demo-broker-certs") not in kube.objects
    broker = builders.pod_template(spec, REF, "broker")["spec"]
    assert [v["name"] for v in broker["volumes"] if "secret" in v] == ["controller-token", "controller-ca"]
    job = nodeloss.recovery_job(spec, REF, 0, "node-1", 3)
    kubernetes_validate.validate(job, "1.31", strict=True)
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AUTOMQ_CONTROLLER_CA_FILE"] == "/etc/automq-controller-ca/ca.crt"
    assert env["AUTOMQ_CONTROLLER_TOKEN_FILE"] == "/etc/automq-token/token"
    assert all(a.startswith("https://") for a in container["args"] if "demo-controller-" in a)


def test_hostile_stored_material_is_replaced_not_trusted() -> None:
    spec = spec_with()
    kube = FakeKube()
    asyncio.run(security.ensure_certificates(kube, spec, REF, NOW))
    # Someone overwrote the broker key with another key: the pair no longer matches.
    stranger = certificates.new_ca("x", NOW, 10)
    kube.objects[("Secret", "demo-broker-certs")]["data"]["tls.key"] = base64.b64encode(stranger.key_pem).decode()
    assert asyncio.run(security.ensure_certificates(kube, spec, REF, NOW)) == [
        "broker certificate issued (the stored key does not belong to the certificate)"
    ]
    kube.objects[("Secret", "demo-cluster-ca")]["data"]["ca.crt"] = base64.b64encode(b"garbage").decode()
    notes = asyncio.run(security.ensure_certificates(kube, spec, REF, NOW))
    # A new CA; the old one stays in the public bundle until it expires, so the brokers'
    # certificate it signed keeps working (no outage) and is re-signed when it falls due.
    assert len(notes) == 1 and notes[0].startswith("cluster CA created (the stored CA cannot be read")
    assert len(certificates.load_chain(_data(kube, "demo-cluster-ca-cert")["ca.crt"])) == 2


# ------------------------------------------------------------------------------ AutoMQUser tls


def test_tls_user_certificate_maps_to_its_principal_and_is_renewed() -> None:
    from automq.broker.security.principal import PrincipalMapper
    from automq.operator import users

    spec = spec_with(**MIXED)
    kube = FakeKube()
    asyncio.run(security.ensure_certificates(kube, spec, REF, NOW))
    expiry = asyncio.run(users.ensure_certificate_secret(kube, "alice", REF, "u-alice", spec, "b:9092", NOW))
    secret = kube.objects[("Secret", "alice")]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-alice"
    data = _data(kube, "alice")
    assert set(data) == {"user.crt", "user.key", "user.p12", "user.password", "ca.crt", "bootstrap"}
    cert = certificates.load_chain(data["user.crt"])[0]
    mapper = PrincipalMapper(broker_config(spec).tls.principal_mapping_rules)
    assert mapper.name_for(cert.subject.rfc4514_string()) == "alice"  # the principal the ACLs name
    # The broker certificate keeps its full DN: it cannot pose as a user.
    broker_leaf = certificates.load_chain(_data(kube, "demo-broker-certs")["tls.crt"])[0]
    assert mapper.name_for(broker_leaf.subject.rfc4514_string()) == "CN=demo-broker,O=automq-cluster"
    assert cert.issuer.rfc4514_string() == "CN=kafka-demo-clients-ca,O=automq-cluster"
    assert data["ca.crt"] == _data(kube, "demo-cluster-ca-cert")["ca.crt"]  # to trust the brokers
    assert expiry == cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    from cryptography.hazmat.primitives.serialization import pkcs12

    key, p12_cert, _ = pkcs12.load_key_and_certificates(data["user.p12"], data["user.password"])
    assert p12_cert == cert and key is not None

    kube.writes.clear()
    asyncio.run(users.ensure_certificate_secret(kube, "alice", REF, "u-alice", spec, "b:9092", NOW))
    assert kube.writes == []  # nothing due
    asyncio.run(
        users.ensure_certificate_secret(kube, "alice", REF, "u-alice", spec, "b:9092", NOW + dt.timedelta(days=340))
    )
    renewed = certificates.load_chain(_data(kube, "alice")["user.crt"])[0]
    assert renewed.serial_number != cert.serial_number and renewed.not_valid_after_utc > cert.not_valid_after_utc

    # Someone else's Secret of that name is never taken over.
    kube.objects[("Secret", "bob")] = {"kind": "Secret", "metadata": {"name": "bob", "ownerReferences": [{"uid": "x"}]}}
    with pytest.raises(users.CredentialConflict):
        asyncio.run(users.ensure_certificate_secret(kube, "bob", REF, "u-bob", spec, "b:9092", NOW))


def test_tls_users_need_the_operator_ca_and_a_certificate_listener() -> None:
    from automq.operator import users

    assert users._certificate_problem(spec_with(**MIXED)) is None
    assert "issuer: operator" in (
        users._certificate_problem(spec_with(**{**MIXED, "security": {"certificates": {"issuer": "cert-manager"}}}))
        or ""
    )
    assert "authentication type tls" in (users._certificate_problem(spec_with()) or "")
    # Before the cluster's reconcile made the clients CA: a clear, retriable error.
    with pytest.raises(LookupError, match="clients CA"):
        asyncio.run(users.ensure_certificate_secret(FakeKube(), "alice", REF, "u", spec_with(**MIXED), "b", NOW))


# ------------------------------------------------------------------------------ reconcile steps


class ReconcileKube(FakeKube):
    async def list(self, kind: str, namespace: str, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (k, _), o in self.objects.items()
            if k == kind and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in (labels or {}).items())
        ]

    async def delete(self, kind: str, namespace: str, name: str, **_: Any) -> bool:
        self.writes.append(f"delete {(kind, name)}")
        return self.objects.pop((kind, name), None) is not None


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def info(self, reason: str, message: str) -> None:
        self.seen.append((reason, message))

    def warn(self, reason: str, message: str) -> None:
        self.seen.append((reason, message))


def _pass(kube: ReconcileKube, spec: Any, *steps: Any) -> Events:
    from automq.operator.reconcile import Cluster

    events = Events()
    cluster = Cluster(
        api=kube,  # type: ignore[arg-type]
        ref=REF,
        spec=spec,
        raw_spec={},
        generation=1,
        previous_status={},
        reporter=events,
        controller_api_factory=lambda urls, auth=None: None,
    )
    for step in steps:
        asyncio.run(step(cluster))
    return events


def test_reconcile_removes_external_services_and_policies_no_longer_wanted() -> None:
    from automq.operator import reconcile

    kube = ReconcileKube()
    events = _pass(kube, spec_with(**MIXED), reconcile.security_material, reconcile.services)
    names = {n for (k, n) in kube.objects if k == "Service"}
    assert {"demo-external-1", "demo-cloud-1", "demo-external-bootstrap"} <= names
    assert {n for (k, n) in kube.objects if k == "NetworkPolicy"} == {"demo-broker", "demo-controller"}
    assert {n for (k, n) in kube.objects if k == "Secret"} >= {
        "demo-controller-token",
        "demo-broker-certs",
        "demo-controller-certs",
    }
    assert [r for r, _ in events.seen].count("CertificateIssued") == 4  # two CAs, brokers', controllers'

    # Scale-in: the scaled-away broker's own Services go (a LoadBalancer costs money), the rest stay.
    _pass(kube, spec_with(**{**MIXED, "broker": {"replicas": 1}}), reconcile.services)
    names = {n for (k, n) in kube.objects if k == "Service"}
    assert "demo-external-1" not in names and "demo-cloud-1" not in names
    assert {"demo-external-0", "demo-cloud-0", "demo-bootstrap", "demo-brokers"} <= names

    # External listeners removed, NetworkPolicies turned off: their objects go too.
    internal_only = spec_with(listeners=MIXED["listeners"][:2], security={"networkPolicies": {"enabled": False}})
    _pass(kube, internal_only, reconcile.security_material, reconcile.services)
    assert {n for (k, n) in kube.objects if k == "Service"} == {"demo-bootstrap", "demo-brokers", "demo-controllers"}
    assert not [n for (k, n) in kube.objects if k == "NetworkPolicy"]


def test_cert_manager_missing_is_a_clear_problem_not_a_crash() -> None:
    from automq.operator import reconcile
    from automq.operator.kube import KubeError
    from automq.operator.reconcile import Cluster

    class NoCertManager(ReconcileKube):
        async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
            if kind in ("Certificate", "Issuer"):
                raise KubeError(404, "the server could not find the requested resource")
            return await super().get(kind, namespace, name)

    cluster = Cluster(
        api=NoCertManager(),  # type: ignore[arg-type]
        ref=REF,
        spec=spec_with(security={"certificates": {"issuer": "cert-manager"}}),
        raw_spec={},
        generation=1,
        previous_status={},
        reporter=Events(),
        controller_api_factory=lambda urls, auth=None: None,
    )
    asyncio.run(reconcile.security_material(cluster))
    [problem] = cluster.problems
    assert problem.reason == "CertManagerMissing" and "install cert-manager" in problem.message
