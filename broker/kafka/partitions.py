"""A partition this broker leads: the one place appends and reads of its log go through.

A `Partition` owns the idempotent-producer state (the ProducerStateManager; persisted and
rebuilt across owners by producer_recovery.py) and the partition's transactions (txn_state.py),
and wakes long-polling fetches when an append becomes durable. A stream fenced under us
(StreamClosedError) means another broker leads now: the partition is dropped and callers get
NotLeaderError (→ NOT_LEADER_OR_FOLLOWER, clients refresh metadata). Which partitions are led
here, and their opening and closing, is partition_manager.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from automq.broker.controller.protocol import PartitionInfo, TopicInfo
from automq.broker.kafka import producer_recovery, records
from automq.broker.kafka.leader_epochs import LeaderEpochHistory
from automq.broker.kafka.producer_snapshots import ProducerSnapshotStore
from automq.broker.kafka.producers import ProducerStateError
from automq.broker.kafka.txn_state import AbortedTxn, PartitionTxnState
from automq.broker.storage.api import FetchResult, Stream, StreamClosedError

if TYPE_CHECKING:  # (partition_manager imports this module)
    from automq.broker.kafka.partition_manager import PartitionManager

log = logging.getLogger(__name__)


class PartitionError(Exception):
    pass


class NotLeaderError(PartitionError):
    """This broker does not lead the partition (now): NOT_LEADER_OR_FOLLOWER."""


class UnknownPartitionError(PartitionError):
    """No such topic or partition in the metadata: UNKNOWN_TOPIC_OR_PARTITION."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    duplicate: bool = False  # an idempotent retry answered with its original offset


class Partition:
    """One led partition: its stream, leader epoch, producer state and fetch waiters."""

    def __init__(
        self,
        info: PartitionInfo,
        topic: TopicInfo,
        stream: Stream,
        producer_state: Any,
        manager: PartitionManager | None,
        snapshots: ProducerSnapshotStore | None = None,
    ) -> None:
        self.topic = info.topic
        self.partition = info.partition
        self.topic_id = topic.topic_id
        self.stream = stream
        self.leader_epoch = info.leader_epoch
        # which epoch wrote which offsets: the controller's ranges, then ours from the log end
        self.epochs = LeaderEpochHistory(stream.epochs)
        self.epochs.assign(info.leader_epoch, stream.end_offset)
        self.producer_state = producer_state
        self.configs = dict(topic.configs)
        self._manager = manager
        self._waiters: set[asyncio.Future[None]] = set()
        self.closed = False
        # (offset, timestamp) of the largest batch maxTimestamp seen (appends since open and
        # the tail scanned on open): ListOffsets MAX_TIMESTAMP without scanning the log
        self.max_timestamp: tuple[int, int] | None = None
        # open transactions and aborted ranges (read_committed): txn_state.py
        self.txns = PartitionTxnState()
        if producer_state is not None:
            producer_state.keep = self.txns  # a producer mid-transaction here never expires
        # producer-state snapshots (producer_recovery.py); appends note the offsets they
        # reserved but have not recorded yet, which a snapshot must not cover
        self.snapshots = producer_recovery.PartitionSnapshots(self, snapshots)
        self._unrecorded = self.snapshots.unrecorded

    # ---------------------------------------------------------------- offsets

    @property
    def high_watermark(self) -> int:
        return self.stream.confirm_offset

    @property
    def log_start_offset(self) -> int:
        return self.stream.start_offset

    @property
    def log_end_offset(self) -> int:
        return self.stream.end_offset

    @property
    def last_stable_offset(self) -> int:
        """read_committed consumers read below this: the oldest open transaction's first offset."""
        txns = self.txns
        hw = self.stream.confirm_offset
        return txns.last_stable_offset(hw) if txns.ongoing else hw

    def aborted_transactions(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        txns = self.txns
        if not txns:
            return []
        txns.prune(self.stream.start_offset)
        return txns.aborted_between(fetch_offset, upper_offset)

    @property
    def uses_log_append_time(self) -> bool:
        return self.configs.get("message.timestamp.type", "CreateTime") == "LogAppendTime"

    @property
    def is_compacted(self) -> bool:
        return "compact" in self.configs.get("cleanup.policy", "delete").split(",")

    def epoch_end_offset(self, requested_epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest epoch <= requested, the offset where it ended)."""
        return self.epochs.end_offset_for(requested_epoch, self.log_end_offset, self.log_start_offset)

    def epoch_at(self, offset: int) -> int:
        """The leader epoch that wrote `offset` (ListOffsets answers it with the offset)."""
        return self.epochs.epoch_at(offset)

    def max_message_bytes(self, default: int) -> int:
        value = self.configs.get("max.message.bytes")
        try:
            return int(value) if value is not None else default
        except ValueError:
            return default

    # ---------------------------------------------------------------- appends

    async def append_batch(
        self,
        batch: bytearray | memoryview,
        header: records.BatchHeader,
        *,
        sequenced: bool = True,
        verification_guard: object | None = None,
    ) -> AppendResult:
        """Append one validated v2 batch (a private, mutable copy): offsets assigned here.

        Between the producer-state check and the stream's synchronous offset reservation
        there is no await, so two retries of one idempotent batch cannot both append.
        `sequenced=False`: a coordinator's own transactional batch (TxnOffsetCommit), which
        carries the producer id without a sequence, as in Kafka. `verification_guard`: the
        batch was verified with the transaction coordinator (KIP-890); refused if a marker of
        its producer was written here since the verification began.
        """
        if self.closed:
            raise NotLeaderError(f"{self.topic}-{self.partition} is no longer led here")
        if verification_guard is not None and not self.txns.verified(header.producer_id, verification_guard):
            raise ProducerStateError(
                ErrorCode.invalid_txn_state,
                f"producer {header.producer_id}: its transaction ended in {self.topic}-{self.partition} "
                "while the batch was being verified",
            )
        state = self.producer_state
        idempotent = header.producer_id >= 0 and state is not None and sequenced
        if idempotent:
            original = state.check(header.producer_id, header.producer_epoch, header.base_sequence, header.record_count)
            if original is not None:
                return AppendResult(original, -1, duplicate=True)
        append_time = -1
        if self.uses_log_append_time:
            append_time = int(time.time() * 1000)
        base_offset = self.stream.end_offset
        records.assign_offsets(batch, base_offset, self.leader_epoch, append_time)
        unrecorded = self._unrecorded
        unrecorded.add(base_offset)
        # a transaction's first batch here holds the last stable offset back from now on
        opened = header.is_transactional and self.txns.on_data(header.producer_id, base_offset)
        try:
            # stream.append reserves [end_offset, end_offset+count) before its first await
            # a bytearray batch is stored as it is (bytes-like, not copied); the storage API is
            # typed for the immutable forms it usually gets
            await self.stream.append(batch, header.record_count)  # type: ignore[arg-type]
        except BaseException as exc:
            unrecorded.discard(base_offset)
            if opened:
                self.txns.undo_open(header.producer_id, base_offset)
            if idempotent:
                state.discard(header.producer_id, header.producer_epoch, header.base_sequence, header.record_count)
            if isinstance(exc, StreamClosedError):
                self._fenced()
                raise NotLeaderError(f"{self.topic}-{self.partition}: stream closed or fenced") from None
            raise
        timestamp = append_time if append_time >= 0 else header.max_timestamp
        if self.max_timestamp is None or timestamp > self.max_timestamp[1]:
            self.max_timestamp = (base_offset + header.last_offset_delta, timestamp)
        if idempotent:
            state.record(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.record_count,
                base_offset,
                timestamp,
            )
        unrecorded.discard(base_offset)
        self.snapshots.after_append(base_offset)
        self._wake()
        return AppendResult(base_offset, append_time)

    async def append_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int) -> int:
        """Write a transaction marker (WriteTxnMarkers); returns its offset once durable. The
        transaction is closed here as soon as the marker has its offset (no await between),
        so no later batch of the producer can join the finished transaction."""
        if self.closed:
            raise NotLeaderError(f"{self.topic}-{self.partition} is no longer led here")
        state = self.producer_state
        if state is not None:
            state.check_marker(producer_id, producer_epoch)
        now = int(time.time() * 1000)
        batch = records.control_batch(producer_id, producer_epoch, commit, coordinator_epoch, now)
        offset = self.stream.end_offset
        records.assign_offsets(batch, offset, self.leader_epoch, now if self.uses_log_append_time else -1)
        self._unrecorded.add(offset)
        first = self.txns.ongoing.get(producer_id)
        self.txns.on_marker(producer_id, commit, offset)
        try:
            await self.stream.append(batch, 1)  # type: ignore[arg-type]
        except BaseException as exc:
            self._unrecorded.discard(offset)
            # not written: the transaction is still open here (the coordinator retries)
            self.txns.undo_marker(producer_id, first, offset)
            if isinstance(exc, StreamClosedError):
                self._fenced()
                raise NotLeaderError(f"{self.topic}-{self.partition}: stream closed or fenced") from None
            raise
        if state is not None:
            state.record_marker(producer_id, producer_epoch, now)
        self._unrecorded.discard(offset)
        self._wake()
        return offset

    # append_batches is the name in the seams doc: several batches, in order.
    async def append_batches(self, batches: Iterable[tuple[bytearray, records.BatchHeader]]) -> list[AppendResult]:
        return [await self.append_batch(b, h) for b, h in batches]

    # ---------------------------------------------------------------- reads

    async def read(self, offset: int, max_bytes: int, end_offset: int | None = None) -> FetchResult:
        """Whole batches from `offset` up to the high watermark (at least one if any)."""
        if self.closed:
            raise NotLeaderError(f"{self.topic}-{self.partition} is no longer led here")
        try:
            return await self.stream.fetch(
                offset, end_offset if end_offset is not None else self.stream.confirm_offset, max_bytes
            )
        except StreamClosedError:
            self._fenced()
            raise NotLeaderError(f"{self.topic}-{self.partition}: stream closed or fenced") from None

    def add_waiter(self, waiter: asyncio.Future[None]) -> None:
        """`waiter` gets a result when the next append becomes durable (long-poll fetch)."""
        self._waiters.add(waiter)

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    def _wake(self) -> None:
        if not self._waiters:
            return
        waiters, self._waiters = self._waiters, set()
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _fenced(self) -> None:
        # A fenced owner persists no producer snapshot any more (not even the final one): an
        # append it refused after the WAL took it (acknowledgement lease revoked) was dropped
        # from its producer state, so a snapshot covering it would let the next owner take the
        # client's retry of it as new. The next owner replays from the last snapshot instead.
        self.snapshots.store = None
        if self._manager is not None and not self.closed:
            log.warning(
                "stream of %s-%d was fenced (epoch %d): dropping leadership",
                self.topic,
                self.partition,
                self.leader_epoch,
            )
            self._manager._drop_fenced(self)

    async def close(self) -> None:
        self.closed = True
        self._wake()  # long-polling fetches answer now (and get NOT_LEADER next time)
        await self.snapshots.write_final()  # before the stream is released to the next owner
        try:
            await self.stream.close()
        except StreamClosedError:
            pass

    # ---------------------------------------------------------------- producer state across owners

    @property
    def snapshot_offset(self) -> int:
        """The offset of the newest producer snapshot written or loaded (-1: none)."""
        return self.snapshots.offset

    async def write_snapshot(self) -> int | None:
        return await self.snapshots.write()

    async def rebuild_producer_state(self) -> None:
        await producer_recovery.rebuild_producer_state(self)

    # ---------------------------------------------------------------- timestamps

    async def offset_of_max_timestamp(self) -> tuple[int, int] | None:
        """ListOffsets MAX_TIMESTAMP: (offset, timestamp) of the record with the largest
        timestamp. Appends track it per batch (no per-record work on the hot path); the one
        batch is read and walked here, at query time."""
        latest = self.max_timestamp
        if latest is None:
            return None
        result = await self.read(latest[0], 1, self.high_watermark)
        for batch in result.batches:
            if batch.base_offset <= latest[0] < batch.next_offset:
                offset, timestamp = records.offset_of_max_timestamp(batch.payload)
                if timestamp == latest[1]:
                    return offset, timestamp
        return latest

    async def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= timestamp_ms.

        Binary search over offsets with one-batch reads, assuming batch max timestamps grow
        with offsets (what Kafka's time index assumes too), then the records of the batch it
        ends in. O(log n) reads instead of reading the whole log."""
        low, high = self.log_start_offset, self.high_watermark
        answer: tuple[int, int] | None = None
        while low < high:
            mid = (low + high) // 2
            result = await self.read(mid, 1, high)
            if not result.batches:
                break
            batch = result.batches[0]
            header = records.parse_header(batch.payload)
            if header.max_timestamp >= timestamp_ms:
                answer = records.first_record_at_or_after(batch.payload, timestamp_ms)
                if batch.base_offset <= low:
                    break
                high = batch.base_offset
            else:
                low = max(batch.next_offset, mid + 1)
        return answer
