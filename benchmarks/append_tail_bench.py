"""Append tail latency with uploads (and optionally a catch-up read) running, inside one
process: the storage engine alone, no Kafka client in the measurement. Prints numbers next
to baselines from the same run; asserts nothing.

    python benchmarks/append_tail_bench.py                      # 30 s at 10 MiB/s, 4 KiB appends
    python benchmarks/append_tail_bench.py --catchup-bytes 1GiB # a reader catches up from objects meanwhile

What it prints:
1. baseline: raw 4 KiB write+fdatasync p50/p99 in the same directory (the disk's own floor);
2. append latency (from the moment an append was due, so a stalled loop counts in full)
   p50/p99/max at a fixed rate across a few streams, with uploads of the default 64 MiB
   blocks to a file:// store on the same disk;
3. where stalls come from: event-loop lag p99/max (a 1 ms ticker), the longest stretches in
   which the loop thread itself was on the CPU without giving the loop a turn (own work,
   not preemption by other processes), garbage-collection pauses per generation, WAL
   fdatasync p99/max, and the number of uploads that fell inside the run.
   The start-up heap is frozen out of garbage collection as a broker does
   (`freeze_startup_heap`); --no-gc-freeze compares without it.

Issue 14 goal 1 is produce p99 <= 5 ms and <= 5x raw fdatasync p99 through the Kafka layer
(benchmarks/kafka_bench.py); this run shows how much of that budget the storage engine
itself uses, without the load generator's noise.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import time
from pathlib import Path

from automq.broker.config import NodeConfig, parse_size
from automq.broker.node import freeze_startup_heap
from automq.broker.objectstore import open_object_store
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata

MiB = 1 << 20


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def raw_fdatasync(directory: Path, n: int = 2000) -> list[float]:
    path = directory / f"raw-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, bytes(n * 4096), 0)
        os.fsync(fd)
        block = os.urandom(4096)
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            os.pwrite(fd, block, i * 4096)
            os.fdatasync(fd)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        os.close(fd)
        path.unlink()


class LoopWatch:
    """A 1 ms ticker: loop lag per tick, and the loop thread's own CPU time per tick."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.cpu_stalls: list[float] = []
        self.gc: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._gc_start = 0.0
        self._task: asyncio.Task | None = None

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc[info["generation"]].append(time.perf_counter() - self._gc_start)

    async def _tick(self) -> None:
        last, cpu = time.perf_counter(), time.thread_time()
        while True:
            await asyncio.sleep(0.001)
            now, c = time.perf_counter(), time.thread_time()
            self.lags.append(now - last - 0.001)
            if c - cpu > 0.002:
                self.cpu_stalls.append(c - cpu)
            last, cpu = now, c

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.ensure_future(self._tick())

    def stop(self) -> None:
        gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()


async def run(args: argparse.Namespace, directory: Path) -> None:
    store_url = f"file://{directory}/objects"
    config = NodeConfig(node_id=1, data_dir=str(directory / "node"), object_store_url=store_url)
    store = open_object_store(store_url)
    meta = InProcessMetadata(store)
    engine = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
    await engine.start()
    sids = [await engine.create_stream() for _ in range(args.streams)]
    streams = [await engine.open_stream(sid, 0) for sid in sids]
    payload = os.urandom(args.batch_bytes)

    reader_done: asyncio.Future | None = None
    read_stats = {"bytes": 0, "seconds": 0.0}
    if args.catchup_bytes:
        old = await engine.open_stream(await engine.create_stream(), 0)
        chunk = os.urandom(256 << 10)
        written = 0
        while written < args.catchup_bytes:
            await asyncio.gather(*(old.append(chunk, 256) for _ in range(16)))
            written += 16 * len(chunk)
        await engine.uploader.flush()
        engine.log_cache.drop_stream(old.stream_id)  # the reader must go to the objects
        print(f"catch-up source: {written / MiB:.0f} MiB written and uploaded")

        async def catch_up() -> None:
            t0 = time.perf_counter()
            offset, end = 0, written // len(chunk) * 256
            while offset < end:
                r = await old.fetch(offset, end, 16 * MiB)
                read_stats["bytes"] += sum(len(b.payload) for b in r.batches)
                offset = r.batches[-1].base_offset + r.batches[-1].record_count
            read_stats["seconds"] = time.perf_counter() - t0

    puts_before = store.stats.puts
    latencies: list[float] = []
    inflight: set[asyncio.Task] = set()

    async def one(stream, due: float) -> None:
        await stream.append(payload, max(1, args.batch_bytes // 1024))
        latencies.append(time.perf_counter() - due)

    if not args.no_gc_freeze:
        freeze_startup_heap()  # as a broker does once it serves
    watch = LoopWatch()
    watch.start()
    wal_sync_before = _histogram_state(engine)
    interval = args.batch_bytes / (args.rate_mib * MiB)
    start = time.perf_counter()
    if args.catchup_bytes:
        reader_done = asyncio.ensure_future(catch_up())
    sent = 0
    while True:
        now = time.perf_counter()
        if now - start >= args.seconds:
            break
        while start + sent * interval <= now:
            t = asyncio.ensure_future(one(streams[sent % len(streams)], start + sent * interval))
            inflight.add(t)
            t.add_done_callback(inflight.discard)
            sent += 1
        await asyncio.sleep(0.0005)
    if inflight:
        await asyncio.wait(inflight)
    watch.stop()
    if reader_done is not None:
        await reader_done
    uploads = store.stats.puts - puts_before
    syncs = _histogram_delta(engine, wal_sync_before)
    await engine.close()
    await store.close()

    print(
        f"appends at {args.rate_mib:g} MiB/s ({args.batch_bytes} B, {args.streams} streams, {args.seconds:g} s, "
        f"{uploads} objects uploaded meanwhile): p50 {pct(latencies, 50) * 1e3:.2f} ms, "
        f"p99 {pct(latencies, 99) * 1e3:.2f} ms, max {max(latencies) * 1e3:.1f} ms"
    )
    if args.catchup_bytes:
        print(
            f"catch-up read from objects: {read_stats['bytes'] / MiB:.0f} MiB at "
            f"{read_stats['bytes'] / MiB / max(read_stats['seconds'], 1e-9):.1f} MiB/s during the appends"
        )
    stalls = sorted(watch.cpu_stalls, reverse=True)
    print(
        f"  event loop: lag p99 {pct(watch.lags, 99) * 1e3:.2f} ms, max {max(watch.lags) * 1e3:.1f} ms; "
        f"loop-thread CPU without a turn > 2 ms: {len(stalls)} times, {sum(stalls) * 1e3:.0f} ms in all, "
        f"longest {', '.join(f'{s * 1e3:.1f}' for s in stalls[:5]) or '-'} ms"
    )
    print(
        "  gc pauses: "
        + "; ".join(f"gen{g} {len(v)} x, max {max(v, default=0) * 1e3:.1f} ms" for g, v in watch.gc.items())
    )
    print(f"  WAL fdatasync (engine histogram, bucket bounds): {syncs}")


def _histogram_state(engine: StorageEngine) -> dict[float, float]:
    metrics = engine.metrics
    out: dict[float, float] = {}
    for metric in metrics.wal_sync_seconds.collect():
        for s in metric.samples:
            if s.name.endswith("_bucket"):
                out[float(s.labels["le"])] = s.value
    return out


def _histogram_delta(engine: StorageEngine, before: dict[float, float]) -> str:
    after = _histogram_state(engine)
    total = after.get(float("inf"), 0) - before.get(float("inf"), 0)
    if not total:
        return "no syncs"

    def bound(p: float) -> str:
        for le in sorted(after):
            if after[le] - before.get(le, 0) >= total * p:
                return f"<= {le * 1e3:g} ms"
        return "?"

    return f"{total:.0f} syncs, p50 {bound(0.5)}, p99 {bound(0.99)}, max {bound(1.0)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where the WAL and the file:// store go (default: a temp dir)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rate-mib", type=float, default=10.0)
    ap.add_argument("--batch-bytes", type=int, default=4096)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--catchup-bytes", type=parse_size, default=0)
    ap.add_argument("--no-gc-freeze", action="store_true", help="compare: skip the broker's post-start-up gc.freeze")
    args = ap.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at start")
    with tempfile.TemporaryDirectory(prefix="append-tail-", dir=args.dir) as d:
        directory = Path(d)
        raw = raw_fdatasync(directory)
        print(f"baseline: raw 4 KiB write+fdatasync p50 {pct(raw, 50) * 1e3:.2f} ms, p99 {pct(raw, 99) * 1e3:.2f} ms")
        try:
            import uvloop
        except ImportError:  # pragma: no cover
            asyncio.run(run(args, directory))
        else:
            uvloop.run(run(args, directory))


if __name__ == "__main__":
    main()
