"""A node-loss scenario on the kubelet harness, shared by the end-to-end test and the benchmark.

Real controller and broker processes (one per pod the operator's StatefulSets ask for), the real
operator with its node-loss daemon, real confluent-kafka producers (acks=all, idempotent,
per-partition sequence numbers). The node under a broker that leads partitions is marked
NotReady and its processes are SIGKILLed; the operator is then on its own. The harness enforces
ReadWriteOnce (the replacement pod waits while the WAL volume is attached to the lost node,
until the out-of-service taint or a deleted VolumeAttachment releases it; `multi_attach=True`
for the multiAttach strategy) and runs the operator's WAL-recovery Job as a real process.
"""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import AdminClient
from kubelet_harness import KubeletHarness
from sequenced_load import SequencedProducer, create_topic

NODE_LOSS_STEPS = ["NodeLost", "BrokerFenced", "PodReleased", "VolumeReleased", "WalRecovered", "PartitionsServed"]


def cluster_spec(wal: dict[str, Any], grace_s: int, brokers: int = 2) -> dict[str, Any]:
    return {
        "controller": {"replicas": 1},
        "broker": {"replicas": brokers, "wal": wal, "nodeLossGracePeriod": grace_s},
        "objectStore": {"bucket": "node-loss"},  # the harness replaces the store (object_store_url)
        # Plain clients and controller calls: the security defaults are tested elsewhere
        # (tests/e2e/test_operator_security.py).
        "listeners": [{"name": "PLAINTEXT", "port": 9092}],
        "security": {"controllerApi": {"authentication": "none", "tls": False}},
    }


@dataclass
class NodeLossRun:
    strategy: str
    victim: str = ""
    node: str = ""
    lost_at: float = 0.0  # monotonic, when the node went NotReady
    served_at: float = 0.0  # every partition had a leader again and the load was acknowledged again
    resolved_at: float = 0.0  # NodeLossResolved: the replacement pod Ready
    events: list[str] = field(default_factory=list)
    degraded_seen: str = ""
    job_output: str = ""
    load: SequencedProducer | None = None
    # Seconds after NotReady of each step's event (first occurrence) and of the replacement
    # pod's creation and readiness: where the time goes.
    timeline: dict[str, float] = field(default_factory=dict)
    # zombie=True: the lost broker's process, frozen while its node was lost, resumed once the
    # operator released its volume.
    zombie: subprocess.Popen[bytes] | None = None

    @property
    def seconds_to_served(self) -> float:
        """NotReady -> the operator's PartitionsServed event (its eventTime: the moment the
        operator saw every partition led), else when the test noticed it."""
        return self.timeline.get("PartitionsServed", self.served_at - self.lost_at)


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return {p.id: p.leader for p in md.topics[topic].partitions.values()}


def _events(k8s: KubeletHarness, name: str) -> list[str]:
    """Event reasons in the order they were posted (kmock lists objects in creation order)."""
    return [e.get("reason", "") for e in k8s.events(name)]


def _recovery_job_output(k8s: KubeletHarness, name: str, ordinal: int) -> str:
    """The harness's Job runner ran the operator's WAL-recovery Job as a real process: its
    exit code and output line."""
    job_name = f"{name}-broker-{ordinal}-wal-recovery"

    def finished() -> Any:
        done = next((r for r in k8s.jobs.runs if r.job == job_name and r.exit_code is not None), None)
        # The replacement pod may attach the (multi-attach) volume, recover it and be Ready
        # first: the operator then deletes the Job, whose run is moot.
        return done or ("NodeLossResolved" in _events(k8s, name) and "resolved")

    run = k8s.wait_for(f"Job {job_name} run", finished, timeout=180)
    if run == "resolved":
        return "not finished: the replacement broker recovered its WAL first and the Job was deleted"
    log = (k8s.root / "logs" / f"{run.pod}.log").read_text(errors="replace")
    lines = [line for line in log.splitlines() if line.startswith("node ") or "automq wal recover:" in line]
    return f"exit {run.exit_code}\n" + "\n".join(lines[-2:])


def run_node_loss(
    k8s: KubeletHarness,
    wal: dict[str, Any],
    grace_s: int,
    rate: float = 300.0,
    zombie: bool = False,
    resume_after: str = "VolumeReleased",
) -> NodeLossRun:
    """Create a 2-broker cluster, produce, lose the node of a broker leading partitions, wait
    until the partitions are served again and the replacement is Ready. The load keeps running
    (stop it and check it with `check_exactly_once`).

    `zombie=True`: the lost node's broker is not killed but frozen (SIGSTOP: a hung or
    partitioned node), and resumed (SIGCONT) once the operator has fenced it and released its
    volume, while clients still send it requests; it holds the WAL file and the listen address
    the replacement needs, as a node that comes back from a partition would. `resume_after`:
    the event it resumes on; "PartitionsServed" is the worst case, the replacement has read the
    WAL already and whatever the zombie writes now is never recovered."""
    name = "demo"
    strategy = "s3" if wal.get("kind") == "s3" else wal.get("failover", "forceDetach")
    run = NodeLossRun(strategy)
    k8s.create_cluster(name, cluster_spec(wal, grace_s))
    k8s.wait_ready(name, brokers=2, timeout=180)
    bootstrap = k8s.bootstrap(name)
    create_topic(bootstrap, "orders", 4)
    placed = k8s.wait_for(
        "leaders on both brokers", lambda: (ls := leaders(bootstrap, "orders")) and min(ls.values()) >= 0 and ls
    )
    run.load = SequencedProducer(bootstrap, "orders", 4, client="confluent", rate=rate, name="p").start()
    k8s.wait_for("records acknowledged", lambda: run.load.acked_count() > 300)
    ordinal = max(placed.values())  # a broker that leads partitions
    run.victim = f"{name}-broker-{ordinal}"
    run.node = k8s.node_of(run.victim)
    if zombie:
        state = k8s.pod_process(run.victim)
        assert state is not None and state.process is not None
        run.zombie = state.process
        k8s.signal_pod(run.victim, signal.SIGSTOP)
    run.lost_at = time.monotonic()
    lost_wall = time.time()
    k8s.node_down(run.node, kill=not zombie)

    def degraded() -> str:
        status = (k8s.get("AutoMQCluster", name) or {}).get("status") or {}
        for c in status.get("conditions") or []:
            if c["type"] == "Degraded" and c["status"] == "True" and c["reason"] == "NodeLost":
                return str(c["message"])
        return ""

    run.degraded_seen = k8s.wait_for("Degraded NodeLost", degraded, timeout=120)
    if run.zombie is not None:
        k8s.wait_for(f"{resume_after} (to resume the zombie)", lambda: resume_after in _events(k8s, name), timeout=180)
        run.zombie.send_signal(signal.SIGCONT)
    if strategy == "multiAttach":
        run.job_output = _recovery_job_output(k8s, name, ordinal)

    def served() -> bool:
        return "PartitionsServed" in _events(k8s, name)

    k8s.wait_for("partitions served again", served, timeout=180)
    run.served_at = time.monotonic()
    k8s.wait_for("node loss resolved", lambda: "NodeLossResolved" in _events(k8s, name), timeout=180)
    run.resolved_at = time.monotonic()
    # First occurrence of each step (the Degraded condition also posts a NodeLost Warning).
    seen: list[str] = []
    for reason in _events(k8s, name):
        if reason in [*NODE_LOSS_STEPS, "NodeLossResolved"] and reason not in seen:
            seen.append(reason)
    run.events = seen
    for event in k8s.events(name):
        reason, stamp = event.get("reason", ""), event.get("eventTime") or event.get("firstTimestamp")
        if reason in [*NODE_LOSS_STEPS, "NodeLossResolved"] and reason not in run.timeline and stamp:
            at = dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
            run.timeline[reason] = at - lost_wall
    for at, what, _ in k8s.history(run.victim):
        if at > run.lost_at and what in ("created", "ready"):
            run.timeline.setdefault(f"replacement {what}", at - run.lost_at)
    return run
