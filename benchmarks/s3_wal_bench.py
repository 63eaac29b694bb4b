"""S3 WAL acknowledgement latency and throughput against SeaweedFS, next to raw PUTs of the
same store in the same run (issue 14 goal 3).

    python benchmarks/s3_wal_bench.py [--seconds 10] [--rate-mib 1] [--append-kib 16]

1. Baselines: sequential raw PUTs of one append's size and of a typical light-load bulk
   (p50/p99), the same as conditional creates (If-None-Match, what the WAL's bulk PUTs are),
   a LIST of the fence markers (what each ack also waited for before the tombstone fencing),
   and raw parallel PUT throughput of 8 MiB objects (4 and 8 at a time).
2. Light load: appends offered open-loop at --rate-mib (a timer, not waiting for acks), each
   acknowledgement's latency.
3. Saturation: 64 appends of 1 MiB in flight for --seconds; MiB/s acknowledged.

Prints numbers only; asserts nothing. The machine may be shared: compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from automq.broker.objectstore import open_object_store
from automq.broker.objectstore.seaweedfs import SeaweedFS
from automq.broker.storage.wal.base import WalRecord
from automq.broker.storage.wal.objectstore import MAX_INFLIGHT, MAX_UNACKED, ObjectStoreWal, fence_prefix

MiB = 1 << 20


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))] if s else float("nan")


def ms(v: float) -> str:
    return f"{v * 1000:7.2f} ms"


async def raw_puts(store, size: int, count: int, conditional: bool = False) -> list[float]:
    data = os.urandom(size)
    lat = []
    tag = os.urandom(4).hex()  # fresh keys: a conditional create of an existing key fails
    for i in range(count):
        t0 = time.perf_counter()
        await store.put(f"bench/raw/{size}/{tag}/{i}", data, if_none_match=conditional)
        lat.append(time.perf_counter() - t0)
    return lat


async def raw_lists(store, count: int) -> list[float]:
    lat = []
    for _ in range(count):
        t0 = time.perf_counter()
        async for _info in store.list(fence_prefix(9)):
            pass
        lat.append(time.perf_counter() - t0)
    return lat


async def raw_parallel(store, size: int, total: int, concurrency: int) -> float:
    data = os.urandom(size)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await store.put(f"bench/par/{concurrency}/{i}", data)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(total // size)))
    return total / MiB / (time.perf_counter() - t0)


async def open_wal(store, epoch: int, wal_class: type = ObjectStoreWal, node: int = 1) -> ObjectStoreWal:
    wal = wal_class(store, node, epoch)
    await wal.recover()
    await wal.start(wal.report.end_position)
    return wal


async def light_load(
    store,
    epoch: int,
    append_bytes: int,
    rate_mib: float,
    seconds: float,
    wal_class: type = ObjectStoreWal,
    node: int = 1,
) -> tuple[list[float], int]:
    wal = await open_wal(store, epoch, wal_class, node)
    payload = os.urandom(append_bytes)
    interval = append_bytes / (rate_mib * MiB)
    lat: list[float] = []
    pending: set[asyncio.Future] = set()
    start = time.perf_counter()
    n = 0
    puts_before = store.stats.puts if hasattr(store, "stats") else 0
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fut = wal.append(WalRecord(1, 0, n, 1, payload))
        fut.add_done_callback(lambda f, t0=t0: lat.append(time.perf_counter() - t0))
        pending.add(fut)
        fut.add_done_callback(pending.discard)
        n += 1
        await asyncio.sleep(max(0.0, start + n * interval - time.perf_counter()))
    if pending:
        await asyncio.gather(*pending)
    puts = (store.stats.puts - puts_before) if hasattr(store, "stats") else -1
    await wal.trim(wal.durable_position)
    await wal.close()
    return lat, puts


async def saturation(
    store, epoch: int, seconds: float, inflight: int = 64, max_bulks: int = MAX_INFLIGHT, max_unacked: int = MAX_UNACKED
) -> float:
    wal = ObjectStoreWal(store, 1, epoch, max_inflight=max_bulks, max_unacked=max_unacked)
    await wal.recover()
    await wal.start(wal.report.end_position)
    payload = os.urandom(MiB)
    done = 0
    stop = time.perf_counter() + seconds

    async def appender(k: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop:
            await wal.append(WalRecord(k, 0, i, 1, payload))
            done += 1
            i += 1

    async def trimmer() -> None:  # stands in for the uploader
        while time.perf_counter() < stop:
            await asyncio.sleep(0.5)
            await wal.trim(wal.durable_position)

    t0 = time.perf_counter()
    await asyncio.gather(*(appender(k) for k in range(inflight)), trimmer())
    elapsed = time.perf_counter() - t0
    await wal.trim(wal.durable_position)
    await wal.close()
    return done / elapsed


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate-mib", type=float, default=1.0)
    ap.add_argument("--append-kib", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--max-bulks", type=int, default=MAX_INFLIGHT, help="the WAL's max_inflight (PUTs at once)")
    ap.add_argument(
        "--max-unacked",
        type=int,
        nargs="+",
        default=[MAX_UNACKED],
        help="the WAL's max_unacked (bulks cut, not acknowledged); several values take turns in every saturation round",
    )
    ap.add_argument("--saturation-rounds", type=int, default=2)
    ap.add_argument("--appends-in-flight", type=int, default=64, help="1 MiB appends outstanding at saturation")
    ap.add_argument("--saturation-only", action="store_true")
    ap.add_argument(
        "--old-wal",
        default=None,
        help="path of another version of broker/storage/wal/objectstore.py (e.g. from `git show`): "
        "its light load runs right after this one's in every round, on its own node id",
    )
    args = ap.parse_args()
    old_class = None
    if args.old_wal:
        spec = importlib.util.spec_from_file_location("old_s3_wal", args.old_wal)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        old_class = module.ObjectStoreWal
    base = Path(args.dir or tempfile.mkdtemp(prefix="s3-wal-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    server = SeaweedFS(data_dir=base / "seaweedfs")
    server.start()
    server.export_environment()
    print(f"# S3 WAL bench on SeaweedFS; load average {os.getloadavg()[0]:.1f} at start; {os.cpu_count()} CPUs")
    try:
        store = open_object_store(server.url_for(server.create_bucket()))
        await raw_puts(store, 1024, 20)  # warm up connections and volumes
        append = args.append_kib * 1024
        if not args.saturation_only:
            print("\n## baselines (same store, same run)")
            for size in (append, 4 * append):
                lat = await raw_puts(store, size, 200)
                print(f"raw PUT {size // 1024:5d} KiB, sequential: p50 {ms(pct(lat, 50))}  p99 {ms(pct(lat, 99))}")
                lat = await raw_puts(store, size, 200, conditional=True)
                print(f"raw conditional PUT {size // 1024:5d} KiB:  p50 {ms(pct(lat, 50))}  p99 {ms(pct(lat, 99))}")
            lists = await raw_lists(store, 200)
            print(f"fence LIST (no longer on the ack path): p50 {ms(pct(lists, 50))}  p99 {ms(pct(lists, 99))}")
            par4 = await raw_parallel(store, 8 * MiB, 256 * MiB, 4)
            par8 = await raw_parallel(store, 8 * MiB, 256 * MiB, 8)
            print(f"raw parallel PUT, 8 MiB objects: 4 at a time {par4:7.1f} MiB/s, 8 at a time {par8:7.1f} MiB/s")

            print(
                f"\n## light load: {args.rate_mib} MiB/s of {args.append_kib} KiB appends, open loop, "
                f"{args.rounds} rounds of {args.seconds / args.rounds:.1f}s, each after 50 raw PUTs (load drifts)"
            )
            lat, puts, raw = [], 0, []
            old_lat, old_puts = [], 0
            for r in range(args.rounds):
                raw += await raw_puts(store, append, 50)
                got, n = await light_load(store, 1 + r, append, args.rate_mib, args.seconds / args.rounds)
                lat += got
                puts += n
                if old_class is not None:
                    got, n = await light_load(
                        store, 1 + r, append, args.rate_mib, args.seconds / args.rounds, old_class, node=2
                    )
                    old_lat += got
                    old_puts += n
            print(f"raw PUT {append // 1024} KiB (interleaved): p50 {ms(pct(raw, 50))}  p99 {ms(pct(raw, 99))}")
            print(
                f"S3 WAL ack latency:        p50 {ms(pct(lat, 50))} ({pct(lat, 50) / pct(raw, 50):.2f}x raw PUT p50)  "
                f"p99 {ms(pct(lat, 99))} ({pct(lat, 99) / pct(raw, 99):.2f}x raw PUT p99)  max {ms(max(lat))}; "
                f"{len(lat)} appends in {puts} PUTs"
            )
            if old_lat:
                print(
                    f"--old-wal ack latency:     p50 {ms(pct(old_lat, 50))} ({pct(old_lat, 50) / pct(raw, 50):.2f}x)  "
                    f"p99 {ms(pct(old_lat, 99))} ({pct(old_lat, 99) / pct(raw, 99):.2f}x)  max {ms(max(old_lat))}; "
                    f"{len(old_lat)} appends in {old_puts} PUTs"
                )
        print(
            f"\n## saturation: {args.appends_in_flight} appends of 1 MiB in flight, {args.seconds}s, at most {args.max_bulks} PUTs at once "
            "and max_unacked bulks unacknowledged; raw parallel PUTs (8 MiB, 4 at a time) right before and right "
            "after each (load drifts)"
        )
        epoch = 1 + args.rounds
        for _ in range(args.saturation_rounds):
            for unacked in args.max_unacked:
                before = await raw_parallel(store, 8 * MiB, 128 * MiB, 4)
                mibs = await saturation(
                    store, epoch, args.seconds, args.appends_in_flight, max_bulks=args.max_bulks, max_unacked=unacked
                )
                after = await raw_parallel(store, 8 * MiB, 128 * MiB, 4)
                epoch += 1
                print(
                    f"S3 WAL (max_unacked {unacked:2d}) {mibs:7.1f} MiB/s acknowledged; raw parallel PUT before "
                    f"{before:7.1f}, after {after:7.1f} ({mibs / ((before + after) / 2):.2f}x their mean)"
                )
        await store.close()
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
