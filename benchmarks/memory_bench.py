"""Broker memory at load (issue 14 goal 5): RSS over a run, next to the configured caches.

    python benchmarks/memory_bench.py [--duration 600] [--rate-mib 10] [--log-cache-mib 256]
                                      [--block-cache-mib 128] [--sample-s 10]

A controller and one broker process (file:// store, volume WAL) are started here; a
confluent-kafka producer (acks=all, 1 KiB records) writes --rate-mib MiB/s to an 8-partition
topic while one consumer tails it and another re-reads it from the beginning over and over
(catch-up reads through the block cache). Every --sample-s seconds the broker's RSS
(VmRSS) and its peak (VmHWM) are printed with the bytes produced and read so far. At the end:
RSS idle right after start (the baseline), RSS at the end of warm-up (the first third of the
run), the largest and the last sample, growth after warm-up (least-squares slope, MiB per
minute), and the goal's budget: log cache + block cache + 150 MB.

The load generator runs in this process on the same machine; prints numbers only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import yaml
from kafka_bench import LoadProducer, Tail, create_topic, metrics_lines
from startup_bench import pick_ports, stop, wait_http

MiB = 1 << 20


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, kib, _ = line.split()
            values[key[:-1]] = int(kib) / 1024
    return values["VmRSS"], values["VmHWM"]


def metrics(http: str) -> dict[str, float]:
    """A node's /metrics page: {'name{labels}': value}."""
    lines = metrics_lines([f"http://{http}/metrics"])
    return {k: float(v) for k, _, v in (line.rpartition(" ") for line in lines if line[:1] != "#") if k}


def metric(http: str, name: str) -> float:
    """Sum of one metric's samples (all label sets)."""
    return sum(v for k, v in metrics(http).items() if k == name or k.startswith(name + "{"))


class Breakdown(threading.Thread):
    """Samples, every --fine-s seconds, the broker's RSS next to what its /metrics page says
    holds memory: the two caches (what they keep alive) and the C heap (glibc's mallinfo2:
    in use, freed but held, mmapped big buffers). At the end: the samples with the highest RSS,
    decomposed, and the median one, so a peak can be told apart from steady state."""

    def __init__(self, pid: int, http: str, every: float, stop_flag: threading.Event) -> None:
        super().__init__(daemon=True)
        self.pid, self.http, self.every, self.stop_flag = pid, http, every, stop_flag
        self.rows: list[tuple[float, ...]] = []

    def run(self) -> None:
        start = time.perf_counter()
        while not self.stop_flag.wait(self.every):
            try:
                m = metrics(self.http)
                rss, _ = rss_mib(self.pid)
            except OSError:
                continue
            g = lambda key: m.get(key, 0.0) / MiB  # noqa: E731
            self.rows.append(
                (
                    time.perf_counter() - start,
                    rss,
                    g('automq_storage_cache_bytes{cache="log_cache"}'),
                    g('automq_storage_cache_bytes{cache="block_cache"}'),
                    g('automq_process_heap_bytes{state="in_use"}'),
                    g('automq_process_heap_bytes{state="free"}'),
                    g('automq_process_heap_bytes{state="mmapped"}'),
                )
            )

    def report(self) -> None:
        if not self.rows:
            return
        print(f"\nRSS breakdown, {len(self.rows)} samples every {self.every:g} s (MiB; heap = glibc's C heap):")
        print(
            f"{'t (s)':>6} {'RSS':>7} {'log cache':>10} {'block cache':>12} {'heap in use':>12} "
            f"{'heap free':>10} {'mmapped':>8} {'RSS - caches':>13}"
        )
        by_rss = sorted(self.rows, key=lambda r: r[1])
        median = by_rss[len(by_rss) // 2]
        for label, row in [("median", median)] + [("", r) for r in by_rss[-5:][::-1]]:
            t, rss, lc, bc, used, free, mm = row
            print(
                f"{t:6.0f} {rss:7.1f} {lc:10.1f} {bc:12.1f} {used:12.1f} {free:10.1f} {mm:8.1f} "
                f"{rss - lc - bc:13.1f} {label}"
            )


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB), in MiB per minute."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return 60 * sum((x - mx) * (y - my) for x, y in points) / var if var else float("nan")


class CatchUp(threading.Thread):
    """Re-reads the topic from the beginning, again and again, with a fresh group each time:
    each pass reads what was produced when it started (mostly older than the log cache holds,
    so it comes through the block cache), then starts over."""

    def __init__(self, bootstrap: str, topic: str, stop_flag: threading.Event, produced) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.stop_flag, self.produced = bootstrap, topic, stop_flag, produced
        self.bytes = 0
        self.passes = 0

    def run(self) -> None:
        while not self.stop_flag.is_set():
            target = self.produced()
            if target < 64 * MiB:
                time.sleep(1)
                continue
            tail = Tail(self.bootstrap, self.topic, from_beginning=True)
            seen = 0
            while not self.stop_flag.is_set() and seen < target:
                msgs = tail.consumer.consume(10_000, 0.5)
                got = sum(len(m.value() or b"") for m in msgs if not m.error())
                seen += got
                self.bytes += got
            tail.consumer.close()
            self.passes += 1


def start_processes(base: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, subprocess.Popen, str, str]:
    store = f"file://{base}/objects"
    ctl_port, kafka_port, http_port = pick_ports(args.port_base, 3)
    (base / "controller.yaml").write_text(
        yaml.safe_dump(
            {
                "node_id": 0,
                "object_store_url": store,
                "http_host": "127.0.0.1",
                "http_port": ctl_port,
                "log_level": "WARNING",
            }
        )
    )
    ctl = subprocess.Popen(
        [sys.executable, "-m", "automq.broker.cli", "controller", "--config", str(base / "controller.yaml")],
        stdout=open(base / "controller.log", "ab"),
        stderr=subprocess.STDOUT,
    )
    wait_http(f"http://127.0.0.1:{ctl_port}/readyz", ctl)
    (base / "broker.yaml").write_text(
        yaml.safe_dump(
            {
                "node_id": 1,
                "data_dir": str(base / "broker"),
                "object_store_url": store,
                "controller_urls": [f"http://127.0.0.1:{ctl_port}"],
                "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": kafka_port}],
                "http_host": "127.0.0.1",
                "http_port": http_port,
                "log_level": "WARNING",
                "storage": {
                    "log_cache_bytes": args.log_cache_mib * MiB,
                    "block_cache_bytes": args.block_cache_mib * MiB,
                },
                "kafka": {"group_initial_rebalance_delay_ms": 0},
            }
        )
    )
    env = dict(os.environ)
    for pair in args.broker_env:
        key, _, value = pair.partition("=")
        env[key] = value
    broker = subprocess.Popen(
        [sys.executable, "-m", "automq.broker.cli", "broker", "--config", str(base / "broker.yaml")],
        stdout=open(base / "broker.log", "ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    wait_http(f"http://127.0.0.1:{http_port}/readyz", broker)
    return ctl, broker, f"127.0.0.1:{kafka_port}", f"127.0.0.1:{http_port}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--rate-mib", type=float, default=10.0)
    ap.add_argument("--log-cache-mib", type=int, default=256)
    ap.add_argument("--block-cache-mib", type=int, default=128)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--fine-s", type=float, default=0.5, help="period of the RSS breakdown samples")
    ap.add_argument("--port-base", type=int, default=37200)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--broker-env", action="append", default=[], help="NAME=VALUE for the broker process (repeat)")
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="memory-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"# memory bench; load average {os.getloadavg()[0]:.1f} at start; {os.cpu_count()} CPUs")
    budget = args.log_cache_mib + args.block_cache_mib + 150 * 1e6 / MiB
    print(
        f"configured: log cache {args.log_cache_mib} MiB + block cache {args.block_cache_mib} MiB; "
        f"goal: RSS <= caches + 150 MB = {budget:.0f} MiB"
    )
    ctl, broker, bootstrap, http = start_processes(base, args)
    stop_flag = threading.Event()
    try:
        time.sleep(1)
        idle, _ = rss_mib(broker.pid)
        print(f"broker RSS idle after start (baseline): {idle:.1f} MiB")
        topic = f"mem-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, 8)
        producer = LoadProducer(bootstrap, topic)
        tail = Tail(bootstrap, topic, from_beginning=False)
        tail.start()
        catch_up = CatchUp(bootstrap, topic, stop_flag, lambda: producer.acked_bytes)
        catch_up.start()
        breakdown = Breakdown(broker.pid, http, args.fine_s, stop_flag)
        breakdown.start()
        produce = threading.Thread(
            target=producer.run, args=(args.duration, args.rate_mib * MiB), daemon=True, name="producer"
        )
        start = time.perf_counter()
        produce.start()
        print(
            f"\n{'t (s)':>6} {'RSS MiB':>8} {'peak MiB':>9} {'produced MiB':>13} {'tail MiB':>9} {'catch-up MiB':>13}"
        )
        samples: list[tuple[float, float]] = []
        while produce.is_alive():
            produce.join(args.sample_s)
            if broker.poll() is not None:
                raise SystemExit(f"the broker exited ({broker.returncode}); see {base}/broker.log")
            t = time.perf_counter() - start
            rss, hwm = rss_mib(broker.pid)
            samples.append((t, rss))
            print(
                f"{t:6.0f} {rss:8.1f} {hwm:9.1f} {producer.acked_bytes / MiB:13.0f} "
                f"{tail.bytes / MiB:9.0f} {catch_up.bytes / MiB:13.0f}",
                flush=True,
            )
        warm = [(t, r) for t, r in samples if t >= args.duration / 3]
        warm_start = warm[0][1] if warm else float("nan")
        _, hwm = rss_mib(broker.pid)
        print(
            f"\nRSS idle {idle:.1f} MiB; after warm-up (t >= {args.duration / 3:.0f} s) {warm_start:.1f} MiB; "
            f"largest sample {max(r for _, r in samples):.1f} MiB; last {samples[-1][1]:.1f} MiB; peak (VmHWM) "
            f"{hwm:.1f} MiB; growth after warm-up {slope(warm):+.2f} MiB/min"
        )
        print(
            f"budget (log cache + block cache + 150 MB) {budget:.0f} MiB: peak is {hwm / budget:.2f}x of it; "
            f"produced {producer.acked_bytes / MiB:.0f} MiB ({producer.errors} errors), "
            f"catch-up passes {catch_up.passes}"
        )
        stop_flag.set()
        breakdown.join()
        breakdown.report()
        got = metric(http, "automq_storage_object_read_bytes_total") / MiB
        print(
            f"object store read {got:.0f} MiB for {catch_up.bytes / MiB:.0f} MiB of catch-up values "
            f"({got / max(catch_up.bytes / MiB, 1):.2f} MiB read per MiB consumed; above ~1.1 blocks were read "
            "ahead and evicted before use)"
        )
    finally:
        stop_flag.set()
        for proc in (broker, ctl):
            stop(proc)
        if broker.poll() is None:
            os.kill(broker.pid, signal.SIGKILL)
        if args.dir is None:  # a run leaves GBs of WAL and objects: never keep a temporary one
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
