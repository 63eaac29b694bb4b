"""Node loss against the kmock Kubernetes emulator: Nodes, broker Pods, PVCs, VolumeAttachments.

Each test runs node-loss passes (what the operator's node-loss daemon runs) with a recording
controller API; Kubernetes writes the pass makes go into the same ordered log, so the order
fence -> pod force-delete -> volume release / recovery Job is asserted exactly. Time is the
pass's clock: the tests move it instead of sleeping through grace periods.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import kmock
import kopf
import pytest

from automq.operator import builders, nodeloss
from automq.operator.builders import ClusterRef
from automq.operator.controller_api import ControllerApiError
from automq.operator.handlers import _node_loss_notes, register
from automq.operator.kube import KubeApi
from automq.operator.nodeloss import ANNOTATION, OUT_OF_SERVICE, NodeLossPass, read_records
from automq.operator.reconcile import Cluster
from automq.operator.spec import GROUP, PLURAL, VERSION, parse_spec

NS = "streaming"
T0 = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.UTC)


def iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class RecordingApi(KubeApi):
    """The real client; writes also go to the shared log (and one can be made to fail once)."""

    def __init__(self, url: str, log: list[tuple]) -> None:
        super().__init__(url)
        self.log = log
        self.fail_next: set[tuple[str, str]] = set()  # (verb, kind)

    def _maybe_fail(self, verb: str, kind: str) -> None:
        if (verb, kind) in self.fail_next:
            self.fail_next.discard((verb, kind))
            raise ConnectionError(f"injected: {verb} {kind} failed (the operator died here)")

    async def delete(self, kind: str, namespace: str, name: str, *, grace_period_s: int | None = None) -> bool:
        self._maybe_fail("delete", kind)
        self.log.append(("delete", kind, name, grace_period_s))
        return await super().delete(kind, namespace, name, grace_period_s=grace_period_s)

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._maybe_fail("create", obj["kind"])
        if obj["kind"] != "AutoMQCluster":
            self.log.append(("create", obj["kind"], obj["metadata"]["name"]))
        return await super().create(obj)

    async def patch(self, kind: str, namespace: str, name: str, patch: dict, subresource: str | None = None) -> dict:
        if kind == "Node" and "spec" in patch:
            self.log.append(("patch", kind, name, [t["key"] for t in patch["spec"]["taints"]]))
        return await super().patch(kind, namespace, name, patch, subresource)


class FakeController:
    """The controller's view: which brokers it still hears, recovery jobs, offline partitions."""

    def __init__(self, log: list[tuple]) -> None:
        self.log = log
        self.hears: set[int] = set()
        self.pending: set[int] = set()  # brokers with a WAL recovery job
        self.offline = 0
        self.down = False

    def api(self, urls: list[str], auth: Any = None) -> FakeController:
        return self

    def _check(self) -> None:
        if self.down:
            raise ControllerApiError("controller unreachable")

    async def broker_silent(self, node_id: int) -> tuple[bool, str]:
        self._check()
        self.log.append(("silent?", node_id))
        if node_id in self.hears:
            return False, f"the controller last heard broker {node_id} 200 ms ago"
        return True, f"the controller last heard broker {node_id} 15000 ms ago"

    async def fence_broker(self, node_id: int) -> int:
        self._check()
        self.log.append(("fence", node_id))
        self.pending.add(node_id)
        return 7

    async def wal_recovery_pending(self, node_id: int) -> bool:
        self._check()
        return node_id in self.pending

    async def offline_partitions(self) -> int:
        self._check()
        return self.offline

    async def close(self) -> None:
        pass


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def info(self, reason: str, message: str) -> None:
        self.seen.append((reason, message))

    def warn(self, reason: str, message: str) -> None:
        self.seen.append((reason, message))

    def reasons(self) -> list[str]:
        return [r for r, _ in self.seen]


class World:
    """One cluster `demo` with 3 brokers on nodes n0, n1, n2 (each Ready), in kmock."""

    def __init__(self, api: RecordingApi, spec: dict[str, Any]) -> None:
        self.api = api
        self.log = api.log
        self.controller = FakeController(self.log)
        self.events = Events()
        self.raw_spec = spec
        self.spec = parse_spec(spec)
        self.ref = ClusterRef("demo", NS, str(uuid.uuid4()))
        self.now = T0
        self.missing_since: dict[str, dt.datetime] = {}
        self.warned: set[str] = set()

    async def setup(self) -> None:
        await self.api.create(
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AutoMQCluster",
                "metadata": {"name": "demo", "namespace": NS, "uid": self.ref.uid},
                "spec": self.raw_spec,
            }
        )
        for i in range(3):
            await self.node(f"n{i}", ready=True)
            await self.pod(i, f"n{i}")
            claim = f"wal-demo-broker-{i}"
            await self.api.create(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim, "namespace": NS, "uid": str(uuid.uuid4())},
                    "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": f"pv-{i}"},
                }
            )
            await self.api.create(
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "VolumeAttachment",
                    "metadata": {"name": f"csi-{i}", "uid": str(uuid.uuid4())},
                    "spec": {
                        "attacher": "ebs.csi.aws.com",
                        "nodeName": f"n{i}",
                        "source": {"persistentVolumeName": f"pv-{i}"},
                    },
                }
            )
        self.log.clear()

    async def node(self, name: str, ready: bool, since: dt.datetime = T0) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": str(uuid.uuid4()), "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True" if ready else "Unknown", "lastTransitionTime": iso(since)}
                ]
            },
        }
        if await self.api.get("Node", "", name) is None:
            await self.api.create(body)
        else:
            await self.api.patch("Node", "", name, {"status": body["status"]})

    async def pod(self, ordinal: int, node: str, ready: bool = True) -> str:
        uid = str(uuid.uuid4())
        labels = builders.common_labels(self.ref, "broker")
        await self.api.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"demo-broker-{ordinal}", "namespace": NS, "uid": uid, "labels": labels},
                "spec": {"nodeName": node, "containers": [{"name": "broker", "image": "automq"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
            }
        )
        return uid

    def recovery(self) -> NodeLossPass:
        """A pass as the daemon makes one; a new object per pass (nothing carried but the
        daemon's own in-memory maps, which an operator restart loses)."""
        return NodeLossPass(
            api=self.api,
            ref=self.ref,
            spec=self.spec,
            reporter=self.events,
            controller_api_factory=self.controller.api,
            missing_since=self.missing_since,
            warned=self.warned,
            now=lambda: self.now,
        )

    async def run(self) -> bool:
        return await self.recovery().run()

    async def records(self) -> dict[str, Any]:
        return read_records(await self.api.get("AutoMQCluster", NS, "demo") or {})

    def actions(self) -> list[tuple]:
        return [e for e in self.log if e[0] != "silent?"]


@pytest.fixture
async def kube(emulator_class: type) -> AsyncIterator[RecordingApi]:
    emulator = emulator_class()
    emulator.resources.load_bundled()
    info = emulator.resources[f"{GROUP}/{VERSION}/{PLURAL}"]
    info.kind = "AutoMQCluster"
    info.namespaced = True
    info.verbs = {"get", "list", "watch", "create", "patch", "update", "delete"}
    info.subresources = {"status", "scale"}
    async with kmock.Server(emulator) as server:
        api = RecordingApi(str(server.url), [])
        yield api
        await api.close()


BASE = {"objectStore": {"bucket": "demo-bucket"}, "broker": {"replicas": 3}}


def spec_with(**wal: Any) -> dict[str, Any]:
    return {**BASE, "broker": {"replicas": 3, "wal": {"kind": "volume", "size": "10Gi", **wal}}}


async def world(kube: RecordingApi, spec: dict[str, Any]) -> World:
    w = World(kube, spec)
    await w.setup()
    return w


async def test_force_detach_with_the_out_of_service_taint_in_order(kube: RecordingApi) -> None:
    w = await world(kube, spec_with(failover="forceDetach"))
    await w.node("n1", ready=False, since=T0)
    w.now = T0 + dt.timedelta(seconds=21)
    assert await w.run()
    assert w.actions() == [
        ("fence", 1),
        ("delete", "Pod", "demo-broker-1", 0),
        ("patch", "Node", "n1", [OUT_OF_SERVICE["key"]]),
    ]
    assert (await kube.get("Pod", NS, "demo-broker-1")) is None
    assert (await w.records())["1"]["step"] == "volumeReleased"
    assert w.events.reasons() == ["NodeLost", "BrokerFenced", "PodReleased", "VolumeReleased"]
    # Degraded while in progress, naming node and broker.
    live = await kube.get("AutoMQCluster", NS, "demo")
    [(reason, message)] = nodeloss.degraded_notes(live)
    assert reason == "NodeLost" and "node n1" in message and "broker 1" in message

    # The replacement pod registered and recovered its own WAL: the controller's job is gone.
    w.controller.pending.clear()
    w.now += dt.timedelta(seconds=5)
    recoveries = nodeloss.RECOVERIES.labels("forceDetach")._value.get()
    seconds = nodeloss.RECOVERY_SECONDS.labels("forceDetach")._sum.get()
    await w.run()
    assert nodeloss.RECOVERIES.labels("forceDetach")._value.get() == recoveries + 1
    assert nodeloss.RECOVERY_SECONDS.labels("forceDetach")._sum.get() == seconds + 26  # NotReady -> served
    assert (await w.records())["1"]["step"] == "served"
    assert w.events.reasons()[-2:] == ["WalRecovered", "PartitionsServed"]
    assert "26 s after node n1 was lost" in w.events.seen[-1][1]

    # Cleared once the replacement pod is Ready; the taint goes once the node is back.
    await w.pod(1, "n0")
    await w.node("n1", ready=True, since=w.now)
    assert not await w.run()
    assert await w.records() == {}
    assert w.events.reasons()[-1] == "NodeLossResolved"
    assert not (await kube.get("Node", "", "n1"))["spec"]["taints"]
    assert nodeloss.degraded_notes(await kube.get("AutoMQCluster", NS, "demo")) == []
    # The other brokers were never touched.
    assert [e for e in w.log if e[0] == "fence"] == [("fence", 1)]


async def test_force_detach_without_taint_deletes_only_the_wal_attachment(kube: RecordingApi) -> None:
    w = await world(kube, spec_with(failover="forceDetach", outOfServiceTaint=False))
    # Another volume on the lost node that is not this broker's WAL.
    await kube.create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttachment",
            "metadata": {"name": "csi-other", "uid": str(uuid.uuid4())},
            "spec": {"attacher": "x", "nodeName": "n2", "source": {"persistentVolumeName": "pv-other"}},
        }
    )
    w.log.clear()
    await w.node("n2", ready=False, since=T0)
    w.now = T0 + dt.timedelta(seconds=60)
    await w.run()
    assert w.actions() == [
        ("fence", 2),
        ("delete", "Pod", "demo-broker-2", 0),
        ("delete", "VolumeAttachment", "csi-2", None),
    ]
    assert await kube.get("VolumeAttachment", "", "csi-other") is not None


async def test_multi_attach_runs_a_recovery_job_away_from_the_lost_node(kube: RecordingApi) -> None:
    w = await world(kube, spec_with(failover="multiAttach"))
    await w.node("n0", ready=False, since=T0)
    w.now = T0 + dt.timedelta(seconds=20)
    await w.run()
    job_name = "demo-broker-0-wal-recovery"
    assert w.actions() == [("fence", 0), ("delete", "Pod", "demo-broker-0", 0), ("create", "Job", job_name)]
    job = await kube.get("Job", NS, job_name)
    pod = job["spec"]["template"]["spec"]
    assert {"name": "wal", "persistentVolumeClaim": {"claimName": "wal-demo-broker-0"}} in pod["volumes"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n0"]}]}]
    args = pod["containers"][0]["args"]
    assert args[:6] == ["wal", "recover", "--wal", f"{builders.WAL_DIR}/wal", "--node-id", "0"]
    assert args[args.index("--object-store") + 1].startswith("s3://demo-bucket")
    assert "--controller" in args and pod["restartPolicy"] == "Never"
    assert args[args.index("--fenced-epoch") + 1] == "7"  # the epoch fencing answered
    assert job["metadata"]["ownerReferences"][0]["uid"] == w.ref.uid

    # The Job completed the controller's recovery job: partitions served without the new pod.
    w.controller.pending.clear()
    await w.run()
    assert (await w.records())["0"]["step"] == "served"
    await w.pod(0, "n1")
    await w.run()
    assert await w.records() == {} and await kube.get("Job", NS, job_name) is None


async def test_a_node_back_within_the_grace_triggers_nothing(kube: RecordingApi) -> None:
    w = await world(kube, spec_with())
    await w.node("n1", ready=False, since=T0)
    w.now = T0 + dt.timedelta(seconds=19)
    assert not await w.run()
    await w.node("n1", ready=True, since=w.now)
    w.now = T0 + dt.timedelta(seconds=60)
    assert not await w.run()
    assert w.log == [] and w.events.seen == []  # not even a question to the controller
    assert ANNOTATION not in ((await kube.get("AutoMQCluster", NS, "demo"))["metadata"].get("annotations") or {})


async def test_a_controller_still_hearing_the_broker_blocks_fencing(kube: RecordingApi) -> None:
    w = await world(kube, spec_with())
    w.controller.hears.add(1)
    await w.node("n1", ready=False, since=T0)
    w.now = T0 + dt.timedelta(seconds=120)
    await w.run()
    await w.run()
    assert w.actions() == [] and await w.records() == {}
    assert w.events.reasons() == ["FencingBlocked"]  # once, not once per pass
    assert "200 ms ago" in w.events.seen[0][1]
    # An unreachable controller cannot agree either.
    w.controller.hears.clear()
    w.controller.down = True
    await w.run()
    assert w.actions() == [] and w.events.reasons()[-1] == "NodeLossWaiting"
    # Once it agrees, recovery starts.
    w.controller.down = False
    await w.run()
    assert w.actions()[0] == ("fence", 1)


async def test_operator_restart_mid_recovery_resumes_without_repeating(kube: RecordingApi) -> None:
    w = await world(kube, spec_with(failover="multiAttach"))
    await w.node("n2", ready=False, since=T0)
    w.now = T0 + dt.timedelta(seconds=30)
    kube.fail_next.add(("delete", "Pod"))  # the operator dies after fencing, before freeing the pod
    with pytest.raises(ConnectionError):
        await w.run()
    assert (await w.records())["2"]["step"] == "fenced"
    # A new operator process: no memory of the first, only what the API holds.
    w.missing_since.clear()
    w.warned.clear()
    await w.run()
    assert w.actions() == [
        ("fence", 2),
        ("delete", "Pod", "demo-broker-2", 0),
        ("create", "Job", "demo-broker-2-wal-recovery"),
    ]
    # Two operators at once (e.g. during a Recreate rollout): the fixed Job name makes one Job.
    records = await w.records()
    records["2"]["step"] = "podReleased"
    await kube.patch("AutoMQCluster", NS, "demo", {"metadata": {"annotations": {ANNOTATION: json.dumps(records)}}})
    await kube.delete("Job", NS, "demo-broker-2-wal-recovery")
    results = await asyncio.gather(w.run(), w.run(), return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len([j for j in await kube.list("Job", NS) if j["metadata"]["name"] == "demo-broker-2-wal-recovery"]) == 1
    assert (await w.records())["2"]["step"] == "volumeReleased"


async def test_s3_wal_fences_and_frees_the_pod_only(kube: RecordingApi) -> None:
    w = await world(kube, {**BASE, "broker": {"replicas": 3, "wal": {"kind": "s3"}}})
    await w.node("n1", ready=False, since=T0)
    w.now = T0 + dt.timedelta(seconds=25)
    await w.run()
    assert w.actions() == [("fence", 1), ("delete", "Pod", "demo-broker-1", 0)]
    assert (await w.records())["1"]["strategy"] == "s3"
    w.controller.pending.clear()  # a live broker recovered the S3 WAL
    w.controller.offline = 2  # ... and the controller has not placed every partition yet
    await w.run()
    assert (await w.records())["1"]["step"] == "recovered"
    w.controller.offline = 0
    await w.run()
    assert (await w.records())["1"]["step"] == "served"


async def test_a_deleted_node_counts_from_when_it_was_first_missed(kube: RecordingApi) -> None:
    w = await world(kube, spec_with(outOfServiceTaint=True))
    await kube.delete("Node", "", "n0")
    w.log.clear()
    w.now = T0 + dt.timedelta(seconds=100)
    await w.run()  # first seen missing now: the grace starts now
    assert w.actions() == []
    w.now += dt.timedelta(seconds=21)
    await w.run()
    # No Node to taint: the WAL's VolumeAttachment is deleted instead.
    assert w.actions() == [
        ("fence", 0),
        ("delete", "Pod", "demo-broker-0", 0),
        ("delete", "VolumeAttachment", "csi-0", None),
    ]


async def test_status_step_puts_node_lost_first_in_degraded(kube: RecordingApi) -> None:
    w = await world(kube, spec_with())
    await w.node("n1", ready=False, since=T0)
    w.now = T0 + dt.timedelta(seconds=30)
    await w.run()
    live = await kube.get("AutoMQCluster", NS, "demo")
    cluster = Cluster(
        api=kube,
        ref=w.ref,
        spec=w.spec,
        raw_spec=w.raw_spec,
        generation=1,
        previous_status={},
        reporter=w.events,
        controller_api_factory=w.controller.api,  # type: ignore[arg-type]
    )
    await _node_loss_notes(live)(cluster)
    assert cluster.problems[0].reason == "NodeLost" and "node n1" in cluster.problems[0].message


def test_operator_watches_nodes_and_broker_pods() -> None:
    registry = register(kopf.OperatorRegistry())
    watched = {(s.group, s.version, s.any_name) for s in registry._watching.get_all_selectors()}
    assert watched == {("", "v1", "nodes"), ("", "v1", "pods")}
    assert "node-loss" in {h.id for h in registry._spawning.get_all_handlers()}


async def test_a_bound_broker_pod_gets_its_nodes_zone_label(kube: RecordingApi) -> None:
    await world(kube, spec_with())
    zone = "topology.kubernetes.io/zone"
    await kube.patch("Node", "", "n1", {"metadata": {"labels": {zone: "eu-west-1b"}}})
    pod = await kube.get("Pod", NS, "demo-broker-1")
    assert await nodeloss.copy_topology_label(kube, pod, zone)
    assert (await kube.get("Pod", NS, "demo-broker-1"))["metadata"]["labels"][zone] == "eu-west-1b"
    # Already labelled, not bound yet, or a node without the label: nothing to do.
    assert not await nodeloss.copy_topology_label(kube, await kube.get("Pod", NS, "demo-broker-1"), zone)
    assert not await nodeloss.copy_topology_label(kube, await kube.get("Pod", NS, "demo-broker-0"), zone)
    unbound = {"metadata": {"name": "demo-broker-9", "namespace": NS}, "spec": {}}
    assert not await nodeloss.copy_topology_label(kube, unbound, zone)


async def controllers(w: World, holder: str | None, renewed: dt.datetime) -> None:
    """Three controller pods c0..c2 on nodes c0..c2; the controller Lease held by `holder`."""
    for i in range(3):
        await w.node(f"c{i}", ready=True)
        await kube_create_pod(w, f"demo-controller-{i}", "controller", f"c{i}")
    await w.api.create(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": builders.lease_name(w.ref), "namespace": NS, "uid": str(uuid.uuid4())},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 3,
                "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
    )
    w.log.clear()


async def kube_create_pod(w: World, name: str, role: str, node: str, ready: bool = True) -> str:
    uid = str(uuid.uuid4())
    await w.api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": uid, "labels": builders.common_labels(w.ref, role)},
            "spec": {"nodeName": node, "containers": [{"name": role, "image": "automq"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }
    )
    return uid


def three_controllers() -> dict[str, Any]:
    return {**spec_with(), "controller": {"replicas": 3}}


async def test_a_controller_on_a_lost_node_is_force_deleted_after_the_grace(kube: RecordingApi) -> None:
    w = await world(kube, three_controllers())
    # The active controller is c0's; c2's node dies (a standby).
    await controllers(w, "demo-controller-0-controller-1000", T0)
    await w.node("c2", ready=False, since=T0)
    await kube.patch("Pod", NS, "demo-controller-2", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    w.now = T0 + dt.timedelta(seconds=10)
    await w.run()
    assert w.actions() == [] and w.events.reasons() == []  # within the grace: nothing

    w.now = T0 + dt.timedelta(seconds=21)
    assert await w.run()
    assert w.actions() == [("delete", "Pod", "demo-controller-2", 0)]
    assert w.events.reasons() == ["ControllerNodeLost"]
    assert "2 of 3 controllers Ready" in w.events.seen[0][1]
    live = await kube.get("AutoMQCluster", NS, "demo")
    [(reason, message)] = nodeloss.degraded_notes(live)
    assert reason == "ControllerNodeLost" and "demo-controller-2" in message and "node c2" in message
    # No broker was touched, nothing fenced.
    assert not [e for e in w.log if e[0] == "fence"]

    # Passes go on: nothing repeated while the replacement starts, one event for the incident.
    await w.run()
    await kube_create_pod(w, "demo-controller-2", "controller", "c0", ready=False)  # the StatefulSet's
    await w.run()
    assert [a for a in w.actions() if a[0] == "delete"] == [("delete", "Pod", "demo-controller-2", 0)]
    assert w.events.reasons() == ["ControllerNodeLost"]
    # The replacement is Ready: the condition clears.
    await kube.patch("Pod", NS, "demo-controller-2", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert not await w.run()
    assert w.events.reasons() == ["ControllerNodeLost", "ControllerNodeLossResolved"]
    assert nodeloss.degraded_notes(await kube.get("AutoMQCluster", NS, "demo")) == []


async def test_a_controller_still_renewing_its_lease_is_never_force_deleted(kube: RecordingApi) -> None:
    w = await world(kube, three_controllers())
    # c0's node is NotReady to the API server, but its controller renewed the Lease since then:
    # alive, only its kubelet is cut off.
    await controllers(w, "demo-controller-0-controller-1000", T0 + dt.timedelta(seconds=25))
    await w.node("c0", ready=False, since=T0)
    w.now = T0 + dt.timedelta(seconds=30)
    await w.run()
    await w.run()
    assert w.actions() == []
    assert w.events.reasons() == ["FencingBlocked"]
    assert "renewed the controller Lease" in w.events.seen[0][1]
    # The Lease went stale (the controller really died, a standby took over): now it goes.
    await kube.patch(
        "Lease", NS, builders.lease_name(w.ref), {"spec": {"holderIdentity": "demo-controller-1-controller-1001"}}
    )
    w.now += dt.timedelta(seconds=5)
    await w.run()
    assert w.actions() == [("delete", "Pod", "demo-controller-0", 0)]
    assert w.events.reasons()[-1] == "ControllerNodeLost"


async def test_the_only_controller_lost_says_metadata_waits(kube: RecordingApi) -> None:
    w = await world(kube, spec_with())
    await w.node("c0", ready=True)
    await kube_create_pod(w, "demo-controller-0", "controller", "c0")
    w.log.clear()
    await w.node("c0", ready=False, since=T0)
    await kube.patch("Pod", NS, "demo-controller-0", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    w.now = T0 + dt.timedelta(seconds=21)
    await w.run()
    assert w.actions() == [("delete", "Pod", "demo-controller-0", 0)]
    [(reason, message)] = nodeloss.degraded_notes(await kube.get("AutoMQCluster", NS, "demo"))
    assert reason == "ControllerNodeLost" and "no controller is Ready" in message


async def test_a_pass_wakes_when_the_grace_ends_and_a_follower_writes_nothing(kube: RecordingApi) -> None:
    w = await world(kube, spec_with())
    await w.node("n1", ready=False, since=T0)
    w.now = T0 + dt.timedelta(seconds=12.5)
    recovery = w.recovery()
    await recovery.run()
    assert recovery.wake_in_s == pytest.approx(7.5)  # the daemon looks again right at the grace's end
    w.now = T0 + dt.timedelta(seconds=21)
    follower = w.recovery()
    follower.may_act = lambda: False  # another operator replica leads
    assert not await follower.run()
    assert w.actions() == [] and w.events.reasons() == [] and await w.records() == {}
    assert await w.run()  # the leader acts
    assert [a[0] for a in w.actions()] == ["fence", "delete", "patch"]
