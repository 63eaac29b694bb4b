"""Transactional produce vs idempotent produce, and read_committed vs read_uncommitted reads,
measured in the same run on a real local cluster with confluent-kafka (librdkafka). Prints
numbers next to their same-run baselines; asserts nothing.

    python benchmarks/txn_bench.py                              # 2 brokers, 100k x 1 KiB records
    python benchmarks/txn_bench.py --records 300000 --txn-size 500
    python benchmarks/txn_bench.py --bootstrap 127.0.0.1:9092   # an already running cluster

1. baseline: an idempotent producer (acks=all, linger.ms=5), --records records of --size bytes
   to a 4-partition topic, from the first send to the last acknowledgement;
2. the same records from a transactional producer, committing every --txn-size records
   (and once more with 10x smaller transactions): throughput and its ratio to (1) in the same
   round; --rounds alternating rounds, medians printed. The issue's goal is >= 80 %;
3. reading the transactional topic from the start with read_uncommitted (baseline) and
   read_committed (the consumer drops nothing here, but gets aborted-transaction lists and
   markers to skip, and reads only below the last stable offset).

The load generator runs in this process on the same machine as the brokers, so the numbers
include that contention.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from automq.broker import local

MiB = 1 << 20


def start_cluster(brokers: int, data_dir: str) -> tuple[subprocess.Popen[str], str]:
    port = local.free_port_block(brokers)
    cmd = [sys.executable, "-m", "automq.broker.cli", "local", "up", "--brokers", str(brokers)]
    cmd += ["--data-dir", data_dir, "--port", str(port), "--set", "group.initial.rebalance.delay.ms=0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("bootstrap: "):
            return proc, line.split(" ", 1)[1].strip()
    raise RuntimeError(f"the local cluster did not start (exit {proc.wait()})")


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        t = admin.list_topics(name, timeout=10).topics.get(name)
        if t is not None and t.error is None and all(p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.2)


def produce(bootstrap: str, topic: str, records: int, size: int, txn_size: int | None) -> float:
    """Seconds from the first send to the last acknowledgement (or commit)."""
    from confluent_kafka import Producer

    config = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True}
    if txn_size:
        config["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    producer = Producer(config)
    if txn_size:
        producer.init_transactions(60)
    value = os.urandom(size)
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    start = time.perf_counter()
    in_txn = 0
    for i in range(records):
        if txn_size and in_txn == 0:
            producer.begin_transaction()
        while True:
            try:
                producer.produce(topic, value=value, key=str(i).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        in_txn += 1
        if txn_size and in_txn == txn_size:
            producer.commit_transaction(120)
            in_txn = 0
    if txn_size and in_txn:
        producer.commit_transaction(120)
    producer.flush(120)
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} records failed, e.g. {errors[0]}")
    return elapsed


def consume(bootstrap: str, topic: str, records: int, level: str) -> float:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": level,
        }
    )
    consumer.subscribe([topic])
    seen = 0
    start = None
    deadline = time.monotonic() + 300
    while seen < records and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 1.0):
            if msg.error():
                continue
            if start is None:
                start = time.perf_counter()
            seen += 1
    elapsed = time.perf_counter() - (start or time.perf_counter())
    consumer.close()
    if seen < records:
        raise RuntimeError(f"{level}: read {seen} of {records} records")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="an existing cluster (else a local one is started)")
    parser.add_argument("--brokers", type=int, default=2)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--txn-size", type=int, default=1000, help="records per transaction")
    parser.add_argument("--rounds", type=int, default=3, help="alternating idempotent/transactional rounds")
    args = parser.parse_args()
    proc = None
    tmp = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        tmp = tempfile.TemporaryDirectory(prefix="txn-bench-")
        proc, bootstrap = start_cluster(args.brokers, tmp.name)
    try:
        mib = args.records * args.size / MiB
        small = max(1, args.txn_size // 10)
        idem_rates: list[float] = []
        txn_rates: list[float] = []
        small_rates: list[float] = []
        txn_topic = ""
        # alternating rounds: a busy machine's drift hits both sides alike; medians reported
        for _ in range(args.rounds):
            idem_topic, txn_topic, small_topic = (f"bench-{k}-{uuid.uuid4().hex[:6]}" for k in ("idem", "txn", "small"))
            for t in (idem_topic, txn_topic, small_topic):
                create_topic(bootstrap, t, 4)
            idem_rates.append(mib / produce(bootstrap, idem_topic, args.records, args.size, None))
            txn_rates.append(mib / produce(bootstrap, txn_topic, args.records, args.size, args.txn_size))
            small_rates.append(mib / produce(bootstrap, small_topic, args.records, args.size, small))
        idem = statistics.median(idem_rates)
        rows = [
            ("produce idempotent (baseline)", idem, None),
            (f"produce transactional, {args.txn_size}/txn", statistics.median(txn_rates), None),
            (f"produce transactional, {small}/txn", statistics.median(small_rates), None),
        ]
        ratios = [t / i for t, i in zip(txn_rates, idem_rates, strict=True)]
        small_ratios = [t / i for t, i in zip(small_rates, idem_rates, strict=True)]
        ru = consume(bootstrap, txn_topic, args.records, "read_uncommitted")
        rc = consume(bootstrap, txn_topic, args.records, "read_committed")
        rows.append(("read transactional topic, read_uncommitted (baseline)", mib / ru, None))
        rows.append(("read transactional topic, read_committed", mib / rc, ru / rc))
        print(f"{args.records} records x {args.size} B, 4 partitions, {args.brokers} brokers, {args.rounds} rounds")
        for name, rate, ratio in rows:
            tail = f"  ({ratio:.0%} of baseline)" if ratio is not None else ""
            print(f"  {name:<55} {rate:8.1f} MiB/s{tail}")
        print(
            f"  transactional / idempotent per round: {', '.join(f'{r:.0%}' for r in ratios)} "
            f"({args.txn_size}/txn); {', '.join(f'{r:.0%}' for r in small_ratios)} ({small}/txn)"
        )
    finally:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
