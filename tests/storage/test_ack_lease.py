"""The acknowledgement lease (storage/ack_lease.py): a broker answers appends and fetches only
while the controller vouches for it; expired it waits for a renewal, revoked (fenced) it fails
them, though the WAL took the record."""

from __future__ import annotations

import asyncio

import pytest

from automq.broker.storage.ack_lease import AckLease, LeaseRevokedError
from automq.broker.storage.api import StreamClosedError


async def until(check, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_runs_from_the_send_time_for_what_was_granted():
    clock = Clock()
    lease = AckLease(3000, clock=clock)
    assert not lease.valid()  # nothing granted yet
    sent = clock.now
    clock.now += 0.5  # the answer came back half a second later
    lease.grant(sent, 2000)  # the controller granted less than asked
    assert lease.valid() and lease.remaining() == pytest.approx(1.5)
    clock.now = sent + 1.999
    assert lease.valid()
    clock.now = sent + 2.0
    assert not lease.valid()
    lease.grant(sent, 1000)  # an older, shorter grant never shortens or renews it
    assert not lease.valid()
    lease.grant(clock.now, 0)  # a controller that grants none
    assert not lease.valid()


def test_a_revoked_lease_stays_revoked():
    clock = Clock()
    lease = AckLease(3000, clock=clock)
    lease.grant(clock.now, 3000)
    lease.revoke("node 1 epoch 1 was fenced")
    assert not lease.valid() and lease.remaining() == 0.0 and lease.revoked == "node 1 epoch 1 was fenced"
    lease.grant(clock.now, 3000)
    assert not lease.valid()


def test_a_lease_asks_for_a_positive_duration():
    with pytest.raises(ValueError, match="positive"):
        AckLease(0)


async def test_hold_waits_for_a_renewal_or_fails_on_a_revoke():
    clock = Clock()
    lease = AckLease(3000, clock=clock)
    waiting = asyncio.ensure_future(lease.hold())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    lease.grant(clock.now, 3000)
    await asyncio.wait_for(waiting, 5)
    clock.now += 5
    failing = asyncio.ensure_future(lease.hold())
    await asyncio.sleep(0.01)
    assert not failing.done()
    lease.revoke("fenced")
    with pytest.raises(LeaseRevokedError, match="fenced"):
        await asyncio.wait_for(failing, 5)


async def leased_stream(engines):
    """An engine under a lease (valid now, on a clock the test moves) and one open stream."""
    engine = await engines.start()
    clock = Clock()
    engine.ack_lease = lease = AckLease(3000, clock=clock)
    stream = await engine.open_stream(await engine.create_stream(), 0)
    lease.grant(clock.now, 3000)
    return clock, lease, stream


async def test_an_engine_holds_acknowledgements_while_its_lease_is_expired(engines):
    clock, lease, stream = await leased_stream(engines)
    assert await stream.append(b"a" * 100, 1) == 0  # valid: answered at once
    clock.now += 3  # a freeze outlived the lease
    append = asyncio.ensure_future(stream.append(b"b" * 100, 1))
    await until(lambda: stream.confirm_offset == 2)  # durable in the WAL ...
    fetch = asyncio.ensure_future(stream.fetch(0, 2, 1 << 20))
    await asyncio.sleep(0.05)
    assert not append.done() and not fetch.done()  # ... but neither answered
    lease.grant(clock.now, 3000)  # the next heartbeat renewed it
    assert await asyncio.wait_for(append, 5) == 1
    assert [b.base_offset for b in (await asyncio.wait_for(fetch, 5)).batches] == [0, 1]


async def test_a_fenced_engine_answers_nothing_it_wrote_after_its_lease_ran_out(engines):
    clock, lease, stream = await leased_stream(engines)
    await stream.append(b"a" * 100, 1)
    clock.now += 10
    append = asyncio.ensure_future(stream.append(b"b" * 100, 1))
    await until(lambda: stream.confirm_offset == 2)
    fetch = asyncio.ensure_future(stream.fetch(0, 2, 1 << 20))
    await asyncio.sleep(0.05)
    assert not append.done() and not fetch.done()
    lease.revoke("node 1 epoch 1 is not current (2)")  # the heartbeat said fenced
    with pytest.raises(StreamClosedError, match="fenced before the append"):
        await asyncio.wait_for(append, 5)
    with pytest.raises(StreamClosedError, match="fenced"):
        await asyncio.wait_for(fetch, 5)
    with pytest.raises(StreamClosedError):
        await stream.append(b"c" * 100, 1)  # the stream stays fenced
