"""The transaction coordinator's rules, without I/O: one `TxnMetadata` per transactional id and
the checks every transactional request runs against it (KIP-98, KIP-360, KIP-588).

A transaction moves Empty -> Ongoing (AddPartitionsToTxn / AddOffsetsToTxn) -> PrepareCommit
or PrepareAbort (EndTxn, a timeout, or a new producer instance fencing the old one) ->
CompleteCommit / CompleteAbort once every partition has its marker, and then Ongoing again with
the next AddPartitionsToTxn. The producer epoch grows with every InitProducerId, so an older
instance of the same transactional id is fenced (PRODUCER_FENCED) everywhere.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from kio.schema.errors import ErrorCode

from automq.broker.kafka.transactions.log import TxnValue

MAX_EPOCH = 32767  # Short.MAX_VALUE; at MAX_EPOCH - 1 a new producer id is allocated (Kafka's rule)


class TxnState(enum.IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE)

    @property
    def kafka_name(self) -> str:
        return "".join(part.capitalize() for part in self.name.split("_"))


@dataclass(slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]] = frozenset()
    last_update_ms: int = 0
    start_ms: int = -1
    # the epoch before the last bump (not persisted): recognises a retried InitProducerId (KIP-360)
    last_epoch: int = -1
    coordinator_partition: int = 0

    def copy(self, **changes: object) -> TxnMetadata:
        return replace(self, **changes)  # type: ignore[arg-type]

    def value(self) -> TxnValue:
        return TxnValue(
            self.producer_id,
            self.producer_epoch,
            self.timeout_ms,
            int(self.state),
            tuple(sorted(self.partitions)),
            self.last_update_ms,
            self.start_ms,
        )

    @classmethod
    def from_value(cls, transactional_id: str, value: TxnValue, coordinator_partition: int) -> TxnMetadata:
        return cls(
            transactional_id,
            value.producer_id,
            value.producer_epoch,
            value.timeout_ms,
            TxnState(value.state),
            frozenset(value.partitions),
            value.last_update_ms,
            value.start_ms,
            coordinator_partition=coordinator_partition,
        )


def check_producer(md: TxnMetadata | None, producer_id: int, producer_epoch: int) -> ErrorCode | None:
    """The checks AddPartitionsToTxn, AddOffsetsToTxn and EndTxn share."""
    if md is None or md.producer_id != producer_id:
        return ErrorCode.invalid_producer_id_mapping
    if producer_epoch != md.producer_epoch:
        return ErrorCode.producer_fenced
    return None


def end_txn_answer(md: TxnMetadata, commit: bool) -> tuple[ErrorCode | None, TxnState | None]:
    """(error, None) to answer now, or (None, the Prepare state to write)."""
    state = md.state
    if state is TxnState.ONGOING:
        return None, TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    if state is TxnState.PREPARE_COMMIT:
        return (ErrorCode.concurrent_transactions if commit else ErrorCode.invalid_txn_state), None
    if state is TxnState.PREPARE_ABORT:
        return (ErrorCode.invalid_txn_state if commit else ErrorCode.concurrent_transactions), None
    if state is TxnState.COMPLETE_COMMIT:
        return (ErrorCode.none if commit else ErrorCode.invalid_txn_state), None
    if state is TxnState.COMPLETE_ABORT:
        return (ErrorCode.invalid_txn_state if commit else ErrorCode.none), None
    if state is TxnState.PREPARE_EPOCH_FENCE:
        return ErrorCode.concurrent_transactions, None
    return ErrorCode.invalid_txn_state, None  # Empty, Dead: nothing to end


def bumped(md: TxnMetadata, now_ms: int, new_producer_id: int | None) -> TxnMetadata:
    """The next epoch (a new producer id at epoch 0 once the epoch space is used up)."""
    if new_producer_id is not None:
        return md.copy(producer_id=new_producer_id, producer_epoch=0, last_epoch=-1, last_update_ms=now_ms)
    return md.copy(producer_epoch=md.producer_epoch + 1, last_epoch=md.producer_epoch, last_update_ms=now_ms)


def needs_new_producer_id(md: TxnMetadata) -> bool:
    return md.producer_epoch >= MAX_EPOCH - 1
