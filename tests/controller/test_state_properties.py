"""Random operation sequences against the state machine (sans I/O), checking invariants.

Invariants (after every step): `MetadataState.check_invariants()` (no two owners of a stream
epoch, owner ranges and objects contiguous, index == objects); committed objects cover
exactly the acknowledged offsets of every stream; a stale node epoch never commits;
replaying the emitted records on an empty state, and a snapshot round trip, rebuild the
same state; the garbage collector only ever destroys objects that nobody can read.
"""

from __future__ import annotations

import itertools
import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from automq.broker.controller import commands as c
from automq.broker.controller.protocol import Endpoint
from automq.broker.controller.records import record_from_json, record_to_json
from automq.broker.controller.state import COMMITTED, MetadataState
from automq.broker.storage.metadata import (
    CommitStreamSetObjectRequest,
    MetadataError,
    NodeFencedError,
    ObjectStreamRange,
    ObjectType,
    StreamObject,
)

NODES = [1, 2, 3]
TOPICS = ["a", "b"]
EP = [Endpoint("PLAINTEXT", "h", 9092)]


class ControllerMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.state = MetadataState()
        self.log: list[dict] = []
        self.now = 1_000
        self.epochs: dict[int, int] = {}  # node -> its latest node epoch
        self.acked: dict[int, int] = {}  # stream id -> acknowledged end offset
        self.readable: set[int] = set()  # object ids a reader could have been handed
        self.run(c.init_cluster, "test")
        # start from a live cluster so that most steps do real work
        for node in NODES:
            self.register(node, None)
        self.create_topic("a", 3)
        self.open_all()

    @rule()
    def open_all(self) -> None:
        for p in self._led():
            try:
                self.run(c.open_stream, p.stream_id, p.leader_epoch, p.leader, self.epochs[p.leader])
            except MetadataError:
                pass

    def run(self, fn, *args):
        tx = c.Tx(self.state, self.now)
        try:
            return fn(tx, *args)
        finally:
            # records emitted before an error are applied too: they must be logged
            self.log.extend(json.loads(json.dumps(record_to_json(x))) for x in tx.records)

    # ------------------------------------------------------------------ brokers

    @rule(node=st.sampled_from(NODES), rack=st.sampled_from([None, "r1", "r2"]))
    def register(self, node: int, rack) -> None:
        self.epochs[node] = self.run(c.register_broker, node, EP, rack)

    @rule(node=st.sampled_from(NODES))
    def fence(self, node: int) -> None:
        try:
            self.run(c.fence_broker, node)
        except MetadataError:
            assert node not in self.state.brokers

    @rule(node=st.sampled_from(NODES), drain=st.booleans())
    def drain(self, node: int, drain: bool) -> None:
        try:
            self.run(c.drain_broker if drain else c.undrain_broker, node)
        except MetadataError:
            pass

    # ------------------------------------------------------------------ topics

    @rule(name=st.sampled_from(TOPICS), n=st.integers(1, 3))
    def create_topic(self, name: str, n: int) -> None:
        try:
            info = self.run(c.create_topic, name, n, {})
        except MetadataError:
            assert name in self.state.topics
            return
        for p in info.partitions:
            self.acked[p.stream_id] = 0

    @rule(name=st.sampled_from(TOPICS))
    def delete_topic(self, name: str) -> None:
        topic = self.state.topics.get(name)
        try:
            self.run(c.delete_topic, name)
        except MetadataError:
            assert topic is None
            return
        for p in topic.partitions:
            self.acked.pop(p.stream_id, None)

    @rule(name=st.sampled_from(TOPICS), part=st.integers(0, 2), node=st.sampled_from(NODES))
    def reassign(self, name: str, part: int, node: int) -> None:
        try:
            self.run(c.reassign_partition, name, part, node)
        except MetadataError:
            pass

    # ------------------------------------------------------------------ streams

    def _partitions(self):
        return [p for t in self.state.topics.values() for p in t.partitions]

    def _led(self):
        return [p for p in self._partitions() if p.leader >= 0 and self.state.brokers[p.leader].state != "fenced"]

    def _writable(self):
        return [
            s
            for s in self.state.streams.values()
            if s.state == "open" and s.owner in self.state.brokers and self.state.brokers[s.owner].state != "fenced"
        ]

    @precondition(lambda self: self._led())
    @rule(data=st.data(), stale=st.sampled_from([False, False, False, True]))
    def open_stream(self, data, stale: bool) -> None:
        p = data.draw(st.sampled_from(self._led()))
        node = p.leader
        epoch = p.leader_epoch - 1 if stale else p.leader_epoch
        try:
            self.run(c.open_stream, p.stream_id, epoch, node, self.epochs.get(node, 0))
        except MetadataError:
            pass

    @precondition(lambda self: self._partitions())
    @rule(data=st.data())
    def close_and_hand_over(self, data) -> None:
        p = data.draw(st.sampled_from(self._partitions()))
        s = self.state.streams[p.stream_id]
        try:
            self.run(c.close_stream, p.stream_id, s.epoch, s.owner, self.epochs.get(s.owner, 0))
            self.run(c.partition_closed, p.topic, p.partition, p.leader, self.epochs.get(p.leader, 0), p.leader_epoch)
        except MetadataError:
            pass

    @precondition(lambda self: self._partitions())
    @rule(data=st.data(), by=st.integers(0, 30))
    def trim(self, data, by: int) -> None:
        p = data.draw(st.sampled_from(self._partitions()))
        s = self.state.streams[p.stream_id]
        try:
            self.run(c.trim_stream, p.stream_id, s.epoch, s.start_offset + by, s.owner, self.epochs.get(s.owner, 0))
        except MetadataError:
            pass

    # ------------------------------------------------------------------ objects

    @precondition(lambda self: self._writable())
    @rule(
        data=st.data(),
        stale_node=st.sampled_from([False, False, True]),
        gap=st.sampled_from([0, 0, 0, 1]),
        split=st.booleans(),
    )
    def upload(self, data, stale_node: bool, gap: int, split: bool) -> None:
        """A broker uploads what it holds for up to 3 of its open streams (sometimes
        including another owner's stream, which must be refused)."""
        streams = self._writable()
        owner = data.draw(st.sampled_from(sorted({s.owner for s in streams})))
        mine = [s for s in streams if s.owner == owner]
        chosen = data.draw(st.lists(st.sampled_from(mine), min_size=1, max_size=3, unique_by=lambda s: s.stream_id))
        others = [s for s in streams if s.owner != owner]
        if others and data.draw(st.sampled_from([False, False, False, True])):
            chosen.append(data.draw(st.sampled_from(others)))
        node = chosen[0].owner
        node_epoch = self.epochs.get(node, 0) - (1 if stale_node else 0)
        first = self.run(c.prepare_objects, 2, 10_000)
        ranges, objs = [], []
        for s in chosen:
            length = data.draw(st.integers(1, 20))
            if split and not objs:
                objs.append(
                    StreamObject(first + 1, length * 10, s.stream_id, s.end_offset + gap, s.end_offset + gap + length)
                )
            else:
                ranges.append(
                    ObjectStreamRange(
                        s.stream_id, s.epoch, s.end_offset + gap, s.end_offset + gap + length, length * 10
                    )
                )
        req = CommitStreamSetObjectRequest(node, node_epoch, first if ranges else -1, 100, tuple(ranges), tuple(objs))
        before = {s.stream_id: s.end_offset for s in chosen}
        try:
            self.run(c.commit_stream_set_object, req)
        except NodeFencedError:
            return
        except MetadataError:
            assert not (
                all(s.owner == node for s in chosen)
                and gap == 0
                and not stale_node
                and self.state.brokers.get(node) is not None
                and self.state.brokers[node].state != "fenced"
            ), "a valid commit by the owner was rejected"
            return
        assert not stale_node, "a zombie (stale node epoch) committed"
        assert gap == 0, "a commit with a gap was accepted"
        for rg in ranges:
            assert before[rg.stream_id] == self.acked[rg.stream_id] == rg.start_offset
            self.acked[rg.stream_id] = rg.end_offset
        for so in objs:
            self.acked[so.stream_id] = so.end_offset
        self.readable.update(
            oid
            for oid in (first, first + 1)
            if self.state.objects.get(oid) and self.state.objects[oid].state == COMMITTED
        )

    @precondition(lambda self: self.state.jobs)
    @rule(data=st.data(), complete=st.booleans())
    def recover_wal(self, data, complete: bool) -> None:
        """The operator claims a fenced node's WAL job, commits as that node under the
        recovery epoch (must be accepted), and maybe completes the job."""
        job = data.draw(st.sampled_from(sorted(self.state.jobs.values(), key=lambda j: j.job_id)))
        try:
            recovery_epoch = self.run(c.claim_wal_recovery, job.job_id, -1, -1)
        except MetadataError:
            return
        held = sorted(
            (s for s in self.state.streams.values() if s.owner == job.node_id and s.state == "open"),
            key=lambda s: s.stream_id,
        )
        if held:
            s = held[0]
            oid = self.run(c.prepare_objects, 1, 10_000)
            req = CommitStreamSetObjectRequest(
                job.node_id,
                recovery_epoch,
                oid,
                10,
                (ObjectStreamRange(s.stream_id, s.epoch, s.end_offset, s.end_offset + 3, 10),),
            )
            self.run(c.commit_stream_set_object, req)  # must not raise
            if s.stream_id in self.acked:
                self.acked[s.stream_id] = s.end_offset
        if complete:
            self.run(c.complete_wal_recovery, job.job_id, -1, -1)
            assert not any(s.owner == job.node_id and s.state == "open" for s in self.state.streams.values())

    @rule(data=st.data())
    def compact_stream_sets(self, data) -> None:
        sets = c.get_stream_set_objects(self.state, None)
        if len(sets) < 2:
            return
        picked = data.draw(st.lists(st.sampled_from(sets), min_size=2, max_size=3, unique_by=lambda o: o.object_id))
        ranges = [
            ObjectStreamRange(rg.stream_id, 0, rg.start_offset, rg.end_offset, 1) for o in picked for rg in o.ranges
        ]
        drop = data.draw(st.booleans())  # a broken compaction that loses a range must be refused
        if drop and len(ranges) > 1:
            ranges = ranges[1:]
        first = self.run(c.prepare_objects, 1, 10_000)
        req = CommitStreamSetObjectRequest(-1, -1, first, 10, tuple(ranges), (), tuple(o.object_id for o in picked))
        try:
            self.run(c.commit_stream_set_object, req)
        except MetadataError:
            return
        self.readable.add(first)

    @precondition(lambda self: self._partitions())
    @rule(data=st.data())
    def compact_stream(self, data) -> None:
        p = data.draw(st.sampled_from(self._partitions()))
        objs = c.get_objects(self.state, p.stream_id, 0, -1, 3)
        if len(objs) < 2:
            return
        mine = [rg for o in objs for rg in o.ranges if rg.stream_id == p.stream_id]
        first = self.run(c.prepare_objects, 1, 10_000)
        so = StreamObject(
            first, 10, p.stream_id, mine[0].start_offset, mine[-1].end_offset, tuple(o.object_id for o in objs)
        )
        try:
            self.run(c.commit_stream_object, so, -1, -1)
        except MetadataError:
            return
        self.readable.add(first)

    @rule(ms=st.integers(1, 20_000))
    def time_passes_and_gc(self, ms: int) -> None:
        self.now += ms
        self.run(c.expire_prepared)
        doomed = c.deletable_objects(self.state, self.now, 5_000)
        for oid in doomed:
            obj = self.state.objects[oid]
            assert obj.state != COMMITTED
            for sid, index in self.state.stream_index.items():
                assert all(e[2] != oid for e in index), f"GC would delete object {oid} still read by stream {sid}"
        self.run(c.objects_destroyed, doomed)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def state_invariants(self) -> None:
        if not hasattr(self, "state"):
            return
        self.state.check_invariants()

    @invariant()
    def objects_cover_exactly_what_was_acknowledged(self) -> None:
        if not hasattr(self, "state"):
            return
        for sid, end in self.acked.items():
            s = self.state.streams[sid]
            assert s.end_offset == end, f"stream {sid}: end {s.end_offset} but {end} acknowledged"
            covered = sorted((a, b) for a, b, _ in self.state.stream_index[sid])
            live_from = max(s.start_offset, 0)
            if live_from < end:
                assert covered and covered[0][0] <= live_from and covered[-1][1] == end
                for (_, b), (a2, _) in itertools.pairwise(covered):
                    assert b == a2
            for _a, _b, oid in self.state.stream_index[sid]:
                obj = self.state.objects[oid]
                assert obj.object_type in (ObjectType.STREAM, ObjectType.STREAM_SET)

    def every_partition_is_served_once_every_broker_is_back(self) -> None:
        """Liveness of moves (issue 17 item 1): whatever died in the middle of whatever, once
        every broker is back and active and does what a broker process does after its WAL
        replay (release the moving partitions it leads, open the ones it leads), every
        partition is online. Checked on a copy, at the end of every run (cheap enough)."""
        copy = MetadataState.from_snapshot(json.loads(json.dumps(self.state.snapshot())))

        def run(fn, *args):
            return fn(c.Tx(copy, self.now), *args)

        epochs = {n: run(c.register_broker, n, EP, None) for n in NODES}
        for n in NODES:
            run(c.undrain_broker, n)
        for _ in range(4):
            for p in [p for t in copy.topics.values() for p in t.partitions]:
                if p.leader < 0:
                    continue
                if p.state == "moving":
                    steps = [
                        (c.close_stream, p.stream_id, p.leader_epoch, p.leader, epochs[p.leader]),
                        (c.partition_closed, p.topic, p.partition, p.leader, epochs[p.leader], p.leader_epoch),
                    ]
                else:
                    steps = [(c.open_stream, p.stream_id, p.leader_epoch, p.leader, epochs[p.leader])]
                for fn, *args in steps:
                    try:
                        run(fn, *args)
                    except MetadataError:
                        pass
        stuck = [
            (p.topic, p.partition, p.state, p.leader, p.target)
            for t in copy.topics.values()
            for p in t.partitions
            if p.state != "online" or p.leader < 0
        ]
        assert not stuck, f"partitions not served with every broker back: {stuck}"

    def teardown(self) -> None:
        if not hasattr(self, "state"):
            return
        self.every_partition_is_served_once_every_broker_is_back()
        replayed = MetadataState()
        for data in self.log:
            replayed.apply(record_from_json(data))
        replayed.last_seq = self.state.last_seq
        assert replayed.snapshot() == self.state.snapshot(), "replaying the records gave another state"
        roundtrip = MetadataState.from_snapshot(json.loads(json.dumps(self.state.snapshot())))
        roundtrip.check_invariants()
        assert roundtrip.snapshot() == self.state.snapshot()
        assert roundtrip.stream_index == self.state.stream_index


ControllerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestControllerStateMachine = ControllerMachine.TestCase
