"""A thin asyncio client for the few Kubernetes API calls the reconciler makes, and `apply`.

Why not the `kubernetes` package's generated API classes: they are synchronous (a thread per
call) and need one method per kind; the reconciler needs five verbs over nine kinds. The
`kubernetes` package still resolves credentials (in-cluster service account, then KUBECONFIG),
so this client authenticates exactly as kopf and kubectl do.

Apply is "get, then create or JSON-merge-patch only when different" rather than server-side
apply: it works on every API server and on the kmock emulator the tests use (which has no
server-side apply). To remove fields the operator no longer wants (e.g. a dropped annotation),
each object carries what the operator last applied (annotation `automq.io/last-applied`) and the
merge patch sets those fields to null, as `kubectl apply` does.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import ssl
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from automq.operator.builders import LAST_APPLIED
from automq.operator.quantity import QUANTITY_MAPS, same_quantity
from automq.operator.spec import GROUP, PLURAL, VERSION


@dataclass(frozen=True, slots=True)
class Kind:
    api_version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        # Cluster-scoped kinds (Node, VolumeAttachment) ignore the namespace.
        path = f"{base}/namespaces/{namespace}/{self.plural}" if self.namespaced else f"{base}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
        return path


KINDS: dict[str, Kind] = {
    "ConfigMap": Kind("v1", "configmaps"),
    "Secret": Kind("v1", "secrets"),
    "Service": Kind("v1", "services"),
    "ServiceAccount": Kind("v1", "serviceaccounts"),
    "Pod": Kind("v1", "pods"),
    "PersistentVolumeClaim": Kind("v1", "persistentvolumeclaims"),
    "Event": Kind("v1", "events"),
    "StatefulSet": Kind("apps/v1", "statefulsets"),
    "PodDisruptionBudget": Kind("policy/v1", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": Kind("autoscaling/v2", "horizontalpodautoscalers"),
    "Role": Kind("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "rolebindings"),
    "AutoMQCluster": Kind(f"{GROUP}/{VERSION}", PLURAL),
    "AutoMQUser": Kind(f"{GROUP}/{VERSION}", "automqusers"),
    # Node loss (automq.operator.nodeloss).
    "Job": Kind("batch/v1", "jobs"),
    "CronJob": Kind("batch/v1", "cronjobs"),  # the Spark jobs (automq.operator.sparkjobs)
    "Node": Kind("v1", "nodes", namespaced=False),
    "VolumeAttachment": Kind("storage.k8s.io/v1", "volumeattachments", namespaced=False),
    # Leader election between operator replicas (automq.operator.leadership).
    "Lease": Kind("coordination.k8s.io/v1", "leases"),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies"),
    "Certificate": Kind("cert-manager.io/v1", "certificates"),  # spec.security.certificates.issuer: cert-manager
    "Issuer": Kind("cert-manager.io/v1", "issuers"),
}


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status, the message is the server's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubeApi:
    """The API server at `host`, authenticated with a bearer token and/or client certificate."""

    def __init__(
        self,
        host: str,
        *,
        headers: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | bool = True,
        token_refresh: Any = None,
    ) -> None:
        self.host = host.rstrip("/")
        self._headers = headers or {}
        self._ssl = ssl_context
        self._token_refresh = token_refresh  # the kubernetes Configuration, re-read before calls
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_environment(cls) -> KubeApi:
        """In-cluster service account first, then KUBECONFIG / ~/.kube/config."""
        from kubernetes import client, config

        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            # KUBECONFIG read now, not when `kubernetes` was imported (its default is fixed then).
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=cfg)
        return cls.from_configuration(cfg)

    @classmethod
    def from_configuration(cls, cfg: Any) -> KubeApi:
        context: ssl.SSLContext | bool = True
        if cfg.host.startswith("https"):
            if not cfg.verify_ssl:
                context = False
            else:
                context = (
                    ssl.create_default_context(cafile=cfg.ssl_ca_cert)
                    if cfg.ssl_ca_cert
                    else ssl.create_default_context()
                )
                if cfg.cert_file:
                    context.load_cert_chain(cfg.cert_file, cfg.key_file)
        return cls(cfg.host, ssl_context=context, token_refresh=cfg)

    def _auth_headers(self) -> dict[str, str]:
        cfg = self._token_refresh
        if cfg is None:
            return {}
        if cfg.refresh_api_key_hook is not None:
            cfg.refresh_api_key_hook(cfg)  # in-cluster tokens rotate
        token = cfg.get_api_key_with_prefix("authorization")
        return {"Authorization": token} if token else {}

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        headers = {**self._headers, **self._auth_headers(), "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        async with self._session.request(
            method, self.host + path, data=data, headers=headers, params=params, ssl=self._ssl
        ) as resp:
            text = await resp.text()
            if resp.status >= 400:
                try:
                    message = json.loads(text).get("message", text)
                except ValueError:
                    message = text
                raise KubeError(resp.status, message)
            return json.loads(text) if text else None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- verbs ---------------------------------------------------------------------------------

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._request("GET", KINDS[kind].path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, kind: str, namespace: str, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Objects of a kind whose labels include `labels` (filtered here too: not every server filters)."""
        params = {"labelSelector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))} if labels else None
        result = await self._request("GET", KINDS[kind].path(namespace), params=params)
        items = result.get("items", []) if result else []
        wanted = labels or {}
        return [
            o for o in items if all((o.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return await self._request("POST", KINDS[obj["kind"]].path(meta.get("namespace", "")), obj)

    async def patch(
        self, kind: str, namespace: str, name: str, patch: dict[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        return await self._request(
            "PATCH", KINDS[kind].path(namespace, name, subresource), patch, "application/merge-patch+json"
        )

    async def delete(self, kind: str, namespace: str, name: str, *, grace_period_s: int | None = None) -> bool:
        """Delete; False when it was already gone. `grace_period_s=0` force-deletes a pod (its
        kubelet is unreachable and would never confirm a graceful stop)."""
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        try:
            await self._request("DELETE", KINDS[kind].path(namespace, name), options)
            return True
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise


# ---------------------------------------------------------------------------------------------
# Apply


def contains(live: Any, desired: Any, *, quantities: bool = False) -> bool:
    """Whether `live` already says everything `desired` says (the server may add defaults).

    Values of resource maps (`requests`, `limits`, ...) are compared as quantities: the server
    stores them canonicalised (`1024Mi` reads back as `1Gi`)."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            k in live and contains(live[k], v, quantities=quantities or k in QUANTITY_MAPS) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(contains(a, b) for a, b in zip(live, desired, strict=False))
        )
    if quantities:
        return same_quantity(live, desired)
    return live == desired


def merge_patch(last_applied: Any, desired: Any) -> Any:
    """A JSON merge patch from what we applied before to what we want: removed keys become null."""
    if not isinstance(desired, dict) or not isinstance(last_applied, dict):
        return copy.deepcopy(desired)
    patch: dict[str, Any] = {key: None for key in last_applied if key not in desired}
    for key, value in desired.items():
        patch[key] = merge_patch(last_applied.get(key), value) if isinstance(value, dict) else copy.deepcopy(value)
    return patch


def _with_last_applied(desired: dict[str, Any]) -> tuple[dict[str, Any], str]:
    record = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    body = copy.deepcopy(desired)
    body["metadata"].setdefault("annotations", {})[LAST_APPLIED] = record
    return body, record


ApplyResult = Literal["created", "patched", "unchanged"]

# Fields the API server refuses to change after creation. They are set at create time only and
# left out of patches: the server adds defaults inside them (e.g. a claim template's volumeMode
# and status), so even re-sending "the same" value can read as a change. A wanted change to one
# of them is the caller's to detect and report (see reconcile's WAL check).
IMMUTABLE_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "StatefulSet": (
        ("spec", "volumeClaimTemplates"),
        ("spec", "selector"),
        ("spec", "serviceName"),
        ("spec", "podManagementPolicy"),
    ),
    "Service": (("spec", "clusterIP"),),
    "RoleBinding": (("roleRef",),),
}


def without_immutable(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    for path in IMMUTABLE_FIELDS.get(kind, ()):
        node: Any = out
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


async def apply(api: KubeApi, desired: dict[str, Any]) -> tuple[ApplyResult, dict[str, Any]]:
    """Make the object match `desired`; touch the API only when something differs."""
    meta = desired["metadata"]
    body, record = _with_last_applied(desired)
    live = await api.get(desired["kind"], meta["namespace"], meta["name"])
    if live is None:
        try:
            return "created", await api.create(body)
        except KubeError as exc:
            if exc.status != 409:  # created meanwhile (another reconcile, a restart): patch it
                raise
            live = await api.get(desired["kind"], meta["namespace"], meta["name"]) or {}
    annotations = live.get("metadata", {}).get("annotations") or {}
    mutable = without_immutable(desired["kind"], body)
    if annotations.get(LAST_APPLIED) == record and contains(live, mutable):
        return "unchanged", live
    try:
        last = json.loads(annotations.get(LAST_APPLIED) or "{}")
    except ValueError:
        last = {}
    patch = merge_patch(without_immutable(desired["kind"], last), mutable)
    return "patched", await api.patch(desired["kind"], meta["namespace"], meta["name"], patch)


async def wait_until(predicate: Any, timeout: float, interval: float) -> bool:
    """Poll an async predicate until it is true or `timeout` seconds passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if await predicate():
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(interval)
