"""Kafka-level benchmark: a real local cluster, confluent-kafka (librdkafka) as the load
generator. Prints numbers next to baselines measured in the same run; asserts nothing.

    python benchmarks/kafka_bench.py                         # short default run (~1 min)
    python benchmarks/kafka_bench.py --catchup-bytes 1GiB --reassign-large 1GiB --duration 30
    python benchmarks/kafka_bench.py --seaweedfs              # object store: a local SeaweedFS
    python benchmarks/kafka_bench.py --bootstrap 127.0.0.1:9092   # an already running cluster

What it measures:
1. baselines: loopback TCP throughput (one socket, 1 MiB writes) and fsync'd file writes
   (1 MiB writes, fdatasync each) on this machine;
2. produce throughput (MiB/s) and produce latency p50/p99 (send -> acknowledgement) with
   acks=all, 1 KiB records, as fast as the producer goes, with one consumer tailing;
3. the same at a fixed rate (default 10 MiB/s): latency p50/p99 at that load;
4. catch-up read: a consumer reads --catchup-bytes written earlier from the beginning while
   producing continues at the fixed rate; read MiB/s and the produce p99 meanwhile;
5. partition reassignment time for a partition holding 10 MiB and one holding
   --reassign-large: from AlterPartitionReassignments until a produce to the partition is
   acknowledged by the new leader.

The load generator runs in this Python process on the same machine as the brokers (2 cores
here), so the numbers include that contention; latency is measured in the delivery callback,
so it includes the producer's own queueing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from automq.broker import local
from automq.broker.config import parse_size

MiB = 1 << 20
RECORD = 1024
UPLOAD_BLOCK = 64 * MiB  # storage.upload_block_bytes' default


# --------------------------------------------------------------------------- cluster


class Cluster:
    """`automq local up` in a subprocess, or an existing bootstrap."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.process: subprocess.Popen[str] | None = None
        self.seaweed = None
        self.bucket = ""
        self.tmp: tempfile.TemporaryDirectory[str] | None = None
        self.bootstrap = args.bootstrap or ""
        self.metrics_urls: list[str] = []  # brokers' /metrics (a started cluster only)

    def __enter__(self) -> Cluster:
        if self.bootstrap:
            return self
        self.tmp = tempfile.TemporaryDirectory(prefix="kafka-bench-")
        object_store = self.args.object_store
        if self.args.seaweedfs:
            from automq.broker.objectstore.seaweedfs import SeaweedFS

            self.seaweed = SeaweedFS(data_dir=Path(self.tmp.name) / "seaweedfs")
            self.seaweed.start()
            self.seaweed.export_environment()
            self.bucket = self.seaweed.create_bucket()
            object_store = self.seaweed.url_for(self.bucket)
        port = self.args.port or local.free_port_block(self.args.brokers)
        cmd = [
            sys.executable,
            "-m",
            "automq.broker.cli",
            "local",
            "up",
            "--brokers",
            str(self.args.brokers),
            "--data-dir",
            str(Path(self.tmp.name) / "cluster"),
            "--port",
            str(port),
            # the consumer phase measures fetching, not Kafka's 3 s wait for more group members
            "--set",
            "group.initial.rebalance.delay.ms=0",
        ]
        for item in getattr(self.args, "set", None) or ():  # peak_bench builds its own args
            cmd += ["--set", item]
        if object_store:
            cmd += ["--object-store", object_store]
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
        )
        assert self.process.stdout is not None
        deadline = time.monotonic() + 180
        for line in self.process.stdout:
            if line.startswith("bootstrap: "):
                self.bootstrap = line.split(" ", 1)[1].strip()
                break
            if time.monotonic() > deadline:
                break
        config_dir = Path(self.tmp.name) / "cluster" / "config"
        for path in sorted(config_dir.glob("broker-*.yaml")):
            http_port = (yaml.safe_load(path.read_text()) or {}).get("http_port")
            if http_port:
                self.metrics_urls.append(f"http://127.0.0.1:{http_port}/metrics")
        if not self.bootstrap:
            self.__exit__()
            raise SystemExit(
                "the local cluster did not start; see its logs under " + str(Path(self.tmp.name) / "cluster" / "logs")
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        if self.seaweed is not None:
            self.seaweed.stop()
        if self.tmp is not None:
            self.tmp.cleanup()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(60)
    leaders(bootstrap, name, partitions)


def leaders(bootstrap: str, name: str, partitions: int, timeout: float = 60, admin=None) -> dict[int, int]:
    from confluent_kafka.admin import AdminClient

    admin = admin or AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t = admin.list_topics(name, timeout=10).topics.get(name)
        if (
            t is not None
            and t.error is None
            and len(t.partitions) == partitions
            and all(p.leader >= 0 for p in t.partitions.values())
        ):
            return {p.id: p.leader for p in t.partitions.values()}
        time.sleep(0.1)
    raise RuntimeError(f"no leaders for {name}")


# --------------------------------------------------------------------------- baselines


def loopback_tcp_mib_s(total: int = 512 * MiB) -> float:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def sink() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv_into(buf):
                pass

    buf = bytearray(MiB)
    t = threading.Thread(target=sink, daemon=True)
    t.start()
    chunk = os.urandom(MiB)
    with socket.create_connection(("127.0.0.1", port)) as c:
        start = time.perf_counter()
        for _ in range(total // MiB):
            c.sendall(chunk)
    t.join()
    elapsed = time.perf_counter() - start
    server.close()
    return total / MiB / elapsed


def fsync_write_mib_s(directory: str, total: int = 64 * MiB, block: int = MiB) -> tuple[float, float]:
    """(MiB/s, p99 ms per write+fdatasync) of block-sized writes each made durable."""
    chunk = os.urandom(block)
    path = Path(directory) / f"fsync-{uuid.uuid4().hex}"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        start = time.perf_counter()
        for _ in range(total // block):
            t0 = time.perf_counter()
            os.write(fd, chunk)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return total / MiB / elapsed, _pct(times, 99) * 1000


def raw_ranged_get_mib_s(seaweed, bucket: str, total: int, threads: int = 8, part: int = 4 * MiB) -> float:
    """MiB/s of `threads` threads reading the bucket's objects (the catch-up's data) in
    `part`-sized ranged GETs over plain http.client into reused buffers: what the server
    gives a client with no per-request SDK work (URLs presigned up front) and no event loop.
    Reads `total` bytes, going round the objects again if they hold less."""
    client = seaweed.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    objects = [(o["Key"], o["Size"]) for page in pages for o in page.get("Contents", []) if o["Size"]]
    if not objects:
        return float("nan")
    urls = {
        key: urllib.parse.urlsplit(
            client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=3600)
        )
        for key, _ in objects
    }
    work: list[tuple[str, int, int]] = []
    while sum(e - s for _, s, e in work) < total:
        work += [(key, off, min(size, off + part)) for key, size in objects for off in range(0, size, part)]
    work.reverse()
    lock = threading.Lock()
    read = [0]

    def worker() -> None:
        import http.client

        endpoint = urllib.parse.urlsplit(seaweed.endpoint)
        conn = http.client.HTTPConnection(endpoint.hostname, endpoint.port)
        buf = memoryview(bytearray(part))
        while True:
            with lock:
                if not work or read[0] >= total:
                    return
                key, start, end = work.pop()
            url = urls[key]
            conn.request("GET", f"{url.path}?{url.query}", headers={"Range": f"bytes={start}-{end - 1}"})
            response = conn.getresponse()
            got = 0
            while got < end - start and (n := response.readinto(buf[got : end - start])):
                got += n
            with lock:
                read[0] += got

    started = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return read[0] / MiB / (time.perf_counter() - started)


# --------------------------------------------------------------------------- load


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


# the load generator's producer settings (peak_bench's lean producer uses them too)
PRODUCER_CONFIG = {
    "acks": "all",
    "linger.ms": 2,
    "batch.size": 256 * 1024,
    "queue.buffering.max.kbytes": 32 * 1024,
    "compression.type": "none",
    "enable.idempotence": False,
}


class LoadProducer:
    """acks=all producer of 1 KiB records whose first 8 bytes carry the send time."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
        self.latencies: list[float] = []
        # librdkafka's own figure (Message.latency(): produce() until the broker's answer was
        # read, on its broker thread): what Kafka's Java perf tool measures in its callback,
        # without the wait for this loop's next poll() and the GIL that `latencies` includes
        self.client_latencies: list[float] = []
        self.acked_bytes = 0
        self.errors = 0
        self._padding = os.urandom(RECORD - 8)

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self.errors += 1
            return
        sent = struct.unpack_from(">d", msg.value(), 0)[0]
        self.latencies.append(time.perf_counter() - sent)
        latency = msg.latency()
        if latency is not None:
            self.client_latencies.append(latency)
        self.acked_bytes += RECORD

    def send(self) -> bool:
        try:
            self.producer.produce(
                self.topic, struct.pack(">d", time.perf_counter()) + self._padding, on_delivery=self._on_delivery
            )
            return True
        except BufferError:
            self.producer.poll(0.001)
            return False

    def run(self, seconds: float, rate_bytes: float | None = None) -> None:
        end = time.perf_counter() + seconds
        start = time.perf_counter()
        sent = 0
        while time.perf_counter() < end:
            if rate_bytes is not None:
                due = (time.perf_counter() - start) * rate_bytes / RECORD
                if sent >= due:
                    self.producer.poll(0)
                    time.sleep(0.0005)
                    continue
            if self.send():
                sent += 1
            if sent % 64 == 0:
                self.producer.poll(0)
        self.producer.flush(120)

    def reset(self) -> None:
        self.latencies = []
        self.client_latencies = []
        self.acked_bytes = 0

    def latency_figures(self, latencies: list[float] | None = None, client: list[float] | None = None) -> str:
        """p50/p99/max seen in the delivery callback, then librdkafka's own p50/p99."""
        seen = self.latencies if latencies is None else latencies
        own = self.client_latencies if client is None else client
        return (
            f"latency p50 {_pct(seen, 50) * 1000:.2f} ms p99 {_pct(seen, 99) * 1000:.2f} ms "
            f"max {max(seen, default=float('nan')) * 1000:.1f} ms (librdkafka's own: p50 "
            f"{_pct(own, 50) * 1000:.2f} ms p99 {_pct(own, 99) * 1000:.2f} ms)"
        )


class Tail(threading.Thread):
    """A consumer reading a topic (from the end or the beginning) and counting bytes."""

    def __init__(self, bootstrap: str, topic: str, from_beginning: bool) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest" if from_beginning else "latest",
                "fetch.max.bytes": 64 * MiB,
                "max.partition.fetch.bytes": 16 * MiB,
                "queued.max.messages.kbytes": 256 * 1024,
                "log_level": 4,  # warnings and up: not an info line per consumer (telemetry ids)
            }
        )
        self.consumer.subscribe([topic])
        self.bytes = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            msgs = self.consumer.consume(10_000, 0.2)
            if msgs:
                now = time.perf_counter()
                if self.first_at is None:
                    self.first_at = now
                self.last_at = now
                self.bytes += sum(len(m.value() or b"") for m in msgs if not m.error())
        self.consumer.close()

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(30)


def fill(bootstrap: str, topic: str, total: int) -> float:
    """Write `total` bytes of 1 KiB records to partition 0 as fast as possible; MiB/s."""
    p = LoadProducer(bootstrap, topic)
    start = time.perf_counter()
    n = total // RECORD
    sent = 0
    while sent < n:
        if p.send():
            sent += 1
        if sent % 256 == 0:
            p.producer.poll(0)
    p.producer.flush(300)
    return total / MiB / (time.perf_counter() - start)


# --------------------------------------------------------------------------- runs


def throughput(bootstrap: str, seconds: float, partitions: int) -> None:
    topic = f"bench-tp-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions)
    tail = Tail(bootstrap, topic, from_beginning=True)
    tail.start()
    time.sleep(2.0)  # let the consumer join and fetch before load starts
    p = LoadProducer(bootstrap, topic)
    p.run(1.0)  # warm-up
    p.reset()
    tail_before = tail.bytes
    start = time.perf_counter()
    p.run(seconds)
    elapsed = time.perf_counter() - start
    time.sleep(1.0)
    consumed = tail.bytes - tail_before
    tail.stop()
    print(
        f"produce (max rate, acks=all, 1 KiB, {partitions} partitions, 1 tailing consumer): "
        f"{p.acked_bytes / MiB / elapsed:.1f} MiB/s, latency p50 {_pct(p.latencies, 50) * 1000:.1f} ms "
        f"p99 {_pct(p.latencies, 99) * 1000:.1f} ms; consumer read {consumed / MiB / elapsed:.1f} MiB/s; errors {p.errors}"
    )


def fixed_rate(bootstrap: str, seconds: float, rate_mib: float, partitions: int, metrics: Sequence[str] = ()) -> None:
    topic = f"bench-fr-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions)
    tail = Tail(bootstrap, topic, from_beginning=True)
    tail.start()
    time.sleep(2.0)
    p = LoadProducer(bootstrap, topic)
    p.run(1.0, rate_mib * MiB)
    p.reset()
    before = produce_latency_buckets(list(metrics))
    start = time.perf_counter()
    p.run(seconds, rate_mib * MiB)
    elapsed = time.perf_counter() - start
    after = produce_latency_buckets(list(metrics))
    tail.stop()
    print(
        f"produce at {rate_mib:g} MiB/s (acks=all, 1 KiB, 1 tailing consumer): achieved {p.acked_bytes / MiB / elapsed:.1f} MiB/s, "
        f"{p.latency_figures()}; errors {p.errors}{broker_side(before, after)}"
    )


def metrics_lines(urls: Sequence[str]) -> Iterator[str]:
    """The lines of each broker's /metrics page, one page after the other."""
    import urllib.request

    for url in urls:
        with urllib.request.urlopen(url, timeout=10) as answer:
            yield from answer.read().decode().splitlines()


def produce_latency_buckets(urls: list[str]) -> dict[str, dict[float, float]]:
    """The brokers' Produce latency histogram (request parsed -> response queued) and their
    WAL group write+sync histogram, each summed over brokers: {name: {upper bound in seconds:
    cumulative count}}; and their CPU seconds so far ("cpu") with when they were read ("time").
    Only "time" for a cluster not started here."""
    wanted = {
        "produce": ("kafka_request_latency_seconds_bucket{", 'api="Produce"'),
        "wal": ("automq_storage_wal_sync_seconds_bucket{", ""),
        "disk": ("automq_storage_wal_disk_seconds_bucket{", ""),
    }
    found: dict[str, dict[float, float]] = {"time": {0.0: time.perf_counter()}}
    for line in metrics_lines(urls):
        for counter, key in (("process_cpu_seconds_total ", "cpu"), ("automq_storage_ack_lease_waits_total ", "lease")):
            if line.startswith(counter):
                total = found.setdefault(key, {0.0: 0.0})
                total[0.0] += float(line.rsplit(" ", 1)[1])
        for name, (prefix, label) in wanted.items():
            if line.startswith(prefix) and label in line:
                labels, value = line.rsplit(" ", 1)
                le = labels.split('le="', 1)[1].split('"', 1)[0]
                bound = float("inf") if le == "+Inf" else float(le)
                buckets = found.setdefault(name, {})
                buckets[bound] = buckets.get(bound, 0.0) + float(value)
    return found


def _p99_bucket(before: dict[float, float], after: dict[float, float]) -> tuple[float, float, float, float]:
    """(count, share over 10 ms, lower, upper bound of the bucket holding the p99) of what a
    histogram counted between two scrapes."""
    delta = {b: after[b] - before.get(b, 0.0) for b in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return 0.0, 0.0, 0.0, 0.0
    over_10 = total - delta.get(0.01, total)
    lower = bound = 0.0
    for bound, count in delta.items():
        if count >= 0.99 * total:
            break
        lower = bound
    return total, over_10 / total, lower, bound


def broker_side(before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]) -> str:
    """What the brokers saw of the Produce requests between two scrapes: how many took
    over 10 ms, and the histogram bucket holding the p99 (bucket bounds, not exact); and the
    bucket holding the p99 of their WAL groups' write+sync, which every acks=all Produce
    waits for (the rest of its time is the event loop's and the thread hand-offs')."""
    if not after.get("produce"):
        return ""
    total, over_10, lower, bound = _p99_bucket(before.get("produce", {}), after["produce"])
    if total <= 0:
        return ""
    text = (
        f"; broker side (request parsed -> response queued): {int(total)} Produce requests, "
        f"{over_10 * 100:.1f} % over 10 ms, p99 in ({lower * 1000:g}, {bound * 1000:g}] ms"
    )
    groups, _, wal_lower, wal_bound = _p99_bucket(before.get("wal", {}), after.get("wal", {}))
    if groups > 0:
        text += f"; WAL write+sync: {int(groups)} groups, p99 in ({wal_lower * 1000:g}, {wal_bound * 1000:g}] ms"
        _, _, disk_lower, disk_bound = _p99_bucket(before.get("disk", {}), after.get("disk", {}))
        if disk_bound:
            text += f" (its system calls alone: p99 in ({disk_lower * 1000:g}, {disk_bound * 1000:g}] ms)"
    if "cpu" in before and "cpu" in after:
        cpu = (after["cpu"][0.0] - before["cpu"][0.0]) / (after["time"][0.0] - before["time"][0.0])
        text += f"; broker CPU {cpu * 100:.0f} % of a core"
    waits = after.get("lease", {0.0: 0.0})[0.0] - before.get("lease", {0.0: 0.0})[0.0]
    if waits > 0:  # answers held for a heartbeat (storage/ack_lease.py): a controller too slow
        text += f"; {int(waits)} answers held for the acknowledgement lease"
    return text


def wal_bytes_pending(urls: Sequence[str]) -> float:
    """Bytes the brokers' WALs hold that are not yet uploaded and trimmed."""
    pending = 0.0
    for line in metrics_lines(urls):
        if line.startswith("automq_storage_wal_bytes_pending "):
            pending += float(line.rsplit(" ", 1)[1])
    return pending


def wait_for_uploads(urls: Sequence[str], below: int, timeout: float = 120.0) -> str:
    """Waits until the WALs hold less than `below` bytes not yet uploaded; says how long."""
    start = time.perf_counter()
    pending = wal_bytes_pending(urls)
    while pending >= below and time.perf_counter() - start < timeout:
        time.sleep(0.2)
        pending = wal_bytes_pending(urls)
    return f", then {time.perf_counter() - start:.1f} s until {pending / MiB:.0f} MiB were left to upload"


def catch_up(
    bootstrap: str,
    total: int,
    rate_mib: float,
    reader_mode: str = "thread",
    nice: int = 0,
    metrics: Sequence[str] = (),
    after_upload: bool = False,
    cluster: Cluster | None = None,
) -> None:
    old = f"bench-cu-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, old, 1)
    write_rate = fill(bootstrap, old, total)
    waited = ""
    if after_upload and metrics:
        # the catch-up then reads uploaded objects, without the fill's own uploads still
        # writing to the disk the WAL syncs on (a partial block waits for its age trigger)
        waited = wait_for_uploads(metrics, UPLOAD_BLOCK)
    live = f"bench-live-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, live, 1)
    p = LoadProducer(bootstrap, live)
    done = threading.Event()

    def produce_meanwhile() -> None:
        while not done.is_set():
            p.run(0.5, rate_mib * MiB)

    producing = threading.Thread(target=produce_meanwhile, daemon=True)
    producing.start()
    before: dict[str, dict[float, float]] = {}
    after: dict[str, dict[float, float]] = {}
    latencies: list[float] = []
    client_latencies: list[float] = []
    read, elapsed = 0, float("nan")
    if reader_mode == "thread":
        before = produce_latency_buckets(list(metrics))
        start = time.perf_counter()
        reader = Tail(bootstrap, old, from_beginning=True)
        reader.start()
        deadline = start + max(120.0, total / MiB)
        while reader.bytes < total and time.perf_counter() < deadline:
            time.sleep(0.05)
        elapsed = time.perf_counter() - start
        read = reader.bytes
        latencies, client_latencies = list(p.latencies), list(p.client_latencies)
        after = produce_latency_buckets(list(metrics))
        reader.stop()
    else:
        # The reader in its own process: its decoding does not hold this process's GIL, which
        # the producer's delivery callbacks (where latency is measured) need.
        command = [sys.executable, __file__, "--catchup-child", bootstrap, old, str(total)]
        if nice:
            command = ["nice", "-n", str(nice), *command]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("started"):
                p.reset()
                before = produce_latency_buckets(list(metrics))
            elif line.startswith("read "):
                latencies, client_latencies = list(p.latencies), list(p.client_latencies)
                after = produce_latency_buckets(list(metrics))
                read, elapsed = int(line.split()[1]), float(line.split()[2])
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    done.set()
    producing.join(60)
    where = "in this process" if reader_mode == "thread" else f"in its own process{f', nice {nice}' if nice else ''}"
    print(
        f"catch-up read of {total / MiB:.0f} MiB written earlier (written at {write_rate:.1f} MiB/s{waited}), reader {where}: "
        f"{read / MiB / elapsed:.1f} MiB/s ({read / MiB:.0f} MiB in {elapsed:.1f} s) while producing {rate_mib:g} MiB/s; "
        f"produce {p.latency_figures(latencies, client_latencies)} meanwhile{broker_side(before, after)}"
    )
    if cluster is not None and cluster.seaweed is not None:
        raw = raw_ranged_get_mib_s(cluster.seaweed, cluster.bucket, total)
        print(
            f"baseline: raw parallel ranged GETs of the same objects from SeaweedFS {raw:.1f} MiB/s "
            f"(8 threads, 4 MiB ranges, plain http.client; issue 14: catch-up >= 80% of this, "
            f"here {read / MiB / elapsed / raw * 100:.0f}%)"
        )


def catchup_child(bootstrap: str, topic: str, total: int) -> None:
    """--catchup-reader process: read `total` bytes of `topic` from the beginning; report."""
    reader = Tail(bootstrap, topic, from_beginning=True)
    print("started", flush=True)
    start = time.perf_counter()
    reader.start()
    deadline = start + max(120.0, total / MiB)
    while reader.bytes < total and time.perf_counter() < deadline:
        time.sleep(0.05)
    print(f"read {reader.bytes} {time.perf_counter() - start}", flush=True)
    reader.stop()


def reassignment(bootstrap: str, size: int) -> None:
    from confluent_kafka import Producer
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    topic = f"bench-ra-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 1)
    fill(bootstrap, topic, size)
    leader = leaders(bootstrap, topic, 1)[0]
    from confluent_kafka.admin import AdminClient

    brokers = sorted(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers)
    target = next((b for b in brokers if b != leader), None)
    if target is None:
        print("reassignment: needs two brokers (--brokers 2)")
        return
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "message.timeout.ms": 60_000})
    producer.produce(topic, b"warm")
    producer.flush(30)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=60_000)
    watcher = AdminClient({"bootstrap.servers": bootstrap})
    leaders(bootstrap, topic, 1, admin=watcher)  # connected before the clock starts
    try:
        start = time.perf_counter()
        admin.alter_partition_reassignments({TopicPartition(topic, 0): [target]})
        moved_at = None
        while time.perf_counter() - start < 60:
            if leaders(bootstrap, topic, 1, admin=watcher)[0] == target:
                moved_at = time.perf_counter()
                break
            time.sleep(0.01)
        acked: list[float] = []
        producer.produce(
            topic,
            b"after-move",
            on_delivery=lambda err, msg: acked.append(time.perf_counter()) if err is None else None,
        )
        producer.flush(60)
    finally:
        admin.close()
    if moved_at is None or not acked:
        print(f"reassignment of a partition holding {size / MiB:.0f} MiB: did not complete within 60 s")
        return
    print(
        f"reassignment of a partition holding {size / MiB:.0f} MiB (broker {leader} -> {target}): "
        f"new leader in metadata after {(moved_at - start) * 1000:.0f} ms, first produce acknowledged by it after "
        f"{(acked[0] - start) * 1000:.0f} ms"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", help="use a running cluster instead of starting one")
    ap.add_argument("--brokers", type=int, default=2)
    ap.add_argument(
        "--port", type=int, default=0, help="first Kafka port of the started cluster (default: a free block)"
    )
    ap.add_argument("--object-store", help="object store URL for the started cluster (default: embedded file://)")
    ap.add_argument("--seaweedfs", action="store_true", help="start a local SeaweedFS and use it as the object store")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of each produce run")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rate-mib", type=float, default=10.0, help="fixed produce rate for the latency run")
    ap.add_argument(
        "--linger-ms",
        type=float,
        default=PRODUCER_CONFIG["linger.ms"],
        help="the load generator's linger.ms (a record waits up to this long in the client for its batch)",
    )
    ap.add_argument("--catchup-bytes", type=parse_size, default=256 * MiB)
    ap.add_argument("--reassign-large", type=parse_size, default=100 * MiB)
    ap.add_argument(
        "--catchup-reader",
        choices=["thread", "process"],
        default="thread",
        help="run the catch-up consumer in this process (sharing its GIL with the producer whose latency"
        " is measured) or in its own process",
    )
    ap.add_argument("--catchup-nice", type=int, default=0, help="niceness of the catch-up reader's process")
    ap.add_argument(
        "--catchup-after-upload",
        action="store_true",
        help="start the catch-up only once the written data is uploaded (less than one upload block left"
        " in the WAL), so it reads objects without the fill's uploads still running",
    )
    ap.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="a node setting for the started cluster, as `automq local up --set` takes it (repeatable)",
    )
    ap.add_argument("--catchup-child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--skip", nargs="*", default=[], choices=["baseline", "throughput", "fixed", "catchup", "reassign"])
    args = ap.parse_args()
    PRODUCER_CONFIG["linger.ms"] = args.linger_ms
    if args.catchup_child:
        bootstrap, topic, total = args.catchup_child
        catchup_child(bootstrap, topic, int(total))
        return 0

    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) at start"
    )
    if "baseline" not in args.skip:
        print(f"baseline: loopback TCP {loopback_tcp_mib_s():.0f} MiB/s (1 MiB writes, one connection)")
        with tempfile.TemporaryDirectory(prefix="fsync-", dir=os.environ.get("BENCH_FSYNC_DIR")) as d:
            rate, p99 = fsync_write_mib_s(d)
            print(
                f"baseline: fdatasync'd file writes {rate:.0f} MiB/s (1 MiB per write+fdatasync, p99 {p99:.1f} ms) in {d}"
            )
            _rate4, p99_4k = fsync_write_mib_s(d, total=4 * MiB, block=4096)
            print(f"baseline: 4 KiB write+fdatasync p99 {p99_4k:.2f} ms (issue 14: produce p99 <= 5x this) in {d}")
    with Cluster(args) as cluster:
        print(
            f"cluster: {cluster.bootstrap} ({'SeaweedFS' if args.seaweedfs else args.object_store or 'embedded file:// store'})"
        )
        if "throughput" not in args.skip:
            throughput(cluster.bootstrap, args.duration, args.partitions)
        if "fixed" not in args.skip:
            fixed_rate(cluster.bootstrap, args.duration, args.rate_mib, args.partitions, cluster.metrics_urls)
        if "catchup" not in args.skip:
            catch_up(
                cluster.bootstrap,
                args.catchup_bytes,
                args.rate_mib,
                args.catchup_reader,
                args.catchup_nice,
                cluster.metrics_urls,
                args.catchup_after_upload,
                cluster,
            )
        if "reassign" not in args.skip:
            reassignment(cluster.bootstrap, 10 * MiB)
            reassignment(cluster.bootstrap, args.reassign_large)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
