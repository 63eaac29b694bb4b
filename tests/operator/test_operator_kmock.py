"""The real kopf operator against the kmock Kubernetes emulator.

One emulator and one operator for the module (they run in threads with their own event loops);
the tests run in order on the clusters they create. What kmock lacks is supplied here, visibly:
  - a StatefulSet controller + kubelet (`PodSimulator`): creates each StatefulSet's pods from its
    current template, recreates deleted ones (not Ready at first, Ready shortly after), removes
    pods above `replicas`; it can make a pod crash-loop;
  - the scale subresource (`ScalingEmulator` in conftest.py): GET/PATCH .../scale mapped onto the paths the
    generated CRD declares, as the API server does;
  - uids on created objects (the tests give them).
The controller API is a recording fake: drains and undrains land in the same ordered log as
pod deletions, so the tests can assert the order of a rolling change.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kmock
import pytest
from kmock_emulator import KubeconfigSwap, install_cluster_crd

from automq.operator import builders
from automq.operator.builders import ClusterRef
from automq.operator.controller_api import ControllerApiError
from automq.operator.handlers import OperatorContext
from automq.operator.kube import KubeApi
from automq.operator.main import operate
from automq.operator.reconcile import ReconcileSettings
from automq.operator.spec import GROUP, PLURAL, VERSION, parse_spec

NS = "streaming"
WAIT_S = 60.0  # upper bound for a condition to become true (generous: CI machines are shared)


class Log:
    """An ordered, thread-safe record of what happened (drains, pod deletions, replicas)."""

    def __init__(self) -> None:
        self.entries: list[tuple] = []
        self.held: set[int] = set()  # brokers whose drain does not finish until released
        self.controller_down = False  # every controller call fails
        self.scram: list[Any] = []  # SCRAM credentials stored through the controller API
        self._lock = threading.Lock()

    def add(self, *entry: Any) -> None:
        with self._lock:
            self.entries.append(entry)

    def snapshot(self) -> list[tuple]:
        with self._lock:
            return list(self.entries)


class RecordingControllerApi:
    def __init__(self, log: Log, urls: list[str]) -> None:
        self.log = log
        self.urls = urls

    async def drain_broker(self, node_id: int) -> None:
        if self.log.controller_down:
            raise ControllerApiError(f"drain of broker {node_id} failed: controller unreachable")
        self.log.add("drain", node_id)

    async def undrain_broker(self, node_id: int) -> None:
        if self.log.controller_down:
            raise ControllerApiError(f"undrain of broker {node_id} failed: controller unreachable")
        self.log.add("undrain", node_id)

    async def broker_drained(self, node_id: int) -> bool:
        return node_id not in self.log.held

    async def unregister_broker(self, node_id: int) -> None:
        if self.log.controller_down:
            raise ControllerApiError(f"unregister of broker {node_id} failed: controller unreachable")
        self.log.add("unregister", node_id)

    # The brokers' own SCRAM credential (secure defaults: broker-to-broker calls authenticate).
    async def metadata(self) -> Any:
        if self.log.controller_down:
            raise ControllerApiError("cannot read cluster metadata: controller unreachable")
        return SimpleNamespace(scram_credentials=list(self.log.scram))

    async def alter_scram(self, deletions: list[Any], upsertions: list[Any]) -> None:
        self.log.scram = [c for c in self.log.scram if c.user not in {u.user for u in upsertions}] + upsertions
        self.log.add("scram", [u.user for u in upsertions])

    async def close(self) -> None:
        pass


class PodSimulator:
    """The StatefulSet controller and kubelet kmock does not have."""

    def __init__(self, api: KubeApi, log: Log) -> None:
        self.api = api
        self.log = log
        self.crashing: dict[str, str] = {}  # pod name -> template hash that crash-loops
        self.replicas: dict[str, int] = {}

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception as exc:  # keep simulating; a test will time out with the log
                self.log.add("simulator-error", repr(exc))
            await asyncio.sleep(0.2)

    async def step(self) -> None:
        for sts in await self.api.list("StatefulSet", NS):
            name = sts["metadata"]["name"]
            replicas = sts["spec"]["replicas"]
            if self.replicas.get(name) != replicas:
                self.log.add("replicas", name, replicas)
                self.replicas[name] = replicas
            template = sts["spec"]["template"]
            pods = {p["metadata"]["name"]: p for p in await self.api.list("Pod", NS, template["metadata"]["labels"])}
            for i in range(replicas):
                pod_name = f"{name}-{i}"
                pod = pods.get(pod_name)
                if pod is None:
                    if self.replicas.get(("seen", pod_name)):
                        self.log.add("deleted", pod_name)
                    self.replicas[("seen", pod_name)] = True  # type: ignore[index]
                    await self.api.create(self._pod(pod_name, template, ready=False))
                elif self.crashing.get(pod_name) == (pod["metadata"].get("annotations") or {}).get(
                    builders.TEMPLATE_HASH
                ):
                    if not (pod.get("status", {}).get("containerStatuses") or [{}])[0].get("state", {}).get("waiting"):
                        await self.api.patch("Pod", NS, pod_name, {"status": self._crashing_status(template)})
                elif not _is_ready(pod):
                    await self.api.patch(
                        "Pod",
                        NS,
                        pod_name,
                        {
                            "status": {
                                "phase": "Running",
                                "conditions": [{"type": "Ready", "status": "True"}],
                                "containerStatuses": None,
                            }
                        },
                    )
            for pod_name in pods:
                if int(pod_name.rsplit("-", 1)[1]) >= replicas:
                    await self.api.delete("Pod", NS, pod_name)
                    self.replicas.pop(("seen", pod_name), None)  # type: ignore[arg-type]
                    self.log.add("removed", pod_name)

    @staticmethod
    def _pod(name: str, template: dict[str, Any], ready: bool) -> dict[str, Any]:
        meta = copy.deepcopy(template["metadata"])
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**meta, "name": name, "namespace": NS, "uid": str(uuid.uuid4())},
            "spec": copy.deepcopy(template["spec"]),
            "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }

    @staticmethod
    def _crashing_status(template: dict[str, Any]) -> dict[str, Any]:
        container = template["spec"]["containers"][0]["name"]
        return {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": container,
                    "restartCount": 4,
                    "ready": False,
                    "state": {
                        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}
                    },
                }
            ],
        }


def _is_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


class Harness:
    """kmock + simulator in one thread, the operator in another; sync helpers for the tests."""

    def __init__(self, tmp: Path, emulator_class: type) -> None:
        self.tmp = tmp
        self.emulator_class = emulator_class
        self.log = Log()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kmock", daemon=True)
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.operator_errors: list[BaseException] = []

    def call(self, coro: Any, timeout: float = WAIT_S) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        self.thread.start()
        self.url = self.call(self._start_kmock())
        kubeconfig = self.tmp / "kubeconfig"
        self.kubeconfig_swap = KubeconfigSwap(kubeconfig, self.url, NS)
        self.context = OperatorContext(
            controller_api_factory=lambda urls, auth=None: RecordingControllerApi(self.log, urls),
            settings=ReconcileSettings(
                poll_interval_s=0.1, pod_ready_timeout_s=WAIT_S, drain_timeout_s=5, scale_in_wait_s=1
            ),
            retry_delay_s=0.2,
            status_interval_s=1.0,
            resync_interval_s=4.0,  # drift repair (a full pass of a quiet cluster) within seconds
        )
        self.operator_thread = threading.Thread(target=self._run_operator, name="operator", daemon=True)
        self.operator_thread.start()
        assert self.ready_flag.wait(WAIT_S), f"operator did not start: {self.operator_errors}"

    async def _start_kmock(self) -> str:
        self.emulator = self.emulator_class()
        install_cluster_crd(self.emulator)
        self.server = kmock.Server(self.emulator)
        await self.server.__aenter__()
        self.api = KubeApi(str(self.server.url))
        self.simulator = PodSimulator(self.api, self.log)
        self.simulator_task = asyncio.get_running_loop().create_task(self.simulator.run())
        return str(self.server.url).rstrip("/")

    def _run_operator(self) -> None:
        try:
            asyncio.run(
                operate([], True, None, context=self.context, stop_flag=self.stop_flag, ready_flag=self.ready_flag)
            )
        except BaseException as exc:
            self.operator_errors.append(exc)

    def stop(self) -> None:
        self.stop_flag.set()
        self.operator_thread.join(WAIT_S)

        async def shutdown() -> None:
            self.simulator_task.cancel()
            await self.api.close()
            await self.server.__aexit__(None, None, None)

        self.call(shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)
        self.kubeconfig_swap.restore()

    # -- helpers for tests -------------------------------------------------------------------

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.call(self.api.get(kind, NS, name))

    def list(self, kind: str) -> list[dict[str, Any]]:
        return self.call(self.api.list(kind, NS))

    def create_cluster(self, name: str, spec: dict[str, Any]) -> ClusterRef:
        uid = str(uuid.uuid4())
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AutoMQCluster",
            "metadata": {"name": name, "namespace": NS, "uid": uid, "generation": 1, "resourceVersion": "1"},
            "spec": spec,
        }
        self.call(self.api.create(body))
        return ClusterRef(name, NS, uid)

    def patch_spec(self, name: str, spec_patch: dict[str, Any]) -> None:
        self.call(self.api.patch("AutoMQCluster", NS, name, {"spec": spec_patch}))

    def request(self, method: str, path: str, body: Any = None) -> Any:
        return self.call(self.api._request(method, path, body, "application/merge-patch+json"))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.list("Event") if e.get("involvedObject", {}).get("name") == name]

    def wait_for(self, what: str, check: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + WAIT_S
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except (KeyError, TypeError, IndexError) as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(0.05)
        pytest.fail(
            f"timed out waiting for {what}; last: {last!r}; operator errors: {self.operator_errors}; log tail: {self.log.snapshot()[-20:]}"
        )


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return c
    return {}


@pytest.fixture(scope="module")
def k8s(tmp_path_factory: pytest.TempPathFactory, emulator_class: type):
    harness = Harness(tmp_path_factory.mktemp("kmock"), emulator_class)
    harness.start()
    try:
        yield harness
    finally:
        harness.stop()


SPEC = {
    "controller": {"replicas": 2},
    "broker": {"replicas": 3, "wal": {"kind": "volume", "size": "5Gi"}, "resources": {"requests": {"cpu": "1"}}},
    "objectStore": {"bucket": "automq-data", "endpoint": "http://seaweedfs:8333", "pathStyle": True},
    "deletionPolicy": "Delete",
}


def _ready(k8s: Harness, name: str) -> dict[str, Any] | None:
    obj = k8s.get("AutoMQCluster", name)
    return obj if condition(obj, "Ready").get("status") == "True" else None


# ------------------------------------------------------------------------------------------


def test_create_builds_every_object_with_owner_references(k8s: Harness) -> None:
    ref = k8s.create_cluster("demo", SPEC)
    spec = parse_spec(SPEC)
    expected = builders.desired_objects(spec, ref)
    for want in expected:
        live = k8s.wait_for(
            f"{want['kind']} {want['metadata']['name']}", lambda: k8s.get(want["kind"], want["metadata"]["name"])
        )
        assert live["metadata"]["ownerReferences"] == [ref.owner_reference()]
        for key in ("spec", "data", "rules", "roleRef", "subjects"):
            if key in want:
                assert live[key] == want[key], (want["kind"], key)
    cluster = k8s.wait_for("cluster Ready", lambda: _ready(k8s, "demo"))
    status = cluster["status"]
    assert status["brokers"] == {"desired": 3, "replicas": 3, "ready": 3, "updated": 3, "summary": "3/3"}
    assert status["controllers"]["summary"] == "2/2"
    assert status["bootstrap"] == "demo-bootstrap.streaming.svc:9092"
    assert status["brokerSelector"] == builders.broker_selector(ref)
    assert condition(cluster, "Degraded")["status"] == "False"
    assert condition(cluster, "Progressing")["status"] == "False"
    assert "automq.io/finalizer" in cluster["metadata"]["finalizers"]
    k8s.wait_for("ClusterReady event", lambda: any(e["reason"] == "ClusterReady" for e in k8s.events("demo")))
    # Nothing was drained or restarted while creating.
    assert [e for e in k8s.log.snapshot() if e[0] in ("drain", "deleted")] == []
    # Secure defaults: the brokers' own SCRAM user was stored once a controller was Ready.
    assert [e for e in k8s.log.snapshot() if e[0] == "scram"] == [("scram", ["__automq-broker"])]
    # ... and the controller API is https with a certificate of the cluster CA (the ConfigMap's
    # https controller_urls were compared above with what the builders render).
    assert cluster["metadata"]["annotations"]["automq.io/controller-api-scheme"] == "https"
    assert status["controllerEndpoint"] == "https://demo-controllers.streaming.svc:9093"
    certs = k8s.get("Secret", "demo-controller-certs")
    assert set(certs["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert certs["data"]["ca.crt"] == k8s.get("Secret", "demo-cluster-ca-cert")["data"]["ca.crt"]
    assert certs["metadata"]["ownerReferences"] == [ref.owner_reference()]


def test_config_change_rolls_brokers_one_at_a_time_then_controllers(k8s: Harness) -> None:
    before = len(k8s.log.snapshot())
    k8s.patch_spec("demo", {"config": {"kafka.num_partitions": "12"}})
    k8s.wait_for(
        "ConfigMap with the override",
        lambda: "num_partitions: 12" in k8s.get("ConfigMap", "demo-config")["data"]["broker.yaml"],
    )

    def rolled() -> bool:
        deleted = [e for e in k8s.log.snapshot()[before:] if e[0] == "deleted"]
        return len(deleted) == 5 and _ready(k8s, "demo") is not None

    k8s.wait_for("all five pods restarted and the cluster Ready", rolled)
    steps = [e for e in k8s.log.snapshot()[before:] if e[0] in ("drain", "undrain", "deleted")]
    assert steps == [
        ("drain", 0),
        ("deleted", "demo-broker-0"),
        ("undrain", 0),
        ("drain", 1),
        ("deleted", "demo-broker-1"),
        ("undrain", 1),
        ("drain", 2),
        ("deleted", "demo-broker-2"),
        ("undrain", 2),
        ("deleted", "demo-controller-0"),
        ("deleted", "demo-controller-1"),
    ]
    want = builders.template_hash(k8s.get("StatefulSet", "demo-broker"))
    for i in range(3):
        assert k8s.get("Pod", f"demo-broker-{i}")["metadata"]["annotations"][builders.TEMPLATE_HASH] == want
    events = {e["reason"] for e in k8s.events("demo")}
    assert {"RollingRestart", "PodRestarted"} <= events
    assert k8s.get("AutoMQCluster", "demo")["status"]["drainedBrokers"] == []


def test_broker_resources_change_restarts_only_brokers(k8s: Harness) -> None:
    before = len(k8s.log.snapshot())
    k8s.patch_spec("demo", {"broker": {"resources": {"requests": {"cpu": "2"}}}})

    def rolled() -> bool:
        deleted = [e for e in k8s.log.snapshot()[before:] if e[0] == "deleted"]
        return len(deleted) == 3 and _ready(k8s, "demo") is not None

    k8s.wait_for("three brokers restarted", rolled)
    deleted = [e[1] for e in k8s.log.snapshot()[before:] if e[0] == "deleted"]
    assert deleted == ["demo-broker-0", "demo-broker-1", "demo-broker-2"]
    container = k8s.get("StatefulSet", "demo-broker")["spec"]["template"]["spec"]["containers"][0]
    # The spec's cpu request; memory, which the spec leaves out, keeps the broker default.
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}


def test_scale_subresource_scales_in_after_draining_and_back_out(k8s: Harness) -> None:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}/demo/scale"
    scale = k8s.request("GET", base)
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert (
        scale["status"]["selector"]
        == "app.kubernetes.io/component=broker,app.kubernetes.io/instance=demo,app.kubernetes.io/name=automq"
    )

    before = len(k8s.log.snapshot())
    k8s.request("PATCH", base, {"spec": {"replicas": 1}})
    k8s.wait_for(
        "brokers scaled to 1 and Ready",
        lambda: _ready(k8s, "demo") and k8s.get("AutoMQCluster", "demo")["status"]["brokers"]["replicas"] == 1,
    )
    entries = [e for e in k8s.log.snapshot()[before:] if e[0] in ("drain", "replicas", "removed")]
    drains = [e for e in entries if e[0] == "drain"]
    assert sorted(d[1] for d in drains) == [1, 2]
    shrink = entries.index(("replicas", "demo-broker", 1))
    assert all(entries.index(d) < shrink for d in drains), entries  # drained before the StatefulSet shrank
    assert k8s.get("StatefulSet", "demo-broker")["spec"]["replicas"] == 1
    assert k8s.request("GET", base)["status"]["replicas"] == 1
    assert k8s.get("AutoMQCluster", "demo")["status"]["drainedBrokers"] == []  # nothing left drained
    # Once their pods are gone, the removed brokers are unregistered at the controller.
    log = k8s.log.snapshot()[before:]
    for node_id in (1, 2):
        assert log.index(("removed", f"demo-broker-{node_id}")) < log.index(("unregister", node_id)), log
    assert any(e["reason"] == "BrokerUnregistered" for e in k8s.events("demo"))

    k8s.request("PATCH", base, {"spec": {"replicas": 2}})
    k8s.wait_for(
        "brokers scaled to 2 and Ready",
        lambda: _ready(k8s, "demo") and k8s.get("AutoMQCluster", "demo")["status"]["brokers"]["ready"] == 2,
    )
    assert k8s.get("StatefulSet", "demo-broker")["spec"]["replicas"] == 2
    assert any(e["reason"] == "ScalingOut" for e in k8s.events("demo"))


def test_crash_looping_pod_is_reported_degraded(k8s: Harness) -> None:
    k8s.simulator.crashing["demo-broker-1"] = k8s.get("Pod", "demo-broker-1")["metadata"]["annotations"][
        builders.TEMPLATE_HASH
    ]
    k8s.call(
        k8s.api.patch("Pod", NS, "demo-broker-1", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    )
    cluster = k8s.wait_for(
        "Degraded CrashLoopBackOff",
        lambda: (
            (c := k8s.get("AutoMQCluster", "demo"))
            and condition(c, "Degraded").get("reason") == "CrashLoopBackOff"
            and c
        ),
    )
    assert condition(cluster, "Degraded")["status"] == "True"
    assert "demo-broker-1" in condition(cluster, "Degraded")["message"]
    assert condition(cluster, "Ready")["status"] == "False"
    k8s.wait_for(
        "CrashLoopBackOff warning event",
        lambda: any(e["reason"] == "CrashLoopBackOff" and e["type"] == "Warning" for e in k8s.events("demo")),
    )
    k8s.simulator.crashing.pop("demo-broker-1")
    k8s.call(k8s.api.patch("Pod", NS, "demo-broker-1", {"status": {"containerStatuses": None}}))
    cluster = k8s.wait_for("Ready again", lambda: _ready(k8s, "demo"))
    assert condition(cluster, "Degraded")["status"] == "False"


def test_crash_looping_controller_is_restarted_first_by_a_fix(k8s: Harness) -> None:
    """Outdated pods that are not Ready go first: a broken controller does not wait for brokers."""
    k8s.simulator.crashing["demo-controller-1"] = k8s.get("Pod", "demo-controller-1")["metadata"]["annotations"][
        builders.TEMPLATE_HASH
    ]
    k8s.call(
        k8s.api.patch(
            "Pod", NS, "demo-controller-1", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
        )
    )
    k8s.wait_for(
        "controller crash loop reported",
        lambda: "demo-controller-1" in condition(k8s.get("AutoMQCluster", "demo"), "Degraded").get("message", ""),
    )
    before = len(k8s.log.snapshot())
    k8s.patch_spec("demo", {"config": {"kafka.num_partitions": "6"}})  # the "fix": both roles outdated
    k8s.wait_for(
        "Ready after the fix",
        lambda: len([e for e in k8s.log.snapshot()[before:] if e[0] == "deleted"]) == 4 and _ready(k8s, "demo"),
    )
    steps = [e for e in k8s.log.snapshot()[before:] if e[0] in ("drain", "undrain", "deleted")]
    assert steps == [
        ("deleted", "demo-controller-1"),
        ("drain", 0),
        ("deleted", "demo-broker-0"),
        ("undrain", 0),
        ("drain", 1),
        ("deleted", "demo-broker-1"),
        ("undrain", 1),
        ("deleted", "demo-controller-0"),
    ]
    k8s.simulator.crashing.clear()


def test_no_broker_restarts_while_the_controller_cannot_drain(k8s: Harness) -> None:
    k8s.log.controller_down = True
    before = len(k8s.log.snapshot())
    k8s.patch_spec("demo", {"broker": {"resources": {"requests": {"cpu": "1"}}}})
    cluster = k8s.wait_for(
        "ControllerUnavailable",
        lambda: (
            (c := k8s.get("AutoMQCluster", "demo"))
            and condition(c, "Degraded").get("reason") == "ControllerUnavailable"
            and c
        ),
    )
    assert "cannot drain broker 0 before restarting demo-broker-0" in condition(cluster, "Degraded")["message"]
    assert condition(cluster, "Progressing")["status"] == "True"
    assert [e for e in k8s.log.snapshot()[before:] if e[0] == "deleted"] == []  # nothing restarted undrained
    assert cluster["status"]["drainedBrokers"] == [0]  # the drain may have landed: undrain it later

    k8s.log.controller_down = False
    k8s.wait_for(
        "rolled once the controller answers",
        lambda: len([e for e in k8s.log.snapshot()[before:] if e[0] == "deleted"]) == 2 and _ready(k8s, "demo"),
    )
    steps = [e for e in k8s.log.snapshot()[before:] if e[0] in ("drain", "undrain", "deleted")]
    if steps[:1] == [("undrain", 0)]:
        steps = steps[1:]  # a status refresh may first undrain the broker whose drain may have landed
    assert steps == [
        ("drain", 0),
        ("deleted", "demo-broker-0"),
        ("undrain", 0),
        ("drain", 1),
        ("deleted", "demo-broker-1"),
        ("undrain", 1),
    ]


def _spark_job(k8s: Harness, cron: dict[str, Any], name: str, condition: str, at: str) -> None:
    """What the CronJob controller does on a schedule tick: a Job from the jobTemplate (its
    labels, an owner reference), here already finished with `condition`."""
    template = cron["spec"]["jobTemplate"]
    status: dict[str, Any] = {
        "startTime": at,
        "conditions": [{"type": condition, "status": "True", "lastTransitionTime": at}],
    }
    if condition == "Failed":
        status["conditions"][0].update(
            reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit"
        )
    k8s.call(
        k8s.api.create(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": name,
                    "namespace": NS,
                    "uid": str(uuid.uuid4()),
                    "labels": dict(template["metadata"]["labels"]),
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "CronJob",
                            "name": cron["metadata"]["name"],
                            "uid": "x",
                            "controller": True,
                        }
                    ],
                },
                "spec": copy.deepcopy(template["spec"]),
                "status": status,
            }
        )
    )


def test_spark_jobs_become_cron_jobs_with_run_status_and_go_when_disabled(k8s: Harness) -> None:
    k8s.patch_spec(
        "demo",
        {
            "compaction": {"enabled": True, "schedule": "*/15 * * * *"},
            "lakeIngestion": {"enabled": True, "topics": ["orders"], "catalogUri": "https://iceberg-rest:8181"},
        },
    )
    crons = k8s.wait_for(
        "three CronJobs",
        lambda: (
            [c for c in (k8s.get("CronJob", n) for n in ("demo-compact", "demo-keycompact", "demo-ingest")) if c]
            if all(k8s.get("CronJob", n) for n in ("demo-compact", "demo-keycompact", "demo-ingest"))
            else None
        ),
    )
    uid = k8s.get("AutoMQCluster", "demo")["metadata"]["uid"]
    for cron in crons:
        assert cron["metadata"]["ownerReferences"][0]["uid"] == uid
        assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert crons[0]["spec"]["schedule"] == "*/15 * * * *"
    assert k8s.get("ServiceAccount", "demo-spark")["automountServiceAccountToken"] is False
    k8s.wait_for(
        "sparkJobs in status",
        lambda: (
            set(k8s.get("AutoMQCluster", "demo")["status"].get("sparkJobs") or {})
            == {"compaction", "keyCompaction", "lakeIngestion"}
        ),
    )
    assert "notImplemented" not in k8s.get("AutoMQCluster", "demo")["status"]

    # Runs finish (the CronJob controller's part): the status says when, a failure is an event.
    _spark_job(k8s, crons[0], "demo-compact-1", "Complete", "2026-01-01T10:00:00Z")
    _spark_job(k8s, crons[0], "demo-compact-2", "Failed", "2026-01-01T10:15:00Z")
    compaction = k8s.wait_for(
        "compaction run status",
        lambda: (s := k8s.get("AutoMQCluster", "demo")["status"]["sparkJobs"]["compaction"]).get("lastFailedJob") and s,
    )
    assert compaction["lastSuccessfulTime"] == "2026-01-01T10:00:00Z"
    assert compaction["lastFailureTime"] == "2026-01-01T10:15:00Z"
    assert compaction["lastFailedJob"] == "demo-compact-2"
    assert "BackoffLimitExceeded" in compaction["lastFailureMessage"]
    assert compaction["cronJob"] == "demo-compact" and compaction["schedule"] == "*/15 * * * *"
    k8s.wait_for(
        "SparkJobFailed event",
        lambda: any(e["reason"] == "SparkJobFailed" and "demo-compact-2" in e["message"] for e in k8s.events("demo")),
    )
    ingest = k8s.get("AutoMQCluster", "demo")["status"]["sparkJobs"]["lakeIngestion"]
    assert ingest.get("lastFailedJob") is None and ingest.get("lastSuccessfulTime") is None  # its own Jobs only

    k8s.patch_spec("demo", {"lakeIngestion": {"enabled": False}, "compaction": {"keys": {"enabled": False}}})
    k8s.wait_for(
        "disabled jobs' CronJobs deleted",
        lambda: k8s.get("CronJob", "demo-ingest") is None and k8s.get("CronJob", "demo-keycompact") is None,
    )
    assert k8s.get("CronJob", "demo-compact") is not None
    k8s.wait_for(
        "disabled jobs gone from status",
        lambda: set(k8s.get("AutoMQCluster", "demo")["status"].get("sparkJobs") or {}) == {"compaction"},
    )
    failed_events = [e for e in k8s.events("demo") if e["reason"] == "SparkJobFailed"]
    assert len(failed_events) == 1, failed_events  # once per failed run, not once per pass

    # executor pods: the drivers' Role grants pod management, the template ConfigMap appears,
    # the CronJob runs Spark on Kubernetes; back to local executors, the Role grants nothing
    k8s.patch_spec("demo", {"compaction": {"executors": 2}})
    role = k8s.wait_for("Spark driver Role", lambda: (r := k8s.get("Role", "demo-spark")) and r.get("rules") and r)
    assert {"pods", "configmaps"} == {res for rule in role["rules"] for res in rule["resources"]}
    assert k8s.get("RoleBinding", "demo-spark")["subjects"][0]["name"] == "demo-spark"
    assert "compaction.json" in k8s.get("ConfigMap", "demo-spark-executors")["data"]
    k8s.wait_for(
        "CronJob on Spark on Kubernetes",
        lambda: (
            "k8s://"
            in " ".join(
                k8s.get("CronJob", "demo-compact")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0][
                    "args"
                ]
            )
        ),
    )
    k8s.patch_spec("demo", {"compaction": {"executors": 0}})
    k8s.wait_for("Spark driver Role emptied", lambda: k8s.get("Role", "demo-spark")["rules"] == [])
    k8s.patch_spec("demo", {"compaction": {"enabled": False}})
    k8s.wait_for("compaction CronJob deleted", lambda: k8s.get("CronJob", "demo-compact") is None)
    assert k8s.get("StatefulSet", "demo-broker")["spec"]["replicas"] == 2  # nothing else changed


def test_scale_in_waits_for_the_drain(k8s: Harness) -> None:
    k8s.log.held.add(1)
    before = len(k8s.log.snapshot())
    k8s.patch_spec("demo", {"broker": {"replicas": 1}})
    cluster = k8s.wait_for(
        "ScalingIn in progress",
        lambda: (
            (c := k8s.get("AutoMQCluster", "demo")) and condition(c, "Progressing").get("reason") == "ScalingIn" and c
        ),
    )
    assert "draining brokers [1]" in condition(cluster, "Progressing")["message"]
    assert ("drain", 1) in k8s.log.snapshot()[before:]
    assert k8s.get("StatefulSet", "demo-broker")["spec"]["replicas"] == 2  # not before the drain is done
    assert cluster["status"]["drainedBrokers"] == [1]

    k8s.log.held.discard(1)
    k8s.wait_for(
        "scaled in", lambda: k8s.get("StatefulSet", "demo-broker")["spec"]["replicas"] == 1 and _ready(k8s, "demo")
    )
    assert k8s.get("AutoMQCluster", "demo")["status"]["drainedBrokers"] == []


def test_wal_change_is_refused_without_restarting_anything(k8s: Harness) -> None:
    before = len(k8s.log.snapshot())
    resources = k8s.get("StatefulSet", "demo-broker")["spec"]["template"]["spec"]["containers"][0]["resources"]
    k8s.patch_spec("demo", {"broker": {"wal": {"size": "50Gi"}, "resources": {"requests": {"cpu": "3"}}}})
    cluster = k8s.wait_for(
        "WalChangeNotSupported",
        lambda: (
            (c := k8s.get("AutoMQCluster", "demo"))
            and condition(c, "Degraded").get("reason") == "WalChangeNotSupported"
            and c
        ),
    )
    assert "spec.broker.wal" in condition(cluster, "Degraded")["message"]
    sts = k8s.get("StatefulSet", "demo-broker")
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert sts["spec"]["template"]["spec"]["containers"][0]["resources"] == resources  # held back too
    k8s.wait_for(
        "WalChangeNotSupported event", lambda: any(e["reason"] == "WalChangeNotSupported" for e in k8s.events("demo"))
    )
    assert [e for e in k8s.log.snapshot()[before:] if e[0] in ("drain", "deleted")] == []

    k8s.patch_spec("demo", {"broker": {"wal": {"size": "5Gi"}, "resources": resources}})
    k8s.wait_for("Ready after the revert", lambda: _ready(k8s, "demo"))


def test_scale_to_zero_does_not_wait_for_a_drain(k8s: Harness) -> None:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}/demo/scale"
    k8s.log.held.add(0)  # a drain of the last broker could never finish
    before = len(k8s.log.snapshot())
    k8s.request("PATCH", base, {"spec": {"replicas": 0}})
    k8s.wait_for(
        "no brokers", lambda: k8s.get("StatefulSet", "demo-broker")["spec"]["replicas"] == 0 and _ready(k8s, "demo")
    )
    assert ("drain", 0) not in k8s.log.snapshot()[before:]
    k8s.wait_for(
        "ScaledToZero warning",
        lambda: any(e["reason"] == "ScaledToZero" and e["type"] == "Warning" for e in k8s.events("demo")),
    )
    k8s.log.held.clear()
    k8s.request("PATCH", base, {"spec": {"replicas": 1}})
    k8s.wait_for(
        "one broker again",
        lambda: _ready(k8s, "demo") and k8s.get("AutoMQCluster", "demo")["status"]["brokers"]["ready"] == 1,
    )


def test_invalid_spec_is_reported_and_recovers_when_fixed(k8s: Harness) -> None:
    def degraded_message(name: str, fragment: str) -> Any:
        c = k8s.get("AutoMQCluster", name)
        message = condition(c, "Degraded").get("message", "")
        return condition(c, "Degraded").get("reason") == "InvalidSpec" and fragment in message and c

    k8s.create_cluster(
        "broken",
        {
            "objectStore": {"bucket": "automq-data"},
            "broker": {"wal": {"kind": "volume"}},
            "config": {"kafka.num_partition": "3"},
        },
    )
    cluster = k8s.wait_for(
        "InvalidSpec status",
        lambda: degraded_message("broken", "spec.broker.wal.size is required when spec.broker.wal.kind is volume"),
    )
    assert condition(cluster, "Degraded")["status"] == "True"
    assert condition(cluster, "Ready")["status"] == "False" and condition(cluster, "Ready")["reason"] == "InvalidSpec"
    event = k8s.wait_for("InvalidSpec event", lambda: [e for e in k8s.events("broken") if e["reason"] == "InvalidSpec"])
    assert event[0]["type"] == "Warning" and "wal.size" in event[0]["message"]
    assert k8s.get("StatefulSet", "broken-broker") is None  # nothing built from a bad spec

    # Half fixed: the next problem is named.
    k8s.patch_spec("broken", {"broker": {"wal": {"size": "1Gi"}}})
    k8s.wait_for(
        "config key named",
        lambda: degraded_message("broken", "spec.config['kafka.num_partition']: unknown node config key"),
    )
    assert k8s.get("StatefulSet", "broken-broker") is None

    k8s.patch_spec("broken", {"config": {"kafka.num_partition": None, "kafka.num_partitions": "3"}})
    k8s.wait_for("fixed cluster Ready", lambda: _ready(k8s, "broken"))
    assert (
        k8s.get("StatefulSet", "broken-broker")["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"][
            "storage"
        ]
        == "1Gi"
    )


def test_objects_changed_by_hand_are_put_back(k8s: Harness) -> None:
    k8s.call(k8s.api.delete("Service", NS, "demo-bootstrap"))
    k8s.call(k8s.api.patch("ConfigMap", NS, "demo-config", {"data": {"broker.yaml": "edited by hand"}}))
    k8s.wait_for("Service recreated", lambda: k8s.get("Service", "demo-bootstrap"))
    k8s.wait_for(
        "ConfigMap restored", lambda: "node_id: 0" in k8s.get("ConfigMap", "demo-config")["data"]["broker.yaml"]
    )
    assert k8s.get("Service", "demo-bootstrap")["metadata"]["ownerReferences"][0]["name"] == "demo"


def test_delete_runs_the_finalizer(k8s: Harness) -> None:
    # kmock has no volume controller: make the claims the StatefulSet controller would have made.
    labels = builders.selector_labels(ClusterRef("demo", NS, ""), "broker")
    for name in ("wal-demo-broker-0", "wal-demo-broker-1"):
        k8s.call(
            k8s.api.create(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": name, "namespace": NS, "uid": str(uuid.uuid4()), "labels": labels},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
                }
            )
        )
    for name in ("wal-broken-broker-0",):
        k8s.call(
            k8s.api.create(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {
                        "name": name,
                        "namespace": NS,
                        "uid": str(uuid.uuid4()),
                        "labels": builders.selector_labels(ClusterRef("broken", NS, ""), "broker"),
                    },
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                }
            )
        )

    k8s.call(k8s.api.delete("AutoMQCluster", NS, "demo"))
    k8s.wait_for("demo gone (finalizer removed)", lambda: k8s.get("AutoMQCluster", "demo") is None)
    assert k8s.get("PersistentVolumeClaim", "wal-demo-broker-0") is None  # deletionPolicy: Delete
    assert k8s.get("PersistentVolumeClaim", "wal-demo-broker-1") is None
    assert k8s.get("PersistentVolumeClaim", "wal-broken-broker-0") is not None  # another cluster's data

    k8s.call(k8s.api.delete("AutoMQCluster", NS, "broken"))  # deletionPolicy defaults to Retain
    k8s.wait_for("broken gone", lambda: k8s.get("AutoMQCluster", "broken") is None)
    assert k8s.get("PersistentVolumeClaim", "wal-broken-broker-0") is not None
    reasons = {e["reason"] for e in k8s.events("demo") + k8s.events("broken")}
    assert {"DataDeleted", "DataRetained"} <= reasons
    assert k8s.operator_errors == []


def test_automq_operator_command_serves_liveness_and_stops_on_sigterm(k8s: Harness) -> None:
    """The console entry point in its own process: KUBECONFIG login, liveness, clean SIGTERM."""
    import signal
    import socket
    import subprocess
    import sys
    import urllib.request

    assert k8s.list("AutoMQCluster") == []  # runs last: nothing for a second operator to touch
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "KUBECONFIG": str(k8s.tmp / "kubeconfig")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "automq.broker.cli", "operator", "-A", "--liveness", f"http://127.0.0.1:{port}/healthz"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                return False

        k8s.wait_for("liveness endpoint", healthy)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_cluster_an_older_operator_made_keeps_plaintext_and_is_told_so(k8s: Harness) -> None:
    """Upgrade safety of the secure defaults: a cluster whose node ConfigMap exists before this
    operator first sees it (an older operator made it) is pinned `legacy`: no listener in its spec
    still means PLAINTEXT, no controller token, no NetworkPolicies, and a Warning says how to move."""
    old_ref = ClusterRef("old", NS, "not-yet")
    legacy = parse_spec(SPEC, legacy=True)
    before = builders.config_map(legacy, old_ref)  # what the older operator wrote
    k8s.call(k8s.api.create(before))
    ref = k8s.create_cluster("old", SPEC)
    cluster = k8s.wait_for("old cluster Ready", lambda: _ready(k8s, "old"))
    assert cluster["metadata"]["annotations"]["automq.io/security-defaults"] == "legacy"
    assert k8s.get("ConfigMap", "old-config")["data"] == before["data"]  # unchanged: nothing rolls
    assert "security_protocol: PLAINTEXT" in before["data"]["broker.yaml"]
    assert k8s.get("NetworkPolicy", "old-broker") is None
    assert k8s.get("Secret", "old-controller-token") is None and k8s.get("Secret", "old-cluster-ca") is None
    assert cluster["status"]["listeners"][0]["securityProtocol"] == "PLAINTEXT"
    warning = k8s.wait_for(
        "SecurityDefaultsLegacy event",
        lambda: [e for e in k8s.events("old") if e["reason"] == "SecurityDefaultsLegacy"],
    )
    assert "spec.listeners" in warning[0]["message"]
    assert ref.name == "old"

    # One an operator with secure defaults but http controllers made keeps http controllers.
    mid_ref = ClusterRef("mid", NS, "not-yet")
    k8s.call(k8s.api.create(builders.config_map(parse_spec(SPEC, controller_http=True), mid_ref)))
    mid = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AutoMQCluster",
        "metadata": {
            "name": "mid",
            "namespace": NS,
            "uid": str(uuid.uuid4()),
            "generation": 1,
            "resourceVersion": "1",
            "annotations": {"automq.io/security-defaults": "secure"},
        },
        "spec": SPEC,
    }
    mid_before = k8s.call(k8s.api.get("ConfigMap", NS, "mid-config"))["data"]
    k8s.call(k8s.api.create(mid))
    k8s.wait_for("mid cluster Ready", lambda: _ready(k8s, "mid"))
    assert k8s.get("AutoMQCluster", "mid")["metadata"]["annotations"]["automq.io/controller-api-scheme"] == "http"
    assert k8s.get("ConfigMap", "mid-config")["data"] == mid_before  # nothing rolls
    assert k8s.get("Secret", "mid-controller-certs") is None

    # A new cluster next to it gets the secure defaults.
    k8s.create_cluster("fresh", SPEC)
    k8s.wait_for(
        "fresh cluster pinned",
        lambda: (
            (k8s.get("AutoMQCluster", "fresh") or {})
            .get("metadata", {})
            .get("annotations", {})
            .get("automq.io/security-defaults")
            == "secure"
        ),
    )
    k8s.wait_for("fresh NetworkPolicy", lambda: k8s.get("NetworkPolicy", "fresh-broker"))
    assert (
        "SASL_SSL"
        in k8s.wait_for("fresh ConfigMap", lambda: k8s.get("ConfigMap", "fresh-config"))["data"]["broker.yaml"]
    )


def test_cert_manager_issuer_gets_certificates_owned_by_the_cluster(k8s: Harness) -> None:
    for plural, kind in (("certificates", "Certificate"), ("issuers", "Issuer")):  # cert-manager's CRDs
        info = k8s.emulator.resources[f"cert-manager.io/v1/{plural}"]
        info.kind, info.namespaced = kind, True
        info.verbs = {"get", "list", "watch", "create", "patch", "update", "delete"}
    k8s.create_cluster("cm", {**SPEC, "security": {"certificates": {"issuer": "cert-manager", "renewalDays": 20}}})
    certificate = k8s.wait_for("broker Certificate", lambda: k8s.get("Certificate", "cm-broker-certs"))
    assert certificate["spec"]["secretName"] == "cm-broker-certs" and certificate["spec"]["renewBefore"] == "480h"
    assert "*.cm-brokers.streaming.svc" in certificate["spec"]["dnsNames"]
    controller = k8s.wait_for("controller Certificate", lambda: k8s.get("Certificate", "cm-controller-certs"))
    assert controller["spec"]["dnsNames"][0] == "*.cm-controllers.streaming.svc"
    assert controller["spec"]["issuerRef"] == certificate["spec"]["issuerRef"]
    assert k8s.get("Issuer", "cm-cluster-ca")["spec"] == {"ca": {"secretName": "cm-cluster-ca"}}
    assert certificate["metadata"]["ownerReferences"][0]["name"] == "cm"
    assert k8s.get("Secret", "cm-cluster-ca") is None  # cert-manager makes it, not the operator
