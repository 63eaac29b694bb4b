"""Desired Kubernetes objects of one AutoMQCluster: pure functions, spec in, manifests out.

Nothing here talks to the API server; `reconcile` diffs and applies what these return. Every
object carries the common `app.kubernetes.io/*` labels and an owner reference to the
AutoMQCluster, so deleting the cluster garbage-collects them (volume claims excepted, see
`deletionPolicy`).

Names, for a cluster `demo`:
    demo-config                ConfigMap: node config template per role (broker.yaml, controller.yaml)
    demo-bootstrap             Service (ClusterIP): Kafka listeners of all brokers
    demo-brokers               Service (headless): stable DNS per broker pod
    demo-controllers           Service (headless): stable DNS per controller pod, controller API
    demo                       ServiceAccount, Role (Leases), RoleBinding
    demo-controller/-broker    StatefulSets (updateStrategy OnDelete: the operator orders restarts)
    demo-controller/-broker    PodDisruptionBudgets (maxUnavailable 1)

Pod `demo-broker-N` is broker node N; `demo-controller-N` is controller node 1000+N (see
`automq.operator.podconfig` for how each pod gets its own node id).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from automq.broker.config import Listener, NodeConfig, dump_config
from automq.operator import quantity
from automq.operator.certificates import PRINCIPAL_MAPPING_RULES
from automq.operator.rbac import CLUSTER_RULES
from automq.operator.security_spec import ListenerSpec
from automq.operator.spec import (
    BROKER_HTTP_PORT,
    CONTROLLER_PORT,
    GROUP,
    KIND,
    REPLICATION_LISTENER,
    REPLICATION_PORT,
    VERSION,
    AutoMQClusterSpec,
    Resources,
    Scheduling,
    broker_principal,
    inter_broker_listener,
    nest_overrides,
)

Role = Literal["controller", "broker"]
ROLES: tuple[Role, ...] = ("controller", "broker")
CONTROLLER_NODE_ID_BASE = 1000
MANAGED_BY = "automq-operator"

# Annotations the operator reads back.
TEMPLATE_HASH = f"{GROUP}/template-hash"  # on pod templates: a pod with another hash is outdated
CONFIG_HASH = f"{GROUP}/config-hash"  # on pod templates: config changes roll pods
LAST_APPLIED = f"{GROUP}/last-applied"  # on every object: what the operator last wrote

CONFIG_DIR = "/etc/automq"
NODE_CONFIG_DIR = "/config"
DATA_DIR = "/var/lib/automq/data"
WAL_DIR = "/var/lib/automq/wal"
USER_ID = 10001  # the image's non-root user (Dockerfile)


@dataclass(frozen=True, slots=True)
class ClusterRef:
    """Identity of the AutoMQCluster the objects belong to."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


# ---------------------------------------------------------------------------------------------
# Names and labels


def config_map_name(ref: ClusterRef) -> str:
    return f"{ref.name}-config"


def statefulset_name(ref: ClusterRef, role: Role) -> str:
    return f"{ref.name}-{role}"


def headless_service_name(ref: ClusterRef, role: Role) -> str:
    return f"{ref.name}-{role}s"


def bootstrap_service_name(ref: ClusterRef) -> str:
    return f"{ref.name}-bootstrap"


def pod_name(ref: ClusterRef, role: Role, ordinal: int) -> str:
    return f"{statefulset_name(ref, role)}-{ordinal}"


def lease_name(ref: ClusterRef) -> str:
    return f"{ref.name}-controller"


def broker_node_id(ordinal: int) -> int:
    return ordinal


def selector_labels(ref: ClusterRef, role: Role | None = None) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": "automq", "app.kubernetes.io/instance": ref.name}
    if role is not None:
        labels["app.kubernetes.io/component"] = role
    return labels


def common_labels(ref: ClusterRef, role: Role | None = None) -> dict[str, str]:
    return {
        **selector_labels(ref, role),
        "app.kubernetes.io/part-of": "automq",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def label_selector(labels: dict[str, str]) -> str:
    """A label selector string (what the scale subresource reports) for exact-match labels."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def broker_selector(ref: ClusterRef) -> str:
    return label_selector(selector_labels(ref, "broker"))


def external_bootstrap_service_name(ref: ClusterRef, listener: ListenerSpec) -> str:
    return f"{ref.name}-{_port_name(listener.name)}-bootstrap"


def external_broker_service_name(ref: ClusterRef, listener: ListenerSpec, ordinal: int) -> str:
    return f"{ref.name}-{_port_name(listener.name)}-{ordinal}"


def bootstrap_address(spec: AutoMQClusterSpec, ref: ClusterRef) -> str:
    return f"{bootstrap_service_name(ref)}.{ref.namespace}.svc:{spec.internal_listeners()[0].port}"


# Secrets the node pods mount (automq.operator.security creates them); here to keep builders pure.
TLS_DIR = "/etc/automq-tls"
TOKEN_DIR = "/etc/automq-token"
CONTROLLER_TLS_DIR = "/etc/automq-controller-tls"  # controllers: their https certificate and key
CONTROLLER_CA_DIR = "/etc/automq-controller-ca"  # everyone else: only the CA that signed it


BROKER_CREDENTIALS_DIR = "/etc/automq-broker-credentials"
OAUTH_DIR = "/etc/automq-oauth"  # the JWKS Secret of oauthbearer listeners
INTER_BROKER_JAAS = "inter-broker.jaas"


def broker_credentials_secret_name(ref: ClusterRef) -> str:
    return f"{ref.name}-broker-credentials"


def broker_certs_secret_name(ref: ClusterRef) -> str:
    return f"{ref.name}-broker-certs"


def controller_token_secret_name(ref: ClusterRef) -> str:
    return f"{ref.name}-controller-token"


def controller_certs_secret_name(ref: ClusterRef) -> str:
    return f"{ref.name}-controller-certs"


def controller_ca_volume(ref: ClusterRef, name: str = "controller-ca") -> dict[str, Any]:
    """The controllers' certificate Secret projected down to its ca.crt: a caller gets the CA
    it verifies the controllers against and never the controllers' key."""
    return {
        "name": name,
        "secret": {
            "secretName": controller_certs_secret_name(ref),
            "defaultMode": 0o440,
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        },
    }


def listener_status(spec: AutoMQClusterSpec, ref: ClusterRef) -> list[dict[str, Any]]:
    """status.listeners: what a client of each listener puts in its config."""
    out = []
    for lst in spec.listeners:
        entry: dict[str, Any] = {
            "name": lst.name,
            "type": lst.type,
            "securityProtocol": lst.security_protocol(),
        }
        if lst.sasl_mechanism():
            entry["saslMechanism"] = lst.sasl_mechanism()
        if lst.type == "internal":
            entry["service"] = bootstrap_service_name(ref)
            entry["bootstrapServers"] = f"{bootstrap_service_name(ref)}.{ref.namespace}.svc:{lst.port}"
        else:
            entry["service"] = external_bootstrap_service_name(ref, lst)
            if lst.advertised_host_template:
                hosts = [lst.advertised_host_template.replace("{ordinal}", str(i)) for i in range(spec.broker.replicas)]
                entry["bootstrapServers"] = ",".join(f"{h}:{lst.port}" for h in hosts)
        if lst.tls:  # cert-manager puts the issuing CA in the certificate's own Secret
            operator_ca = spec.security.certificates.issuer == "operator"
            entry["caSecret"] = f"{ref.name}-cluster-ca-cert" if operator_ca else broker_certs_secret_name(ref)
        out.append(entry)
    return out


def broker_listeners(spec: AutoMQClusterSpec) -> list[Listener]:
    """The brokers' listeners as node config: the spec's, plus REPLICATION (PLAINTEXT, for
    broker-to-broker calls, which carry no credentials yet) when no internal one is PLAINTEXT."""
    out = [
        Listener(
            name=lst.name,
            host="0.0.0.0",
            port=lst.port,
            advertised_port=lst.port,
            security_protocol=lst.security_protocol(),
            # Each TLS listener has its own rule: a client-certificate listener refuses a client
            # without one at the handshake, a SASL_SSL listener next to it asks for none.
            ssl_client_auth=("required" if lst.client_certificates() else "none") if lst.tls else None,
        )
        for lst in spec.listeners
    ]
    if inter_broker_listener(spec.listeners) is None:
        out.append(
            Listener(name=REPLICATION_LISTENER, host="0.0.0.0", port=REPLICATION_PORT, advertised_port=REPLICATION_PORT)
        )
    return out


def external_listeners_env(spec: AutoMQClusterSpec) -> str:
    """What podconfig needs to advertise external listeners per broker (JSON, see podconfig)."""
    external = {
        lst.name: {"host": lst.advertised_host_template or "", "port_base": lst.node_port_base}
        for lst in spec.listeners
        if lst.type != "internal"
    }
    return json.dumps(external, sort_keys=True, separators=(",", ":"))


def controller_scheme(spec: AutoMQClusterSpec) -> str:
    """The scheme clients call the controllers with (mid-switch, automq.operator.controller_scheme
    decides which; the controllers then serve both)."""
    return "https" if spec.controller_client_tls() else "http"


def controller_api_summary(spec: AutoMQClusterSpec) -> str:
    """status.controllerApi: what the controllers serve and their clients use now."""
    if spec.controller_plain_http():
        return f"switching: controllers serve http and https, clients use {controller_scheme(spec)}"
    return controller_scheme(spec)


def controller_client_env(spec: AutoMQClusterSpec) -> list[dict[str, Any]]:
    """A pod without a node config (Spark jobs, WAL recovery Jobs) that calls the controller API
    finds the token and the controllers' CA through these variables (ControllerClientAuth.from_env)."""
    env: list[dict[str, Any]] = []
    if spec.controller_token():
        env.append({"name": "AUTOMQ_CONTROLLER_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"})
    if spec.controller_tls():
        env.append({"name": "AUTOMQ_CONTROLLER_CA_FILE", "value": f"{CONTROLLER_CA_DIR}/ca.crt"})
    return env


def controller_client_mounts(spec: AutoMQClusterSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = []
    if spec.controller_token():
        mounts.append({"name": "controller-token", "mountPath": TOKEN_DIR, "readOnly": True})
    if spec.controller_tls():
        mounts.append({"name": "controller-ca", "mountPath": CONTROLLER_CA_DIR, "readOnly": True})
    return mounts


def controller_client_volumes(spec: AutoMQClusterSpec, ref: ClusterRef) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = []
    if spec.controller_token():
        volumes.append(_secret_volume("controller-token", controller_token_secret_name(ref)))
    if spec.controller_tls():
        volumes.append(controller_ca_volume(ref))
    return volumes


def controller_urls(spec: AutoMQClusterSpec, ref: ClusterRef, scheme: str | None = None) -> list[str]:
    service = headless_service_name(ref, "controller")
    scheme = scheme or controller_scheme(spec)
    return [
        f"{scheme}://{pod_name(ref, 'controller', i)}.{service}.{ref.namespace}.svc:{CONTROLLER_PORT}"
        for i in range(spec.controller.replicas)
    ]


def controller_service_url(spec: AutoMQClusterSpec, ref: ClusterRef) -> str:
    """Every controller behind one name (the headless Service resolves to all of them)."""
    service = headless_service_name(ref, "controller")
    return f"{controller_scheme(spec)}://{service}.{ref.namespace}.svc:{CONTROLLER_PORT}"


def controller_dns_names(ref: ClusterRef) -> list[str]:
    """What the controllers' certificate names: any pod of their headless Service (a wildcard,
    so scaling needs no new certificate) and the Service itself."""
    service, ns = headless_service_name(ref, "controller"), ref.namespace
    return [
        f"*.{service}.{ns}.svc",
        f"*.{service}.{ns}.svc.cluster.local",
        service,
        f"{service}.{ns}",
        f"{service}.{ns}.svc",
        f"{service}.{ns}.svc.cluster.local",
    ]


def _metadata(
    ref: ClusterRef, name: str, role: Role | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ref.namespace,
        "labels": common_labels(ref, role),
        "ownerReferences": [ref.owner_reference()],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def content_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Node config


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def node_config(spec: AutoMQClusterSpec, ref: ClusterRef, role: Role) -> NodeConfig:
    """The role's config template (node_id 0; each pod fills in its own, see podconfig)."""
    role_spec = spec.controller if role == "controller" else spec.broker
    raw: dict[str, Any] = {
        "node_id": 0,
        "cluster_id": spec.cluster_id or f"{ref.namespace}-{ref.name}",
        "data_dir": DATA_DIR,
        "object_store_url": spec.object_store.url(),
        # Controllers do not call each other through these: they follow what they serve, so that
        # a switch of their clients' scheme does not restart them too.
        "controller_urls": controller_urls(
            spec, ref, ("https" if spec.controller_tls() else "http") if role == "controller" else None
        ),
        "http_host": "0.0.0.0",
        "http_port": CONTROLLER_PORT if role == "controller" else BROKER_HTTP_PORT,
    }
    if role == "controller" and spec.controller.schema_registry_port is not None:
        raw["controller"] = {"schema_registry_port": spec.controller.schema_registry_port}
    if spec.controller_token():
        raw["security"] = {"controller_token_file": f"{TOKEN_DIR}/token"}
    if spec.controller_tls() if role == "controller" else spec.controller_client_tls():
        # Every node verifies the controllers' certificate (a controller also calls the others).
        ca_dir = CONTROLLER_TLS_DIR if role == "controller" else CONTROLLER_CA_DIR
        raw.setdefault("security", {})["controller_ca_file"] = f"{ca_dir}/ca.crt"
        if role == "controller":
            raw["security"]["controller_tls"] = True
            if spec.controller_plain_http():
                raw["security"]["controller_plain_http"] = True
            raw["tls"] = {"cert_file": f"{CONTROLLER_TLS_DIR}/tls.crt", "key_file": f"{CONTROLLER_TLS_DIR}/tls.key"}
    if role == "broker":
        listeners = broker_listeners(spec)
        raw["listeners"] = [listener.model_dump() for listener in listeners]
        inter = inter_broker_listener(spec.listeners)
        inter_name = inter.name if inter else REPLICATION_LISTENER
        # Named unless it is the first listener and PLAINTEXT (the broker's own default), so
        # clusters that predate spec.listeners keep a byte-identical config.
        if not (inter_name == listeners[0].name and listeners[0].security_protocol == "PLAINTEXT"):
            raw["kafka"] = {"inter_broker_listener_name": inter_name}
        mechanism = inter.sasl_mechanism() if inter is not None else None
        if mechanism is not None:
            # The brokers' own SCRAM user (automq.operator.security keeps its credential);
            # PLAIN listeners check passwords against SCRAM credentials too.
            raw["security"] = {
                **raw.get("security", {}),
                "sasl_mechanism_inter_broker_protocol": mechanism,
                "sasl_inter_broker_jaas_config_file": f"{BROKER_CREDENTIALS_DIR}/{INTER_BROKER_JAAS}",
            }
        if spec.needs_tls():
            # Which listeners require client certificates is each listener's ssl_client_auth
            # (broker_listeners), so the section's own client_auth stays at its default, none.
            raw["tls"] = {
                "cert_file": f"{TLS_DIR}/tls.crt",
                "key_file": f"{TLS_DIR}/tls.key",
                "ca_file": f"{TLS_DIR}/ca.crt",
                "principal_mapping_rules": list(PRINCIPAL_MAPPING_RULES),
            }
        oauth = next((lst.authentication for lst in spec.listeners if lst.sasl_mechanism() == "OAUTHBEARER"), None)
        if oauth is not None:
            security = raw.setdefault("security", {})
            if oauth.jwks_secret is not None:
                security["sasl_oauthbearer_jwks_file"] = f"{OAUTH_DIR}/{oauth.jwks_secret.key}"
            if oauth.expected_issuer is not None:
                security["sasl_oauthbearer_expected_issuer"] = oauth.expected_issuer
            if oauth.expected_audience is not None:
                security["sasl_oauthbearer_expected_audience"] = oauth.expected_audience
        mechanisms = sorted({m for lst in spec.listeners if (m := lst.sasl_mechanism()) is not None})
        if mechanisms:
            raw.setdefault("security", {})["sasl_enabled_mechanisms"] = mechanisms
        wal = spec.broker.wal
        raw["wal"] = {"kind": wal.kind}
        if wal.kind == "volume":
            raw["wal"].update(path=f"{WAL_DIR}/wal", capacity=quantity.wal_capacity_bytes(wal.size or "0"))
    else:
        raw["listeners"] = []
        # On Kubernetes the active controller holds a Lease (CLUSTER_RULES grants exactly that).
        raw["controller"] = {
            **raw.get("controller", {}),
            "leadership": "lease",
            "lease_name": lease_name(ref),
            "lease_namespace": ref.namespace,
        }
    overrides = nest_overrides({**spec.config, **role_spec.config})
    merged = _deep_merge(raw, overrides)
    principal = broker_principal(ref.name, inter_broker_listener(spec.listeners)) if role == "broker" else None
    if principal is not None:
        # Brokers act on each other's partitions (WriteTxnMarkers needs CLUSTER_ACTION): with an
        # authorizer on, their own principal is a super user, whatever else spec.config names.
        kafka = merged.setdefault("kafka", {})
        names = [n for n in str(kafka.get("super_users") or "").split(";") if n.strip()]
        if principal not in names:
            kafka["super_users"] = ";".join([*names, principal])
    return NodeConfig.model_validate(merged)


def config_map(spec: AutoMQClusterSpec, ref: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ref, config_map_name(ref)),
        "data": {f"{role}.yaml": dump_config(node_config(spec, ref, role)) for role in ROLES},
    }


def rendered_client_scheme(config_map: dict[str, Any] | None) -> Literal["http", "https"] | None:
    """The scheme the brokers of a rendered ConfigMap call their controllers with: that of its
    broker.yaml's controller_urls, not any "https://" in the file (an S3 endpoint is often
    https). None without a ConfigMap or a readable broker.yaml."""
    text = ((config_map or {}).get("data") or {}).get("broker.yaml")
    if text is None:
        return None
    try:
        urls = (yaml.safe_load(text) or {}).get("controller_urls") or []
    except yaml.YAMLError:
        return None
    return "https" if any(str(u).startswith("https://") for u in urls) else "http"


# ---------------------------------------------------------------------------------------------
# Services


def _port_name(listener_name: str) -> str:
    # Service port names are DNS labels: lowercase, '-', at most 15 characters.
    return listener_name.lower().replace("_", "-")[:15].strip("-") or "kafka"


def bootstrap_service(spec: AutoMQClusterSpec, ref: ClusterRef) -> dict[str, Any]:
    """Internal listeners only: external ones have their own Services."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ref, bootstrap_service_name(ref), "broker"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(ref, "broker"),
            "ports": [
                {
                    "name": _port_name(listener.name),
                    "port": listener.port,
                    "targetPort": listener.port,
                    "protocol": "TCP",
                }
                for listener in spec.internal_listeners()
            ],
        },
    }


def headless_service(spec: AutoMQClusterSpec, ref: ClusterRef, role: Role) -> dict[str, Any]:
    if role == "broker":
        ports = [
            {"name": _port_name(listener.name), "port": listener.port, "targetPort": listener.port, "protocol": "TCP"}
            for listener in broker_listeners(spec)
        ]
        ports.append({"name": "http", "port": BROKER_HTTP_PORT, "targetPort": BROKER_HTTP_PORT, "protocol": "TCP"})
    else:
        ports = [{"name": "http", "port": CONTROLLER_PORT, "targetPort": CONTROLLER_PORT, "protocol": "TCP"}]
        registry = spec.controller.schema_registry_port
        if registry is not None:
            ports.append({"name": "schema-registry", "port": registry, "targetPort": registry, "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ref, headless_service_name(ref, role), role),
        "spec": {
            "clusterIP": "None",
            # Nodes must find each other (and register) before they are Ready.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(ref, role),
            "ports": ports,
        },
    }


def _external_service(
    ref: ClusterRef, lst: ListenerSpec, name: str, selector: dict[str, str], node_port: int | None, bootstrap: bool
) -> dict[str, Any]:
    port: dict[str, Any] = {"name": _port_name(lst.name), "port": lst.port, "targetPort": lst.port, "protocol": "TCP"}
    if node_port is not None:
        port["nodePort"] = node_port
    meta = _metadata(ref, name, "broker", dict(lst.annotations) or None)
    meta["labels"] = {**meta["labels"], LISTENER_LABEL: _port_name(lst.name)}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "NodePort" if lst.type == "nodeport" else "LoadBalancer",
            "selector": selector,
            "ports": [port],
            # A broker's own Service keeps the client's address (ACL host rules) and skips a hop.
            "externalTrafficPolicy": "Cluster" if bootstrap else "Local",
        },
    }


def external_services(spec: AutoMQClusterSpec, ref: ClusterRef, brokers: int) -> list[dict[str, Any]]:
    """Per nodeport/loadbalancer listener: a bootstrap Service over all brokers and one Service
    per broker (selected by its pod name), which is what each broker advertises."""
    out: list[dict[str, Any]] = []
    for lst in spec.listeners:
        if lst.type == "internal":
            continue
        out.append(
            _external_service(
                ref, lst, external_bootstrap_service_name(ref, lst), selector_labels(ref, "broker"), None, True
            )
        )
        for i in range(brokers):
            node_port = lst.node_port_base + i if lst.node_port_base is not None else None
            selector = {**selector_labels(ref, "broker"), POD_NAME_LABEL: pod_name(ref, "broker", i)}
            out.append(
                _external_service(ref, lst, external_broker_service_name(ref, lst, i), selector, node_port, False)
            )
    return out


LISTENER_LABEL = f"{GROUP}/listener"  # on external Services: which listener they expose
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"  # set on every StatefulSet pod by Kubernetes


def services(spec: AutoMQClusterSpec, ref: ClusterRef) -> list[dict[str, Any]]:
    return [
        bootstrap_service(spec, ref),
        headless_service(spec, ref, "broker"),
        headless_service(spec, ref, "controller"),
        *external_services(spec, ref, spec.broker.replicas),
    ]


# ---------------------------------------------------------------------------------------------
# Identity and permissions


def service_account(spec: AutoMQClusterSpec, ref: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(ref, ref.name),
        # Only controllers need the API (Leases); their pod spec mounts the token explicitly.
        "automountServiceAccountToken": False,
    }


def lease_role(spec: AutoMQClusterSpec, ref: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(ref, ref.name),
        "rules": [dict(rule) for rule in CLUSTER_RULES],
    }


def lease_role_binding(spec: AutoMQClusterSpec, ref: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(ref, ref.name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ref.name},
        "subjects": [{"kind": "ServiceAccount", "name": ref.name, "namespace": ref.namespace}],
    }


def pod_disruption_budget(spec: AutoMQClusterSpec, ref: ClusterRef, role: Role) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(ref, statefulset_name(ref, role), role),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(ref, role)}},
    }


# ---------------------------------------------------------------------------------------------
# StatefulSets


# Used for a resource the spec names neither a request nor a limit for. Brokers: the log cache
# (256 MiB) and block cache (128 MiB) plus the interpreter and in-flight batches fit in 1 GiB;
# controllers hold only metadata. Memory limit = request (no overcommit, no surprise OOM kills
# from neighbours); no CPU limit (throttling a broker adds latency, it never saves memory).
DEFAULT_RESOURCES: dict[Role, dict[str, dict[str, str]]] = {
    "broker": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
    "controller": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "256Mi"}},
}


def _resources(resources: Resources, role: Role) -> dict[str, Any]:
    """The spec's requests and limits, with the role's defaults for resources it does not mention
    at all (a request given alone must not meet a smaller default limit, or the other way)."""
    requests, limits = dict(resources.requests), dict(resources.limits)
    defaults = DEFAULT_RESOURCES[role]
    for name in {*defaults["requests"], *defaults["limits"]}:
        if name in requests or name in limits:
            continue
        if name in defaults["requests"]:
            requests[name] = defaults["requests"][name]
        if name in defaults["limits"]:
            limits[name] = defaults["limits"][name]
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = dict(sorted(requests.items()))
    if limits:
        out["limits"] = dict(sorted(limits.items()))
    return out


def _scheduling(scheduling: Scheduling) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if scheduling.node_selector:
        out["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        out["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in scheduling.tolerations]
    if scheduling.affinity:
        out["affinity"] = scheduling.affinity
    if scheduling.priority_class_name:
        out["priorityClassName"] = scheduling.priority_class_name
    return out


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod_env(spec: AutoMQClusterSpec, ref: ClusterRef, role: Role) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "AUTOMQ_ROLE", "value": role},
        {"name": "AUTOMQ_NODE_ID_BASE", "value": str(CONTROLLER_NODE_ID_BASE if role == "controller" else 0)},
        {
            "name": "AUTOMQ_ADVERTISED_HOST",
            # $(POD_NAME) is expanded by the kubelet from the variable above.
            "value": f"$(POD_NAME).{headless_service_name(ref, role)}.{ref.namespace}.svc",
        },
    ]
    if role == "broker" and any(lst.type != "internal" for lst in spec.listeners):
        env += [
            {"name": "AUTOMQ_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "AUTOMQ_EXTERNAL_LISTENERS", "value": external_listeners_env(spec)},
        ]
    if role == "broker":
        # The broker's rack is its node's zone, always (rack.enabled adds the spreading): the pod
        # carries the node's topology label (Kubernetes' PodTopologyLabels admission, or the
        # operator copies it when the pod is bound, see handlers.broker_pod_changed).
        key = spec.broker.rack.topology_key
        env.append({"name": "AUTOMQ_RACK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{key}']"}}})
    return env


def _credentials_env(spec: AutoMQClusterSpec) -> list[dict[str, Any]]:
    secret = spec.object_store.credentials_secret
    env: list[dict[str, Any]] = [{"name": "AWS_DEFAULT_REGION", "value": spec.object_store.region}]
    if secret is not None:
        env += [
            {
                "name": "AWS_ACCESS_KEY_ID",
                "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.access_key_id_key}},
            },
            {
                "name": "AWS_SECRET_ACCESS_KEY",
                "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.secret_access_key_key}},
            },
            # Keys come from the Secret: never fall back to instance metadata.
            {"name": "AWS_EC2_METADATA_DISABLED", "value": "true"},
        ]
    return env


def _probe(path: str, port: int, period: int, failures: int, scheme: str = "HTTP") -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port, "scheme": scheme},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def pod_template(spec: AutoMQClusterSpec, ref: ClusterRef, role: Role) -> dict[str, Any]:
    """The pod template, annotated with the hash that tells outdated pods apart."""
    role_spec = spec.controller if role == "controller" else spec.broker
    http_port = CONTROLLER_PORT if role == "controller" else BROKER_HTTP_PORT
    env = _pod_env(spec, ref, role)
    volume_mounts: list[dict[str, Any]] = [
        {"name": "node-config", "mountPath": NODE_CONFIG_DIR},
        {"name": "data", "mountPath": DATA_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if role == "broker" and spec.broker.wal.kind == "volume":
        volume_mounts.append({"name": "wal", "mountPath": WAL_DIR})
    secret_volumes: list[dict[str, Any]] = []
    if role == "broker" and spec.needs_tls():
        secret_volumes.append(_secret_volume("tls", broker_certs_secret_name(ref)))
        volume_mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
    oauth = next((lst.authentication for lst in spec.listeners if lst.sasl_mechanism() == "OAUTHBEARER"), None)
    if role == "broker" and oauth is not None and oauth.jwks_secret is not None:
        secret_volumes.append(_secret_volume("oauth-jwks", oauth.jwks_secret.name))
        volume_mounts.append({"name": "oauth-jwks", "mountPath": OAUTH_DIR, "readOnly": True})
    inter = inter_broker_listener(spec.listeners)
    if role == "broker" and inter is not None and inter.sasl_mechanism() is not None:
        secret_volumes.append(_secret_volume("broker-credentials", broker_credentials_secret_name(ref)))
        volume_mounts.append({"name": "broker-credentials", "mountPath": BROKER_CREDENTIALS_DIR, "readOnly": True})
    if spec.controller_token():
        secret_volumes.append(_secret_volume("controller-token", controller_token_secret_name(ref)))
        volume_mounts.append({"name": "controller-token", "mountPath": TOKEN_DIR, "readOnly": True})
    if spec.controller_tls() and role == "controller":
        secret_volumes.append(_secret_volume("controller-tls", controller_certs_secret_name(ref)))
        volume_mounts.append({"name": "controller-tls", "mountPath": CONTROLLER_TLS_DIR, "readOnly": True})
    elif role == "broker" and spec.controller_client_tls():
        secret_volumes.append(controller_ca_volume(ref))
        volume_mounts.append({"name": "controller-ca", "mountPath": CONTROLLER_CA_DIR, "readOnly": True})
    # https controllers answer nothing in clear text; the kubelet's HTTPS probes do not verify
    probe_scheme = "HTTPS" if spec.controller_tls() and role == "controller" else "HTTP"
    ports = [{"name": "http", "containerPort": http_port, "protocol": "TCP"}]
    if role == "controller" and spec.controller.schema_registry_port is not None:
        ports.append(
            {"name": "schema-registry", "containerPort": spec.controller.schema_registry_port, "protocol": "TCP"}
        )
    if role == "broker":
        ports = [
            {"name": _port_name(listener.name), "containerPort": listener.port, "protocol": "TCP"}
            for listener in broker_listeners(spec)
        ] + ports

    init = {
        "name": "node-config",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "automq.operator.podconfig"],
        "args": ["--template", f"{CONFIG_DIR}/{role}.yaml", "--out", f"{NODE_CONFIG_DIR}/node.yaml"],
        "env": env,
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "node-config", "mountPath": NODE_CONFIG_DIR},
        ],
        "securityContext": _container_security(),
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
    }
    main = {
        "name": role,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": [role, "--config", f"{NODE_CONFIG_DIR}/node.yaml"],
        "env": env + _credentials_env(spec),
        "ports": ports,
        "volumeMounts": volume_mounts,
        "readinessProbe": _probe("/readyz", http_port, 5, 3, probe_scheme),
        "livenessProbe": _probe("/healthz", http_port, 10, 6, probe_scheme),
        # WAL recovery replays and uploads before the node serves: allow it up to 10 minutes.
        "startupProbe": _probe("/healthz", http_port, 5, 120, probe_scheme),
        "securityContext": _container_security(),
    }
    resources = _resources(role_spec.resources, role)
    if resources:
        main["resources"] = resources

    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map_name(ref)}},
        {"name": "node-config", "emptyDir": {}},
        {"name": "data", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        *secret_volumes,
    ]
    pod_spec: dict[str, Any] = {
        "serviceAccountName": ref.name,
        "automountServiceAccountToken": role == "controller",
        "enableServiceLinks": False,
        # Brokers upload what their WAL holds before exiting; give them time.
        "terminationGracePeriodSeconds": 120 if role == "broker" else 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": USER_ID,
            "runAsGroup": USER_ID,
            "fsGroup": USER_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [init],
        "containers": [main],
        "volumes": volumes,
        "topologySpreadConstraints": _spread(spec, ref, role),
        **_scheduling(role_spec.scheduling),
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]

    annotations = {CONFIG_HASH: content_hash(dump_config(node_config(spec, ref, role)))}
    if spec.metrics.enabled:
        annotations.update(
            {"prometheus.io/scrape": "true", "prometheus.io/port": str(http_port), "prometheus.io/path": "/metrics"}
        )
        if probe_scheme == "HTTPS":
            annotations["prometheus.io/scheme"] = "https"
    template = {"metadata": {"labels": common_labels(ref, role), "annotations": annotations}, "spec": pod_spec}
    template["metadata"]["annotations"][TEMPLATE_HASH] = content_hash(template)
    return template


def _secret_volume(name: str, secret: str) -> dict[str, Any]:
    # Mounted as a directory (no subPath): the kubelet swaps renewed content in place and the
    # node re-reads it, so a renewed certificate or token needs no restart.
    secret_source: dict[str, Any] = {"secretName": secret, "defaultMode": 0o440}
    return {"name": name, "secret": secret_source}


def _spread(spec: AutoMQClusterSpec, ref: ClusterRef, role: Role) -> list[dict[str, Any]]:
    selector = {"matchLabels": selector_labels(ref, role)}
    constraints = [
        # Prefer one node per pod; a small cluster still schedules.
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": selector,
        }
    ]
    if role == "broker" and spec.broker.rack.enabled:
        constraints.append(
            {
                "maxSkew": 1,
                "topologyKey": spec.broker.rack.topology_key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": selector,
            }
        )
    return constraints


def statefulset(spec: AutoMQClusterSpec, ref: ClusterRef, role: Role, replicas: int | None = None) -> dict[str, Any]:
    """A role's StatefulSet; `replicas` overrides the spec while a scale-in is still draining."""
    role_spec = spec.controller if role == "controller" else spec.broker
    sts_spec: dict[str, Any] = {
        "replicas": role_spec.replicas if replicas is None else replicas,
        "serviceName": headless_service_name(ref, role),
        "selector": {"matchLabels": selector_labels(ref, role)},
        # The operator restarts pods itself, in order, draining brokers first.
        "updateStrategy": {"type": "OnDelete"},
        "podManagementPolicy": "Parallel",
        "template": pod_template(spec, ref, role),
    }
    if role == "broker" and spec.broker.wal.kind == "volume":
        wal = spec.broker.wal
        claim_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": wal.size}},
        }
        if wal.storage_class_name:
            claim_spec["storageClassName"] = wal.storage_class_name
        sts_spec["volumeClaimTemplates"] = [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "wal", "labels": common_labels(ref, role)},
                "spec": claim_spec,
            }
        ]
        sts_spec["persistentVolumeClaimRetentionPolicy"] = {
            "whenDeleted": "Delete" if spec.deletion_policy == "Delete" else "Retain",
            # A removed broker's WAL was drained and uploaded, but keep the volume: scaling back
            # out reuses it and nothing is lost if an upload was still pending.
            "whenScaled": "Retain",
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(ref, statefulset_name(ref, role), role),
        "spec": sts_spec,
    }


def template_hash(sts: dict[str, Any]) -> str:
    return sts["spec"]["template"]["metadata"]["annotations"][TEMPLATE_HASH]


def wal_claim_names(ref: ClusterRef, ordinals: range) -> list[str]:
    return [f"wal-{pod_name(ref, 'broker', i)}" for i in ordinals]


def desired_objects(spec: AutoMQClusterSpec, ref: ClusterRef) -> list[dict[str, Any]]:
    """Everything the cluster needs, in the order the reconciler applies it."""
    return [
        config_map(spec, ref),
        *services(spec, ref),
        service_account(spec, ref),
        lease_role(spec, ref),
        lease_role_binding(spec, ref),
        pod_disruption_budget(spec, ref, "controller"),
        pod_disruption_budget(spec, ref, "broker"),
        statefulset(spec, ref, "controller"),
        statefulset(spec, ref, "broker"),
    ]
