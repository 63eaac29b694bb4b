"""Validation of every controller request: a request either raises a specific
`MetadataError` before touching the state, or emits the records that carry it out (sans I/O).

A command runs inside a `Tx`: `tx.emit(record)` applies the record to the state at once (so
later steps of the same command, and later commands of the same group commit, see it) and
collects it for the metadata log. Commands validate everything before their first emit, so
an error never leaves half a change behind. The clock is an argument (`tx.now_ms`), which
keeps these functions deterministic under test.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping

from automq.broker import group_configs, topic_configs
from automq.broker.controller import records as r
from automq.broker.controller.placement import Placement, counted_node
from automq.broker.controller.protocol import (
    BrokerNotAvailableError,
    Endpoint,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTopicError,
    ObjectConflictError,
    PartitionInfo,
    ReassignmentInProgressError,
    TopicExistsError,
    TopicInfo,
    UnknownTopicError,
    WalRecoveryJobError,
    WalRecoveryPendingError,
)
from automq.broker.controller.state import (
    COMMITTED,
    MARKED,
    PREPARED,
    BrokerState,
    JobState,
    MetadataState,
    PartitionState,
    StreamState,
)
from automq.broker.storage.metadata import (
    CommitStreamSetObjectRequest,
    NodeFencedError,
    ObjectMetadata,
    ObjectNotPreparedError,
    ObjectType,
    OffsetMismatchError,
    StreamFencedError,
    StreamMetadata,
    StreamNotFoundError,
    StreamNotOpenError,
    StreamObject,
)

MAX_PARTITIONS_PER_TOPIC = 10_000
MAX_PREPARE_COUNT = 10_000
MAX_PREPARE_TTL_MS = 24 * 3_600_000
GC_BATCH = 1_000

_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


class Tx:
    """One command's view: the state, the time, and the records it emitted."""

    def __init__(self, state: MetadataState, now_ms: int, records: list[r.Record] | None = None) -> None:
        self.state = state
        self.now_ms = now_ms
        self.records: list[r.Record] = [] if records is None else records
        self._placement: Placement | None = None

    def emit(self, record: r.Record) -> None:
        self.state.apply(record)
        self.records.append(record)

    @property
    def placement(self) -> Placement:
        if self._placement is None:
            self._placement = Placement(self.state)
        return self._placement


# --------------------------------------------------------------------------- checks


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidRequestError(message)


def check_node(state: MetadataState, node_id: int, node_epoch: int) -> BrokerState:
    """The caller is a registered, unfenced broker under its current node epoch."""
    b = state.brokers.get(node_id)
    if b is None:
        raise NodeFencedError(f"node {node_id} is not registered; register first")
    if node_epoch != b.node_epoch:
        raise NodeFencedError(f"node {node_id} epoch {node_epoch} is not current ({b.node_epoch}); register again")
    if b.state == "fenced":
        raise NodeFencedError(f"node {node_id} epoch {node_epoch} was fenced; register again")
    return b


def check_committer(state: MetadataState, node_id: int, node_epoch: int) -> None:
    """Like check_node, but a fenced node's id is also accepted under the recovery epoch of
    its claimed WAL recovery job: the recoverer commits that WAL's data as the dead node."""
    b = state.brokers.get(node_id)
    if b is not None and b.state == "fenced" and node_epoch == b.node_epoch:
        job = state.pending_job_for(node_id)
        if job is not None and job.state == "claimed" and job.recovery_epoch == node_epoch:
            return
    check_node(state, node_id, node_epoch)


def _stream(state: MetadataState, stream_id: int) -> StreamState:
    s = state.streams.get(stream_id)
    if s is None:
        raise StreamNotFoundError(f"stream {stream_id} does not exist")
    return s


def _partition(state: MetadataState, topic: str, partition: int) -> PartitionState:
    if topic not in state.topics:
        raise UnknownTopicError(f"topic {topic!r} does not exist")
    p = state.partition(topic, partition)
    if p is None:
        raise UnknownTopicError(f"topic {topic!r} has no partition {partition}")
    return p


def _recovery_blocks(state: MetadataState, s: StreamState) -> bool:
    """The stream is held open by a fenced broker whose WAL is not recovered yet."""
    if s.state != "open":
        return False
    owner = state.brokers.get(s.owner)
    return (owner is not None and owner.state == "fenced") or state.pending_job_for(s.owner) is not None


def _check_writer(state: MetadataState, s: StreamState, epoch: int, node_id: int) -> None:
    """`node_id` may append to `s` under `epoch`: it is the open owner, or it claimed the
    recovery of the fenced owner's WAL."""
    if epoch < s.epoch:
        raise StreamFencedError(f"stream {s.stream_id} epoch {epoch} is stale (current {s.epoch})")
    if epoch > s.epoch:
        raise StreamNotOpenError(f"stream {s.stream_id} was never opened under epoch {epoch} (current {s.epoch})")
    if s.state != "open":
        raise StreamNotOpenError(f"stream {s.stream_id} is closed")
    if s.owner == node_id:
        return
    job = state.pending_job_for(s.owner)
    if job is not None and job.state == "claimed" and job.claimed_by == node_id:
        return
    raise StreamNotOpenError(f"stream {s.stream_id} is open by node {s.owner}, not {node_id}")


def _check_prepared(state: MetadataState, oid: int, now_ms: int) -> None:
    obj = state.objects.get(oid)
    if obj is None or obj.state != PREPARED:
        raise ObjectNotPreparedError(f"object {oid} was not prepared, or is already committed")
    if obj.expires_at_ms < now_ms:
        raise ObjectNotPreparedError(f"object {oid} expired at {obj.expires_at_ms} (now {now_ms})")


# --------------------------------------------------------------------------- cluster


def init_cluster(tx: Tx, cluster_id: str) -> None:
    if not tx.state.cluster_id:
        tx.emit(r.ClusterInitialized(cluster_id))


def register_broker(tx: Tx, node_id: int, endpoints: list[Endpoint], rack: str | None) -> int:
    _require(node_id >= 0, f"node_id must be >= 0, got {node_id}")
    for e in endpoints:
        _require(bool(e.listener) and bool(e.host) and 0 < e.port < 65536, f"bad endpoint {e}")
    state = tx.state
    old = state.brokers.get(node_id)
    epoch = old.node_epoch + 1 if old else 1
    tx.emit(r.BrokerRegistered(node_id, epoch, [[e.listener, e.host, e.port] for e in endpoints], rack, tx.now_ms))
    if old is not None and old.state == "draining":
        tx.emit(r.BrokerStateChanged(node_id, "draining"))
    job = state.pending_job_for(node_id)
    if job is not None:
        # It is back (same node id, so same volume / S3 WAL keys) and recovers its own WAL
        # before it opens streams; its streams stay open to it so that recovery can commit.
        # A claimer's recovery epoch is below the new node epoch now: it stops committing.
        tx.emit(r.WalRecoveryJobCancelled(job.job_id))
    place_offline_partitions(tx)
    continue_drains(tx)
    return epoch


def heartbeat(tx: Tx, node_id: int, node_epoch: int) -> str:
    return check_node(tx.state, node_id, node_epoch).state


def unregister_broker(tx: Tx, node_id: int, node_epoch: int) -> None:
    check_node(tx.state, node_id, node_epoch)
    fence_broker(tx, node_id)


def fence_broker(tx: Tx, node_id: int) -> None:
    """Stop trusting a broker (session expired, graceful exit, or the operator said so)."""
    state = tx.state
    b = state.brokers.get(node_id)
    if b is None:
        raise BrokerNotAvailableError(f"node {node_id} is not registered")
    if b.state == "fenced":
        return
    tx.emit(r.BrokerStateChanged(node_id, "fenced"))
    for job in list(state.jobs.values()):
        if job.state == "claimed" and job.claimed_by == node_id:
            tx.emit(r.WalRecoveryJobReleased(job.job_id))
    open_streams = sorted(s.stream_id for s in state.streams.values() if s.owner == node_id and s.state == "open")
    if open_streams and state.pending_job_for(node_id) is None:
        tx.emit(r.WalRecoveryJobCreated(state.next_job_id, node_id, b.node_epoch, open_streams, tx.now_ms))
    held = set(open_streams)
    for t in list(state.topics.values()):
        for p in t.partitions:
            if p.leader == node_id:
                if p.stream_id in held:
                    # its WAL may hold acknowledged data: nobody leads until it is recovered. A
                    # move in progress keeps its target, where the partition goes once it is.
                    tx.placement.release(t.name, counted_node(p))
                    target = p.target if p.state == "moving" else -1
                    tx.emit(r.PartitionChanged(t.name, p.partition, -1, p.leader_epoch, "offline", target))
                else:
                    _move_now(tx, p, prefer=p.target if p.state == "moving" else -1)
            elif p.state == "moving" and p.target == node_id:
                tx.placement.release(t.name, node_id)
                tx.emit(r.PartitionChanged(t.name, p.partition, p.leader, p.leader_epoch, "moving", -1))


def _move_now(tx: Tx, p: PartitionState, prefer: int = -1) -> None:
    """Give a partition whose stream nobody holds open to a new leader under a new epoch."""
    tx.placement.release(p.topic, counted_node(p))
    leader = tx.placement.choose(p.topic, exclude=(), prefer=prefer)
    if leader < 0:
        tx.emit(r.PartitionChanged(p.topic, p.partition, -1, p.leader_epoch, "offline", -1))
    else:
        tx.emit(r.PartitionChanged(p.topic, p.partition, leader, p.leader_epoch + 1, "online", -1))


def place_offline_partitions(tx: Tx) -> None:
    state = tx.state
    if not tx.placement.candidates():
        return
    for t in list(state.topics.values()):
        for p in t.partitions:
            if p.leader >= 0 or p.state != "offline":
                continue
            s = state.streams.get(p.stream_id)
            if s is not None and _recovery_blocks(state, s):
                continue
            target = p.target if p.target in tx.placement.candidates() else -1
            if s is not None and s.state == "open":
                # Its owner is back and replays its WAL into the stream: only it may hold the
                # stream until it closes it. An interrupted move resumes from that owner.
                owner = state.brokers.get(s.owner)
                if owner is not None and owner.state != "fenced" and 0 <= target != s.owner:
                    tx.emit(r.PartitionChanged(t.name, p.partition, s.owner, p.leader_epoch, "moving", target))
                    tx.placement.choose(t.name, prefer=target)  # the move counts against its target
                    continue
                prefer = s.owner
            else:
                prefer = target
            leader = tx.placement.choose(t.name, prefer=prefer)
            tx.emit(r.PartitionChanged(t.name, p.partition, leader, p.leader_epoch + 1, "online", -1))


def continue_drains(tx: Tx) -> None:
    """Partitions still led by draining brokers (no target was available) get one now."""
    state = tx.state
    draining = {b.node_id for b in state.brokers.values() if b.state == "draining"}
    if not draining:
        return
    for t in list(state.topics.values()):
        for p in t.partitions:
            if p.leader in draining and (p.state == "online" or (p.state == "moving" and p.target < 0)):
                target = tx.placement.choose(t.name, exclude=(p.leader,))
                if target < 0:
                    return
                tx.placement.release(t.name, p.leader)
                tx.emit(r.PartitionChanged(t.name, p.partition, p.leader, p.leader_epoch, "moving", target))


def drain_broker(tx: Tx, node_id: int) -> None:
    b = tx.state.brokers.get(node_id)
    if b is None or b.state == "fenced":
        raise BrokerNotAvailableError(f"node {node_id} is not an active broker")
    if b.state != "draining":
        tx.emit(r.BrokerStateChanged(node_id, "draining"))
    continue_drains(tx)


def undrain_broker(tx: Tx, node_id: int) -> None:
    b = tx.state.brokers.get(node_id)
    if b is None or b.state == "fenced":
        raise BrokerNotAvailableError(f"node {node_id} is not an active broker")
    if b.state == "draining":
        tx.emit(r.BrokerStateChanged(node_id, "active"))
        # partitions created while every broker was draining have no leader yet: this one can take them
        place_offline_partitions(tx)


def reassign_partition(tx: Tx, topic: str, partition: int, target: int) -> None:
    state = tx.state
    p = _partition(state, topic, partition)
    b = state.brokers.get(target)
    if b is None or b.state != "active":
        raise BrokerNotAvailableError(f"node {target} is not an active, non-draining broker")
    if p.state == "moving":
        raise ReassignmentInProgressError(f"{topic}-{partition} is already moving to node {p.target}")
    if p.leader == target:
        return
    s = state.streams[p.stream_id]
    if p.leader < 0:
        if _recovery_blocks(state, s):
            raise WalRecoveryPendingError(f"{topic}-{partition} waits for the WAL recovery of node {s.owner}")
        tx.emit(r.PartitionChanged(topic, partition, target, p.leader_epoch + 1, "online", -1))
    elif s.state == "open" and s.owner == p.leader:
        # graceful: the old leader uploads and closes, then calls partition_closed
        tx.emit(r.PartitionChanged(topic, partition, p.leader, p.leader_epoch, "moving", target))
    else:
        # the leader does not hold the stream open: nothing to hand over
        tx.emit(r.PartitionChanged(topic, partition, target, p.leader_epoch + 1, "online", -1))


def partition_closed(tx: Tx, topic: str, partition: int, node_id: int, node_epoch: int, leader_epoch: int) -> None:
    state = tx.state
    check_node(state, node_id, node_epoch)
    p = _partition(state, topic, partition)
    if leader_epoch < p.leader_epoch or p.leader != node_id or p.state != "moving":
        return  # already moved on (a retry, or a move that completed some other way)
    if leader_epoch > p.leader_epoch:
        raise StreamFencedError(f"{topic}-{partition} leader epoch {leader_epoch} is ahead of {p.leader_epoch}")
    s = state.streams[p.stream_id]
    if s.state == "open" and s.owner == node_id:
        raise InvalidRequestError(f"{topic}-{partition}: close stream {s.stream_id} before partition_closed")
    _finish_move(tx, p)


def _finish_move(tx: Tx, p: PartitionState) -> None:
    """The old leader no longer holds the stream: the target leads under the next epoch (or,
    if the target went away meanwhile, whichever broker placement picks)."""
    tb = tx.state.brokers.get(p.target)
    if tb is None or tb.state != "active":
        _move_now(tx, p)
    else:
        tx.emit(r.PartitionChanged(p.topic, p.partition, p.target, p.leader_epoch + 1, "online", -1))


# --------------------------------------------------------------------------- topics


def _validate_configs(configs: Mapping[str, str | None], allow_none: bool) -> None:
    """Kafka's topic configs, checked by the one table of them (`automq.broker.topic_configs`),
    so the controller refuses exactly what a broker refuses: a direct API caller (operator,
    tools) cannot store a key or value a broker would not accept (INVALID_CONFIG)."""
    for key, value in configs.items():
        if value is None and allow_none:
            if key not in topic_configs.TOPIC_CONFIGS:
                raise InvalidConfigError(f"Unknown topic config name: {key}")
            continue  # removes the key: back to the broker default
        if not isinstance(value, str) and value is not None:
            raise InvalidConfigError(f"topic config {key!r} must be a string, got {type(value).__name__}")
        try:
            topic_configs.validate_value(key, value)
        except topic_configs.TopicConfigError as exc:
            raise InvalidConfigError(str(exc)) from None


def validate_topic_name(name: str) -> None:
    if not isinstance(name, str) or not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is invalid: 1-249 characters of [a-zA-Z0-9._-], not '.' or '..'")


def topic_info(state: MetadataState, name: str) -> TopicInfo:
    t = state.topics[name]
    return TopicInfo(
        t.name,
        t.topic_id,
        tuple(
            PartitionInfo(p.topic, p.partition, p.stream_id, p.leader, p.leader_epoch, p.state, p.target)
            for p in t.partitions
        ),
        dict(t.configs),
    )


def _add_partitions(tx: Tx, name: str, topic_id: str, start: int, end: int) -> None:
    for i in range(start, end):
        sid = tx.state.next_stream_id
        tx.emit(r.StreamCreated(sid, {"topic": name, "partition": str(i), "topic_id": topic_id}))
        leader = tx.placement.choose(name)
        tx.emit(r.PartitionCreated(name, i, sid, leader, 0, "online" if leader >= 0 else "offline"))


def create_topic(tx: Tx, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
    validate_topic_name(name)
    if name in tx.state.topics:
        raise TopicExistsError(f"topic {name!r} already exists")
    if not 1 <= partitions <= MAX_PARTITIONS_PER_TOPIC:
        raise InvalidPartitionsError(f"partitions must be 1..{MAX_PARTITIONS_PER_TOPIC}, got {partitions}")
    _validate_configs(configs, allow_none=False)
    topic_id = str(uuid.uuid4())
    tx.emit(r.TopicCreated(name, topic_id, dict(configs)))
    _add_partitions(tx, name, topic_id, 0, partitions)
    return topic_info(tx.state, name)


def delete_topic(tx: Tx, name: str) -> None:
    t = tx.state.topics.get(name)
    if t is None:
        raise UnknownTopicError(f"topic {name!r} does not exist")
    for p in t.partitions:
        if p.stream_id in tx.state.streams:
            tx.emit(r.StreamDeleted(p.stream_id, tx.now_ms))
    tx.emit(r.TopicDeleted(name))


def create_partitions(tx: Tx, name: str, total_count: int) -> TopicInfo:
    t = tx.state.topics.get(name)
    if t is None:
        raise UnknownTopicError(f"topic {name!r} does not exist")
    if total_count <= len(t.partitions):
        raise InvalidPartitionsError(
            f"topic {name!r} has {len(t.partitions)} partitions; the new count must be larger, got {total_count}"
        )
    if total_count > MAX_PARTITIONS_PER_TOPIC:
        raise InvalidPartitionsError(f"at most {MAX_PARTITIONS_PER_TOPIC} partitions per topic, got {total_count}")
    _add_partitions(tx, name, t.topic_id, len(t.partitions), total_count)
    return topic_info(tx.state, name)


def alter_topic_configs(tx: Tx, name: str, configs: dict[str, str | None]) -> None:
    if name not in tx.state.topics:
        raise UnknownTopicError(f"topic {name!r} does not exist")
    _validate_configs(configs, allow_none=True)
    if configs:
        tx.emit(r.TopicConfigsAltered(name, dict(configs)))


def alter_group_configs(tx: Tx, group_id: str, configs: dict[str, str | None]) -> None:
    """Per-group dynamic configs, checked by the one table of them (`automq.broker.group_configs`)."""
    current = tx.state.group_configs.get(group_id, {})
    ops = [
        (k, topic_configs.AlterConfigOp.DELETE if v is None else topic_configs.AlterConfigOp.SET, v)
        for k, v in configs.items()
    ]
    try:
        changes = group_configs.apply_incremental(current, ops)
    except topic_configs.TopicConfigError as exc:
        raise InvalidConfigError(str(exc)) from None
    if changes:
        tx.emit(r.GroupConfigsAltered(group_id, changes))


# --------------------------------------------------------------------------- streams


def create_stream(tx: Tx, tags: dict[str, str] | None) -> int:
    sid = tx.state.next_stream_id
    tx.emit(r.StreamCreated(sid, dict(tags or {})))
    return sid


def open_stream(tx: Tx, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> StreamMetadata:
    state = tx.state
    check_node(state, node_id, node_epoch)
    s = _stream(state, stream_id)
    if epoch < s.epoch:
        raise StreamFencedError(f"stream {stream_id} epoch {epoch} is stale (current {s.epoch})")
    where = state.partition_of_stream.get(stream_id)
    if where is not None:
        p = state.partition(*where)
        assert p is not None, "partition_of_stream names only existing partitions"
        if p.leader != node_id or p.leader_epoch != epoch:
            raise StreamFencedError(
                f"stream {stream_id} belongs to {where[0]}-{where[1]}, led by node {p.leader} "
                f"under leader epoch {p.leader_epoch}; node {node_id} asked with epoch {epoch}"
            )
    if epoch == s.epoch and s.state == "open" and s.owner == node_id:
        return state.stream_metadata(s)  # a retry, or the owner restarting
    if s.owner != node_id and _recovery_blocks(state, s):
        raise WalRecoveryPendingError(f"stream {stream_id}: the WAL of node {s.owner} is not recovered yet")
    if epoch == s.epoch and s.ranges and s.ranges[-1].node_id != node_id:
        raise StreamFencedError(f"stream {stream_id} epoch {epoch} already belongs to node {s.ranges[-1].node_id}")
    tx.emit(r.StreamOpened(stream_id, epoch, node_id))
    return state.stream_metadata(s)


def close_stream(tx: Tx, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> None:
    state = tx.state
    check_node(state, node_id, node_epoch)
    s = _stream(state, stream_id)
    if epoch < s.epoch:
        raise StreamFencedError(f"stream {stream_id} epoch {epoch} is stale (current {s.epoch})")
    if s.owner != node_id:
        raise StreamNotOpenError(f"stream {stream_id} is not owned by node {node_id} under epoch {epoch}")
    # An epoch above the stream's is the owner releasing a stream it was given again under a
    # newer leader epoch without opening it yet (it restarted meanwhile): still its own.
    if s.state == "open":
        tx.emit(r.StreamClosed(stream_id))
        # Closing the stream of a moving partition is the handover itself: the move completes
        # in the same log entry, so a lost partition_closed answer cannot strand it.
        where = state.partition_of_stream.get(stream_id)
        p = state.partition(*where) if where is not None else None
        if p is not None and p.state == "moving" and p.leader == node_id:
            _finish_move(tx, p)


def trim_stream(tx: Tx, stream_id: int, epoch: int, new_start_offset: int, node_id: int, node_epoch: int) -> None:
    state = tx.state
    check_node(state, node_id, node_epoch)
    s = _stream(state, stream_id)
    if epoch < s.epoch:
        raise StreamFencedError(f"stream {stream_id} epoch {epoch} is stale (current {s.epoch})")
    if epoch > s.epoch or s.owner != node_id:
        raise StreamNotOpenError(f"stream {stream_id} is not owned by node {node_id} under epoch {epoch}")
    _require(new_start_offset >= 0, f"new_start_offset must be >= 0, got {new_start_offset}")
    if new_start_offset > s.start_offset:  # never backwards; a smaller value is a stale retry
        tx.emit(r.StreamTrimmed(stream_id, new_start_offset, tx.now_ms))


def delete_stream(tx: Tx, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> None:
    state = tx.state
    check_node(state, node_id, node_epoch)
    s = _stream(state, stream_id)
    if epoch < s.epoch:
        raise StreamFencedError(f"stream {stream_id} epoch {epoch} is stale (current {s.epoch})")
    if stream_id in state.partition_of_stream:
        topic, part = state.partition_of_stream[stream_id]
        raise InvalidRequestError(f"stream {stream_id} is partition {topic}-{part}'s; delete the topic instead")
    tx.emit(r.StreamDeleted(stream_id, tx.now_ms))


def get_streams(state: MetadataState, stream_ids: list[int]) -> list[StreamMetadata]:
    return [state.stream_metadata(state.streams[i]) for i in stream_ids if i in state.streams]


# --------------------------------------------------------------------------- objects


def prepare_objects(tx: Tx, count: int, ttl_ms: int) -> int:
    _require(1 <= count <= MAX_PREPARE_COUNT, f"count must be 1..{MAX_PREPARE_COUNT}, got {count}")
    _require(1 <= ttl_ms <= MAX_PREPARE_TTL_MS, f"ttl_ms must be 1..{MAX_PREPARE_TTL_MS}, got {ttl_ms}")
    first = tx.state.next_object_id
    tx.emit(r.ObjectsPrepared(first, count, tx.now_ms + ttl_ms))
    return first


def _merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """a minus b, both merged."""
    out: list[tuple[int, int]] = []
    for start, end in a:
        cur = start
        for bs, be in b:
            if be <= cur or bs >= end:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < end:
            out.append((cur, end))
    return out


def _check_swap(
    state: MetadataState, sources: list[int], new: dict[int, list[tuple[int, int]]], only_stream: int | None
) -> None:
    """A compaction's new ranges hold exactly the sources' live data (minus what a trim made
    garbage meanwhile), so the swap neither loses nor duplicates an offset."""
    held: dict[int, list[tuple[int, int]]] = {}
    for oid in sources:
        obj = state.objects.get(oid)
        if obj is None or obj.state != COMMITTED:
            raise ObjectConflictError(f"compaction source object {oid} is no longer live")
        mine = [rg for rg in obj.ranges if only_stream is None or rg[0] == only_stream]
        if not mine:
            raise ObjectConflictError(f"compaction source object {oid} holds no live data of the compacted streams")
        for sid, start, end in mine:
            held.setdefault(sid, []).append((start, end))
    for sid in set(held) | set(new):
        have = _merge(held.get(sid, []))
        got = _merge(new.get(sid, []))
        if _subtract(got, have):
            raise ObjectConflictError(f"stream {sid}: compacted ranges {got} hold data the sources {have} do not")
        s = state.streams.get(sid)
        floor = s.start_offset if s is not None else None
        for start, end in _subtract(have, got):
            if floor is not None and end > floor:
                raise ObjectConflictError(f"stream {sid}: compaction drops live offsets [{start},{end})")


def _same_commit(state: MetadataState, req: CommitStreamSetObjectRequest) -> bool:
    """Every object of the request is already committed exactly so: a retried request."""
    ids = ([req.object_id] if req.object_id >= 0 else []) + [so.object_id for so in req.stream_objects]
    if not ids:
        return False
    for oid in ids:
        obj = state.objects.get(oid)
        if obj is None or obj.state == PREPARED or obj.node_id != req.node_id:
            return False
    return not (req.object_id >= 0 and state.objects[req.object_id].object_size != req.object_size)


def commit_stream_set_object(tx: Tx, req: CommitStreamSetObjectRequest) -> None:
    state = tx.state
    compaction = bool(req.compacted_object_ids)
    if not compaction or req.node_id >= 0:
        check_committer(state, req.node_id, req.node_epoch)
    if _same_commit(state, req):
        return
    _require(req.object_id >= 0 or not req.stream_ranges, "stream_ranges need a stream-set object (object_id >= 0)")
    _require(req.object_id >= 0 or bool(req.stream_objects), "nothing to commit: no object and no stream objects")
    _require(req.object_size >= 0, "object_size must be >= 0")
    ids = ([req.object_id] if req.object_id >= 0 else []) + [so.object_id for so in req.stream_objects]
    _require(len(set(ids)) == len(ids), f"object ids repeat in one commit: {ids}")
    for oid in ids:
        _check_prepared(state, oid, tx.now_ms)
    pieces: list[tuple[int, int, int, int | None]] = [
        (rg.stream_id, rg.start_offset, rg.end_offset, rg.epoch) for rg in req.stream_ranges
    ] + [(so.stream_id, so.start_offset, so.end_offset, None) for so in req.stream_objects]
    for sid, start, end, _ in pieces:
        _require(0 <= start < end, f"stream {sid}: empty or negative range [{start},{end})")
    for so in req.stream_objects:
        _require(so.object_size >= 0, "object_size must be >= 0")
        _require(
            not so.source_object_ids,
            "stream objects of an upload replace nothing; compaction uses commit_stream_object",
        )
    if compaction:
        _require(req.object_id not in req.compacted_object_ids, "an object cannot replace itself")
        new: dict[int, list[tuple[int, int]]] = {}
        for sid, start, end, _ in pieces:
            new.setdefault(sid, []).append((start, end))
        _check_swap(state, list(req.compacted_object_ids), new, None)
        for oid in req.compacted_object_ids:
            if state.objects[oid].object_type != ObjectType.STREAM_SET:
                raise ObjectConflictError(f"object {oid} is not a stream-set object")
    else:
        expected: dict[int, int] = {}
        for sid, start, end, epoch in sorted(pieces, key=lambda x: (x[0], x[1])):
            s = _stream(state, sid)
            _check_writer(state, s, s.epoch if epoch is None else epoch, req.node_id)
            at = expected.get(sid, s.end_offset)
            if start != at:
                raise OffsetMismatchError(f"stream {sid}: range starts at {start}, committed end is {at}")
            expected[sid] = end
    tx.emit(
        r.StreamSetObjectCommitted(
            req.object_id,
            req.object_size,
            req.node_id,
            [[rg.stream_id, rg.start_offset, rg.end_offset] for rg in req.stream_ranges],
            [[so.object_id, so.object_size, so.stream_id, so.start_offset, so.end_offset] for so in req.stream_objects],
            list(req.compacted_object_ids),
            tx.now_ms,
        )
    )


def commit_stream_object(tx: Tx, obj: StreamObject, node_id: int, node_epoch: int) -> None:
    state = tx.state
    if not obj.source_object_ids or node_id >= 0:
        check_committer(state, node_id, node_epoch)
    existing = state.objects.get(obj.object_id)
    if (
        existing is not None
        and existing.state != PREPARED
        and existing.node_id == node_id
        and existing.object_size == obj.object_size
    ):
        return  # a retry of a commit that went through
    _require(0 <= obj.start_offset < obj.end_offset, f"empty or negative range [{obj.start_offset},{obj.end_offset})")
    _require(obj.object_size >= 0, "object_size must be >= 0")
    _check_prepared(state, obj.object_id, tx.now_ms)
    s = _stream(state, obj.stream_id)
    if obj.source_object_ids:
        _require(obj.object_id not in obj.source_object_ids, "an object cannot replace itself")
        _check_swap(
            state, list(obj.source_object_ids), {obj.stream_id: [(obj.start_offset, obj.end_offset)]}, obj.stream_id
        )
    else:
        _check_writer(state, s, s.epoch, node_id)
        if obj.start_offset != s.end_offset:
            raise OffsetMismatchError(
                f"stream {obj.stream_id}: range starts at {obj.start_offset}, committed end is {s.end_offset}"
            )
    tx.emit(
        r.StreamObjectCommitted(
            obj.object_id,
            obj.object_size,
            obj.stream_id,
            obj.start_offset,
            obj.end_offset,
            list(obj.source_object_ids),
            node_id,
            tx.now_ms,
        )
    )


def get_objects(
    state: MetadataState, stream_id: int, start_offset: int, end_offset: int, limit: int
) -> list[ObjectMetadata]:
    s = _stream(state, stream_id)
    _require(limit >= 1, f"limit must be >= 1, got {limit}")
    _require(start_offset >= 0, f"start_offset must be >= 0, got {start_offset}")
    end = s.end_offset if end_offset < 0 else end_offset
    return state.objects_for(stream_id, start_offset, end, limit)


def get_stream_set_objects(state: MetadataState, node_id: int | None) -> list[ObjectMetadata]:
    return [
        state.object_metadata(o)
        for o in sorted(state.objects.values(), key=lambda o: o.object_id)
        if o.state == COMMITTED and o.object_type == ObjectType.STREAM_SET and (node_id is None or o.node_id == node_id)
    ]


# --------------------------------------------------------------------------- garbage collection


def expire_prepared(tx: Tx) -> int:
    """Prepared ids past their TTL become garbage (whatever was written under them goes)."""
    objects = tx.state.objects
    expired = [oid for oid in tx.state.prepared_ids if objects[oid].expires_at_ms < tx.now_ms]
    expired = sorted(expired)[:GC_BATCH]
    if expired:
        tx.emit(r.ObjectsMarkedForDeletion(expired, tx.now_ms))
    return len(expired)


def deletable_objects(state: MetadataState, now_ms: int, retention_ms: int) -> list[int]:
    """Ids marked for deletion at least `retention_ms` ago: readers that listed them before
    they were replaced have had that long to finish."""
    ids = [oid for oid in state.marked_ids if state.objects[oid].marked_at_ms + retention_ms <= now_ms]
    return sorted(ids)[:GC_BATCH]


def objects_destroyed(tx: Tx, object_ids: list[int]) -> None:
    gone = [oid for oid in object_ids if oid in tx.state.objects and tx.state.objects[oid].state == MARKED]
    if gone:
        tx.emit(r.ObjectsDestroyed(gone))


# --------------------------------------------------------------------------- WAL recovery


def _job(state: MetadataState, job_id: int) -> JobState:
    job = state.jobs.get(job_id)
    if job is None:
        raise WalRecoveryJobError(f"WAL recovery job {job_id} does not exist (completed or never created)")
    return job


def _check_claimer(state: MetadataState, node_id: int, node_epoch: int) -> None:
    if node_id != -1:  # -1: the operator, which is no broker
        check_node(state, node_id, node_epoch)


def claim_wal_recovery(tx: Tx, job_id: int, node_id: int, node_epoch: int) -> int:
    """Returns the recovery epoch: commit the recovered data as (job.node_id, that epoch)."""
    _check_claimer(tx.state, node_id, node_epoch)
    job = _job(tx.state, job_id)
    if job.state == "claimed":
        if job.claimed_by == node_id:
            return job.recovery_epoch
        raise WalRecoveryJobError(f"WAL recovery job {job_id} is claimed by node {job.claimed_by}")
    dead = tx.state.brokers[job.node_id]
    if dead.state != "fenced":
        raise WalRecoveryJobError(f"node {job.node_id} registered again and recovers its own WAL")
    recovery_epoch = dead.node_epoch + 1
    tx.emit(r.WalRecoveryJobClaimed(job_id, node_id, recovery_epoch))
    return recovery_epoch


def complete_wal_recovery(tx: Tx, job_id: int, node_id: int, node_epoch: int) -> None:
    _check_claimer(tx.state, node_id, node_epoch)
    job = _job(tx.state, job_id)
    if job.state != "claimed" or job.claimed_by != node_id:
        raise WalRecoveryJobError(f"WAL recovery job {job_id} is not claimed by node {node_id}")
    tx.emit(r.WalRecoveryJobCompleted(job_id))
    place_offline_partitions(tx)


def abandon_wal_recovery(tx: Tx, job_id: int) -> None:
    """The operator gives up on a WAL (the volume is gone): the partitions reopen without it."""
    _job(tx.state, job_id)
    tx.emit(r.WalRecoveryJobCompleted(job_id))
    place_offline_partitions(tx)
