"""Leader election between operator replicas (automq.operator.leadership) against kmock, whose
test emulator answers stale writes with 409 as the API server does. Time is each candidate's
own clock, moved by the test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import kmock
import pytest

from automq.operator.kube import KubeApi
from automq.operator.leadership import LeaderElection

NS = "automq-system"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def url(emulator_class: type) -> AsyncIterator[str]:
    emulator = emulator_class()
    emulator.resources.load_bundled()
    async with kmock.Server(emulator) as server:
        yield str(server.url)


async def candidates(url: str, *names: str) -> tuple[list[LeaderElection], Clock]:
    clock = Clock()
    return [
        LeaderElection(
            api=KubeApi(url),
            namespace=NS,
            identity=name,
            lease_duration_s=15,
            renew_deadline_s=10,
            retry_period_s=2,
            clock=clock,
        )
        for name in names
    ], clock


async def close(*elections: LeaderElection) -> None:
    for e in elections:
        await e.api.close()


async def test_one_leader_then_a_takeover_only_after_the_lease_expires(url: str) -> None:
    (a, b), clock = await candidates(url, "op-a", "op-b")
    assert await a.try_acquire_or_renew() and a.is_leader()
    assert not await b.try_acquire_or_renew() and not b.is_leader()
    lease = await a.api.get("Lease", NS, "automq-operator")
    assert lease is not None and lease["spec"]["holderIdentity"] == "op-a"
    assert lease["spec"]["leaseDurationSeconds"] == 15

    # a renews while it lives: b keeps seeing a changing record and never takes over.
    for _ in range(10):
        clock.t += 2
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
    assert a.is_leader() and not b.is_leader()

    # a stops renewing (cut off, or hung): it stops counting itself leader after the renew
    # deadline, before b may take over (a whole lease duration without a change).
    clock.t += 10
    assert not a.is_leader()
    assert not await b.try_acquire_or_renew()  # 10 s without a change < 15 s
    clock.t += 5
    assert await b.try_acquire_or_renew() and b.is_leader()
    lease = await b.api.get("Lease", NS, "automq-operator")
    assert lease["spec"]["holderIdentity"] == "op-b" and lease["spec"]["leaseTransitions"] == 1

    # a comes back: it sees b holding a live lease and stays a follower.
    assert not await a.try_acquire_or_renew() and not a.is_leader()
    await close(a, b)


async def test_a_released_lease_is_taken_at_once(url: str) -> None:
    (a, b), _ = await candidates(url, "op-a", "op-b")
    await a.try_acquire_or_renew()
    a._notify()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert not a.is_leader()
    lease = await b.api.get("Lease", NS, "automq-operator")
    assert not lease["spec"].get("holderIdentity")
    assert await b.try_acquire_or_renew() and b.is_leader()
    await close(a, b)


async def test_concurrent_candidates_never_both_win(url: str) -> None:
    # Creation: the API server's create admits one.
    elections, clock = await candidates(url, "op-a", "op-b", "op-c")
    won = await asyncio.gather(*(e.try_acquire_or_renew() for e in elections))
    assert sum(won) == 1, won
    # Takeover of an expired lease: every candidate read the same resourceVersion; the first
    # write wins, the others get 409.
    leader = elections[won.index(True)]
    others = [e for e in elections if e is not leader]
    for e in others:
        await e.try_acquire_or_renew()  # observe the record
    clock.t += 16
    won = await asyncio.gather(*(e.try_acquire_or_renew() for e in others))
    assert sum(won) == 1, won
    assert sum(e.is_leader() for e in elections) == 1
    await close(*elections)


async def test_a_renewal_racing_a_stale_takeover_keeps_one_leader(url: str) -> None:
    (a, b), clock = await candidates(url, "op-a", "op-b")
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    clock.t += 16  # b believes the lease expired (a's renewals did not reach it)...
    stale = await b.api.get("Lease", NS, "automq-operator")
    await a.try_acquire_or_renew()  # ... but a renews first
    real_get = b.api.get

    async def old_read(kind: str, namespace: str, name: str) -> dict | None:
        return stale if kind == "Lease" else await real_get(kind, namespace, name)

    b.api.get = old_read  # type: ignore[method-assign]
    assert not await b.try_acquire_or_renew()  # its takeover carries the old resourceVersion: 409
    assert a.is_leader() and not b.is_leader()
    b.api.get = real_get  # type: ignore[method-assign]
    await close(a, b)


async def test_run_acquires_and_release_on_cancel(url: str) -> None:
    a = LeaderElection(
        api=KubeApi(url), namespace=NS, identity="op-a", retry_period_s=0.05, renew_deadline_s=1, lease_duration_s=2
    )
    task = asyncio.create_task(a.run())
    assert await asyncio.wait_for(a.wait_leading(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    lease = await a.api.get("Lease", NS, "automq-operator")
    assert not a.is_leader() and not lease["spec"].get("holderIdentity")
    await a.api.close()


def test_settings_must_leave_room_between_deadline_and_expiry() -> None:
    with pytest.raises(ValueError, match="renew deadline < lease duration"):
        LeaderElection(api=KubeApi("http://127.0.0.1:1"), namespace=NS, lease_duration_s=10, renew_deadline_s=10)


async def test_a_reconcile_pass_stops_between_steps_once_leadership_is_lost() -> None:
    from automq.operator.builders import ClusterRef
    from automq.operator.reconcile import Cluster, reconcile
    from automq.operator.spec import parse_spec

    leading = [True]
    ran: list[str] = []

    def step(name: str, lose: bool = False):
        async def run(c: Cluster) -> None:
            ran.append(name)
            if lose:
                leading[0] = False

        return run

    cluster = Cluster(
        api=KubeApi("http://127.0.0.1:1"),  # never called: no status is written once not leading
        ref=ClusterRef("demo", "ns", "uid"),
        spec=parse_spec({"objectStore": {"bucket": "bkt"}}),
        raw_spec={},
        generation=1,
        previous_status={},
        reporter=None,  # type: ignore[arg-type]
        controller_api_factory=None,  # type: ignore[arg-type]
        may_act=lambda: leading[0],
    )
    await reconcile(cluster, (("a", step("a")), ("b", step("b", lose=True)), ("c", step("c"))))
    assert ran == ["a", "b"]
