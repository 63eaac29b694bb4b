"""The C allocator's settings for node processes (glibc): fewer arenas, a fixed mmap threshold.

Measured with benchmarks/memory_bench.py (one broker, 10 MiB/s acks=all, a tailing and a
catch-up consumer, 256 MiB log cache + 128 MiB block cache): with glibc's defaults the broker
settled at ~800 MiB RSS, of which ~360 MiB were six per-thread malloc arenas (one per worker
thread that ever allocated: WAL syncs, encodes, object reads) holding freed batch buffers,
and the main heap kept big freed buffers because glibc's *dynamic* mmap threshold rises to
the largest buffer ever freed (up to 32 MiB), so later big allocations come from the heap and
fragment it. Two arenas and a fixed 256 KiB threshold (big buffers are mmapped and go back to
the system when freed) brought the same run to ~550 MiB.

Environment variables win: a process started with MALLOC_ARENA_MAX or MALLOC_MMAP_THRESHOLD_
keeps them (glibc applied them already), and AUTOMQ_MALLOC_TUNING=0 leaves glibc's defaults
(for comparisons). Not glibc (musl, macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys

log = logging.getLogger(__name__)

ARENA_MAX = 2
MMAP_THRESHOLD = 256 << 10
_M_MMAP_THRESHOLD = -3  # mallopt parameters, from glibc's malloc.h
_M_ARENA_MAX = -8


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library, loaded once: find_library runs ldconfig in a subprocess (~1 ms), too slow
    for a metrics scrape on the event loop. None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def tune_allocator() -> dict[str, int]:
    """Apply the settings before any worker thread exists (arenas are made per thread on
    first use); returns what was set."""
    if not sys.platform.startswith("linux") or os.environ.get("AUTOMQ_MALLOC_TUNING", "1") == "0":
        return {}
    lib = libc()
    mallopt = getattr(lib, "mallopt", None)
    if mallopt is None:
        return {}
    if not hasattr(lib, "gnu_get_libc_version"):
        return {}  # another C library: its mallopt (if any) means something else
    done: dict[str, int] = {}
    for env, param, value in (
        ("MALLOC_ARENA_MAX", _M_ARENA_MAX, ARENA_MAX),
        ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ):
        if env in os.environ:
            continue
        if mallopt(param, value) == 1:
            done[env] = value
        else:
            log.warning("mallopt(%d, %d) refused; keeping glibc's default for %s", param, value, env)
    return done


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_stats() -> dict[str, int] | None:
    """glibc's own account of the C heap (mallinfo2, glibc >= 2.33), in bytes: `in_use` (malloc'd
    from the arenas' heaps), `free` (freed but still held by the heaps: resident if touched),
    `mmapped` (big buffers, each its own mapping, returned to the system when freed). None
    where unavailable. RSS minus these is code, stacks and what is not malloc'd."""
    fn = _mallinfo2()
    if fn is None:
        return None
    info = fn()
    return {"in_use": info.uordblks, "free": info.fordblks, "mmapped": info.hblkhd}


@functools.cache
def _mallinfo2():
    fn = getattr(libc(), "mallinfo2", None) if sys.platform.startswith("linux") else None
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


class HeapCollector:
    """`automq_process_heap_bytes{state=in_use|free|mmapped}` on a node's /metrics page: where
    RSS above the caches goes (issue 14 goal 5; benchmarks/memory_bench.py samples it)."""

    def __init__(self, registry) -> None:
        if heap_stats() is not None:
            registry.register(self)

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        stats = heap_stats()
        family = GaugeMetricFamily(
            "automq_process_heap_bytes",
            "C heap bytes by glibc mallinfo2: in_use, free (freed, still held), mmapped",
            labels=["state"],
        )
        for state, value in (stats or {}).items():
            family.add_metric([state], value)
        yield family
