"""Security material of one AutoMQCluster: CAs and certificates, the controller API token, and
the secure-defaults pin, kept in Secrets the cluster owns.

Secrets, for a cluster `demo` (all owned by the AutoMQCluster, so deleted with it):
    demo-cluster-ca          ca.crt, ca.key   the cluster CA (signs node certificates)
    demo-cluster-ca-cert     ca.crt           what clients trust: the current cluster CA(s)
    demo-clients-ca          ca.crt, ca.key   the clients CA (signs AutoMQUser tls certificates)
    demo-clients-ca-cert     ca.crt           what brokers verify clients against
    demo-broker-certs        tls.crt, tls.key, ca.crt   the brokers' certificate (wildcard names of
                                              the headless Service, the bootstrap names, external
                                              names) and the trust bundle (both CAs)
    demo-controller-token    token            the controller API's shared token
    demo-controller-certs    tls.crt, tls.key, ca.crt   the controllers' https certificate (wildcard
                                              names of their headless Service) and the cluster
                                              CA(s); other pods mount only its ca.crt

With `spec.security.certificates.issuer: cert-manager` the operator does not generate anything:
it renders cert-manager `Certificate`s whose Secrets have the same names and keys (tls.crt,
tls.key, ca.crt), so the pods are the same either way.

Rotation never restarts a pod: Secret volumes are updated in place by the kubelet and brokers
re-read their certificate files (`tls.reload_check_interval_ms`), the controller re-reads its
token file (the previous token stays valid for 5 minutes).
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import logging
import secrets as random_secrets
import ssl
from collections.abc import Sequence
from typing import Any

from automq.broker.security.controller_auth import ControllerClientAuth, TokenFile
from automq.broker.security.scram import make_credential, password_matches
from automq.operator import builders, certificates
from automq.operator.builders import ClusterRef
from automq.operator.certificates import KeyPair
from automq.operator.spec import (
    BROKER_USER,
    CONTROLLER_SCHEME_ANNOTATION,
    SECURITY_DEFAULTS_ANNOTATION,
    AutoMQClusterSpec,
    inter_broker_listener,
)

log = logging.getLogger(__name__)

TOKEN_KEY = "token"


def cluster_ca_secret(ref: ClusterRef) -> str:
    return f"{ref.name}-cluster-ca"


def cluster_ca_cert_secret(ref: ClusterRef) -> str:
    return f"{ref.name}-cluster-ca-cert"


def clients_ca_secret(ref: ClusterRef) -> str:
    return f"{ref.name}-clients-ca"


def clients_ca_cert_secret(ref: ClusterRef) -> str:
    return f"{ref.name}-clients-ca-cert"


broker_certs_secret = builders.broker_certs_secret_name
controller_token_secret = builders.controller_token_secret_name
controller_certs_secret = builders.controller_certs_secret_name


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(data: dict[str, str], key: str) -> bytes:
    try:
        return base64.b64decode(data.get(key) or "")
    except ValueError:
        return b""


def broker_dns_names(spec: AutoMQClusterSpec, ref: ClusterRef) -> list[str]:
    """Every name a client may use to reach a broker: any pod of the headless Service (one
    wildcard covers every ordinal, so scaling needs no new certificate), the bootstrap Services,
    and the external addresses of nodeport/loadbalancer listeners that have a host template."""
    ns = ref.namespace
    headless = builders.headless_service_name(ref, "broker")
    names = [f"*.{headless}.{ns}.svc", f"*.{headless}.{ns}.svc.cluster.local", f"{headless}.{ns}.svc"]
    bootstraps = [builders.bootstrap_service_name(ref)] + [
        builders.external_bootstrap_service_name(ref, lst) for lst in spec.listeners if lst.type != "internal"
    ]
    for service in bootstraps:
        names += [service, f"{service}.{ns}", f"{service}.{ns}.svc", f"{service}.{ns}.svc.cluster.local"]
    most = max(spec.broker.replicas, spec.autoscaling.max_replicas if spec.autoscaling.enabled else 0, 1)
    for lst in spec.listeners:
        if lst.advertised_host_template:
            names += [lst.advertised_host_template.replace("{ordinal}", str(i)) for i in range(most)]
    names += spec.security.certificates.extra_dns_names
    return list(dict.fromkeys(names))


async def _write_secret(
    api: Any, ref: ClusterRef, name: str, data: dict[str, bytes], live: dict[str, Any] | None
) -> bool:
    """Create the Secret, or replace its data when it differs; True when written."""
    encoded = {k: _b64(v) for k, v in data.items()}
    if live is not None:
        current = live.get("data") or {}
        if current == encoded:
            return False
        gone: dict[str, str | None] = {k: None for k in current if k not in encoded}
        await api.patch("Secret", ref.namespace, name, {"data": {**encoded, **gone}})
        return True
    await api.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": name,
                "namespace": ref.namespace,
                "labels": builders.common_labels(ref),
                "ownerReferences": [ref.owner_reference()],
            },
            "data": encoded,
        }
    )
    return True


async def _ensure_ca(
    api: Any, spec: AutoMQClusterSpec, ref: ClusterRef, which: str, now: dt.datetime, notes: list[str]
) -> tuple[KeyPair, bytes, list[Any]]:
    """The current CA, the trust bundle (current first, then older unexpired CAs), and the
    older CAs that leaf certificates may still be signed by while the new one is distributed."""
    settings = spec.security.certificates
    key_name = cluster_ca_secret(ref) if which == "cluster" else clients_ca_secret(ref)
    cert_name = cluster_ca_cert_secret(ref) if which == "cluster" else clients_ca_cert_secret(ref)
    live = await api.get("Secret", ref.namespace, key_name)
    data = (live or {}).get("data") or {}
    stored = KeyPair(_unb64(data, "ca.crt"), _unb64(data, "ca.key")) if live is not None else None
    # A CA is replaced twice the renewal window before it ends; leaves signed by the old one are
    # re-signed only when they fall due themselves (at most one window later, and before the
    # old CA ends, which caps their validity), so clients get a whole renewal window to pick up
    # the new CA from the ca.crt bundle before any broker presents a certificate signed by it.
    why = certificates.ca_due(stored, now, 2 * settings.renewal_days)
    if why is None and stored is not None:
        ca = stored
    else:
        ca = certificates.new_ca(f"{ref.namespace}-{ref.name}-{which}-ca", now, settings.ca_validity_days)
        notes.append(f"{which} CA created ({why})")
    public = await api.get("Secret", ref.namespace, cert_name)
    trusted = certificates.bundle(ca.cert_pem, _unb64((public or {}).get("data") or {}, "ca.crt"), now=now)
    await _write_secret(api, ref, key_name, {"ca.crt": ca.cert_pem, "ca.key": ca.key_pem}, live)
    await _write_secret(api, ref, cert_name, {"ca.crt": trusted}, public)
    return ca, trusted, certificates.load_chain(trusted)[1:]


async def ensure_certificates(api: Any, spec: AutoMQClusterSpec, ref: ClusterRef, now: dt.datetime) -> list[str]:
    """Operator-issued CAs and the broker and controller certificates, created or renewed as
    needed; what was done."""
    notes: list[str] = []
    cluster_ca, cluster_bundle, previous = await _ensure_ca(api, spec, ref, "cluster", now, notes)
    _clients_ca, clients_bundle, _ = await _ensure_ca(api, spec, ref, "clients", now, notes)
    issuer = (cluster_ca, previous)
    if spec.needs_tls():
        dns = broker_dns_names(spec, ref)
        await _ensure_leaf(api, spec, ref, "broker", dns, issuer, cluster_bundle + clients_bundle, now, notes)
    if spec.controller_tls():
        # The controllers' clients are nodes, the operator and jobs of this cluster: they trust
        # the cluster CA only (ca.crt here is all a broker or job pod mounts of this Secret).
        dns = builders.controller_dns_names(ref)
        await _ensure_leaf(api, spec, ref, "controller", dns, issuer, cluster_bundle, now, notes)
    return notes


async def _ensure_leaf(
    api: Any,
    spec: AutoMQClusterSpec,
    ref: ClusterRef,
    role: str,
    dns: list[str],
    issuer: tuple[KeyPair, list[Any]],
    trust: bytes,
    now: dt.datetime,
    notes: list[str],
) -> None:
    """The role's certificate Secret (tls.crt, tls.key, ca.crt), (re)issued by the cluster CA when due."""
    name = broker_certs_secret(ref) if role == "broker" else controller_certs_secret(ref)
    live = await api.get("Secret", ref.namespace, name)
    data = (live or {}).get("data") or {}
    leaf = KeyPair(_unb64(data, "tls.crt"), _unb64(data, "tls.key")) if live is not None else None
    settings = spec.security.certificates
    cluster_ca, previous = issuer
    why = certificates.leaf_due(leaf, cluster_ca, now, settings.renewal_days, dns, previous)
    if why is not None or leaf is None:
        leaf = certificates.issue(
            cluster_ca,
            certificates.node_subject(f"{ref.name}-{role}"),
            now,
            settings.validity_days,
            dns_names=dns,
            server=True,
        )
        notes.append(f"{role} certificate issued ({why})")
    await _write_secret(api, ref, name, {"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem, "ca.crt": trust}, live)


async def ensure_controller_token(api: Any, ref: ClusterRef) -> str:
    """The controller API token (generated once)."""
    name = controller_token_secret(ref)
    live = await api.get("Secret", ref.namespace, name)
    token = _unb64((live or {}).get("data") or {}, TOKEN_KEY).decode(errors="replace").strip()
    if not token:
        token = random_secrets.token_urlsafe(32)
        await _write_secret(api, ref, name, {TOKEN_KEY: token.encode()}, live)
        log.info("controller token of %s/%s written to Secret %s", ref.namespace, ref.name, name)
    return token


async def ensure_broker_credentials(api: Any, spec: AutoMQClusterSpec, ref: ClusterRef) -> str | None:
    """The brokers' own SCRAM password (in `<cluster>-broker-credentials`, with the JAAS line
    the brokers read), when they call each other on a SASL listener; None otherwise."""
    inter = inter_broker_listener(spec.listeners)
    if inter is None or inter.sasl_mechanism() is None:
        return None
    name = builders.broker_credentials_secret_name(ref)
    live = await api.get("Secret", ref.namespace, name)
    data = (live or {}).get("data") or {}
    password = _unb64(data, "password").decode(errors="replace")
    if not password:
        password = random_secrets.token_urlsafe(24)
    module = "plain.PlainLoginModule" if inter.sasl_mechanism() == "PLAIN" else "scram.ScramLoginModule"
    jaas = f'org.apache.kafka.common.security.{module} required username="{BROKER_USER}" password="{password}";'
    await _write_secret(
        api, ref, name, {"password": password.encode(), builders.INTER_BROKER_JAAS: jaas.encode()}, live
    )
    return password


def broker_scram_mechanism(spec: AutoMQClusterSpec) -> str | None:
    """The mechanism of the brokers' stored SCRAM credential (PLAIN listeners check passwords
    against any stored SCRAM credential: SCRAM-SHA-512 then)."""
    inter = inter_broker_listener(spec.listeners)
    mechanism = inter.sasl_mechanism() if inter is not None else None
    if mechanism is None:
        return None
    return "SCRAM-SHA-512" if mechanism == "PLAIN" else mechanism


async def store_broker_credential(controller: Any, spec: AutoMQClusterSpec, password: str) -> bool:
    """Put the brokers' SCRAM credential in the cluster's metadata if it is not there (or no
    longer matches the password); True when it was already in place."""
    from automq.operator.users import _credential, _info

    mechanism = broker_scram_mechanism(spec)
    if mechanism is None:
        return True
    image = await controller.metadata()
    held = [c for c in image.scram_credentials if c.user == BROKER_USER and c.mechanism == mechanism]
    if held and password_matches(_credential(held[0]), password):
        return True
    await controller.alter_scram([], [_info(BROKER_USER, make_credential(mechanism, password))])
    log.info("brokers' SCRAM credential (%s, %s) stored", BROKER_USER, mechanism)
    return False


class _FixedToken(TokenFile):
    """A token the operator read from the cluster's Secret (it runs outside the node pods and
    does not mount it): no file behind it."""

    def __init__(self, token: str) -> None:
        self.path = "<Secret>"
        self._token = token
        self._previous = ""
        self._previous_until = 0.0

    def current(self) -> str:
        return self._token


async def operator_controller_auth(api: Any, spec: AutoMQClusterSpec, ref: ClusterRef) -> ControllerClientAuth | None:
    """What the operator sends to this cluster's controller API and how it verifies the
    controllers' https certificate (None: nothing to send, plain http)."""
    token: TokenFile | None = None
    if spec.controller_token():
        live = await api.get("Secret", ref.namespace, controller_token_secret(ref))
        value = _unb64((live or {}).get("data") or {}, TOKEN_KEY).decode(errors="replace").strip()
        # empty: not created yet (the reconcile creates it before any node starts)
        token = _FixedToken(value) if value else None
    context: ssl.SSLContext | None = None
    if spec.controller_tls():
        # Trust exactly the CA in the controllers' Secret (the operator's cluster CA, or the one
        # cert-manager's issuer put there), never the system store: a public CA's certificate
        # for the Service's name must not pass. Not there yet: nothing is trusted, calls fail.
        live = await api.get("Secret", ref.namespace, controller_certs_secret(ref))
        ca = _unb64((live or {}).get("data") or {}, "ca.crt")
        context = _trusting(ca)
    if token is None and context is None:
        return None
    return ControllerClientAuth(token=token, ssl=context)


def _trusting(ca_pem: bytes) -> ssl.SSLContext:
    """A client context trusting only the certificates of `ca_pem` (none: it trusts nothing)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies certificates and host names
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if certificates.load_chain(ca_pem):
        context.load_verify_locations(cadata=ca_pem.decode())
    return context


async def authenticated(factory: Any, api: Any, spec: AutoMQClusterSpec, ref: ClusterRef) -> Any:
    """The controller API factory, bound to this cluster's credentials when it needs any."""
    auth = await operator_controller_auth(api, spec, ref)
    return factory if auth is None else functools.partial(factory, auth=auth)


async def pin_security_defaults(api: Any, live: dict[str, Any], ref: ClusterRef) -> tuple[bool, bool]:
    """Decide once whether the cluster gets the secure defaults; returns (legacy, newly pinned).

    A cluster whose node ConfigMap already exists was created by an operator without secure
    defaults: it keeps PLAINTEXT and an open controller API until its spec says otherwise."""
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    pinned = annotations.get(SECURITY_DEFAULTS_ANNOTATION)
    if pinned in ("legacy", "secure"):
        return pinned == "legacy", False
    legacy = await api.get("ConfigMap", ref.namespace, builders.config_map_name(ref)) is not None
    value = "legacy" if legacy else "secure"
    await api.patch(
        "AutoMQCluster", ref.namespace, ref.name, {"metadata": {"annotations": {SECURITY_DEFAULTS_ANNOTATION: value}}}
    )
    live.setdefault("metadata", {}).setdefault("annotations", {})[SECURITY_DEFAULTS_ANNOTATION] = value
    return legacy, True


async def pin_controller_scheme(api: Any, live: dict[str, Any], ref: ClusterRef) -> bool:
    """Decide once whether `controllerApi.tls` defaults to false; True when it does.

    A cluster whose nodes already call their controllers over http (a ConfigMap with http
    controller_urls, written by an operator from before https controllers) keeps http until
    its spec says `tls: true`; everything else gets https."""
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    pinned = annotations.get(CONTROLLER_SCHEME_ANNOTATION)
    if pinned in ("http", "https"):
        return pinned == "http"
    config_map = await api.get("ConfigMap", ref.namespace, builders.config_map_name(ref))
    https = builders.rendered_client_scheme(config_map) == "https"
    value = "http" if config_map is not None and not https else "https"
    await api.patch(
        "AutoMQCluster", ref.namespace, ref.name, {"metadata": {"annotations": {CONTROLLER_SCHEME_ANNOTATION: value}}}
    )
    live.setdefault("metadata", {}).setdefault("annotations", {})[CONTROLLER_SCHEME_ANNOTATION] = value
    return value == "http"


# ---------------------------------------------------------------------------------------------
# cert-manager


CERT_MANAGER_API = "cert-manager.io/v1"


def cert_manager_objects(spec: AutoMQClusterSpec, ref: ClusterRef) -> list[dict[str, Any]]:
    """Issuers and Certificates for `issuer: cert-manager` (empty otherwise, or without TLS)."""
    settings = spec.security.certificates
    if settings.issuer != "cert-manager" or not spec.needs_certificates():
        return []
    out: list[dict[str, Any]] = []
    issuer_ref = settings.cert_manager.issuer_ref
    if issuer_ref is None:
        # The standard cert-manager bootstrap of a private CA: self-signed issuer -> CA
        # certificate (in demo-cluster-ca) -> CA issuer that signs the brokers' certificate.
        selfsigned = f"{ref.name}-selfsigned"
        ca_issuer = f"{ref.name}-cluster-ca"
        out += [
            _cm(ref, "Issuer", selfsigned, {"selfSigned": {}}),
            _cm(
                ref,
                "Certificate",
                cluster_ca_secret(ref),
                {
                    "isCA": True,
                    "commonName": f"{ref.namespace}-{ref.name}-cluster-ca",
                    "secretName": cluster_ca_secret(ref),
                    "duration": f"{settings.ca_validity_days * 24}h",
                    "renewBefore": f"{settings.renewal_days * 24}h",
                    "privateKey": {"algorithm": "ECDSA", "size": 256},
                    "issuerRef": {"name": selfsigned, "kind": "Issuer", "group": "cert-manager.io"},
                },
            ),
            _cm(ref, "Issuer", ca_issuer, {"ca": {"secretName": cluster_ca_secret(ref)}}),
        ]
        issuer = {"name": ca_issuer, "kind": "Issuer", "group": "cert-manager.io"}
    else:
        issuer = issuer_ref.model_dump(by_alias=True)
    roles = [("broker", broker_dns_names(spec, ref))] if spec.needs_tls() else []
    if spec.controller_tls():
        roles.append(("controller", builders.controller_dns_names(ref)))
    for role, dns in roles:
        secret = broker_certs_secret(ref) if role == "broker" else controller_certs_secret(ref)
        out.append(
            _cm(
                ref,
                "Certificate",
                secret,
                {
                    "secretName": secret,
                    "commonName": f"{ref.name}-{role}",
                    "subject": {"organizations": [certificates.BROKER_ORGANIZATION]},
                    "dnsNames": dns,
                    "duration": f"{settings.validity_days * 24}h",
                    "renewBefore": f"{settings.renewal_days * 24}h",
                    "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
                    "usages": ["server auth", "client auth", "digital signature"],
                    "issuerRef": issuer,
                },
            )
        )
    return out


def _cm(ref: ClusterRef, kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": CERT_MANAGER_API,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": ref.namespace,
            "labels": builders.common_labels(ref),
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": spec,
    }


# ---------------------------------------------------------------------------------------------
# AutoMQUser client certificates


async def issue_user_certificate(
    api: Any,
    ref: ClusterRef,
    user: str,
    now: dt.datetime,
    validity_days: int,
    renewal_days: int,
    current: KeyPair | None,
) -> tuple[KeyPair, bytes, str | None]:
    """A client certificate for `user` signed by the cluster's clients CA (renewed when due),
    and the cluster CA bundle the client must trust; the reason it was (re)issued, if it was."""
    live = await api.get("Secret", ref.namespace, clients_ca_secret(ref))
    data = (live or {}).get("data") or {}
    ca = KeyPair(_unb64(data, "ca.crt"), _unb64(data, "ca.key"))
    if live is None or certificates.ca_due(ca, now, 0) is not None:
        raise LookupError(
            f"the clients CA of AutoMQCluster {ref.name} is not there yet (Secret {clients_ca_secret(ref)})"
        )
    public = await api.get("Secret", ref.namespace, cluster_ca_cert_secret(ref))
    cluster_trust = _unb64((public or {}).get("data") or {}, "ca.crt")
    why = certificates.leaf_due(current, ca, now, renewal_days)
    if why is None and current is not None:
        return current, cluster_trust, None
    issued = certificates.issue(ca, certificates.user_subject(user), now, validity_days, server=False)
    return issued, cluster_trust, why


def trust_names(pems: Sequence[bytes]) -> list[str]:
    """Subjects of the certificates in PEM bundles (for status and logs)."""
    return [c.subject.rfc4514_string() for pem in pems for c in certificates.load_chain(pem)]
