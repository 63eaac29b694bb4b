"""Transactions as one partition sees them: open transactions, aborted ranges, the last stable offset.

A transactional producer's first batch in a partition opens a transaction there (its offset is
the transaction's *first offset*); the coordinator's marker (a control batch, COMMIT or ABORT)
closes it. From that the partition knows:

* the **last stable offset** (LSO): the first offset of the oldest open transaction, or the
  high watermark when none is open. read_committed consumers read only below it;
* the **aborted transactions** (Kafka's transaction index): (producer id, first offset, marker
  offset) of every aborted transaction, returned in Fetch responses so read_committed clients
  drop the aborted batches of those producers between first offset and the marker.

State changes come only from batch headers (the transactional/control attribute bits, the
producer id); a marker's type is read from its one record. Non-transactional batches never
reach this module, so idempotent and plain produce pay nothing for it.

Snapshots: `at(offset)` gives the state as of every batch below an offset (open transactions
that a marker at or after that offset closed are reported open again), which the producer
snapshot stores (producer_snapshots.py, version 2) so a new owner replays only the batches
after it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset


@dataclass(slots=True)
class TxnSnapshotState:
    """What a producer snapshot keeps of the transactions below its offset."""

    ongoing: dict[int, int] = field(default_factory=dict)  # producer id -> first offset
    aborted: list[AbortedTxn] = field(default_factory=list)


class PartitionTxnState:
    def __init__(self) -> None:
        self.ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self._aborted: list[AbortedTxn] = []  # in marker order (ascending last_offset)
        self._aborted_last: list[int] = []  # last_offset of each, for bisect
        # markers since the last snapshot: (producer id, first offset or -1, marker offset)
        self._completed: list[tuple[int, int, int]] = []
        # KIP-890 verification guards: producer id -> the token of a verification started
        # while it had no open transaction here; a marker or the opening batch ends it, so a
        # batch verified before a marker cannot open a transaction after it (transactions/verification.py)
        self.verifying: dict[int, object] = {}

    def __bool__(self) -> bool:
        return bool(self.ongoing or self._aborted)

    def __contains__(self, producer_id: object) -> bool:
        """Has this producer a transaction open here?"""
        return producer_id in self.ongoing

    @property
    def aborted(self) -> list[AbortedTxn]:
        return list(self._aborted)

    def last_stable_offset(self, high_watermark: int) -> int:
        if not self.ongoing:
            return high_watermark
        return min(high_watermark, min(self.ongoing.values()))

    # ---------------------------------------------------------------- changes

    def on_data(self, producer_id: int, base_offset: int) -> bool:
        """A transactional batch got base_offset; True when it opened the transaction here."""
        if producer_id in self.ongoing:
            return False
        self.ongoing[producer_id] = base_offset
        if self.verifying:
            self.verifying.pop(producer_id, None)
        return True

    def verification_guard(self, producer_id: int) -> object:
        """The token a verification of this producer's next transaction here carries."""
        guard = self.verifying.get(producer_id)
        if guard is None:
            guard = self.verifying[producer_id] = object()
        return guard

    def verified(self, producer_id: int, guard: object) -> bool:
        """May a batch verified under `guard` be appended? (no marker since it began)"""
        return producer_id in self.ongoing or self.verifying.get(producer_id) is guard

    def undo_open(self, producer_id: int, base_offset: int) -> None:
        """The append of a batch that opened a transaction failed: it is not in the log."""
        if self.ongoing.get(producer_id) == base_offset:
            del self.ongoing[producer_id]

    def on_marker(self, producer_id: int, commit: bool, marker_offset: int) -> None:
        first = self.ongoing.pop(producer_id, -1)
        if self.verifying:
            self.verifying.pop(producer_id, None)
        self._completed.append((producer_id, first, marker_offset))
        if not commit and first >= 0:
            self._aborted.append(AbortedTxn(producer_id, first, marker_offset))
            self._aborted_last.append(marker_offset)

    def undo_marker(self, producer_id: int, first_offset: int | None, marker_offset: int) -> None:
        """The marker's append failed: the transaction is open again."""
        self._completed = [c for c in self._completed if c[2] != marker_offset]
        if self._aborted_last and self._aborted_last[-1] == marker_offset:
            self._aborted.pop()
            self._aborted_last.pop()
        if first_offset is not None:
            self.ongoing[producer_id] = first_offset

    def prune(self, log_start_offset: int) -> None:
        """Forget aborted transactions wholly below the log start (retention, DeleteRecords)."""
        cut = bisect.bisect_left(self._aborted_last, log_start_offset)
        if cut:
            del self._aborted[:cut]
            del self._aborted_last[:cut]

    # ---------------------------------------------------------------- reads

    def aborted_between(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions a fetch of [fetch_offset, upper_offset) must report: those
        whose marker is at or after fetch_offset and that began before upper_offset."""
        start = bisect.bisect_left(self._aborted_last, fetch_offset)
        return [a for a in self._aborted[start:] if a.first_offset < upper_offset]

    # ---------------------------------------------------------------- snapshots

    def at(self, offset: int) -> TxnSnapshotState:
        """The state as of every batch below `offset` (a snapshot's offset)."""
        ongoing = {pid: first for pid, first in self.ongoing.items() if first < offset}
        for pid, first, marker in self._completed:
            if 0 <= first < offset <= marker:
                ongoing[pid] = first
        aborted = [a for a in self._aborted if a.last_offset < offset]
        return TxnSnapshotState(ongoing, aborted)

    def snapshot_written(self, offset: int) -> None:
        """A snapshot at `offset` is durable: markers below it need not be remembered."""
        self._completed = [c for c in self._completed if c[2] >= offset]

    def load(self, state: TxnSnapshotState) -> None:
        self.ongoing = dict(state.ongoing)
        self._aborted = sorted(state.aborted, key=lambda a: a.last_offset)
        self._aborted_last = [a.last_offset for a in self._aborted]
        self._completed = []
