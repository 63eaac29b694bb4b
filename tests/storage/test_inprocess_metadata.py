"""InProcessMetadata enforces every rule of the metadata contract, durably, and two
instances sharing a bucket (two processes) never both win a change."""

from __future__ import annotations

import asyncio

import pytest

from automq.broker.objectstore import open_object_store
from automq.broker.storage.inprocess import InProcessMetadata
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


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def url(request) -> str:
    return request.getfixturevalue("file_url" if request.param == "file" else "s3_url")


@pytest.fixture
async def store(url):
    s = open_object_store(url)
    yield s
    await s.close()


def commit(object_id: int, *ranges: tuple[int, int, int, int], node=(1, 0), objects=()) -> CommitStreamSetObjectRequest:
    return CommitStreamSetObjectRequest(
        node_id=node[0],
        node_epoch=node[1],
        object_id=object_id,
        object_size=100,
        stream_ranges=tuple(ObjectStreamRange(sid, ep, a, b, 10) for sid, ep, a, b in ranges),
        stream_objects=tuple(objects),
    )


async def test_implements_both_protocols(store):
    meta = InProcessMetadata(store)
    assert isinstance(meta, StreamManager) and isinstance(meta, ObjectManager)


async def test_stream_epochs_and_ownership(store):
    meta = InProcessMetadata(store)
    sid = await meta.create_stream({"topic": "t"})
    m = (await meta.get_streams([sid, 99]))[0]
    assert (m.epoch, m.start_offset, m.end_offset, m.state, m.tags) == (0, 0, 0, "closed", {"topic": "t"})
    await meta.open_stream(sid, 1, node_id=1, node_epoch=0)
    with pytest.raises(StreamFencedError):
        await meta.open_stream(sid, 0, node_id=2, node_epoch=0)
    with pytest.raises(StreamFencedError):  # same epoch, another node, still open
        await meta.open_stream(sid, 1, node_id=2, node_epoch=0)
    await meta.open_stream(sid, 2, node_id=2, node_epoch=0)  # a newer epoch takes over
    with pytest.raises(StreamFencedError):
        await meta.close_stream(sid, 1, node_id=1, node_epoch=0)
    with pytest.raises(StreamNotOpenError):
        await meta.trim_stream(sid, 2, 0, node_id=1, node_epoch=0)
    await meta.close_stream(sid, 2, node_id=2, node_epoch=0)
    await meta.close_stream(sid, 2, node_id=2, node_epoch=0)  # idempotent
    with pytest.raises(StreamNotFoundError):
        await meta.open_stream(12345, 0, node_id=1, node_epoch=0)


async def test_node_epochs_fence_zombies(store):
    meta = InProcessMetadata(store)
    sid = await meta.create_stream()
    assert await meta.register_node(1) == 0
    assert await meta.register_node(1) == 1
    with pytest.raises(NodeFencedError):
        await meta.open_stream(sid, 0, node_id=1, node_epoch=0)
    await meta.open_stream(sid, 0, node_id=1, node_epoch=1)
    oid = await meta.prepare_objects(1, 60_000)
    with pytest.raises(NodeFencedError):
        await meta.commit_stream_set_object(commit(oid, (sid, 0, 0, 5), node=(1, 0)))


async def test_commit_checks_offsets_epochs_and_prepared_ids(store):
    meta = InProcessMetadata(store)
    a, b = await meta.create_stream(), await meta.create_stream()
    await meta.open_stream(a, 0, 1, 0)
    await meta.open_stream(b, 0, 1, 0)
    first = await meta.prepare_objects(3, 60_000)
    with pytest.raises(OffsetMismatchError):  # does not start at the committed end (0)
        await meta.commit_stream_set_object(commit(first, (a, 0, 5, 10)))
    await meta.open_stream(a, 1, 2, 0)  # node 2 takes stream a over
    with pytest.raises(StreamFencedError):
        await meta.commit_stream_set_object(commit(first, (a, 0, 0, 10)))
    await meta.commit_stream_set_object(commit(first, (b, 0, 0, 10), objects=[StreamObject(first + 1, 500, b, 10, 30)]))
    assert [(m.stream_id, m.end_offset) for m in await meta.get_streams([b])] == [(b, 30)]
    with pytest.raises(ObjectNotPreparedError):  # committed already
        await meta.commit_stream_set_object(commit(first, (b, 0, 30, 40)))
    with pytest.raises(ObjectNotPreparedError):  # never prepared
        await meta.commit_stream_set_object(commit(first + 100, (b, 0, 30, 40)))
    objs = await meta.get_objects(b, 0, -1, 10)
    assert [(o.object_id, o.object_type) for o in objs] == [
        (first, ObjectType.STREAM_SET),
        (first + 1, ObjectType.STREAM),
    ]
    assert [o.object_id for o in await meta.get_objects(b, 12, 20, 10)] == [first + 1]
    assert [o.object_id for o in await meta.get_stream_set_objects(node_id=1)] == [first]


async def test_prepared_ids_expire_and_their_objects_are_deleted(store):
    meta = InProcessMetadata(store, gc_retention_ms=0)
    sid = await meta.create_stream()
    await meta.open_stream(sid, 0, 1, 0)
    oid = await meta.prepare_objects(1, 1)
    from automq.broker.storage.metadata import object_key

    await store.put(object_key(oid), b"orphan")
    await asyncio.sleep(0.01)
    with pytest.raises(ObjectNotPreparedError):
        await meta.commit_stream_set_object(commit(oid, (sid, 0, 0, 1)))
    await meta.create_stream()  # any later change sweeps
    await meta.create_stream()
    assert not await store.exists(object_key(oid))


async def test_trim_makes_objects_below_start_garbage(store):
    meta = InProcessMetadata(store, gc_retention_ms=0)
    sid = await meta.create_stream()
    await meta.open_stream(sid, 0, 1, 0)
    o1 = await meta.prepare_objects(1, 60_000)
    await meta.commit_stream_set_object(commit(o1, (sid, 0, 0, 10)))
    o2 = await meta.prepare_objects(1, 60_000)
    await meta.commit_stream_set_object(commit(o2, (sid, 0, 10, 20)))
    await meta.trim_stream(sid, 0, 12, 1, 0)
    await meta.trim_stream(sid, 0, 5, 1, 0)  # never backward
    assert (await meta.get_streams([sid]))[0].start_offset == 12
    assert [o.object_id for o in await meta.get_objects(sid, 0, -1, 10)] == [o2]


async def test_state_is_durable_and_two_instances_never_both_win(store, url):
    one = InProcessMetadata(store)
    other_store = open_object_store(url)
    two = InProcessMetadata(other_store)
    try:
        ids = await asyncio.gather(*(m.create_stream() for m in (one, two) for _ in range(5)))
        assert sorted(ids) == list(range(10))  # no id handed out twice
        sid = ids[0]
        await one.open_stream(sid, 5, node_id=1, node_epoch=0)
        with pytest.raises(StreamFencedError):  # `two` sees the winner's state before deciding
            await two.open_stream(sid, 4, node_id=2, node_epoch=0)
        fresh = InProcessMetadata(store)  # a restart reads the durable state
        m = (await fresh.get_streams([sid]))[0]
        assert (m.epoch, m.owner_node_id, m.state) == (5, 1, "open")
    finally:
        await other_store.close()


async def test_bad_arguments_are_rejected(store):
    meta = InProcessMetadata(store)
    with pytest.raises(ValueError, match="count"):
        await meta.prepare_objects(0, 1000)


async def test_compaction_commits_replace_objects(store):
    meta = InProcessMetadata(store, gc_retention_ms=0)
    sid = await meta.create_stream()
    await meta.open_stream(sid, 0, 1, 0)
    o1 = await meta.prepare_objects(1, 60_000)
    await meta.commit_stream_set_object(commit(o1, (sid, 0, 0, 10)))
    o2 = await meta.prepare_objects(1, 60_000)
    await meta.commit_stream_set_object(commit(o2, (sid, 0, 10, 20)))
    # a compaction job rewrites both stream-set objects into one stream object
    new = await meta.prepare_objects(1, 60_000)
    await meta.commit_stream_object(
        StreamObject(new, 300, sid, 0, 20, source_object_ids=(o1, o2)), node_id=-1, node_epoch=0
    )
    objs = await meta.get_objects(sid, 0, -1, 10)
    assert [(o.object_id, o.object_type) for o in objs] == [(new, ObjectType.STREAM)]
    assert (await meta.get_streams([sid]))[0].end_offset == 20  # compaction moves no offsets
    with pytest.raises(ObjectNotPreparedError):  # the same id cannot be committed twice
        await meta.commit_stream_object(
            StreamObject(new, 300, sid, 0, 20, source_object_ids=(o1,)), node_id=-1, node_epoch=0
        )


async def test_reads_see_changes_made_by_another_instance(store, url):
    one = InProcessMetadata(store)
    sid = await one.create_stream()
    assert [m.end_offset for m in await one.get_streams([sid])] == [0]
    other_store = open_object_store(url)
    try:
        two = InProcessMetadata(other_store)
        await two.open_stream(sid, 0, 1, 0)
        oid = await two.prepare_objects(1, 60_000)
        await two.commit_stream_set_object(commit(oid, (sid, 0, 0, 7)))
        assert [m.end_offset for m in await one.get_streams([sid])] == [7]
        assert [o.object_id for o in await one.get_objects(sid, 0, -1, 10)] == [oid]
    finally:
        await other_store.close()
