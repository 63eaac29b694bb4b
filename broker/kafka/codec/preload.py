"""Loading the kio schema modules of every served request/response version ahead of use.

kio imports a message's schema module on its first use. Done lazily, the first request of
each API version stalled the event loop while its modules loaded: up to ~125 ms for one
(ConsumerGroupHeartbeat v1; ~850 modules, ~2 s for all served versions, busy machine), which
lands in the latency of whatever the loop was serving then (issue 14). A
broker loads them on a worker thread once it serves (`automq.broker.kafka.process`): start-up
does not wait for them, and the loop keeps its turns while the thread imports."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from automq.broker.kafka.codec.framing import _reader, request_class, response_class
from automq.broker.kafka.codec.lengths import _plan
from automq.broker.kafka.codec.responses import _writer

log = logging.getLogger(__name__)


def preload_order(served: Mapping[int, tuple[int, int]]) -> list[tuple[int, int]]:
    """(api key, version) pairs, every key's newest version first, then the next newest...:
    clients mostly speak the newest version both sides know, so those are loaded first."""
    pairs = [(key, version) for key, (low, high) in served.items() for version in range(low, high + 1)]
    return sorted(pairs, key=lambda pair: (served[pair[0]][1] - pair[1], pair[0]))


def preload_schemas(served: Mapping[int, tuple[int, int]], stop: threading.Event | None = None) -> int:
    """Load the request and response classes, their readers, writers and length-check plans
    of every served version; returns how many versions were loaded. Returns early once
    `stop` is set (the broker is stopping). A version that fails to load is logged and
    skipped: the request that needs it fails the same way it would have without this."""
    loaded = 0
    for key, version in preload_order(served):
        if stop is not None and stop.is_set():
            break
        try:
            request = request_class(key, version)
            _plan(request)
            _reader(request)
            _writer(response_class(key, version))
        except Exception as exc:
            log.warning("could not preload the schema of api key %d version %d: %s", key, version, exc)
            continue
        loaded += 1
    return loaded
