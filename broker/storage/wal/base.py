"""The write-ahead log interface: what the engine needs from a WAL, whatever it is made of.

A WAL is an ordered log of records (one appended batch each). `append` is synchronous in
the part that matters for ordering: it enqueues the record and returns a future, so records
are durable in exactly the order `append` was called. The future resolves to the record's
end position once the record is durable (fdatasync'd, or PUT completed). Positions are
logical and only grow; `trim(position)` tells the WAL everything below it has been uploaded
and committed, so the space (or the bulk objects) can be reused.

Two implementations: `VolumeWal` (a preallocated file or block device used as a ring) and
`ObjectStoreWal` (bulk objects in the object store, the "S3 WAL").
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


class WalError(Exception):
    pass


class WalCorruptionError(WalError):
    """The WAL holds damaged data that was acknowledged (a bad record followed by good ones,
    or no valid header). Never served; the node must not start on it silently."""


class WalFencedError(WalError):
    """A newer incarnation of this node (higher node epoch) owns the WAL."""


class WalClosedError(WalError):
    pass


class WalRecordTooLargeError(WalError):
    """A record that can never fit in the WAL (larger than the ring, or the bulk limit)."""


@dataclass(slots=True)
class WalRecord:
    """One appended batch as the WAL stores it."""

    stream_id: int
    stream_epoch: int
    base_offset: int
    record_count: int
    payload: bytes | memoryview
    wal_end: int = -1  # logical position just past this record, set when it is durable/replayed


@dataclass(slots=True)
class RecoveryReport:
    """What replay found. `stop_reason`: "end" (clean end of log), "torn" (a damaged record at
    the tail: an append that was never acknowledged), or "empty"."""

    records: int = 0
    bytes: int = 0
    start_position: int = 0
    end_position: int = 0
    stop_reason: str = "empty"
    damaged_position: int | None = None
    details: list[str] = field(default_factory=list)


# Called when the WAL cannot accept more data until something is uploaded and trimmed.
PressureHandler = Callable[[], Awaitable[None] | None]


class WriteAheadLog(abc.ABC):
    report: RecoveryReport
    _pressure_handler: PressureHandler | None = None

    @abc.abstractmethod
    async def recover(self) -> list[WalRecord]:
        """Read every record since the trim point, in order, without changing the WAL.
        Damaged tails are skipped and reported in `self.report`; damage followed by valid
        data raises WalCorruptionError."""

    @abc.abstractmethod
    async def start(self, trim_position: int) -> None:
        """Become the writer (after recovered records were uploaded): mark everything below
        `trim_position` as trimmed and fence older incarnations."""

    @abc.abstractmethod
    def append(self, record: WalRecord) -> asyncio.Future[int]:
        """Enqueue a record; the future resolves to its end position once durable."""

    @abc.abstractmethod
    async def trim(self, position: int) -> None:
        """Everything below `position` is uploaded and committed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop accepting appends, wait for queued ones to become durable."""

    # Called synchronously, in WAL order, with each group of records once durable and before
    # their futures resolve: the engine fills the log cache and advances confirm offsets here.
    on_durable: Callable[[list[WalRecord]], None] | None = None
    # Called once, on the loop, when a write error stopped the WAL for good (every append
    # since fails): the node cannot take writes any more and should exit so its supervisor
    # restarts it (the restart replays what was acknowledged). Not called on close or fencing.
    on_failed: Callable[[BaseException], None] | None = None

    def set_pressure_handler(self, handler: PressureHandler) -> None:
        self._pressure_handler = handler

    def stop_waiting(self) -> None:  # noqa: B027 - only a WAL with back-pressure waits has anything to stop
        """The node is stopping or fenced: appends that wait for space (an upload and a trim
        that will not come) fail now with WalClosedError; they were never acknowledged."""

    @property
    @abc.abstractmethod
    def durable_position(self) -> int:
        """End position of the last durable record."""

    @property
    def bytes_pending_trim(self) -> int:
        """Bytes held in the WAL that are not trimmed yet."""
        return 0
