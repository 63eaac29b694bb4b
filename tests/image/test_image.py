"""The container images, built from the project's Dockerfile and run with podman.

No registry is reachable from CI, so the base image is made by scripts/build-base-image.sh
(mmdebstrap, cached by its recipe hash); podman's layer cache keeps the two targets cheap after
the first run. What is run here:

- the runtime image as a controller container and a broker container (host network, free
  loopback ports, read-only root filesystem, /tmp on tmpfs, named volumes for data), with the
  file store on a shared volume and with SeaweedFS; a real Kafka client on the host produces and
  consumes; SIGTERM stops (`podman stop`) finish within the grace period in both stop orders
  (exit 0, not podman's SIGKILL after the timeout); data survives container restarts;
- the same image as the operator (`automq operator`) against kmock's API server on the host:
  liveness answers and an AutoMQCluster becomes a StatefulSet;
- the spark image running a tiny `local[1]` job through its entrypoint.

Skipped, with the reason, only where podman is missing or cannot run (`podman info` fails).
podman reads tests/image/containers.conf unless CONTAINERS_CONF is already set: it holds the
settings sandboxes like CI need (no default ulimits, runc, cgroupfs).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
import yaml

from automq.broker.local import free_port, free_port_block

pytestmark = [pytest.mark.image, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/python-local:3.11-bookworm"
# What docs/kubernetes.md tells people to build, and the chart's default repository.
RUNTIME_IMAGE = "ghcr.io/automq-py/automq:0.1.0"
SPARK_IMAGE = "ghcr.io/automq-py/automq-spark:0.1.0"
WAIT_S = 90.0
GRACE_S = 30  # Kubernetes' default terminationGracePeriodSeconds


@dataclass
class Podman:
    env: dict[str, str]
    prefix: str = field(default_factory=lambda: f"automq-test-{uuid.uuid4().hex[:8]}")
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)

    def __call__(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["podman", *args], capture_output=True, text=True, env=self.env, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            pytest.fail(f"podman {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return result

    def volume(self, role: str) -> str:
        name = f"{self.prefix}-{role}"
        self("volume", "create", name)
        self.volumes.append(name)
        return name

    def run_detached(self, role: str, image: str, *args: str, options: list[str]) -> str:
        name = f"{self.prefix}-{role}-{len(self.containers)}"
        self("run", "-d", "--name", name, *options, image, *args)
        self.containers.append(name)
        return name

    def logs(self, name: str) -> str:
        result = self("logs", name, check=False)
        return (result.stdout + result.stderr)[-4000:]

    def stop(self, name: str) -> int:
        """SIGTERM, then SIGKILL after GRACE_S, as the kubelet does; the container's exit code."""
        self("stop", "--time", str(GRACE_S), name, timeout=GRACE_S + 60)
        return int(self("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip())

    def cleanup(self) -> None:
        for name in self.containers:
            self("rm", "--force", "--time", "0", name, check=False)
        for name in self.volumes:
            self("volume", "rm", "--force", name, check=False)


@pytest.fixture(scope="module")
def podman_env() -> dict[str, str]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (bash scripts/install-system-deps.sh installs podman, runc, mmdebstrap)")
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(Path(__file__).with_name("containers.conf")))
    info = subprocess.run(["podman", "info"], capture_output=True, text=True, env=env, check=False)
    if info.returncode != 0:
        pytest.skip(f"podman cannot run here: {info.stderr.strip().splitlines()[-1:]}")
    return env


@pytest.fixture(scope="module")
def engine(podman_env: dict[str, str]) -> Podman:
    """For the module's image builds (builds leave no containers)."""
    return Podman(podman_env)


@pytest.fixture
def podman(podman_env: dict[str, str]) -> Iterator[Podman]:
    """Per test, so a test's containers stop using the CPU as soon as it ends."""
    per_test = Podman(podman_env)
    try:
        yield per_test
    finally:
        per_test.cleanup()


def _build(podman: Podman, target: str, tag: str) -> None:
    podman(
        "build",
        "--build-arg",
        f"PYTHON_IMAGE={BASE_IMAGE}",
        "--target",
        target,
        "--tag",
        tag,
        str(ROOT),
        timeout=1800,
    )


@pytest.fixture(scope="module")
def base_image(engine: Podman) -> str:
    exists = engine("image", "exists", BASE_IMAGE, check=False).returncode == 0
    if not exists and os.geteuid() != 0:
        pytest.skip(f"{BASE_IMAGE} is missing and building it needs root: sudo bash scripts/build-base-image.sh")
    if os.geteuid() == 0:  # the script keeps an image whose recipe hash matches
        result = subprocess.run(
            ["bash", str(ROOT / "scripts" / "build-base-image.sh"), BASE_IMAGE],
            capture_output=True,
            text=True,
            env=engine.env,
            timeout=1200,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    return BASE_IMAGE


@pytest.fixture(scope="module")
def runtime_image(engine: Podman, base_image: str) -> str:
    _build(engine, "runtime", RUNTIME_IMAGE)
    return RUNTIME_IMAGE


@pytest.fixture(scope="module")
def spark_image(engine: Podman, base_image: str) -> str:
    _build(engine, "spark", SPARK_IMAGE)
    return SPARK_IMAGE


# --- helpers ---------------------------------------------------------------------------------


def wait_http_ok(url: str, podman: Podman, container: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        state = podman("inspect", "--format", "{{.State.Status}}", container).stdout.strip()
        if state != "running":
            pytest.fail(f"{container} is {state} before {url} answered:\n{podman.logs(container)}")
        time.sleep(0.3)
    pytest.fail(f"{url} did not answer 200 within {WAIT_S}s:\n{podman.logs(container)}")


@dataclass
class Cluster:
    """A controller container and a broker container sharing one object store."""

    podman: Podman
    image: str
    config_dir: Path
    object_store_url: str
    extra_options: list[str]
    kafka_port: int = field(default_factory=lambda: free_port_block(1))
    controller_http: int = field(default_factory=free_port)
    broker_http: int = field(default_factory=free_port)
    names: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    def write_configs(self) -> None:
        common = {
            "data_dir": "/var/lib/automq/data",
            "object_store_url": self.object_store_url,
            "controller_urls": [f"http://127.0.0.1:{self.controller_http}"],
            "http_host": "127.0.0.1",
        }
        controller = {**common, "node_id": 0, "listeners": [], "http_port": self.controller_http}
        broker = {
            **common,
            "node_id": 1,
            "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": self.kafka_port}],
            "http_port": self.broker_http,
            "kafka": {"group_initial_rebalance_delay_ms": 0},
        }
        self.config_dir.mkdir(parents=True, exist_ok=True)
        (self.config_dir / "controller.yaml").write_text(yaml.safe_dump(controller))
        (self.config_dir / "broker.yaml").write_text(yaml.safe_dump(broker))

    def start(self, role: str, data_volume: str) -> str:
        options = [
            "--network=host",
            "--read-only",
            "--tmpfs=/tmp",
            f"--volume={self.config_dir}:/etc/automq:ro",
            f"--volume={data_volume}:/var/lib/automq/data",
            *self.extra_options,
        ]
        name = self.podman.run_detached(role, self.image, role, "--config", f"/etc/automq/{role}.yaml", options=options)
        self.names[role] = name
        port = self.controller_http if role == "controller" else self.broker_http
        wait_http_ok(f"http://127.0.0.1:{port}/readyz", self.podman, name)
        return name


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(WAIT_S) == 0, "not every record was acknowledged"


def consume(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.append(message.value())
    finally:
        consumer.close()
    return got


# --- the runtime image -----------------------------------------------------------------------


def test_runtime_image_runs_as_uid_10001_with_owned_data_dirs(podman: Podman, runtime_image: str) -> None:
    [inspect] = yaml.safe_load(podman("image", "inspect", runtime_image).stdout)
    assert inspect["Config"]["User"] == "10001:10001"
    assert inspect["Config"]["Entrypoint"] == ["automq"]
    assert podman("run", "--rm", "--read-only", runtime_image, "--version").stdout.strip() == "automq 0.1.0"
    # Docker mounts a new named volume with the ownership of the directory it covers, so the
    # directories must exist and belong to the image's user.
    probe = podman(
        "run",
        "--rm",
        "--entrypoint=sh",
        runtime_image,
        "-c",
        "id -u; stat -c %u:%g /var/lib/automq/data /var/lib/automq/objects; python -m pip --version || echo no-pip",
    ).stdout.split()
    assert probe[:3] == ["10001", "10001:10001", "10001:10001"], probe
    assert probe[-1] == "no-pip"


def test_controller_and_broker_containers_on_the_file_store(podman: Podman, runtime_image: str, tmp_path) -> None:
    objects = podman.volume("objects")
    cluster = Cluster(
        podman,
        runtime_image,
        tmp_path / "config",
        "file:///var/lib/automq/objects",
        extra_options=[f"--volume={objects}:/var/lib/automq/objects"],
    )
    cluster.write_configs()
    controller_data, broker_data = podman.volume("controller-data"), podman.volume("broker-data")
    controller = cluster.start("controller", controller_data)
    broker = cluster.start("broker", broker_data)

    first = [f"first-{i}".encode() for i in range(200)]
    produce(cluster.bootstrap, "image-file", first)
    assert consume(cluster.bootstrap, "image-file", len(first)) == first

    # Broker first (a rolling update's order): both exit 0 within the grace period.
    assert podman.stop(broker) == 0, podman.logs(broker)
    assert podman.stop(controller) == 0, podman.logs(controller)

    # Same containers, same volumes: the data is still there and the topic takes more.
    podman("start", controller)
    wait_http_ok(f"http://127.0.0.1:{cluster.controller_http}/readyz", podman, controller)
    podman("start", broker)
    wait_http_ok(f"http://127.0.0.1:{cluster.broker_http}/readyz", podman, broker)
    second = [f"second-{i}".encode() for i in range(50)]
    produce(cluster.bootstrap, "image-file", second)
    assert consume(cluster.bootstrap, "image-file", len(first) + len(second)) == first + second

    # Controller first (what a node loss or a careless `kubectl delete` does): the broker still
    # stops within the grace period; what it could not upload stays in its WAL volume.
    assert podman.stop(controller) == 0, podman.logs(controller)
    assert podman.stop(broker) == 0, podman.logs(broker)
    podman("start", controller)
    wait_http_ok(f"http://127.0.0.1:{cluster.controller_http}/readyz", podman, controller)
    podman("start", broker)
    wait_http_ok(f"http://127.0.0.1:{cluster.broker_http}/readyz", podman, broker)
    assert consume(cluster.bootstrap, "image-file", len(first) + len(second)) == first + second


@pytest.mark.s3
def test_broker_container_on_seaweedfs_keeps_nothing_of_its_own(
    podman: Podman, runtime_image: str, s3_url: str, tmp_path
) -> None:
    cluster = Cluster(
        podman,
        runtime_image,
        tmp_path / "config",
        s3_url,
        # The SeaweedFS fixture exported its credentials to this process.
        extra_options=[
            f"--env={key}={os.environ[key]}"
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
        ],
    )
    cluster.write_configs()
    cluster.start("controller", podman.volume("s3-controller-data"))
    broker = cluster.start("broker", podman.volume("s3-broker-data"))
    values = [f"s3-{i}".encode() for i in range(300)]
    produce(cluster.bootstrap, "image-s3", values)
    assert consume(cluster.bootstrap, "image-s3", len(values)) == values

    # A graceful stop uploads what the WAL holds; a new broker container on an EMPTY data volume
    # then serves everything from the object store.
    assert podman.stop(broker) == 0, podman.logs(broker)
    podman("rm", broker)
    podman.containers.remove(broker)
    cluster.start("broker", podman.volume("s3-broker-data-2"))
    assert consume(cluster.bootstrap, "image-s3", len(values)) == values


# --- the operator ----------------------------------------------------------------------------


class KubeApiServer:
    """kmock's emulated Kubernetes API on a loopback port, in a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kmock", daemon=True)

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT_S)

    def start(self) -> str:
        self.thread.start()
        return self.call(self._start())

    async def _start(self) -> str:
        import kmock
        from kmock_emulator import ScalingEmulator, install_cluster_crd

        from automq.operator.kube import KubeApi

        self.emulator = ScalingEmulator()
        install_cluster_crd(self.emulator)
        self.server = kmock.Server(self.emulator)
        await self.server.__aenter__()
        self.url = str(self.server.url).rstrip("/")
        self.api = KubeApi(self.url)
        return self.url

    def stop(self) -> None:
        async def shutdown() -> None:
            await self.api.close()
            await self.server.__aexit__(None, None, None)

        self.call(shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)


def test_operator_container_serves_liveness_and_reconciles(podman: Podman, runtime_image: str, tmp_path) -> None:
    from automq.operator.spec import GROUP, VERSION

    api_server = KubeApiServer()
    url = api_server.start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                    "users": [{"name": "test", "user": {"token": "test-token"}}],
                    "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
                    "current-context": "kmock",
                }
            )
        )
        kubeconfig.chmod(0o644)
        liveness = free_port()
        operator = podman.run_detached(
            "operator",
            runtime_image,
            "operator",
            "--all-namespaces",
            f"--liveness=http://127.0.0.1:{liveness}/healthz",
            "--metrics-port=0",
            options=[
                "--network=host",
                "--read-only",
                "--tmpfs=/tmp",
                f"--volume={kubeconfig}:/etc/automq/kubeconfig:ro",
                "--env=KUBECONFIG=/etc/automq/kubeconfig",
            ],
        )
        wait_http_ok(f"http://127.0.0.1:{liveness}/healthz", podman, operator)

        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AutoMQCluster",
            "metadata": {"name": "demo", "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"objectStore": {"bucket": "automq-data"}},
        }
        api_server.call(api_server.api.create(body))
        deadline = time.monotonic() + WAIT_S
        statefulsets: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not statefulsets:
            statefulsets = api_server.call(api_server.api.list("StatefulSet", "default"))
            time.sleep(0.5)
        assert statefulsets, f"the operator in the container made no StatefulSet:\n{podman.logs(operator)}"
        assert {s["spec"]["template"]["spec"]["containers"][0]["image"] for s in statefulsets} == {RUNTIME_IMAGE}
        assert podman.stop(operator) == 0, podman.logs(operator)
    finally:
        api_server.stop()


# --- the spark image -------------------------------------------------------------------------


@pytest.mark.timeout(1800)  # a cold build of the spark target alone takes minutes on a busy 2-core machine
def test_spark_image_runs_a_local_job(podman: Podman, spark_image: str, tmp_path) -> None:
    [inspect] = yaml.safe_load(podman("image", "inspect", spark_image).stdout)
    assert inspect["Config"]["User"] == "10001:10001"
    assert "SPARK_HOME=/opt/spark" in inspect["Config"]["Env"]
    job = tmp_path / "job.py"
    job.write_text(
        "from pyspark.sql import SparkSession\n"
        "import automq.spark\n"
        "spark = SparkSession.builder.appName('image-test').getOrCreate()\n"
        "rows = spark.range(1000).selectExpr('sum(id) AS total').collect()\n"
        "conf = spark.sparkContext.getConf()\n"
        "print('RESULT', rows[0]['total'], spark.sparkContext.master, conf.get('spark.submit.deployMode'),"
        " conf.get('spark.driver.bindAddress'))\n"
        "spark.stop()\n"
    )
    job.chmod(0o644)
    result = podman(
        "run",
        "--rm",
        "--read-only",
        "--tmpfs=/tmp",
        "--network=host",
        "--env=POD_IP=127.0.0.1",
        f"--volume={job}:/jobs/job.py:ro",
        spark_image,
        "driver",
        "--master",
        "local[1]",
        "--conf",
        "spark.ui.enabled=false",
        "/jobs/job.py",
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # the entrypoint's driver mode: spark-submit in client mode, bound to the pod's IP
    assert "RESULT 499500 local[1] client 127.0.0.1" in result.stdout
