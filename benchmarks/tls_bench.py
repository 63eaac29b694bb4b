"""Produce throughput and latency over SASL_SSL (TLS + SCRAM-SHA-512) next to plaintext, in
the same run. Prints numbers; asserts nothing.

    python benchmarks/tls_bench.py                  # 64 MiB per run, 2 rounds
    python benchmarks/tls_bench.py --mib 256 --rounds 3

Each round starts two one-broker `automq local up` clusters (real processes), one plain and
one `--secure`, and produces --mib of 1 KiB records with acks=all from confluent-kafka
(librdkafka). Reported per run: MiB/s, p50/p99 of the time from produce() to the delivery
report, and the broker process's CPU seconds per GiB produced (utime + stime from /proc: what
the broker's work costs whatever else the machine runs, unlike MiB/s on a shared machine).
Summary: the best round of each mode, every round's SASL_SSL change against the plaintext run
just before it (median and range), and the median CPU per GiB of each mode. The issue's goal:
at most 25 % less throughput over SASL_SSL.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from automq.broker import local

MiB = 1 << 20
RECORD = 1024


def start(data: Path, secure: bool, port: int | None = None) -> tuple[subprocess.Popen[str], dict[str, str]]:
    if port is not None:
        # a given range may lie in the ephemeral range, where outgoing connections take ports
        port = next((p for p in range(port, port + 10) if local.port_is_free(p)), port)
    port = port if port is not None else local.free_port_block(1)
    cmd = [sys.executable, "-m", "automq.broker.cli", "local", "up", "--brokers", "1"]
    cmd += ["--data-dir", str(data), "--port", str(port)] + (["--secure"] if secure else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stdout is not None
    conf: dict[str, str] = {}
    for line in proc.stdout:
        if "=" in line and not line.startswith(("#", "bootstrap: ")):
            key, value = line.strip().split("=", 1)
            conf[key] = value
        if line.startswith("bootstrap: "):
            conf["bootstrap.servers"] = line.split(" ", 1)[1].strip()
            return proc, conf
    stop(proc)
    raise SystemExit(f"the local cluster did not start; logs under {data}/logs")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def broker_cpu_s(proc: subprocess.Popen[str]) -> float:
    """CPU seconds (user + system) used so far by the `automq broker` child of a `local up`."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    for pid in children:
        try:
            if b"broker" not in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[3:4][0]:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    raise SystemExit(f"no broker process under local up (pid {proc.pid})")


def produce(conf: dict[str, str], mib: int) -> tuple[float, float, float]:
    from confluent_kafka import Producer

    producer = Producer(
        {**conf, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20, "queue.buffering.max.kbytes": 1 << 20}
    )
    value = os.urandom(RECORD)
    count = mib * MiB // RECORD
    latencies: list[float] = []

    def delivered(err, _msg, sent=None):
        if err is None:
            latencies.append(time.perf_counter() - sent)

    producer.produce("warmup", value)
    producer.flush(60)
    started = time.perf_counter()
    for _ in range(count):
        sent = time.perf_counter()
        while True:
            try:
                producer.produce("bench", value, on_delivery=lambda e, m, s=sent: delivered(e, m, s))
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(300)
    elapsed = time.perf_counter() - started
    latencies.sort()
    if len(latencies) != count:
        raise SystemExit(f"only {len(latencies)} of {count} records delivered")
    return mib / elapsed, latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.99)] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base-port", type=int, default=None, help="Kafka ports from here (default: any free)")
    args = parser.parse_args()
    best: dict[str, tuple[float, float, float]] = {}
    changes: list[float] = []
    cpu: dict[str, list[float]] = {"plaintext": [], "sasl_ssl": []}
    with tempfile.TemporaryDirectory(prefix="tls-bench-") as tmp:
        for r in range(args.rounds):
            mibps: dict[str, float] = {}
            for name, secure in (("plaintext", False), ("sasl_ssl", True)):
                port = None if args.base_port is None else args.base_port + 10 * (2 * r + int(secure))
                proc, conf = start(Path(tmp) / f"{name}-{r}", secure, port)
                try:
                    before = broker_cpu_s(proc)
                    result = produce(conf, args.mib)
                    per_gib = (broker_cpu_s(proc) - before) * 1024 / args.mib
                finally:
                    stop(proc)
                cpu[name].append(per_gib)
                mibps[name] = result[0]
                print(
                    f"round {r + 1} {name:10s} {result[0]:7.1f} MiB/s  p50 {result[1]:7.1f} ms  "
                    f"p99 {result[2]:7.1f} ms  broker CPU {per_gib:5.2f} s/GiB"
                )
                if name not in best or result[0] > best[name][0]:
                    best[name] = result
            changes.append(100 * (mibps["sasl_ssl"] / mibps["plaintext"] - 1))
            print(f"round {r + 1} SASL_SSL vs plaintext {changes[-1]:+.1f} %")
    plain, secure = best["plaintext"], best["sasl_ssl"]
    print(f"\nbest of {args.rounds} rounds, {args.mib} MiB of {RECORD}-byte records, acks=all, librdkafka:")
    print(f"  plaintext (baseline) {plain[0]:7.1f} MiB/s  p50 {plain[1]:7.1f} ms  p99 {plain[2]:7.1f} ms")
    print(f"  SASL_SSL SCRAM-512   {secure[0]:7.1f} MiB/s  p50 {secure[1]:7.1f} ms  p99 {secure[2]:7.1f} ms")
    print(f"  throughput change: {100 * (secure[0] / plain[0] - 1):+.1f} % (goal: no worse than -25 %)")
    met = sum(1 for c in changes if c >= -25)
    print(
        f"  per round: median {statistics.median(changes):+.1f} %, range {min(changes):+.1f} .. "
        f"{max(changes):+.1f} %, goal met in {met} of {len(changes)} rounds"
    )
    p_cpu, s_cpu = statistics.median(cpu["plaintext"]), statistics.median(cpu["sasl_ssl"])
    print(f"  broker CPU per GiB (median): plaintext {p_cpu:.2f} s, SASL_SSL {s_cpu:.2f} s ({s_cpu / p_cpu:.2f}x)")


if __name__ == "__main__":
    main()
