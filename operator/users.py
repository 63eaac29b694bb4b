"""Reconciling AutoMQUser resources: the cluster's ACLs and quotas for one principal follow
the spec (see `user_spec` for the model and what the resource owns).

A pass reads the cluster's metadata through its controller (`ControllerApi.metadata()`),
creates the missing bindings, deletes the extra ones with exact filters, and sets or removes
the user's quota keys; an unchanged user costs one metadata read. It runs on create, update,
resume and every few minutes (drift: ACLs changed through the Kafka API), only on the leading
operator replica. Deleting the resource removes the principal's ACLs and quotas (unless its
cluster is gone already).

With `spec.authentication` (SCRAM-SHA-512/256) the operator generates a password once, keeps it
in a Secret named after the user and owned by the AutoMQUser (deleted with it), and stores the
salted credential in the cluster's metadata (what AlterUserScramCredentials stores); a
credential that no longer matches the Secret's password is replaced, and one for a mechanism
the spec no longer names is removed.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import secrets
from dataclasses import dataclass
from typing import Any

import kopf

from automq.broker.controller.acls import AclBinding, AclFilter
from automq.broker.controller.protocol import ScramCredentialInfo
from automq.broker.security.scram import ScramCredential, make_credential, password_matches
from automq.operator import builders, certificates, security
from automq.operator.builders import ClusterRef
from automq.operator.certificates import KeyPair
from automq.operator.controller_api import ControllerApi, ControllerApiError
from automq.operator.spec import AutoMQClusterSpec, InvalidSpec, parse_cluster
from automq.operator.user_spec import (
    API_VERSION,
    USER_KIND,
    AutoMQUserSpec,
    InvalidUserSpec,
    desired_acls,
    desired_quotas,
    jaas_config,
    parse_user_spec,
    principal_of,
    quota_ops,
    scram_mechanism,
    wants_certificate,
)

log = logging.getLogger(__name__)

RETRY_DELAY_S = 15.0
RESYNC_INTERVAL_S = 300.0


@dataclass(frozen=True)
class UserOutcome:
    created: int
    deleted: int
    quota_changes: int
    acls: int  # what the principal holds now


def _exact(b: AclBinding) -> AclFilter:
    return AclFilter(b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host, b.operation, b.permission)


async def sync_user(controller: ControllerApi, name: str, spec: AutoMQUserSpec | None) -> UserOutcome:
    """Make the cluster hold exactly what the spec says for the user (None: nothing)."""
    principal = principal_of(name)
    image = await controller.metadata()
    current = {b for b in image.acls if b.principal == principal}
    wanted = desired_acls(name, spec) if spec is not None else set()
    missing = sorted(wanted - current, key=AclBinding.key)
    extra = sorted(current - wanted, key=AclBinding.key)
    if missing:
        await controller.create_acls(missing)
    if extra:
        await controller.delete_acls([_exact(b) for b in extra])
    entity = (("user", name),)
    held = next((dict(q.values) for q in image.client_quotas if q.entity == entity), {})
    ops = quota_ops(held, desired_quotas(spec) if spec is not None else {})
    if ops:
        await controller.alter_user_quotas(name, ops)
    if missing or extra or ops:
        log.info(
            "user %s: %d ACLs created, %d deleted, quotas %s", principal, len(missing), len(extra), ops or "unchanged"
        )
    return UserOutcome(len(missing), len(extra), len(ops), len(wanted))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _credential(info: ScramCredentialInfo) -> ScramCredential:
    decode = base64.b64decode
    return ScramCredential(
        info.mechanism, decode(info.salt), info.iterations, decode(info.stored_key), decode(info.server_key)
    )


def _info(user: str, c: ScramCredential) -> ScramCredentialInfo:
    return ScramCredentialInfo(user, c.mechanism, _b64(c.salt), c.iterations, _b64(c.stored_key), _b64(c.server_key))


class CredentialConflict(Exception):
    """A Secret of the user's name exists and does not belong to this AutoMQUser."""


async def ensure_secret(
    kube: Any, name: str, namespace: str, owner_uid: str, mechanism: str, bootstrap: str, ca: str = ""
) -> str:
    """The user's password: read from its Secret, or generated and stored in a new one. `ca`:
    the cluster CA bundle clients trust (ca.crt), when the cluster has TLS listeners."""
    live = await kube.get("Secret", namespace, name)
    wanted = {"username": name, "mechanism": mechanism, "bootstrap": bootstrap}
    if ca:
        wanted["ca.crt"] = ca
    if live is not None:
        owners = live.get("metadata", {}).get("ownerReferences") or []
        if not any(o.get("uid") == owner_uid for o in owners):
            raise CredentialConflict(f"Secret {namespace}/{name} exists and is not owned by AutoMQUser {name}")
        data = live.get("data") or {}
        password = base64.b64decode(data.get("password", "")).decode()
        if password:
            full = {**wanted, "sasl.jaas.config": jaas_config(name, password)}
            stale = {k: _b64(v.encode()) for k, v in full.items() if data.get(k) != _b64(v.encode())}
            if stale:
                await kube.patch("Secret", namespace, name, {"data": stale})
            return password
    password = secrets.token_urlsafe(24)
    values = {**wanted, "password": password, "sasl.jaas.config": jaas_config(name, password)}
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "automq-operator", "automq.io/user": name},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": USER_KIND,
                    "name": name,
                    "uid": owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {k: _b64(v.encode()) for k, v in values.items()},
    }
    if live is None:
        await kube.create(body)
    else:  # ours but without a password (edited by hand, or a tls user before): start over
        fresh: dict[str, str | None] = {k: _b64(v.encode()) for k, v in values.items()}
        fresh.update({k: None for k in live.get("data") or {} if k not in fresh})
        await kube.patch("Secret", namespace, name, {"data": fresh})
    log.info("user User:%s: credentials written to Secret %s/%s", name, namespace, name)
    return password


def _secret_body(name: str, namespace: str, owner_uid: str, data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "automq-operator", "automq.io/user": name},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": USER_KIND,
                    "name": name,
                    "uid": owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


async def ensure_certificate_secret(
    kube: Any,
    name: str,
    ref: ClusterRef,
    owner_uid: str,
    cluster_spec: AutoMQClusterSpec,
    bootstrap: str,
    now: dt.datetime | None = None,
) -> str:
    """A tls user's client certificate from the cluster's clients CA, in the user's Secret:
    issued once, re-issued when due (or signed by a CA no longer current). Returns the
    certificate's expiry (RFC 3339)."""
    namespace = ref.namespace
    live = await kube.get("Secret", namespace, name)
    data = (live or {}).get("data") or {}
    if live is not None:
        owners = live.get("metadata", {}).get("ownerReferences") or []
        if not any(o.get("uid") == owner_uid for o in owners):
            raise CredentialConflict(f"Secret {namespace}/{name} exists and is not owned by AutoMQUser {name}")
    current = None
    if data.get("user.crt") and data.get("user.key"):
        current = KeyPair(base64.b64decode(data["user.crt"]), base64.b64decode(data["user.key"]))
    settings = cluster_spec.security.certificates
    pair, trust, why = await security.issue_user_certificate(
        kube, ref, name, now or dt.datetime.now(dt.UTC), settings.validity_days, settings.renewal_days, current
    )
    password = base64.b64decode(data["user.password"]).decode() if data.get("user.password") else ""
    if why is not None or not password:
        password = secrets.token_urlsafe(18)
    wanted = {
        "user.crt": pair.cert_pem,
        "user.key": pair.key_pem,
        "user.p12": certificates.pkcs12(name, pair, password),
        "user.password": password.encode(),
        "ca.crt": trust,
        "bootstrap": bootstrap.encode(),
    }
    encoded = {k: base64.b64encode(v).decode() for k, v in wanted.items()}
    # user.p12 is re-encrypted with a fresh salt each time: compare what it holds, not its bytes.
    unchanged = why is None and all(data.get(k) == v for k, v in encoded.items() if k != "user.p12")
    if live is None:
        await kube.create(_secret_body(name, namespace, owner_uid, wanted))
    elif not unchanged:
        stale = {k: None for k in data if k not in encoded}
        await kube.patch("Secret", namespace, name, {"data": {**encoded, **stale}})
    if why is not None:
        log.info("user User:%s: client certificate written to Secret %s/%s (%s)", name, namespace, name, why)
    return certificates.load_chain(pair.cert_pem)[0].not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")


async def sync_credentials(
    controller: ControllerApi,
    kube: Any,
    name: str,
    namespace: str,
    owner_uid: str,
    spec: AutoMQUserSpec | None,
    bootstrap: str,
    ca: str = "",
) -> str | None:
    """SCRAM credentials of the user as the spec says; the Secret's name, or None without any."""
    mechanism = scram_mechanism(spec) if spec is not None else None
    image = await controller.metadata()
    held = {c.mechanism: c for c in image.scram_credentials if c.user == name}
    deletions = [(name, m) for m in held if m != mechanism]
    upsertions = []
    if mechanism is not None:
        password = await ensure_secret(kube, name, namespace, owner_uid, mechanism, bootstrap, ca)
        current = held.get(mechanism)
        if current is None or not password_matches(_credential(current), password):
            upsertions.append(_info(name, make_credential(mechanism, password)))
    if deletions or upsertions:
        await controller.alter_scram(deletions, upsertions)
        log.info("user User:%s: SCRAM %s stored, %s removed", name, mechanism if upsertions else "-", deletions)
    return name if mechanism is not None else None


def _certificate_problem(cluster: AutoMQClusterSpec) -> str | None:
    """Why a tls user of this cluster cannot get (or use) a client certificate, if it cannot."""
    if cluster.security.certificates.issuer != "operator":
        return (
            "authentication tls needs spec.security.certificates.issuer: operator on the cluster "
            "(client certificates come from its clients CA)"
        )
    if not any(listener.client_certificates() for listener in cluster.listeners):
        return "authentication tls needs a cluster listener with authentication type tls (and tls: true)"
    return None


def _condition(status: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": kopf_now(),
    }


def kopf_now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class _Cluster:
    controller: ControllerApi
    bootstrap: str
    spec: AutoMQClusterSpec
    ref: ClusterRef


async def _cluster_controller(ctx: Any, namespace: str, cluster: str) -> _Cluster | None:
    """The controller API of the user's AutoMQCluster, its bootstrap address and spec; None
    when the cluster does not exist."""
    live = await ctx.kube().get("AutoMQCluster", namespace, cluster)
    if live is None:
        return None
    meta = live.get("metadata", {})
    try:
        cluster_spec = parse_cluster(live)
    except InvalidSpec as exc:
        raise kopf.TemporaryError(f"AutoMQCluster {cluster} has an invalid spec: {exc}", delay=RETRY_DELAY_S) from exc
    ref = ClusterRef(name=cluster, namespace=namespace, uid=str(meta.get("uid", "")))
    factory = await security.authenticated(ctx.controller_api_factory, ctx.kube(), cluster_spec, ref)
    controller: ControllerApi = factory(builders.controller_urls(cluster_spec, ref))
    return _Cluster(controller, builders.bootstrap_address(cluster_spec, ref), cluster_spec, ref)


async def reconcile_user(
    spec: Any, name: str, namespace: str, meta: Any, patch: Any, memo: Any, logger: Any, **_: Any
) -> None:
    """kopf create / update / resume / timer handler of AutoMQUser."""
    ctx = memo.automq
    if not ctx.is_leader():
        raise kopf.TemporaryError("not the leading operator replica", delay=RETRY_DELAY_S)
    generation = meta.get("generation")
    try:
        parsed = parse_user_spec(dict(spec or {}))
    except InvalidUserSpec as exc:
        patch.status["observedGeneration"] = generation
        patch.status["conditions"] = [_condition("False", "InvalidSpec", str(exc))]
        raise kopf.PermanentError(f"invalid AutoMQUser spec: {exc}") from exc
    found = await _cluster_controller(ctx, namespace, parsed.cluster)
    if found is None:
        patch.status["conditions"] = [
            _condition("False", "ClusterNotFound", f"AutoMQCluster {parsed.cluster} does not exist in {namespace}")
        ]
        raise kopf.TemporaryError(f"AutoMQCluster {parsed.cluster} not found", delay=RETRY_DELAY_S)
    controller, bootstrap = found.controller, found.bootstrap
    uid = str(meta.get("uid", ""))
    expires = None
    try:
        ca = ""
        if found.spec.needs_tls():
            public = await ctx.kube().get("Secret", namespace, security.cluster_ca_cert_secret(found.ref))
            ca = base64.b64decode(((public or {}).get("data") or {}).get("ca.crt") or "").decode()
        if wants_certificate(parsed):
            problem = _certificate_problem(found.spec)
            if problem is not None:
                patch.status["conditions"] = [_condition("False", "NoClientCertificates", problem)]
                raise kopf.TemporaryError(problem, delay=RETRY_DELAY_S)
            expires = await ensure_certificate_secret(ctx.kube(), name, found.ref, uid, found.spec, bootstrap)
        secret = await sync_credentials(controller, ctx.kube(), name, namespace, uid, parsed, bootstrap, ca)
        if expires is not None:
            secret = name
        outcome = await sync_user(controller, name, parsed)
    except LookupError as exc:  # the clients CA is not made yet: the cluster's reconcile makes it
        patch.status["conditions"] = [_condition("False", "ClientsCaMissing", str(exc))]
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc
    except CredentialConflict as exc:
        patch.status["conditions"] = [_condition("False", "SecretConflict", str(exc))]
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc
    except ControllerApiError as exc:
        patch.status["conditions"] = [_condition("False", "ControllerUnavailable", str(exc))]
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc
    finally:
        await controller.close()
    patch.status["observedGeneration"] = generation
    patch.status["secret"] = secret
    patch.status["principal"] = principal_of(name)
    patch.status["acls"] = outcome.acls
    if expires is not None:
        patch.status["certificateNotAfter"] = expires
    patch.status["conditions"] = [
        _condition("True", "Synced", f"{outcome.acls} ACLs and {len(desired_quotas(parsed))} quotas in place")
    ]


async def delete_user(spec: Any, name: str, namespace: str, memo: Any, logger: Any, **_: Any) -> None:
    ctx = memo.automq
    if not ctx.is_leader():
        raise kopf.TemporaryError("not the leading operator replica", delay=RETRY_DELAY_S)
    cluster = (spec or {}).get("cluster")
    if not cluster:
        return  # never valid: nothing was created
    found = await _cluster_controller(ctx, namespace, str(cluster))
    if found is None:
        return  # the cluster (and its metadata) is gone
    controller = found.controller
    try:
        await sync_credentials(controller, ctx.kube(), name, namespace, "", None, "")  # the Secret goes with its owner
        await sync_user(controller, name, None)
    except ControllerApiError as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc
    finally:
        await controller.close()
