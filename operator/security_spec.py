"""The security parts of the AutoMQCluster spec: Kafka listeners (`spec.listeners`) and
`spec.security` (certificates, controller API credentials, NetworkPolicies).

A listener is what Strimzi users know: a name, a port, a `type` saying who reaches it
(`internal`: pods of the Kubernetes cluster through the bootstrap and headless Services;
`nodeport` / `loadbalancer`: from outside, through one Service per broker plus a bootstrap
Service), `tls` on or off, and an `authentication` type. The pair (tls, authentication) is the
listener's Kafka security protocol:

    tls  authentication                          Kafka security protocol
    no   -                                       PLAINTEXT
    yes  -  or  tls (client certificate)         SSL
    no   scram-sha-512/-256, plain, oauthbearer  SASL_PLAINTEXT
    yes  scram-sha-512/-256, plain, oauthbearer  SASL_SSL

Secure by default: a cluster whose spec names no listener gets one `INTERNAL` listener on 9092
with TLS and SCRAM-SHA-512, certificates from a cluster CA the operator manages, a token on the
controller API and NetworkPolicies. A cluster created before these defaults existed keeps its
PLAINTEXT listener and open controller API (the operator pins that choice in the annotation
`automq.io/security-defaults: legacy`, see `automq.operator.security`), because switching its
clients to TLS + SCRAM behind their back would break every one of them; it moves by naming its
listeners (and `spec.security`) explicitly.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from automq.broker.config import SecurityProtocol

ListenerType = Literal["internal", "nodeport", "loadbalancer"]
AuthenticationType = Literal["scram-sha-512", "scram-sha-256", "plain", "oauthbearer", "tls"]
SASL_MECHANISMS = {
    "scram-sha-512": "SCRAM-SHA-512",
    "scram-sha-256": "SCRAM-SHA-256",
    "plain": "PLAIN",
    "oauthbearer": "OAUTHBEARER",
}
NODE_PORT_MIN, NODE_PORT_MAX = 30000, 32767
ORDINAL_PLACEHOLDER = "{ordinal}"
_HOST_TEMPLATE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
    )


class SecretKeySelector(_Model):
    """A key of a Secret in the cluster's namespace."""

    name: str = Field(..., min_length=1, max_length=253, description="Secret name.")
    key: str = Field("jwks.json", min_length=1, max_length=253, description="Key within the Secret.")


class ListenerAuthentication(_Model):
    """How clients of this listener authenticate."""

    type: AuthenticationType = Field(
        ...,
        description="scram-sha-512 / scram-sha-256: SCRAM users (AutoMQUser with authentication scram-*); "
        "plain: SASL PLAIN checked against the SCRAM users' passwords; oauthbearer: JWTs signed by a key "
        "of jwksSecret; tls: client certificates signed by the clients CA (needs tls: true; AutoMQUser with "
        "authentication tls).",
    )
    jwks_secret: SecretKeySelector | None = Field(
        None,
        description="oauthbearer: the Secret key holding your identity provider's JSON Web Key Set (the "
        "brokers re-read it when the Secret changes). Required unless spec.config sets "
        "security.sasl_oauthbearer_allow_unsecured (development only).",
    )
    expected_issuer: str | None = Field(None, description="oauthbearer: tokens' iss must be this.")
    expected_audience: str | None = Field(None, description="oauthbearer: tokens' aud must contain this.")

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.type == 'oauthbearer' || (!has(self.jwksSecret) && !has(self.expectedIssuer) "
                    "&& !has(self.expectedAudience))",
                    "message": "jwksSecret, expectedIssuer and expectedAudience only apply to oauthbearer",
                }
            ]
        }
    )

    @model_validator(mode="after")
    def _oauth_only(self) -> ListenerAuthentication:
        oauth = (self.jwks_secret, self.expected_issuer, self.expected_audience)
        if self.type != "oauthbearer" and any(v is not None for v in oauth):
            raise ValueError("jwksSecret, expectedIssuer and expectedAudience only apply to oauthbearer")
        return self

    def oauth_settings(self) -> tuple[str | None, ...]:
        secret = self.jwks_secret
        return (
            secret.name if secret else None,
            secret.key if secret else None,
            self.expected_issuer,
            self.expected_audience,
        )


class ListenerSpec(_Model):
    """A Kafka listener on every broker."""

    name: str = Field(
        ...,
        pattern=r"^[A-Z][A-Z0-9_]*$",
        max_length=32,
        description="Listener name as Kafka clients see it, e.g. INTERNAL or EXTERNAL.",
    )
    port: int = Field(..., ge=1024, le=65535, description="Container port (>= 1024: the pods run as non-root).")
    type: ListenerType = Field(
        "internal",
        description="internal: reached inside the Kubernetes cluster (bootstrap and headless Services). "
        "nodeport / loadbalancer: from outside, through a Service per broker and a bootstrap Service of that type.",
    )
    tls: bool = Field(False, description="Encrypt the listener with TLS (certificates: spec.security.certificates).")
    authentication: ListenerAuthentication | None = Field(
        None, description="Client authentication; none when absent (anyone who can connect is User:ANONYMOUS)."
    )
    node_port_base: int | None = Field(
        None,
        ge=NODE_PORT_MIN,
        le=NODE_PORT_MAX,
        description="nodeport: broker N is advertised (and its Service exposed) on node port nodePortBase + N.",
    )
    advertised_host_template: str | None = Field(
        None,
        max_length=253,
        description="nodeport / loadbalancer: the address broker N advertises, with {ordinal} replaced by N "
        "(e.g. kafka-{ordinal}.example.com, a DNS name pointing at that broker's Service). Required for "
        "loadbalancer; nodeport defaults to the IP of the node the broker runs on. The names are added to the "
        "broker certificate.",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Annotations of this listener's external Services (e.g. for external-dns or a cloud load balancer).",
    )

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.authentication) || self.authentication.type != 'tls' || "
                    "(has(self.tls) && self.tls)",
                    "message": "authentication type tls (client certificates) needs tls: true on the listener",
                },
                {
                    "rule": "!has(self.type) || self.type != 'nodeport' || has(self.nodePortBase)",
                    "message": "a nodeport listener needs nodePortBase (broker N uses node port nodePortBase + N)",
                },
                {
                    "rule": "!has(self.type) || self.type != 'loadbalancer' || has(self.advertisedHostTemplate)",
                    "message": "a loadbalancer listener needs advertisedHostTemplate (the DNS name of broker {ordinal})",
                },
                {
                    "rule": "(has(self.type) && self.type != 'internal') || "
                    "(!has(self.nodePortBase) && !has(self.advertisedHostTemplate))",
                    "message": "nodePortBase and advertisedHostTemplate only apply to nodeport and loadbalancer listeners",
                },
            ]
        }
    )

    @field_validator("advertised_host_template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if ORDINAL_PLACEHOLDER not in value:
            raise ValueError("advertisedHostTemplate must contain {ordinal}: every broker needs its own address")
        if not re.match(_HOST_TEMPLATE, value.replace(ORDINAL_PLACEHOLDER, "0")):
            raise ValueError(f"advertisedHostTemplate {value!r} is not a DNS name once {{ordinal}} is replaced")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ListenerSpec:
        where = f"listener {self.name}"
        if self.authentication is not None and self.authentication.type == "tls" and not self.tls:
            raise ValueError(f"{where}: authentication type tls (client certificates) needs tls: true")
        if self.type == "nodeport" and self.node_port_base is None:
            raise ValueError(f"{where}: a nodeport listener needs nodePortBase")
        if self.type == "loadbalancer" and self.advertised_host_template is None:
            raise ValueError(f"{where}: a loadbalancer listener needs advertisedHostTemplate")
        if self.type == "internal" and (self.node_port_base is not None or self.advertised_host_template is not None):
            raise ValueError(
                f"{where}: nodePortBase and advertisedHostTemplate only apply to nodeport and loadbalancer listeners"
            )
        return self

    def security_protocol(self) -> SecurityProtocol:
        """Kafka's name for what this listener speaks."""
        sasl = self.authentication is not None and self.authentication.type in SASL_MECHANISMS
        if sasl:
            return "SASL_SSL" if self.tls else "SASL_PLAINTEXT"
        return "SSL" if self.tls else "PLAINTEXT"

    def sasl_mechanism(self) -> str | None:
        if self.authentication is None:
            return None
        return SASL_MECHANISMS.get(self.authentication.type)

    def client_certificates(self) -> bool:
        return self.authentication is not None and self.authentication.type == "tls"


def secure_default_listeners() -> list[ListenerSpec]:
    """What a new cluster gets when its spec names no listener."""
    return [
        ListenerSpec(name="INTERNAL", port=9092, tls=True, authentication=ListenerAuthentication(type="scram-sha-512"))
    ]


def legacy_default_listeners() -> list[ListenerSpec]:
    """What clusters created before the secure defaults had: PLAINTEXT on 9092, no authentication."""
    return [ListenerSpec(name="PLAINTEXT", port=9092)]


class IssuerRef(_Model):
    """A cert-manager Issuer or ClusterIssuer."""

    name: str = Field(..., min_length=1, max_length=253, description="Issuer name.")
    kind: Literal["Issuer", "ClusterIssuer"] = Field("Issuer", description="Issuer or ClusterIssuer.")
    group: str = Field("cert-manager.io", description="API group of the issuer.")


class CertManagerSpec(_Model):
    """Certificates issued by cert-manager instead of the operator's own CA."""

    issuer_ref: IssuerRef | None = Field(
        None,
        description="Issuer of the broker (and controller) certificates. Absent: the operator renders a "
        "self-signed Issuer, a CA Certificate from it and a CA Issuer, i.e. a cluster CA kept by cert-manager.",
    )


class CertificatesSpec(_Model):
    """Certificates of TLS listeners and of the controller API."""

    issuer: Literal["operator", "cert-manager"] = Field(
        "operator",
        description="operator: a cluster CA and a clients CA the operator generates, keeps in Secrets and renews. "
        "cert-manager: Certificate resources (cert-manager must be installed).",
    )
    validity_days: int = Field(365, ge=2, le=3650, description="Validity of broker and controller certificates.")
    renewal_days: int = Field(
        30, ge=1, le=3649, description="Renew a certificate (or CA) this many days before it expires."
    )
    ca_validity_days: int = Field(1825, ge=2, le=36500, description="Validity of the operator's CAs.")
    cert_manager: CertManagerSpec = Field(default_factory=CertManagerSpec, description="issuer: cert-manager only.")
    extra_dns_names: list[str] = Field(
        default_factory=list,
        max_length=100,
        description="More DNS names for the broker certificate (e.g. an external bootstrap name).",
    )

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.renewalDays) ? self.renewalDays : 30) < "
                    "(has(self.validityDays) ? self.validityDays : 365)",
                    "message": "spec.security.certificates.renewalDays must be less than validityDays",
                }
            ]
        }
    )

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> CertificatesSpec:
        if self.renewal_days >= self.validity_days:
            raise ValueError(
                f"spec.security.certificates.renewalDays ({self.renewal_days}) must be less than "
                f"validityDays ({self.validity_days})"
            )
        if self.renewal_days >= self.ca_validity_days:
            raise ValueError(
                f"spec.security.certificates.renewalDays ({self.renewal_days}) must be less than "
                f"caValidityDays ({self.ca_validity_days})"
            )
        return self


class ControllerApiSpec(_Model):
    """Credentials of the controller's HTTP API (brokers, the operator and Spark jobs call it)."""

    authentication: Literal["token", "none"] | None = Field(
        None,
        description="token: a random token in a Secret the operator creates; every call carries it, probes and "
        "/metrics stay open. none: no credentials (anyone who reaches the port can change metadata). "
        "Absent: token, except on clusters created before secure defaults (see docs/security.md).",
    )
    tls: bool | None = Field(
        None,
        description="Serve the controller API over https with a certificate from the cluster CA "
        "(spec.security.certificates: the operator's CA or cert-manager); brokers, the operator and the Spark "
        "jobs verify it. Absent: true, except on clusters created before secure defaults.",
    )


class NetworkPoliciesSpec(_Model):
    """NetworkPolicies around the cluster's pods (enforced only by a CNI that supports them)."""

    enabled: bool | None = Field(
        None,
        description="Render NetworkPolicies. Absent: true, except on clusters created before secure defaults.",
    )
    kafka_from: list[dict[str, Any]] | None = Field(
        None,
        description="NetworkPolicyPeers (podSelector / namespaceSelector / ipBlock) allowed to reach the Kafka "
        "listeners; absent: anyone (clients authenticate on the listener).",
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    metrics_from: list[dict[str, Any]] | None = Field(
        None,
        description="NetworkPolicyPeers allowed to scrape /metrics on the nodes' HTTP ports (e.g. "
        "{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}); absent: anyone.",
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    operator_namespace: str | None = Field(
        None,
        description="Namespace of the operator's pods (allowed to call the controller API). Absent: operator "
        "pods (app.kubernetes.io/component: operator, part-of: automq) in any namespace.",
    )


class SecuritySpec(_Model):
    """Certificates, controller API credentials and NetworkPolicies."""

    certificates: CertificatesSpec = Field(default_factory=CertificatesSpec, description="Certificates.")
    controller_api: ControllerApiSpec = Field(default_factory=ControllerApiSpec, description="Controller API.")
    network_policies: NetworkPoliciesSpec = Field(default_factory=NetworkPoliciesSpec, description="NetworkPolicies.")
