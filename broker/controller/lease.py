"""A Kubernetes `coordination.k8s.io/v1` Lease as the gate of controller leadership
(`controller.leadership: lease`).

Only the Lease holder *tries* to become (or stay) the active controller; safety still comes
from the metadata log's conditional writes (`log.py`), so a holder that lost its Lease without
noticing can never corrupt anything: its next log write fails. The Lease rules follow
client-go's leader election: a Lease is free when it has no holder, or when its
(holder, renewTime) did not change for `leaseDurationSeconds` *as observed by this process's
monotonic clock* (no trust in other nodes' clocks). Writes carry the resourceVersion read, so
the API server refuses (409) a second writer that read the same version.

The kubernetes client is synchronous: every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from automq.broker.config import NodeConfig

log = logging.getLogger(__name__)

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubernetesLease:
    def __init__(self, api: Any, name: str, namespace: str, identity: str, duration_s: int) -> None:
        self.api = api  # kubernetes.client.CoordinationV1Api
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.duration_s = max(1, duration_s)
        self._observed: tuple[Any, Any] | None = None
        self._observed_at = 0.0

    @classmethod
    def from_config(cls, config: NodeConfig) -> KubernetesLease:
        from kubernetes import client
        from kubernetes import config as kube_config

        try:
            kube_config.load_incluster_config()
        except kube_config.ConfigException:
            kube_config.load_kube_config()
        namespace = config.controller.lease_namespace
        if namespace is None:
            namespace = _SA_NAMESPACE.read_text().strip() if _SA_NAMESPACE.exists() else "default"
        return cls(
            client.CoordinationV1Api(),
            config.controller.lease_name,
            namespace,
            # one identity per process: a controller restarted under the same host name (a
            # StatefulSet pod recreated elsewhere) does not take its dead predecessor's Lease as
            # its own, and a frozen predecessor that comes back does not share the new one's.
            # The node id stays last: the operator finds a pod's controller by it.
            f"{socket.gethostname()}-{secrets.token_hex(4)}-controller-{config.node_id}",
            math.ceil(config.controller.lease_timeout_ms / 1000),
        )

    async def try_acquire(self) -> bool:
        """Take or renew the Lease; True while this process holds it."""
        try:
            return await asyncio.to_thread(self._acquire)
        except Exception as exc:
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    async def release(self) -> None:
        """Give the Lease up (graceful shutdown) so a standby need not wait for it to expire."""
        try:
            await asyncio.to_thread(self._release)
        except Exception as exc:
            log.warning("lease %s/%s: release failed: %s", self.namespace, self.name, exc)

    # ------------------------------------------------------------------ blocking parts

    def _read(self):
        from kubernetes.client.exceptions import ApiException

        try:
            return self.api.read_namespaced_lease(name=self.name, namespace=self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _acquire(self) -> bool:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        lease = self._read()
        now = _now_micro()
        if lease is None:
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=client.V1LeaseSpec(
                    holder_identity=self.identity,
                    lease_duration_seconds=self.duration_s,
                    acquire_time=now,
                    renew_time=now,
                    lease_transitions=0,
                ),
            )
            try:
                self.api.create_namespaced_lease(namespace=self.namespace, body=body)
            except ApiException as exc:
                if exc.status == 409:  # another controller created it first
                    return False
                raise
            return True
        spec = lease.spec
        holder = spec.holder_identity or ""
        observed = (holder, str(spec.renew_time))
        if observed != self._observed:
            self._observed, self._observed_at = observed, time.monotonic()
        duration = spec.lease_duration_seconds or self.duration_s
        expired = time.monotonic() - self._observed_at > duration
        if holder and holder != self.identity and not expired:
            return False
        patch: dict[str, Any] = {
            "spec": {"holderIdentity": self.identity, "renewTime": now, "leaseDurationSeconds": self.duration_s}
        }
        if holder != self.identity:
            patch["spec"]["acquireTime"] = now
            patch["spec"]["leaseTransitions"] = (spec.lease_transitions or 0) + 1
        if lease.metadata.resource_version:
            patch["metadata"] = {"resourceVersion": lease.metadata.resource_version}  # 409 if it changed
        try:
            self.api.patch_namespaced_lease(name=self.name, namespace=self.namespace, body=patch)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        if holder != self.identity:
            log.info("lease %s/%s acquired by %s (was %r)", self.namespace, self.name, self.identity, holder)
        return True

    def _release(self) -> None:
        lease = self._read()
        if lease is None or lease.spec.holder_identity != self.identity:
            return
        patch: dict[str, Any] = {"spec": {"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": _now_micro()}}
        if lease.metadata.resource_version:
            patch["metadata"] = {"resourceVersion": lease.metadata.resource_version}
        self.api.patch_namespaced_lease(name=self.name, namespace=self.namespace, body=patch)
