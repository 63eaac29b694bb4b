"""Node loss: a broker whose Kubernetes node died is fenced, freed and its WAL recovered elsewhere.

When a node stops (power, kernel, network), its pods stay "Terminating" forever (the kubelet
that would confirm the stop is gone) and a ReadWriteOnce WAL volume stays attached to it, so
the StatefulSet never replaces the broker and its partitions stay offline. Per broker, one
`recover_step` at a time, in this order:

    lost      the pod's node is NotReady/Unknown (since its Ready condition's
              lastTransitionTime) or gone, for longer than spec.broker.nodeLossGracePeriod,
              AND the controller agrees the broker is silent (fenced, or no heartbeat for half
              its session). One signal alone never fences a live broker.
    fenced    the controller fences the broker (its epoch is refused from now on, a zombie
              can append nothing more; the controller opens a WAL recovery job) BEFORE
              anything releases its volume.
    podReleased   the stuck pod is force-deleted (grace 0): the StatefulSet makes a new one.
    volumeReleased / jobCreated / (S3 WAL: nothing to release)
              forceDetach: the node gets the `node.kubernetes.io/out-of-service` taint
              (Kubernetes detaches its volumes) or, with outOfServiceTaint false or the Node
              gone, the WAL volume's VolumeAttachment is deleted; the new pod attaches the
              volume on a healthy node and recovers its own WAL on start.
              multiAttach: a Job pinned away from the lost node mounts the broker's WAL claim
              and runs `automq wal recover`, which hands the partitions to live brokers
              without waiting for the new pod.
    recovered the controller holds no recovery job for the broker any more.
    served    no partition is without a leader.
    (cleared) the replacement pod is Ready: the record goes, Degraded clears.

Controllers on a lost node hold no data (the metadata is a log of objects in the object store)
and the active one holds a Lease, so losing one only costs a standby, or a Lease takeover. What
is left is the pod stuck Terminating on the dead node, which keeps its StatefulSet from making a
replacement: after the same grace, a controller pod on a lost node is force-deleted, unless its
controller still renewed the controller Lease after the node went NotReady (then it is alive,
only its kubelet is unreachable: `FencingBlocked`). Force-deleting it never costs a live
controller: a zombie that kept running cannot write the metadata log past the live leader (its
writes are conditional). Degraded `ControllerNodeLost` says how many controllers are Ready (none:
the metadata, and so every new partition leader, waits for the replacement) until the
replacement pod is Ready. Progress: the `automq.io/controller-node-loss` annotation.

Progress is the `automq.io/node-loss` annotation on the AutoMQCluster (JSON, per broker
ordinal), written after every step, so an operator restart resumes where it stopped. Every
step is idempotent (fencing twice, deleting what is gone, a Job with a fixed name), so even
two operators acting at once do each thing once. A node that comes back within the grace
triggers nothing: nothing is written before the grace is over.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Histogram

from automq.operator import builders
from automq.operator.builders import ClusterRef
from automq.operator.controller_api import ControllerApi, ControllerApiError
from automq.operator.kube import KubeApi, KubeError
from automq.operator.spec import GROUP, AutoMQClusterSpec

log = logging.getLogger(__name__)

ANNOTATION = f"{GROUP}/node-loss"
CONTROLLER_ANNOTATION = f"{GROUP}/controller-node-loss"
OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
STEPS = ("fenced", "podReleased", "volumeReleased", "recovered", "served")

RECOVERIES = Counter(
    "automq_operator_node_loss_recoveries_total",
    "Brokers recovered after their node was lost, by WAL failover strategy",
    ["strategy"],
)
RECOVERY_SECONDS = Histogram(
    "automq_operator_node_loss_recovery_seconds",
    "Seconds from a lost node's NotReady transition to every partition served again (grace included)",
    ["strategy"],
    buckets=(5, 10, 20, 30, 45, 60, 90, 120, 300, 600),
)


class Reporter:  # the shape of reconcile.Reporter (not imported: reconcile imports nothing from here)
    def info(self, reason: str, message: str) -> None: ...

    def warn(self, reason: str, message: str) -> None: ...


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _pod_ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def node_lost_since(node: dict[str, Any] | None) -> dt.datetime | None:
    """When the node stopped being Ready (None while it is Ready). A Node without a Ready
    condition yet has just registered: not lost."""
    if node is None:
        return None
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return None
            return _parse(condition.get("lastTransitionTime")) or _now()
    return None


def strategy(spec: AutoMQClusterSpec) -> str:
    return "s3" if spec.broker.wal.kind == "s3" else spec.broker.wal.failover


def wal_claim_name(ref: ClusterRef, ordinal: int) -> str:
    return builders.wal_claim_names(ref, range(ordinal, ordinal + 1))[0]


def recovery_job_name(ref: ClusterRef, ordinal: int) -> str:
    return f"{builders.statefulset_name(ref, 'broker')}-{ordinal}-wal-recovery"


def recovery_job(
    spec: AutoMQClusterSpec, ref: ClusterRef, ordinal: int, lost_node: str, fenced_epoch: int = -1
) -> dict[str, Any]:
    """The multiAttach WAL-recovery Job: `automq wal recover` on the lost broker's WAL claim,
    never scheduled on the lost node."""
    template = builders.pod_template(spec, ref, "broker")["spec"]
    broker = template["containers"][0]
    labels = {**builders.common_labels(ref), "app.kubernetes.io/component": "wal-recovery"}
    args = ["wal", "recover", "--wal", f"{builders.WAL_DIR}/wal", "--node-id", str(builders.broker_node_id(ordinal))]
    args += ["--object-store", spec.object_store.url()]
    if fenced_epoch >= 0:
        # The replacement pod may get the volume first (multi-attach) and recover it itself.
        args += ["--fenced-epoch", str(fenced_epoch)]
    for url in builders.controller_urls(spec, ref):
        args += ["--controller", url]
    away = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [lost_node]}]}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": template["serviceAccountName"],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": template["securityContext"],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [away]}}},
        "containers": [
            {
                "name": "wal-recovery",
                "image": broker["image"],
                "imagePullPolicy": broker["imagePullPolicy"],
                "args": args,
                # the AWS keys, and what the controller API needs (token, the controllers' CA)
                "env": [
                    *(e for e in broker["env"] if e["name"].startswith("AWS_")),
                    *builders.controller_client_env(spec),
                ],
                "volumeMounts": [
                    {"name": "wal", "mountPath": builders.WAL_DIR},
                    {"name": "tmp", "mountPath": "/tmp"},
                    *builders.controller_client_mounts(spec),
                ],
                "securityContext": broker["securityContext"],
                "resources": broker.get("resources", {}),
            }
        ],
        "volumes": [
            {"name": "wal", "persistentVolumeClaim": {"claimName": wal_claim_name(ref, ordinal)}},
            {"name": "tmp", "emptyDir": {}},
            *builders.controller_client_volumes(spec, ref),
        ],
    }
    for key in ("nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets"):
        if key in template:
            pod_spec[key] = template[key]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": recovery_job_name(ref, ordinal),
            "namespace": ref.namespace,
            "labels": labels,
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": {
            "backoffLimit": 6,
            "ttlSecondsAfterFinished": 3600,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


@dataclass
class NodeLossSettings:
    interval_s: float = 2.0  # between checks when nothing wakes the loop


@dataclass
class NodeLossPass:
    """One look at one cluster's brokers, acting on what is lost; what one pass shares."""

    api: KubeApi
    ref: ClusterRef
    spec: AutoMQClusterSpec
    reporter: Reporter
    controller_api_factory: Callable[..., ControllerApi]
    # In-memory only, kept across passes by the caller: when a vanished Node was first missed
    # (a deleted Node has no Ready transition time) and which warnings were already posted.
    missing_since: dict[str, dt.datetime] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    now: Callable[[], dt.datetime] = _now
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    controller_records: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Whether this operator replica may write (leader election); checked before every step.
    may_act: Callable[[], bool] = lambda: True
    # Seconds until the earliest grace period seen in this pass ends (None: none running), so
    # the daemon looks again right then instead of up to an interval later.
    wake_in_s: float | None = None
    _controller: ControllerApi | None = None

    def controller(self) -> ControllerApi:
        if self._controller is None:
            self._controller = self.controller_api_factory(builders.controller_urls(self.spec, self.ref))
        return self._controller

    async def close(self) -> None:
        if self._controller is not None:
            await self._controller.close()
            self._controller = None

    async def _save_controllers(self) -> None:
        value = json.dumps(self.controller_records, sort_keys=True) if self.controller_records else None
        await self.api.patch(
            "AutoMQCluster",
            self.ref.namespace,
            self.ref.name,
            {"metadata": {"annotations": {CONTROLLER_ANNOTATION: value}}},
        )

    async def _save(self) -> None:
        value = json.dumps(self.records, sort_keys=True) if self.records else None
        await self.api.patch(
            "AutoMQCluster", self.ref.namespace, self.ref.name, {"metadata": {"annotations": {ANNOTATION: value}}}
        )

    async def run(self) -> bool:
        """One pass; True while a recovery is in progress (the caller checks again soon)."""
        live = await self.api.get("AutoMQCluster", self.ref.namespace, self.ref.name)
        if live is None or live.get("metadata", {}).get("deletionTimestamp"):
            return False
        self.records = read_records(live)
        prefix = builders.statefulset_name(self.ref, "broker") + "-"
        pods = {
            int(p["metadata"]["name"][len(prefix) :]): p
            for p in await self.api.list("Pod", self.ref.namespace, builders.selector_labels(self.ref, "broker"))
            if p["metadata"]["name"].startswith(prefix) and p["metadata"]["name"][len(prefix) :].isdigit()
        }
        try:
            for ordinal, pod in sorted(pods.items()):
                if str(ordinal) not in self.records:
                    await self._detect(ordinal, pod)
            for key in sorted(self.records, key=int):
                await self._advance(int(key), pods.get(int(key)))
            self.controller_records = read_records(live, CONTROLLER_ANNOTATION)
            await self._controllers()
        finally:
            await self.close()
        return bool(self.records) or bool(self.controller_records)

    # -- detection -------------------------------------------------------------------------

    async def _lost_past_grace(
        self, pod: dict[str, Any], blocked_key: str
    ) -> tuple[str, dict[str, Any] | None, dt.datetime] | None:
        """(node name, Node or None when gone, lost since) when the pod's node has been lost for
        longer than the grace; None otherwise (and the wake-up time noted while in the grace)."""
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            return None  # not scheduled: nothing is stuck anywhere
        node = await self.api.get("Node", "", node_name)
        since: dt.datetime | None
        if node is None:
            since = self.missing_since.setdefault(node_name, self.now())
        else:
            self.missing_since.pop(node_name, None)
            since = node_lost_since(node)
        if since is None:
            self.warned.discard(f"{blocked_key}/{node_name}")
            return None
        grace = self.spec.broker.node_loss_grace_period
        remaining = grace - (self.now() - since).total_seconds()
        if remaining > 0:
            self.wake_in_s = remaining if self.wake_in_s is None else min(self.wake_in_s, remaining)
            return None  # may come back (a flapping node, a kubelet restart): nothing happens yet
        return node_name, node, since

    async def _detect(self, ordinal: int, pod: dict[str, Any]) -> None:
        lost = await self._lost_past_grace(pod, f"blocked/{ordinal}")
        if lost is None:
            return
        node_name, node, since = lost
        node_id = builders.broker_node_id(ordinal)
        try:
            silent, why = await self.controller().broker_silent(node_id)
        except ControllerApiError as exc:
            self._warn_once(f"controller/{ordinal}", "NodeLossWaiting", f"node {node_name} looks lost but {exc}")
            return
        if not silent:
            # The API server says the node is gone, the controller still hears the broker: a
            # partition between the node and the API server, not a dead broker. Never fence it.
            self._warn_once(
                f"blocked/{ordinal}/{node_name}",
                "FencingBlocked",
                f"node {node_name} of broker {node_id} is {'gone' if node is None else 'not Ready'}, but {why}: not fencing it",
            )
            return
        if not self.may_act():
            return
        self.records[str(ordinal)] = {
            "node": node_name,
            "nodeGone": node is None,
            "pod": pod["metadata"]["name"],
            "podUid": pod["metadata"].get("uid"),
            "since": _iso(since),
            "strategy": strategy(self.spec),
            "step": "lost",
        }
        await self._save()
        self.reporter.warn(
            "NodeLost",
            f"node {node_name} {'is gone' if node is None else 'is not Ready'} since {_iso(since)} and {why}: "
            f"recovering broker {node_id} ({strategy(self.spec)})",
        )

    def _warn_once(self, key: str, reason: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            self.reporter.warn(reason, message)

    # -- controllers -----------------------------------------------------------------------

    async def _controllers(self) -> None:
        prefix = builders.statefulset_name(self.ref, "controller") + "-"
        pods = {
            p["metadata"]["name"]: p
            for p in await self.api.list("Pod", self.ref.namespace, builders.selector_labels(self.ref, "controller"))
            if p["metadata"]["name"].startswith(prefix) and p["metadata"]["name"][len(prefix) :].isdigit()
        }
        total = self.spec.controller.replicas
        for name, pod in sorted(pods.items()):  # a copy: a released pod leaves `pods`
            key = name[len(prefix) :]
            if key in self.controller_records or not self.may_act():
                continue
            lost = await self._lost_past_grace(pod, f"blocked/{name}")
            if lost is None:
                continue
            node_name, node, since = lost
            alive = await self._controller_renews_lease(name, since)
            if alive:
                self._warn_once(
                    f"blocked/{name}/{node_name}",
                    "FencingBlocked",
                    f"node {node_name} of controller pod {name} is {'gone' if node is None else 'not Ready'}, but {alive}: "
                    "not force-deleting it",
                )
                continue
            others = [p for n, p in pods.items() if n != name and _pod_ready(p)]
            self.controller_records[key] = {
                "node": node_name,
                "pod": name,
                "podUid": pod["metadata"].get("uid"),
                "since": _iso(since),
                "controllers": total,
                "readyControllers": len(others),
            }
            await self._save_controllers()  # before the delete: a restart resumes, never repeats blindly
            await self.api.delete("Pod", self.ref.namespace, name, grace_period_s=0)
            del pods[name]
            left = f"{len(others)} of {total} controllers Ready" if others else "no controller is Ready until it is"
            self.reporter.warn(
                "ControllerNodeLost",
                f"node {node_name} {'is gone' if node is None else 'is not Ready'} since {_iso(since)}: controller pod "
                f"{name} force-deleted so its StatefulSet replaces it on a healthy node; {left}",
            )
        for key, record in sorted(self.controller_records.items()):
            current = pods.get(record["pod"])
            if current is None or current["metadata"].get("uid") == record["podUid"]:
                if current is not None and self.may_act():  # the delete did not happen (a restart in between)
                    await self.api.delete("Pod", self.ref.namespace, record["pod"], grace_period_s=0)
                continue
            if not _pod_ready(current) or not self.may_act():
                continue
            del self.controller_records[key]
            await self._save_controllers()
            self.reporter.info(
                "ControllerNodeLossResolved", f"controller pod {record['pod']} is Ready again on a new pod"
            )

    async def _controller_renews_lease(self, pod_name: str, since: dt.datetime) -> str:
        """Why the controller of `pod_name` is alive ('' if nothing says so): it holds the
        controller Lease and renewed it after its node was lost (only the kubelet is cut off)."""
        lease = await self.api.get("Lease", self.ref.namespace, builders.lease_name(self.ref))
        spec = (lease or {}).get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        # A controller's identity is "<host>-<random>-controller-<node id>" (broker/controller/lease.py);
        # the node id is the pod's (ids are unique in a cluster, host names need not be).
        node_id = builders.CONTROLLER_NODE_ID_BASE + int(pod_name.rsplit("-", 1)[1])
        if not holder.endswith(f"-controller-{node_id}"):
            return ""
        renewed = _parse(spec.get("renewTime"))
        if renewed is None or renewed <= since:
            return ""
        return f"it renewed the controller Lease at {_iso(renewed)}, after the node was lost"

    # -- recovery --------------------------------------------------------------------------

    async def _step(self, ordinal: int, step: str, reason: str, message: str, **extra: Any) -> None:
        self.records[str(ordinal)].update(step=step, **extra)
        await self._save()
        self.reporter.info(reason, message)

    async def _advance(self, ordinal: int, pod: dict[str, Any] | None) -> None:
        record = self.records[str(ordinal)]
        node_id = builders.broker_node_id(ordinal)
        node_name = record["node"]
        try:
            if record["step"] == "lost":
                if not self.may_act():
                    return
                epoch = await self.controller().fence_broker(node_id)
                await self._step(
                    ordinal,
                    "fenced",
                    "BrokerFenced",
                    f"broker {node_id} fenced at the controller (node epoch {epoch})",
                    nodeEpoch=epoch,
                )
            if record["step"] == "fenced":
                if not self.may_act():
                    return
                if pod is not None and pod["metadata"].get("uid") == record["podUid"]:
                    await self.api.delete("Pod", self.ref.namespace, record["pod"], grace_period_s=0)
                await self._step(
                    ordinal,
                    "podReleased",
                    "PodReleased",
                    f"pod {record['pod']} on lost node {node_name} force-deleted; the StatefulSet replaces it",
                )
            if record["step"] == "podReleased":
                if not self.may_act():
                    return
                await self._release_volume(ordinal, record)
            if record["step"] == "volumeReleased":
                if not self.may_act():
                    return
                if await self.controller().wal_recovery_pending(node_id):
                    await self._watch_job(ordinal, record)
                    return
                await self._step(
                    ordinal,
                    "recovered",
                    "WalRecovered",
                    f"the WAL of broker {node_id} is recovered",
                    recoveredAt=_iso(self.now()),
                )
            if record["step"] == "recovered":
                if not self.may_act():
                    return
                if await self.controller().offline_partitions() > 0:
                    return
                since = _parse(record["since"]) or self.now()
                seconds = (self.now() - since).total_seconds()
                RECOVERIES.labels(record["strategy"]).inc()
                RECOVERY_SECONDS.labels(record["strategy"]).observe(seconds)
                await self._step(
                    ordinal,
                    "served",
                    "PartitionsServed",
                    f"every partition of lost broker {node_id} is served again, {seconds:.0f} s after node {node_name} was lost",
                    servedAt=_iso(self.now()),
                )
            if record["step"] == "served":
                if not self.may_act():
                    return
                await self._clear(ordinal, record, pod)
        except ControllerApiError as exc:
            self._warn_once(f"controller/{ordinal}", "NodeLossWaiting", f"recovery of broker {node_id} waits: {exc}")

    async def _release_volume(self, ordinal: int, record: dict[str, Any]) -> None:
        kind = record["strategy"]
        node_name = record["node"]
        if kind == "s3":
            message = "S3 WAL: no volume to release; a live broker recovers the WAL"
        elif kind == "multiAttach":
            job = recovery_job(self.spec, self.ref, ordinal, node_name, int(record.get("nodeEpoch", -1)))
            try:
                await self.api.create(job)
            except KubeError as exc:
                if exc.status != 409:  # 409: created before a restart, or by another operator
                    raise
            message = (
                f"WAL-recovery Job {job['metadata']['name']} created (claim {wal_claim_name(self.ref, ordinal)}, "
                f"not on node {node_name})"
            )
        else:
            node = await self.api.get("Node", "", node_name)
            if node is not None and self.spec.broker.wal.out_of_service_taint:
                taints = list((node.get("spec") or {}).get("taints") or [])
                if not any(t.get("key") == OUT_OF_SERVICE["key"] for t in taints):
                    await self.api.patch("Node", "", node_name, {"spec": {"taints": [*taints, OUT_OF_SERVICE]}})
                record["tainted"] = True
                message = f"node {node_name} tainted {OUT_OF_SERVICE['key']}: Kubernetes detaches its volumes"
            else:
                released = await self._delete_attachments(ordinal, node_name)
                message = f"VolumeAttachments {released or '(none left)'} of node {node_name} deleted"
        await self._step(ordinal, "volumeReleased", "VolumeReleased", message)

    async def _delete_attachments(self, ordinal: int, node_name: str) -> list[str]:
        claim = await self.api.get("PersistentVolumeClaim", self.ref.namespace, wal_claim_name(self.ref, ordinal))
        volume = ((claim or {}).get("spec") or {}).get("volumeName")
        deleted = []
        for attachment in await self.api.list("VolumeAttachment", ""):
            spec = attachment.get("spec") or {}
            if spec.get("nodeName") != node_name:
                continue
            if volume is not None and (spec.get("source") or {}).get("persistentVolumeName") != volume:
                continue
            if await self.api.delete("VolumeAttachment", "", attachment["metadata"]["name"]):
                deleted.append(attachment["metadata"]["name"])
        return deleted

    async def _watch_job(self, ordinal: int, record: dict[str, Any]) -> None:
        if record["strategy"] != "multiAttach":
            return
        job = await self.api.get("Job", self.ref.namespace, recovery_job_name(self.ref, ordinal))
        failed = any(
            c.get("type") == "Failed" and c.get("status") == "True"
            for c in ((job or {}).get("status") or {}).get("conditions") or []
        )
        if failed:
            self._warn_once(
                f"job/{ordinal}",
                "WalRecoveryFailed",
                f"WAL-recovery Job {recovery_job_name(self.ref, ordinal)} failed: see its pod's log; the replacement "
                "broker recovers its own WAL once its volume attaches",
            )

    async def _clear(self, ordinal: int, record: dict[str, Any], pod: dict[str, Any] | None) -> None:
        if pod is None or pod["metadata"].get("uid") == record["podUid"] or not _pod_ready(pod):
            return
        node_name = record["node"]
        if record.get("tainted"):
            node = await self.api.get("Node", "", node_name)
            if node is not None and node_lost_since(node) is None:
                taints = [
                    t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != OUT_OF_SERVICE["key"]
                ]
                await self.api.patch("Node", "", node_name, {"spec": {"taints": taints}})
            elif node is not None:
                self.reporter.warn(
                    "OutOfServiceTaintLeft",
                    f"node {node_name} is still not Ready: remove the taint once it is repaired "
                    f"(kubectl taint nodes {node_name} {OUT_OF_SERVICE['key']}-)",
                )
        if record["strategy"] == "multiAttach":
            await self.api.delete("Job", self.ref.namespace, recovery_job_name(self.ref, ordinal))
        del self.records[str(ordinal)]
        await self._save()
        self.reporter.info(
            "NodeLossResolved", f"broker {builders.broker_node_id(ordinal)} is Ready again on a new pod {record['pod']}"
        )


def read_records(cluster: dict[str, Any], annotation: str = ANNOTATION) -> dict[str, dict[str, Any]]:
    raw = ((cluster.get("metadata") or {}).get("annotations") or {}).get(annotation)
    if not raw:
        return {}
    try:
        records = json.loads(raw)
    except ValueError:
        log.warning("ignoring unreadable %s annotation: %r", annotation, raw[:200])
        return {}
    return records if isinstance(records, dict) else {}


def degraded_notes(cluster: dict[str, Any]) -> list[tuple[str, str]]:
    """(reason, message) per broker still being recovered, for the Degraded condition."""
    notes = []
    for key, record in sorted(read_records(cluster).items(), key=lambda kv: int(kv[0])):
        node_id = builders.broker_node_id(int(key))
        notes.append(
            (
                "NodeLost",
                f"node {record.get('node')} lost since {record.get('since')}: broker {node_id} "
                f"({record.get('strategy')}) at step {record.get('step')}",
            )
        )
    for _, record in sorted(read_records(cluster, CONTROLLER_ANNOTATION).items(), key=lambda kv: int(kv[0])):
        ready, total = record.get("readyControllers", 0), record.get("controllers", 0)
        quorum = (
            "no controller is Ready: metadata changes (new leaders, topics) wait for the replacement"
            if not ready
            else f"{ready} of {total} controllers Ready"
        )
        notes.append(
            (
                "ControllerNodeLost",
                f"controller pod {record.get('pod')} on node {record.get('node')} lost since "
                f"{record.get('since')}, force-deleted; {quorum}",
            )
        )
    return notes


async def copy_topology_label(api: KubeApi, pod: dict[str, Any], key: str) -> bool:
    """Give a bound broker pod its node's topology label (`key`, e.g. the zone) when it lacks it,
    so the downward API can pass it to the broker as its rack. Clusters with the
    PodTopologyLabels admission plugin label pods themselves; others get it here, in the moments
    between binding and container start (a broker started before it reports no rack until its
    next restart). True when the pod was labelled."""
    meta = pod.get("metadata") or {}
    node_name = (pod.get("spec") or {}).get("nodeName")
    if not node_name or key in (meta.get("labels") or {}) or meta.get("deletionTimestamp"):
        return False
    node = await api.get("Node", "", node_name)
    value = ((node or {}).get("metadata", {}).get("labels") or {}).get(key)
    if value is None:
        return False
    await api.patch("Pod", meta["namespace"], meta["name"], {"metadata": {"labels": {key: value}}})
    return True
