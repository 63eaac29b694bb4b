"""Controller benchmark: commit latency of a metadata change and standby takeover time.
Prints numbers next to a baseline measured in the same run; asserts nothing.

    python benchmarks/controller_bench.py                  # file:// and a local SeaweedFS (~1 min)
    python benchmarks/controller_bench.py --no-seaweedfs   # file:// only
    python benchmarks/controller_bench.py -n 1000 --takeovers 5

For each object store:
1. commit latency: one client commits a stream-set object (prepare ids up front), one
   request at a time: HTTP -> validation -> one conditional PUT of a log entry -> answer;
2. baseline, interleaved with 1 (so both see the same load on this shared machine): a raw
   conditional PUT (If-None-Match: *) of a log entry's size from this process to the store,
   the floor of any durable change;
3. group commit: `--concurrency` clients commit on their own streams at once; commits/s,
   latency p50/p99 and requests per log entry;
4. takeover: a standby controller process follows; the leader is killed with SIGKILL;
   the time until the standby leads and until the client's next write is acknowledged by
   it. This is dominated by the lease timeout (default 3 s; also measured with 1 s), during
   which the standby waits for the dead leader.

Controllers run as real `automq controller` processes (default controller config unless said);
the load generator runs in this process on the same (2-core) machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from automq.broker.controller import records as r
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.log import MetadataLog
from automq.broker.controller.protocol import Endpoint
from automq.broker.objectstore import open_object_store
from automq.broker.storage.metadata import CommitStreamSetObjectRequest, ObjectStreamRange


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ControllerProc:
    def __init__(self, workdir: Path, node_id: int, store_url: str, controller: dict | None = None) -> None:
        self.node_id = node_id
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = {
            "node_id": node_id,
            "object_store_url": store_url,
            "http_host": "127.0.0.1",
            "http_port": self.port,
            "log_level": "WARNING",
            "controller": controller or {},
        }
        self.config_path = workdir / f"controller-{node_id}.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg))
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "automq.broker.cli", "controller", "--config", str(self.config_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"controller {self.node_id} not ready")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def entry_size() -> int:
    rec = r.StreamSetObjectCommitted(123456, 8 << 20, 1, [[42, 1_000_000, 1_001_000]], [], [], int(time.time() * 1000))
    return len(MetadataLog.encode_entry(123456, 0, "0123456789abcdef", [rec]))


async def commit_latency(
    client: ControllerClient, node_epoch: int, n: int, store_url: str, size: int
) -> tuple[list[float], list[float]]:
    """Commit latency and, interleaved with it (same moment, same load), the raw PUT baseline."""
    sid = await client.create_stream({"bench": "seq"})
    await client.open_stream(sid, 1, 1, node_epoch)
    first = await client.prepare_objects(n, 600_000)
    store = open_object_store(store_url)
    payload = b"x" * size
    lat, base = [], []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            await store.put(f"bench/raw/{i:08d}", payload, if_none_match=True)
            base.append(time.perf_counter() - t0)
            req = CommitStreamSetObjectRequest(
                1, node_epoch, first + i, 1 << 20, (ObjectStreamRange(sid, 1, i * 10, i * 10 + 10, 1 << 20),)
            )
            t0 = time.perf_counter()
            await client.commit_stream_set_object(req)
            lat.append(time.perf_counter() - t0)
    finally:
        await store.close()
    return lat, base


async def group_commit(
    client: ControllerClient, node_epoch: int, writers: int, per_writer: int
) -> tuple[float, list[float], int]:
    sids = []
    for _ in range(writers):
        sid = await client.create_stream({"bench": "group"})
        await client.open_stream(sid, 1, 1, node_epoch)
        sids.append(sid)
    first = await client.prepare_objects(writers * per_writer, 600_000)
    seq_before = (await client.status())["log_seq"]
    lat: list[float] = []

    async def writer(w: int) -> None:
        for i in range(per_writer):
            oid = first + w * per_writer + i
            req = CommitStreamSetObjectRequest(
                1, node_epoch, oid, 1 << 20, (ObjectStreamRange(sids[w], 1, i * 10, i * 10 + 10, 1 << 20),)
            )
            t0 = time.perf_counter()
            await client.commit_stream_set_object(req)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    elapsed = time.perf_counter() - t0
    entries = (await client.status())["log_seq"] - seq_before
    return writers * per_writer / elapsed, lat, entries


async def wait_leader(url: str) -> float:
    """perf_counter() when `url` first reports itself leader."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(f"{url}/v1/status") as resp:
                    if (await resp.json())["role"] == "leader":
                        return time.perf_counter()
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.01)


async def takeover(workdir: Path, store_url: str, rounds: int, lease_timeout_ms: int) -> list[tuple[float, float]]:
    settings = {"lease_timeout_ms": lease_timeout_ms, "renew_interval_ms": min(500, lease_timeout_ms // 4)}
    procs = [ControllerProc(workdir, 10, store_url, settings), ControllerProc(workdir, 11, store_url, settings)]
    results = []
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready()
        client = ControllerClient([p.url for p in procs], retry_deadline_s=60, request_timeout_s=2)
        await client.create_stream({"bench": "warmup"})
        for _ in range(rounds):
            leader_url = (await client.status())["leader_url"]
            leader = next(p for p in procs if p.url == leader_url)
            standby = next(p for p in procs if p is not leader)
            standby.wait_ready()
            await asyncio.sleep(0.5)
            t0 = time.perf_counter()
            leader.kill()
            elected = asyncio.create_task(wait_leader(standby.url))
            await client.create_stream({"bench": "after-kill"})  # retries until the new leader answers
            total = time.perf_counter() - t0
            results.append((total, await elected - t0))
            leader.start()  # back as the next round's standby
            leader.wait_ready()
        await client.close()
    finally:
        for p in procs:
            p.stop()
    return results


async def run_backend(name: str, store_url: str, args, workdir: Path) -> None:
    print(f"\n== {name}: {store_url.split('?')[0]}")
    size = entry_size()

    proc = ControllerProc(workdir, 0, store_url)
    proc.start()
    try:
        proc.wait_ready()
        async with ControllerClient([proc.url]) as client:
            epoch = await client.register_broker(1, [Endpoint("PLAINTEXT", "127.0.0.1", 9092)], None)

            async def heartbeats() -> None:  # a broker that stops heartbeating is fenced
                while True:
                    await client.heartbeat(1, epoch)
                    await asyncio.sleep(1)

            keepalive = asyncio.create_task(heartbeats())
            lat, base = await commit_latency(client, epoch, args.n, store_url, size)
            print(
                f"baseline raw conditional PUT ({size} B)      p50 {pct(base, 0.5):7.2f} ms   p99 {pct(base, 0.99):7.2f} ms   (interleaved)"
            )
            print(
                f"metadata change (commit, 1 client)          p50 {pct(lat, 0.5):7.2f} ms   p99 {pct(lat, 0.99):7.2f} ms   (n={len(lat)})"
            )
            rate, glat, entries = await group_commit(client, epoch, args.concurrency, args.per_writer)
            total = args.concurrency * args.per_writer
            print(
                f"group commit ({args.concurrency} clients)                 p50 {pct(glat, 0.5):7.2f} ms   p99 {pct(glat, 0.99):7.2f} ms   "
                f"{rate:8.0f} commits/s, {total / max(entries, 1):.1f} requests per log entry"
            )
            keepalive.cancel()
    finally:
        proc.stop()

    for lease_ms in args.lease_timeout_ms if args.takeovers else ():
        times = await takeover(workdir, store_url, args.takeovers, lease_ms)
        acked = [t for t, _ in times]
        elected = [e for _, e in times]
        print(
            f"standby takeover after kill -9 (lease_timeout_ms={lease_ms}, renew {min(500, lease_ms // 4)} ms, poll 100 ms): "
            f"standby leads after {', '.join(f'{e:.2f}' for e in elected)} s; "
            f"client write acked after {', '.join(f'{t:.2f}' for t in acked)} s (median {statistics.median(acked):.2f} s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=150, help="sequential operations per latency measurement")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--per-writer", type=int, default=10)
    parser.add_argument("--takeovers", type=int, default=1, help="kill -9 rounds per lease timeout")
    parser.add_argument(
        "--lease-timeout-ms",
        type=int,
        nargs="+",
        default=[3000, 1000],
        help="controller.lease_timeout_ms values to measure takeover with (3000 is the default)",
    )
    parser.add_argument("--no-seaweedfs", action="store_true", help="skip the SeaweedFS runs")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="automq-controller-bench-"))
    print(f"controller benchmark (cpus: {os.cpu_count()}); workdir {workdir}")
    asyncio.run(run_backend("file", f"file://{workdir}/objects", args, workdir))
    if not args.no_seaweedfs:
        from automq.broker.objectstore.seaweedfs import SeaweedFS

        server = SeaweedFS.launch(workdir / "seaweedfs")
        try:
            server.export_environment()
            bucket = server.create_bucket()
            asyncio.run(run_backend("seaweedfs", server.url_for(bucket), args, workdir))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
