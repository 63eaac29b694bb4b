"""Broker start-up and WAL replay speed (issue 14 goal 6), next to baselines from the same run.

    python benchmarks/startup_bench.py [--rounds 5] [--wal-mib 256] [--port-base 37100]

1. Ready time: a controller process runs on a file:// store; a broker process is started
   `--rounds` times on an empty volume WAL (a fresh data dir each time) and the time from
   spawning it to its first Metadata answer that lists it (raw Kafka Metadata v1 over a
   socket, polled every 5 ms) is printed, with the CPU seconds the process used until then
   (steadier than wall time on a shared machine). Baselines, same run, interleaved: a bare
   interpreter start (`python -c pass`) and interpreters that only import the broker's
   modules, with and without kio seeing Hypothesis.
2. Replay: a volume WAL of --wal-mib filled with 64 KiB records (no trim) is replayed by a
   new incarnation (`VolumeWal.recover()`), in MiB/s, next to a sequential read of the same
   file with 1 MiB reads (both from the page cache: the file was just written).

Prints numbers only; asserts nothing. The machine may be shared: compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from automq.broker.storage.wal.base import WalRecord
from automq.broker.storage.wal.volume import VolumeWal

MiB = 1 << 20
# what `automq broker` imports before it serves, the way its entry point does
IMPORTS = (
    "import automq.broker.cli as cli; cli._import_kio_without_hypothesis(); "
    "import automq.broker.kafka.process, automq.broker.config"
)
IMPORTS_BEFORE = "import automq.broker.cli; import automq.broker.kafka.process, automq.broker.config"
# what the OAUTHBEARER and principal modules imported at start until they imported it lazily
IMPORTS_WITH_CRYPTOGRAPHY = (
    IMPORTS + "; import cryptography.x509, cryptography.exceptions, cryptography.hazmat.primitives.hashes, "
    "cryptography.hazmat.primitives.asymmetric.ec, cryptography.hazmat.primitives.asymmetric.rsa, "
    "cryptography.hazmat.primitives.asymmetric.padding, cryptography.hazmat.primitives.asymmetric.utils"
)


def metadata_request(correlation_id: int) -> bytes:
    client = b"startup-bench"
    body = struct.pack(">hhih", 3, 1, correlation_id, len(client)) + client + struct.pack(">i", -1)
    return struct.pack(">i", len(body)) + body


def read_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def metadata_lists(port: int, node_id: int) -> bool:
    """One Metadata v1 round trip; True when the answer lists `node_id` among the brokers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(metadata_request(7))
            (size,) = struct.unpack(">i", read_exact(sock, 4))
            data = read_exact(sock, size)
    except OSError:
        return False
    (count,) = struct.unpack_from(">i", data, 4)
    pos = 8
    for _ in range(max(count, 0)):
        (nid,) = struct.unpack_from(">i", data, pos)
        if nid == node_id:
            return True
        (hlen,) = struct.unpack_from(">h", data, pos + 4)
        pos += 6 + hlen + 4
        (rlen,) = struct.unpack_from(">h", data, pos)
        pos += 2 + max(rlen, 0)
    return False


def pick_ports(base: int, count: int) -> list[int]:
    """`count` ports from `base` up that nothing holds right now: a fixed port range on a
    shared machine overlaps the kernel's ephemeral range, so other processes' client
    connections sometimes sit on it."""
    found: list[int] = []
    port = base
    while len(found) < count:
        if port > base + 500:
            raise RuntimeError(f"no {count} free ports in {base}..{base + 500}")
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                found.append(port)
            except OSError:
                pass
        port += 1
    return found


def spawn_time(code: str) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of `python -c code`."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code])
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"python -c {code!r} failed")
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited ({proc.returncode}) before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} never answered")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def broker_ready_times(
    base: Path, rounds: int, port_base: int, baselines: Callable[[], object], wal_capacity_mib: int = 256
) -> list[tuple[float, float]]:
    store = f"file://{base}/objects"
    ctl_port, kafka_port, http_port = pick_ports(port_base, 3)
    ctl_cfg = base / "controller.yaml"
    ctl_cfg.write_text(
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
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ctl = subprocess.Popen(
        [sys.executable, "-m", "automq.broker.cli", "controller", "--config", str(ctl_cfg)],
        stdout=open(base / "controller.log", "ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    times = []
    try:
        wait_http(f"http://127.0.0.1:{ctl_port}/readyz", ctl)
        for r in range(rounds):
            baselines()
            cfg = base / f"broker-{r}.yaml"
            cfg.write_text(
                yaml.safe_dump(
                    {
                        "node_id": 1,
                        "data_dir": str(base / f"broker-{r}"),
                        "object_store_url": store,
                        "controller_urls": [f"http://127.0.0.1:{ctl_port}"],
                        "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": kafka_port}],
                        "http_host": "127.0.0.1",
                        "http_port": http_port,
                        "log_level": "WARNING",
                        "wal": {"capacity": f"{wal_capacity_mib}MiB"},
                    }
                )
            )
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, "-m", "automq.broker.cli", "broker", "--config", str(cfg)],
                stdout=open(base / f"broker-{r}.log", "ab"),
                stderr=subprocess.STDOUT,
                env=env,
            )
            try:
                while not metadata_lists(kafka_port, 1):
                    if proc.poll() is not None:
                        raise RuntimeError(f"broker exited ({proc.returncode}); see {base}/broker-{r}.log")
                    if time.perf_counter() - t0 > 120:
                        raise RuntimeError("broker never answered Metadata")
                    time.sleep(0.005)
                times.append((time.perf_counter() - t0, cpu_seconds(proc.pid)))
            finally:
                stop(proc)
    finally:
        stop(ctl)
    return times


async def replay(base: Path, wal_mib: int) -> tuple[float, float, int, int]:
    path = base / "replay.wal"
    capacity = wal_mib * MiB
    wal = VolumeWal(path, capacity, 9, 1)
    await wal.recover()
    await wal.start(0)
    payload = os.urandom(64 << 10)
    futures = []
    n = 0
    # fill to ~95 % of the ring (records carry a 64-byte header; the ring must not wrap)
    while (n + 1) * (len(payload) + 64) < capacity * 0.95:
        futures.append(wal.append(WalRecord(n % 16, 0, n, 1, payload)))
        n += 1
        if len(futures) >= 64:
            await asyncio.gather(*futures)
            futures = []
    await asyncio.gather(*futures)
    await wal.close()
    filled = n * len(payload)

    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(MiB):
            pass
    raw = os.path.getsize(path) / MiB / (time.perf_counter() - t0)

    again = VolumeWal(path, capacity, 9, 2)
    t0 = time.perf_counter()
    records = await again.recover()
    elapsed = time.perf_counter() - t0
    await again.close()
    return filled / MiB / elapsed, raw, len(records), filled


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--wal-mib", type=int, default=256)
    ap.add_argument("--port-base", type=int, default=37100)
    ap.add_argument(
        "--ready-wal-mib", type=int, default=256, help="WAL capacity of the started brokers (a new WAL is preallocated)"
    )
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="startup-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        print(f"# start-up bench; load average {os.getloadavg()[0]:.1f} at start; {os.cpu_count()} CPUs")

        print(
            f"\n## broker ready (first Metadata answer listing it) on a new, empty {args.ready_wal_mib} MiB volume WAL, "
            f"{args.rounds} rounds"
        )
        bare: list[tuple[float, float]] = []
        imports: list[tuple[float, float]] = []
        with_hypothesis: list[tuple[float, float]] = []
        with_cryptography: list[tuple[float, float]] = []
        ready = broker_ready_times(
            base,
            args.rounds,
            args.port_base,
            # interleaved with the broker starts (the machine's load drifts)
            lambda: (
                bare.append(spawn_time("pass")),
                imports.append(spawn_time(IMPORTS)),
                with_hypothesis.append(spawn_time(IMPORTS_BEFORE)),
                with_cryptography.append(spawn_time(IMPORTS_WITH_CRYPTOGRAPHY)),
            ),
            args.ready_wal_mib,
        )
        for name, values in (
            ("python -c pass (baseline)", bare),
            ("the same imports with kio seeing Hypothesis (before)", with_hypothesis),
            ("the same imports + cryptography at start (before)", with_cryptography),
            ("python -c <the broker's imports, as `automq broker`>", imports),
            ("broker process ready", ready),
        ):
            wall = [w for w, _ in values]
            cpu = [c for _, c in values]
            print(
                f"{name:55s} wall median {statistics.median(wall) * 1000:6.0f} ms "
                f"(min {min(wall) * 1000:6.0f}, max {max(wall) * 1000:6.0f}); "
                f"CPU median {statistics.median(cpu) * 1000:6.0f} ms"
            )

        print(f"\n## replay of a full {args.wal_mib} MiB volume WAL (64 KiB records)")
        for _ in range(2):
            speed, raw, count, filled = asyncio.run(replay(base, args.wal_mib))
            print(
                f"VolumeWal.recover(): {count} records, {filled / MiB:.0f} MiB at {speed:7.1f} MiB/s "
                f"(sequential 1 MiB reads of the same file: {raw:7.1f} MiB/s, {speed / raw:.2f}x)"
            )
            (base / "replay.wal").unlink()

    finally:
        if args.dir is None:  # each round left a preallocated WAL: never keep a temporary dir
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
