"""What key compaction keeps of one partition's log, decided as Kafka's log cleaner decides it.

Sans-I/O: `LogScan` is fed every committed batch of the partition in offset order (pass 1),
`KeyCleaner` is then fed the batches of the objects being replaced (pass 2) and emits the
batches of the new object. `keycompact.py` does the reading, writing and committing.

Transactions (what a read_committed consumer sees must be the same before and after, and
producers must keep working):

- the **cut** is the first offset of the oldest transaction still open in the committed log
  (its last stable offset, as far as objects show). Nothing at or above it is cleaned: those
  batches are copied byte for byte, and records there never supersede older ones (the open
  transaction may still abort, and Kafka's cleaner stops there too);
- a key's latest offset counts only records a read_committed consumer would see:
  non-transactional ones and those of committed transactions; aborted records never win;
- batches of aborted transactions are removed;
- **markers** (control batches) stay while any batch of their transaction remains with its
  producer fields. ABORT markers stay for good: brokers keep reporting an aborted
  transaction to read_committed consumers from their own memory and snapshots, and a
  consumer told of one whose marker is gone would skip that producer's later committed
  batches. A COMMIT marker with none of its data left gets a delete horizon stamped in
  (KIP-534: attribute bit 0x40, baseTimestamp = now + delete.retention.ms) and goes on the
  first run after the horizon, only below the partition's oldest producer snapshot (a broker
  that loads an older snapshot replays the marker to close the transaction);
- the **last batch of every active producer** (newest timestamp within
  producer.id.expiration.ms) keeps its producer id, epoch, base sequence and offset span,
  even with no records left (an empty batch, as Kafka's cleaner writes): a broker rebuilding
  producer state from the log takes the producer's last sequence from it, so idempotent and
  transactional producers continue without OUT_OF_ORDER_SEQUENCE after compaction. A marker
  that is its producer's last entry stays too (it carries the producer's epoch).

Offsets are kept: a batch keeps its base offset and span; records keep their offsets. The
store needs the new object to cover every offset, so removed batches are folded into a
neighbouring kept batch's span (that batch then loses its producer fields: its sequence
numbers no longer match its span), or, next to batches whose producer fields must stay, into
an empty batch with no producer.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c

from automq.broker.kafka import records

HORIZON_BIT = 0x40  # KIP-534 "delete horizon set": baseTimestamp holds the horizon
_BASE_TS = struct.Struct(">q")
_BASE_TS_OFFSET = 27  # after attributes (21..23) and lastOffsetDelta (23..27)
_ATTRIBUTES = struct.Struct(">h")
_CRC = struct.Struct(">I")

Emit = Callable[[int, int, bytes], None]  # (base offset, offset count, batch bytes)


@dataclass(slots=True)
class _Txn:
    producer_id: int
    first_offset: int
    batches: list[int] = field(default_factory=list)
    committed: bool | None = None  # None while open


@dataclass(slots=True)
class ScanResult:
    cut: int  # first offset not cleaned (oldest open transaction), or the scanned end
    latest: dict[bytes, int]  # key -> offset of its latest record a read_committed reader sees, below cut
    aborted: set[int]  # base offsets of batches of aborted transactions
    # producer id -> (base offset of its last data batch or -1, of its last batch, that one's max timestamp)
    producers: dict[int, tuple[int, int, int]]

    def producer_batches(self, active_since_ms: int) -> set[int]:
        """Base offsets of what keeps the state of producers active since then: each one's
        last data batch (its last sequence) and its last batch if that is a marker (its epoch)."""
        out = set()
        for last_data, last, ts in self.producers.values():
            if ts >= active_since_ms:
                out.add(last)
                if last_data >= 0:
                    out.add(last_data)
        return out


class LogScan:
    """Pass 1 over the whole committed log of a partition, batches in offset order."""

    def __init__(self) -> None:
        self.end = 0
        self._latest: dict[bytes, int] = {}
        self._aborted: set[int] = set()
        self._ongoing: dict[int, _Txn] = {}
        self._producers: dict[int, tuple[int, int, int]] = {}
        # keys of batches at or after the oldest open transaction's first offset: they count
        # once everything before them is decided (base offset, [(offset, key)], transaction)
        self._pending: deque[tuple[int, list[tuple[int, bytes]], _Txn | None]] = deque()

    def add(self, batch: bytes | memoryview, header: records.BatchHeader | None = None) -> None:
        h = header or records.parse_header(batch)
        self.end = max(self.end, h.base_offset + h.last_offset_delta + 1)
        if h.producer_id >= 0:
            last_data = self._producers.get(h.producer_id, (-1, -1, -1))[0]
            if not h.is_control:
                last_data = h.base_offset
            self._producers[h.producer_id] = (last_data, h.base_offset, h.max_timestamp)
        if h.is_control:
            kind = records.control_type(batch, h)
            if kind is None:
                return  # an unknown control type (Kafka ignores those too)
            txn = self._ongoing.pop(h.producer_id, None)
            if txn is not None:
                txn.committed = kind == records.CONTROL_COMMIT
                if not txn.committed:
                    self._aborted.update(txn.batches)
            self._drain()
            return
        keys = [(o, k) for o, _ts, k, _v, _h in records.decode_records(batch, h) if k is not None]
        txn = None
        if h.is_transactional and h.producer_id >= 0:
            txn = self._ongoing.get(h.producer_id)
            if txn is None:
                txn = self._ongoing[h.producer_id] = _Txn(h.producer_id, h.base_offset)
            txn.batches.append(h.base_offset)
        if self._ongoing:
            self._pending.append((h.base_offset, keys, txn))
        else:
            self._apply(keys)

    def _apply(self, keys: list[tuple[int, bytes]]) -> None:
        latest = self._latest
        for offset, key in keys:
            latest[key] = offset

    def _drain(self) -> None:
        limit = min(t.first_offset for t in self._ongoing.values()) if self._ongoing else None
        pending = self._pending
        while pending and (limit is None or pending[0][0] < limit):
            _base, keys, txn = pending.popleft()
            if txn is None or txn.committed:
                self._apply(keys)

    def result(self) -> ScanResult:
        cut = min((t.first_offset for t in self._ongoing.values()), default=self.end)
        return ScanResult(cut, self._latest, set(self._aborted), dict(self._producers))


@dataclass(slots=True)
class _Item:
    """A batch of the output, its span possibly widened over removed batches."""

    start: int
    end: int
    pinned: bool  # its producer fields and span must stay as they are
    raw: bytes | None = None  # written as is
    header: records.BatchHeader | None = None  # rebuilt from header + records
    recs: list[records.Record] = field(default_factory=list)
    txn_pid: int = -1  # a transactional batch whose producer fields are intact: its producer id


@dataclass(slots=True)
class CleanStats:
    batches_in: int = 0
    batches_out: int = 0
    records_in: int = 0
    records_out: int = 0
    aborted_batches_removed: int = 0
    markers_removed: int = 0
    markers_stamped: int = 0
    empty_batches: int = 0


class KeyCleaner:
    """Pass 2: the batches of the objects being replaced in, the new object's batches out."""

    def __init__(
        self,
        scan: ScanResult,
        emit: Emit,
        *,
        now_ms: int,
        min_lag_ms: int,
        delete_retention_ms: int,
        producer_expiration_ms: int,
        marker_floor: int | None,
    ) -> None:
        self.scan = scan
        self._emit = emit
        self.now_ms = now_ms
        self.lag_cut = now_ms - min_lag_ms
        self.tombstone_cut = now_ms - delete_retention_ms
        self.delete_retention_ms = delete_retention_ms
        self.marker_floor = marker_floor  # COMMIT markers at or above it stay (None: no snapshot)
        self.producer_last = scan.producer_batches(now_ms - producer_expiration_ms)
        self.stats = CleanStats()
        self._pending: _Item | None = None
        self._gap: tuple[int, int, int] | None = None  # (start, end, max timestamp) of removed batches
        self._txn_batches: dict[int, int] = {}  # producer id -> batches of its transaction with fields, written

    # ---------------------------------------------------------------- input

    def add(self, batch: bytes | memoryview, header: records.BatchHeader | None = None) -> None:
        h = header or records.parse_header(batch)
        self.stats.batches_in += 1
        end = h.base_offset + h.last_offset_delta + 1
        if h.base_offset >= self.scan.cut:
            self.stats.records_in += 0 if h.is_control else h.record_count
            self._keep(_Item(h.base_offset, end, True, raw=bytes(batch), txn_pid=_txn_pid(h)))
            return
        if h.is_control:
            self._marker(bytes(batch), h, end)
            return
        pinned = h.base_offset in self.producer_last
        if h.base_offset in self.scan.aborted:
            self.stats.records_in += h.record_count
            self.stats.aborted_batches_removed += 1
            if pinned:
                self._keep(_Item(h.base_offset, end, True, header=h, txn_pid=_txn_pid(h)))
            else:
                self._remove(h, end)
            return
        recs = records.decode_records(batch, h)
        self.stats.records_in += len(recs)
        latest = self.scan.latest
        kept = [
            r
            for r in recs
            if r[1] > self.lag_cut
            or r[2] is None
            or (latest.get(r[2]) == r[0] and not (r[3] is None and r[1] < self.tombstone_cut))
        ]
        if kept or pinned:
            self._keep(_Item(h.base_offset, end, pinned, header=h, recs=kept, txn_pid=_txn_pid(h)))
        else:
            self._remove(h, end)

    def _marker(self, batch: bytes, h: records.BatchHeader, end: int) -> None:
        pid = h.producer_id
        kind = records.control_type(batch, h)
        data_left = self._txn_batches.pop(pid, 0) or (self._pending is not None and self._pending.txn_pid == pid)
        if (
            kind != records.CONTROL_COMMIT
            or data_left
            or h.base_offset in self.producer_last
            or (self.marker_floor is not None and h.base_offset >= self.marker_floor)
        ):
            self._keep(_Item(h.base_offset, end, True, raw=batch))
            return
        if h.attributes & HORIZON_BIT:
            if h.base_timestamp <= self.now_ms:
                self.stats.markers_removed += 1
                self._remove(h, end)
            else:
                self._keep(_Item(h.base_offset, end, True, raw=batch))
            return
        self.stats.markers_stamped += 1
        self._keep(_Item(h.base_offset, end, True, raw=stamp_horizon(batch, self.now_ms + self.delete_retention_ms)))

    # ---------------------------------------------------------------- output

    def _remove(self, h: records.BatchHeader, end: int) -> None:
        pending = self._pending
        if self._gap is not None:
            start, _end, ts = self._gap
            self._gap = (start, end, max(ts, h.max_timestamp))
        elif pending is not None and not pending.pinned:
            pending.end = end  # widened: its producer fields go
            pending.txn_pid = -1
        else:
            self._gap = (h.base_offset, end, h.max_timestamp)

    def _keep(self, item: _Item) -> None:
        if self._gap is not None:
            start, _end, ts = self._gap
            self._gap = None
            if not item.pinned:
                item.start = start  # folded forward: its producer fields go
                item.txn_pid = -1
            else:
                self._write_pending()
                self._write_empty(start, _end, ts)
        self._write_pending()
        self._pending = item

    def finish(self) -> None:
        self._write_pending()
        if self._gap is not None:
            start, end, ts = self._gap
            self._gap = None
            self._write_empty(start, end, ts)

    def _write_pending(self) -> None:
        item = self._pending
        if item is None:
            return
        self._pending = None
        if item.txn_pid >= 0:
            self._txn_batches[item.txn_pid] = self._txn_batches.get(item.txn_pid, 0) + 1
        if item.raw is not None:
            self._out(item.start, item.end, item.raw, -1)
            return
        h = item.header
        assert h is not None
        folded = item.start != h.base_offset or item.end != h.base_offset + h.last_offset_delta + 1
        recs = item.recs
        log_append = h.attributes & records.TIMESTAMP_TYPE_BIT
        if recs:
            base_ts = min(r[1] for r in recs)
            max_ts = h.max_timestamp if log_append else max(r[1] for r in recs)
        else:
            base_ts, max_ts = h.base_timestamp, h.max_timestamp
        keep_fields = not folded
        attributes = h.attributes & (records.TIMESTAMP_TYPE_BIT | (records.TRANSACTIONAL_BIT if keep_fields else 0))
        batch = records.build_batch(
            item.start,
            [records.encode_record(o - item.start, ts - base_ts, k, v, hd) for o, ts, k, v, hd in recs],
            last_offset_delta=item.end - item.start - 1,
            base_timestamp=base_ts,
            max_timestamp=max_ts,
            attributes=attributes,
            producer_id=h.producer_id if keep_fields else -1,
            producer_epoch=h.producer_epoch if keep_fields else -1,
            base_sequence=h.base_sequence if keep_fields else -1,
            partition_leader_epoch=h.partition_leader_epoch,
        )
        self._out(item.start, item.end, batch, len(recs))

    def _write_empty(self, start: int, end: int, timestamp: int) -> None:
        batch = records.build_batch(
            start, [], last_offset_delta=end - start - 1, base_timestamp=timestamp, max_timestamp=timestamp
        )
        self._out(start, end, batch, 0)

    def _out(self, start: int, end: int, batch: bytes, record_count: int) -> None:
        h = records.parse_header(batch)
        count = h.record_count if record_count < 0 else record_count
        self.stats.batches_out += 1
        self.stats.records_out += 0 if h.is_control else count
        if count == 0 and not h.is_control:
            self.stats.empty_batches += 1
        self._emit(start, end - start, batch)


def _txn_pid(h: records.BatchHeader) -> int:
    return h.producer_id if h.is_transactional and not h.is_control and h.producer_id >= 0 else -1


def stamp_horizon(batch: bytes, horizon_ms: int) -> bytes:
    """The batch with KIP-534's delete horizon set (attribute bit + baseTimestamp), CRC redone."""
    out = bytearray(batch)
    (attributes,) = _ATTRIBUTES.unpack_from(out, records.ATTRIBUTES_OFFSET)
    _ATTRIBUTES.pack_into(out, records.ATTRIBUTES_OFFSET, attributes | HORIZON_BIT)
    _BASE_TS.pack_into(out, _BASE_TS_OFFSET, horizon_ms)
    _CRC.pack_into(out, records.CRC_OFFSET, crc32c.crc32c(memoryview(out)[records.ATTRIBUTES_OFFSET :]))
    return bytes(out)
