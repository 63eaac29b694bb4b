"""Key compaction's decisions on transactional logs (keyclean.py), byte level, no Spark: aborted
batches go, markers stay until safe, nothing at or above an open transaction is touched,
records of aborted or open transactions never supersede committed ones, every active
producer's last batch keeps its producer fields and span, and the output covers every input
offset."""

from __future__ import annotations

from automq.broker.kafka import records
from automq.broker.kafka.producers import ProducerStateManager
from automq.spark.keyclean import HORIZON_BIT, KeyCleaner, LogScan
from automq.spark.reader import ArrowBuilder

NOW = 1_000_000_000
HOUR = 3_600_000


class Log:
    """Builds a partition's batches with dense offsets."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.next = 0
        self.seq: dict[int, int] = {}

    def data(self, *kvs: tuple[bytes | None, bytes | None], pid: int = -1, txn: bool = False, ts: int = NOW - HOUR):
        base = self.next
        seq = -1
        if pid >= 0:
            seq = self.seq.get(pid, 0)
            self.seq[pid] = seq + len(kvs)
        recs = [records.encode_record(i, 0, k, v) for i, (k, v) in enumerate(kvs)]
        self.batches.append(
            records.build_batch(
                base,
                recs,
                last_offset_delta=len(kvs) - 1,
                base_timestamp=ts,
                max_timestamp=ts,
                attributes=records.TRANSACTIONAL_BIT if txn else 0,
                producer_id=pid,
                producer_epoch=0 if pid >= 0 else -1,
                base_sequence=seq,
            )
        )
        self.next += len(kvs)
        return base

    def marker(self, pid: int, commit: bool, ts: int = NOW - HOUR) -> int:
        batch = records.control_batch(pid, 0, commit, 0, ts)
        batch[0:8] = self.next.to_bytes(8, "big")  # baseOffset is outside the CRC
        self.batches.append(bytes(batch))
        self.next += 1
        return self.next - 1


def clean(batches: list[bytes], now: int = NOW, retention: int = 0, floor: int | None = None, expiry: int = 24 * HOUR):
    scan = LogScan()
    for b in batches:
        scan.add(b)
    out: list[tuple[int, int, bytes]] = []
    cleaner = KeyCleaner(
        scan.result(),
        lambda s, c, b: out.append((s, c, b)),
        now_ms=now,
        min_lag_ms=0,
        delete_retention_ms=retention,
        producer_expiration_ms=expiry,
        marker_floor=floor,
    )
    for b in batches:
        cleaner.add(b)
    cleaner.finish()
    # the output covers every input offset, in order, without gaps
    pos = records.parse_header(batches[0]).base_offset
    for start, count, batch in out:
        h = records.parse_header(batch)
        assert (start, count) == (h.base_offset, h.last_offset_delta + 1) and start == pos
        pos += count
    last = records.parse_header(batches[-1])
    assert pos == last.base_offset + last.last_offset_delta + 1
    return [b for _s, _c, b in out], cleaner.stats


def rows(batches: list[bytes], committed_only: bool = False) -> list[tuple[int, bytes | None, bytes | None]]:
    """What a consumer reads (read_uncommitted, or read_committed over the batch headers)."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    aborted_pids: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {}
    for b in batches:
        h = records.parse_header(b)
        if h.is_control:
            held = aborted_pids.pop(h.producer_id, [])
            if records.control_type(b, h) == records.CONTROL_COMMIT:
                out += held
            continue
        recs = [(o, k, v) for o, _t, k, v, _h in records.decode_records(b, h)]
        if committed_only and h.is_transactional and h.producer_id >= 0:
            aborted_pids.setdefault(h.producer_id, []).extend(recs)
        else:
            out += recs
    return sorted(out)


def headers(batches: list[bytes]) -> list[records.BatchHeader]:
    return [records.parse_header(b) for b in batches]


def test_aborted_batches_go_markers_stay_and_aborted_values_never_win():
    log = Log()
    log.data((b"a", b"a1"), (b"b", b"b1"))
    log.data((b"a", b"a-aborted"), (b"c", b"c-aborted"), pid=7, txn=True)
    abort_at = log.marker(7, commit=False)
    log.data((b"b", b"b2"), pid=8, txn=True)
    log.marker(8, commit=True)
    log.data((b"d", b"d1"))
    before_committed = rows(log.batches, committed_only=True)
    out, stats = clean(log.batches)
    got = rows(out)
    # a1 survives (the aborted a is not its successor), b1 superseded by the committed b2
    assert got == [(0, b"a", b"a1"), (5, b"b", b"b2"), (7, b"d", b"d1")]
    # the same read_committed view as compacting what a read_committed reader saw
    latest = {k: (o, k, v) for o, k, v in before_committed}
    assert sorted(latest.values()) == got == rows(out, committed_only=True)
    assert stats.aborted_batches_removed == 1
    hs = headers(out)
    assert any(h.is_control and h.base_offset == abort_at for h in hs)  # ABORT markers stay


def test_nothing_at_or_after_an_open_transaction_is_cleaned():
    log = Log()
    log.data((b"k", b"v1"))
    open_first = log.data((b"k", b"open"), pid=9, txn=True)  # never ends (in these objects)
    log.data((b"k", b"v2"))
    log.data((b"k", b"v3"))
    out, _stats = clean(log.batches)
    # k=v1 stays: its successors are at or above the open transaction (they may abort, or
    # a read_committed reader cannot see them yet) and those batches are copied byte for byte
    assert rows(out) == [(0, b"k", b"v1"), (1, b"k", b"open"), (2, b"k", b"v2"), (3, b"k", b"v3")]
    assert out[1:] == log.batches[open_first:]


def test_commit_marker_stamped_then_removed_once_its_data_is_gone_and_the_horizon_passed():
    log = Log()
    log.data((b"x", b"1"), pid=5, txn=True)
    log.marker(5, commit=True)
    log.data((b"x", b"2"), pid=6)  # supersedes the transaction's only record; last batch of 6
    log.data((b"y", b"1"), pid=5)  # producer 5's last batch is not the marker
    out, stats = clean(log.batches, retention=HOUR)
    marker = next(h for h in headers(out) if h.is_control)
    assert stats.markers_stamped == 1 and marker.attributes & HORIZON_BIT and marker.base_timestamp == NOW + HOUR
    assert records.control_type(next(b for b in out if records.parse_header(b).is_control)) == records.CONTROL_COMMIT
    # before the horizon: kept; after it: removed
    again, stats = clean(out, now=NOW + HOUR - 1, retention=HOUR)
    assert any(h.is_control for h in headers(again)) and stats.markers_removed == 0
    gone, stats = clean(out, now=NOW + HOUR, retention=HOUR)
    assert not any(h.is_control for h in headers(gone)) and stats.markers_removed == 1
    assert rows(gone) == [(2, b"x", b"2"), (3, b"y", b"1")]
    # a producer snapshot at or below the marker: a broker loading it must replay the marker
    kept, _ = clean(out, now=NOW + HOUR, retention=HOUR, floor=1)
    assert any(h.is_control for h in headers(kept))


def test_commit_marker_stays_while_its_transaction_has_data_with_producer_fields():
    log = Log()
    log.data((b"x", b"1"), pid=5, txn=True)
    log.marker(5, commit=True)
    log.data((b"z", b"1"), pid=5)  # producer 5's last batch
    out, stats = clean(log.batches, now=NOW + 10 * HOUR)
    assert stats.markers_stamped == 0 and [h.is_control for h in headers(out)] == [False, True, False]
    assert headers(out)[0].producer_id == 5 and headers(out)[0].is_transactional


def test_active_producers_last_batch_keeps_fields_and_span_even_when_empty():
    log = Log()
    log.data((b"a", b"1"), (b"b", b"1"), (b"c", b"1"), pid=3)  # producer 3's only (so last) batch
    log.data((b"a", b"2"), (b"b", b"2"), (b"c", b"2"))  # supersedes all of it
    log.data((b"a", b"old"), pid=4, ts=NOW - 48 * HOUR)  # an expired producer's last batch
    log.data((b"a", b"3"))
    out, stats = clean(log.batches)
    hs = headers(out)
    first = hs[0]
    assert (first.base_offset, first.last_offset_delta, first.record_count) == (0, 2, 0)
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (3, 0, 0)
    assert stats.empty_batches == 1
    assert all(h.producer_id != 4 for h in hs)  # expired: not kept for it
    # the Spark jobs' reader takes the empty batch in its stride
    builder = ArrowBuilder("t", 0)
    assert sum(builder.add_batch(b, 0, 1 << 40) for b in out) == len(rows(out))
    assert builder.flush().column("offset").to_pylist() == [o for o, _k, _v in rows(out)]
    # a broker rebuilding producer state from this log expects sequence 3 next from producer 3
    state = ProducerStateManager(clock=lambda: NOW)
    for h in hs:
        if h.producer_id >= 0 and not h.is_control:
            state.record(h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta + 1, h.base_offset, NOW)
    assert state.check(3, 0, 3, 1) is None


def test_aborted_last_batch_of_a_producer_is_kept_empty_with_its_marker():
    log = Log()
    log.data((b"a", b"1"))
    log.data((b"a", b"no"), (b"b", b"no"), pid=2, txn=True)
    log.marker(2, commit=False)
    out, _stats = clean(log.batches)
    hs = headers(out)
    assert [(h.base_offset, h.record_count, h.producer_id, h.is_control) for h in hs] == [
        (0, 1, -1, False),
        (1, 0, 2, False),
        (3, 1, 2, True),
    ]
    assert rows(out) == [(0, b"a", b"1")]
