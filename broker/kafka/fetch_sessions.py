"""Incremental fetch sessions (KIP-227): the broker remembers what a consumer fetches.

A client opens a session with a full fetch (session_id 0, epoch 0) and from then on sends
only partitions whose fetch position changed (plus `forgotten` ones to drop); the broker
answers only partitions with news (records, an error, a moved high watermark or log start).
Epoch -1 is a sessionless full fetch (and closes the named session). librdkafka does not use
sessions; the Java client and kafka-python do.

The cache is bounded (`kafka.fetch_session_cache_slots`); when full, the least recently used
session idle for longer than EVICT_AFTER_S is evicted, otherwise a new session is declined
(session id 0 in the response), which clients handle by continuing with full fetches.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from automq.broker.kafka.metrics import KafkaMetrics

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
EVICT_AFTER_S = 120.0


@dataclass(slots=True)
class SessionPartition:
    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1  # v12+: epoch of the last record the client got (diverging epoch)
    # what the client was last told, so only changes are sent
    last_high_watermark: int = -1
    last_log_start_offset: int = -1
    last_stable_offset: int = -1


@dataclass(slots=True)
class FetchSession:
    session_id: int
    epoch: int  # the epoch the next request must carry
    partitions: OrderedDict[tuple[str, int], SessionPartition] = field(default_factory=OrderedDict)
    last_used: float = field(default_factory=time.monotonic)

    def next_epoch(self) -> None:
        # epochs wrap to 1, never to 0 (initial) or negative (final)
        self.epoch = 1 if self.epoch >= 0x7FFFFFFF else self.epoch + 1
        self.last_used = time.monotonic()


class FetchSessionCache:
    def __init__(self, slots: int, metrics: KafkaMetrics | None = None) -> None:
        self._slots = slots
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._metrics = metrics
        self._ids = itertools.count(random.randint(1, 1 << 20))

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        session = self._sessions.get(session_id)
        if session is not None:
            self._sessions.move_to_end(session_id)
        return session

    def create(self) -> FetchSession | None:
        """A new session (epoch 1 expected next), or None when the cache is full of live ones."""
        if self._slots <= 0:
            return None
        if len(self._sessions) >= self._slots:
            oldest_id, oldest = next(iter(self._sessions.items()))
            if time.monotonic() - oldest.last_used < EVICT_AFTER_S:
                return None
            del self._sessions[oldest_id]
        session_id = next(self._ids) & 0x7FFFFFFF or next(self._ids)
        while session_id in self._sessions or session_id == 0:
            session_id = next(self._ids) & 0x7FFFFFFF
        session = FetchSession(session_id, epoch=1)
        self._sessions[session_id] = session
        self._update_gauge()
        return session

    def remove(self, session_id: int) -> None:
        if self._sessions.pop(session_id, None) is not None:
            self._update_gauge()

    def _update_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.fetch_sessions.set(len(self._sessions))
