"""The file:// store's ETag cost on the upload path: CPU seconds to store 64 MiB objects
with a conditional `put` (If-None-Match: keeps the MD5 ETag) and an unconditional `put` (a
CRC-32C tag from 8 MiB on, what the uploader's objects get), same run.

    python benchmarks/file_store_etag_bench.py [--mib 64] [--rounds 5]

CPU = user + system time of this process (the writes run in worker threads), which is
steadier than wall time on a shared machine. Prints numbers only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from automq.broker.objectstore.local import LocalObjectStore

MiB = 1 << 20


def cpu() -> float:
    t = os.times()
    return t.user + t.system


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    data = os.urandom(args.mib * MiB)
    print(f"# file store ETag bench; load average {os.getloadavg()[0]:.1f}; {args.mib} MiB objects")
    with tempfile.TemporaryDirectory(prefix="etag-bench-") as d:
        store = LocalObjectStore.from_url(f"file://{d}/objects?fsync=false")
        results: dict[str, list[tuple[float, float]]] = {"conditional put (MD5)": [], "put (CRC-32C tag)": []}
        for r in range(args.rounds):  # interleaved: the machine's load drifts
            for name in results:
                c0, w0 = cpu(), time.perf_counter()
                if name.startswith("conditional"):
                    await store.put(f"c/{r}", data, if_none_match=True)
                else:
                    await store.put(f"p/{r}", data)
                results[name].append((cpu() - c0, time.perf_counter() - w0))
        for name, values in results.items():
            c = statistics.median(v[0] for v in values)
            w = statistics.median(v[1] for v in values)
            print(
                f"{name:26s} CPU median {c * 1000:7.1f} ms ({args.mib / c:7.0f} MiB per CPU-s), wall {w * 1000:7.1f} ms"
            )


if __name__ == "__main__":
    asyncio.run(main())
