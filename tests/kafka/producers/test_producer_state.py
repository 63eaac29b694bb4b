"""ProducerStateManager: Kafka's idempotent-producer rules, checked case by case and against
a model under random retries, duplicates and reordering (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from automq.broker.kafka.producers import (
    MAX_SEQUENCE,
    ProducerIdAllocator,
    ProducerIdExhaustedError,
    ProducerStateError,
    ProducerStateManager,
    last_sequence,
    sequence_after,
)


def append(psm: ProducerStateManager, log: list, pid: int, epoch: int, seq: int, count: int, ts: int = 0) -> int:
    """check + append to `log` + record, the way the produce path does it."""
    dup = psm.check(pid, epoch, seq, count)
    if dup is not None:
        return dup
    base = sum(c for _, c in log)
    log.append((seq, count))
    psm.record(pid, epoch, seq, count, base, ts)
    return base


def error_of(fn, *args) -> ErrorCode | None:
    try:
        fn(*args)
    except ProducerStateError as exc:
        return exc.error_code
    return None


def test_in_order_batches_are_accepted_and_duplicates_return_original_offsets() -> None:
    psm, log = ProducerStateManager(), []
    offsets = [append(psm, log, 7, 0, seq, 10) for seq in range(0, 100, 10)]
    assert offsets == list(range(0, 100, 10))
    # the last 5 batches are remembered with their offsets
    for seq in range(50, 100, 10):
        assert psm.check(7, 0, seq, 10) == seq
    # older ones are out of order, not duplicates
    assert error_of(psm.check, 7, 0, 40, 10) == ErrorCode.out_of_order_sequence_number
    # same first sequence but a different range is not a duplicate
    assert error_of(psm.check, 7, 0, 90, 5) == ErrorCode.out_of_order_sequence_number
    assert len(log) == 10


def test_gap_and_stale_epoch_and_epoch_bump() -> None:
    psm, log = ProducerStateManager(), []
    append(psm, log, 1, 3, 0, 5)
    assert error_of(psm.check, 1, 3, 6, 1) == ErrorCode.out_of_order_sequence_number  # gap
    assert error_of(psm.check, 1, 2, 5, 1) == ErrorCode.invalid_producer_epoch  # fenced epoch
    assert error_of(psm.check, 1, 2, 0, 5) == ErrorCode.invalid_producer_epoch  # even an old duplicate
    assert error_of(psm.check, 1, 4, 5, 1) == ErrorCode.out_of_order_sequence_number  # new epoch must start at 0
    assert append(psm, log, 1, 4, 0, 2) == 5  # epoch bump resets sequences
    assert error_of(psm.check, 1, 3, 0, 5) == ErrorCode.invalid_producer_epoch  # the old epoch is fenced now
    assert psm.check(1, 4, 0, 2) == 5  # duplicates of the new epoch are found
    assert psm.check(1, 4, 2, 1) is None


def test_unknown_producer_is_accepted_at_any_sequence() -> None:
    psm, log = ProducerStateManager(), []
    assert append(psm, log, 9, 0, 1234, 3) == 0
    assert psm.check(9, 0, 1237, 1) is None


def test_sequence_wraps_after_max_int32() -> None:
    assert sequence_after(MAX_SEQUENCE, 1) == 0
    assert last_sequence(MAX_SEQUENCE - 1, 5) == 2
    psm, log = ProducerStateManager(), []
    append(psm, log, 2, 0, MAX_SEQUENCE - 4, 5)  # ends exactly at 2^31-1
    assert append(psm, log, 2, 0, 0, 3) == 5
    append(psm, log, 2, 0, 3, 2)
    psm2, log2 = ProducerStateManager(), []
    append(psm2, log2, 2, 0, MAX_SEQUENCE - 1, 4)  # spans the wrap: MAX-1, MAX, 0, 1
    assert psm2.check(2, 0, MAX_SEQUENCE - 1, 4) == 0  # duplicate across the wrap
    assert psm2.check(2, 0, 2, 1) is None
    assert error_of(psm2.check, 2, 0, MAX_SEQUENCE, 1) is not None


def test_pipelined_batches_are_checked_against_pending_ones() -> None:
    psm = ProducerStateManager()
    for seq in range(0, 5):
        assert psm.check(5, 0, seq, 1) is None  # five in flight, none durable yet
    # a retry of an in-flight batch cannot be answered yet: retriable error
    assert error_of(psm.check, 5, 0, 2, 1) == ErrorCode.request_timed_out
    for seq in range(0, 5):
        psm.record(5, 0, seq, 1, 100 + seq, 1)
    assert psm.check(5, 0, 2, 1) == 102


def test_discard_lets_a_failed_append_be_retried() -> None:
    psm = ProducerStateManager()
    assert psm.check(5, 0, 0, 4) is None
    psm.discard(5, 0, 0, 4)
    # the producer stays known: a later batch may not overtake the failed one
    assert error_of(psm.check, 5, 0, 4, 1) == ErrorCode.out_of_order_sequence_number
    assert psm.check(5, 0, 0, 4) is None
    psm.record(5, 0, 0, 4, 10, 1)
    assert psm.check(5, 0, 4, 1) is None
    psm.discard(5, 0, 4, 1)
    assert psm.check(5, 0, 4, 1) is None  # the sequence after the durable batch again


def test_non_idempotent_batches_skip_everything() -> None:
    psm = ProducerStateManager()
    assert psm.check(-1, -1, -1, 10) is None
    psm.record(-1, -1, -1, 10, 0, 0)
    assert len(psm) == 0


@pytest.mark.parametrize("args", [(1, 0, -1, 1), (1, -1, 0, 1), (1, 0, 0, 0)])
def test_hostile_producer_fields_are_invalid_record(args) -> None:
    assert error_of(ProducerStateManager().check, *args) == ErrorCode.invalid_record


def test_rebuild_restores_duplicates_and_sequences() -> None:
    psm, log = ProducerStateManager(), []
    entries = []
    for seq in range(0, 8):
        base = append(psm, log, 3, 1, seq * 2, 2, ts=seq)
        entries.append((3, 1, seq * 2, 2, base, seq))
    entries.append((-1, -1, -1, 4, 16, 9))  # plain batches in between are ignored
    fresh = ProducerStateManager()
    fresh.rebuild(entries)
    assert fresh.check(3, 1, 14, 2) == 14
    assert fresh.check(3, 1, 6, 2) == 6  # 5th newest
    assert error_of(fresh.check, 3, 1, 4, 2) == ErrorCode.out_of_order_sequence_number
    assert fresh.check(3, 1, 16, 1) is None


def test_expire_forgets_idle_producers_only() -> None:
    psm = ProducerStateManager(producer_id_expiration_ms=1000)
    psm.check(1, 0, 0, 1)
    psm.record(1, 0, 0, 1, 0, 100)
    psm.check(2, 0, 0, 1)
    psm.record(2, 0, 0, 1, 1, 900)
    psm.check(3, 0, 0, 1)  # pending: never expired while in flight
    assert psm.expire(1500) == [1]
    assert psm.entry(1) is None and psm.entry(2) is not None and psm.entry(3) is not None
    # an expired producer is unknown again: any sequence is accepted
    assert psm.check(1, 0, 77, 1) is None


def test_record_expires_idle_producers_lazily(monkeypatch) -> None:
    import automq.broker.kafka.producers as producers

    monkeypatch.setattr(producers, "EXPIRE_CHECK_EVERY", 3)
    now = [10_000]
    psm = ProducerStateManager(producer_id_expiration_ms=1_000, clock=lambda: now[0])
    psm.check(1, 0, 0, 1)
    psm.record(1, 0, 0, 1, 0, 1_000)  # idle since t=1000
    now[0] = 10_000
    for seq in range(3):
        psm.check(2, 0, seq, 1)
        psm.record(2, 0, seq, 1, seq + 1, 9_900)
    assert psm.entry(1) is None and psm.entry(2) is not None


def test_producer_ids_are_unique_across_nodes_and_epochs() -> None:
    seen = set()
    for node_id in (0, 1, 2**16 - 1):
        for epoch in (0, 1, 2**23 - 1):
            alloc = ProducerIdAllocator(node_id, epoch)
            for _ in range(3):
                pid = alloc.next_id()
                assert 0 <= pid < 2**63
                seen.add(pid)
    assert len(seen) == 3 * 3 * 3
    with pytest.raises(ValueError, match="node_id"):
        ProducerIdAllocator(2**16, 0)
    with pytest.raises(ValueError, match="node_epoch"):
        ProducerIdAllocator(0, 2**23)
    alloc = ProducerIdAllocator(0, 0)
    alloc._counter = iter([2**24])  # the last id of the epoch was handed out
    with pytest.raises(ProducerIdExhaustedError):
        alloc.next_id()


# ---- property tests ------------------------------------------------------------------------


class Model:
    """Kafka's rules restated over the full history of accepted batches (no bounded deque)."""

    def __init__(self) -> None:
        self.state: dict[int, tuple[int, list[tuple[int, int, int]]]] = {}  # pid -> (epoch, [(first, last, offset)])

    def apply(self, pid: int, epoch: int, seq: int, count: int, next_offset: int):
        last = (seq + count - 1) % 2**31
        if pid not in self.state:
            self.state[pid] = (epoch, [(seq, last, next_offset)])
            return "new"
        cur_epoch, hist = self.state[pid]
        if epoch == cur_epoch:
            for first, lst, off in hist[-5:]:
                if (first, lst) == (seq, last):
                    return ("dup", off)
        if epoch < cur_epoch:
            return ErrorCode.invalid_producer_epoch
        if epoch > cur_epoch:
            if seq != 0:
                return ErrorCode.out_of_order_sequence_number
            self.state[pid] = (epoch, [(seq, last, next_offset)])
            return "new"
        expected = (hist[-1][1] + 1) % 2**31
        if seq != expected:
            return ErrorCode.out_of_order_sequence_number
        hist.append((seq, last, next_offset))
        return "new"


ops = st.lists(
    st.tuples(
        st.integers(0, 2),  # producer id
        st.integers(0, 3),  # epoch
        st.one_of(st.integers(0, 40), st.integers(MAX_SEQUENCE - 5, MAX_SEQUENCE)),  # base sequence
        st.integers(1, 4),  # record count
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_random_batches_match_the_model(batches) -> None:
    psm, model, next_offset = ProducerStateManager(), Model(), 0
    for pid, epoch, seq, count in batches:
        expected = model.apply(pid, epoch, seq, count, next_offset)
        try:
            got = psm.check(pid, epoch, seq, count)
        except ProducerStateError as exc:
            got = exc.error_code
        else:
            if got is None:
                psm.record(pid, epoch, seq, count, next_offset, 0)
                next_offset += count
                got = "new"
            else:
                got = ("dup", got)
        assert got == expected, (pid, epoch, seq, count)


@st.composite
def client_runs(draw):
    """A client sending batches with up to 5 in flight; the network duplicates, reorders and
    drops requests and responses, appends sometimes fail, and the client retries."""
    counts = draw(st.lists(st.integers(1, 5), min_size=1, max_size=30))
    start = draw(st.one_of(st.just(0), st.integers(MAX_SEQUENCE - 20, MAX_SEQUENCE)))
    steps = draw(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=300))
    return counts, start, steps


@settings(max_examples=300, deadline=None)
@given(client_runs())
def test_retries_duplicates_and_reordering_never_duplicate_or_reorder_the_log(run) -> None:
    counts, start, steps = run
    seqs, s = [], start
    for c in counts:
        seqs.append(s)
        s = sequence_after(s, c)
    psm = ProducerStateManager()
    log: list[int] = []  # batch indexes in the order they were appended
    acked: dict[int, int] = {}
    pending: list[tuple[int, int]] = []  # (batch index, reserved offset) accepted, not durable
    next_to_send, end_offset = 0, 0

    def send(i: int) -> None:
        nonlocal end_offset
        try:
            dup = psm.check(7, 0, seqs[i], counts[i])
        except ProducerStateError:
            return  # the client will retry it later
        if dup is not None:
            assert log[[o for o, _ in offsets_of()].index(dup)] == i, "duplicate answered with another batch's offset"
            acked[i] = dup
            return
        pending.append((i, end_offset))
        log.append(i)
        end_offset += counts[i]

    def offsets_of():
        out, off = [], 0
        for idx in log:
            out.append((off, idx))
            off += counts[idx]
        return out

    for action, k in steps:
        in_flight = [i for i in range(next_to_send) if i not in acked]
        if action == 0 and next_to_send < len(counts) and len(in_flight) < 5:
            send(next_to_send)
            next_to_send += 1
        elif action == 1 and in_flight:
            send(in_flight[k % len(in_flight)])  # a retry (or a duplicated request)
        elif action == 2 and pending:
            i, off = pending.pop(0)  # WAL syncs complete in order
            psm.record(7, 0, seqs[i], counts[i], off, 0)
            acked[i] = off
        elif action == 3 and pending:
            # the WAL failed: this and every later pending append fail (the stream is broken)
            for i, _ in reversed(pending):
                psm.discard(7, 0, seqs[i], counts[i])
                log.remove(i)
            end_offset = sum(counts[i] for i in log)
            pending.clear()
        elif action == 4 and acked:
            send(sorted(acked)[k % len(acked)])  # a late duplicate of something acknowledged
    assert len(log) == len(set(log)), "a batch was appended twice"
    assert log == sorted(log), "batches were appended out of order"
    assert log == list(range(len(log))), "a batch was skipped"
