"""The real operator, real controller/broker processes and real clients, on the kubelet harness.

The AutoMQCluster is applied to kmock; the operator writes the StatefulSets and the ConfigMap;
`tests/support/kubelet_harness.py` runs a process per pod with the config the operator rendered
(object store: the shared SeaweedFS, through the S3 URL the operator rendered, unchanged).
confluent-kafka and kafka-python produce acks=all idempotent records with sequence numbers;
everything acknowledged is read back exactly once, in order, at the end.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient
from kubelet_harness import KubeletHarness, s3_cluster_spec
from sequenced_load import SequencedProducer, check_exactly_once, create_topic, read_partitions

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.timeout(300)]


@pytest.fixture
def k8s(tmp_path, s3_url) -> Iterator[KubeletHarness]:
    with KubeletHarness(tmp_path) as harness:
        harness.s3_url = s3_url  # type: ignore[attr-defined]
        yield harness


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return {p.id: p.leader for p in md.topics[topic].partitions.values()}


def test_apply_scale_out_and_serve_with_real_clients(k8s: KubeletHarness) -> None:
    k8s.create_cluster("demo", s3_cluster_spec(k8s.s3_url))  # type: ignore[attr-defined]
    k8s.wait_ready("demo", brokers=1)
    pods = {p["metadata"]["name"]: p for p in k8s.list("Pod")}
    assert set(pods) == {"demo-controller-0", "demo-broker-0"}
    broker0 = pods["demo-broker-0"]
    assert broker0["status"]["podIP"] == k8s.pod_process("demo-broker-0").ip
    assert k8s.get("Node", broker0["spec"]["nodeName"])["status"]["conditions"][0]["status"] == "True"

    bootstrap = k8s.bootstrap("demo")
    create_topic(bootstrap, "orders", 4)
    loads = [
        SequencedProducer(bootstrap, "orders", 4, client="confluent", rate=150, name="c").start(),
        SequencedProducer(bootstrap, "orders", 4, client="kafka-python", rate=50, name="k").start(),
    ]
    k8s.wait_for("records acknowledged on one broker", lambda: all(load.acked_count() > 50 for load in loads))

    k8s.scale("demo", 2)  # the /scale subresource, as kubectl scale or an HPA does
    cluster = k8s.wait_ready("demo", brokers=2)
    assert cluster["status"]["brokers"]["ready"] == 2
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    new = k8s.pod_process("demo-broker-1")
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {
        0: (k8s.pod_process("demo-broker-0").ip, k8s.pod_process("demo-broker-0").ports[9092]),
        1: (new.ip, new.ports[9092]),
    }
    # The new broker serves: a topic created now has leaders on it, and a client that knows
    # only the new broker's address produces to and reads from them.
    create_topic(bootstrap, "after-scale", 8)
    placed = leaders(bootstrap, "after-scale")
    assert 1 in placed.values(), placed
    only_new = f"{new.ip}:{new.ports[9092]}"
    fresh = SequencedProducer(only_new, "after-scale", 8, rate=200, name="n").start()
    k8s.wait_for("records on the new broker", lambda: fresh.acked_count() > 200)
    fresh.stop()
    assert {a.partition for a in fresh.acked} >= {p for p, leader in placed.items() if leader == 1}
    assert check_exactly_once(only_new, "after-scale", [fresh]) == fresh.acked_count()

    for load in loads:
        load.stop()
    checked = check_exactly_once(bootstrap, "orders", loads)
    assert checked == sum(load.acked_count() for load in loads) > 100


def test_kill_delete_and_scale_in_keep_every_acknowledged_record(k8s: KubeletHarness) -> None:
    k8s.create_cluster("demo", s3_cluster_spec(k8s.s3_url, brokers=2))  # type: ignore[attr-defined]
    k8s.wait_ready("demo", brokers=2)
    bootstrap = k8s.bootstrap("demo")
    create_topic(bootstrap, "events", 6)
    load = SequencedProducer(bootstrap, "events", 6, rate=200, name="c").start()
    k8s.wait_for("records acknowledged", lambda: load.acked_count() > 100)

    # kill -9: the kubelet restarts the container in the same pod (restartCount 1); the broker
    # replays its WAL and serves again.
    pid = k8s.kill_pod("demo-broker-1", signal.SIGKILL)
    uid = k8s.get("Pod", "demo-broker-1")["metadata"]["uid"]
    k8s.wait_for(
        "demo-broker-1 restarted in place",
        lambda: (
            (p := k8s.get("Pod", "demo-broker-1"))
            and p["metadata"]["uid"] == uid
            and p["status"]["containerStatuses"][0]["restartCount"] == 1
            and "demo-broker-1" in k8s.ready_pods("demo")
        ),
    )
    assert k8s.pod_process("demo-broker-1").pid != pid

    # Graceful delete: Terminating (deletionTimestamp) until the process stopped, then a new pod.
    uid = k8s.get("Pod", "demo-broker-0")["metadata"]["uid"]
    k8s.delete_pod("demo-broker-0")
    k8s.wait_for(
        "demo-broker-0 re-created and Ready",
        lambda: (
            (p := k8s.get("Pod", "demo-broker-0"))
            and p["metadata"]["uid"] != uid
            and "demo-broker-0" in k8s.ready_pods("demo")
        ),
    )
    before = load.acked_count()
    k8s.wait_for("records acknowledged after the restarts", lambda: load.acked_count() > before + 100)

    # Scale in through /scale: the operator drains broker 1 (real controller), then the
    # StatefulSet shrinks and the harness stops the process with SIGTERM.
    proc = k8s.pod_process("demo-broker-1").process
    k8s.scale("demo", 1)
    k8s.wait_ready("demo", brokers=1)
    k8s.wait_for("demo-broker-1 gone", lambda: k8s.get("Pod", "demo-broker-1") is None)
    assert proc.poll() is not None
    assert proc.returncode == 0, k8s.log_tail("demo-broker-1")  # it stopped on SIGTERM, not killed
    time.sleep(1.0)
    load.stop()
    assert set(leaders(bootstrap, "events").values()) == {0}
    assert check_exactly_once(bootstrap, "events", [load]) == load.acked_count()
    assert sum(len(rows) for rows in read_partitions(bootstrap, "events", 6).values()) >= load.acked_count()


def test_node_loss_primitives_for_the_node_loss_tests(k8s: KubeletHarness) -> None:
    """What issue 11's tests build on: a NotReady node, a pod stuck Terminating on it, a force
    delete, the replacement on another node while the old process lives on as a zombie."""
    k8s.create_cluster("demo", s3_cluster_spec(k8s.s3_url))  # type: ignore[attr-defined]
    k8s.wait_ready("demo", brokers=1)
    node = k8s.node_of("demo-broker-0")
    zombie = k8s.pod_process("demo-broker-0").process
    k8s.node_down(node, kill=False)
    assert k8s.get("Node", node)["status"]["conditions"][0]["status"] == "Unknown"
    k8s.wait_for("pod unready on the lost node", lambda: "demo-broker-0" not in k8s.ready_pods("demo"))

    k8s.delete_pod("demo-broker-0")  # graceful: nobody on the lost node confirms it
    time.sleep(1.5)
    stuck = k8s.get("Pod", "demo-broker-0")
    assert stuck["metadata"]["deletionTimestamp"] and stuck["spec"]["nodeName"] == node
    assert zombie.poll() is None

    k8s.delete_pod("demo-broker-0", grace_s=0)  # force: gone at once, the StatefulSet replaces it
    # ... but its WAL volume is still attached to the lost node: the replacement waits.
    k8s.wait_for("replacement blocked on its volume", lambda: k8s.history("demo-broker-0", "volume blocked"))
    waiting = k8s.get("Pod", "demo-broker-0")["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ContainerCreating" and "Multi-Attach error" in waiting["message"], waiting
    assert len(k8s.list("VolumeAttachment")) == 1
    k8s.taint_node(node, "node.kubernetes.io/out-of-service")  # non-graceful node shutdown: detach
    k8s.wait_for(
        "replacement Ready on another node",
        lambda: (
            (p := k8s.get("Pod", "demo-broker-0"))
            and p["spec"]["nodeName"] != node
            and "demo-broker-0" in k8s.ready_pods("demo")
        ),
    )
    # Nothing signalled the lost node's process: it runs on, or exited on its own (a broker
    # fenced by its replacement's registration exits by itself), never by a signal.
    assert zombie.poll() is None or zombie.returncode >= 0, zombie.returncode
    assert k8s.pod_process("demo-broker-0").process is not zombie
    bootstrap = k8s.bootstrap("demo")
    create_topic(bootstrap, "after-loss", 2)
    load = SequencedProducer(bootstrap, "after-loss", 2, rate=100, name="z").start()
    k8s.wait_for("records acknowledged by the replacement", lambda: load.acked_count() > 50)
    load.stop()
    assert check_exactly_once(bootstrap, "after-loss", [load]) == load.acked_count()
    k8s.node_up(node)
    assert k8s.get("Node", node)["status"]["conditions"][0]["status"] == "True"
