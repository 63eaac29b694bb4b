"""How long a WAL-style fdatasync waits while the file:// object store writes objects on the
same disk, for the store's write-back as it is and for the alternatives tried (issue 14).
Prints numbers next to the baseline from the same run (no store writes); asserts nothing.

    python benchmarks/store_wal_contention_bench.py                  # 3 rounds, 512 MiB per trial
    python benchmarks/store_wal_contention_bench.py --rounds 5 --dir /data

One thread stands in for the WAL: 4 KiB pwrite + fdatasync, a 0.4 ms pause, again (what a
volume WAL does at ~10 MiB/s of small groups). Meanwhile another thread has a real
LocalObjectStore put 64 MiB objects back to back (the uploader's size). Modes, interleaved
round by round so the machine's state is shared:

- none: no store writes, the baseline;
- store: the store as it is (256 KiB write + sync_file_range steps, one fsync to seal);
- 4mib-fdatasync: the previous write-back, 4 MiB write + fdatasync steps;
- store+idle-ioprio: the store as it is, its threads in I/O priority class idle
  (ioprio_set; what the disk's scheduler makes of it: /sys/block/*/queue/scheduler).

Per trial: the WAL syncs' p50/p99/max and how many completed, the store's MiB/s; then the
median p99 per mode across rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from automq.broker.config import parse_size
from automq.broker.objectstore import local
from automq.broker.objectstore.local import LocalObjectStore

MiB = 1 << 20
OBJECT = 64 * MiB
MODES = ("none", "store", "4mib-fdatasync", "store+idle-ioprio")
_IOPRIO_WHO_PROCESS, _IOPRIO_CLASS_IDLE, _SYS_IOPRIO_SET_X86_64 = 1, 3, 251


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))] if s else float("nan")


def set_idle_ioprio() -> None:
    """This thread's I/O priority class to idle (who=0: the calling thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_IOPRIO_SET_X86_64, _IOPRIO_WHO_PROCESS, 0, _IOPRIO_CLASS_IDLE << 13) != 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")


def wal_loop(directory: Path, stop: threading.Event, out: list[float]) -> None:
    path = directory / "wal"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        slots = 2048
        os.pwrite(fd, bytes(slots * 4096), 0)  # preallocated, as the volume WAL is
        os.fsync(fd)
        block = os.urandom(4096)
        i = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            os.pwrite(fd, block, (i % slots) * 4096)
            os.fdatasync(fd)
            out.append(time.perf_counter() - t0)
            i += 1
            time.sleep(0.0004)
    finally:
        os.close(fd)
        path.unlink()


def old_write_back(fd: int, offset: int, length: int) -> None:
    os.fdatasync(fd)


def store_writes(directory: Path, mode: str, total: int) -> float:
    """Puts `total` bytes as 64 MiB objects; returns seconds."""
    saved: tuple[int, Callable[[int, int, int], None]] = (local._WRITEBACK_STEP, local._write_back)
    if mode == "4mib-fdatasync":
        local._WRITEBACK_STEP, local._write_back = 4 * MiB, old_write_back
    data = os.urandom(OBJECT)

    async def puts() -> float:
        if mode == "store+idle-ioprio":
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(4, initializer=set_idle_ioprio))
        store = LocalObjectStore(directory / "objects")
        t0 = time.perf_counter()
        n = 0
        while n * OBJECT < total:
            await store.put(f"o/{n}", data)
            await store.delete_many([f"o/{n}"])
            n += 1
        elapsed = time.perf_counter() - t0
        await store.close()
        return elapsed

    try:
        return asyncio.run(puts())
    finally:
        local._WRITEBACK_STEP, local._write_back = saved


def trial(directory: Path, mode: str, total: int) -> tuple[list[float], float]:
    stop = threading.Event()
    syncs: list[float] = []
    wal = threading.Thread(target=wal_loop, args=(directory, stop, syncs))
    wal.start()
    try:
        if mode == "none":
            time.sleep(2.0)
            seconds = 0.0
        else:
            seconds = store_writes(directory, mode, total)
    finally:
        stop.set()
        wal.join()
    return syncs, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where the WAL file and the store go (default: a temp dir)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bytes", type=parse_size, default=512 * MiB, help="store bytes per trial")
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    args = ap.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at start")
    for disk in sorted(Path("/sys/block").glob("*/queue/scheduler")):
        if not disk.parent.parent.name.startswith(("loop", "ram", "zram")):
            print(f"  {disk.parent.parent.name}: scheduler {disk.read_text().strip()}")
    p99s: dict[str, list[float]] = {m: [] for m in args.modes}
    with tempfile.TemporaryDirectory(prefix="store-wal-", dir=args.dir) as d:
        for r in range(args.rounds):
            for mode in args.modes:
                syncs, seconds = trial(Path(d), mode, args.bytes)
                p99s[mode].append(pct(syncs, 99))
                rate = f"store {args.bytes / MiB / seconds:.0f} MiB/s" if seconds else "no store writes"
                print(
                    f"round {r + 1} {mode:18s} WAL fdatasync p50 {pct(syncs, 50) * 1e3:.2f} ms "
                    f"p99 {pct(syncs, 99) * 1e3:.2f} ms max {max(syncs) * 1e3:.1f} ms, "
                    f"{len(syncs)} syncs; {rate}",
                    flush=True,
                )
    print("median WAL fdatasync p99 across rounds (baseline: none):")
    for mode, values in p99s.items():
        print(f"  {mode:18s} {statistics.median(values) * 1e3:.2f} ms  ({', '.join(f'{v * 1e3:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
