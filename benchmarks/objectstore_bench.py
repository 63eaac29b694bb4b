"""Object-store PUT/GET throughput and latency, each backend next to a baseline from the same run.

    python benchmarks/objectstore_bench.py                 # local + SeaweedFS (started here)
    python benchmarks/objectstore_bench.py --quick         # fewer operations
    python benchmarks/objectstore_bench.py --s3-url 's3://b?endpoint=...&path_style=true'
    python benchmarks/objectstore_bench.py --quick --race 50   # + conditional-write race probe

Rows:
  file-raw     write + fsync + rename of a plain file, read back (what the local store must beat or match)
  file         LocalObjectStore (temp file, fsync, rename, dir fsync, xattr ETag)
  boto3-raw    synchronous boto3 put_object/get_object against the same server
  s3           S3ObjectStore (aiobotocore) against the same server
Operations run one at a time (latency), then `--concurrency` at once (throughput). Prints
numbers only; never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from automq.broker.objectstore import open_object_store
from automq.broker.objectstore.seaweedfs import SeaweedFS

KiB, MiB = 1 << 10, 1 << 20
SIZES = [(4 * KiB, 200), (1 * MiB, 30), (8 * MiB, 8)]


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def report(
    name: str, op: str, size: int, latencies: list[float], parallel_seconds: float | None, parallel_ops: int
) -> None:
    total = sum(latencies)
    mib_s = len(latencies) * size / MiB / total if total else float("nan")
    line = (
        f"{name:10} {op:4} {size // KiB:>6} KiB  n={len(latencies):<4}"
        f" p50={statistics.median(latencies) * 1000:8.2f} ms  p99={percentile(latencies, 0.99) * 1000:8.2f} ms"
        f"  seq={mib_s:8.1f} MiB/s"
    )
    if parallel_seconds:
        line += f"  par={parallel_ops * size / MiB / parallel_seconds:8.1f} MiB/s"
    print(line, flush=True)


async def measure(op: Callable[[int], Awaitable[object]], count: int, concurrency: int) -> tuple[list[float], float]:
    latencies = []
    for index in range(count):
        started = time.perf_counter()
        await op(index)
        latencies.append(time.perf_counter() - started)
    started = time.perf_counter()
    limit = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with limit:
            await op(count + index)

    await asyncio.gather(*(one(index) for index in range(count)))
    return latencies, time.perf_counter() - started


async def bench_store(name: str, url: str, concurrency: int, scale: float) -> None:
    async with open_object_store(url) as store:
        for size, count in SIZES:
            count = max(4, int(count * scale))
            data = os.urandom(size)
            put_lat, put_par = await measure(lambda i: store.put(f"bench/{size}/{i}", data), count, concurrency)
            report(name, "PUT", size, put_lat, put_par, count)
            get_lat, get_par = await measure(lambda i: store.get(f"bench/{size}/{i}"), count, concurrency)
            report(name, "GET", size, get_lat, get_par, count)
            await store.delete_many([f"bench/{size}/{i}" for i in range(2 * count)])


async def conditional_race(name: str, url: str, rounds: int, writers: int) -> None:
    """How often racing conditional writers do NOT produce exactly one winner (should be 0)."""
    from automq.broker.objectstore import PreconditionFailed

    stores = [open_object_store(url) for _ in range(4)]
    try:

        async def attempt(index: int, put: Callable[[object], Awaitable[object]]) -> bool:
            try:
                await put(stores[index % len(stores)])
            except PreconditionFailed:
                return False
            return True

        create_bad = 0
        for round_number in range(rounds):
            key = f"race/create/{round_number}"
            wins = await asyncio.gather(
                *(attempt(i, lambda s, i=i: s.put(key, b"%d" % i, if_none_match=True)) for i in range(writers))
            )
            create_bad += sum(wins) != 1
        replace_bad = 0
        await stores[0].put("race/cas", b"0")
        for round_number in range(rounds):
            etag = (await stores[0].head("race/cas")).etag
            # Unique content per writer and round: ETags are content hashes, so writing bytes
            # equal to the current object would legitimately keep the ETag and let a second
            # writer match it too (ABA), which is not a race.
            wins = await asyncio.gather(
                *(
                    attempt(i, lambda s, i=i, r=round_number: s.put("race/cas", b"%d-%d" % (r, i), if_match=etag))
                    for i in range(writers)
                )
            )
            replace_bad += sum(wins) != 1
        print(
            f"{name:10} race {writers} writers x {rounds} rounds: If-None-Match rounds without exactly one "
            f"winner {create_bad}/{rounds}, If-Match {replace_bad}/{rounds}",
            flush=True,
        )
    finally:
        for store in stores:
            await store.close()


def bench_raw_files(root: Path, scale: float) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for size, count in SIZES:
        count = max(4, int(count * scale))
        data = os.urandom(size)
        put_lat, get_lat = [], []
        for index in range(count):
            started = time.perf_counter()
            temp, final = root / f"tmp-{index}", root / f"obj-{index}"
            with open(temp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(temp, final)
            put_lat.append(time.perf_counter() - started)
        for index in range(count):
            started = time.perf_counter()
            (root / f"obj-{index}").read_bytes()
            get_lat.append(time.perf_counter() - started)
        report("file-raw", "PUT", size, put_lat, None, count)
        report("file-raw", "GET", size, get_lat, None, count)


def bench_raw_boto3(endpoint: str, bucket: str, scale: float) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}))
    for size, count in SIZES:
        count = max(4, int(count * scale))
        data = os.urandom(size)
        put_lat, get_lat = [], []
        for index in range(count):
            started = time.perf_counter()
            client.put_object(Bucket=bucket, Key=f"raw/{size}/{index}", Body=data)
            put_lat.append(time.perf_counter() - started)
        for index in range(count):
            started = time.perf_counter()
            client.get_object(Bucket=bucket, Key=f"raw/{size}/{index}")["Body"].read()
            get_lat.append(time.perf_counter() - started)
        report("boto3-raw", "PUT", size, put_lat, None, count)
        report("boto3-raw", "GET", size, get_lat, None, count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--s3-url", help="benchmark this S3 bucket instead of starting SeaweedFS")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="a quarter of the operations")
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument(
        "--race",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also race 16 conditional writers for ROUNDS rounds per backend (correctness probe)",
    )
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, concurrency {args.concurrency}", flush=True)

    with tempfile.TemporaryDirectory(prefix="automq-objbench-") as tmp:
        bench_raw_files(Path(tmp) / "raw", scale)
        asyncio.run(bench_store("file", f"file://{tmp}/objects", args.concurrency, scale))
        if args.race:
            asyncio.run(conditional_race("file", f"file://{tmp}/race", args.race, 16))
        if args.skip_s3:
            return
        server: SeaweedFS | None = None
        try:
            if args.s3_url:
                url = args.s3_url
            else:
                server = SeaweedFS.launch(Path(tmp) / "seaweedfs")
                server.export_environment()
                url = server.url_for(server.create_bucket())
            from automq.broker.objectstore.s3 import parse_s3_url

            settings = parse_s3_url(url)
            if settings.endpoint:
                bench_raw_boto3(settings.endpoint, settings.bucket, scale)
            asyncio.run(bench_store("s3", url, args.concurrency, scale))
            if args.race:
                asyncio.run(conditional_race("s3", url, args.race, 16))
        finally:
            if server is not None:
                server.remove()


if __name__ == "__main__":
    main()
