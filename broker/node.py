"""Running a node process (broker or controller): logging, the event loop, the exit code.

Each role provides `serve(config) -> exit code`; this module is the one place that decides
how a node process logs and which event loop it runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from automq.broker.config import NodeConfig
from automq.broker.logs import TEXT_FORMAT, configure_logging
from automq.broker.malloc import tune_allocator
from automq.broker.objectstore.check import ObjectStoreCheckError, check_object_store

LOG_FORMAT = TEXT_FORMAT
EXIT_BAD_CONFIG = 2

log = logging.getLogger(__name__)

Serve = Callable[[NodeConfig], Coroutine[Any, Any, int]]


async def _refused_by_store(url: str) -> str | None:
    """The start-up check's one line when the store answers that the setting is wrong (no
    bucket, credentials denied, no conditional writes); None when it works or does not answer
    yet (it may be starting: the node retries it as always)."""
    try:
        await check_object_store(url)
    except ObjectStoreCheckError as exc:
        return None if exc.transient else str(exc)
    return None


async def _serve_checked(config: NodeConfig, serve: Serve) -> int:
    """`serve`, with the object store checked alongside (not before: a restarting node must
    not lose time before it registers again). A store that refuses the setting ends the
    process with exit 2 and one line, as `automq local up` does, instead of retrying forever."""
    main = asyncio.ensure_future(serve(config))
    check = asyncio.ensure_future(_refused_by_store(config.object_store_url))
    done, _ = await asyncio.wait({main, check}, return_when=asyncio.FIRST_COMPLETED)
    if main in done:
        check.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await check
        return main.result()
    refused = check.result()
    if refused is None:
        return await main
    log.error("%s", refused)
    main.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await main
    return EXIT_BAD_CONFIG


def freeze_startup_heap() -> int:
    """Move every object alive once start-up is done (modules, codec classes, config) into
    the collector's permanent generation; returns how many.

    A full collection walks every tracked object: in a started broker that is mostly what
    start-up built and will never free, and it took 25-80 ms (busy machine: up to ~280 ms)
    on the event loop, once or twice per upload cycle, which lands straight in the produce
    p99 (issue 14, benchmarks/append_tail_bench.py). Frozen objects are still freed by
    reference counting; only cycles among them are never collected, which is why this runs
    once after start-up and never on the live working set (connections, caches).

    Only the young generations are collected first (under 1 ms): this runs on the event loop
    once the broker serves, where a full collection took 50-130 ms at start-up and ~90 ms after
    the schema preload (busy machine) and freed nothing but ~60 start-up objects in cycles,
    which are frozen instead (a few KiB, once)."""
    gc.collect(1)
    gc.freeze()
    return gc.get_freeze_count()


def run_node(config: NodeConfig, serve: Serve, role: str | None = None) -> None:
    """Block until `serve` returns; a non-zero result becomes the process exit code."""
    configure_logging(config.log_level, process=role, node_id=config.node_id, log_format=config.log_format)
    tune_allocator()  # before the loop starts any worker thread
    # A produce crosses threads while its WAL group is written: loop -> WAL thread (frame,
    # pwritev, fdatasync, each return taking the GIL back) -> loop. While the loop thread is
    # busy (serving a catch-up read), each of those waits for the GIL up to the switch
    # interval, 5 ms by default. At 0.5 ms the produce p99 during a 1 GiB catch-up fell from
    # 31-41 to 23-26 ms in three alternating pairs (quiet machine, docs/benchmarks.md), with
    # the catch-up's throughput unchanged; the price is ~5-10 % of peak produce throughput
    # (more hand-offs of the GIL), which gil_switch_interval_us: 5000 takes back.
    sys.setswitchinterval(config.gil_switch_interval_us / 1_000_000)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        code = asyncio.run(_serve_checked(config, serve))
    else:
        code = uvloop.run(_serve_checked(config, serve))
    if code:
        raise SystemExit(code)
