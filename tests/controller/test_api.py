"""The controller API end to end: real HTTP server, real file:// object store, the client."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from automq.broker.controller import commands
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.protocol import (
    BrokerNotAvailableError,
    ClusterClient,
    ControllerUnavailableError,
    Endpoint,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTopicError,
    TopicExistsError,
    UnknownTopicError,
)
from automq.broker.storage.metadata import (
    CommitStreamSetObjectRequest,
    NodeFencedError,
    ObjectManager,
    ObjectNotPreparedError,
    ObjectStreamRange,
    ObjectType,
    OffsetMismatchError,
    StreamFencedError,
    StreamManager,
    StreamNotFoundError,
    StreamNotOpenError,
    StreamObject,
)

EP = [Endpoint("PLAINTEXT", "127.0.0.1", 9092)]


async def test_client_implements_the_three_contracts(client: ControllerClient) -> None:
    assert isinstance(client, StreamManager)
    assert isinstance(client, ObjectManager)
    assert isinstance(client, ClusterClient)


async def test_broker_lifecycle_and_topics(client: ControllerClient) -> None:
    e1 = await client.register_broker(1, EP, "a")
    e2 = await client.register_broker(2, [Endpoint("PLAINTEXT", "127.0.0.1", 9093)], "b")
    assert (e1, e2) == (1, 1)
    assert await client.register_broker(1, EP, "a") == 2  # re-registration bumps the epoch
    with pytest.raises(NodeFencedError):
        await client.heartbeat(1, 1)
    assert await client.heartbeat(1, 2) == "active"

    topic = await client.create_topic("orders", 4, {"retention.ms": "60000"})
    assert [p.partition for p in topic.partitions] == [0, 1, 2, 3]
    assert sorted(p.leader for p in topic.partitions) == [1, 1, 2, 2]  # spread evenly
    assert len({p.stream_id for p in topic.partitions}) == 4
    with pytest.raises(TopicExistsError):
        await client.create_topic("orders", 1, {})
    with pytest.raises(InvalidTopicError):
        await client.create_topic("bad/name", 1, {})
    with pytest.raises(InvalidPartitionsError):
        await client.create_topic("zero", 0, {})
    with pytest.raises(InvalidConfigError):
        await client.create_topic("cfg", 1, {"retention.ms": "soon"})
    with pytest.raises(InvalidConfigError):
        await client.create_topic("cfg", 1, {"no.such.key": "1"})

    grown = await client.create_partitions("orders", 6)
    assert len(grown.partitions) == 6
    with pytest.raises(InvalidPartitionsError):
        await client.create_partitions("orders", 6)
    await client.alter_topic_configs("orders", {"retention.ms": None, "cleanup.policy": "compact"})
    image = await client.watch_metadata(-1, 0)
    (orders,) = [t for t in image.topics if t.name == "orders"]
    assert orders.configs == {"cleanup.policy": "compact"}
    assert {b.node_id: b.node_epoch for b in image.brokers} == {1: 2, 2: 1}

    await client.delete_topic("orders")
    with pytest.raises(UnknownTopicError):
        await client.delete_topic("orders")
    with pytest.raises(UnknownTopicError):
        await client.alter_topic_configs("orders", {})
    image = await client.watch_metadata(-1, 0)
    assert image.topics == ()


async def test_watch_wakes_on_change(client: ControllerClient) -> None:
    image = await client.watch_metadata(-1, 0)
    waiter = asyncio.create_task(client.watch_metadata(image.version, 30_000))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await client.register_broker(7, EP, None)
    newer = await asyncio.wait_for(waiter, 10)  # long before the 30 s timeout
    assert newer.version > image.version
    assert [b.node_id for b in newer.brokers] == [7]
    # and times out with the same version when nothing changes
    same = await client.watch_metadata(newer.version, 50)
    assert same.version == newer.version


async def test_stream_open_commit_read_trim(client: ControllerClient) -> None:
    epoch = await client.register_broker(1, EP, None)
    topic = await client.create_topic("t", 1, {})
    p = topic.partitions[0]
    meta = await client.open_stream(p.stream_id, p.leader_epoch, 1, epoch)
    assert (meta.state, meta.owner_node_id, meta.end_offset) == ("open", 1, 0)
    assert meta.tags["topic"] == "t"

    first = await client.prepare_objects(3, 60_000)
    await client.commit_stream_set_object(
        CommitStreamSetObjectRequest(
            1,
            epoch,
            first,
            100,
            (ObjectStreamRange(p.stream_id, p.leader_epoch, 0, 10, 100),),
            (StreamObject(first + 1, 500, p.stream_id, 10, 60),),
        )
    )
    objs = await client.get_objects(p.stream_id, 0, -1, 10)
    assert [(o.object_id, o.object_type) for o in objs] == [
        (first, ObjectType.STREAM_SET),
        (first + 1, ObjectType.STREAM),
    ]
    assert objs[1].ranges[0].end_offset == 60
    assert [o.object_id for o in await client.get_objects(p.stream_id, 30, 40, 10)] == [first + 1]
    assert [o.object_id for o in await client.get_stream_set_objects(1)] == [first]
    assert await client.get_stream_set_objects(2) == []
    (sm,) = await client.get_streams([p.stream_id, 999])
    assert sm.end_offset == 60

    with pytest.raises(OffsetMismatchError):  # a gap
        await client.commit_stream_object(StreamObject(first + 2, 5, p.stream_id, 61, 70), 1, epoch)
    with pytest.raises(ObjectNotPreparedError):
        await client.commit_stream_object(StreamObject(first + 50, 5, p.stream_id, 60, 70), 1, epoch)
    with pytest.raises(StreamFencedError):  # not the partition's leader epoch
        await client.open_stream(p.stream_id, p.leader_epoch + 1, 1, epoch)
    with pytest.raises(StreamNotFoundError):
        await client.open_stream(12345, 0, 1, epoch)

    await client.trim_stream(p.stream_id, p.leader_epoch, 10, 1, epoch)
    assert [o.object_id for o in await client.get_objects(p.stream_id, 0, -1, 10)] == [first + 1]
    await client.close_stream(p.stream_id, p.leader_epoch, 1, epoch)
    await client.close_stream(p.stream_id, p.leader_epoch, 1, epoch)  # idempotent
    with pytest.raises(StreamNotOpenError):
        await client.commit_stream_object(StreamObject(first + 2, 5, p.stream_id, 60, 70), 1, epoch)

    # a plain (non-partition) stream, as the storage engine's own streams use
    sid = await client.create_stream({"kind": "internal"})
    opened = await client.open_stream(sid, 3, 1, epoch)
    assert opened.epoch == 3
    await client.delete_stream(sid, 3, 1, epoch)
    assert await client.get_streams([sid]) == []


async def test_zombie_broker_cannot_commit(client: ControllerClient) -> None:
    old = await client.register_broker(1, EP, None)
    p = (await client.create_topic("z", 1, {})).partitions[0]
    await client.open_stream(p.stream_id, p.leader_epoch, 1, old)
    new = await client.register_broker(1, EP, None)  # the broker restarted; the old process lives on
    oid = await client.prepare_objects(1, 60_000)
    req = CommitStreamSetObjectRequest(1, old, oid, 10, (ObjectStreamRange(p.stream_id, p.leader_epoch, 0, 5, 10),))
    with pytest.raises(NodeFencedError):
        await client.commit_stream_set_object(req)
    with pytest.raises(NodeFencedError):
        await client.trim_stream(p.stream_id, p.leader_epoch, 1, 1, old)
    # the new incarnation can, and a retry of the same commit is accepted once
    ok = CommitStreamSetObjectRequest(1, new, oid, 10, (ObjectStreamRange(p.stream_id, p.leader_epoch, 0, 5, 10),))
    await client.commit_stream_set_object(ok)
    await client.commit_stream_set_object(ok)
    assert (await client.get_streams([p.stream_id]))[0].end_offset == 5


async def test_drain_and_reassign(client: ControllerClient) -> None:
    e1 = await client.register_broker(1, EP, None)
    await client.register_broker(2, EP, None)
    topic = await client.create_topic("m", 2, {})
    on1 = next(p for p in topic.partitions if p.leader == 1)
    await client.open_stream(on1.stream_id, on1.leader_epoch, 1, e1)
    await client.reassign_partition("m", on1.partition, 2)
    image = await client.watch_metadata(-1, 0)
    moving = image.topics[0].partitions[on1.partition]
    assert (moving.state, moving.leader, moving.target) == ("moving", 1, 2)
    await client.close_stream(on1.stream_id, on1.leader_epoch, 1, e1)
    await client.partition_closed("m", on1.partition, 1, e1, on1.leader_epoch)
    image = await client.watch_metadata(-1, 0)
    moved = image.topics[0].partitions[on1.partition]
    assert (moved.state, moved.leader, moved.leader_epoch) == ("online", 2, on1.leader_epoch + 1)
    with pytest.raises(BrokerNotAvailableError):
        await client.reassign_partition("m", 0, 42)

    await client.drain_broker(2)
    assert await client.heartbeat(1, e1) == "active"
    image = await client.watch_metadata(-1, 0)
    assert {b.node_id: b.state for b in image.brokers}[2] == "draining"
    # every partition led by 2 is now moving off it
    assert all(not (p.leader == 2 and p.state == "online") for p in image.topics[0].partitions)
    with pytest.raises(BrokerNotAvailableError):
        await client.reassign_partition("m", 0, 2)  # a draining broker takes no partitions
    await client.undrain_broker(2)


async def test_hostile_http_bodies(service, client: ControllerClient) -> None:
    async with aiohttp.ClientSession() as http:
        for body in (
            b"not json",
            b"[]",
            b'{"node_id": "1", "endpoints": []}',
            b'{"node_id": -5, "endpoints": []}',
            b'{"node_id": 1, "endpoints": [], "extra": 1}',
            b'{"node_id": 99999999999, "endpoints": []}',
        ):
            async with http.post(f"{service.url}/v1/register_broker", data=body) as resp:
                assert resp.status == 400, body
                data = await resp.json()
                assert data["error"] == "INVALID_REQUEST"
        async with http.post(f"{service.url}/v1/no_such_method", data=b"{}") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"] == "INVALID_REQUEST"
        async with http.post(f"{service.url}/v1/prepare_objects", json={"count": 0, "ttl_ms": 10}) as resp:
            assert resp.status == 400
        async with http.get(f"{service.url}/readyz") as resp:
            assert resp.status == 200
        async with http.get(f"{service.url}/metrics") as resp:
            assert "automq_controller_log_append_seconds" in await resp.text()
    with pytest.raises(InvalidRequestError):
        await client.prepare_objects(0, 1000)
    with pytest.raises(InvalidRequestError):
        await client.call(
            "commit_stream_set_object",
            {"node_id": 1, "node_epoch": 1, "object_id": 0, "object_size": -1, "stream_ranges": []},
        )


async def test_unreachable_controllers_raise_unavailable() -> None:
    async with ControllerClient(["http://127.0.0.1:1"], retry_deadline_s=0.3) as c:
        with pytest.raises(ControllerUnavailableError):
            await c.heartbeat(1, 1)


async def test_group_commit_keeps_each_request_apart(service, client: ControllerClient) -> None:
    """Many concurrent requests share log entries; each still gets its own answer, and of
    racing commits at the same offset exactly one wins."""
    epoch = await client.register_broker(1, EP, None)
    sids = [await client.create_stream({"i": str(i)}) for i in range(20)]
    for sid in sids:
        await client.open_stream(sid, 0, 1, epoch)
    first = await client.prepare_objects(100, 60_000)
    seq_before = service.controller.state.last_seq

    def commit(oid: int, sid: int, start: int) -> CommitStreamSetObjectRequest:
        return CommitStreamSetObjectRequest(1, epoch, oid, 1, (ObjectStreamRange(sid, 0, start, start + 1, 1),))

    ok = [commit(first + i, sid, 0) for i, sid in enumerate(sids)]
    racing = [commit(first + 50 + i, sids[0], 1) for i in range(5)]  # all want offset 1 of stream 0
    results = await asyncio.gather(*(client.commit_stream_set_object(r) for r in ok + racing), return_exceptions=True)
    assert results[: len(ok)] == [None] * len(ok)
    outcomes = results[len(ok) :]
    assert sum(r is None for r in outcomes) == 1
    assert all(isinstance(r, OffsetMismatchError) for r in outcomes if r is not None)
    assert service.controller.state.last_seq > seq_before
    ends = {s.stream_id: s.end_offset for s in await client.get_streams(sids)}
    assert ends == {sid: (2 if sid == sids[0] else 1) for sid in sids}


async def test_queued_requests_share_one_log_entry(service) -> None:
    ctl = service.controller
    sizes: list[int] = []
    original = ctl._commit

    async def recording(batch):
        sizes.append(len(batch))
        await original(batch)

    ctl._commit = recording
    firsts = await asyncio.gather(*(ctl.execute(lambda tx: commands.prepare_objects(tx, 1, 1000)) for _ in range(30)))
    assert sorted(firsts) == list(range(min(firsts), min(firsts) + 30))  # each got its own id
    assert max(sizes) >= 30  # all queued before the leader looked: one entry for all of them
