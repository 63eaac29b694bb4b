"""Command validation without I/O: each bad request gets its specific error and changes
nothing; placement spreads over brokers and racks."""

from __future__ import annotations

import json

import pytest

from automq.broker.controller import commands as c
from automq.broker.controller.protocol import (
    BrokerNotAvailableError,
    Endpoint,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTopicError,
    ObjectConflictError,
    ReassignmentInProgressError,
    UnknownTopicError,
)
from automq.broker.controller.state import MetadataState
from automq.broker.storage.metadata import (
    CommitStreamSetObjectRequest,
    MetadataError,
    NodeFencedError,
    ObjectNotPreparedError,
    ObjectStreamRange,
    OffsetMismatchError,
    StreamFencedError,
    StreamNotFoundError,
    StreamNotOpenError,
    StreamObject,
)

EP = [Endpoint("PLAINTEXT", "h", 9092)]


class Cluster:
    def __init__(self) -> None:
        self.state = MetadataState()
        self.now = 1_000
        self.run(c.init_cluster, "t")

    def run(self, fn, *args):
        tx = c.Tx(self.state, self.now)
        result = fn(tx, *args)
        self.state.check_invariants()
        return result

    def refused(self, error: type[MetadataError], fn, *args) -> MetadataError:
        """The command fails with exactly `error` and leaves the state untouched."""
        before = json.dumps(self.state.snapshot(), sort_keys=True)
        tx = c.Tx(self.state, self.now)
        with pytest.raises(error) as info:
            fn(tx, *args)
        assert type(info.value) is error
        assert tx.records == []
        assert json.dumps(self.state.snapshot(), sort_keys=True) == before
        return info.value


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def test_hostile_topic_requests(cluster: Cluster) -> None:
    for name in ("", ".", "..", "a/b", "x" * 250, "sp ace", "ü"):
        cluster.refused(InvalidTopicError, c.create_topic, name, 1, {})
    for n in (0, -1, 10_001):
        cluster.refused(InvalidPartitionsError, c.create_topic, "t", n, {})
    cluster.refused(InvalidConfigError, c.create_topic, "t", 1, {"retention.ms": "1h"})
    cluster.refused(InvalidConfigError, c.create_topic, "t", 1, {"cleanup.policy": "never"})
    cluster.refused(InvalidConfigError, c.create_topic, "t", 1, {"retention.ms": None})
    cluster.refused(InvalidConfigError, c.create_topic, "t", 1, {"max.message.bytes": 5})
    cluster.refused(UnknownTopicError, c.delete_topic, "nope")
    cluster.refused(UnknownTopicError, c.create_partitions, "nope", 3)
    # one table of topic configs for brokers and controller: keys Kafka 4 removed are unknown,
    # values a broker refuses are refused here too
    for removed in ("message.format.version", "message.downconversion.enable", "message.timestamp.difference.max.ms"):
        cluster.refused(InvalidConfigError, c.create_topic, "t", 1, {removed: "1"})
    cluster.refused(InvalidConfigError, c.create_topic, "t", 1, {"segment.bytes": "12"})
    cluster.refused(InvalidConfigError, c.create_topic, "t", 1, {"compression.zstd.level": "99"})
    cluster.refused(UnknownTopicError, c.reassign_partition, "nope", 0, 1)
    info = cluster.run(c.create_topic, "t", 2, {"cleanup.policy": "compact,delete", "compression.zstd.level": "3"})
    assert all(p.leader == -1 and p.state == "offline" for p in info.partitions)  # no broker yet
    cluster.refused(UnknownTopicError, c.reassign_partition, "t", 2, 1)
    cluster.refused(InvalidPartitionsError, c.create_partitions, "t", 1)


def test_hostile_object_requests(cluster: Cluster) -> None:
    epoch = cluster.run(c.register_broker, 1, EP, None)
    p = cluster.run(c.create_topic, "t", 1, {}).partitions[0]
    sid = p.stream_id
    cluster.run(c.open_stream, sid, 0, 1, epoch)
    cluster.refused(InvalidRequestError, c.prepare_objects, 0, 1000)
    cluster.refused(InvalidRequestError, c.prepare_objects, 10_001, 1000)
    cluster.refused(InvalidRequestError, c.prepare_objects, 1, 0)
    oid = cluster.run(c.prepare_objects, 4, 1000)

    def req(ranges=(), objs=(), object_id=oid, node=1, node_epoch=epoch, compacted=()):
        return CommitStreamSetObjectRequest(
            node, node_epoch, object_id, 10, tuple(ranges), tuple(objs), tuple(compacted)
        )

    rng = ObjectStreamRange(sid, 0, 0, 10, 10)
    cluster.refused(NodeFencedError, c.commit_stream_set_object, req([rng], node=2))
    cluster.refused(NodeFencedError, c.commit_stream_set_object, req([rng], node_epoch=epoch + 1))
    cluster.refused(InvalidRequestError, c.commit_stream_set_object, req([ObjectStreamRange(sid, 0, 5, 5, 1)]))
    cluster.refused(InvalidRequestError, c.commit_stream_set_object, req([ObjectStreamRange(sid, 0, 9, 3, 1)]))
    cluster.refused(InvalidRequestError, c.commit_stream_set_object, req([rng], object_id=-1))
    cluster.refused(InvalidRequestError, c.commit_stream_set_object, req(object_id=-1))
    cluster.refused(InvalidRequestError, c.commit_stream_set_object, req([rng], [StreamObject(oid, 1, sid, 10, 11)]))
    cluster.refused(
        InvalidRequestError, c.commit_stream_set_object, req([rng], [StreamObject(oid + 1, 1, sid, 10, 11, (oid + 2,))])
    )
    cluster.refused(ObjectNotPreparedError, c.commit_stream_set_object, req([rng], object_id=oid + 100))
    cluster.refused(StreamNotFoundError, c.commit_stream_set_object, req([ObjectStreamRange(999, 0, 0, 1, 1)]))
    cluster.refused(StreamFencedError, c.commit_stream_set_object, req([ObjectStreamRange(sid, -1, 0, 1, 1)]))
    cluster.refused(StreamNotOpenError, c.commit_stream_set_object, req([ObjectStreamRange(sid, 1, 0, 1, 1)]))
    cluster.refused(OffsetMismatchError, c.commit_stream_set_object, req([ObjectStreamRange(sid, 0, 1, 2, 1)]))
    # two ranges of one stream must chain
    cluster.refused(
        OffsetMismatchError, c.commit_stream_set_object, req([rng], [StreamObject(oid + 1, 1, sid, 11, 12)])
    )
    cluster.run(c.commit_stream_set_object, req([rng], [StreamObject(oid + 1, 1, sid, 10, 12)]))
    # compaction hostility
    cluster.refused(
        InvalidRequestError,
        c.commit_stream_set_object,
        req([ObjectStreamRange(sid, 0, 0, 10, 1)], object_id=oid + 2, compacted=(oid + 2,)),
    )
    cluster.refused(
        ObjectConflictError,
        c.commit_stream_set_object,
        req([ObjectStreamRange(sid, 0, 0, 10, 1)], object_id=oid + 2, compacted=(oid + 1,)),
    )  # a stream object
    cluster.refused(
        ObjectConflictError,
        c.commit_stream_set_object,
        req([ObjectStreamRange(sid, 0, 0, 11, 1)], object_id=oid + 2, compacted=(oid,)),
    )  # invents data
    cluster.refused(
        ObjectConflictError,
        c.commit_stream_set_object,
        req([ObjectStreamRange(sid, 0, 0, 9, 1)], object_id=oid + 2, compacted=(oid,)),
    )  # loses data
    cluster.refused(
        ObjectConflictError, c.commit_stream_object, StreamObject(oid + 2, 1, sid, 0, 12, (oid, 424242)), -1, -1
    )
    cluster.run(c.commit_stream_object, StreamObject(oid + 2, 1, sid, 0, 12, (oid, oid + 1)), -1, -1)
    cluster.refused(
        ObjectConflictError, c.commit_stream_object, StreamObject(oid + 3, 1, sid, 0, 12, (oid, oid + 1)), -1, -1
    )
    assert [o.object_id for o in c.get_objects(cluster.state, sid, 0, -1, 10)] == [oid + 2]
    with pytest.raises(InvalidRequestError):
        c.get_objects(cluster.state, sid, 0, -1, 0)
    with pytest.raises(StreamNotFoundError):
        c.get_objects(cluster.state, 999, 0, -1, 1)
    # expired ids cannot be committed any more
    cluster.now += 5_000
    cluster.refused(ObjectNotPreparedError, c.commit_stream_object, StreamObject(oid + 3, 1, sid, 12, 13), 1, epoch)


def test_stream_epochs(cluster: Cluster) -> None:
    e1 = cluster.run(c.register_broker, 1, EP, None)
    e2 = cluster.run(c.register_broker, 2, EP, None)
    sid = cluster.run(c.create_stream, {"k": "v"})
    cluster.run(c.open_stream, sid, 5, 1, e1)
    cluster.refused(StreamFencedError, c.open_stream, sid, 4, 2, e2)  # older epoch
    cluster.refused(StreamFencedError, c.open_stream, sid, 5, 2, e2)  # same epoch, other owner
    cluster.run(c.open_stream, sid, 5, 1, e1)  # idempotent reopen by the owner
    cluster.run(c.open_stream, sid, 6, 2, e2)  # a newer epoch takes over
    cluster.refused(StreamFencedError, c.close_stream, sid, 5, 1, e1)
    cluster.refused(StreamFencedError, c.trim_stream, sid, 5, 3, 1, e1)
    cluster.refused(StreamNotOpenError, c.trim_stream, sid, 6, 3, 1, e1)
    cluster.refused(InvalidRequestError, c.trim_stream, sid, 6, -1, 2, e2)
    cluster.run(c.trim_stream, sid, 6, 3, 2, e2)
    cluster.run(c.trim_stream, sid, 6, 1, 2, e2)  # backwards: ignored
    assert cluster.state.streams[sid].start_offset == 3
    ranges = [(g.epoch, g.node_id) for g in cluster.state.streams[sid].ranges]
    assert ranges == [(5, 1), (6, 2)]


def test_partition_stream_needs_leader_and_leader_epoch(cluster: Cluster) -> None:
    e1 = cluster.run(c.register_broker, 1, EP, None)
    e2 = cluster.run(c.register_broker, 2, EP, None)
    p = cluster.run(c.create_topic, "t", 1, {}).partitions[0]
    other = 2 if p.leader == 1 else 1
    cluster.refused(StreamFencedError, c.open_stream, p.stream_id, p.leader_epoch, other, e2 if other == 2 else e1)
    cluster.refused(
        StreamFencedError, c.open_stream, p.stream_id, p.leader_epoch + 1, p.leader, e1 if p.leader == 1 else e2
    )
    cluster.refused(InvalidRequestError, c.delete_stream, p.stream_id, 0, p.leader, e1 if p.leader == 1 else e2)


def test_placement_spreads_over_racks_and_skips_draining(cluster: Cluster) -> None:
    for node, rack in ((1, "r1"), (2, "r1"), (3, "r2")):
        cluster.run(c.register_broker, node, EP, rack)
    info = cluster.run(c.create_topic, "t", 4, {})
    racks = [cluster.state.brokers[p.leader].rack for p in info.partitions]
    assert racks.count("r1") == 2 and racks.count("r2") == 2
    cluster.run(c.drain_broker, 3)
    cluster.refused(BrokerNotAvailableError, c.reassign_partition, "t", 0, 3)
    more = cluster.run(c.create_topic, "u", 6, {})
    assert {p.leader for p in more.partitions} == {1, 2}
    assert sorted(p.leader for p in more.partitions).count(1) == 3
    # partitions of the draining broker are moving (its streams are not open: they move at once)
    assert all(p.leader != 3 or p.state == "moving" for p in cluster.state.topics["t"].partitions)
    cluster.refused(BrokerNotAvailableError, c.drain_broker, 99)


def test_reassignment_in_progress_and_stale_partition_closed(cluster: Cluster) -> None:
    e1 = cluster.run(c.register_broker, 1, EP, None)
    cluster.run(c.register_broker, 2, EP, None)
    p = next(p for p in cluster.run(c.create_topic, "t", 2, {}).partitions if p.leader == 1)
    cluster.run(c.open_stream, p.stream_id, p.leader_epoch, 1, e1)
    cluster.run(c.reassign_partition, "t", p.partition, 2)
    cluster.refused(ReassignmentInProgressError, c.reassign_partition, "t", p.partition, 2)
    cluster.refused(InvalidRequestError, c.partition_closed, "t", p.partition, 1, e1, p.leader_epoch)  # still open
    cluster.refused(StreamFencedError, c.partition_closed, "t", p.partition, 1, e1, p.leader_epoch + 7)
    cluster.run(c.close_stream, p.stream_id, p.leader_epoch, 1, e1)
    cluster.run(c.partition_closed, "t", p.partition, 1, e1, p.leader_epoch)
    moved = cluster.state.topics["t"].partitions[p.partition]
    assert (moved.leader, moved.leader_epoch, moved.state) == (2, p.leader_epoch + 1, "online")
    cluster.run(c.partition_closed, "t", p.partition, 1, e1, p.leader_epoch)  # a retry: no change
    assert cluster.state.topics["t"].partitions[p.partition].leader_epoch == p.leader_epoch + 1


def test_a_compaction_swap_tells_leaders_which_range_was_rewritten(cluster: Cluster) -> None:
    epoch = cluster.run(c.register_broker, 1, EP, None)
    sid = cluster.run(c.create_topic, "t", 1, {"cleanup.policy": "compact"}).partitions[0].stream_id
    cluster.run(c.open_stream, sid, 0, 1, epoch)
    oid = cluster.run(c.prepare_objects, 3, 1000)
    for i, (start, end) in enumerate([(0, 10), (10, 25)]):
        cluster.run(
            c.commit_stream_set_object,
            CommitStreamSetObjectRequest(1, epoch, oid + i, 10, (ObjectStreamRange(sid, 0, start, end, 10),), (), ()),
        )
    partition = cluster.state.image().topics[0].partitions[0]
    assert partition.compacted_end == 0
    version = cluster.state.version
    cluster.run(c.commit_stream_object, StreamObject(oid + 2, 15, sid, 0, 25, (oid, oid + 1)), -1, -1)
    # visible: brokers long-polling the metadata wake up and see the rewritten range's end
    assert cluster.state.version > version
    assert cluster.state.image().topics[0].partitions[0].compacted_end == 25
    # kept across a snapshot, and snapshots written before the field existed still load
    snap = cluster.state.snapshot()
    assert MetadataState.from_snapshot(json.loads(json.dumps(snap))).image().topics[0].partitions[0].compacted_end == 25
    old = json.loads(json.dumps(snap))
    old["streams"] = [row[:8] for row in old["streams"]]
    assert MetadataState.from_snapshot(old).image().topics[0].partitions[0].compacted_end == 0
