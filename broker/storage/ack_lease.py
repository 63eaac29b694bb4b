"""The acknowledgement lease: a broker acknowledges a write only while the controller vouches
for it.

A broker frozen (SIGSTOP, a long GC-like stall, a node partitioned from the controller)
can resume after the operator fenced it and a replacement recovered its WAL. Its WAL writes
still succeed (the volume may still be attached, or shared), so without a lease it would
acknowledge records nobody will ever read: the replacement's recovery already ran. A
heartbeat or registration answered by the controller grants a lease of `granted_ms`, counted
on this broker's monotonic clock from the moment the request was *sent*; the controller
counts the same lease from the moment it *received* the request (later), and issues no newer
epoch for the node (a re-registration, a WAL recovery claim) until its own count has run out.
An append is acknowledged only if the lease is valid once the append is durable; so every
acknowledged record was in the WAL before any recoverer could read it.

When the lease has run out, appends wait for the next heartbeat: renewed, they are
acknowledged; fenced, they fail (the client retries on the partition's new leader, where the
record is either recovered or absent, never acknowledged twice).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class LeaseRevokedError(Exception):
    """The controller fenced this node: nothing it appends may be acknowledged any more."""


class AckLease:
    def __init__(self, requested_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        if requested_ms <= 0:
            raise ValueError(f"the acknowledgement lease must be positive, got {requested_ms} ms")
        self.requested_ms = requested_ms
        self._clock = clock
        self._until = float("-inf")
        self._revoked: str | None = None
        self._changed = asyncio.Event()

    @property
    def revoked(self) -> str | None:
        return self._revoked

    def remaining(self) -> float:
        """Seconds the lease still runs (<= 0: expired or revoked)."""
        if self._revoked is not None:
            return 0.0
        return self._until - self._clock()

    def valid(self) -> bool:
        return self._revoked is None and self._clock() < self._until

    def grant(self, sent_at: float, granted_ms: int) -> None:
        """The controller answered a request sent at `sent_at` (this clock) with a lease."""
        if self._revoked is not None or granted_ms <= 0:
            return
        until = sent_at + granted_ms / 1000
        if until > self._until:
            self._until = until
            self._wake()

    def revoke(self, reason: str) -> None:
        if self._revoked is None:
            self._revoked = reason
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def hold(self) -> None:
        """Return once the lease is valid; raise LeaseRevokedError once it never will be."""
        while True:
            if self._revoked is not None:
                raise LeaseRevokedError(self._revoked)
            if self._clock() < self._until:
                return
            await self._changed.wait()
