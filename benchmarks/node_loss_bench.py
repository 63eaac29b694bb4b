"""Seconds from a node going NotReady to its broker's partitions served again, per WAL strategy.

    python benchmarks/node_loss_bench.py [--grace 20] [--strategies forceDetach,multiAttach,s3]

Each run is the end-to-end node-loss scenario (tests/support/node_loss_scenario.py) on the kubelet
harness: real controller and broker processes, the real operator, a confluent-kafka producer
(acks=all, idempotent, 300 records/s), and the node under a broker that leads partitions marked
NotReady with its processes SIGKILLed. Reported per strategy:

    served     NotReady -> the operator's PartitionsServed event time (every partition has a
               leader); "seen" is when the benchmark's polling of events noticed it
    grace      spec.broker.nodeLossGracePeriod, included in `served`
    after      served - grace: what detection (controller agreement), fencing, release and WAL
               recovery cost on top of the grace
    resolved   NotReady -> the replacement pod Ready (Degraded cleared)
    where the time goes: seconds after NotReady of each step's event (NodeLost, BrokerFenced,
               PodReleased, VolumeReleased, WalRecovered, PartitionsServed, NodeLossResolved)
               and of the replacement pod's creation and readiness

Baseline, same run: a broker process kill -9'd WITHOUT node loss (the kubelet restarts it in
place and it recovers its own WAL): seconds from the kill until every partition has a leader.
Every run ends with the exactly-once check of everything acknowledged. No timing is asserted.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from kubelet_harness import KubeletHarness
from node_loss_scenario import cluster_spec, leaders, run_node_loss
from sequenced_load import SequencedProducer, check_exactly_once, create_topic

WALS = {
    "forceDetach": {"kind": "volume", "size": "64Mi", "failover": "forceDetach"},
    "multiAttach": {"kind": "volume", "size": "64Mi", "failover": "multiAttach"},
    "s3": {"kind": "s3"},
}


def _harness(root: Path, multi_attach: bool = False) -> KubeletHarness:
    return KubeletHarness(root, object_store_url=(root / "objects").as_uri(), multi_attach=multi_attach)


def baseline(root: Path) -> float:
    with _harness(root) as k8s:
        k8s.create_cluster("demo", cluster_spec(WALS["forceDetach"], 20))
        k8s.wait_ready("demo", brokers=2, timeout=180)
        bootstrap = k8s.bootstrap("demo")
        create_topic(bootstrap, "orders", 4)
        placed = k8s.wait_for("leaders", lambda: (ls := leaders(bootstrap, "orders")) and min(ls.values()) >= 0 and ls)
        load = SequencedProducer(bootstrap, "orders", 4, rate=300, name="p").start()
        k8s.wait_for("records acknowledged", lambda: load.acked_count() > 300)
        victim = f"demo-broker-{max(placed.values())}"
        old = k8s.pod_process(victim).pid
        start = time.monotonic()
        k8s.kill_pod(victim, signal.SIGKILL)
        k8s.wait_for("restarted", lambda: k8s.pod_process(victim).pid not in (None, old), timeout=180)
        k8s.wait_for(
            "every partition led",
            lambda: min(leaders(bootstrap, "orders").values()) >= 0 and victim in k8s.ready_pods("demo"),
        )
        seconds = time.monotonic() - start
        load.stop()
        check_exactly_once(k8s.bootstrap("demo"), "orders", [load])
        return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grace", type=int, default=20, help="spec.broker.nodeLossGracePeriod (s)")
    parser.add_argument("--strategies", default="forceDetach,multiAttach,s3")
    args = parser.parse_args()
    print("# the machine is shared with other engineers' tests: numbers are from a busy machine")
    with tempfile.TemporaryDirectory(prefix="node-loss-bench-") as tmp:
        base = baseline(Path(tmp) / "baseline")
        print(f"baseline  broker kill -9, restarted in place: partitions led again after {base:5.1f} s")
        for strategy in args.strategies.split(","):
            root = Path(tmp) / strategy
            with _harness(root, multi_attach=strategy == "multiAttach") as k8s:
                run = run_node_loss(k8s, WALS[strategy], grace_s=args.grace)
                assert run.load is not None
                run.load.stop()
                checked = check_exactly_once(k8s.bootstrap("demo"), "orders", [run.load])
                print(
                    f"{strategy:12s} served {run.seconds_to_served:5.1f} s  (grace {args.grace} s, after grace "
                    f"{run.seconds_to_served - args.grace:5.1f} s, seen {run.served_at - run.lost_at:5.1f} s)  "
                    f"resolved {run.resolved_at - run.lost_at:5.1f} s  "
                    f"{checked} acknowledged records read back once"
                    + (f"  [job: {run.job_output.splitlines()[1][:90]}]" if run.job_output else "")
                )
                steps = sorted(run.timeline.items(), key=lambda kv: kv[1])
                print(
                    "             where the time goes (s after NotReady): "
                    + ", ".join(f"{k} {v:.1f}" for k, v in steps)
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
