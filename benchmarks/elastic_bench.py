"""Elastic operator benchmark on the kubelet harness: the real operator (in this process) against
kmock, real controller/broker processes, a real confluent-kafka load generator (same machine).
Prints numbers next to baselines from the same run; asserts nothing.

    python benchmarks/elastic_bench.py                      # SeaweedFS when its binary is there, else file://
    python benchmarks/elastic_bench.py --store file --interval 5 --drain-partitions 100

Phases (each on its own AutoMQCluster):
1. drain (drain-elastic: the same with spec.balancing on, so scale-in moves partitions off
   maxConcurrentMoves at a time first; drain-bounded, for comparison: the same drain by `automq rebalance --drain 1
   --max-concurrent N`, the balancer's executor): 2 brokers, a topic with 2 x --drain-partitions partitions (about --drain-partitions
   led by each), steady load; `kubectl scale --replicas 1` (the /scale subresource). Measured:
   seconds from the scale request to broker 1 leading nothing (Kafka metadata polled every
   0.2 s), to its pod gone; produce p99 in the 10 s before vs during the drain.
2. scale-out share (needs spec.balancing): 1 broker, balancing on with --interval, load on
   --partitions partitions; scale 1 -> 2. Measured: seconds from the new pod Ready to it
   carrying >= 80 % of its fair share of bytes-in (per-broker rates from the brokers' own
   /metrics, 2 s windows); produce p99 in the 10 s before the scale vs from Ready to share.
3. steady: after phase 2, leader changes (moves) over --steady seconds at the same load.
Baselines: produce p99 at the same rate with nothing moving (phase "before" windows), and the
evaluation interval (a balancer cannot react faster than one interval + one scrape window).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from elastic_probe import BytesInMeter, LeaderWatcher
from kubelet_harness import KubeletHarness
from sequenced_load import SequencedProducer, check_exactly_once, create_topic

from automq.operator.spec import BalancingSpec


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def balancing_supported() -> bool:
    """spec.balancing does something (not the old validated placeholder)."""
    return "placeholder" not in (BalancingSpec.__doc__ or "").lower()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root = Path(tempfile.mkdtemp(prefix="elastic-bench-", dir=args.tmp))
        self.weed = None
        self.store_url: str | None = None
        self.endpoint = "http://127.0.0.1:1"
        self.bucket = "automq-bench"

    def __enter__(self) -> Bench:
        store = self.args.store
        if store == "auto":
            store = "s3" if shutil.which("weed") or _weed() else "file"
        if store == "s3":
            from automq.broker.objectstore.seaweedfs import SeaweedFS

            self.weed = SeaweedFS(data_dir=self.root / "seaweedfs")
            self.weed.start()
            self.weed.export_environment(os.environ)
            self.endpoint = self.weed.endpoint
        self.store = store
        self.stores: dict[str, str] = {}
        self.k8s = KubeletHarness(self.root / "k8s", object_store_url=self.stores if store == "file" else None)
        self.k8s.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.k8s.__exit__(*exc)
        if self.weed is not None:
            self.weed.stop()
        if not self.args.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def spec(self, name: str, brokers: int, **extra: object) -> dict:
        bucket = f"{self.bucket}-{name}"
        if self.weed is not None:
            self.weed.create_bucket(bucket)
        else:
            self.stores[name] = f"file://{self.root}/objects-{name}"
        return {
            "controller": {"replicas": 1},
            "broker": {"replicas": brokers, "wal": {"kind": "volume", "size": "256Mi"}},
            "objectStore": {"bucket": bucket, "endpoint": self.endpoint, "pathStyle": True},
            "deletionPolicy": "Delete",
            **extra,
        }

    # ---------------------------------------------------------------- phase 1

    def drain(self, bounded: int | None = None, elastic: bool = False) -> None:
        """`bounded` None: the operator's scale-in (/scale 2 -> 1); with `elastic`, balancing is on
        (maxConcurrentMoves --bounded-concurrency), so the operator moves partitions off in bounded
        steps before the controller's drain. A number: `automq rebalance --drain 1 --max-concurrent N`
        (the balancer's executor, N moves at a time), for comparison."""
        a, k8s = self.args, self.k8s
        name = "drain" if bounded is None else f"drain{bounded}"
        extra: dict = {}
        if elastic:
            name = "drain-elastic"
            extra["balancing"] = {
                "enabled": True,
                "intervalSeconds": 3600,  # no rebalancing of its own during the run
                "maxConcurrentMoves": a.bounded_concurrency,
            }
        k8s.create_cluster(name, self.spec(name, 2, **extra))
        k8s.wait_ready(name, brokers=2, timeout=180)
        bootstrap = k8s.bootstrap(name)
        create_topic(bootstrap, "drain", 2 * a.drain_partitions)
        watcher = LeaderWatcher(bootstrap, ["drain"], interval_s=0.2).start()
        on_1 = len(watcher.led_by(1))
        load = SequencedProducer(bootstrap, "drain", 2 * a.drain_partitions, rate=a.rate, value_size=1024, name="d")
        load.start()
        time.sleep(a.warmup)
        t_before = time.monotonic()
        time.sleep(10)
        if bounded is None:
            t0 = time.monotonic()
            k8s.scale(name, 1)
        else:
            cmd = [sys.executable, "-m", "automq.broker.cli", "rebalance", "--bootstrap", bootstrap.split(",")[0]]
            cmd += ["--drain", "1", "--max-concurrent", str(bounded), "--max-moves", "100000", "--interval", "2"]
            cli = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            # the CLI measures load for 2 s first: the drain starts with the first move
            k8s.wait_for("first move", lambda: watcher.moves() or cli.poll() is not None, timeout=120, interval=0.05)
            t0 = watcher.moves()[0].at if watcher.moves() else time.monotonic()
        k8s.wait_for("broker 1 drained", lambda: not watcher.led_by(1), timeout=300, interval=0.05)
        drained = time.monotonic()
        if bounded is None:
            k8s.wait_for(f"{name}-broker-1 gone", lambda: k8s.get("Pod", f"{name}-broker-1") is None, timeout=300)
        else:
            out = cli.communicate(timeout=300)[0].decode(errors="replace")
            if cli.returncode != 0:
                print(f"  automq rebalance exited {cli.returncode}: {out[-2000:]}")
        gone = time.monotonic()
        time.sleep(2)
        load.stop()
        watcher.stop()
        checked = check_exactly_once(bootstrap, "drain", [load])
        before = load.latencies(t_before, t0)
        during = load.latencies(t0, drained)
        if bounded is None:
            how = f"balancing on, maxConcurrentMoves {a.bounded_concurrency}" if elastic else "balancing off"
            print(
                f"\n== drain ({how}): scale 2 -> 1 with broker 1 leading {on_1} partitions ({a.rate:.0f} rec/s x 1 KiB)"
            )
            print(
                f"  seconds to drain (scale request -> broker 1 leads nothing):  {drained - t0:7.2f} s   (goal < 10 s)"
            )
            print(f"  seconds until its pod is gone (drain + SIGTERM + exit):       {gone - t0:7.2f} s")
        else:
            print(
                f"\n== drain for comparison: automq rebalance --drain 1 --max-concurrent {bounded}, broker 1 leading "
                f"{on_1} partitions ({a.rate:.0f} rec/s x 1 KiB)"
            )
            print(f"  seconds to drain (first move -> broker 1 leads nothing):     {drained - t0:7.2f} s")
        print(
            f"  produce p99 before (baseline, 10 s):  {pct(before, 0.99):7.1f} ms  p50 {pct(before, 0.5):6.1f} ms  n={len(before)}"
        )
        print(
            f"  produce p99 during the drain:         {pct(during, 0.99):7.1f} ms  p50 {pct(during, 0.5):6.1f} ms  n={len(during)}"
        )
        print(f"  acknowledged records read back exactly once: {checked}")
        self.remove(name)

    def remove(self, name: str) -> None:
        """Brokers first (scale to 0: each drains and exits cleanly), then the cluster."""
        self.k8s.scale(name, 0)
        self.k8s.wait_for(f"{name} without brokers", lambda: not self.k8s.ready_pods(name), timeout=300)
        self.k8s.delete_cluster(name)

    # ---------------------------------------------------------------- phases 2 and 3

    def scale_out(self) -> None:
        a, k8s = self.args, self.k8s
        operator_balancing = balancing_supported() and not a.cli_balancer
        extra = {}
        if operator_balancing:
            extra["balancing"] = {"enabled": True, "intervalSeconds": a.interval, "tolerancePercent": 10}
            driver = f"the operator's balancer (spec.balancing, intervalSeconds {a.interval})"
        else:
            driver = f"`automq rebalance` run in a loop (scrape window {a.interval} s), not the operator"
        k8s.create_cluster("grow", self.spec("grow", 1, **extra))
        k8s.wait_ready("grow", brokers=1, timeout=180)
        bootstrap = k8s.bootstrap("grow")
        create_topic(bootstrap, "grow", a.partitions)
        load = SequencedProducer(bootstrap, "grow", a.partitions, rate=a.rate, value_size=1024, name="g").start()
        watcher = LeaderWatcher(bootstrap, ["grow"], interval_s=0.2).start()
        meter = BytesInMeter(k8s, "grow")
        time.sleep(a.warmup)
        t_before = time.monotonic()
        time.sleep(10)
        t0 = time.monotonic()
        k8s.scale("grow", 2)
        cli = None if operator_balancing else CliBalancer(bootstrap, a.interval).start()
        k8s.wait_for("grow-broker-1 Ready", lambda: k8s.history("grow-broker-1", "ready"), timeout=180)
        ready = k8s.history("grow-broker-1", "ready")[0][0]
        share_at = None
        rates: dict[int, float] = {}
        deadline = time.monotonic() + a.share_timeout
        while time.monotonic() < deadline:
            rates = meter.rates(2.0)
            total = sum(rates.values())
            if len(rates) == 2 and total > 0 and rates.get(1, 0.0) >= 0.8 * total / 2:
                share_at = time.monotonic()
                break
        print(f"\n== scale-out 1 -> 2, {a.partitions} partitions, {a.rate:.0f} rec/s x 1 KiB; moves by {driver}")
        print(f"  scale request -> new pod Ready:       {ready - t0:7.2f} s")
        if share_at is None:
            print(
                f"  new broker never reached 80 % of its fair share within {a.share_timeout:.0f} s; last rates {rates}"
            )
            share_at = time.monotonic()
        else:
            print(
                f"  Ready -> new broker >= 80 % of fair bytes-in share: {share_at - ready:7.2f} s (goal < 30 s; "
                f"measured in 2 s windows, so +-2 s)  rates B/s { ({b: round(r) for b, r in rates.items()}) }"
            )
        before = load.latencies(t_before, t0)
        during = load.latencies(ready, share_at)
        print(f"  produce p99 before (baseline, 10 s):   {pct(before, 0.99):7.1f} ms  n={len(before)}")
        print(f"  produce p99 during the rebalance:      {pct(during, 0.99):7.1f} ms  n={len(during)}")
        moves_to_balance = len(watcher.moves(ready, share_at))
        t_steady = time.monotonic()
        time.sleep(a.steady)
        steady_moves = watcher.moves(t_steady)
        print(f"  moves Ready -> share: {moves_to_balance}")
        print(
            f"  moves over {a.steady:.0f} s of steady load after that: {len(steady_moves)} "
            f"(= {len(steady_moves) * 3600 / a.steady:.0f}/h; goal 0 after convergence)"
        )
        load.stop()
        watcher.stop()
        if cli is not None:
            cli.stop()
            print(f"  rebalance CLI runs: {cli.runs} (exit codes {sorted(set(cli.codes))})")
        print(f"  acknowledged records read back exactly once: {check_exactly_once(bootstrap, 'grow', [load])}")


class CliBalancer:
    """`automq rebalance --bootstrap ...` back to back, as a stand-in balancer loop."""

    def __init__(self, bootstrap: str, interval_s: int) -> None:
        self.cmd = [
            sys.executable,
            "-m",
            "automq.broker.cli",
            "rebalance",
            "--bootstrap",
            bootstrap.split(",")[0],
            "--interval",
            str(interval_s),
            "--tolerance",
            "10",
        ]
        self.runs = 0
        self.codes: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CliBalancer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        while not self._stop.is_set():
            done = subprocess.run(self.cmd, capture_output=True, timeout=300)
            self.runs += 1
            self.codes.append(done.returncode)


def _weed() -> bool:
    try:
        from automq.broker.objectstore.seaweedfs import find_weed_binary

        return bool(find_weed_binary())
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["auto", "s3", "file"], default="auto")
    parser.add_argument("--interval", type=int, default=5, help="balancing evaluation interval, seconds")
    parser.add_argument("--rate", type=float, default=500.0, help="records/s (1 KiB each)")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--drain-partitions", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--steady", type=float, default=60.0)
    parser.add_argument("--share-timeout", type=float, default=120.0)
    parser.add_argument("--phases", default="drain,drain-elastic,drain-bounded,scale-out")
    parser.add_argument("--bounded-concurrency", type=int, default=8, help="moves at once in the drain-bounded phase")
    parser.add_argument(
        "--cli-balancer", action="store_true", help="drive moves with `automq rebalance` even if spec.balancing works"
    )
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"elastic_bench: load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    with Bench(args) as bench:
        print(f"object store: {bench.store}")
        phases = args.phases.split(",")
        if "drain" in phases:
            bench.drain()
        if "drain-elastic" in phases:
            bench.drain(elastic=True)
        if "drain-bounded" in phases:
            bench.drain(bounded=args.bounded_concurrency)
        if "scale-out" in phases:
            bench.scale_out()
    load = os.getloadavg()
    print(f"load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
