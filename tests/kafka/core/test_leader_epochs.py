"""The leader-epoch history answers OffsetForLeaderEpoch as Kafka's leader-epoch cache does."""

import itertools

from hypothesis import given
from hypothesis import strategies as st

from automq.broker.kafka.leader_epochs import LeaderEpochHistory


def test_end_offset_of_each_epoch_is_the_start_of_the_next():
    h = LeaderEpochHistory([(0, 0), (2, 100), (5, 250)])
    assert h.end_offset_for(0, 400) == (0, 100)
    assert h.end_offset_for(2, 400) == (2, 250)
    assert h.end_offset_for(5, 400) == (5, 400)  # the latest epoch ends at the log end
    # an epoch that never led answers with the largest epoch below it and where that ended
    assert h.end_offset_for(1, 400) == (0, 100)
    assert h.end_offset_for(3, 400) == (2, 250)
    assert h.end_offset_for(4, 400) == (2, 250)


def test_unknown_newer_and_undefined_epochs_are_undefined():
    h = LeaderEpochHistory([(3, 10), (4, 20)])
    assert h.end_offset_for(5, 30) == (-1, -1)
    assert h.end_offset_for(-1, 30) == (-1, -1)
    assert LeaderEpochHistory().end_offset_for(0, 0) == (-1, -1)


def test_an_epoch_older_than_the_history_ends_where_the_history_starts():
    # Kafka: (requested epoch, start offset of the first known epoch)
    h = LeaderEpochHistory([(3, 10), (4, 20)])
    assert h.end_offset_for(1, 30) == (1, 10)


def test_epochs_without_records_leave_no_trace():
    h = LeaderEpochHistory()
    h.assign(0, 0)
    h.assign(1, 50)
    h.assign(2, 50)  # epoch 1 led but appended nothing
    h.assign(3, 50)
    assert h.entries == [(0, 0), (3, 50)]
    assert h.end_offset_for(1, 80) == (0, 50)
    assert h.end_offset_for(2, 80) == (0, 50)


def test_reassigning_the_same_epoch_is_a_no_op_and_older_epochs_are_superseded():
    h = LeaderEpochHistory([(0, 0), (1, 10)])
    h.assign(1, 15)  # the same leader reopening at a later offset keeps the epoch's start
    assert h.entries == [(0, 0), (1, 10)]
    h.assign(1, 5)  # a start before the known one replaces it (Kafka's cache does the same)
    assert h.entries == [(0, 0), (1, 5)]
    h.assign(-1, 3)  # undefined epochs are ignored
    assert h.entries == [(0, 0), (1, 5)]


def test_log_start_forgets_epochs_wholly_below_it():
    h = LeaderEpochHistory([(0, 0), (2, 100), (5, 250)])
    assert h.end_offset_for(0, 400, log_start_offset=150) == (0, 150)
    assert h.end_offset_for(2, 400, log_start_offset=150) == (2, 250)
    assert h.end_offset_for(1, 400, log_start_offset=300) == (1, 300)
    assert h.end_offset_for(5, 400, log_start_offset=300) == (5, 400)


def test_epoch_at_an_offset():
    h = LeaderEpochHistory([(1, 0), (4, 10), (6, 10), (7, 30)])
    assert h.entries == [(1, 0), (6, 10), (7, 30)]
    assert [h.epoch_at(o) for o in (0, 9, 10, 29, 30, 10_000)] == [1, 1, 6, 6, 7, 7]
    assert LeaderEpochHistory([(2, 5)]).epoch_at(4) == -1


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 200)), max_size=30), st.integers(-1, 25))
def test_answers_agree_with_a_brute_force_reading(assignments, requested):
    h = LeaderEpochHistory()
    for epoch, start in sorted(assignments):  # epochs grow, offsets may repeat
        h.assign(epoch, max(start, h.entries[-1][1] if h.entries else 0))
    entries = h.entries
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(entries))
    log_end = (entries[-1][1] if entries else 0) + 7
    epoch, end = h.end_offset_for(requested, log_end)
    if not entries or requested < 0 or requested > entries[-1][0]:
        assert (epoch, end) == (-1, -1)
    elif requested == entries[-1][0]:
        assert (epoch, end) == (requested, log_end)
    else:
        below = [e for e in entries if e[0] <= requested]
        above = [e for e in entries if e[0] > requested]
        assert end == above[0][1]
        assert epoch == (below[-1][0] if below else requested)
