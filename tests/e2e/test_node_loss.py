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
from node_loss_scenario import NODE_LOSS_STEPS, run_node_loss
from sequenced_load import check_exactly_once

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
def test_a_frozen_broker_resumed_after_fencing_cannot_append(k8s: KubeletHarness, failover: str) -> None:
    """A zombie: the lost node's broker was frozen, not dead. Once the operator fenced it and
    released its volume it resumes, with producers still sending to its address and the WAL
    file (shared here, as a volume on a node back from a partition) open: it must acknowledge
    nothing that is not read back, and stop by itself (its node epoch is refused)."""
    run = run_node_loss(k8s, {"kind": "volume", "size": "64Mi", "failover": failover}, grace_s=2, zombie=True)
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
