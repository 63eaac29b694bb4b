"""Fault soak: the fault suite's faults in a loop, under continuous acks=all idempotent produce.

    python benchmarks/fault_soak.py                 # 5 minutes
    python benchmarks/fault_soak.py --minutes 30 --port 22100 --data-dir /tmp/soak

Starts its own SeaweedFS, a FaultProxy in front of it, and a controller plus two brokers as
real processes (tests/faults/faultkit.py: the same kit the fault suite uses). Two producers
run the whole time (confluent-kafka and kafka-python, each on its own 4-partition topic).
Faults, one after another, round robin: broker kill -9, broker SIGSTOP past the session
timeout, controller kill -9, controller SIGSTOP, object store stall / 503 SlowDown / dropped
replies, SeaweedFS kill -9, a reassignment under load, a reassignment whose old leader is
killed at once, WAL full (store stalled while large records fill the small volume WAL).
After each fault it waits until every partition of both topics acknowledged a record sent
after the fault began (time to serve again), then lets things settle for a moment.

At the end both topics are read back: acknowledged-but-missing, duplicated, reordered and
acknowledged-at-another-offset records are counted. Prints totals; exit status 1 if any of
those is not zero. Times are from whatever machine it runs on (never a pass/fail criterion).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "faults"))

from faultkit import FaultProxy, ProcessCluster, SequenceProducer, kill9_seaweedfs, verify

from automq.broker.objectstore.seaweedfs import SeaweedFS

PARTITIONS = 4
SESSION_TIMEOUT_MS = 4_000
OVERRIDES = {
    "session_timeout_ms": SESSION_TIMEOUT_MS,
    "heartbeat_interval_ms": 500,
    "storage": {"upload_interval_ms": 2_000, "log_cache_bytes": 32 << 20, "block_cache_bytes": 16 << 20},
    "wal": {"capacity": 8 << 20},
}


class Soak:
    def __init__(
        self, cluster: ProcessCluster, proxy: FaultProxy, seaweed: SeaweedFS, producers: list[SequenceProducer]
    ):
        self.cluster = cluster
        self.proxy = proxy
        self.seaweed = seaweed
        self.producers = producers
        self.injected: Counter[str] = Counter()
        self.serve_again: dict[str, list[float]] = defaultdict(list)
        self.gaps: dict[str, list[float]] = defaultdict(list)  # longest ack gap of any partition
        self.never_served: Counter[str] = Counter()
        self.flood: SequenceProducer | None = None
        self.wal_full_events = 0.0  # automq_storage_wal_full increments during wal_full faults

    # ------------------------------------------------------------ faults: each returns t0

    def broker_kill9(self) -> float:
        t0 = time.monotonic()
        self.cluster.kill9(f"broker-{self._busiest_broker()}")
        return t0

    def broker_sigstop(self) -> float:
        t0 = time.monotonic()
        name = f"broker-{self._busiest_broker()}"
        self.cluster.pause(name)
        time.sleep(2 * SESSION_TIMEOUT_MS / 1000)
        self.cluster.resume(name)
        return t0

    def controller_kill9(self) -> float:
        t0 = time.monotonic()
        self.cluster.kill9("controller", restart=False)
        time.sleep(1)
        self.cluster.restart("controller", wait=False)
        return t0

    def controller_sigstop(self) -> float:
        t0 = time.monotonic()
        self.cluster.pause("controller")
        time.sleep(3)
        self.cluster.resume("controller")
        return t0

    def store_stall(self) -> float:
        t0 = time.monotonic()
        self.proxy.stall()
        time.sleep(6)
        self.proxy.heal()
        return t0

    def store_throttle(self) -> float:
        t0 = time.monotonic()
        self.proxy.throttle(0.6)
        time.sleep(8)
        self.proxy.heal()
        return t0

    def store_drop(self) -> float:
        t0 = time.monotonic()
        self.proxy.drop_replies(0.3)
        time.sleep(8)
        self.proxy.heal()
        return t0

    def seaweedfs_kill9(self) -> float:
        t0 = time.monotonic()
        kill9_seaweedfs(self.seaweed)
        time.sleep(2)
        self.seaweed.start()
        return t0

    def reassign(self) -> float:
        producer = self.producers[0]
        leaders = self.cluster.leaders(producer.topic, PARTITIONS)
        partition = int(time.monotonic()) % PARTITIONS
        target = 2 if leaders[partition] == 1 else 1
        t0 = time.monotonic()
        self.cluster.reassign(producer.topic, partition, target)
        return t0

    def reassign_kill9(self) -> float:
        producer = self.producers[1]
        leaders = self.cluster.leaders(producer.topic, PARTITIONS)
        partition = int(time.monotonic()) % PARTITIONS
        old = leaders[partition]
        self.cluster.reassign(producer.topic, partition, 2 if old == 1 else 1)
        t0 = time.monotonic()  # the move is under way: kill the old leader in the middle of it
        self.cluster.kill9(f"broker-{old}")
        return t0

    def wal_full(self) -> float:
        """Stall the store while 16 KiB records fill the 8 MiB WALs: appends wait
        (back-pressure) until the store heals; measured from the heal."""
        assert self.flood is not None
        before = self._wal_full_events()
        self.flood.value_size, self.flood.rate = 16 << 10, 300.0  # ~5 MB/s: the 8 MiB WALs fill in seconds
        self.proxy.stall()
        time.sleep(12)
        self.wal_full_events += max(0.0, self._wal_full_events() - before)  # a restart resets counters
        t0 = time.monotonic()
        self.proxy.heal()
        self.flood.value_size, self.flood.rate = 4 << 10, 20.0
        return t0

    def _wal_full_events(self) -> float:
        return sum(self.cluster.metric(b.name, "automq_storage_wal_full_total") for b in self.cluster.brokers)

    # ------------------------------------------------------------ loop

    def _busiest_broker(self) -> int:
        leaders = self.cluster.leaders(self.producers[0].topic, PARTITIONS)
        counts = Counter(leaders.values())
        return counts.most_common(1)[0][0]

    def run(self, minutes: float, only: list[str] | None = None) -> None:
        kinds = [
            "broker_kill9",
            "store_stall",
            "controller_kill9",
            "store_throttle",
            "broker_sigstop",
            "store_drop",
            "controller_sigstop",
            "reassign",
            "seaweedfs_kill9",
            "reassign_kill9",
            "wal_full",
        ]
        if only:
            unknown = set(only) - set(kinds)
            if unknown:
                raise SystemExit(f"--faults: unknown fault kinds {sorted(unknown)}; known: {', '.join(kinds)}")
            kinds = [k for k in kinds if k in only]
        deadline = time.monotonic() + minutes * 60
        i = 0
        while time.monotonic() < deadline:
            kind = kinds[i % len(kinds)]
            i += 1
            stamp = time.strftime("%H:%M:%S")  # wall clock, to find the fault in the process logs
            started = time.monotonic()
            try:
                t0 = getattr(self, kind)()
            except Exception as exc:
                print(f"  {kind}: could not inject ({exc!r}); skipped", flush=True)
                time.sleep(2)
                continue
            self.injected[kind] += 1
            waits = [p.time_to_serve_again(t0, timeout=180) for p in self.producers]
            time.sleep(1)
            gap = max(p.longest_ack_gap(started) for p in self.producers)
            self.gaps[kind].append(gap)
            if any(w is None for w in waits):
                self.never_served[kind] += 1
                print(f"  {stamp} {kind}: NOT serving again within 180 s", flush=True)
                print(self.cluster.log_tail(lines=10), flush=True)
            else:
                worst = max(w for w in waits if w is not None)
                self.serve_again[kind].append(worst)
                acked = sum(p.acked for p in self.producers)
                print(
                    f"  {stamp} {kind}: serving again after {worst:.2f}s, longest ack gap {gap:.2f}s (acked so far {acked})",
                    flush=True,
                )
            for name in self.cluster.nodes:
                with contextlib.suppress(AssertionError):
                    self.cluster.wait_ready(name, timeout=120)
            time.sleep(2)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--port", type=int, default=None, help="first Kafka port (brokers use port, port+1)")
    parser.add_argument("--data-dir", default=None, help="where processes keep WALs and logs (default: a temp dir)")
    parser.add_argument("--rate", type=float, default=300.0, help="records/s of each sequence producer")
    parser.add_argument("--faults", default="", help="comma-separated fault kinds to cycle through (default: all)")
    args = parser.parse_args()

    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="fault-soak-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    print(f"fault soak: {args.minutes:g} min, data and logs in {data_dir}", flush=True)
    seaweed = SeaweedFS(data_dir=data_dir / "seaweedfs")
    seaweed.start()
    seaweed.export_environment()
    os.environ.update({"AWS_EC2_METADATA_DISABLED": "true"})
    started = time.monotonic()
    try:
        with FaultProxy(seaweed.endpoint) as proxy:
            bucket = seaweed.create_bucket()
            with ProcessCluster(
                data_dir / "cluster", proxy.url_for(bucket), brokers=2, overrides=OVERRIDES, first_port=args.port
            ) as cluster:
                topics = [f"soak-{c}-{uuid.uuid4().hex[:6]}" for c in ("confluent", "kafkapython", "flood")]
                for t in topics:
                    cluster.create_topic(t, PARTITIONS)
                producers = [
                    SequenceProducer(cluster.bootstrap, topics[0], PARTITIONS, "confluent", rate=args.rate),
                    SequenceProducer(cluster.bootstrap, topics[1], PARTITIONS, "kafka-python", rate=args.rate),
                ]
                flood = SequenceProducer(
                    cluster.bootstrap, topics[2], PARTITIONS, "confluent", rate=20.0, value_size=4096
                )
                for p in [*producers, flood]:
                    p.start()
                soak = Soak(cluster, proxy, seaweed, producers)
                soak.flood = flood
                soak.run(args.minutes, [k for k in args.faults.split(",") if k])
                for p in [*producers, flood]:
                    p.stop()
                verdicts = {p.client + ":" + p.topic: verify(p, timeout=600) for p in [*producers, flood]}
    finally:
        seaweed.stop()
    elapsed = time.monotonic() - started

    print(f"\n=== fault soak totals ({elapsed / 60:.1f} min incl. setup and verification; busy shared machine) ===")
    print("faults injected:", ", ".join(f"{k}={v}" for k, v in sorted(soak.injected.items())))
    print(f"faults injected total: {sum(soak.injected.values())}")
    bad = 0
    for name, v in verdicts.items():
        print(f"{name}: {v.summary()}")
        bad += len(v.missing) + len(v.duplicates) + len(v.reordered) + len(v.wrong_offset)
    totals = {
        "acked": sum(v.acked for v in verdicts.values()),
        "missing": sum(len(v.missing) for v in verdicts.values()),
        "duplicated": sum(len(v.duplicates) for v in verdicts.values()),
        "reordered": sum(len(v.reordered) for v in verdicts.values()),
        "wrong_offset": sum(len(v.wrong_offset) for v in verdicts.values()),
        "unknown_outcome": sum(v.unknown_outcome for v in verdicts.values()),
    }
    print("records:", ", ".join(f"{k}={v}" for k, v in totals.items()))
    everything = [s for values in soak.serve_again.values() for s in values]
    print(
        f"time to serve again (all faults, n={len(everything)}): p50 {_pct(everything, 0.5):.2f}s "
        f"p99 {_pct(everything, 0.99):.2f}s max {max(everything, default=float('nan')):.2f}s"
    )
    gaps = [s for values in soak.gaps.values() for s in values]
    print(
        f"longest ack gap of a partition per fault (n={len(gaps)}): p50 {_pct(gaps, 0.5):.2f}s "
        f"p99 {_pct(gaps, 0.99):.2f}s max {max(gaps, default=float('nan')):.2f}s"
    )
    print(f"  {'fault':20s}     n  serve again p50 / max     ack gap p50 / max")
    for kind, values in sorted(soak.serve_again.items()):
        g = soak.gaps.get(kind, [])
        print(
            f"  {kind:20s} {len(values):5d}  {_pct(values, 0.5):7.2f}s / {max(values):7.2f}s"
            f"   {_pct(g, 0.5):7.2f}s / {max(g, default=float('nan')):7.2f}s"
        )
    if soak.never_served:
        print("NOT serving again within 180 s:", dict(soak.never_served))
    print(f"WAL-full waits during wal_full faults: {soak.wal_full_events:.0f} (0: the WAL never filled)")
    print(f"proxy: {dict(soak.proxy.counts)}")
    restarts = {n.name: n.restarts for n in cluster.nodes.values()}
    print(f"process restarts: {restarts}")
    return 1 if bad or soak.never_served else 0


if __name__ == "__main__":
    sys.exit(main())
