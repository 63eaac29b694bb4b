"""ListOffsets: earliest (-2), latest (-1), by timestamp, max timestamp (-3).

Latest is the high watermark for read_uncommitted and the last stable offset (the first
offset of the oldest open transaction) for read_committed, as in Kafka. EARLIEST_LOCAL (-4) is the log start (all data is
"local" in the sense that every offset is readable). By timestamp: a binary search over
batch max timestamps, then the records of the batch it ends in (uncompressed batches; a
compressed one answers with its base offset and max timestamp, and a consumer seeking there
skips the earlier records itself). MAX_TIMESTAMP reports the offset of the first record with
the largest timestamp seen by this leader (appends since it opened the partition and the tail
scanned at open): the batch is known from the appends, its records are read at query time.
EARLIEST_PENDING_UPLOAD (-6, v11, KIP-1023) asks for the first offset not yet copied to tiered
storage: this design has no tiers, so it is answered as a Kafka topic without remote storage
answers it (offset and timestamp -1, no error). A sentinel sent in a version older than the one
that introduced it is answered UNSUPPORTED_VERSION, as Kafka does.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka import codec
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.leader_epochs import leader_epoch_error
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.partitions import NotLeaderError, UnknownPartitionError
from automq.broker.storage.api import StreamClosedError

log = logging.getLogger(__name__)

API_KEY = 2
LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
EARLIEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6
# the first ListOffsets version that carries each sentinel (Kafka's timestampMinSupportedVersion)
_SENTINEL_MIN_VERSION = {MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, EARLIEST_TIERED: 9, EARLIEST_PENDING_UPLOAD: 11}


class _Denied(Exception):
    """The principal may not DESCRIBE the topic."""


@handles(API_KEY)
async def list_offsets(request, ctx: RequestContext):
    broker = ctx.broker
    cls = ctx.response_class
    partition_cls = codec.nested(cls, "ListOffsetsPartitionResponse")
    topic_cls = codec.nested(cls, "ListOffsetsTopicResponse")
    committed = getattr(request, "isolation_level", 0) == 1
    topics = []
    for topic in request.topics:
        parts = []
        denied = broker.authorizer is not None and not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, topic.name)
        for req in topic.partitions:
            error, offset, timestamp, epoch = ErrorCode.none, -1, -1, -1
            try:
                if denied:
                    raise _Denied
                partition = broker.partitions.get(topic.name, req.partition_index)
                error = leader_epoch_error(partition, getattr(req, "current_leader_epoch", -1))
                if error != ErrorCode.none:
                    pass
                elif ctx.api_version < _SENTINEL_MIN_VERSION.get(req.timestamp, 0):
                    error = ErrorCode.unsupported_version
                elif req.timestamp == EARLIEST_PENDING_UPLOAD:
                    pass  # nothing is pending a tier upload: offset -1, as Kafka without remote storage
                elif req.timestamp == LATEST:
                    offset = partition.last_stable_offset if committed else partition.high_watermark
                elif req.timestamp in (EARLIEST, EARLIEST_LOCAL, EARLIEST_TIERED):
                    offset = partition.log_start_offset
                elif req.timestamp == MAX_TIMESTAMP:
                    found = await partition.offset_of_max_timestamp()
                    if found is not None:
                        offset, timestamp = found
                elif req.timestamp >= 0:
                    found = await partition.offset_for_timestamp(req.timestamp)
                    if found is not None:
                        offset, timestamp = found
                else:
                    error = ErrorCode.invalid_request
            except (NotLeaderError, StreamClosedError):
                error = ErrorCode.not_leader_or_follower
            except UnknownPartitionError:
                error = ErrorCode.unknown_topic_or_partition
            except _Denied:
                error = ErrorCode.topic_authorization_failed
            if error != ErrorCode.none:
                offset, timestamp = -1, -1
            elif offset >= 0:
                # the epoch that wrote the offset (the leader's own for the log end), as Kafka
                # answers it, so a consumer seeking there validates against the right epoch
                epoch = partition.leader_epoch if req.timestamp == LATEST else partition.epoch_at(offset)
            parts.append(
                codec.build(
                    partition_cls,
                    partition_index=req.partition_index,
                    error_code=error,
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=epoch,
                )
            )
        topics.append(codec.build(topic_cls, name=topic.name, partitions=tuple(parts)))
    return codec.build(cls, throttle_time=codec.ZERO_THROTTLE, topics=tuple(topics))
