"""Consume throughput of a KIP-932 share group next to a classic consumer group, on the same
topic, in the same run. Prints numbers; asserts nothing.

    python benchmarks/share_group_bench.py                         # 1 broker, 6 partitions, 100k x 100 B, 2 rounds
    python benchmarks/share_group_bench.py --share-consumers 3 --brokers 3
    python benchmarks/share_group_bench.py --backlog               # drain records produced beforehand

An `automq local up` cluster (real processes, file:// object store). Each round creates a
topic and starts, on it, both groups at once:
- classic: --classic-consumers librdkafka Consumers in one classic group,
- share: --share-consumers librdkafka ShareConsumers in one share group (implicit
  acknowledgement: each poll accepts the previous poll's records, so each acceptance is made
  durable by the partition leader: one conditional PUT of the share-partition's state per
  acknowledgement round and partition).
Once both groups are settled (every partition assigned, every share-partition initialised,
two share heartbeats later), one producer writes --records records and each group's time
runs from the first produce call until its members together received every record. Both
groups read the same records at the same time, on the same machine load; the producer's own
time is printed as the floor neither can beat.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from automq.broker import local
from automq.broker.kafka.share.state_store import group_prefix


def start_cluster(data: Path, port: int, brokers: int, heartbeat_ms: int) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "automq.broker.cli", "local", "up", "--brokers", str(brokers)]
    cmd += ["--data-dir", str(data), "--port", str(port), "--set", "group.initial.rebalance.delay.ms=0"]
    cmd += ["--set", f"group.share.heartbeat.interval.ms={heartbeat_ms}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("bootstrap: "):
            return proc, line.split(" ", 1)[1].strip()
    stop_cluster(proc)
    raise SystemExit(f"the local cluster did not start; logs under {data}/logs")


def stop_cluster(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        t = admin.list_topics(topic, timeout=10).topics.get(topic)
        if t is not None and len(t.partitions) == partitions and all(p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.2)
    raise SystemExit("the topic's partitions got no leaders")


def produce(bootstrap: str, topic: str, records: int, size: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 256 * 1024, "acks": "all"})
    value = b"x" * size
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, key=str(i).encode())
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise SystemExit("records not delivered")


class Members:
    """Consumers of one group in threads, counting the records they receive."""

    def __init__(self, kind: str, bootstrap: str, topic: str, group: str, count: int) -> None:
        self.kind, self.bootstrap, self.topic, self.group = kind, bootstrap, topic, group
        self.lock = threading.Lock()
        self.received = 0
        self.assigned: set[int] = set()
        self.stop = threading.Event()
        self.reached: float | None = None
        self.target = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        for t in self.threads:
            t.start()

    def _count(self, n: int) -> None:
        with self.lock:
            self.received += n
            if self.reached is None and self.target and self.received >= self.target:
                self.reached = time.perf_counter()

    def _run(self) -> None:
        if self.kind == "classic":
            from confluent_kafka import Consumer

            c = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": self.group,
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                }
            )

            def on_assign(_consumer, partitions) -> None:
                with self.lock:
                    self.assigned |= {p.partition for p in partitions}

            c.subscribe([self.topic], on_assign=on_assign)
            try:
                while not self.stop.is_set():
                    self._count(sum(1 for m in c.consume(1000, 0.2) if m.error() is None))
            finally:
                c.close()
        else:
            from confluent_kafka import ShareConsumer

            s = ShareConsumer({"bootstrap.servers": self.bootstrap, "group.id": self.group})
            s.subscribe([self.topic])
            try:
                while not self.stop.is_set():
                    self._count(sum(1 for m in s.poll(0.2) if m.error() is None))
                s.commit_sync(60)
            finally:
                s.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)


def settle(data: Path, classic: Members, share: Members, partitions: int, heartbeat_s: float) -> None:
    root = data / "objects" / group_prefix(share.group)
    deadline = time.monotonic() + 120
    while len(classic.assigned) < partitions or len(list(root.glob("*%obj"))) < partitions:
        if time.monotonic() > deadline:
            raise SystemExit("the groups did not settle within 120 s")
        time.sleep(0.1)
    time.sleep(2 * heartbeat_s)  # share members' assignments converge by heartbeats


def set_earliest(bootstrap: str, group: str) -> None:
    """share.auto.offset.reset=earliest as a group config (a backlog is read from its start)."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(30)
    time.sleep(1.0)  # every broker learns it from the controller's metadata


def backlog(args: argparse.Namespace) -> None:
    """--backlog: the records are in the topic before either group starts; each group, one
    after the other (alternating which goes first), drains them from the start. A share
    group's members join one by one, so with several of them the time includes the
    assignment converging (heartbeats, --heartbeat-ms)."""
    results: dict[str, list[float]] = {"classic": [], "share": []}
    with tempfile.TemporaryDirectory(prefix="share-bench-") as tmp:
        data = Path(tmp)
        port = args.port if args.port is not None else local.free_port_block(args.brokers)
        proc, bootstrap = start_cluster(data, port, args.brokers, args.heartbeat_ms)
        try:
            for r in range(args.rounds):
                topic = f"share-backlog-{r}"
                create_topic(bootstrap, topic, args.partitions)
                produce(bootstrap, topic, args.records, args.size)
                suffix = uuid.uuid4().hex[:8]
                set_earliest(bootstrap, f"share-{suffix}")
                for kind in ("classic", "share") if r % 2 == 0 else ("share", "classic"):
                    count = args.classic_consumers if kind == "classic" else args.share_consumers
                    start = time.perf_counter()
                    members = Members(kind, bootstrap, topic, f"{kind}-{suffix}", count)
                    members.target = args.records
                    try:
                        deadline = time.monotonic() + 600
                        while members.reached is None and time.monotonic() < deadline:
                            time.sleep(0.02)
                        if members.reached is None:
                            raise SystemExit(f"{kind} got {members.received} of {args.records}")
                        results[kind].append(members.reached - start)
                    finally:
                        members.close()
                print(
                    f"round {r + 1}: classic group {results['classic'][-1]:.2f} s, "
                    f"share group {results['share'][-1]:.2f} s",
                    flush=True,
                )
        finally:
            stop_cluster(proc)
    print(
        f"\n{args.brokers} broker(s), {args.partitions} partitions, backlog of {args.records} x {args.size} B, "
        f"median of {args.rounds} rounds (time from the members' start to the last record received)"
    )
    print("| reader | members | seconds | records/s | MB/s |")
    print("|---|---|---|---|---|")
    for kind, label, n in (
        ("classic", "classic group (baseline)", args.classic_consumers),
        ("share", "share group (KIP-932)", args.share_consumers),
    ):
        took = statistics.median(results[kind])
        print(
            f"| {label} | {n} | {took:.2f} | {args.records / took:,.0f} | {args.records * args.size / took / 1e6:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--classic-consumers", type=int, default=1)
    parser.add_argument("--share-consumers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--heartbeat-ms", type=int, default=1000, help="group.share.heartbeat.interval.ms")
    parser.add_argument("--port", type=int, default=None, help="the cluster's first port (default: a free block)")
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="produce first, then time each group (one after the other) draining the backlog from its start",
    )
    args = parser.parse_args()
    if args.backlog:
        backlog(args)
        return

    results: dict[str, list[float]] = {"producer": [], "classic": [], "share": []}
    with tempfile.TemporaryDirectory(prefix="share-bench-") as tmp:
        data = Path(tmp)
        port = args.port if args.port is not None else local.free_port_block(args.brokers)
        proc, bootstrap = start_cluster(data, port, args.brokers, args.heartbeat_ms)
        try:
            for r in range(args.rounds):
                topic = f"share-bench-{r}"
                create_topic(bootstrap, topic, args.partitions)
                suffix = uuid.uuid4().hex[:8]
                classic = Members("classic", bootstrap, topic, f"classic-{suffix}", args.classic_consumers)
                share = Members("share", bootstrap, topic, f"share-{suffix}", args.share_consumers)
                try:
                    settle(data, classic, share, args.partitions, args.heartbeat_ms / 1000)
                    classic.target = share.target = args.records
                    start = time.perf_counter()
                    produce(bootstrap, topic, args.records, args.size)
                    results["producer"].append(time.perf_counter() - start)
                    deadline = time.monotonic() + 600
                    while (classic.reached is None or share.reached is None) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    if classic.reached is None or share.reached is None:
                        raise SystemExit(
                            f"classic got {classic.received}, share got {share.received} of {args.records}"
                        )
                    results["classic"].append(classic.reached - start)
                    results["share"].append(share.reached - start)
                finally:
                    classic.close()
                    share.close()
                print(
                    f"round {r + 1}: producer {results['producer'][-1]:.2f} s, classic group "
                    f"{results['classic'][-1]:.2f} s, share group {results['share'][-1]:.2f} s",
                    flush=True,
                )
        finally:
            stop_cluster(proc)

    print(
        f"\n{args.brokers} broker(s), {args.partitions} partitions, {args.records} x {args.size} B, "
        f"median of {args.rounds} rounds (time from the first produce call to the last record received)"
    )
    print("| reader | members | seconds | records/s | MB/s |")
    print("|---|---|---|---|---|")
    for kind, label, n in (
        ("producer", "producer alone (floor)", 1),
        ("classic", "classic group (baseline)", args.classic_consumers),
        ("share", "share group (KIP-932)", args.share_consumers),
    ):
        took = statistics.median(results[kind])
        print(
            f"| {label} | {n} | {took:.2f} | {args.records / took:,.0f} | {args.records * args.size / took / 1e6:.1f} |"
        )


if __name__ == "__main__":
    main()
