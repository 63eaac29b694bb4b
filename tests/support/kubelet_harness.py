"""A kubelet (and StatefulSet controller, scheduler, node controller) for kmock: the real operator's
StatefulSets become real controller and broker processes on this machine.

kmock emulates the Kubernetes API but runs nothing. `KubeletHarness` starts kmock
(`KubeletEmulator`), the real kopf operator (in a thread of this process, as
tests/operator/test_operator_kmock.py does), and a loop that plays the missing parts:

  StatefulSet controller  for every StatefulSet in the namespace: a Pod per ordinal below
                          `spec.replicas` from the current template (re-created after a delete,
                          once the old one is gone); Pods at or above `replicas` are deleted.
  scheduler               each Pod gets `spec.nodeName`: the Node it had before if that is Ready,
                          else a new Node object (`node-<n>`, labels hostname and
                          topology.kubernetes.io/zone cycling over `zones`).
  kubelet                 runs the init step (`automq.operator.podconfig.render_pod_config`, the
                          code the init container runs, on the ConfigMap and the pod env with
                          fieldRef/secretKeyRef/$(VAR) resolved), then the main container as
                          `python -m automq.broker.cli <args>`; probes /readyz and writes the Pod
                          status (phase, Ready, podIP, containerStatuses with restartCount); restarts
                          a process that exits (back-off); on delete: Ready=False, SIGTERM, SIGKILL
                          after the pod's terminationGracePeriodSeconds, then the Pod goes. Graceful
                          deletion is real: the harness's finalizer keeps a deleted Pod (with its
                          deletionTimestamp) until its process stopped; a force delete
                          (gracePeriodSeconds=0) removes it at once.
  node controller         `node_down(node)` marks the Node NotReady (Ready=Unknown) and its Pods
                          Ready=False; its kubelet stops acting (processes are SIGKILLed, or left
                          running as zombies with `kill=False`); `node_up(node)` brings it back.
                          A force-deleted pod's replacement goes to a new Node and a new podIP and
                          mounts the same WAL directory (the claim follows the pod, as after a
                          forced detach): a zombie still running has that file open too, exactly
                          the hazard fencing must make harmless.
  volumes, Jobs           `kubelet_volumes.Volumes`: PVCs from claim templates, bound PVs, and
                          VolumeAttachments with the ReadWriteOnce rule (a volume attached to a lost
                          node blocks the replacement pod, "Multi-Attach error", until released;
                          `multi_attach=True` allows a second attachment); `kubelet_jobs.JobRunner`:
                          Jobs run as real processes (`k8s.jobs.runs`).

Addresses. Every pod is a process on this host, so it cannot keep the ports the operator rendered
(9092, 9093, 9094 for every pod): each pod gets a stable loopback IP (its podIP, 127.x.y.z,
kept across re-creation like its DNS name) and a stable mapped port per container port, from a
block of free ports (`broker.local.free_port_block`, or `port_base`). The rendered node config is
rewritten only where it must be: listeners and http bind to podIP:mapped and advertise that (so
real Kafka clients in the test get usable addresses), controller URLs are mapped, data_dir and the
WAL volume path point under the harness's root (the WAL dir per claim `wal-<pod>`, kept across
pod re-creation as a PersistentVolumeClaim is), and, with `object_store_url=`, the object store is
replaced (else the operator's rendered S3 URL is used as is). `map_url` / `map_address` translate
any pod, headless-Service, bootstrap-Service or podIP address the operator builds; the operator in
this process gets them through its OperatorContext (controller API factory).

API (sync, for tests; one harness per process at a time: it points KUBECONFIG at kmock):

    with KubeletHarness(tmp_path, object_store_url=None, context=None) as k8s:
        ref = k8s.create_cluster("demo", spec)        # AutoMQCluster; the operator does the rest
        k8s.wait_ready("demo", brokers=1)             # cluster Ready and that many broker pods Ready
        k8s.bootstrap("demo")                         # "ip:port,..." of the Ready brokers
        k8s.scale("demo", 2)                          # PATCH .../scale, as kubectl scale / an HPA
        k8s.patch_spec("demo", {...}); k8s.get(kind, name); k8s.list(kind); k8s.events("demo")
        k8s.kill_pod("demo-broker-1")                 # kill -9 its process (the kubelet restarts it)
        k8s.delete_pod("demo-broker-1", grace_s=None) # through the API, like kubectl delete pod
        k8s.node_of("demo-broker-1"); k8s.node_down(node, kill=True); k8s.node_up(node)
        k8s.taint_node(node, "node.kubernetes.io/out-of-service")  # what the operator may do
        k8s.signal_pod(pod, signal.SIGSTOP)           # freeze / thaw a process (zombie scenarios)
        k8s.pod_process(pod) -> PodProcess | None     # pid, config path, log path, mapped ports
        k8s.map_url(url); k8s.map_address(host, port); k8s.controller_urls("demo")
        k8s.wait_for(what, check, timeout)            # poll until truthy, else fail with context
    s3_cluster_spec(s3_url, brokers=1, **extra)       # a small spec on the s3_url fixture's bucket
        k8s.history(pod=None, what=None)              # [(monotonic, created|ready|unready|terminating|deleted, pod)]
        k8s.log_tail(pod)

`context` is a function of the harness returning the OperatorContext the operator runs with (for
operator features with their own factories); by default controller calls go through `map_url`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as dt
import itertools
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import aiohttp
import kmock
import pytest
import yaml
from kmock_emulator import KUBELET_FINALIZER, KubeconfigSwap, KubeletEmulator, install_cluster_crd
from kubelet_jobs import JobRunner
from kubelet_volumes import Volumes

from automq.broker.config import dump_config
from automq.broker.local import free_port_block, port_is_free
from automq.operator import builders
from automq.operator.builders import ClusterRef
from automq.operator.controller_api import ControllerClientApi
from automq.operator.elastic import ElasticSettings
from automq.operator.handlers import OperatorContext
from automq.operator.kube import KubeApi
from automq.operator.main import operate
from automq.operator.podconfig import render_pod_config
from automq.operator.reconcile import ReconcileSettings
from automq.operator.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

NS = "streaming"
WAIT_S = 90.0  # default bound for a condition to become true (generous: the machine is shared)
TICK_S = 0.2  # how often the StatefulSet controller looks at the API
PROBE_S = 0.3  # how often a running pod's /readyz is probed
SECRET_SYNC_S = 2.0  # how often mounted Secrets are brought up to date (the kubelet's sync, shortened)
PORTS_PER_BLOCK = 96


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _die_with_harness() -> None:
    """In the child: SIGKILL when the harness's loop thread dies, so a crashed test leaves no
    processes behind (PR_SET_PDEATHSIG fires on the death of the forking thread)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


@dataclass
class PodProcess:
    """What the kubelet knows about one pod (stable across re-creation of the same pod name)."""

    name: str
    ip: str
    ports: dict[int, int]  # container port -> port on `ip`
    port_names: dict[int, str] = field(default_factory=dict)  # container port -> its name
    probe_port: int | None = None  # container port of the readiness probe
    probe_scheme: str = "http"  # its httpGet scheme (an https probe, as the kubelet's, verifies nothing)
    claims: list[str] = field(default_factory=list)  # PersistentVolumeClaims the pod mounts
    container: str = ""
    role: str = ""
    uid: str = ""
    node: str = ""
    config_path: Path | None = None
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    ready: bool = False
    terminating: bool = False
    grace_s: float = 30.0
    task: asyncio.Task[None] | None = None
    status_sent: Any = None
    secrets_synced: float = 0.0  # monotonic time of the last Secret volume refresh

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class NodeState:
    name: str
    zone: str
    ready: bool = True


@dataclass
class _Shared:
    """State shared between the harness thread's loop and the test thread (under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    pods: dict[str, PodProcess] = field(default_factory=dict)  # pod name -> process state
    nodes: dict[str, NodeState] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    zombies: list[subprocess.Popen[bytes]] = field(default_factory=list)  # processes of force-deleted pods
    history: list[tuple[float, str, str]] = field(default_factory=list)  # (monotonic, what, pod)


class KubeletHarness:
    def __init__(
        self,
        root: Path,
        *,
        namespace: str = NS,
        object_store_url: str | dict[str, str] | None = None,
        port_base: int | None = None,
        zones: tuple[str, ...] = ("zone-a", "zone-b", "zone-c"),
        grace_override_s: float | None = None,
        multi_attach: bool = False,
        context: Callable[[KubeletHarness], OperatorContext] | None = None,
    ) -> None:
        self.root = Path(root)
        self.namespace = namespace
        # one URL for every cluster, or per cluster name (two clusters must not share a store)
        self.object_store_url = object_store_url
        self.zones = zones
        self.grace_override_s = grace_override_s
        self.multi_attach = multi_attach
        self._context_factory = context or default_context
        self._port_base = port_base if port_base is not None else free_port_block(PORTS_PER_BLOCK)
        self._next_port = itertools.count(self._port_base)
        self._ip_counter = itertools.count(1)
        self._node_counter = itertools.count(0)
        self.state = _Shared()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kubelet", daemon=True)
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.operator_errors: list[BaseException] = []
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> KubeletHarness:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for sub in ("pods", "volumes", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.thread.start()
        self.url = self.call(self._start_kmock())
        self.kubeconfig = self.root / "kubeconfig"
        self.kubeconfig_swap = KubeconfigSwap(self.kubeconfig, self.url, self.namespace)
        self.context = self._context_factory(self)
        self.operator_thread = threading.Thread(target=self._run_operator, name="operator", daemon=True)
        self.operator_thread.start()
        if not self.ready_flag.wait(WAIT_S):
            raise RuntimeError(f"operator did not start: {self.operator_errors}")

    async def _start_kmock(self) -> str:
        self.emulator = KubeletEmulator()
        install_cluster_crd(self.emulator)
        self.server = kmock.Server(self.emulator)
        await self.server.__aenter__()
        url = str(self.server.url).rstrip("/")
        self.api = KubeApi(url)
        self.volumes = Volumes(self.api, self.namespace, self.root, multi_attach=self.multi_attach)
        self.jobs = JobRunner(self)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        self._task = asyncio.get_running_loop().create_task(self._run())
        return url

    def _run_operator(self) -> None:
        try:
            asyncio.run(
                operate([], True, None, context=self.context, stop_flag=self.stop_flag, ready_flag=self.ready_flag)
            )
        except BaseException as exc:
            self.operator_errors.append(exc)

    def stop(self) -> None:
        """Operator first (it must not react to what follows), then every process, then kmock."""
        self.stop_flag.set()
        self.operator_thread.join(WAIT_S)

        async def shutdown() -> None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            for pod in list(self.state.pods.values()):
                if pod.task is not None:
                    pod.task.cancel()
            for task in list(self._tasks):
                task.cancel()
            self.jobs.kill_all()
            # Brokers before controllers: a broker stopping hands its partitions back and
            # flushes its WAL through the controller.
            pods = list(self.state.pods.values())
            brokers = [p.process for p in pods if p.running() and p.role != "controller"]
            brokers += [z for z in self.state.zombies if z.poll() is None]
            controllers = [p.process for p in pods if p.running() and p.role == "controller"]
            for group in (brokers, controllers):
                for proc in group:
                    assert proc is not None
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGCONT)
                        proc.terminate()
                deadline = time.monotonic() + 20
                while any(p.poll() is None for p in group if p) and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                for proc in group:
                    if proc is not None and proc.poll() is None:
                        proc.kill()
                        proc.wait()
            await self._http.close()
            await self.api.close()
            await self.server.__aexit__(None, None, None)

        try:
            self.call(shutdown(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT_S)
            self.kubeconfig_swap.restore()

    def call(self, coro: Any, timeout: float = WAIT_S) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # ------------------------------------------------------------------ addresses

    def _new_ip(self) -> str:
        n = next(self._ip_counter)
        return f"127.{100 + n // 65536}.{n // 256 % 256}.{n % 256}"

    def _free_port_from_block(self) -> int:
        """The next port of the block that nothing holds now: the block was free when the harness
        started, but other tests on this machine may have taken some of it since."""
        while True:
            port = next(self._next_port)
            if port >= self._port_base + PORTS_PER_BLOCK:
                raise RuntimeError(f"the harness's port block ({PORTS_PER_BLOCK} ports) is used up")
            if port_is_free(port, "0.0.0.0"):  # 0.0.0.0 conflicts with any local holder of the port
                return port

    def _pod_state(self, pod_name: str, container_ports: list[int]) -> PodProcess:
        with self.state.lock:
            pod = self.state.pods.get(pod_name)
            if pod is None:
                pod = PodProcess(name=pod_name, ip=self._new_ip(), ports={})
                self.state.pods[pod_name] = pod
            elif pod.running():
                # A force-deleted pod's process still runs (its node is down): a zombie holding
                # the old address; the replacement gets a new IP, as it would on another node.
                assert pod.process is not None
                self.state.zombies.append(pod.process)
                pod.process = None
                pod.ip = self._new_ip()
            for port in container_ports:
                if port not in pod.ports:
                    pod.ports[port] = self._free_port_from_block()
            return pod

    def map_address(self, host: str, port: int) -> tuple[str, int]:
        """Where `host:port` as the operator or a node config names it really is on this machine.

        `<pod>.<headless-svc>.<ns>.svc`, a podIP, `<headless-svc>.<ns>.svc` (any Ready pod of it,
        controllers: the first) and `<bootstrap-svc>.<ns>.svc` (the first Ready broker). Unknown
        names are returned unchanged."""
        first = host.split(".", 1)[0]
        with self.state.lock:
            pods = dict(self.state.pods)
        pod = pods.get(first) or next((p for p in pods.values() if p.ip == host), None)
        if pod is None and (host.endswith(f".{self.namespace}.svc") or host.endswith(".svc.cluster.local")):
            service = first
            candidates = [
                p
                for name, p in sorted(pods.items())
                if (service.endswith("-bootstrap") and name.startswith(service[: -len("-bootstrap")] + "-broker-"))
                or (service.endswith("s") and name.startswith(service[:-1] + "-"))
            ]
            pod = next((p for p in candidates if p.ready), candidates[0] if candidates else None)
        if pod is None or port not in pod.ports:
            return host, port
        return pod.ip, pod.ports[port]

    def map_url(self, url: str) -> str:
        """`map_address` for a URL (`http://host:port/path`) or a bare `host:port`."""
        if "://" not in url:
            host, _, port = url.rpartition(":")
            h, p = self.map_address(host, int(port))
            return f"{h}:{p}"
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            return url
        h, p = self.map_address(parts.hostname, parts.port)
        return urlunsplit(parts._replace(netloc=f"{h}:{p}"))

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep playing the kubelet; a test times out with the error
                log.exception("kubelet step failed")
                with self.state.lock:
                    self.state.errors.append(repr(exc))
                    del self.state.errors[:-20]
            await asyncio.sleep(TICK_S)

    async def _step(self) -> None:
        ns = self.namespace
        self._ticks = getattr(self, "_ticks", 0) + 1
        if self._ticks % 5 == 0:
            await self._collect_garbage()
        live_pods = {p["metadata"]["name"]: p for p in await self.api.list("Pod", ns)}
        managed = {n: p for n, p in live_pods.items() if KUBELET_FINALIZER in (p["metadata"].get("finalizers") or [])}
        # Pods that vanished (force delete, or their termination finished): make sure nothing
        # runs for them, unless their node is down (a dead kubelet kills nothing: a zombie).
        for name, pod in list(self.state.pods.items()):
            if pod.uid and name not in live_pods and not pod.terminating:
                if self._node_ready(pod.node):
                    await self._terminate(pod, grace_s=0)
                else:
                    pod.uid = ""
        for name, obj in managed.items():
            state = self.state.pods.get(name)
            if state is None or state.uid != obj["metadata"].get("uid"):
                continue
            if obj["metadata"].get("deletionTimestamp") and not state.terminating and self._node_ready(state.node):
                state.terminating = True
                grace = obj["metadata"].get("deletionGracePeriodSeconds")
                self._background(self._finish_deletion(state, grace))
        for sts in await self.api.list("StatefulSet", ns):
            await self._reconcile_statefulset(sts, live_pods)
        await self.jobs.step()

    def _record(self, what: str, pod: str) -> None:
        with self.state.lock:
            self.state.history.append((time.monotonic(), what, pod))

    def history(self, pod: str | None = None, what: str | None = None) -> list[tuple[float, str, str]]:
        """What happened to pods, in order: (time.monotonic(), "created" | "ready" | "unready" |
        "terminating" | "deleted", pod name)."""
        with self.state.lock:
            return [h for h in self.state.history if (pod is None or h[2] == pod) and (what is None or h[1] == what)]

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _collect_garbage(self) -> None:
        """The garbage collector kmock lacks: objects whose owner (by uid) is gone are deleted."""
        owners = {c["metadata"].get("uid") for c in await self.api.list("AutoMQCluster", self.namespace)}
        statefulsets = await self.api.list("StatefulSet", self.namespace)
        owners |= {s["metadata"].get("uid") for s in statefulsets}
        sts_names = {s["metadata"]["name"] for s in statefulsets}
        for kind in _GARBAGE_COLLECTED:
            for obj in await self.api.list(kind, self.namespace):
                meta = obj["metadata"]
                refs = meta.get("ownerReferences") or []
                if kind == "Pod":  # pods we made before their StatefulSet had a uid: by name
                    gone = any(r.get("kind") == "StatefulSet" and r.get("name") not in sts_names for r in refs)
                else:
                    gone = bool(refs) and all(r.get("uid") and r.get("uid") not in owners for r in refs)
                if gone and not meta.get("deletionTimestamp"):
                    await self.api.delete(kind, self.namespace, meta["name"])

    async def _reconcile_statefulset(self, sts: dict[str, Any], live_pods: dict[str, dict[str, Any]]) -> None:
        name = sts["metadata"]["name"]
        replicas = int(sts["spec"].get("replicas") or 0)
        for ordinal in range(replicas):
            pod_name = f"{name}-{ordinal}"
            if pod_name in live_pods:
                continue
            state = self.state.pods.get(pod_name)
            if state is not None and (state.terminating or (state.running() and self._node_ready(state.node))):
                continue  # the old one is still going away
            await self._create_pod(sts, pod_name)
        for pod_name, obj in live_pods.items():
            head, _, tail = pod_name.rpartition("-")
            if (
                head == name
                and tail.isdigit()
                and int(tail) >= replicas
                and not obj["metadata"].get("deletionTimestamp")
            ):
                await self.api.delete("Pod", self.namespace, pod_name)

    # ------------------------------------------------------------------ pods

    async def _create_pod(self, sts: dict[str, Any], pod_name: str) -> None:
        template = copy.deepcopy(sts["spec"]["template"])
        main = template["spec"]["containers"][0]
        state = self._pod_state(pod_name, [p["containerPort"] for p in main.get("ports") or []])
        state.port_names = {p["containerPort"]: p.get("name", "") for p in main.get("ports") or []}
        probe = (main.get("readinessProbe") or {}).get("httpGet") or {}
        port = probe.get("port")
        state.probe_port = next((c for c, n in state.port_names.items() if n == port), port) if port else None
        state.probe_scheme = str(probe.get("scheme") or "HTTP").lower()
        state.container = main["name"]
        node = await self._schedule(state)
        template["spec"]["volumes"] = [
            *(template["spec"].get("volumes") or []),
            *await self.volumes.ensure_claims(sts, pod_name),
        ]
        state.claims = Volumes.claims_of(template)
        uid = str(uuid.uuid4())
        meta = template["metadata"]
        owner = sts["metadata"].get("uid")
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **meta,
                "name": pod_name,
                "namespace": self.namespace,
                "uid": uid,
                "finalizers": [KUBELET_FINALIZER],
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "StatefulSet",
                        "name": sts["metadata"]["name"],
                        "uid": owner or "",
                        "controller": True,
                    }
                ],
            },
            "spec": {**template["spec"], "nodeName": node},
            "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]},
        }
        await self.api.create(body)
        state.uid, state.node, state.restarts, state.ready = uid, node, 0, False
        self._record("created", pod_name)
        state.terminating = False
        state.status_sent = None
        grace = template["spec"].get("terminationGracePeriodSeconds", 30)
        state.grace_s = float(self.grace_override_s if self.grace_override_s is not None else grace)
        state.role = next((e.get("value") for e in main.get("env") or [] if e.get("name") == "AUTOMQ_ROLE"), "") or ""
        state.task = asyncio.get_running_loop().create_task(self._run_pod(state, body))

    async def _schedule(self, state: PodProcess) -> str:
        with self.state.lock:
            if state.node and self.state.nodes.get(state.node, NodeState("", "")).ready:
                return state.node
        return (await self._new_node()).name

    async def _new_node(self) -> NodeState:
        with self.state.lock:
            n = next(self._node_counter)
            node = NodeState(f"node-{n}", self.zones[n % len(self.zones)] if self.zones else "")
            self.state.nodes[node.name] = node
        await self._write_node(node)
        return node

    def _claim_in_use(self, claim: str, node: str) -> bool:
        """A pod using `claim` has a process (or a pod) on `node`."""
        with self.state.lock:
            return any(
                p.node == node and claim in p.claims and (p.uid or p.running()) for p in self.state.pods.values()
            )

    def _object_store_for(self, cluster: str) -> str | None:
        store = self.object_store_url
        if isinstance(store, dict):
            return store.get(cluster)
        return store

    async def _write_node(self, node: NodeState) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "uid": str(uuid.uuid4()),
                "labels": {"kubernetes.io/hostname": node.name, "topology.kubernetes.io/zone": node.zone},
            },
            "status": self._node_status(node),
        }
        await self.api._request("POST", "/api/v1/nodes", body)

    @staticmethod
    def _node_status(node: NodeState) -> dict[str, Any]:
        ready = (
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": _now()}
            if node.ready
            else {
                "type": "Ready",
                "status": "Unknown",
                "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
                "lastTransitionTime": _now(),
            }
        )
        return {"conditions": [ready], "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}

    def _node_ready(self, node: str) -> bool:
        with self.state.lock:
            state = self.state.nodes.get(node)
        return state is None or state.ready

    async def _run_pod(self, state: PodProcess, pod: dict[str, Any]) -> None:
        """The kubelet's work for one pod: init step, start, probe, restart on exit."""
        uid = state.uid
        pod_dir = self.root / "pods" / f"{state.name}-{uid[:8]}"
        backoff = 0.5
        attached = False
        try:
            while state.uid == uid and not state.terminating:
                if not self._node_ready(state.node):
                    await asyncio.sleep(PROBE_S)
                    continue
                if not attached:
                    blocked = [
                        why
                        for claim in state.claims
                        if (why := await self.volumes.attach(claim, state.node, self._node_ready, self._claim_in_use))
                    ]
                    if blocked:
                        if state.status_sent is None or "ContainerCreating" not in str(state.status_sent):
                            await self._write_status(state, waiting=blocked[0], reason="ContainerCreating")
                            self._record("volume blocked", state.name)
                        await asyncio.sleep(0.5)
                        continue
                    attached = True
                if not state.running():
                    if state.process is not None:  # it exited: a container restart, as the kubelet does
                        state.restarts += 1
                        state.ready = False
                        await self._write_status(state, waiting=f"exited with {state.process.returncode}")
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, 5.0)
                        if state.uid != uid or state.terminating or not self._node_ready(state.node):
                            continue
                    try:
                        await self._start_process(state, pod, pod_dir)
                    except Exception as exc:
                        log.exception("cannot start %s", state.name)
                        with self.state.lock:
                            self.state.errors.append(f"{state.name}: {exc!r}")
                        await self._write_status(state, waiting=f"CreateContainerConfigError: {exc}")
                        await asyncio.sleep(1.0)
                        continue
                ready = await self._probe(state)
                if state.running():
                    await self._sync_secret_volumes(state, pod, pod_dir)
                if ready:
                    backoff = 0.5
                if ready != state.ready or state.status_sent is None:
                    state.ready = ready
                    await self._write_status(state)
                    self._record("ready" if ready else "unready", state.name)
                await asyncio.sleep(PROBE_S)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod loop of %s failed", state.name)

    async def _start_process(self, state: PodProcess, pod: dict[str, Any], pod_dir: Path) -> None:
        main = pod["spec"]["containers"][0]
        env = await self._container_env(pod, main)
        config_map = next(v["configMap"]["name"] for v in pod["spec"].get("volumes") or [] if v.get("name") == "config")
        cm = await self.api.get("ConfigMap", self.namespace, config_map)
        if cm is None:
            raise RuntimeError(f"ConfigMap {config_map} not found")
        role = env.get("AUTOMQ_ROLE", "broker")
        template = yaml.safe_load(cm["data"][f"{role}.yaml"]) or {}
        config = render_pod_config(template, env)  # what the init container does
        cluster = (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/instance", "")
        await self._write_secret_volumes(pod, pod_dir)
        config = self._localize(config, state, pod, pod_dir, cluster)
        pod_dir.mkdir(parents=True, exist_ok=True)
        state.config_path = pod_dir / "node.yaml"
        state.config_path.write_text(dump_config(config))
        args = [a if a != f"{builders.NODE_CONFIG_DIR}/node.yaml" else str(state.config_path) for a in main["args"]]
        state.log_path = self.root / "logs" / f"{state.name}.log"
        with open(state.log_path, "ab", buffering=0) as out:
            out.write(f"\n===== {_now()} pod uid {state.uid} restart {state.restarts}: {' '.join(args)}\n".encode())
            state.process = subprocess.Popen(
                [sys.executable, "-m", "automq.broker.cli", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **env, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"},
                preexec_fn=_die_with_harness if sys.platform == "linux" else None,
            )

    def _mounts(self, pod: dict[str, Any], pod_dir: Path) -> dict[str, Path]:
        """The main container's mount paths -> host directories (claims: the volume's directory,
        which outlives the pod; emptyDir: under the pod's directory)."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        out: dict[str, Path] = {}
        for mount in pod["spec"]["containers"][0].get("volumeMounts") or []:
            volume = volumes.get(mount["name"]) or {}
            if volume.get("persistentVolumeClaim"):
                out[mount["mountPath"]] = self.volumes.host_dir(volume["persistentVolumeClaim"]["claimName"])
            elif "emptyDir" in volume:
                out[mount["mountPath"]] = pod_dir / mount["name"]
                out[mount["mountPath"]].mkdir(parents=True, exist_ok=True)
            elif "secret" in volume:
                out[mount["mountPath"]] = pod_dir / "secrets" / mount["name"]
        return out

    async def _write_secret_volumes(self, pod: dict[str, Any], pod_dir: Path) -> None:
        """The main container's Secret volumes as files (what the kubelet mounts); a missing
        Secret fails the start, as the kubelet's CreateContainerConfigError does."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        for mount in pod["spec"]["containers"][0].get("volumeMounts") or []:
            source = (volumes.get(mount["name"]) or {}).get("secret")
            if source is None:
                continue
            name = source["secretName"]
            secret = await self.api.get("Secret", self.namespace, name)
            if secret is None:
                raise RuntimeError(f"Secret {name} not found")
            directory = pod_dir / "secrets" / mount["name"]
            directory.mkdir(parents=True, exist_ok=True)
            data = secret.get("data") or {}
            if source.get("items"):  # a projection: only the keys named, under their paths
                data = {item["path"]: data[item["key"]] for item in source["items"] if item["key"] in data}
            for key, value in data.items():
                target = directory / key
                content = base64.b64decode(value)
                if target.exists() and target.read_bytes() == content:
                    continue  # unchanged: no new mtime (nodes watch their files for changes)
                tmp = directory / f".{key}.tmp"
                tmp.write_bytes(content)
                tmp.replace(target)  # atomic per file, as the kubelet's symlink swap is per volume

    async def _sync_secret_volumes(self, state: PodProcess, pod: dict[str, Any], pod_dir: Path) -> None:
        """A running pod's Secret volumes follow their Secrets (renewed certificates, rotated
        tokens), as the kubelet updates mounted Secrets in place without a restart."""
        now = time.monotonic()
        if now - state.secrets_synced < SECRET_SYNC_S:
            return
        state.secrets_synced = now
        try:
            await self._write_secret_volumes(pod, pod_dir)
        except Exception as exc:  # a Secret deleted meanwhile: keep the files, as the kubelet does
            log.debug("secret volumes of %s not refreshed: %s", state.name, exc)

    def _localize(self, config: Any, state: PodProcess, pod: dict[str, Any], pod_dir: Path, cluster: str) -> Any:
        """The rendered config with this host's addresses and directories (see module doc)."""
        mounts = self._mounts(pod, pod_dir)
        raw = config.model_dump(mode="json")
        raw["listeners"] = [
            {
                **listener,
                "host": state.ip,
                "port": state.ports[listener["port"]],
                "advertised_host": state.ip,
                "advertised_port": state.ports[listener["port"]],
            }
            for listener in raw.get("listeners") or []
        ]
        raw["http_port"] = state.ports[raw["http_port"]]
        raw["http_host"] = state.ip
        raw["controller_urls"] = [self.map_url(u) for u in raw.get("controller_urls") or []]
        if (raw.get("controller") or {}).get("advertised_url"):
            raw["controller"]["advertised_url"] = self.map_url(raw["controller"]["advertised_url"])
        wal = raw.get("wal") or {}
        if wal.get("kind") == "volume":
            wal["path"] = _under_mounts(str(Path(raw["data_dir"]) / wal.get("path", "wal")), mounts)
        raw["data_dir"] = _under_mounts(raw["data_dir"], mounts)
        mounted = (
            ("tls", "cert_file"),
            ("tls", "key_file"),
            ("tls", "ca_file"),
            ("security", "controller_token_file"),
            ("security", "controller_ca_file"),
            ("security", "sasl_inter_broker_jaas_config_file"),
            ("security", "sasl_oauthbearer_jwks_file"),
        )
        for section, key in mounted:
            if (raw.get(section) or {}).get(key):
                raw[section][key] = _under_mounts(raw[section][key], mounts)
        if any(u.startswith("https://") for u in raw["controller_urls"]):
            # Pods are reached at loopback IPs here, which no certificate names: nodes check the
            # controllers' CA but not the host name (tests/operator/test_security.py checks the names).
            raw.setdefault("tls", {})["endpoint_identification_algorithm"] = ""
        store = self._object_store_for(cluster)
        if store:
            raw["object_store_url"] = store
        return type(config).model_validate(raw)

    async def _container_env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        """The container's environment as the kubelet builds it (downward API, Secrets, $(VAR))."""
        env: dict[str, str] = {}
        for item in container.get("env") or []:
            name = item["name"]
            if "value" in item:
                env[name] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), item["value"])
                continue
            source = item.get("valueFrom") or {}
            if "fieldRef" in source:
                env[name] = _field(pod, source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                secret = await self.api._request("GET", f"/api/v1/namespaces/{self.namespace}/secrets/{ref['name']}")
                env[name] = base64.b64decode((secret.get("data") or {})[ref["key"]]).decode()
        return env

    async def _probe(self, state: PodProcess) -> bool:
        http_port = state.ports.get(state.probe_port) if state.probe_port is not None else None
        if http_port is None or not state.running():
            return False
        try:
            url = f"{state.probe_scheme}://{state.ip}:{http_port}/readyz"
            async with self._http.get(url, ssl=False if state.probe_scheme == "https" else None) as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def _write_status(self, state: PodProcess, waiting: str | None = None, reason: str | None = None) -> None:
        container = state.container
        cstate: dict[str, Any]
        if waiting is not None:
            reason = reason or ("CrashLoopBackOff" if state.restarts >= 3 else "Error")
            cstate = {"waiting": {"reason": reason, "message": waiting}}
        elif state.running():
            cstate = {"running": {"startedAt": _now()}}
        else:
            cstate = {"terminated": {"exitCode": state.process.returncode if state.process else 0}}
        status = {
            "phase": "Running" if state.running() else "Pending",
            "podIP": state.ip,
            "podIPs": [{"ip": state.ip}],
            "hostIP": "127.0.0.1",
            "conditions": [
                {"type": "Ready", "status": "True" if state.ready else "False", "lastTransitionTime": _now()},
                {"type": "ContainersReady", "status": "True" if state.ready else "False"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [
                {
                    "name": container,
                    "ready": state.ready,
                    "restartCount": state.restarts,
                    "started": state.running(),
                    "state": cstate,
                }
            ],
        }
        try:
            await self.api.patch("Pod", self.namespace, state.name, {"status": status})
            state.status_sent = status
        except Exception as exc:  # the pod may be gone meanwhile
            log.debug("status of %s not written: %s", state.name, exc)

    async def _finish_deletion(self, state: PodProcess, grace: Any) -> None:
        """Graceful termination: not Ready, SIGTERM, SIGKILL after the grace period, Pod gone."""
        uid = state.uid
        state.ready = False
        self._record("terminating", state.name)
        await self._write_status(state)
        grace_s = state.grace_s if grace in (None, "") else min(state.grace_s, float(grace))
        await self._terminate(state, grace_s)
        if self._node_ready(state.node):
            for claim in state.claims:
                await self.volumes.detach(claim, state.node)
        if state.uid == uid:
            with contextlib.suppress(Exception):
                await self.api.patch("Pod", self.namespace, state.name, {"metadata": {"finalizers": None}})
            state.uid = ""
            state.terminating = False
            self._record("deleted", state.name)

    async def _terminate(self, state: PodProcess, grace_s: float) -> None:
        state.terminating = True
        if state.task is not None:
            state.task.cancel()
        proc = state.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)  # a frozen process must see its SIGTERM
                if grace_s > 0:
                    proc.terminate()
            deadline = time.monotonic() + grace_s
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if proc.poll() is None:
                proc.kill()
            while proc.poll() is None:
                await asyncio.sleep(0.05)
        state.ready = False
        if grace_s == 0:
            state.uid = ""
            state.terminating = False

    # ------------------------------------------------------------------ test API

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """Any kind `automq.operator.kube.KINDS` knows (cluster-scoped ones too: Node, VolumeAttachment)."""
        return self.call(self.api.get(kind, self.namespace, name))

    def list(self, kind: str) -> list[dict[str, Any]]:
        return self.call(self.api.list(kind, self.namespace))

    def create_cluster(self, name: str, spec: dict[str, Any]) -> ClusterRef:
        uid = str(uuid.uuid4())
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AutoMQCluster",
            "metadata": {"name": name, "namespace": self.namespace, "uid": uid, "generation": 1},
            "spec": spec,
        }
        self.call(self.api.create(body))
        return ClusterRef(name, self.namespace, uid)

    def delete_cluster(self, name: str, timeout: float = 180.0) -> None:
        """Delete the AutoMQCluster and wait until the operator's finalizer and the garbage
        collector removed everything it owned and its processes stopped. Slow: all pods get
        SIGTERM at once, as on Kubernetes, and a broker whose controller went first waits for
        it (up to the pod's grace period) before it exits."""
        self.call(self.api.delete("AutoMQCluster", self.namespace, name))
        self.wait_for(
            f"{name} and its pods gone",
            lambda: (
                self.get("AutoMQCluster", name) is None
                and not [p for p in self.list("Pod") if p["metadata"]["name"].startswith(f"{name}-")]
            ),
            timeout,
        )

    def patch_spec(self, name: str, spec_patch: dict[str, Any]) -> None:
        self.call(self.api.patch("AutoMQCluster", self.namespace, name, {"spec": spec_patch}))

    def scale(self, name: str, replicas: int) -> None:
        """Broker replicas through the scale subresource (kubectl scale, HPA, KEDA)."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{name}/scale"
        self.call(self.api._request("PATCH", path, {"spec": {"replicas": replicas}}, "application/merge-patch+json"))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.list("Event") if e.get("involvedObject", {}).get("name") == name]

    def pod_process(self, pod: str) -> PodProcess | None:
        with self.state.lock:
            return self.state.pods.get(pod)

    def ready_pods(self, name: str, role: str = "broker") -> list[str]:
        prefix = f"{name}-{role}-"
        return sorted(
            p["metadata"]["name"]
            for p in self.list("Pod")
            if p["metadata"]["name"].startswith(prefix)
            and not p["metadata"].get("deletionTimestamp")
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        )

    def bootstrap(self, name: str, port: int | None = None) -> str:
        """Kafka bootstrap servers of the cluster's Ready brokers (what its bootstrap Service fronts);
        `port`: only that listener's (container port), else every listener's."""
        out = []
        for pod in self.ready_pods(name):
            state = self.pod_process(pod)
            if state is not None:
                out.extend(
                    f"{state.ip}:{p}"
                    for c, p in sorted(state.ports.items())
                    if c != state.probe_port and (port is None or c == port)
                )
        return ",".join(out)

    def create_user(self, name: str, spec: dict[str, Any]) -> None:
        """An AutoMQUser (the operator creates its credentials Secret, ACLs and quotas)."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AutoMQUser",
            "metadata": {"name": name, "namespace": self.namespace, "uid": str(uuid.uuid4()), "generation": 1},
            "spec": spec,
        }
        self.call(self.api.create(body))

    def controller_urls(self, name: str) -> list[str]:
        spec_replicas = (self.get("StatefulSet", f"{name}-controller") or {}).get("spec", {}).get("replicas", 0)
        urls = (
            yaml.safe_load((self.get("ConfigMap", f"{name}-config") or {}).get("data", {}).get("broker.yaml") or "{}")
            or {}
        ).get("controller_urls") or ["http://"]
        scheme = urls[0].split("://", 1)[0]
        return [
            self.map_url(f"{scheme}://{name}-controller-{i}.{name}-controllers.{self.namespace}.svc:9093")
            for i in range(spec_replicas)
        ]

    def wait_ready(self, name: str, brokers: int, timeout: float = WAIT_S) -> dict[str, Any]:
        """The AutoMQCluster Ready with exactly `brokers` broker pods Ready."""

        def check() -> Any:
            obj = self.get("AutoMQCluster", name)
            conditions = ((obj or {}).get("status") or {}).get("conditions") or []
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            return ready and len(self.ready_pods(name)) == brokers and obj

        return self.wait_for(f"{name} Ready with {brokers} brokers", check, timeout)

    def kill_pod(self, pod: str, sig: int = signal.SIGKILL) -> int:
        """Signal the pod's process (default kill -9); the kubelet restarts it as a container
        restart (same pod, restartCount + 1) unless its node is down. Returns the pid."""
        state = self.pod_process(pod)
        if state is None or not state.running() or state.process is None:
            raise AssertionError(f"{pod} has no running process")
        state.process.send_signal(sig)
        return state.process.pid

    def signal_pod(self, pod: str, sig: int) -> int:
        return self.kill_pod(pod, sig)

    def delete_pod(self, pod: str, grace_s: int | None = None) -> None:
        """Delete through the API (kubectl delete pod [--grace-period=N]); 0 is a force delete."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        self.call(self.api._request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{pod}", body))

    def node_of(self, pod: str) -> str:
        obj = self.get("Pod", pod)
        return (obj or {}).get("spec", {}).get("nodeName", "")

    def node_down(self, node: str, *, kill: bool = True) -> None:
        """The node stops: Node Ready=Unknown, its pods Ready=False (as the node controller
        marks them); its processes are SIGKILLed (`kill=False`: they keep running, unreachable
        to the kubelet: a partitioned node with zombies). Nothing on it is restarted, and a
        graceful delete of its pods stays pending until a force delete or `node_up`."""
        self.call(self._set_node(node, ready=False, kill=kill))

    def taint_node(self, node: str, key: str, effect: str = "NoExecute") -> None:
        obj = self.get("Node", node) or {}
        taints = [*((obj.get("spec") or {}).get("taints") or []), {"key": key, "effect": effect}]
        self.call(self.api.patch("Node", "", node, {"spec": {"taints": taints}}))

    def node_up(self, node: str) -> None:
        self.call(self._set_node(node, ready=True, kill=False))

    async def _set_node(self, node: str, *, ready: bool, kill: bool) -> None:
        with self.state.lock:
            state = self.state.nodes[node]
            state.ready = ready
            pods = [p for p in self.state.pods.values() if p.node == node]
        await self.api._request(
            "PATCH", f"/api/v1/nodes/{node}", {"status": self._node_status(state)}, "application/merge-patch+json"
        )
        for pod in pods:
            if not ready:
                if kill and pod.running() and pod.process is not None:
                    pod.process.kill()
                if pod.uid:
                    pod.ready = False
                    with contextlib.suppress(Exception):
                        await self.api.patch(
                            "Pod",
                            self.namespace,
                            pod.name,
                            {
                                "status": {
                                    "conditions": [{"type": "Ready", "status": "False", "reason": "NodeNotReady"}]
                                }
                            },
                        )
            elif pod.uid and (pod.task is None or pod.task.done()):
                live = await self.api.get("Pod", self.namespace, pod.name)
                if live is not None and live["metadata"].get("uid") == pod.uid:
                    pod.status_sent = None
                    pod.task = asyncio.get_running_loop().create_task(self._run_pod(pod, live))

    def log_tail(self, pod: str, lines: int = 30) -> str:
        state = self.pod_process(pod)
        if state is None or state.log_path is None or not state.log_path.exists():
            return ""
        return "\n".join(state.log_path.read_text(errors="replace").splitlines()[-lines:])

    def errors(self) -> list[str]:
        with self.state.lock:
            return list(self.state.errors)

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = WAIT_S, interval: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except (KeyError, TypeError, IndexError, AttributeError) as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(interval)
        pods = sorted(self.state.pods)
        tails = "\n".join(f"--- {p}\n{self.log_tail(p, 8)}" for p in pods)
        pytest.fail(
            f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}; operator errors: "
            f"{self.operator_errors}; harness errors: {self.errors()}\n{self._clusters_summary()}\n{tails}"
        )

    def _clusters_summary(self) -> str:
        """What the operator last said about each cluster (for failure messages)."""
        try:
            clusters = self.list("AutoMQCluster")
        except Exception as exc:
            return f"(cannot list clusters: {exc})"
        lines = []
        for c in clusters:
            status = c.get("status") or {}
            conditions = "; ".join(
                f"{x.get('type')}={x.get('status')} {x.get('reason', '')}: {x.get('message', '')}"
                for x in status.get("conditions") or []
            )
            lines.append(f"=== {c['metadata']['name']}: {conditions}")
            for key in ("autoscaling", "balancing", "brokers"):
                if key in status:
                    lines.append(f"    {key}: {status[key]}")
        return "\n".join(lines)


_GARBAGE_COLLECTED = (
    "StatefulSet",
    "ConfigMap",
    "Service",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "PodDisruptionBudget",
    "Pod",
)


def _under_mounts(path: str, mounts: dict[str, Path]) -> str:
    """A container path as a host path, through the longest mount that holds it."""
    for mount in sorted(mounts, key=len, reverse=True):
        base = mount.rstrip("/")
        if path == base or path.startswith(base + "/"):
            return str(mounts[mount]) + path[len(base) :]
    raise ValueError(f"{path} is on no volume of the pod (mounts: {sorted(mounts)}): the container could not write it")


def _field(pod: dict[str, Any], path: str) -> str:
    """A downward-API fieldRef of the pod."""
    meta = pod["metadata"]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": pod["spec"].get("nodeName"),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName"),
        "status.podIP": (pod.get("status") or {}).get("podIP"),
    }
    return str(simple.get(path) or "")


def s3_cluster_spec(s3_url: str, brokers: int = 1, **extra: Any) -> dict[str, Any]:
    """An AutoMQCluster spec (1 controller, `brokers` brokers, 64 MiB volume WAL) on the bucket of
    an `s3://bucket?endpoint=...` URL (the `s3_url` fixture); `extra` adds top-level spec keys.
    PLAINTEXT listener and no controller token unless `extra` says otherwise (listeners=...,
    security=...): tests of other features use plain clients; tests/e2e/test_operator_security.py
    runs the secure defaults."""
    parts = urlsplit(s3_url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    return {
        "controller": {"replicas": 1},
        "broker": {"replicas": brokers, "wal": {"kind": "volume", "size": "64Mi"}},
        "objectStore": {"bucket": parts.netloc, "endpoint": query["endpoint"], "pathStyle": True},
        "deletionPolicy": "Delete",
        "listeners": [{"name": "PLAINTEXT", "port": 9092}],
        # plain http controllers: these tests are about other things (tests/e2e/test_operator_security.py
        # runs the secure defaults, https controllers included)
        "security": {"controllerApi": {"authentication": "none", "tls": False}},
        **extra,
    }


def _at_pod_ips(auth: Any) -> Any:
    """The operator's controller credentials for URLs mapped to loopback IPs: the controllers'
    CA is still checked, their host name cannot be (no certificate names a loopback IP)."""
    if auth is not None and auth.ssl is not None:
        auth.ssl.check_hostname = False
    return auth


def default_context(harness: KubeletHarness) -> OperatorContext:
    """Fast passes, real controller calls through the harness's address map."""
    return OperatorContext(
        controller_api_factory=lambda urls, auth=None: ControllerClientApi(
            [harness.map_url(u) for u in urls], auth=_at_pod_ips(auth)
        ),
        settings=ReconcileSettings(
            poll_interval_s=0.2, pod_ready_timeout_s=WAIT_S, drain_timeout_s=30, scale_in_wait_s=2
        ),
        retry_delay_s=0.5,
        status_interval_s=1.0,
        resync_interval_s=10.0,
        address_map=harness.map_url,  # broker /metrics (podIP:9094) and any other pod URL
        elastic=ElasticSettings(poll_s=1.0),
    )
