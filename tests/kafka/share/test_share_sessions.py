"""The share-session cache: keyed by (group, member), bounded, idle sessions evicted."""

from __future__ import annotations

from automq.broker.kafka.share import sessions as mod
from automq.broker.kafka.share.sessions import ShareSessionCache


def test_sessions_are_per_member_bounded_and_idle_ones_make_room(monkeypatch):
    cache = ShareSessionCache(max_sessions=2)
    a, _ = cache.create("g", "a")
    b, _ = cache.create("g", "b")
    assert a is not None and b is not None and cache.get("g", "a") is a
    assert cache.create("g", "c") == (None, None)  # full of live sessions: SHARE_SESSION_LIMIT_REACHED
    again, evicted = cache.create("g", "a")  # reopening replaces, never needs room
    assert again is not None and again is not a and again.epoch == 1 and evicted is None
    clock = [1000.0]
    monkeypatch.setattr(mod.time, "monotonic", lambda: clock[0])
    b.last_used = clock[0]
    again.last_used = clock[0]
    clock[0] += mod.EVICT_AFTER_S + 1
    cache.get("g", "a")  # used recently, so b is the least recently used
    c, evicted = cache.create("g", "c")
    assert c is not None and evicted is b and cache.get("g", "b") is None
    for _ in range(3):
        c.next_epoch()
    assert c.epoch == 4
    c.epoch = 0x7FFFFFFF
    c.next_epoch()
    assert c.epoch == 1  # wraps to 1, never 0 (open) or -1 (close)
