"""The share-partition state machine: acquisition, locks, acknowledgements, delivery counts."""

from __future__ import annotations

import random

import pytest

from automq.broker.kafka.share.partition_state import (
    ACCEPT,
    ACKNOWLEDGED,
    ACQUIRED,
    ARCHIVED,
    AVAILABLE,
    GAP,
    REJECT,
    RELEASE,
    RENEW,
    InvalidAcknowledgement,
    InvalidRecordState,
    SharePartitionState,
)

LOCK = 30_000
LIMIT = 5


def _acquire(s: SharePartitionState, member: str, read_end: int, max_records: int = 500, now: int = 0):
    return s.acquire(member, read_end, max_records, 2000, LOCK, now)


def test_acquire_new_records_as_one_range_and_accept_moves_the_start():
    s = SharePartitionState(10)
    assert s.first_acquirable(high_watermark=20, max_locks=2000) == 10
    assert _acquire(s, "a", 20) == [(10, 19, 1)]
    assert len(s.ranges) == 1 and s.ranges[0].state == ACQUIRED
    assert s.first_acquirable(20, 2000) is None  # everything is locked
    s.acknowledge("a", 10, 19, [ACCEPT], LIMIT, LOCK, 1)
    assert (s.start_offset, s.end_offset, s.ranges) == (20, 20, [])


def test_max_records_and_max_locks_bound_an_acquisition():
    s = SharePartitionState(0)
    assert _acquire(s, "a", 100, max_records=30) == [(0, 29, 1)]
    assert s.acquire("b", 100, 500, 50, LOCK, 0) == [(30, 49, 1)]  # 50 in flight at most
    assert s.first_acquirable(100, 50) is None


def test_partial_acknowledgement_splits_and_release_redelivers_with_a_higher_count():
    s = SharePartitionState(0)
    _acquire(s, "a", 10)
    s.acknowledge(
        "a", 0, 9, [ACCEPT, ACCEPT, RELEASE, ACCEPT, REJECT, ACCEPT, ACCEPT, ACCEPT, GAP, ACCEPT], LIMIT, LOCK, 1
    )
    assert s.start_offset == 2
    assert [(r.first, r.last, r.state) for r in s.ranges] == [
        (2, 2, AVAILABLE),
        (3, 3, ACKNOWLEDGED),
        (4, 4, ARCHIVED),
        (5, 7, ACKNOWLEDGED),
        (8, 8, ARCHIVED),  # a gap: no record at that offset
        (9, 9, ACKNOWLEDGED),
    ]
    assert s.first_acquirable(10, 2000) == 2
    assert _acquire(s, "b", 10) == [(2, 2, 2)]
    s.acknowledge("b", 2, 2, [ACCEPT], LIMIT, LOCK, 2)
    assert (s.start_offset, s.ranges) == (10, [])


def test_acknowledging_what_this_member_does_not_hold_is_invalid_record_state():
    s = SharePartitionState(0)
    _acquire(s, "a", 10)
    with pytest.raises(InvalidRecordState):
        s.acknowledge("b", 0, 3, [ACCEPT], LIMIT, LOCK, 1)  # another member's lock
    with pytest.raises(InvalidRecordState):
        s.acknowledge("a", 5, 12, [ACCEPT], LIMIT, LOCK, 1)  # beyond what was delivered
    s.acknowledge("a", 0, 4, [ACCEPT], LIMIT, LOCK, 1)
    with pytest.raises(InvalidRecordState):
        s.acknowledge("a", 0, 0, [ACCEPT], LIMIT, LOCK, 1)  # twice
    # all or nothing: the held part of a rejected batch stays acquired
    with pytest.raises(InvalidRecordState):
        s.acknowledge("a", 3, 9, [ACCEPT], LIMIT, LOCK, 1)
    assert s.count(ACQUIRED) == 5


def test_malformed_batches_are_invalid_requests():
    s = SharePartitionState(0)
    _acquire(s, "a", 10)
    for first, last, types in [(5, 4, [ACCEPT]), (0, 3, [ACCEPT, ACCEPT]), (0, 1, []), (0, 0, [9]), (-1, 0, [1])]:
        with pytest.raises(InvalidAcknowledgement):
            s.acknowledge("a", first, last, types, LIMIT, LOCK, 1)


def test_lock_expiry_makes_records_available_and_the_limit_archives_a_poison_record():
    s = SharePartitionState(0)
    for delivery in range(1, LIMIT + 1):
        assert s.first_acquirable(1, 2000) == 0
        assert _acquire(s, f"m{delivery}", 1, now=delivery * 100_000) == [(0, 0, delivery)]
        assert s.next_deadline() == delivery * 100_000 + LOCK
        assert s.expire(delivery * 100_000 + LOCK - 1, LIMIT) == 0
        assert s.expire(delivery * 100_000 + LOCK, LIMIT) == 1
    # five deliveries and five expiries: archived, the start moves past it
    assert (s.start_offset, s.ranges) == (1, [])
    assert s.first_acquirable(1, 2000) is None


def test_renew_extends_a_lock():
    s = SharePartitionState(0)
    _acquire(s, "a", 4, now=0)
    s.acknowledge("a", 0, 3, [RENEW], LIMIT, LOCK, 20_000)
    assert s.expire(LOCK, LIMIT) == 0
    assert s.expire(20_000 + LOCK, LIMIT) == 4


def test_release_member_frees_only_its_records():
    s = SharePartitionState(0)
    _acquire(s, "a", 5)
    _acquire(s, "b", 10)
    assert s.release_member("a", LIMIT) == 5
    assert s.first_acquirable(10, 2000) == 0
    assert _acquire(s, "c", 10) == [(0, 4, 2)]


def test_durable_ranges_store_locks_as_available_and_restore_rebuilds_the_same_view():
    s = SharePartitionState(0)
    _acquire(s, "a", 10)
    s.acknowledge("a", 2, 9, [ACCEPT, RELEASE, ACCEPT, ACCEPT, REJECT, ACCEPT, ACCEPT, ACCEPT], LIMIT, LOCK, 1)
    durable = s.durable_ranges()
    assert durable == [
        (0, 1, AVAILABLE, 1),
        (2, 2, ACKNOWLEDGED, 1),
        (3, 3, AVAILABLE, 1),
        (4, 5, ACKNOWLEDGED, 1),
        (6, 6, ARCHIVED, 1),
        (7, 9, ACKNOWLEDGED, 1),
    ]
    r = SharePartitionState.restore(s.start_offset, durable)
    assert (r.start_offset, r.end_offset) == (0, 10)
    assert _acquire(r, "b", 10) == [(0, 1, 2), (3, 3, 2)]  # acknowledged ones are not redelivered


def test_move_start_drops_what_retention_removed():
    s = SharePartitionState(0)
    _acquire(s, "a", 10)
    s.move_start(4)
    assert (s.start_offset, s.ranges[0].first) == (4, 4)
    s.move_start(50)
    assert (s.start_offset, s.end_offset, s.ranges) == (50, 50, [])


def test_random_acknowledgements_never_deliver_an_acknowledged_record_again():
    """Model check: many members, random acks/releases/expiries; every offset is acknowledged
    at most once and, once acknowledged or archived, never acquired again."""
    rng = random.Random(7)
    s = SharePartitionState(0)
    done: set[int] = set()
    held: dict[str, list[int]] = {}
    hw = 0
    now = 0
    for _ in range(2000):
        now += rng.randint(0, 5000)
        hw += rng.randint(0, 20)
        op = rng.random()
        member = f"m{rng.randint(0, 4)}"
        if op < 0.4:
            start = s.first_acquirable(hw, 300)
            if start is None:
                continue
            for first, last, _count in s.acquire(member, hw, rng.randint(1, 60), 300, LOCK, now):
                for o in range(first, last + 1):
                    assert o not in done
                    held.setdefault(member, []).append(o)
        elif op < 0.8 and held.get(member):
            offsets = sorted(held.pop(member))
            o = offsets[0]
            types = [rng.choice([ACCEPT, ACCEPT, RELEASE, REJECT])]
            try:
                s.acknowledge(member, o, o, types, LIMIT, LOCK, now)
            except InvalidRecordState:
                continue  # its lock had expired
            if types[0] in (ACCEPT, REJECT):
                done.add(o)
            held[member] = offsets[1:]
        elif op < 0.9:
            s.expire(now, LIMIT)
        else:
            s.release_member(member, LIMIT)
            held.pop(member, None)
        # invariants: contiguous ranges covering [SPSO, SPEO)
        pos = s.start_offset
        for r in s.ranges:
            assert r.first == pos and r.last >= r.first
            pos = r.last + 1
        assert pos == s.end_offset
        assert not s.ranges or s.ranges[0].state not in (ACKNOWLEDGED, ARCHIVED)
