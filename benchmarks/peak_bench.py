"""Peak produce throughput of one broker (issue 14 goal 4) with a load generator that does as
little per-record Python work as confluent-kafka allows, next to kafka_bench's generator on
the same cluster in the same run. Prints numbers; asserts nothing.

    python benchmarks/peak_bench.py --duration 20 --port 31000

Why a second generator: on a 2-core machine the load generator shares the cores with the
broker, and kafka_bench's (one process: a Python delivery callback per 1 KiB record on the
producer thread, a per-message loop on the consumer thread, one GIL for both) used more CPU
per MiB than the broker itself (docs/benchmarks.md, "Stop 26"). Here the producer and the
tailing consumer run in their own processes (no shared GIL); only every `--sample`-th record
carries a delivery callback (its send time, for latency percentiles) and the consumer counts
records per `consume()` call, not per message. Throughput is what the tailing consumer read
(every record it counts was acknowledged with acks=all first); errors are those of the
sampled records. CPU seconds per MiB of the broker and of each generator are printed too
(from /proc, whole processes, all threads).
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

MiB = 1 << 20
RECORD = 1024


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _broker_pids(root: int) -> list[int]:
    """Broker processes started under `root` (automq local up)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == root and b"broker" in cmd and b"--config" in cmd:
            found.append(int(entry))
    return found


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


# --------------------------------------------------------------------------- children


def produce_child(bootstrap: str, topic: str, seconds: float, sample: int) -> None:
    from confluent_kafka import Producer
    from kafka_bench import PRODUCER_CONFIG  # the same settings as kafka_bench's generator

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
    latencies: list[float] = []
    errors = [0]
    padding = os.urandom(RECORD - 8)
    plain = struct.pack(">d", 0.0) + padding
    now = time.perf_counter

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors[0] += 1
        else:
            latencies.append(now() - struct.unpack_from(">d", msg.value(), 0)[0])

    produce, poll = producer.produce, producer.poll
    sent = 0
    end = now() + seconds
    print("started", flush=True)
    while True:
        if sent % sample == 0:
            if now() >= end:
                break
            value, callback = struct.pack(">d", now()) + padding, on_delivery
        else:
            value, callback = plain, None
        try:
            if callback is None:
                produce(topic, value)
            else:
                produce(topic, value, on_delivery=callback)
        except BufferError:
            poll(0.001)
            continue
        sent += 1
        if sent % 1024 == 0:
            poll(0)
    producer.flush(120)
    print(
        f"done sent={sent} p50={_pct(latencies, 50)} p99={_pct(latencies, 99)} errors={errors[0]} samples={len(latencies)}",
        flush=True,
    )


def consume_child(bootstrap: str, topic: str) -> None:
    """Counts records until stdin closes; prints `ready` once assigned, then the count."""
    import threading

    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"peak-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 64 * MiB,
            "max.partition.fetch.bytes": 16 * MiB,
            "queued.max.messages.kbytes": 256 * 1024,
        }
    )
    assigned = threading.Event()
    consumer.subscribe([topic], on_assign=lambda c, parts: assigned.set())
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    count = 0
    told = False
    while not stop.is_set():
        got = consumer.consume(10_000, 0.2)
        count += len(got)  # every record of this topic is RECORD bytes; no per-message Python
        if assigned.is_set() and not told:
            print("ready", flush=True)
            told = True
        if got:
            print(f"count {count} {time.perf_counter()}", flush=True)
    consumer.close()


# --------------------------------------------------------------------------- runs


def lean_run(bootstrap: str, partitions: int, seconds: float, sample: int, brokers: list[int]) -> None:
    import kafka_bench

    topic = f"peak-{uuid.uuid4().hex[:6]}"
    kafka_bench.create_topic(bootstrap, topic, partitions)
    me = [sys.executable, __file__]
    consumer = subprocess.Popen(
        [*me, "--consume-child", bootstrap, topic], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert consumer.stdout is not None and consumer.stdin is not None
    for line in consumer.stdout:
        if line.startswith("ready"):
            break
    producer = subprocess.Popen(
        [*me, "--produce-child", bootstrap, topic, str(seconds), str(sample)], stdout=subprocess.PIPE, text=True
    )
    assert producer.stdout is not None
    producer.stdout.readline()  # started
    started = time.perf_counter()
    cpu0 = {pid: _cpu_seconds(pid) for pid in (*brokers, producer.pid, consumer.pid)}
    # the consumer's running count, read by a thread
    import threading

    counts: list[tuple[int, float]] = []

    def follow() -> None:
        assert consumer.stdout is not None
        for line in consumer.stdout:
            if line.startswith("count "):
                _, n, at = line.split()
                counts.append((int(n), float(at)))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    base = 0  # a new topic: the consumer counts from its first record
    done = producer.stdout.readline()
    fields = dict(part.split("=") for part in done.split()[1:])
    sent = int(fields["sent"])
    cpu1 = {pid: _cpu_seconds(pid) for pid in cpu0 if pid != producer.pid}
    # the producer exits right after its line: its CPU from its own rusage, reaped here
    _, status, usage = os.wait4(producer.pid, 0)
    producer.returncode = os.waitstatus_to_exitcode(status)
    cpu1[producer.pid] = usage.ru_utime + usage.ru_stime
    elapsed = time.perf_counter() - started
    deadline = time.perf_counter() + 30  # the consumer reads what was acknowledged last
    while time.perf_counter() < deadline and not (counts and counts[-1][0] - base >= sent):
        time.sleep(0.1)
    consumer.stdin.close()
    consumer.wait(60)
    reader.join(5)
    read = (counts[-1][0] - base) if counts else 0
    read_s = (counts[-1][1] - started) if counts else float("nan")  # perf_counter: one clock for all processes
    cpu_mib = lambda pids: sum(cpu1[p] - cpu0[p] for p in pids) * 1000 / max(sent * RECORD / MiB, 1e-9)  # noqa: E731
    print(
        f"lean generator (own processes, latency of 1 in {sample} records): produced {sent * RECORD / MiB / elapsed:.1f} MiB/s "
        f"(sent and flushed), tailing consumer read {read * RECORD / MiB / read_s:.1f} MiB/s ({read}/{sent} records); latency p50 "
        f"{float(fields['p50']) * 1000:.1f} ms p99 {float(fields['p99']) * 1000:.1f} ms ({fields['samples']} samples); "
        f"errors {fields['errors']} (sampled); CPU ms per MiB: broker {cpu_mib(brokers):.2f}, "
        f"producer {cpu_mib([producer.pid]):.2f}, consumer {cpu_mib([consumer.pid]):.2f}"
    )


def baseline_run(bootstrap: str, partitions: int, seconds: float, brokers: list[int]) -> None:
    import kafka_bench

    cpu0 = {pid: _cpu_seconds(pid) for pid in (*brokers, os.getpid())}
    started = time.perf_counter()
    kafka_bench.throughput(bootstrap, seconds, partitions)  # prints its own line
    cpu1 = {pid: _cpu_seconds(pid) for pid in cpu0}
    wall = time.perf_counter() - started
    print(
        f"  (kafka_bench generator, whole call of {wall:.0f} s incl. set-up: broker {sum(cpu1[p] - cpu0[p] for p in brokers) / wall:.2f} "
        f"cores, generator {(cpu1[os.getpid()] - cpu0[os.getpid()]) / wall:.2f} cores)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0, help="Kafka port of the started broker (default: a free one)")
    ap.add_argument("--object-store", help="object store URL for the started cluster (default: embedded file://)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of each produce run")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--sample", type=int, default=16, help="one record in this many carries a delivery callback")
    ap.add_argument("--rounds", type=int, default=2, help="baseline and lean runs, alternating")
    ap.add_argument("--produce-child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--consume-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.produce_child:
        bootstrap, topic, seconds, sample = args.produce_child
        produce_child(bootstrap, topic, float(seconds), int(sample))
        return 0
    if args.consume_child:
        consume_child(*args.consume_child)
        return 0
    sys.path.insert(0, str(Path(__file__).parent))
    import kafka_bench

    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at start")
    cluster_args = argparse.Namespace(
        bootstrap="", brokers=1, port=args.port, object_store=args.object_store, seaweedfs=False
    )
    with kafka_bench.Cluster(cluster_args) as cluster:
        assert cluster.process is not None
        brokers = _broker_pids(cluster.process.pid)
        print(f"cluster: {cluster.bootstrap} (one broker, pid {brokers})")
        for _ in range(args.rounds):
            baseline_run(cluster.bootstrap, args.partitions, args.duration, brokers)
            lean_run(cluster.bootstrap, args.partitions, args.duration, args.sample, brokers)
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
