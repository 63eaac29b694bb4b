"""kmock's Kubernetes emulator with the gaps the operator tests and the kubelet harness need filled.

`ScalingEmulator`: the scale subresource of AutoMQCluster (following the CRD's declared paths),
constant-time request matching, 404 answers for missing objects, names for `generateName`, and a
new resourceVersion on every write.

`KubeletEmulator` (for `kubelet_harness`): additionally, a force delete of a Pod
(`gracePeriodSeconds: 0`, in the query or the DeleteOptions body) removes it at once even while
the harness's kubelet finalizer holds it, as the API server does for `kubectl delete --force
--grace-period=0`; a normal delete only marks it (deletionTimestamp) until the kubelet confirms the
process stopped.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import aiohttp.web
import jsonpatch
import kmock
import yaml
from kubernetes.config import kube_config

from automq.operator.crd import build_crd
from automq.operator.spec import GROUP, PLURAL, VERSION

SCALE = build_crd()["spec"]["versions"][0]["subresources"]["scale"]


def _get_path(obj: dict[str, Any], path: str) -> Any:
    for part in path.strip(".").split("."):
        obj = (obj or {}).get(part)  # type: ignore[assignment]
    return obj


def _set_path(path: str, value: Any) -> dict[str, Any]:
    patch: dict[str, Any] = value
    for part in reversed(path.strip(".").split(".")):
        patch = {part: patch}
    return patch


class ScalingEmulator(kmock.KubernetesEmulator):
    """kmock plus the scale subresource of AutoMQCluster (following the CRD's declared paths),
    constant-time request matching, proper 404 answers for missing objects, names for objects created with generateName, and a new
    resourceVersion on every write."""

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # kmock matches every request against its whole request history (to support assertions
        # over past requests, which these tests do not use): keep only the current one, or each
        # request gets slower than the last.
        del self._requests[:-1]
        resource = request.resource
        meta = request.data.get("metadata") if isinstance(request.data, dict) else None
        if (
            request.action == kmock.action.CREATE
            and meta is not None
            and not meta.get("name")
            and meta.get("generateName")
        ):
            # kmock 0.8 ignores generateName; kopf names its Events that way.
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:10]
        stale = await self._stale_write(request)
        if stale is not None:
            return stale
        if request.action in (kmock.action.CREATE, kmock.action.UPDATE) and request.data is not None:
            # kmock 0.8 keeps resourceVersion as given; kopf tells fresh watch events from stale
            # ones by it, so every write gets a new one, as on a real API server.
            self._versions = getattr(self, "_versions", 1) + 1
            version = str(self._versions)
            if isinstance(request.data, list):
                request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
            elif isinstance(request.data, dict):
                request.data.setdefault("metadata", {})
                if request.data["metadata"] is not None:
                    request.data["metadata"]["resourceVersion"] = version
        if resource is not None and resource.plural == PLURAL and request.subresource == "scale" and request.name:
            key = (resource, request.namespace, request.name)
            async with self._lock:
                if key not in self._objects or self._objects[key].deleted:
                    return aiohttp.web.json_response(
                        {"kind": "Status", "code": 404, "message": "not found"}, status=404
                    )
                if request.method == "PATCH":
                    self._objects[key].patch(_set_path(SCALE["specReplicasPath"], request.data["spec"]["replicas"]))
                    self._objects[key].patch({"metadata": request.data["metadata"]})
                    await self._buses[resource].put({"type": "MODIFIED", "object": self._objects[key].raw})
                obj = self._objects[key].raw
            return aiohttp.web.json_response(
                {
                    "apiVersion": "autoscaling/v1",
                    "kind": "Scale",
                    "metadata": {"name": request.name, "namespace": request.namespace},
                    "spec": {"replicas": _get_path(obj, SCALE["specReplicasPath"])},
                    "status": {
                        "replicas": _get_path(obj, SCALE["statusReplicasPath"]) or 0,
                        "selector": _get_path(obj, SCALE["labelSelectorPath"]) or "",
                    },
                }
            )
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:
            # A stale resourceVersion in kopf's optimistic JSON patch: 422, as the API answers.
            return aiohttp.web.json_response(
                {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 422, "message": str(exc)},
                status=422,
            )
        except kmock.KubernetesError as exc:
            # kmock 0.8 lets a missing object's 404 escape as an HTTP 500; answer as the API does.
            return aiohttp.web.json_response(
                {
                    "apiVersion": "v1",
                    "kind": "Status",
                    "status": "Failure",
                    "code": exc.status,
                    "reason": exc.reason,
                    "message": exc.message,
                },
                status=exc.status,
            )

    async def _stale_write(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        """Optimistic concurrency, as the API server does it: a write whose body carries a
        `metadata.resourceVersion` other than the object's current one is refused with 409
        Conflict (kmock 0.8 ignores it). Writes without one are unconditional, as on a server."""
        resource = request.resource
        data = request.data
        if (
            request.action != kmock.action.UPDATE
            or resource is None
            or not request.name
            or request.subresource
            or not isinstance(data, dict)
            or not isinstance(data.get("metadata"), dict)
            or not data["metadata"].get("resourceVersion")
        ):
            return None
        key = (resource, request.namespace, request.name)
        async with self._lock:
            current = self._objects[key].raw if key in self._objects and not self._objects[key].deleted else None
        if current is None:
            return None  # the usual 404
        have = (current.get("metadata") or {}).get("resourceVersion")
        if have == data["metadata"]["resourceVersion"]:
            return None
        message = (
            f'Operation cannot be fulfilled on {resource.plural} "{request.name}": the object has been '
            "modified; please apply your changes to the latest version and try again"
        )
        return aiohttp.web.json_response(
            {
                "apiVersion": "v1",
                "kind": "Status",
                "status": "Failure",
                "reason": "Conflict",
                "code": 409,
                "message": message,
            },
            status=409,
        )


KUBELET_FINALIZER = "kubelet.automq.test/terminating"


class KubeletEmulator(ScalingEmulator):
    """ScalingEmulator plus graceful Pod deletion as the kubelet harness plays it (see module doc)."""

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if (
            request.action == kmock.action.DELETE
            and resource is not None
            and resource.plural == "pods"
            and request.name
            and _grace_period(request) == 0
        ):
            key = (resource, request.namespace, request.name)
            async with self._lock:
                obj = self._objects[key] if key in self._objects else None  # noqa: SIM401 (no .get)
                if obj is not None and not obj.deleted:
                    finalizers = [f for f in obj.get("metadata", {}).get("finalizers") or [] if f != KUBELET_FINALIZER]
                    obj.patch({"metadata": {"finalizers": finalizers or None}})
        return await super()._handle(request)


def _grace_period(request: kmock.Request) -> int | None:
    value: Any = request.params.get("gracePeriodSeconds")
    if value is None and isinstance(request.data, dict):
        value = request.data.get("gracePeriodSeconds")
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def install_cluster_crd(emulator: kmock.KubernetesEmulator) -> None:
    """Kubernetes' bundled kinds plus AutoMQCluster as its CRD declares it (namespaced, status and
    scale subresources) and AutoMQUser, as an API server knows them once the chart's CRDs are installed."""
    emulator.resources.load_bundled()
    info = emulator.resources[f"{GROUP}/{VERSION}/{PLURAL}"]
    info.kind = "AutoMQCluster"
    info.namespaced = True
    info.verbs = {"get", "list", "watch", "create", "patch", "update", "delete"}
    info.subresources = {"status", "scale"}
    users = emulator.resources[f"{GROUP}/{VERSION}/automqusers"]
    users.kind = "AutoMQUser"
    users.namespaced = True
    users.verbs = {"get", "list", "watch", "create", "patch", "update", "delete"}
    users.subresources = {"status"}


class KubeconfigSwap:
    """Writes a kubeconfig for kmock at `path` and makes it the one every client in this process
    uses: KUBECONFIG, and the kubernetes client's default location (kopf logs in through that
    client, which read KUBECONFIG when it was imported, long before a test starts).
    `restore()` puts both back."""

    def __init__(self, path: Path, url: str, namespace: str) -> None:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                    "users": [{"name": "test", "user": {"token": "test-token"}}],
                    "contexts": [
                        {"name": "kmock", "context": {"cluster": "kmock", "user": "test", "namespace": namespace}}
                    ],
                    "current-context": "kmock",
                }
            )
        )
        self.path = path
        self._old_env = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = str(path)
        self._old_default = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(path)

    def restore(self) -> None:
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = self._old_default
        if self._old_env is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = self._old_env
