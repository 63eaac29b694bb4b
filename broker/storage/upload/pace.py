"""How fast the uploader writes objects: fast enough to keep up, slow enough not to be felt.

An upload is background work. Written as fast as the disk goes, a 64 MiB block took the
file store ~0.4 s, and every Produce answered meanwhile waited for it: the WAL's syncs queue
behind the object's write-back, and the writing threads take cores and the GIL from the event
loop (issue 14, one broker at 10 MiB/s: requests during an upload took 9-12 ms at the median
against ~1.1 ms otherwise, and the uploads' half seconds held most of the produce p99). The
same bytes spread over a few times longer cost the same CPU but take little at any moment.

So a block is written at `speedup` times the rate it was filled at (a block filled in 6.4 s,
at 10 MiB/s, is written in 1.6 s), never below `floor`. The rate is an upper bound with a
small burst; no pace at all (`urgent`) when the uploader must hurry: the WAL or the log cache
is under pressure, a flush waits (a partition moving, a shutdown), or sealed blocks pile up.
The writing thread sleeps between write-back steps (object store `WritePace`); the event loop
never waits for it.
"""

from __future__ import annotations

import threading
import time

MiB = 1 << 20
SPEEDUP = 4.0  # a block is written at this many times the rate it was filled at ...
FLOOR = 32 * MiB  # ... and never slower than this (bytes/s)
BURST = 1 * MiB  # written at once after a pause
MAX_SLEEP = 0.05  # a sleep is cut into pieces this long, so an urgent turn applies at once


class UploadPace:
    """The uploader's `WritePace`: one rate shared by every object being written."""

    def __init__(
        self, speedup: float = SPEEDUP, floor: float = FLOOR, *, clock=time.perf_counter, sleep=time.sleep
    ) -> None:
        self.speedup = speedup
        self.floor = floor
        self._clock = clock
        self._sleep = sleep
        self.rate = floor  # bytes/s
        self.urgent = False  # no pacing while set (read by the writing threads)
        self._lock = threading.Lock()
        self._due = 0.0  # when the bytes taken so far are due, at `rate`

    def block_sealed(self, size: int, fill_seconds: float) -> None:
        """The rate for the block about to be written: `speedup` times the rate it filled at."""
        fill_rate = size / max(fill_seconds, 1e-3)
        self.rate = max(self.floor, self.speedup * fill_rate)

    def take(self, nbytes: int) -> None:
        """From a writing thread, after it wrote `nbytes`: sleep until they are due."""
        if self.urgent:
            return
        with self._lock:
            now = self._clock()
            rate = self.rate
            due = max(self._due, now - BURST / rate) + nbytes / rate
            self._due = due
        while not self.urgent:
            left = due - self._clock()
            if left <= 0:
                return
            self._sleep(min(left, MAX_SLEEP))
