"""What the transaction coordinator writes to `__transaction_state`, and reading it back.

Kafka's own layouts (TransactionLogKey v0 / TransactionLogValue v0, non-flexible):

  key:   int16 version=0, string transactional_id
  value: int16 version=0, int64 producer_id, int16 producer_epoch, int32 timeout_ms,
         int8 state, array of [string topic, array of int32 partition],
         int64 last_update_timestamp_ms, int64 start_timestamp_ms

State codes are Kafka's: 0 Empty, 1 Ongoing, 2 PrepareCommit, 3 PrepareAbort, 4 CompleteCommit,
5 CompleteAbort, 6 Dead, 7 PrepareEpochFence. A null value is a tombstone (an expired id).
Records travel in plain v2 batches (groups/log.py builds and reads them).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from automq.broker.kafka.groups.log import RecordFormatError, _Reader, _str

KEY_VERSION = 0
VALUE_VERSION = 0


@dataclass(frozen=True, slots=True)
class TxnKey:
    transactional_id: str

    def encode(self) -> bytes:
        return struct.pack(">h", KEY_VERSION) + _str(self.transactional_id)

    @classmethod
    def decode(cls, buf: bytes) -> TxnKey:
        r = _Reader(buf)
        version = r.int16()
        if version != KEY_VERSION:
            raise RecordFormatError(f"unsupported transaction log key version {version}")
        return cls(r.str())


@dataclass(frozen=True, slots=True)
class TxnValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: int
    partitions: tuple[tuple[str, int], ...]
    last_update_ms: int
    start_ms: int

    def encode(self) -> bytes:
        by_topic: dict[str, list[int]] = {}
        for topic, index in self.partitions:
            by_topic.setdefault(topic, []).append(index)
        parts = [
            struct.pack(">hqhib", VALUE_VERSION, self.producer_id, self.producer_epoch, self.timeout_ms, self.state),
            struct.pack(">i", len(by_topic)),
        ]
        for topic, indexes in by_topic.items():
            parts += [_str(topic), struct.pack(f">i{len(indexes)}i", len(indexes), *indexes)]
        parts.append(struct.pack(">qq", self.last_update_ms, self.start_ms))
        return b"".join(parts)

    @classmethod
    def decode(cls, buf: bytes) -> TxnValue:
        r = _Reader(buf)
        version = r.int16()
        if version != VALUE_VERSION:
            raise RecordFormatError(f"unsupported transaction log value version {version}")
        pid, epoch, timeout = r.int64(), r.int16(), r.int32()
        state = struct.unpack(">b", r.take(1))[0]
        topics = r.int32()
        if topics < -1 or topics > len(buf):
            raise RecordFormatError(f"bad topic count {topics}")
        partitions: list[tuple[str, int]] = []
        for _ in range(max(topics, 0)):
            topic = r.str()
            count = r.int32()
            if count < 0 or count > len(buf):
                raise RecordFormatError(f"bad partition count {count}")
            partitions += [(topic, r.int32()) for _ in range(count)]
        return cls(pid, epoch, timeout, state, tuple(partitions), r.int64(), r.int64())
