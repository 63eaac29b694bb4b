"""The controller's metadata state and how records change it (sans I/O).

`MetadataState.apply(record)` is the whole state machine: deterministic, no clock, no I/O,
so the leader and every standby that replays the same log hold the same state. Deciding
*which* records a request produces (validation, placement, error codes) lives in
`commands.py`; this module only executes decisions. `snapshot()` / `from_snapshot()`
serialise the state for the metadata log's periodic snapshots, and `check_invariants()`
states what must always hold (property tests call it after every step).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from automq.broker.controller import records as r
from automq.broker.controller.acls import AclBinding
from automq.broker.controller.protocol import (
    BrokerInfo,
    DelegationTokenInfo,
    Endpoint,
    GroupConfigs,
    MetadataImage,
    PartitionInfo,
    ScramCredentialInfo,
    TopicInfo,
    WalRecoveryJob,
)
from automq.broker.controller.quotas import ClientQuota, Entity
from automq.broker.controller.schema_registry.model import RegistryState
from automq.broker.storage.metadata import ObjectMetadata, ObjectType, StreamMetadata, StreamOffsetRange

PREPARED = "prepared"
COMMITTED = "committed"
MARKED = "marked"  # for deletion; the garbage collector deletes it after the retention


@dataclass(slots=True)
class BrokerState:
    node_id: int
    node_epoch: int
    endpoints: list[list[Any]]  # [[listener, host, port], ...]
    rack: str | None
    state: str = "active"
    registered_at_ms: int = 0


@dataclass(slots=True)
class PartitionState:
    topic: str
    partition: int
    stream_id: int
    leader: int
    leader_epoch: int
    state: str = "online"
    target: int = -1


@dataclass(slots=True)
class TopicState:
    name: str
    topic_id: str
    configs: dict[str, str]
    partitions: list[PartitionState]  # [PartitionState], index == partition number


@dataclass(slots=True)
class StreamRange:
    """Offsets one owner appended under one epoch."""

    epoch: int
    node_id: int
    start_offset: int
    end_offset: int


@dataclass(slots=True)
class StreamState:
    stream_id: int
    epoch: int = 0
    start_offset: int = 0
    end_offset: int = 0
    owner: int = -1
    state: str = "closed"
    tags: dict[str, Any] = field(default_factory=dict)
    ranges: list[StreamRange] = field(default_factory=list)
    compacted_end: int = 0  # end of the highest range a compaction rewrote (PartitionInfo.compacted_end)


@dataclass(slots=True)
class ObjectState:
    object_id: int
    state: str
    object_type: int = 0  # ObjectType once committed
    object_size: int = 0
    node_id: int = -1
    # live ranges [[stream_id, start, end], ...]; a range leaves when its stream is deleted or
    # trimmed past it, and an object with none left is garbage
    ranges: list[list[int]] = field(default_factory=list)
    committed_at_ms: int = 0
    expires_at_ms: int = 0  # prepared ids only
    marked_at_ms: int = 0


@dataclass(slots=True)
class JobState:
    job_id: int
    node_id: int
    node_epoch: int
    stream_ids: list[int]
    state: str = "pending"
    claimed_by: int = -1
    created_at_ms: int = 0
    recovery_epoch: int = -1


class MetadataState:
    """Everything the controller knows. Mutated only by `apply`."""

    def __init__(self) -> None:
        self.cluster_id: str = ""
        self.controller_id: int = -1
        self.controller_url: str = ""
        self.term: int = 0
        self.leader_resigned = False
        self.version: int = 0  # bumps on every VISIBLE record
        self.last_seq: int = -1  # log sequence number of the last applied log entry
        self.brokers: dict[int, BrokerState] = {}
        self.topics: dict[str, TopicState] = {}
        self.streams: dict[int, StreamState] = {}
        self.objects: dict[int, ObjectState] = {}
        self.jobs: dict[int, JobState] = {}
        self.next_stream_id = 0
        self.next_object_id = 0
        self.next_job_id = 0
        # derived (rebuilt from objects, never serialised): stream id -> sorted [(start, end, object_id)]
        self.stream_index: dict[int, list[tuple[int, int, int]]] = {}
        # derived: stream id -> (topic, partition)
        self.partition_of_stream: dict[int, tuple[str, int]] = {}
        # derived: ids by state, so GC rounds do not scan every object
        self.prepared_ids: set[int] = set()
        self.marked_ids: set[int] = set()
        # ACL bindings as AclBinding.key() tuples, in creation order (a dict as an ordered set)
        self.acls: dict[tuple[Any, ...], None] = {}
        self.client_quotas: dict[Entity, dict[str, float]] = {}
        self.group_configs: dict[str, dict[str, str]] = {}
        # SCRAM users: (user, mechanism) -> [salt, iterations, stored_key, server_key] (base64)
        self.scram: dict[tuple[str, str], list[Any]] = {}
        # delegation tokens: id -> [owner, requester, renewers, issue_ms, expiry_ms, max_ms]
        self.tokens: dict[str, list[Any]] = {}
        self.schema_registry = RegistryState()  # schema_registry/model.py

    # ------------------------------------------------------------------ apply

    def apply(self, record: r.Record) -> None:
        handler = _HANDLERS[type(record)]
        handler(self, record)
        if r.is_visible(record):
            self.version += 1

    def _controller_elected(self, rec: r.ControllerElected) -> None:
        self.controller_id = rec.controller_id
        self.controller_url = rec.url
        self.term = rec.term
        self.leader_resigned = False

    def _controller_resigned(self, rec: r.ControllerResigned) -> None:
        if rec.term == self.term:
            self.leader_resigned = True

    def _leader_heartbeat(self, rec: r.LeaderHeartbeat) -> None:
        pass

    def _cluster_initialized(self, rec: r.ClusterInitialized) -> None:
        self.cluster_id = rec.cluster_id

    def _broker_registered(self, rec: r.BrokerRegistered) -> None:
        self.brokers[rec.node_id] = BrokerState(
            rec.node_id, rec.node_epoch, [list(e) for e in rec.endpoints], rec.rack, "active", rec.at_ms
        )

    def _broker_state_changed(self, rec: r.BrokerStateChanged) -> None:
        self.brokers[rec.node_id].state = rec.state

    def _topic_created(self, rec: r.TopicCreated) -> None:
        self.topics[rec.name] = TopicState(rec.name, rec.topic_id, dict(rec.configs), [])

    def _topic_deleted(self, rec: r.TopicDeleted) -> None:
        topic = self.topics.pop(rec.name)
        for p in topic.partitions:
            self.partition_of_stream.pop(p.stream_id, None)

    def _topic_configs_altered(self, rec: r.TopicConfigsAltered) -> None:
        configs = self.topics[rec.name].configs
        for key, value in rec.configs.items():
            if value is None:
                configs.pop(key, None)
            else:
                configs[key] = value

    def _partition_created(self, rec: r.PartitionCreated) -> None:
        topic = self.topics[rec.topic]
        assert rec.partition == len(topic.partitions), "partitions are created in order"
        topic.partitions.append(
            PartitionState(rec.topic, rec.partition, rec.stream_id, rec.leader, rec.leader_epoch, rec.state)
        )
        self.partition_of_stream[rec.stream_id] = (rec.topic, rec.partition)

    def _partition_changed(self, rec: r.PartitionChanged) -> None:
        p = self.topics[rec.topic].partitions[rec.partition]
        p.leader, p.leader_epoch, p.state, p.target = rec.leader, rec.leader_epoch, rec.state, rec.target

    def _stream_created(self, rec: r.StreamCreated) -> None:
        self.streams[rec.stream_id] = StreamState(rec.stream_id, tags=dict(rec.tags))
        self.stream_index[rec.stream_id] = []
        self.next_stream_id = max(self.next_stream_id, rec.stream_id + 1)

    def _stream_opened(self, rec: r.StreamOpened) -> None:
        s = self.streams[rec.stream_id]
        last = s.ranges[-1] if s.ranges else None
        if last is None or last.epoch != rec.epoch or last.node_id != rec.node_id:
            s.ranges.append(StreamRange(rec.epoch, rec.node_id, s.end_offset, s.end_offset))
        s.epoch, s.owner, s.state = rec.epoch, rec.node_id, "open"

    def _stream_closed(self, rec: r.StreamClosed) -> None:
        self.streams[rec.stream_id].state = "closed"

    def _stream_trimmed(self, rec: r.StreamTrimmed) -> None:
        s = self.streams[rec.stream_id]
        s.start_offset = rec.start_offset
        index = self.stream_index[rec.stream_id]
        dead = 0
        while dead < len(index) and index[dead][1] <= rec.start_offset:
            dead += 1
        for start, end, oid in index[:dead]:
            self._drop_object_range(oid, rec.stream_id, start, end, rec.at_ms)
        del index[:dead]

    def _stream_deleted(self, rec: r.StreamDeleted) -> None:
        self.streams.pop(rec.stream_id)
        for start, end, oid in self.stream_index.pop(rec.stream_id, []):
            self._drop_object_range(oid, rec.stream_id, start, end, rec.at_ms)

    def _objects_prepared(self, rec: r.ObjectsPrepared) -> None:
        for oid in range(rec.first_object_id, rec.first_object_id + rec.count):
            self.objects[oid] = ObjectState(oid, PREPARED, expires_at_ms=rec.expires_at_ms)
            self.prepared_ids.add(oid)
        self.next_object_id = max(self.next_object_id, rec.first_object_id + rec.count)

    def _stream_set_object_committed(self, rec: r.StreamSetObjectCommitted) -> None:
        fresh = not rec.compacted_object_ids
        for oid in rec.compacted_object_ids:
            self._mark(oid, rec.at_ms)
        if fresh:
            # advance end offsets in order; a stream may appear in both lists
            pieces = [(sid, start, end) for sid, start, end in rec.ranges]
            pieces += [(sid, start, end) for _, _, sid, start, end in rec.stream_objects]
            for sid, _start, end in sorted(pieces, key=lambda x: (x[0], x[1])):
                self._advance(sid, end)
        if rec.object_id >= 0:
            self._commit_object(
                rec.object_id, ObjectType.STREAM_SET, rec.object_size, rec.node_id, rec.ranges, rec.at_ms
            )
        for oid, size, sid, start, end in rec.stream_objects:
            self._commit_object(oid, ObjectType.STREAM, size, rec.node_id, [[sid, start, end]], rec.at_ms)

    def _stream_object_committed(self, rec: r.StreamObjectCommitted) -> None:
        if rec.source_object_ids:
            stream = self.streams.get(rec.stream_id)
            if stream is not None:
                stream.compacted_end = max(stream.compacted_end, rec.end_offset)
            for oid in rec.source_object_ids:
                src = self.objects[oid]
                if src.object_type == ObjectType.STREAM or all(rg[0] == rec.stream_id for rg in src.ranges):
                    self._mark(oid, rec.at_ms)
                else:  # a stream-set source keeps its other streams' data
                    for sid, start, end in [rg for rg in src.ranges if rg[0] == rec.stream_id]:
                        self._drop_object_range(oid, sid, start, end, rec.at_ms)
                        self._unindex(sid, start, end, oid)
        else:
            self._advance(rec.stream_id, rec.end_offset)
        self._commit_object(
            rec.object_id,
            ObjectType.STREAM,
            rec.object_size,
            rec.node_id,
            [[rec.stream_id, rec.start_offset, rec.end_offset]],
            rec.at_ms,
        )

    def _objects_marked_for_deletion(self, rec: r.ObjectsMarkedForDeletion) -> None:
        for oid in rec.object_ids:
            self._mark(oid, rec.at_ms)

    def _objects_destroyed(self, rec: r.ObjectsDestroyed) -> None:
        for oid in rec.object_ids:
            self.objects.pop(oid, None)
            self.marked_ids.discard(oid)
            self.prepared_ids.discard(oid)

    def _wal_recovery_job_created(self, rec: r.WalRecoveryJobCreated) -> None:
        self.jobs[rec.job_id] = JobState(
            rec.job_id, rec.node_id, rec.node_epoch, list(rec.stream_ids), created_at_ms=rec.at_ms
        )
        self.next_job_id = max(self.next_job_id, rec.job_id + 1)

    def _wal_recovery_job_claimed(self, rec: r.WalRecoveryJobClaimed) -> None:
        job = self.jobs[rec.job_id]
        job.state, job.claimed_by, job.recovery_epoch = "claimed", rec.node_id, rec.recovery_epoch
        if rec.recovery_epoch >= 0:
            self.brokers[job.node_id].node_epoch = rec.recovery_epoch

    def _wal_recovery_job_released(self, rec: r.WalRecoveryJobReleased) -> None:
        job = self.jobs[rec.job_id]
        job.state, job.claimed_by = "pending", -1

    def _wal_recovery_job_cancelled(self, rec: r.WalRecoveryJobCancelled) -> None:
        del self.jobs[rec.job_id]

    def _wal_recovery_job_completed(self, rec: r.WalRecoveryJobCompleted) -> None:
        job = self.jobs.pop(rec.job_id)
        for s in self.streams.values():
            if s.owner == job.node_id and s.state == "open":
                s.state = "closed"

    def _acls_created(self, rec: r.AclsCreated) -> None:
        for b in rec.bindings:
            self.acls[tuple(b)] = None

    def _acls_deleted(self, rec: r.AclsDeleted) -> None:
        for b in rec.bindings:
            self.acls.pop(tuple(b), None)

    def _client_quotas_altered(self, rec: r.ClientQuotasAltered) -> None:
        entity: Entity = tuple((t, n) for t, n in rec.entity)
        values = self.client_quotas.setdefault(entity, {})
        for key, value in rec.ops.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        if not values:
            del self.client_quotas[entity]

    def _group_configs_altered(self, rec: r.GroupConfigsAltered) -> None:
        values = self.group_configs.setdefault(rec.group_id, {})
        for key, value in rec.configs.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        if not values:
            del self.group_configs[rec.group_id]

    # ------------------------------------------------------------------ object helpers

    def _advance(self, stream_id: int, end: int) -> None:
        s = self.streams[stream_id]
        s.end_offset = end
        if s.ranges:
            s.ranges[-1].end_offset = end

    def _commit_object(
        self, oid: int, otype: int, size: int, node_id: int, ranges: list[list[int]], at_ms: int
    ) -> None:
        obj = self.objects[oid]
        self.prepared_ids.discard(oid)
        obj.state, obj.object_type, obj.object_size, obj.node_id = COMMITTED, int(otype), size, node_id
        obj.committed_at_ms, obj.expires_at_ms = at_ms, 0
        live = []
        for sid, start, end in ranges:
            s = self.streams.get(sid)
            if s is None or end <= s.start_offset:
                continue  # already garbage (trimmed past, or stream deleted meanwhile)
            live.append([sid, start, end])
            bisect.insort(self.stream_index[sid], (start, end, oid))
        obj.ranges = live
        if not live:
            self._mark(oid, at_ms)

    def _drop_object_range(self, oid: int, sid: int, start: int, end: int, at_ms: int) -> None:
        obj = self.objects.get(oid)
        if obj is None:
            return
        obj.ranges = [rg for rg in obj.ranges if not (rg[0] == sid and rg[1] == start and rg[2] == end)]
        if not obj.ranges and obj.state == COMMITTED:
            obj.state, obj.marked_at_ms = MARKED, at_ms
            self.marked_ids.add(oid)

    def _unindex(self, sid: int, start: int, end: int, oid: int) -> None:
        index = self.stream_index.get(sid)
        if index is None:
            return
        i = bisect.bisect_left(index, (start, end, oid))
        if i < len(index) and index[i] == (start, end, oid):
            del index[i]

    def _mark(self, oid: int, at_ms: int) -> None:
        obj = self.objects.get(oid)
        if obj is None or obj.state == MARKED:
            return
        for sid, start, end in obj.ranges:
            self._unindex(sid, start, end, oid)
        obj.ranges = []
        obj.state, obj.marked_at_ms = MARKED, at_ms
        self.prepared_ids.discard(oid)
        self.marked_ids.add(oid)

    # ------------------------------------------------------------------ queries

    def stream_metadata(self, s: StreamState) -> StreamMetadata:
        return StreamMetadata(
            s.stream_id,
            s.epoch,
            s.start_offset,
            s.end_offset,
            s.owner,
            s.state,
            dict(s.tags),
            tuple((g.epoch, g.start_offset) for g in s.ranges),
        )

    def object_metadata(self, obj: ObjectState) -> ObjectMetadata:
        return ObjectMetadata(
            obj.object_id,
            obj.object_size,
            ObjectType(obj.object_type),
            tuple(StreamOffsetRange(sid, start, end) for sid, start, end in obj.ranges),
            obj.committed_at_ms,
            obj.node_id,
        )

    def objects_for(self, stream_id: int, start: int, end: int, limit: int) -> list[ObjectMetadata]:
        index = self.stream_index.get(stream_id, [])
        # first entry whose end > start: entries are contiguous, so search by end offset
        i = bisect.bisect_right(index, start, key=lambda e: e[1])
        out: list[ObjectMetadata] = []
        for entry_start, _entry_end, oid in index[i:]:
            if entry_start >= end or len(out) >= limit:
                break
            out.append(self.object_metadata(self.objects[oid]))
        return out

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            return None
        return t.partitions[partition]

    def pending_job_for(self, node_id: int) -> JobState | None:
        for job in self.jobs.values():
            if job.node_id == node_id:
                return job
        return None

    def image(self) -> MetadataImage:
        brokers = tuple(
            BrokerInfo(b.node_id, b.node_epoch, tuple(Endpoint(*e) for e in b.endpoints), b.rack, b.state)
            for b in sorted(self.brokers.values(), key=lambda b: b.node_id)
        )
        topics = tuple(
            TopicInfo(
                t.name,
                t.topic_id,
                tuple(
                    PartitionInfo(
                        p.topic,
                        p.partition,
                        p.stream_id,
                        p.leader,
                        p.leader_epoch,
                        p.state,
                        p.target,
                        s.compacted_end if (s := self.streams.get(p.stream_id)) is not None else 0,
                    )
                    for p in t.partitions
                ),
                dict(t.configs),
            )
            for t in sorted(self.topics.values(), key=lambda t: t.name)
        )
        jobs = tuple(
            WalRecoveryJob(
                j.job_id, j.node_id, j.node_epoch, j.state, j.claimed_by, tuple(j.stream_ids), j.recovery_epoch
            )
            for j in sorted(self.jobs.values(), key=lambda j: j.job_id)
        )
        return MetadataImage(
            self.version,
            self.cluster_id,
            self.controller_id,
            brokers,
            topics,
            jobs,
            acls=tuple(AclBinding(*k) for k in self.acls),
            client_quotas=tuple(ClientQuota(e, dict(v)) for e, v in self.client_quotas.items()),
            group_configs=tuple(GroupConfigs(g, dict(v)) for g, v in sorted(self.group_configs.items())),
            scram_credentials=tuple(ScramCredentialInfo(u, m, *v) for (u, m), v in sorted(self.scram.items())),
            delegation_tokens=tuple(
                DelegationTokenInfo(t, o, q, tuple(rs), i, e, m)
                for t, (o, q, rs, i, e, m) in sorted(self.tokens.items())
            ),
        )

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        return {
            "format": 1,
            "cluster_id": self.cluster_id,
            "controller_id": self.controller_id,
            "controller_url": self.controller_url,
            "term": self.term,
            "leader_resigned": self.leader_resigned,
            "version": self.version,
            "last_seq": self.last_seq,
            "next_stream_id": self.next_stream_id,
            "next_object_id": self.next_object_id,
            "next_job_id": self.next_job_id,
            "brokers": [
                [b.node_id, b.node_epoch, b.endpoints, b.rack, b.state, b.registered_at_ms]
                for b in self.brokers.values()
            ],
            "topics": [
                [
                    t.name,
                    t.topic_id,
                    t.configs,
                    [[p.stream_id, p.leader, p.leader_epoch, p.state, p.target] for p in t.partitions],
                ]
                for t in self.topics.values()
            ],
            "streams": [
                [
                    s.stream_id,
                    s.epoch,
                    s.start_offset,
                    s.end_offset,
                    s.owner,
                    s.state,
                    s.tags,
                    [[g.epoch, g.node_id, g.start_offset, g.end_offset] for g in s.ranges],
                    s.compacted_end,
                ]
                for s in self.streams.values()
            ],
            "objects": [
                [
                    o.object_id,
                    o.state,
                    o.object_type,
                    o.object_size,
                    o.node_id,
                    o.ranges,
                    o.committed_at_ms,
                    o.expires_at_ms,
                    o.marked_at_ms,
                ]
                for o in self.objects.values()
            ],
            "jobs": [
                [
                    j.job_id,
                    j.node_id,
                    j.node_epoch,
                    j.stream_ids,
                    j.state,
                    j.claimed_by,
                    j.created_at_ms,
                    j.recovery_epoch,
                ]
                for j in self.jobs.values()
            ],
            "acls": [list(k) for k in self.acls],
            "client_quotas": [[[list(p) for p in e], v] for e, v in self.client_quotas.items()],
            "group_configs": {g: dict(v) for g, v in self.group_configs.items()},
            "scram": [[u, m, *v] for (u, m), v in self.scram.items()],
            "delegation_tokens": {t: list(v) for t, v in self.tokens.items()},
            "schema_registry": self.schema_registry.snapshot(),
        }

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> MetadataState:
        if data.get("format") != 1:
            raise ValueError(f"unknown metadata snapshot format {data.get('format')!r}")
        st = cls()
        for key in (
            "cluster_id",
            "controller_id",
            "controller_url",
            "term",
            "leader_resigned",
            "version",
            "last_seq",
            "next_stream_id",
            "next_object_id",
            "next_job_id",
        ):
            setattr(st, key, data[key])
        for node_id, epoch, endpoints, rack, state, at in data["brokers"]:
            st.brokers[node_id] = BrokerState(node_id, epoch, endpoints, rack, state, at)
        for name, topic_id, configs, parts in data["topics"]:
            t = TopicState(name, topic_id, configs, [])
            for i, (sid, leader, epoch, state, target) in enumerate(parts):
                t.partitions.append(PartitionState(name, i, sid, leader, epoch, state, target))
                st.partition_of_stream[sid] = (name, i)
            st.topics[name] = t
        # Snapshots written before compacted_end existed have 8 fields per stream.
        for sid, epoch, start, end, owner, state, tags, ranges, *later in data["streams"]:
            st.streams[sid] = StreamState(
                sid, epoch, start, end, owner, state, tags, [StreamRange(*g) for g in ranges], *later[:1]
            )
            st.stream_index[sid] = []
        for oid, state, otype, size, node_id, ranges, committed_at, expires_at, marked_at in data["objects"]:
            st.objects[oid] = ObjectState(oid, state, otype, size, node_id, ranges, committed_at, expires_at, marked_at)
            if state == PREPARED:
                st.prepared_ids.add(oid)
            elif state == MARKED:
                st.marked_ids.add(oid)
            for sid, start, end in ranges:
                st.stream_index[sid].append((start, end, oid))
        for index in st.stream_index.values():
            index.sort()
        for job_id, node_id, epoch, stream_ids, state, claimed_by, at, recovery_epoch in data["jobs"]:
            st.jobs[job_id] = JobState(job_id, node_id, epoch, stream_ids, state, claimed_by, at, recovery_epoch)
        for key in data.get("acls", ()):  # absent from snapshots written before ACLs existed
            st.acls[tuple(key)] = None
        for entity, values in data.get("client_quotas", ()):
            st.client_quotas[tuple((t, n) for t, n in entity)] = dict(values)
        for group_id, values in data.get("group_configs", {}).items():  # absent before group configs
            st.group_configs[group_id] = dict(values)
        for user, mechanism, *values in data.get("scram", []):  # absent from snapshots before issue 15
            st.scram[(user, mechanism)] = values
        for token_id, values in data.get("delegation_tokens", {}).items():  # absent before delegation tokens
            st.tokens[token_id] = list(values)
        if "schema_registry" in data:  # absent from snapshots before the schema registry
            st.schema_registry = RegistryState.from_snapshot(data["schema_registry"])
        return st

    # ------------------------------------------------------------------ invariants

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant."""
        for sid, s in self.streams.items():
            index = self.stream_index[sid]
            if index:
                assert index[0][0] <= s.start_offset, f"stream {sid}: first object starts after the stream start"
                assert index[0][1] > s.start_offset, f"stream {sid}: dead object {index[0]} still indexed"
                for (_a_start, a_end, _), (b_start, _b_end, _) in itertools.pairwise(index):
                    assert a_end == b_start, f"stream {sid}: objects not contiguous at {a_end}/{b_start}"
                assert index[-1][1] == s.end_offset, f"stream {sid}: objects end {index[-1][1]} != end {s.end_offset}"
            else:
                assert s.start_offset >= s.end_offset, (
                    f"stream {sid}: offsets [{s.start_offset},{s.end_offset}) have no objects"
                )
            seen: set[tuple[int, int]] = set()
            for g in s.ranges:
                assert (g.epoch, g.node_id) not in seen, f"stream {sid}: duplicate range owner"
                seen.add((g.epoch, g.node_id))
            epochs = [g.epoch for g in s.ranges]
            assert len(set(epochs)) == len(epochs), f"stream {sid}: two owners of one epoch {epochs}"
            assert epochs == sorted(epochs), f"stream {sid}: epochs go backwards {epochs}"
            for a, b in zip(s.ranges, s.ranges[1:], strict=False):
                assert a.end_offset == b.start_offset, f"stream {sid}: owner ranges not continuous"
            if s.ranges:
                assert s.ranges[-1].end_offset == s.end_offset
                assert s.ranges[-1].epoch == s.epoch
            for start, end, oid in index:
                obj = self.objects[oid]
                assert obj.state == COMMITTED, f"object {oid} indexed but {obj.state}"
                assert [sid, start, end] in obj.ranges
        assert self.prepared_ids == {o for o, x in self.objects.items() if x.state == PREPARED}, (
            "prepared ids out of sync"
        )
        assert self.marked_ids == {o for o, x in self.objects.items() if x.state == MARKED}, "marked ids out of sync"
        for oid, obj in self.objects.items():
            if obj.state == COMMITTED:
                assert obj.ranges, f"committed object {oid} holds no live range"
                for sid, start, end in obj.ranges:
                    assert (start, end, oid) in self.stream_index.get(sid, []), f"object {oid} range not indexed"
            else:
                assert not obj.ranges, f"{obj.state} object {oid} has ranges"
        for t in self.topics.values():
            for p in t.partitions:
                assert self.partition_of_stream.get(p.stream_id) == (t.name, p.partition)
                assert p.stream_id in self.streams, f"partition {t.name}-{p.partition} lost its stream"


def _scram_credential_upserted(st: MetadataState, rec: r.ScramCredentialUpserted) -> None:
    st.scram[(rec.user, rec.mechanism)] = [rec.salt, rec.iterations, rec.stored_key, rec.server_key]


def _scram_credential_deleted(st: MetadataState, rec: r.ScramCredentialDeleted) -> None:
    st.scram.pop((rec.user, rec.mechanism), None)


def _token_created(st: MetadataState, rec: r.DelegationTokenCreated) -> None:
    st.tokens[rec.token_id] = [rec.owner, rec.requester, list(rec.renewers), rec.issue_ms, rec.expiry_ms, rec.max_ms]


def _token_renewed(st: MetadataState, rec: r.DelegationTokenRenewed) -> None:
    if rec.token_id in st.tokens:
        st.tokens[rec.token_id][4] = rec.expiry_ms


def _token_removed(st: MetadataState, rec: r.DelegationTokenRemoved) -> None:
    st.tokens.pop(rec.token_id, None)


def _schema_registry(st: MetadataState, rec: r.Record) -> None:
    st.schema_registry.apply(rec)


_HANDLERS: dict[type[r.Record], Callable[[MetadataState, Any], None]] = {
    r.SchemaRegistered: _schema_registry,
    r.SchemaVersionDeleted: _schema_registry,
    r.SchemaConfigSet: _schema_registry,
    r.DelegationTokenCreated: _token_created,
    r.DelegationTokenRenewed: _token_renewed,
    r.DelegationTokenRemoved: _token_removed,
    r.ScramCredentialUpserted: _scram_credential_upserted,
    r.ScramCredentialDeleted: _scram_credential_deleted,
    r.ControllerElected: MetadataState._controller_elected,
    r.ControllerResigned: MetadataState._controller_resigned,
    r.LeaderHeartbeat: MetadataState._leader_heartbeat,
    r.ClusterInitialized: MetadataState._cluster_initialized,
    r.BrokerRegistered: MetadataState._broker_registered,
    r.BrokerStateChanged: MetadataState._broker_state_changed,
    r.TopicCreated: MetadataState._topic_created,
    r.TopicDeleted: MetadataState._topic_deleted,
    r.TopicConfigsAltered: MetadataState._topic_configs_altered,
    r.PartitionCreated: MetadataState._partition_created,
    r.PartitionChanged: MetadataState._partition_changed,
    r.StreamCreated: MetadataState._stream_created,
    r.StreamOpened: MetadataState._stream_opened,
    r.StreamClosed: MetadataState._stream_closed,
    r.StreamTrimmed: MetadataState._stream_trimmed,
    r.StreamDeleted: MetadataState._stream_deleted,
    r.ObjectsPrepared: MetadataState._objects_prepared,
    r.StreamSetObjectCommitted: MetadataState._stream_set_object_committed,
    r.StreamObjectCommitted: MetadataState._stream_object_committed,
    r.ObjectsMarkedForDeletion: MetadataState._objects_marked_for_deletion,
    r.ObjectsDestroyed: MetadataState._objects_destroyed,
    r.WalRecoveryJobCreated: MetadataState._wal_recovery_job_created,
    r.WalRecoveryJobClaimed: MetadataState._wal_recovery_job_claimed,
    r.WalRecoveryJobReleased: MetadataState._wal_recovery_job_released,
    r.WalRecoveryJobCancelled: MetadataState._wal_recovery_job_cancelled,
    r.WalRecoveryJobCompleted: MetadataState._wal_recovery_job_completed,
    r.AclsCreated: MetadataState._acls_created,
    r.AclsDeleted: MetadataState._acls_deleted,
    r.ClientQuotasAltered: MetadataState._client_quotas_altered,
    r.GroupConfigsAltered: MetadataState._group_configs_altered,
}
assert set(_HANDLERS) == set(r.RECORD_TYPES.values()), "every record type needs a handler"
