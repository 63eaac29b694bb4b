"""Client quota arithmetic without a socket: Kafka's sampled rate, throttle times, precedence
and sharing per entity, and the step timer behind request_percentage (a fake clock: no
timing in these tests)."""

from __future__ import annotations

import asyncio

import pytest

from automq.broker.config import KafkaConfig
from automq.broker.controller.quotas import ClientQuota
from automq.broker.kafka import quotas as q


def manager(*entries: tuple[tuple, dict], window_s: int = 1, num: int = 11) -> q.ClientQuotas:
    m = q.ClientQuotas(KafkaConfig(quota_window_num=num, quota_window_size_seconds=window_s))
    m.update(tuple(ClientQuota(e, v) for e, v in entries))
    return m


def test_inactive_without_client_quotas() -> None:
    assert not manager().active
    assert not manager(((("ip", "10.0.0.1"),), {"connection_creation_rate": 5.0})).active
    m = manager(((("client-id", "c"),), {"producer_byte_rate": 1000.0}))
    assert m.active and not m.request_quotas
    assert m.record(q.PRODUCE, "ANONYMOUS", "other", 10**9, now=0.0) == 0  # no quota applies


def test_throttle_is_kafkas_formula_and_capped() -> None:
    m = manager(((("client-id", "c"),), {"producer_byte_rate": 1000.0}))
    # 10 windows of 1 s are the minimum elapsed time: 10_000 bytes at once is exactly the quota
    assert m.record(q.PRODUCE, "u", "c", 10_000, now=100.0) == 0
    # 20_000 bytes over 10 s = 2000 B/s, twice the quota: (2000-1000)/1000 x 10 s = 10 s
    assert m.record(q.PRODUCE, "u", "c", 10_000, now=100.0) == 10_000
    # far over: capped at the whole window (11 samples x 1 s)
    assert m.record(q.PRODUCE, "u", "c", 10**7, now=100.0) == 11_000
    assert m.throttled.labels(q.PRODUCE)._value.get() == 2


def test_rate_forgets_old_samples() -> None:
    m = manager(((("client-id", "c"),), {"consumer_byte_rate": 100.0}), num=2)
    assert m.record(q.FETCH, "u", "c", 1_000, now=0.0) > 0
    # two windows later the burst has left the samples
    assert m.record(q.FETCH, "u", "c", 50, now=10.0) == 0


def test_connections_of_one_entity_share_the_rate_and_precedence_applies() -> None:
    m = manager(
        ((("user", "alice"),), {"producer_byte_rate": 1000.0}),
        ((("client-id", "c1"), ("user", "alice")), {"producer_byte_rate": 100_000.0}),
    )
    # alice's other clients share the user quota; alice with c1 has its own, larger one
    assert m.record(q.PRODUCE, "alice", "c2", 6_000, now=0.0) == 0
    assert m.record(q.PRODUCE, "alice", "c3", 6_000, now=0.0) > 0
    assert m.record(q.PRODUCE, "alice", "c1", 12_000, now=0.0) == 0
    assert m.record(q.PRODUCE, "bob", "c3", 10**6, now=0.0) == 0


def test_quota_changes_take_effect() -> None:
    m = manager(((("client-id", "c"),), {"producer_byte_rate": 1000.0}))
    assert m.record(q.PRODUCE, "u", "c", 50_000, now=0.0) > 0
    m.update((ClientQuota((("client-id", "c"),), {"producer_byte_rate": 10_000_000.0}),))
    assert m.record(q.PRODUCE, "u", "c", 50_000, now=0.0) == 0
    m.update(())
    assert not m.active


def test_old_request_versions_are_throttled_by_the_broker() -> None:
    assert q.client_throttles(0, 9) and not q.client_throttles(0, 5)
    assert q.client_throttles(1, 8) and not q.client_throttles(1, 7)
    assert q.client_throttles(49, 0)


def test_timed_counts_steps_not_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(q.time, "perf_counter", lambda: clock[0])

    async def handler() -> str:
        clock[0] += 0.010  # work before the first await
        await asyncio.sleep(0)
        clock[0] += 0.005  # work after it
        return "done"

    async def main() -> tuple[str, float]:
        spent = [0.0]
        task = asyncio.ensure_future(q.timed(handler(), spent))
        await asyncio.sleep(0)
        clock[0] += 5.0  # time passing while the handler waits: not its cost
        return await task, spent[0]

    result, spent = asyncio.run(main())
    assert result == "done"
    assert spent == pytest.approx(0.015)


def test_timed_propagates_errors_and_cancellation() -> None:
    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    async def main() -> None:
        with pytest.raises(ValueError):
            await q.timed(failing(), [0.0])
        task = asyncio.ensure_future(q.timed(asyncio.sleep(10), [0.0]))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_controller_mutations_strict_and_permissive() -> None:
    m = manager(((("client-id", "c"),), {"controller_mutation_rate": 2.0}), num=2)
    # under the quota before the request: accepted, even when this one overshoots it
    assert m.mutate("u", "c", 30, strict=True, now=0.0) > 0
    # now over it: a strict (recent version) request is refused, with the throttle to wait
    assert m.mutate("u", "c", 1, strict=True, now=0.1) < 0
    # an old version is accepted and only throttled
    assert m.mutate("u", "c", 1, strict=False, now=0.1) > 0
    # once the burst left the window, accepted again
    assert m.mutate("u", "c", 1, strict=True, now=10.0) == 0
    assert manager().mutate("u", "c", 10**6, strict=True) == 0  # no quota


def test_connection_creation_rate_per_address() -> None:
    m = manager(
        ((("ip", None),), {"connection_creation_rate": 1.0}),
        ((("ip", "10.0.0.9"),), {"connection_creation_rate": 100.0}),
        num=2,
    )
    assert m.ip_active and not m.active  # no client quota: the request path stays untouched
    assert m.connection_allowed("10.0.0.1", now=0.0)
    assert not m.connection_allowed("10.0.0.1", now=0.1)  # over 1/s (window of at least 1 s)
    assert m.connection_allowed("10.0.0.2", now=0.1)  # the default applies to each address alone
    assert all(m.connection_allowed("10.0.0.9", now=0.1) for _ in range(50))  # its own, larger quota
    assert m.connection_allowed("10.0.0.1", now=10.0)  # later again
    assert manager().connection_allowed("10.0.0.1")
