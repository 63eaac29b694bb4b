"""Storage engine benchmark: prints numbers next to baselines measured in the same run.

    python benchmarks/storage_bench.py [--dir DIR] [--seconds 2] [--no-s3] [--sizes 1024,16384,1048576]

1. Baselines on the WAL's own disk: write+fdatasync latency per size (p50/p99) and
   sequential write throughput (1 MiB writes, one fdatasync per 16 MiB).
2. Volume WAL (`VolumeWal` with a trimming consumer, and the whole engine via
   `Stream.append`): p50/p99 latency at moderate load (one appender, one append in flight)
   and throughput with many appends in flight (group commit) for 1 KiB, 16 KiB, 1 MiB.
3. S3 WAL against SeaweedFS: the same next to a raw PUT of the same size.
4. Cold reads: a fresh engine (empty caches) reads a stream back from objects through the
   block cache (file:// and SeaweedFS).

No assertions: it prints. Default run stays under about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from automq.broker.config import NodeConfig
from automq.broker.objectstore import open_object_store
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata
from automq.broker.storage.wal.base import WalRecord
from automq.broker.storage.wal.volume import VolumeWal

MiB = 1 << 20


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def fmt_ms(v: float) -> str:
    return f"{v * 1000:8.3f} ms"


def size_name(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // 1024} KiB"


# ---------------------------------------------------------------------------- baselines


def raw_fdatasync(path: Path, size: int, seconds: float) -> list[float]:
    """Sequential pwrite+fdatasync of `size` bytes into a preallocated file (like the ring)."""
    area = 64 * MiB
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        zero = bytes(MiB)
        for off in range(0, area, MiB):
            os.pwrite(fd, zero, off)
        os.fsync(fd)
        buf = os.urandom(size)
        lat = []
        pos = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(lat) < 20:
            t0 = time.perf_counter()
            os.pwrite(fd, buf, pos)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t0)
            pos = (pos + size) % (area - size)
        return lat
    finally:
        os.close(fd)
        path.unlink()


def raw_sequential(path: Path, total: int, preallocated: bool) -> float:
    """1 MiB writes, an fdatasync per 16 MiB: into a new file, or over a preallocated one
    (what the ring does once its file exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        buf = os.urandom(MiB)
        if preallocated:
            for _ in range(total // MiB):
                os.write(fd, bytes(MiB))
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        t0 = time.perf_counter()
        for i in range(total // MiB):
            os.write(fd, buf)
            if i % 16 == 15:
                os.fdatasync(fd)
        os.fdatasync(fd)
        return total / MiB / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()


# ---------------------------------------------------------------------------- volume WAL


async def wal_latency(wal: VolumeWal, size: int, seconds: float) -> list[float]:
    payload = os.urandom(size)
    lat = []
    deadline = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < deadline or len(lat) < 20:
        t0 = time.perf_counter()
        end = await wal.append(WalRecord(1, 0, i, 1, payload))
        lat.append(time.perf_counter() - t0)
        await wal.trim(end)
        i += 1
    return lat


async def wal_throughput(wal: VolumeWal, size: int, seconds: float, inflight: int) -> tuple[float, list[float]]:
    payload = os.urandom(size)
    lat: list[float] = []
    done = 0
    stop = time.perf_counter() + seconds
    counter = 0
    durable: list[int] = [0]

    async def appender() -> None:
        nonlocal done, counter
        while time.perf_counter() < stop:
            counter += 1
            t0 = time.perf_counter()
            end = await wal.append(WalRecord(1, 0, counter, 1, payload))
            lat.append(time.perf_counter() - t0)
            done += size
            durable[0] = max(durable[0], end)

    async def trimmer() -> None:  # stands in for the uploader: keeps the ring from filling
        while time.perf_counter() < stop + 1:
            await asyncio.sleep(0.05)
            if durable[0]:
                await wal.trim(durable[0])

    t0 = time.perf_counter()
    trim_task = asyncio.create_task(trimmer())
    await asyncio.gather(*(appender() for _ in range(inflight)))
    elapsed = time.perf_counter() - t0
    trim_task.cancel()
    return done / MiB / elapsed, lat


def engine_config(data_dir: Path, store_url: str, wal_kind: str = "volume") -> NodeConfig:
    return NodeConfig(
        node_id=1,
        data_dir=str(data_dir),
        object_store_url=store_url,
        wal={"kind": wal_kind, "capacity": 512 * MiB},
        storage={"log_cache_bytes": 512 * MiB, "upload_block_bytes": 64 * MiB, "upload_interval_ms": 5_000},
    )


async def engine_run(
    config: NodeConfig, store_url: str, size: int, seconds: float, inflight: int
) -> tuple[float, list[float]]:
    store = open_object_store(store_url)
    meta = InProcessMetadata(store)
    epoch = await meta.register_node(1)
    engine = StorageEngine(config, store, meta, meta, 1, epoch)
    await engine.start()
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    payload = os.urandom(size)
    lat: list[float] = []
    done = 0
    stop = time.perf_counter() + seconds

    async def appender() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await stream.append(payload, 1)
            lat.append(time.perf_counter() - t0)
            done += size

    t0 = time.perf_counter()
    await asyncio.gather(*(appender() for _ in range(inflight)))
    elapsed = time.perf_counter() - t0
    await engine.close()
    await store.close()
    return done / MiB / elapsed, lat


# ---------------------------------------------------------------------------- reads


async def cold_read(data_dir: Path, store_url: str, total: int) -> tuple[float, float, dict]:
    config = engine_config(data_dir, store_url).model_copy(
        update={
            "storage": engine_config(data_dir, store_url).storage.model_copy(update={"upload_block_bytes": 16 * MiB})
        }
    )
    store = open_object_store(store_url)
    meta = InProcessMetadata(store)
    epoch = await meta.register_node(1)
    engine = StorageEngine(config, store, meta, meta, 1, epoch)
    await engine.start()
    sid = await engine.create_stream()
    stream = await engine.open_stream(sid, 0)
    payload = os.urandom(64 << 10)
    await asyncio.gather(*(stream.append(payload, 10) for _ in range(total // len(payload))))
    await engine.close()
    # a fresh engine: nothing cached
    epoch = await meta.register_node(1)
    engine = StorageEngine(config, store, meta, meta, 1, epoch)
    await engine.start()
    stream = await engine.open_stream(sid, 1)
    end = stream.confirm_offset
    t0 = time.perf_counter()
    pos, got = 0, 0
    while pos < end:
        r = await stream.fetch(pos, end, 1 * MiB)
        got += r.size
        pos = r.next_offset
    elapsed = time.perf_counter() - t0
    stats = {"block_cache_hits": engine.block_cache.hits, "block_cache_misses": engine.block_cache.misses}
    # warm re-read of the tail that still fits the block cache
    t1 = time.perf_counter()
    warm_start = max(0, end - 40 * 10 * 10)
    pos, warm = warm_start, 0
    while pos < end:
        r = await stream.fetch(pos, end, 1 * MiB)
        warm += r.size
        pos = r.next_offset
    warm_elapsed = time.perf_counter() - t1
    await engine.close()
    await store.close()
    return got / MiB / elapsed, warm / MiB / max(warm_elapsed, 1e-9), stats


# ---------------------------------------------------------------------------- S3


async def raw_put(store_url: str, size: int, seconds: float) -> list[float]:
    store = open_object_store(store_url)
    data = os.urandom(size)
    lat = []
    deadline = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < deadline or len(lat) < 10:
        t0 = time.perf_counter()
        await store.put(f"bench/raw/{i}", data)
        lat.append(time.perf_counter() - t0)
        i += 1
    await store.close()
    return lat


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None, help="where the WAL and file:// objects go (default: a temp dir)")
    ap.add_argument("--seconds", type=float, default=0.7)
    ap.add_argument("--sizes", default="1024,16384,1048576")
    ap.add_argument("--inflight", type=int, default=16)
    ap.add_argument("--no-s3", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    base = Path(args.dir or tempfile.mkdtemp(prefix="storage-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    secs = args.seconds
    print(
        f"# storage benchmark in {base}; {os.cpu_count()} CPUs; {secs}s per measurement, {args.inflight} appends in flight for throughput"
    )

    print("\n## baseline: this disk")
    raw_p99 = {}
    for size in sizes:
        lat = raw_fdatasync(base / "raw", size, secs)
        raw_p99[size] = pct(lat, 99)
        print(
            f"pwrite+fdatasync {size_name(size):>7}: p50 {fmt_ms(pct(lat, 50))}  p99 {fmt_ms(pct(lat, 99))}  ({len(lat)} syncs)"
        )
    print(
        f"sequential write (1 MiB writes, fdatasync per 16 MiB): new file {raw_sequential(base / 'seq', 256 * MiB, False):8.1f} MiB/s, "
        f"over a preallocated file {raw_sequential(base / 'seq', 256 * MiB, True):8.1f} MiB/s"
    )

    print("\n## volume WAL (VolumeWal directly, trimmed as it goes)")
    for size in sizes:
        path = base / f"wal-{size}"
        wal = VolumeWal(path, 256 * MiB, 1, 1)
        await wal.recover()
        await wal.start(0)
        lat = await wal_latency(wal, size, secs)
        mibs, tlat = await wal_throughput(wal, size, secs, args.inflight)
        await wal.close()
        path.unlink()
        print(
            f"{size_name(size):>7}: one in flight p50 {fmt_ms(pct(lat, 50))} p99 {fmt_ms(pct(lat, 99))} "
            f"(= {pct(lat, 99) / raw_p99[size]:.2f}x raw fdatasync p99) | {args.inflight} in flight {mibs:8.1f} MiB/s "
            f"p50 {fmt_ms(pct(tlat, 50))} p99 {fmt_ms(pct(tlat, 99))}"
        )

    print("\n## engine (Stream.append: volume WAL + log cache + uploader to file://)")
    for size in sizes:
        d = base / f"engine-{size}"
        url = f"file://{d}/objects"
        _, lat = await engine_run(engine_config(d, url), url, size, secs, 1)
        mibs, tlat = await engine_run(engine_config(d / "t", url), url, size, secs, args.inflight)
        print(
            f"{size_name(size):>7}: one in flight p50 {fmt_ms(pct(lat, 50))} p99 {fmt_ms(pct(lat, 99))} "
            f"(= {pct(lat, 99) / raw_p99[size]:.2f}x raw) | {args.inflight} in flight {mibs:8.1f} MiB/s p99 {fmt_ms(pct(tlat, 99))}"
        )

    print("\n## cold reads through the block cache")
    d = base / "read-file"
    cold, warm, stats = await cold_read(d, f"file://{d}/objects", 32 * MiB)
    print(f"file:// 32 MiB: cold {cold:8.1f} MiB/s, warm tail {warm:8.1f} MiB/s, {stats}")

    if not args.no_s3:
        from automq.broker.objectstore.seaweedfs import SeaweedFS

        server = SeaweedFS(data_dir=base / "seaweedfs")
        server.start()
        server.export_environment()
        try:
            print("\n## S3 WAL against SeaweedFS (a bulk at once when no PUT runs; at most 250 ms / 8 MiB)")
            await raw_put(server.url_for(server.create_bucket()), 1024, 0.3)  # warm up connections and volumes
            store = open_object_store(server.url_for(server.create_bucket()))
            bulk = os.urandom(8 * MiB)
            t0 = time.perf_counter()
            await asyncio.gather(*(store.put(f"bench/bulk/{i}", bulk) for i in range(8)))
            print(
                f"raw PUT throughput, 8 MiB objects, 8 concurrent (the S3 WAL writes 8 MiB bulks, 4 at a time): {64 / (time.perf_counter() - t0):8.1f} MiB/s"
            )
            await store.close()
            for size in sizes:
                bucket = server.create_bucket()
                url = server.url_for(bucket)
                put = await raw_put(url, size, min(secs, 0.5))
                config = engine_config(base / f"s3-{size}", url, "s3")
                _, lat = await engine_run(config, url, size, secs, 1)
                mibs, tlat = await engine_run(
                    config.model_copy(update={"data_dir": str(base / f"s3t-{size}")}), url, size, secs * 1.5, 64
                )
                print(
                    f"{size_name(size):>7}: raw PUT p50 {fmt_ms(pct(put, 50))} p99 {fmt_ms(pct(put, 99))} | one in flight "
                    f"p50 {fmt_ms(pct(lat, 50))} p99 {fmt_ms(pct(lat, 99))} | 64 in flight {mibs:8.1f} MiB/s p99 {fmt_ms(pct(tlat, 99))}"
                )
            bucket = server.create_bucket()
            url = server.url_for(bucket)
            cold, warm, stats = await cold_read(base / "read-s3", url, 32 * MiB)
            print(f"\nSeaweedFS 32 MiB cold read: {cold:8.1f} MiB/s, warm tail {warm:8.1f} MiB/s, {stats}")
        finally:
            server.stop()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
    sys.exit(0)
