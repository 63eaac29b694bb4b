"""Two real kopf operators at once against one kmock API (each in its own thread and event loop,
as two replicas of the chart's Deployment): they elect a leader through the Lease, only the
leader acts on a node loss, and when the leader stops the other takes over and acts alone.

Every Kubernetes write either operator makes through its API client, and every controller call,
lands in one log tagged with the operator's identity. Pods, Nodes, claims and attachments are
created by the test (kmock runs no controllers); the controller API is a recording fake that
says the lost broker is silent and its WAL recovered right after fencing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
from kmock_emulator import KubeconfigSwap, install_cluster_crd

from automq.operator import builders
from automq.operator.builders import ClusterRef
from automq.operator.handlers import OperatorContext
from automq.operator.kube import KubeApi
from automq.operator.main import operate
from automq.operator.nodeloss import ANNOTATION
from automq.operator.reconcile import ReconcileSettings
from automq.operator.spec import GROUP, VERSION, parse_spec

NS = "streaming"
OPERATOR_NS = "automq-system"
WAIT_S = 60.0
SPEC = {
    "objectStore": {"bucket": "demo-bucket"},
    "controller": {"replicas": 1},
    "broker": {
        "replicas": 2,
        "wal": {"kind": "volume", "size": "1Gi", "failover": "forceDetach"},
        "nodeLossGracePeriod": 1,
    },
}


class Log:
    def __init__(self) -> None:
        self.entries: list[tuple] = []
        self.lock = threading.Lock()

    def add(self, *entry: Any) -> None:
        with self.lock:
            self.entries.append(entry)

    def of(self, who: str) -> list[tuple]:
        with self.lock:
            return [e[1:] for e in self.entries if e[0] == who]

    def acting(self, verb: str, *rest: Any) -> list[str]:
        """Who did (verb, *rest)."""
        with self.lock:
            return [e[0] for e in self.entries if e[1 : 2 + len(rest)] == (verb, *rest)]


class TaggedApi(KubeApi):
    """The operator's real API client; its writes also go to the log under its identity."""

    def __init__(self, url: str, who: str, log: Log) -> None:
        super().__init__(url)
        self.who, self.log = who, log
        self.cut = False  # cut off from the API server (a network partition)

    async def _request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if self.cut:
            raise aiohttp.ClientConnectionError(f"{self.who} cannot reach the API server")
        return await super()._request(method, path, *args, **kwargs)

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] != "Lease":  # the election itself: both candidates may try to create it
            self.log.add(self.who, "create", obj["kind"], obj["metadata"].get("name"))
        return await super().create(obj)

    async def patch(self, kind: str, namespace: str, name: str, patch: dict, subresource: str | None = None) -> dict:
        if kind != "Lease":  # the election itself: both candidates write it
            self.log.add(self.who, "patch", kind, name)
        return await super().patch(kind, namespace, name, patch, subresource)

    async def delete(self, kind: str, namespace: str, name: str, *, grace_period_s: int | None = None) -> bool:
        self.log.add(self.who, "delete", kind, name, grace_period_s)
        return await super().delete(kind, namespace, name, grace_period_s=grace_period_s)


class Controller:
    """The metadata controller as both operators see it (one shared state)."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.silent: set[int] = set()

    def view(self, who: str) -> Callable[[list[str]], Any]:
        controller = self

        class View:
            async def broker_silent(self, node_id: int) -> tuple[bool, str]:
                if node_id in controller.silent:
                    return True, f"the controller last heard broker {node_id} 30000 ms ago"
                return False, f"the controller heard broker {node_id} 100 ms ago"

            async def fence_broker(self, node_id: int) -> int:
                controller.log.add(who, "fence", node_id)
                return 3

            async def wal_recovery_pending(self, node_id: int) -> bool:
                return False

            async def offline_partitions(self) -> int:
                return 0

            async def drain_broker(self, node_id: int) -> None:
                controller.log.add(who, "drain", node_id)

            async def undrain_broker(self, node_id: int) -> None:
                controller.log.add(who, "undrain", node_id)

            async def broker_drained(self, node_id: int) -> bool:
                return True

            async def unregister_broker(self, node_id: int) -> None:
                controller.log.add(who, "unregister", node_id)

            async def close(self) -> None:
                pass

        return lambda urls, auth=None: View()


class Operator:
    """One operator replica: `operate()` in a thread with its own loop, stop and ready flags."""

    def __init__(self, who: str, url: str, log: Log, controller: Controller) -> None:
        self.who = who
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.errors: list[BaseException] = []
        self.context = OperatorContext(
            api_factory=lambda: TaggedApi(url, who, log),
            controller_api_factory=controller.view(who),
            settings=ReconcileSettings(poll_interval_s=0.1, pod_ready_timeout_s=WAIT_S, drain_timeout_s=5),
            retry_delay_s=0.2,
            status_interval_s=0.5,
            resync_interval_s=4.0,
            leader_election={
                "namespace": OPERATOR_NS,
                "identity": who,
                "lease_duration_s": 3.0,
                "renew_deadline_s": 2.0,
                "retry_period_s": 0.25,
            },
        )
        self.context.node_loss.interval_s = 0.3
        self.thread = threading.Thread(target=self._run, name=f"operator-{who}", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(
                operate([], True, None, context=self.context, stop_flag=self.stop_flag, ready_flag=self.ready_flag)
            )
        except BaseException as exc:
            self.errors.append(exc)

    def start(self) -> None:
        self.thread.start()
        assert self.ready_flag.wait(WAIT_S), f"operator {self.who} did not start: {self.errors}"

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), f"operator {self.who} did not stop"


class World:
    def __init__(self, tmp: Path, emulator_class: type) -> None:
        self.tmp = tmp
        self.emulator_class = emulator_class
        self.log = Log()
        self.controller = Controller(self.log)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kmock", daemon=True)
        self.operators: dict[str, Operator] = {}

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT_S)

    async def _start_kmock(self) -> str:
        self.emulator = self.emulator_class()
        install_cluster_crd(self.emulator)
        self.server = kmock.Server(self.emulator)
        await self.server.__aenter__()
        self.api = KubeApi(str(self.server.url))
        return str(self.server.url).rstrip("/")

    def start(self) -> None:
        self.thread.start()
        self.url = self.call(self._start_kmock())
        kubeconfig = self.tmp / "kubeconfig"
        self.kubeconfig_swap = KubeconfigSwap(kubeconfig, self.url, NS)
        for who in ("op-a", "op-b"):
            self.operators[who] = Operator(who, self.url, self.log, self.controller)
            self.operators[who].start()

    def stop(self) -> None:
        for op in self.operators.values():
            if op.thread.is_alive():
                op.stop()

        async def shutdown() -> None:
            await self.api.close()
            await self.server.__aexit__(None, None, None)

        self.call(shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)
        self.kubeconfig_swap.restore()

    def wait_for(self, what: str, check: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + WAIT_S
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {what}; last: {last!r}; log tail: {self.log.entries[-20:]}")

    # -- the objects kmock has no controllers for --------------------------------------------

    def holder(self) -> str:
        lease = self.call(self.api.get("Lease", OPERATOR_NS, "automq-operator")) or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def node(self, name: str, ready: bool, since: dt.datetime) -> None:
        status = {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "Unknown",
                    "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ]
        }
        if self.call(self.api.get("Node", "", name)) is None:
            body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": str(uuid.uuid4())}}
            self.call(self.api.create({**body, "spec": {}, "status": status}))
        else:
            self.call(self.api.patch("Node", "", name, {"status": status}))

    def cluster(self) -> ClusterRef:
        ref = ClusterRef("demo", NS, str(uuid.uuid4()))
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AutoMQCluster",
            "metadata": {"name": "demo", "namespace": NS, "uid": ref.uid, "generation": 1},
            "spec": SPEC,
        }
        self.call(self.api.create(body))
        template = builders.statefulset(parse_spec(SPEC), ref, "broker")["spec"]["template"]
        now = dt.datetime.now(dt.UTC)
        for i in range(2):
            self.node(f"n{i}", ready=True, since=now)
            meta = {**template["metadata"], "name": f"demo-broker-{i}", "namespace": NS, "uid": str(uuid.uuid4())}
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": {**template["spec"], "nodeName": f"n{i}"},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            }
            self.call(self.api.create(pod))
        return ref

    def step(self, ordinal: int) -> str:
        live = self.call(self.api.get("AutoMQCluster", NS, "demo")) or {}
        records = json.loads(((live.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION) or "{}")
        return str((records.get(str(ordinal)) or {}).get("step", ""))

    def degraded(self, reason: str) -> str:
        live = self.call(self.api.get("AutoMQCluster", NS, "demo")) or {}
        for c in (live.get("status") or {}).get("conditions") or []:
            if c["type"] == "Degraded" and c["status"] == "True" and c.get("reason") == reason:
                return str(c.get("message"))
        return ""

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.call(self.api.list("Event", NS))
            if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == "demo"
        ]


@pytest.fixture
def world(tmp_path: Path, emulator_class: type) -> Iterator[World]:
    w = World(tmp_path, emulator_class)
    w.start()
    try:
        yield w
    finally:
        w.stop()


@pytest.mark.timeout(240)
def test_two_operators_elect_one_leader_and_only_it_recovers_a_lost_node(world: World) -> None:
    leader = world.wait_for("a Lease holder", world.holder)
    follower = next(who for who in world.operators if who != leader)
    world.cluster()
    world.wait_for("the leader reconciles", lambda: world.log.acting("create", "StatefulSet"))

    # Node n1 is lost (NotReady well past the 1 s grace) and the controller stopped hearing broker 1.
    world.controller.silent.add(1)
    world.node("n1", ready=False, since=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5))
    world.wait_for("broker 1 served again", lambda: world.step(1) == "served")

    assert world.log.acting("fence", 1) == [leader]
    assert world.log.acting("delete", "Pod", "demo-broker-1") == [leader]
    assert world.log.acting("patch", "Node", "n1") == [leader]
    # The follower wrote nothing at all: not the cluster, not a child object, not a pod label.
    assert world.log.of(follower) == [], world.log.of(follower)
    # One NodeLost event for the incident (the Degraded condition does not post a second one).
    world.wait_for("Degraded NodeLost naming the node", lambda: "node n1" in world.degraded("NodeLost"))
    time.sleep(1.0)  # a few more status passes: none may post NodeLost again
    assert len(world.events("NodeLost")) == 1, [e["message"] for e in world.events("NodeLost")]

    # The leader stops (an upgrade, a drained node): it releases the Lease, the follower takes
    # over at once and alone handles the next lost node.
    world.operators[leader].stop()
    world.wait_for("the follower leads", lambda: world.holder() == follower)
    world.controller.silent.add(0)
    world.node("n0", ready=False, since=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5))
    world.wait_for("broker 0 served again", lambda: world.step(0) == "served")
    assert world.log.acting("fence", 0) == [follower]
    assert world.log.acting("delete", "Pod", "demo-broker-0") == [follower]
    assert world.log.acting("fence", 1) == [leader]  # broker 1's recovery was not run again


@pytest.mark.timeout(240)
def test_two_operators_delete_a_cluster_once_through_the_leader(world: World) -> None:
    leader = world.wait_for("a Lease holder", world.holder)
    follower = next(who for who in world.operators if who != leader)
    ref = world.cluster()
    world.call(world.api.patch("AutoMQCluster", NS, "demo", {"spec": {"deletionPolicy": "Delete"}}))
    labels = builders.selector_labels(ref, "broker")
    for name in ("wal-demo-broker-0", "wal-demo-broker-1"):
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS, "uid": str(uuid.uuid4()), "labels": labels},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }
        world.call(world.api.create(claim))
    world.wait_for(
        "both operators put their finalizer handling in place",
        lambda: (
            "automq.io/finalizer"
            in ((world.call(world.api.get("AutoMQCluster", NS, "demo")) or {}).get("metadata") or {}).get(
                "finalizers", []
            )
        ),
    )
    world.call(world.api.delete("AutoMQCluster", NS, "demo"))
    world.wait_for("demo gone", lambda: world.call(world.api.get("AutoMQCluster", NS, "demo")) is None)
    assert world.call(world.api.get("PersistentVolumeClaim", NS, "wal-demo-broker-0")) is None
    assert sorted(world.log.acting("delete", "PersistentVolumeClaim")) == [leader, leader]
    assert [e for e in world.log.of(follower) if e[0] == "delete"] == []
    # (Against kmock, kopf runs the delete handler a second time even with one operator; that
    # run finds nothing left to delete.)
    assert world.events("DataDeleted")


@pytest.mark.timeout(240)
def test_a_leader_cut_off_from_the_api_stops_and_the_other_takes_over_after_expiry(world: World) -> None:
    leader = world.wait_for("a Lease holder", world.holder)
    follower = next(who for who in world.operators if who != leader)
    world.cluster()
    world.wait_for("the leader reconciles", lambda: world.log.acting("create", "StatefulSet"))
    # The leader loses the API server (no clean release): its Lease is not renewed; the
    # follower waits a whole lease duration without a change, then takes over.
    leader_ctx = world.operators[leader].context
    leader_api = leader_ctx.kube()
    assert isinstance(leader_api, TaggedApi)
    leader_api.cut = True
    world.wait_for("the leader steps down at its renew deadline", lambda: not leader_ctx.is_leader())
    world.wait_for("the follower holds the Lease", lambda: world.holder() == follower)
    world.controller.silent.add(1)
    world.node("n1", ready=False, since=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5))
    world.wait_for("broker 1 served again", lambda: world.step(1) == "served")
    assert world.log.acting("fence", 1) == [follower]
    assert world.log.acting("delete", "Pod", "demo-broker-1") == [follower]
    # The old leader reaches the API again: it sees a live holder and stays a follower.
    leader_api.cut = False
    time.sleep(1.0)
    assert not leader_ctx.is_leader() and world.holder() == follower
    assert world.log.acting("fence", 1) == [follower]
