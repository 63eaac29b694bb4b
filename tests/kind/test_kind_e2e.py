"""End to end on a real Kubernetes cluster (kind): image, chart, operator, a cluster, Kafka traffic.

Runs only where a kind cluster is reachable; everywhere else every test skips with the reason
(which tool is missing, or what `docker info` / `kind get clusters` / the API server said).
On such a machine:

    kind create cluster --name automq-e2e
    python -m pytest tests/kind -m kind

Steps (one module-scoped environment, torn down at the end even on failure):
 1. `docker build --target runtime` the image and `kind load docker-image` it into the nodes;
 2. install the chart with Helm's own engine (helm-python-sdk) in namespaced mode, watching a
    fresh namespace, with the loaded image (pullPolicy Never) and wait for the operator;
 3. apply manifests/examples/dev-object-store.yaml and manifests/examples/minimal.yaml (its image
    set to the loaded one) and wait for the AutoMQCluster's Ready condition;
 4. produce and consume with kafka-python through `kubectl port-forward` to the broker pod
    (the broker advertises its pod DNS name, which only resolves inside the cluster, so the
    test resolves that one name to the forwarded local port);
 5. `helm test` the release; delete the cluster and see the finalizer let it go; uninstall.

Environment: AUTOMQ_KIND_CLUSTER picks the kind cluster (default: the only/first one);
AUTOMQ_E2E_IMAGE reuses an image already loaded into kind instead of building one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"

pytestmark = [pytest.mark.kind, pytest.mark.timeout(3600)]


# --- is there a cluster? ----------------------------------------------------------------------


def _run(*args: str, timeout: float = 60, check: bool = False, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=check, **kw)


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {result.returncode}"


def find_kind_cluster() -> tuple[str | None, str]:
    """(cluster name, '') when one is usable, else (None, why not)."""
    missing = [tool for tool in ("docker", "kind", "kubectl") if shutil.which(tool) is None]
    problems = [f"{', '.join(missing)} not installed"] if missing else []
    if "docker" not in missing:
        info = _run("docker", "info", "--format", "{{.ServerVersion}}")
        if info.returncode != 0:
            problems.append(f"docker info failed: {_last_line(info)}")
    if problems:
        return None, "no container engine/kind cluster on this machine: " + "; ".join(problems)
    clusters = _run("kind", "get", "clusters")
    names = clusters.stdout.split()
    if clusters.returncode != 0 or not names:
        return (
            None,
            f"no kind cluster: `kind get clusters` printed {_last_line(clusters)!r} (kind create cluster --name automq-e2e)",
        )
    name = os.environ.get("AUTOMQ_KIND_CLUSTER") or names[0]
    if name not in names:
        return None, f"AUTOMQ_KIND_CLUSTER={name} is not among the kind clusters {names}"
    ready = _run("kubectl", "--context", f"kind-{name}", "get", "--raw", "/readyz")
    if ready.returncode != 0:
        return None, f"kind cluster {name} is not reachable: {_last_line(ready)}"
    return name, ""


# --- the environment --------------------------------------------------------------------------


@dataclass
class Env:
    cluster: str
    context: str
    image: str
    operator_namespace: str
    namespace: str
    release: str
    helm: Any  # helm_python.Config

    def kubectl(self, *args: str, timeout: float = 120, check: bool = True, input: str | None = None):
        result = _run("kubectl", "--context", self.context, *args, timeout=timeout, input=input)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def get_json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


def build_and_load_image(cluster: str) -> str:
    image = os.environ.get("AUTOMQ_E2E_IMAGE")
    if image:
        return image
    image = f"automq-py/automq:e2e-{uuid.uuid4().hex[:8]}"
    build = _run("docker", "build", "--target", "runtime", "-t", image, str(ROOT), timeout=1800)
    assert build.returncode == 0, f"docker build failed:\n{build.stderr[-4000:]}"
    load = _run("kind", "load", "docker-image", image, "--name", cluster, timeout=600)
    assert load.returncode == 0, f"kind load failed: {load.stderr[-2000:]}"
    return image


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    cluster, why = find_kind_cluster()
    if cluster is None:
        pytest.skip(why)
    import helm_python

    helm_python.disable_logging()
    suffix = uuid.uuid4().hex[:6]
    context = f"kind-{cluster}"
    image = build_and_load_image(cluster)
    repository, _, tag = image.rpartition(":")
    e = Env(
        cluster=cluster,
        context=context,
        image=image,
        operator_namespace=f"automq-system-{suffix}",
        namespace=f"automq-e2e-{suffix}",
        release=f"automq-operator-{suffix}",
        helm=helm_python.Config(kube_context=context, namespace=f"automq-system-{suffix}"),
    )
    e.kubectl("create", "namespace", e.namespace)
    try:
        e.helm.install(
            str(ROOT / "charts" / "automq-operator"),
            e.release,
            {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}, "watchNamespaces": [e.namespace]},
            namespace=e.operator_namespace,
            create_namespace=True,
            wait="watcher",
            timeout=300,
        )
        yield e
    finally:
        teardown(e)


def teardown(e: Env) -> None:
    # The cluster first, while the operator still runs to remove its finalizer.
    e.kubectl(
        "-n", e.namespace, "delete", "automqcluster", "--all", "--wait", "--timeout=300s", check=False, timeout=330
    )
    with contextlib.suppress(Exception):
        e.helm.uninstall(e.release, ignore_not_found=True, wait="watcher", timeout=300)
    for namespace in (e.namespace, e.operator_namespace):
        e.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    e.helm.close()


# --- helpers ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def port_forward(e: Env, target: str, remote_port: int) -> Iterator[int]:
    local = free_port()
    proc = subprocess.Popen(
        ["kubectl", "--context", e.context, "-n", e.namespace, "port-forward", target, f"{local}:{remote_port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", local), timeout=1).close()
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"port-forward {target} did not come up: {proc.stderr.read() if proc.poll() is not None else 'timeout'}"
                )
            time.sleep(0.5)
        yield local
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def resolve_to_local(names: dict[str, int]) -> Iterator[None]:
    """Make `<pod name>.<anything>` resolve to the local end of its port-forward.

    kafka-python connects to the addresses brokers advertise (in-cluster DNS names); this maps
    exactly those names, everything else resolves as usual."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if isinstance(host, str) and host.split(".")[0] in names:
            return real("127.0.0.1", names[host.split(".")[0]], socket.AF_INET, socket.SOCK_STREAM)
        return real(host, port, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo
    try:
        yield
    finally:
        socket.getaddrinfo = real


def apply_documents(e: Env, docs: list[dict[str, Any]]) -> None:
    e.kubectl("-n", e.namespace, "apply", "-f", "-", input=yaml.safe_dump_all(docs))


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


# --- the tests -------------------------------------------------------------------------------


def test_operator_runs_locked_down(env: Env):
    [pod] = env.get_json("-n", env.operator_namespace, "pods", "-l", "app.kubernetes.io/component=operator")["items"]
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    [container] = pod["spec"]["containers"]
    assert container["image"] == env.image
    assert f"--namespace={env.namespace}" in container["args"]


def test_minimal_cluster_becomes_ready_and_serves_kafka(env: Env):
    apply_documents(env, [d for d in yaml.safe_load_all((EXAMPLES / "dev-object-store.yaml").read_text()) if d])
    env.kubectl("-n", env.namespace, "rollout", "status", "deployment/automq-dev-s3", "--timeout=300s", timeout=330)
    [cluster] = [d for d in yaml.safe_load_all((EXAMPLES / "minimal.yaml").read_text()) if d]
    cluster["spec"] |= {"image": env.image, "imagePullPolicy": "Never"}
    apply_documents(env, [cluster])
    waited = env.kubectl(
        "-n",
        env.namespace,
        "wait",
        "automqcluster/minimal",
        "--for=condition=Ready",
        "--timeout=600s",
        timeout=630,
        check=False,
    )
    obj = env.get_json("-n", env.namespace, "automqcluster", "minimal")
    assert waited.returncode == 0, f"not Ready: {json.dumps(obj.get('status'), indent=1)}"
    assert obj["status"]["brokers"]["ready"] == 1 and obj["status"]["controllers"]["ready"] == 1
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]

    from kafka import KafkaConsumer, KafkaProducer

    topic = f"e2e-{uuid.uuid4().hex[:6]}"
    with port_forward(env, "pod/minimal-broker-0", 9092) as local, resolve_to_local({"minimal-broker-0": local}):
        bootstrap = f"127.0.0.1:{local}"
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=5)
        sent = [f"message-{i}".encode() for i in range(100)]
        for value in sent:
            producer.send(topic, value)
        producer.flush(timeout=60)
        producer.close()
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=30_000,
        )
        received = [record.value for record in consumer]
        consumer.close()
    assert received == sent


def test_helm_test_hook_passes(env: Env):
    result = env.helm.test(env.release, timeout=300, logs=True)
    assert f"ok http://{env.release}.{env.operator_namespace}.svc:8080/healthz" in json.dumps(result)


def test_deleting_the_cluster_runs_the_finalizer(env: Env):
    if env.kubectl("-n", env.namespace, "get", "automqcluster", "minimal", check=False).returncode != 0:
        pytest.skip("the minimal cluster was not created (see the earlier failure)")
    env.kubectl("-n", env.namespace, "delete", "automqcluster", "minimal", "--wait", "--timeout=300s", timeout=330)
    gone = env.kubectl("-n", env.namespace, "get", "automqcluster", "minimal", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    # Owned objects go with it (garbage collection through owner references).
    deadline = time.monotonic() + 120
    while env.get_json("-n", env.namespace, "statefulsets", "-l", "app.kubernetes.io/instance=minimal")["items"]:
        assert time.monotonic() < deadline, "StatefulSets of the deleted cluster are still there"
        time.sleep(2)


def test_skip_reason_names_the_missing_tools(tmp_path, monkeypatch):
    # Runs everywhere: the reason this suite gives for skipping must say what is missing.
    monkeypatch.setenv("PATH", str(tmp_path))
    name, why = find_kind_cluster()
    assert name is None
    assert why == "no container engine/kind cluster on this machine: docker, kind, kubectl not installed"
