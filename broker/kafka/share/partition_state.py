"""One share-partition's in-flight records (KIP-932), as a pure state machine fed `now_ms`.

A share group consumes a partition as a queue: records between the share-partition start
offset (SPSO) and end offset (SPEO) are *in flight*, each AVAILABLE (to be handed out),
ACQUIRED (locked by one member until a deadline), ACKNOWLEDGED or ARCHIVED (done). Below
the SPSO everything is done; at and above the SPEO nothing was ever handed out.

The state is kept as a sorted list of contiguous ranges covering [SPSO, SPEO) exactly, never
one object per record: a fetch of 500 records is one range, an acknowledgement of a whole
batch touches one range. Ranges split only where a client acknowledges part of one and merge
back when neighbours agree.

Delivery counts: acquiring a record counts one delivery. A record released (by the client,
by its lock timing out, or by its member's session closing) with a delivery count at the
limit (`group.share.delivery.count.limit`) is ARCHIVED instead of becoming AVAILABLE again,
so a poison record stops being redelivered.

Nothing here does I/O; the manager (manager.py) persists `durable_ranges()` and drives time.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby

# Kafka's RecordState ids (what the persisted state and DescribeShareGroupOffsets use)
AVAILABLE = 0
ACQUIRED = 1
ACKNOWLEDGED = 2
ARCHIVED = 4
_DONE = (ACKNOWLEDGED, ARCHIVED)

# AcknowledgementBatch.acknowledge_types
GAP = 0
ACCEPT = 1
RELEASE = 2
REJECT = 3
RENEW = 4
ACK_TYPES = (GAP, ACCEPT, RELEASE, REJECT, RENEW)


class InvalidRecordState(Exception):
    """An acknowledgement of records that are not acquired by this member (Kafka's
    INVALID_RECORD_STATE): already acknowledged, never delivered, lock expired, another member's."""


class InvalidAcknowledgement(ValueError):
    """A malformed acknowledgement batch (Kafka's INVALID_REQUEST): bad range, bad types."""


@dataclass(slots=True)
class InFlightRange:
    first: int
    last: int  # inclusive
    state: int
    delivery_count: int
    member: str | None = None  # ACQUIRED: who holds the lock
    deadline_ms: int = 0  # ACQUIRED: when the lock expires

    def same_as(self, other: InFlightRange) -> bool:
        return (
            self.state == other.state
            and self.delivery_count == other.delivery_count
            and self.member == other.member
            and self.deadline_ms == other.deadline_ms
        )


def _first(r: InFlightRange) -> int:
    return r.first


@dataclass(slots=True)
class SharePartitionState:
    start_offset: int  # SPSO
    end_offset: int = -1  # SPEO; -1: start_offset
    ranges: list[InFlightRange] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.end_offset < self.start_offset:
            self.end_offset = self.ranges[-1].last + 1 if self.ranges else self.start_offset

    # ---------------------------------------------------------------- queries

    @property
    def in_flight(self) -> int:
        """Records between SPSO and SPEO (Kafka bounds this by group.share.partition.max.record.locks)."""
        return self.end_offset - self.start_offset

    def count(self, state: int) -> int:
        return sum(r.last - r.first + 1 for r in self.ranges if r.state == state)

    def first_acquirable(self, high_watermark: int, max_locks: int) -> int | None:
        """Where the next acquisition starts: the first AVAILABLE record, or the SPEO when
        new records exist and the in-flight limit allows more; None when nothing can go out."""
        for r in self.ranges:
            if r.state == AVAILABLE:
                return r.first
        if self.end_offset < high_watermark and self.in_flight < max_locks:
            return self.end_offset
        return None

    def next_deadline(self) -> int | None:
        deadlines = [r.deadline_ms for r in self.ranges if r.state == ACQUIRED]
        return min(deadlines) if deadlines else None

    def durable_ranges(self) -> list[tuple[int, int, int, int]]:
        """(first, last, state, delivery count) as persisted: a lock does not survive its
        leader, so ACQUIRED is stored as AVAILABLE (with the deliveries counted so far);
        AVAILABLE ranges never delivered are left out (they are implied)."""
        out: list[tuple[int, int, int, int]] = []
        for r in self.ranges:
            state = AVAILABLE if r.state == ACQUIRED else r.state
            if state == AVAILABLE and r.delivery_count == 0:
                continue
            if out and out[-1][1] + 1 == r.first and out[-1][2] == state and out[-1][3] == r.delivery_count:
                out[-1] = (out[-1][0], r.last, state, r.delivery_count)
            else:
                out.append((r.first, r.last, state, r.delivery_count))
        return out

    @classmethod
    def restore(cls, start_offset: int, durable: Sequence[tuple[int, int, int, int]]) -> SharePartitionState:
        """The state a new leader starts from: the persisted ranges, with the gaps between
        them AVAILABLE and undelivered."""
        state = cls(start_offset)
        pos = start_offset
        for first, last, st, count in sorted(durable):
            if last < pos:
                continue
            first = max(first, pos)
            if first > pos:
                state.ranges.append(InFlightRange(pos, first - 1, AVAILABLE, 0))
            state.ranges.append(InFlightRange(first, last, AVAILABLE if st == ACQUIRED else st, count))
            pos = last + 1
        state.end_offset = pos
        state._merge(0, len(state.ranges))
        state._advance()
        return state

    # ---------------------------------------------------------------- changes

    def acquire(
        self,
        member: str,
        read_end: int,
        max_records: int,
        max_locks: int,
        lock_ms: int,
        now_ms: int,
        from_offset: int = 0,
    ) -> list[tuple[int, int, int]]:
        """Lock for `member` the AVAILABLE records in [from_offset, read_end) (what the fetch
        read), then new records from the SPEO up to `read_end`, at most `max_records` in all and
        never more than `max_locks` in flight. Returns (first, last, delivery count) per
        acquired range."""
        out: list[tuple[int, int, int]] = []
        budget = max_records
        deadline = now_ms + lock_ms
        if self.end_offset < from_offset:
            return out  # the fetch read past what is in flight: never skip records
        self._split(from_offset)
        i = max(bisect_right(self.ranges, from_offset, key=_first) - 1, 0)
        while i < len(self.ranges) and budget > 0:
            r = self.ranges[i]
            if r.first >= read_end:
                break
            if r.state != AVAILABLE:
                i += 1
                continue
            last = min(r.last, read_end - 1, r.first + budget - 1)
            if last < r.last:
                self.ranges.insert(i + 1, InFlightRange(last + 1, r.last, r.state, r.delivery_count))
                r.last = last
            r.state, r.member, r.deadline_ms = ACQUIRED, member, deadline
            r.delivery_count += 1
            out.append((r.first, r.last, r.delivery_count))
            budget -= r.last - r.first + 1
            i += 1
        new_end = min(read_end, self.start_offset + max_locks, self.end_offset + budget)
        if budget > 0 and new_end > self.end_offset:
            self.ranges.append(InFlightRange(self.end_offset, new_end - 1, ACQUIRED, 1, member, deadline))
            out.append((self.end_offset, new_end - 1, 1))
            self.end_offset = new_end
        self._merge(0, len(self.ranges))
        return _coalesce(out)

    def acknowledge(
        self,
        member: str,
        first: int,
        last: int,
        types: Sequence[int],
        delivery_limit: int,
        lock_ms: int,
        now_ms: int,
    ) -> None:
        """Apply one AcknowledgementBatch. `types` holds one type for the whole range or one
        per offset. All or nothing: every offset must be ACQUIRED by `member`."""
        self.validate(member, first, last, types)
        if len(types) == 1:
            runs = [(first, last, types[0])]
        else:
            runs = []
            pos = first
            for t, group in groupby(types):
                n = sum(1 for _ in group)
                runs.append((pos, pos + n - 1, t))
                pos += n
        for a, b, t in runs:
            self._apply(a, b, t, delivery_limit, now_ms + lock_ms)
        self._advance()

    def validate(self, member: str, first: int, last: int, types: Sequence[int]) -> None:
        """Raise what `acknowledge` would, changing nothing (a request's batches for one
        partition are checked together before any is applied, as Kafka does)."""
        if first < 0 or last < first:
            raise InvalidAcknowledgement(f"acknowledgement batch {first}..{last} is not a range")
        if not types or (len(types) != 1 and len(types) != last - first + 1):
            raise InvalidAcknowledgement(
                f"acknowledgement batch {first}..{last} has {len(types)} types (1 or one per offset)"
            )
        # held first: it bounds the range by what is in flight before any per-offset work
        self._check_held(member, first, last)
        if any(t not in ACK_TYPES for t in types):
            raise InvalidAcknowledgement(f"unknown acknowledge type in {sorted(set(types))}")

    def release_member(self, member: str, delivery_limit: int) -> int:
        """Release every record `member` holds (its share session closed or it left the
        group). Returns how many records were released."""
        released = 0
        for r in self.ranges:
            if r.state == ACQUIRED and r.member == member:
                released += r.last - r.first + 1
                self._unlock(r, delivery_limit)
        if released:
            self._merge(0, len(self.ranges))
            self._advance()
        return released

    def expire(self, now_ms: int, delivery_limit: int) -> int:
        """Locks past their deadline end: the records become AVAILABLE again (or ARCHIVED at
        the delivery limit). Returns how many records were unlocked."""
        unlocked = 0
        for r in self.ranges:
            if r.state == ACQUIRED and r.deadline_ms <= now_ms:
                unlocked += r.last - r.first + 1
                self._unlock(r, delivery_limit)
        if unlocked:
            self._merge(0, len(self.ranges))
            self._advance()
        return unlocked

    def move_start(self, offset: int) -> None:
        """The SPSO moves to `offset` (retention trimmed the log below it, or an admin reset):
        records below it are gone; above the old SPEO nothing was delivered."""
        if offset <= self.start_offset:
            if offset < self.start_offset and not self.ranges:
                self.start_offset = self.end_offset = offset  # an admin reset backwards
            return
        if offset >= self.end_offset:
            self.ranges.clear()
            self.start_offset = self.end_offset = offset
            return
        self._split(offset)
        i = bisect_right(self.ranges, offset - 1, key=_first)
        del self.ranges[:i]
        self.start_offset = offset

    # ---------------------------------------------------------------- internals

    def _check_held(self, member: str, first: int, last: int) -> None:
        if first < self.start_offset or last >= self.end_offset:
            raise InvalidRecordState(
                f"offsets {first}..{last} are not in flight (in flight: {self.start_offset}..{self.end_offset - 1})"
            )
        i = bisect_right(self.ranges, first, key=_first) - 1
        while i < len(self.ranges) and self.ranges[i].first <= last:
            r = self.ranges[i]
            if r.state != ACQUIRED or r.member != member:
                raise InvalidRecordState(
                    f"offsets {max(r.first, first)}..{min(r.last, last)} are not acquired by this member"
                )
            i += 1

    def _apply(self, first: int, last: int, ack: int, delivery_limit: int, renewed_deadline: int) -> None:
        self._split(first)
        self._split(last + 1)
        lo = bisect_right(self.ranges, first, key=_first) - 1
        hi = lo
        while hi < len(self.ranges) and self.ranges[hi].last <= last:
            r = self.ranges[hi]
            if ack == RENEW:
                r.deadline_ms = renewed_deadline
            elif ack in (ACCEPT,):
                r.state, r.member, r.deadline_ms = ACKNOWLEDGED, None, 0
            elif ack in (GAP, REJECT):
                r.state, r.member, r.deadline_ms = ARCHIVED, None, 0
            else:  # RELEASE
                self._unlock(r, delivery_limit)
            hi += 1
        self._merge(max(lo - 1, 0), hi + 1)

    @staticmethod
    def _unlock(r: InFlightRange, delivery_limit: int) -> None:
        r.state = ARCHIVED if r.delivery_count >= delivery_limit else AVAILABLE
        r.member, r.deadline_ms = None, 0

    def _split(self, offset: int) -> None:
        """Make `offset` the first offset of a range (when it lies inside one)."""
        i = bisect_right(self.ranges, offset, key=_first) - 1
        if i < 0:
            return
        r = self.ranges[i]
        if r.first < offset <= r.last:
            self.ranges.insert(i + 1, InFlightRange(offset, r.last, r.state, r.delivery_count, r.member, r.deadline_ms))
            r.last = offset - 1

    def _merge(self, lo: int, hi: int) -> None:
        i = max(lo, 1)
        hi = min(hi, len(self.ranges))
        while i < hi and i < len(self.ranges):
            prev, cur = self.ranges[i - 1], self.ranges[i]
            if prev.last + 1 == cur.first and prev.same_as(cur):
                prev.last = cur.last
                del self.ranges[i]
                hi -= 1
            else:
                i += 1

    def _advance(self) -> None:
        """Move the SPSO past the leading done records."""
        n = 0
        for r in self.ranges:
            if r.state not in _DONE:
                break
            n += 1
        if n:
            self.start_offset = self.ranges[n - 1].last + 1
            del self.ranges[:n]


def _coalesce(ranges: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for first, last, count in ranges:
        if out and out[-1][1] + 1 == first and out[-1][2] == count:
            out[-1] = (out[-1][0], last, count)
        else:
            out.append((first, last, count))
    return out
