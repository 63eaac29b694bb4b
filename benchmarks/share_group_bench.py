"""Consume throughput of a KIP-932 share group next to a classic consumer group, on the same
topic, in the same run. Prints numbers; asserts nothing.

    python benchmarks/share_group_bench.py                         # 1 broker, 6 partitions, 100k x 100 B, 2 rounds
    python benchmarks/share_group_bench.py --share-consumers 3 --brokers 3

An `automq local up` cluster (real processes, file:// object store). Each round creates a
topic, lets a share group initialise its share-partitions (share.auto.offset.reset=latest puts
them at the end of the empty topic), produces --records records, then reads all of them:
- classic: one librdkafka Consumer (classic protocol, auto.offset.reset=earliest, no commits),
- share: --share-consumers librdkafka ShareConsumers (implicit acknowledgement: each poll
  accepts the previous poll's records, so every record's acceptance is made durable by the
  partition leader: one conditional PUT of the share-partition's state per acknowledgement
  round and partition).
The two alternate which goes first from round to round so both see the same machine load.
Time runs from the first poll until every record was received (share: and acknowledged with
a final commit_sync).
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


def start_cluster(data: Path, port: int, brokers: int) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "automq.broker.cli", "local", "up", "--brokers", str(brokers)]
    cmd += ["--data-dir", str(data), "--port", str(port), "--set", "group.initial.rebalance.delay.ms=0"]
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


def init_share_group(bootstrap: str, data: Path, topic: str, group: str, partitions: int) -> None:
    """Poll until every share-partition has its durable state (written on the group's first
    ShareFetch of it), then leave: the share-partition start offsets sit at the (empty) end."""
    from confluent_kafka import ShareConsumer

    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    consumer.subscribe([topic])
    root = data / "objects" / group_prefix(group)
    deadline = time.monotonic() + 60
    try:
        while len(list(root.glob("*%obj"))) < partitions:
            if time.monotonic() > deadline:
                raise SystemExit("the share group did not fetch every partition within 60 s")
            consumer.poll(0.2)
    finally:
        consumer.close()


def run_classic(bootstrap: str, topic: str, records: int) -> float:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"classic-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got = 0
    start = None
    deadline = time.monotonic() + 600
    try:
        while got < records and time.monotonic() < deadline:
            batch = consumer.consume(1000, 0.5)
            if start is None:
                start = time.perf_counter()
            got += sum(1 for m in batch if m.error() is None)
    finally:
        consumer.close()
    assert start is not None
    if got < records:
        raise SystemExit(f"classic consumer got {got} of {records}")
    return time.perf_counter() - start


def run_share(bootstrap: str, topic: str, group: str, records: int, consumers: int) -> float:
    from confluent_kafka import ShareConsumer

    lock = threading.Lock()
    received = [0]
    done = threading.Event()
    started: list[float] = []

    def member() -> None:
        c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
        c.subscribe([topic])
        try:
            while not done.is_set():
                batch = c.poll(0.5)
                with lock:
                    if not started:
                        started.append(time.perf_counter())
                n = sum(1 for m in batch if m.error() is None)
                if n:
                    with lock:
                        received[0] += n
                        if received[0] >= records:
                            done.set()
            c.commit_sync(60)  # the last poll's records are accepted too
        finally:
            c.close()

    threads = [threading.Thread(target=member, daemon=True) for _ in range(consumers)]
    for t in threads:
        t.start()
    done.wait(600)
    done.set()
    for t in threads:
        t.join(120)
    end = time.perf_counter()
    if received[0] < records:
        raise SystemExit(f"share consumers got {received[0]} of {records}")
    return end - started[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--share-consumers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=None, help="the cluster's first port (default: a free block)")
    args = parser.parse_args()

    results: dict[str, list[float]] = {"classic": [], "share": []}
    with tempfile.TemporaryDirectory(prefix="share-bench-") as tmp:
        data = Path(tmp)
        port = args.port if args.port is not None else local.free_port_block(args.brokers)
        proc, bootstrap = start_cluster(data, port, args.brokers)
        try:
            for r in range(args.rounds):
                topic, group = f"share-bench-{r}", f"share-bench-{uuid.uuid4().hex[:8]}"
                create_topic(bootstrap, topic, args.partitions)
                init_share_group(bootstrap, data, topic, group, args.partitions)
                produce(bootstrap, topic, args.records, args.size)
                order = ("classic", "share") if r % 2 == 0 else ("share", "classic")
                for kind in order:
                    if kind == "classic":
                        took = run_classic(bootstrap, topic, args.records)
                    else:
                        took = run_share(bootstrap, topic, group, args.records, args.share_consumers)
                    results[kind].append(took)
                    print(
                        f"round {r + 1} {kind:7s}: {args.records} records in {took:.2f} s = "
                        f"{args.records / took:,.0f} records/s, {args.records * args.size / took / 1e6:.1f} MB/s",
                        flush=True,
                    )
        finally:
            stop_cluster(proc)

    print(
        f"\n{args.brokers} broker(s), {args.partitions} partitions, {args.records} x {args.size} B, "
        f"median of {args.rounds} rounds"
    )
    print("| group | consumers | records/s | MB/s |")
    print("|---|---|---|---|")
    for kind, label, n in (
        ("classic", "classic (baseline)", 1),
        ("share", "share group (KIP-932)", args.share_consumers),
    ):
        took = statistics.median(results[kind])
        print(f"| {label} | {n} | {args.records / took:,.0f} | {args.records * args.size / took / 1e6:.1f} |")


if __name__ == "__main__":
    main()
