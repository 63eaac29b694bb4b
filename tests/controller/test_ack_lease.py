"""The controller's side of the acknowledgement lease (storage/ack_lease.py): it grants leases
on registration and heartbeat, and issues no newer epoch of a node (re-registration, WAL
recovery claim) while a lease it granted may still run on the broker's clock."""

from __future__ import annotations

import pytest

from automq.broker.controller.client import ControllerClient
from automq.broker.controller.controller import MAX_ACK_LEASE_MS
from automq.broker.controller.protocol import Endpoint
from automq.broker.storage.ack_lease import AckLease
from automq.broker.storage.metadata import NodeFencedError

EP = [Endpoint("PLAINTEXT", "127.0.0.1", 9092)]
EP2 = [Endpoint("PLAINTEXT", "127.0.0.1", 9093)]


async def test_leases_are_granted_on_registration_and_renewed_by_heartbeats(client: ControllerClient) -> None:
    lease = AckLease(100_000)  # more than MAX_ACK_LEASE_MS (the fixture's session is 60 s): capped
    epoch = await client.register_broker(1, EP, None, lease=lease)
    assert lease.valid() and MAX_ACK_LEASE_MS / 1000 - 1 < lease.remaining() <= MAX_ACK_LEASE_MS / 1000
    short = AckLease(500)
    await client.heartbeat(1, epoch, lease=short)
    assert short.valid() and short.remaining() <= 0.5
    assert await client.register_broker(2, EP2, None) == 1  # no lease asked: none granted, no wait


async def test_a_re_registration_waits_until_the_old_incarnation_can_acknowledge_nothing(
    client: ControllerClient,
) -> None:
    old = AckLease(600)
    e1 = await client.register_broker(1, EP, None, lease=old)
    await client.heartbeat(1, e1, lease=old)
    assert old.valid()
    # The replacement (same node id, the same WAL volume): its epoch, and so its WAL recovery,
    # only once the old incarnation's lease ran out, counted on the old incarnation's clock.
    e2 = await client.register_broker(1, EP, None)
    assert e2 == e1 + 1
    assert not old.valid()
    with pytest.raises(NodeFencedError):  # its next heartbeat tells the old one it was fenced
        await client.heartbeat(1, e1, lease=old)
    assert not old.valid()


async def test_a_graceful_unregistration_ends_the_lease_at_once(client: ControllerClient) -> None:
    lease = AckLease(30_000)
    e1 = await client.register_broker(1, EP, None, lease=lease)
    await client.unregister_broker(1, e1)  # sent after its WAL and listeners closed
    assert await client.register_broker(1, EP, None) == e1 + 1
    assert lease.valid()  # no wait: the registration came back long before the 30 s


async def test_a_wal_recovery_claim_waits_for_the_fenced_node_s_lease(client: ControllerClient) -> None:
    zombie = AckLease(600)
    e1 = await client.register_broker(1, EP, None, lease=zombie)
    e2 = await client.register_broker(2, EP2, None)
    topic = await client.create_topic("t", 2, {})
    mine = next(p for p in topic.partitions if p.leader == 1)
    await client.open_stream(mine.stream_id, mine.leader_epoch, 1, e1)
    await client.heartbeat(1, e1, lease=zombie)
    await client.fence_broker(1)  # the operator: its node is lost
    (job,) = await client.list_wal_recovery_jobs()
    assert zombie.valid()  # fenced, but a frozen process could still acknowledge until it runs out
    recovery_epoch = await client.claim_wal_recovery(job.job_id, 2, e2)
    assert recovery_epoch > e1
    assert not zombie.valid()
