"""Share-partition state as the group coordinator's admin APIs see it: read (for
DescribeShareGroupOffsets), reset (AlterShareGroupOffsets) and delete (DeleteShareGroupOffsets,
DeleteGroups) a share group's state on one partition.

The state belongs to the partition's leader (share/manager.py: in memory, written to the object
store with conditional writes that fence a deposed leader), so the coordinator never writes it
itself: it calls the leader, in process when that is this broker, else with Kafka's
inter-broker share-state APIs (ReadShareGroupStateSummary, WriteShareGroupState with no state
batches = a reset of the start offset, DeleteShareGroupState) over the inter-broker listener.
`local_*` are what those APIs do on the leader.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec
from automq.broker.kafka.client import BrokerConnection, KafkaClientError
from automq.broker.kafka.partitions import NotLeaderError, UnknownPartitionError
from automq.broker.kafka.share.partition_state import ACKNOWLEDGED, ACQUIRED, ARCHIVED
from automq.broker.security.client import inter_broker
from automq.broker.storage.api import StreamClosedError

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker

log = logging.getLogger(__name__)

INITIALIZE_SHARE_GROUP_STATE = 83
WRITE_SHARE_GROUP_STATE = 85
DELETE_SHARE_GROUP_STATE = 86
READ_SHARE_GROUP_STATE_SUMMARY = 87
LIST_OFFSETS = 2
REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class StateSummary:
    start_offset: int  # the share-partition start offset (SPSO)
    leader_epoch: int
    delivery_complete: int  # records above the SPSO already acknowledged or archived
    acquired: int  # records locked by a member right now (0 when the state is not loaded)
    lag: int  # records not yet delivery-complete: high watermark - SPSO - delivery_complete


def error_of(exc: BaseException) -> ErrorCode:
    if isinstance(exc, (NotLeaderError, StreamClosedError)):
        return ErrorCode.not_leader_or_follower
    if isinstance(exc, UnknownPartitionError):
        return ErrorCode.unknown_topic_or_partition
    return ErrorCode.unknown_server_error


# ---------------------------------------------------------------- on the partition's leader


async def local_summary(broker: Broker, group_id: str, topic: str, index: int) -> StateSummary | None:
    """None when the group has no state for the partition. Raises NotLeaderError /
    UnknownPartitionError when the partition is not led here."""
    partition = broker.partitions.get(topic, index)
    manager = broker.share_partitions
    share = next(
        (
            s
            for s in manager.shares()
            if s.group_id == group_id and s.partition is partition and not s.closed and not s.fenced
        ),
        None,
    )
    if share is not None:
        state = share.state
        start, done, acquired = (
            state.start_offset,
            state.count(ACKNOWLEDGED) + state.count(ARCHIVED),
            state.count(ACQUIRED),
        )
    else:
        loaded = await manager.store.load(group_id, partition.stream.stream_id)
        if loaded is None:
            return None
        snapshot = loaded[0]
        start, acquired = snapshot.start_offset, 0
        done = sum(last - first + 1 for first, last, st, _count in snapshot.ranges if st in (ACKNOWLEDGED, ARCHIVED))
    lag = max(0, partition.high_watermark - start - done)
    return StateSummary(start, partition.leader_epoch, done, acquired, lag)


async def local_initialize(broker: Broker, group_id: str, topic: str, index: int) -> None:
    await broker.share_partitions.initialize(group_id, topic, index)


async def local_reset(broker: Broker, group_id: str, topic: str, index: int, start_offset: int) -> None:
    await broker.share_partitions.reset(group_id, topic, index, start_offset)


async def local_delete(broker: Broker, group_id: str, topic: str, index: int) -> None:
    await broker.share_partitions.delete(group_id, topic, index)


# ---------------------------------------------------------------- from the coordinator


class ShareStateRouter:
    """Calls a partition's leader for a share group's state on it: in process, or over the
    inter-broker listener. Every call answers an ErrorCode instead of raising."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.security = inter_broker(broker.config)
        self._connections: dict[tuple[str, int], BrokerConnection] = {}

    async def close(self) -> None:
        for c in list(self._connections.values()):
            await c.close()
        self._connections.clear()

    def _leader(self, topic: str, index: int) -> tuple[int, uuid.UUID] | ErrorCode:
        info = self.broker.partitions.topic(topic)
        if info is None or not 0 <= index < len(info.partitions):
            return ErrorCode.unknown_topic_or_partition
        leader = self.broker.leader_of(topic, index)
        if leader is None:
            return ErrorCode.leader_not_available
        from automq.broker.kafka.topic_ids import topic_uuid

        return leader[0], topic_uuid(info.topic_id)

    async def _remote(self, node_id: int, request: Any) -> Any:
        endpoint = self.broker.endpoint_of(node_id)
        if endpoint is None:
            raise KafkaClientError(f"no inter-broker endpoint for broker {node_id}")
        host, port, _rack = endpoint
        connection = self._connections.get((host, port))
        if connection is None:
            connection = self._connections[(host, port)] = BrokerConnection(
                host, port, client_id="automq-share-coordinator", security=self.security, timeout_s=REQUEST_TIMEOUT_S
            )
        return await connection.call(request)

    async def summary(self, group_id: str, topic: str, index: int) -> StateSummary | ErrorCode | None:
        found = self._leader(topic, index)
        if isinstance(found, ErrorCode):
            return found
        leader, topic_id = found
        if leader == self.broker.node_id:
            try:
                return await local_summary(self.broker, group_id, topic, index)
            except Exception as exc:
                return self._failed("reading", group_id, topic, index, exc)
        cls = codec.request_class(READ_SHARE_GROUP_STATE_SUMMARY, 1)
        request = cls(
            group_id=group_id,
            topics=(
                codec.nested(cls, "ReadStateSummaryData")(
                    topic_id=topic_id,
                    partitions=(codec.nested(cls, "PartitionData")(partition=index, leader_epoch=-1),),
                ),
            ),
        )
        try:
            response = await self._remote(leader, request)
            [result] = response.results
            [p] = result.partitions
        except (KafkaClientError, ValueError) as exc:
            return self._failed("reading", group_id, topic, index, exc)
        if p.error_code != ErrorCode.none:
            return ErrorCode(p.error_code)
        if p.start_offset < 0:
            return None
        start, done = int(p.start_offset), int(p.delivery_complete_count)
        end = await self._high_watermark(leader, topic, index)
        lag = max(0, end - start - done) if end >= 0 else -1
        return StateSummary(start, int(p.leader_epoch), done, -1, lag)

    async def _high_watermark(self, leader: int, topic: str, index: int) -> int:
        """The partition's high watermark from its leader (ListOffsets latest), -1 if unknown."""
        cls = codec.request_class(LIST_OFFSETS, 4)
        request = cls(
            replica_id=-1,
            isolation_level=0,
            topics=(
                codec.nested(cls, "ListOffsetsTopic")(
                    name=topic,
                    partitions=(codec.nested(cls, "ListOffsetsPartition")(partition_index=index, timestamp=-1),),
                ),
            ),
        )
        try:
            response = await self._remote(leader, request)
            [t] = response.topics
            [p] = t.partitions
        except (KafkaClientError, ValueError):
            return -1
        return int(p.offset) if p.error_code == ErrorCode.none else -1

    async def initialize(self, group_id: str, topic: str, index: int) -> ErrorCode:
        """Have the leader create the group's state on the partition (start offset from the
        group's share.auto.offset.reset) unless it exists."""
        found = self._leader(topic, index)
        if isinstance(found, ErrorCode):
            return found
        leader, topic_id = found
        if leader == self.broker.node_id:
            try:
                await local_initialize(self.broker, group_id, topic, index)
                return ErrorCode.none
            except Exception as exc:
                return self._failed("initializing", group_id, topic, index, exc)
        cls = codec.request_class(INITIALIZE_SHARE_GROUP_STATE, 0)
        partition = codec.nested(cls, "PartitionData")(partition=index, state_epoch=0, start_offset=-1)
        request = cls(
            group_id=group_id,
            topics=(codec.nested(cls, "InitializeStateData")(topic_id=topic_id, partitions=(partition,)),),
        )
        return await self._simple(leader, request, "initializing", group_id, topic, index)

    async def reset(self, group_id: str, topic: str, index: int, start_offset: int) -> ErrorCode:
        found = self._leader(topic, index)
        if isinstance(found, ErrorCode):
            return found
        leader, topic_id = found
        if leader == self.broker.node_id:
            try:
                await local_reset(self.broker, group_id, topic, index, start_offset)
                return ErrorCode.none
            except Exception as exc:
                return self._failed("resetting", group_id, topic, index, exc)
        cls = codec.request_class(WRITE_SHARE_GROUP_STATE, 1)
        partition = codec.nested(cls, "PartitionData")(
            partition=index,
            state_epoch=0,
            leader_epoch=-1,
            start_offset=start_offset,
            delivery_complete_count=0,
            state_batches=(),
        )
        request = cls(
            group_id=group_id, topics=(codec.nested(cls, "WriteStateData")(topic_id=topic_id, partitions=(partition,)),)
        )
        return await self._simple(leader, request, "resetting", group_id, topic, index)

    async def delete(self, group_id: str, topic: str, index: int) -> ErrorCode:
        found = self._leader(topic, index)
        if isinstance(found, ErrorCode):
            return found
        leader, topic_id = found
        if leader == self.broker.node_id:
            try:
                await local_delete(self.broker, group_id, topic, index)
                return ErrorCode.none
            except Exception as exc:
                return self._failed("deleting", group_id, topic, index, exc)
        cls = codec.request_class(DELETE_SHARE_GROUP_STATE, 0)
        partition = codec.nested(cls, "PartitionData")(partition=index)
        request = cls(
            group_id=group_id,
            topics=(codec.nested(cls, "DeleteStateData")(topic_id=topic_id, partitions=(partition,)),),
        )
        return await self._simple(leader, request, "deleting", group_id, topic, index)

    async def partitions_with_state(self, group_id: str) -> list[tuple[str, int]]:
        """(topic, partition) of every partition the group has state for (from the object
        store, which any broker can list). State left by a deleted topic is removed here."""
        store = self.broker.share_partitions.store
        streams = await store.streams_of_group(group_id)
        if not streams:
            return []
        where: dict[int, tuple[str, int]] = {}
        image = self.broker.metadata
        for t in image.topics if image is not None else ():
            for p in t.partitions:
                where[p.stream_id] = (t.name, p.partition)
        out = []
        for stream_id in streams:
            if stream_id in where:
                out.append(where[stream_id])
            elif image is not None:
                await store.delete(group_id, stream_id)  # its topic is gone: nobody leads it
        return sorted(out)

    async def delete_all(self, group_id: str) -> ErrorCode:
        """DeleteGroups of a share group: its state on every partition goes first."""
        for topic, index in await self.partitions_with_state(group_id):
            error = await self.delete(group_id, topic, index)
            if error not in (ErrorCode.none, ErrorCode.unknown_topic_or_partition):
                return error
        return ErrorCode.none

    async def _simple(self, leader: int, request: Any, what: str, group_id: str, topic: str, index: int) -> ErrorCode:
        try:
            response = await self._remote(leader, request)
            [result] = response.results
            [p] = result.partitions
        except (KafkaClientError, ValueError) as exc:
            return self._failed(what, group_id, topic, index, exc)
        return ErrorCode(p.error_code)

    @staticmethod
    def _failed(what: str, group_id: str, topic: str, index: int, exc: BaseException) -> ErrorCode:
        code = error_of(exc)
        if isinstance(exc, KafkaClientError):
            code = ErrorCode.not_leader_or_follower  # the leader is unreachable: the caller may retry
        if code in (ErrorCode.unknown_server_error,):
            log.warning("%s share state of %r on %s-%d failed: %r", what, group_id, topic, index, exc)
        return code
