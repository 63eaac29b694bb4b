"""Running a node process (broker or controller): logging, the event loop, the exit code.

Each role provides `serve(config) -> exit code`; this module is the one place that decides
how a node process logs and which event loop it runs on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from automq.broker.config import NodeConfig
from automq.broker.logs import TEXT_FORMAT, configure_logging

LOG_FORMAT = TEXT_FORMAT


def run_node(
    config: NodeConfig, serve: Callable[[NodeConfig], Coroutine[Any, Any, int]], role: str | None = None
) -> None:
    """Block until `serve` returns; a non-zero result becomes the process exit code."""
    configure_logging(config.log_level, process=role, node_id=config.node_id, log_format=config.log_format)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        code = asyncio.run(serve(config))
    else:
        code = uvloop.run(serve(config))
    if code:
        raise SystemExit(code)
