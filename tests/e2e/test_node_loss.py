"""Node loss end to end on the kubelet harness: real controller and broker processes, the real
operator, real confluent-kafka producers (acks=all, idempotent, sequence numbers).

The node under a broker leading partitions goes NotReady and its processes are SIGKILLed.
The operator must detect it after the grace, fence the broker at the (real) controller, force-
delete its pod and release or recover its WAL; every acknowledged record is then read back
exactly once, in order. forceDetach: the replacement pod on a healthy node recovers the WAL
from the same volume; multiAttach: the recovery Job's command runs as a real process on the
lost broker's WAL volume while the node is still down (the harness's Job runner), and the
replacement pod's volume attaches only once the operator released it (forceDetach).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubelet_harness import KubeletHarness
from node_loss_scenario import NODE_LOSS_STEPS, cluster_spec, run_node_loss
from sequenced_load import SequencedProducer, check_exactly_once, create_topic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(params=["forceDetach", "multiAttach"])
def failover(request) -> str:
    return request.param


@pytest.fixture
def k8s(tmp_path, failover: str) -> Iterator[KubeletHarness]:
    store = (tmp_path / "objects").as_uri()
    # ReadWriteOnce volumes, except for multiAttach, whose storage attaches to a second node.
    with KubeletHarness(tmp_path, object_store_url=store, multi_attach=failover == "multiAttach") as harness:
        yield harness


def test_lost_node_broker_is_fenced_recovered_and_every_ack_read_once(k8s: KubeletHarness, failover: str) -> None:
    run = run_node_loss(k8s, {"kind": "volume", "size": "64Mi", "failover": failover}, grace_s=2)
    assert run.events[: len(NODE_LOSS_STEPS)] == NODE_LOSS_STEPS, run.events
    assert run.events[-1] == "NodeLossResolved"
    assert f"node {run.node}" in run.degraded_seen and "broker" in run.degraded_seen, run.degraded_seen
    if failover == "multiAttach":
        # The Job replayed the WAL (or found the replacement broker had taken it over first).
        assert run.job_output.startswith(("exit 0", "not finished")), run.job_output
        print("recovery job:", run.job_output.splitlines()[1] if "\n" in run.job_output else run.job_output)
    assert run.load is not None
    before = run.load.acked_count()
    k8s.wait_for("producing after recovery", lambda: run.load.acked_count() > before + 200)
    run.load.stop()
    assert not run.load.errors, run.load.errors[:5]
    bootstrap = k8s.bootstrap("demo")
    assert check_exactly_once(bootstrap, "orders", [run.load]) == run.load.acked_count()
    cluster = k8s.get("AutoMQCluster", "demo")
    degraded = next(c for c in cluster["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] != "NodeLost"


@pytest.mark.parametrize("failover", ["forceDetach"])
@pytest.mark.parametrize("resume_after", ["VolumeReleased", "PartitionsServed"])
def test_a_frozen_broker_resumed_after_fencing_cannot_append(
    k8s: KubeletHarness, failover: str, resume_after: str
) -> None:
    """A zombie: the lost node's broker was frozen, not dead. Once the operator fenced it and
    released its volume (or even later: once the replacement recovered the WAL and serves) it
    resumes, with producers still sending to its address and the WAL file (shared here, as a
    volume on a node back from a partition) open: it must acknowledge nothing that is not read
    back, and stop by itself (its node epoch is refused). Its WAL writes still succeed; its
    acknowledgement lease (storage/ack_lease.py) ran out while it was frozen, so it answers
    nothing until a heartbeat, which tells it it was fenced. Without the lease the producers'
    idempotent sequences give it away: the replacement lacks what the zombie acknowledged and
    answers OUT_OF_ORDER_SEQUENCE_NUMBER, fatal to librdkafka."""
    run = run_node_loss(
        k8s,
        {"kind": "volume", "size": "64Mi", "failover": failover},
        grace_s=2,
        zombie=True,
        resume_after=resume_after,
    )
    assert run.zombie is not None and run.load is not None
    assert run.events[: len(NODE_LOSS_STEPS)] == NODE_LOSS_STEPS, run.events
    k8s.wait_for("the zombie to stop by itself", lambda: run.zombie.poll() is not None, timeout=120)
    assert run.zombie.returncode not in (-9, -15), run.zombie.returncode  # not signalled by the harness
    log = (k8s.root / "logs" / f"{run.victim}.log").read_text(errors="replace")
    assert "was fenced" in log, log[-2000:]
    before = run.load.acked_count()
    k8s.wait_for("producing after recovery", lambda: run.load.acked_count() > before + 200)
    run.load.stop()
    assert check_exactly_once(k8s.bootstrap("demo"), "orders", [run.load]) == run.load.acked_count()


@pytest.mark.parametrize("failover", ["forceDetach"])
def test_a_controller_on_a_lost_node_is_replaced_and_the_cluster_keeps_serving(
    k8s: KubeletHarness, failover: str
) -> None:
    """Two real controllers (one holds the Lease) and a broker; the node under the active
    controller dies. A standby takes over the Lease; the operator force-deletes the pod stuck
    on the dead node after the grace, so the StatefulSet starts it again on a healthy node;
    Degraded ControllerNodeLost until it is Ready; producing and reading back goes on."""
    spec = cluster_spec({"kind": "volume", "size": "64Mi", "failover": failover}, grace_s=2, brokers=1)
    spec["controller"]["replicas"] = 2
    k8s.create_cluster("demo", spec)
    k8s.wait_ready("demo", brokers=1, timeout=180)
    bootstrap = k8s.bootstrap("demo")
    create_topic(bootstrap, "orders", 2)
    load = SequencedProducer(bootstrap, "orders", 2, client="confluent", rate=200, name="c").start()
    k8s.wait_for("records acknowledged", lambda: load.acked_count() > 200)

    def holder() -> str:
        lease = k8s.get("Lease", "demo-controller") or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    active = k8s.wait_for("an active controller", holder)
    pod = f"demo-controller-{int(active.rsplit('-', 1)[1]) - 1000}"  # identity: <host>-<random>-controller-<node id>
    node = k8s.node_of(pod)
    k8s.node_down(node, kill=True)

    def degraded() -> str:
        for c in ((k8s.get("AutoMQCluster", "demo") or {}).get("status") or {}).get("conditions") or []:
            if c["type"] == "Degraded" and c["status"] == "True" and c["reason"] == "ControllerNodeLost":
                return str(c["message"])
        return ""

    message = k8s.wait_for("Degraded ControllerNodeLost", degraded, timeout=120)
    assert pod in message and f"node {node}" in message, message
    k8s.wait_for("another controller leads", lambda: (h := holder()) and h != active, timeout=120)
    k8s.wait_for(
        "the controller replaced on a healthy node",
        lambda: (
            (p := k8s.get("Pod", pod))
            and p["spec"].get("nodeName") not in (None, node)
            and pod in k8s.ready_pods("demo", "controller")
        ),
        timeout=180,
    )
    k8s.wait_for(
        "resolved", lambda: "ControllerNodeLossResolved" in [e.get("reason") for e in k8s.events("demo")], timeout=120
    )
    reasons = [e.get("reason") for e in k8s.events("demo")]
    assert reasons.count("ControllerNodeLost") == 1, reasons
    assert "BrokerFenced" not in reasons  # no broker was on that node
    before = load.acked_count()
    k8s.wait_for("producing after the controller moved", lambda: load.acked_count() > before + 200, timeout=120)
    load.stop()
    assert not load.errors, load.errors[:5]
    assert check_exactly_once(k8s.bootstrap("demo"), "orders", [load]) == load.acked_count()
