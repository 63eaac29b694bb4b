"""An uploader's object written to the file:// store: joined first (`put` of one 64 MiB
buffer, what the uploader did up to 16 MiB), in 8 MiB pieces each joined when the store takes
it (`put_multipart`, what it did above 16 MiB), or as its parts (`put_parts`, runs joined under
malloc's mmap threshold, what it does now). Prints wall time, process CPU time and minor page faults per object for both,
interleaved round by round; asserts nothing.

    python benchmarks/file_store_put_parts_bench.py [--rounds 5] [--part-bytes 1024] [--dir /data]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
import time
from collections.abc import AsyncIterator

from automq.broker.malloc import tune_allocator
from automq.broker.objectstore.local import LocalObjectStore

MiB = 1 << 20


async def pieces(parts: list[bytes]) -> AsyncIterator[bytes]:
    step = max(1, 8 * MiB // len(parts[0]))
    for i in range(0, len(parts), step):
        yield await asyncio.to_thread(b"".join, parts[i : i + step])


async def one(store: LocalObjectStore, mode: str, key: str, parts: list[bytes]) -> tuple[float, float, int]:
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if mode == "join+put":
        await store.put(key, await asyncio.to_thread(b"".join, parts))
    elif mode == "8mib-pieces":
        await store.put_multipart(key, pieces(parts))
    else:
        await store.put_parts(key, parts)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    await store.delete_many([key])
    return wall, cpu, faults


async def run(args: argparse.Namespace, directory: str) -> None:
    store = LocalObjectStore(directory)
    parts = [os.urandom(args.part_bytes) for _ in range(args.object_mib * MiB // args.part_bytes)]
    results: dict[str, list[tuple[float, float, int]]] = {"join+put": [], "8mib-pieces": [], "put_parts": []}
    await one(store, "put_parts", "warm", parts)
    for r in range(args.rounds):
        for mode in results:
            results[mode].append(await one(store, mode, f"o/{r}-{mode}", parts))
    for mode, rows in results.items():
        print(
            f"{mode:10s} per {args.object_mib} MiB object of {args.part_bytes} B parts: "
            f"wall median {statistics.median(w for w, _, _ in rows) * 1e3:.0f} ms, "
            f"CPU median {statistics.median(c for _, c, _ in rows) * 1e3:.0f} ms, "
            f"minor faults median {statistics.median(f for _, _, f in rows):.0f} "
            f"({', '.join(str(f) for _, _, f in rows)})"
        )
    await store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--part-bytes", type=int, default=1024)
    ap.add_argument("--object-mib", type=int, default=64)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    tune_allocator()  # as a broker process does
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at start")
    with tempfile.TemporaryDirectory(prefix="put-parts-", dir=args.dir) as d:
        asyncio.run(run(args, d))


if __name__ == "__main__":
    main()
