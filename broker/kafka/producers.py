"""Idempotent-producer state of one partition, and cluster-wide producer id allocation.

`ProducerStateManager` answers, for every batch a producer appends, "is this new and in
order, a retry of something already written, or wrong?" with the rules a Kafka 3.x/4.x
broker applies to idempotent (non-transactional) producers:

* The last 5 batches of each producer are remembered with the offsets they were given; a
  batch with the same epoch and exactly the same sequence range as one of them is a
  duplicate and is answered with the original base offset (nothing is appended).
* A batch with a lower epoch than the producer's current one gets INVALID_PRODUCER_EPOCH
  (the Produce error since Kafka 2.7; PRODUCER_FENCED is what the transaction coordinator
  says, never the partition leader).
* A higher epoch starts over: its first sequence must be 0 (OUT_OF_ORDER_SEQUENCE_NUMBER
  otherwise) and the remembered batches of the old epoch are forgotten.
* Within an epoch the first sequence must follow the last one (last + 1, wrapping from
  2^31-1 to 0); anything else is OUT_OF_ORDER_SEQUENCE_NUMBER.
* A producer the partition knows nothing about (new, expired, or its batches trimmed away)
  is accepted at any sequence. Since KIP-360 (Kafka 2.5) brokers do not answer Produce with
  UNKNOWN_PRODUCER_ID any more; the client's sequence simply becomes the new baseline.
* Producers idle for `producer_id_expiration_ms` are forgotten (`expire`; also run by
  `record` itself every EXPIRE_CHECK_EVERY records, so memory stays bounded without a timer).

Pipelining. A client keeps up to 5 batches in flight, and a batch becomes durable only after
the WAL sync, so `record` (called after the append is durable) runs long after the next
batch's `check`. `check` therefore registers an accepted batch as *pending* at once: the next
batch is checked against it, and a retry of it is recognised. A retry that arrives while the
original is still being written cannot be answered yet (its offset is not durable), so it
gets REQUEST_TIMED_OUT, which every client retries; by then the original is recorded and the
retry is answered as a duplicate. If an append fails after `check`, the caller calls
`discard` so the sequence can be retried.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
MAX_SEQUENCE = 2**31 - 1
BATCHES_TO_RETAIN = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN; clients keep <= 5 in flight
EXPIRE_CHECK_EVERY = 10_000  # records between lazy expiry passes


def sequence_after(sequence: int, increment: int) -> int:
    """`sequence + increment` on Kafka's wrapping int32 sequence space (2^31-1 is followed by 0)."""
    return (sequence + increment) % (MAX_SEQUENCE + 1)


def last_sequence(base_sequence: int, record_count: int) -> int:
    return sequence_after(base_sequence, record_count - 1)


class ProducerStateError(Exception):
    """A batch the partition must refuse; `error_code` is the Produce response error."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(slots=True)
class StoredBatch:
    first_seq: int
    last_seq: int
    base_offset: int | None  # None while pending (accepted, not yet durable)
    timestamp_ms: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    # Oldest first. At most BATCHES_TO_RETAIN durable ones; pending ones are never dropped
    # (their `record` must find them), so a client with more in flight briefly has more.
    batches: list[StoredBatch] = field(default_factory=list)
    last_timestamp_ms: int = -1
    # The sequence the next batch must follow when no batch is remembered (all discarded).
    baseline_last_seq: int = NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else self.baseline_last_seq

    def add(self, batch: StoredBatch) -> None:
        self.batches.append(batch)
        self.trim()

    def trim(self) -> None:
        while len(self.batches) > BATCHES_TO_RETAIN and self.batches[0].base_offset is not None:
            del self.batches[0]

    @property
    def has_pending(self) -> bool:
        return any(b.base_offset is None for b in self.batches)

    def find(self, first_seq: int, last_seq: int) -> StoredBatch | None:
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


class ProducerStateManager:
    """Per-partition idempotent producer state (see module docstring). Not thread-safe: one
    partition is served by one event loop."""

    def __init__(self, producer_id_expiration_ms: int = 24 * 3_600_000, clock=None) -> None:
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerEntry] = {}
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._records_until_expiry = EXPIRE_CHECK_EVERY
        # producer ids never expired (the partition's open transactions: Kafka's rule)
        self.keep: Container[int] = ()

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def entries(self) -> list[ProducerEntry]:
        return list(self._producers.values())

    def check(self, producer_id: int, producer_epoch: int, base_sequence: int, record_count: int) -> int | None:
        """None: new and in order (now pending until `record`/`discard`). An int: the
        batch duplicates one already written at that base offset. Raises ProducerStateError."""
        if producer_id == NO_PRODUCER_ID:
            return None
        if record_count <= 0:
            raise ProducerStateError(ErrorCode.invalid_record, f"producer {producer_id}: batch without records")
        if base_sequence < 0 or producer_epoch < 0:
            raise ProducerStateError(
                ErrorCode.invalid_record,
                f"producer {producer_id}: idempotent batch with sequence {base_sequence} / epoch {producer_epoch}",
            )
        last_seq = last_sequence(base_sequence, record_count)
        entry = self._producers.get(producer_id)
        if entry is None:
            # Unknown producer: any sequence becomes the baseline (KIP-360).
            entry = self._producers[producer_id] = ProducerEntry(producer_id, producer_epoch)
            entry.add(StoredBatch(base_sequence, last_seq, None, -1))
            return None
        if producer_epoch == entry.epoch:
            dup = entry.find(base_sequence, last_seq)
            if dup is not None:
                if dup.base_offset is None:
                    raise ProducerStateError(
                        ErrorCode.request_timed_out,
                        f"producer {producer_id}: retry of sequence {base_sequence} while the original is being written",
                    )
                return dup.base_offset
        if producer_epoch < entry.epoch:
            raise ProducerStateError(
                ErrorCode.invalid_producer_epoch,
                f"producer {producer_id}: epoch {producer_epoch} is older than the current epoch {entry.epoch}",
            )
        if producer_epoch > entry.epoch:
            if base_sequence != 0:
                raise ProducerStateError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {producer_id}: new epoch {producer_epoch} must start at sequence 0, got {base_sequence}",
                )
            entry.epoch = producer_epoch
            entry.batches.clear()
            entry.baseline_last_seq = NO_SEQUENCE
        elif entry.last_seq != NO_SEQUENCE and base_sequence != sequence_after(entry.last_seq, 1):
            raise ProducerStateError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {producer_id} epoch {producer_epoch}: sequence {base_sequence} does not follow {entry.last_seq}",
            )
        entry.add(StoredBatch(base_sequence, last_seq, None, -1))
        return None

    def record(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        record_count: int,
        base_offset: int,
        timestamp_ms: int,
    ) -> None:
        """The batch accepted by `check` is durable at base_offset."""
        if producer_id == NO_PRODUCER_ID:
            return
        entry = self._producers.get(producer_id)
        last_seq = last_sequence(base_sequence, record_count)
        if entry is None:
            entry = self._producers[producer_id] = ProducerEntry(producer_id, producer_epoch)
        elif producer_epoch < entry.epoch:
            return  # written under an epoch since superseded; the new epoch's state stands
        elif producer_epoch > entry.epoch:
            entry.epoch = producer_epoch
            entry.batches.clear()
            entry.baseline_last_seq = NO_SEQUENCE
        batch = entry.find(base_sequence, last_seq)
        if batch is None:
            # Not checked before (log replay, or a caller without check): remember it as written.
            entry.add(StoredBatch(base_sequence, last_seq, base_offset, timestamp_ms))
        else:
            batch.base_offset = base_offset
            batch.timestamp_ms = timestamp_ms
            entry.trim()  # durable now, so it may leave the window
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)
        self._records_until_expiry -= 1
        if self._records_until_expiry <= 0:
            self._records_until_expiry = EXPIRE_CHECK_EVERY
            self.expire(self._clock())

    def check_marker(self, producer_id: int, producer_epoch: int) -> None:
        """A transaction marker from the coordinator: refused if the producer already wrote
        under a newer epoch here (the coordinator is behind), else its epoch becomes current."""
        entry = self._producers.get(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            raise ProducerStateError(
                ErrorCode.invalid_producer_epoch,
                f"marker of producer {producer_id} has epoch {producer_epoch}, older than {entry.epoch}",
            )

    def record_marker(self, producer_id: int, producer_epoch: int, timestamp_ms: int) -> None:
        """A durable marker. A higher epoch (the coordinator fenced the producer) fences
        batches of older epochs; the producer's next epoch starts at sequence 0."""
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = ProducerEntry(producer_id, producer_epoch)
        elif producer_epoch > entry.epoch:
            entry.epoch = producer_epoch
            entry.batches = [b for b in entry.batches if b.base_offset is None]
            entry.baseline_last_seq = NO_SEQUENCE
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)

    def discard(self, producer_id: int, producer_epoch: int, base_sequence: int, record_count: int) -> None:
        """The append of a batch accepted by `check` failed: forget it so a retry is checked afresh."""
        entry = self._producers.get(producer_id)
        if entry is None or entry.epoch != producer_epoch:
            return
        batch = entry.find(base_sequence, last_sequence(base_sequence, record_count))
        if batch is not None and batch.base_offset is None:
            index = entry.batches.index(batch)
            if index == 0:
                # Keep the expectation: the retry of this batch (not a later one) must come next.
                entry.baseline_last_seq = sequence_after(batch.first_seq, MAX_SEQUENCE)
            del entry.batches[index]

    def rebuild(self, entries: Iterable[tuple[int, int, int, int, int, int]]) -> None:
        """Reload from the producer fields of recent batches in log order:
        (producer_id, epoch, base_sequence, record_count, base_offset, timestamp_ms).
        Like Kafka's log recovery, nothing is validated; the log is the truth."""
        self._producers.clear()
        for producer_id, epoch, base_sequence, record_count, base_offset, timestamp_ms in entries:
            if producer_id == NO_PRODUCER_ID or record_count <= 0:
                continue
            self.record(producer_id, epoch, base_sequence, record_count, base_offset, timestamp_ms)

    def snapshot(self, below_offset: int) -> list[ProducerEntry]:
        """Copies of the producers as of every durable batch below `below_offset` (pending
        batches and later ones are left out: the replay after the snapshot finds them).
        The caller makes sure every batch below the offset was recorded."""
        out = []
        for e in self._producers.values():
            batches = [
                StoredBatch(b.first_seq, b.last_seq, b.base_offset, b.timestamp_ms)
                for b in e.batches
                if b.base_offset is not None and b.base_offset < below_offset
            ]
            out.append(ProducerEntry(e.producer_id, e.epoch, batches, e.last_timestamp_ms, e.baseline_last_seq))
        return out

    def load(self, entries: Iterable[ProducerEntry]) -> None:
        """Start from a snapshot's producers (replaces the current state); the batches after
        the snapshot are then fed in with `record`."""
        self._producers = {e.producer_id: e for e in entries}

    def expire(self, now_ms: int) -> list[int]:
        """Forget producers idle for producer_id_expiration_ms, except those in `keep` (the
        partition's open transactions: Kafka never expires a producer mid-transaction);
        returns their ids."""
        keep = self.keep
        expired = [
            pid
            for pid, e in self._producers.items()
            if not e.has_pending and now_ms - e.last_timestamp_ms >= self.producer_id_expiration_ms and pid not in keep
        ]
        for pid in expired:
            del self._producers[pid]
        return expired


# Producer id layout: [node epoch: 23 bits][node id: 16 bits][counter: 24 bits] = 63 bits, so
# ids are positive int64s, unique without asking anyone: a node's epoch grows by one on every
# registration (8M restarts), a node id is held by one live broker at a time, and one broker
# process hands out 16M ids (Kafka's brokers fetch blocks of 1000 from the controller instead;
# the controller contract has no such call, and none is needed at this size).
_COUNTER_BITS = 24
_NODE_ID_BITS = 16
_EPOCH_BITS = 23


class ProducerIdExhaustedError(Exception):
    """This broker handed out every producer id of its current node epoch."""


class ProducerIdAllocator:
    def __init__(self, node_id: int, node_epoch: int) -> None:
        if not 0 <= node_id < 1 << _NODE_ID_BITS:
            raise ValueError(f"node_id {node_id} does not fit the producer id layout (0..{(1 << _NODE_ID_BITS) - 1})")
        if not 0 <= node_epoch < 1 << _EPOCH_BITS:
            raise ValueError(
                f"node_epoch {node_epoch} does not fit the producer id layout (0..{(1 << _EPOCH_BITS) - 1})"
            )
        self._prefix = (node_epoch << (_NODE_ID_BITS + _COUNTER_BITS)) | (node_id << _COUNTER_BITS)
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def next_id(self) -> int:
        with self._lock:
            n = next(self._counter)
        if n >= 1 << _COUNTER_BITS:
            raise ProducerIdExhaustedError(
                "producer ids of this node epoch are exhausted; restart the broker for a new epoch"
            )
        return self._prefix | n
