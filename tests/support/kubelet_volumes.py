"""Persistent volumes for the kubelet harness: claims, volumes and attachments, with the
ReadWriteOnce rule that makes node loss hard.

What Kubernetes controllers do and kmock does not, played here:
  - StatefulSet controller: a PersistentVolumeClaim `<template>-<pod>` per volumeClaimTemplate
    (labels from the template; kept on scale-in, as `whenScaled: Retain` asks), and the pod's
    volume referring to it;
  - PV controller: a PersistentVolume `pv-<namespace>-<claim>` bound to it (claim Bound,
    spec.volumeName); its data is a directory `<root>/volumes/<claim>` on this host;
  - attach/detach controller: a VolumeAttachment (`spec.nodeName`, `spec.source.persistentVolumeName`,
    `status.attached`) when a pod using the claim starts on a node, deleted when that pod is gone
    from a Ready node.
The rule: a volume attached to a NotReady node cannot be attached elsewhere ("Multi-Attach error",
the pod waits in ContainerCreating) until its VolumeAttachment is deleted (what the operator does
for `forceDetach`) or the node carries the `node.kubernetes.io/out-of-service` taint (then it is
detached at once, as Kubernetes' non-graceful node shutdown does), unless the harness was made
with `multi_attach=True` (a storage class that allows a second attachment, e.g. io2). Kubernetes'
own 6-minute force detach is not played.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

ATTACHER = "harness.kubelet.automq.test"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


class Volumes:
    def __init__(self, api: Any, namespace: str, root: Path, *, multi_attach: bool = False) -> None:
        self.api = api  # automq.operator.kube.KubeApi on kmock
        self.namespace = namespace
        self.root = root
        self.multi_attach = multi_attach

    def host_dir(self, claim: str) -> Path:
        path = self.root / "volumes" / claim
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def pv_name(namespace: str, claim: str) -> str:
        return f"pv-{namespace}-{claim}"

    async def ensure_claims(self, sts: dict[str, Any], pod_name: str) -> list[dict[str, Any]]:
        """The claims of a StatefulSet pod (created and bound if missing); returns the pod volumes."""
        volumes = []
        for template in sts["spec"].get("volumeClaimTemplates") or []:
            claim = f"{template['metadata']['name']}-{pod_name}"
            pv = self.pv_name(self.namespace, claim)
            if await self.api.get("PersistentVolumeClaim", self.namespace, claim) is None:
                await self.api.create(
                    {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "metadata": {
                            "name": claim,
                            "namespace": self.namespace,
                            "uid": str(uuid.uuid4()),
                            "labels": dict(template["metadata"].get("labels") or {}),
                        },
                        "spec": {**template["spec"], "volumeName": pv},
                        "status": {"phase": "Bound", "accessModes": template["spec"].get("accessModes", [])},
                    }
                )
            if await request_or_none(self.api, "GET", f"/api/v1/persistentvolumes/{pv}") is None:
                await self.api._request(
                    "POST",
                    "/api/v1/persistentvolumes",
                    {
                        "apiVersion": "v1",
                        "kind": "PersistentVolume",
                        "metadata": {"name": pv, "uid": str(uuid.uuid4())},
                        "spec": {
                            "accessModes": template["spec"].get("accessModes", ["ReadWriteOnce"]),
                            "capacity": {"storage": template["spec"]["resources"]["requests"]["storage"]},
                            "claimRef": {"namespace": self.namespace, "name": claim},
                            "hostPath": {"path": str(self.host_dir(claim))},
                        },
                        "status": {"phase": "Bound"},
                    },
                )
            volumes.append({"name": template["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
        return volumes

    @staticmethod
    def claims_of(pod: dict[str, Any]) -> list[str]:
        return [
            v["persistentVolumeClaim"]["claimName"]
            for v in pod["spec"].get("volumes") or []
            if v.get("persistentVolumeClaim")
        ]

    async def _attachments(self, pv: str) -> list[dict[str, Any]]:
        result = await self.api._request("GET", "/apis/storage.k8s.io/v1/volumeattachments")
        return [
            a
            for a in (result or {}).get("items") or []
            if ((a.get("spec") or {}).get("source") or {}).get("persistentVolumeName") == pv
        ]

    async def attach(self, claim: str, node: str, node_ready: Any, pod_running_on: Any) -> str | None:
        """Attach the claim's volume to `node`; None when attached, else why it cannot be yet.
        `node_ready(name)` and `pod_running_on(claim, node)` are the harness's views."""
        pv = self.pv_name(self.namespace, claim)
        for attachment in await self._attachments(pv):
            other = attachment["spec"]["nodeName"]
            if other == node:
                return None
            node_obj = await request_or_none(self.api, "GET", f"/api/v1/nodes/{other}")
            taints = ((node_obj or {}).get("spec") or {}).get("taints") or []
            released = (node_ready(other) and not pod_running_on(claim, other)) or any(
                t.get("key") == OUT_OF_SERVICE for t in taints
            )
            if released:
                await self._delete(attachment["metadata"]["name"])
            elif not self.multi_attach:
                return (
                    f"Multi-Attach error for volume {pv!r}: Volume is already exclusively attached to one "
                    f"node ({other}) and can't be attached to another"
                )
        name = "csi-" + hashlib.sha256(f"{pv}/{node}".encode()).hexdigest()[:32]
        await self.api._request(
            "POST",
            "/apis/storage.k8s.io/v1/volumeattachments",
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "VolumeAttachment",
                "metadata": {"name": name, "uid": str(uuid.uuid4())},
                "spec": {"attacher": ATTACHER, "nodeName": node, "source": {"persistentVolumeName": pv}},
                "status": {"attached": True},
            },
        )
        return None

    async def detach(self, claim: str, node: str) -> None:
        """The pod using the claim on `node` is gone (from a Ready node): detach."""
        for attachment in await self._attachments(self.pv_name(self.namespace, claim)):
            if attachment["spec"]["nodeName"] == node:
                await self._delete(attachment["metadata"]["name"])

    async def _delete(self, name: str) -> None:
        await request_or_none(self.api, "DELETE", f"/apis/storage.k8s.io/v1/volumeattachments/{name}")


async def request_or_none(api: Any, method: str, path: str, body: Any = None) -> Any:
    """`api._request`, with 404 as None."""
    from automq.operator.kube import KubeError

    try:
        return await api._request(method, path, body)
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise
