"""OffsetForLeaderEpoch (KIP-101, KIP-320): where a leader epoch ended, so a consumer that
sees a new leader epoch in its metadata can check its position was not truncated.

Answered by the partition's leader from its leader-epoch history (`kafka/leader_epochs.py`).
In this design nothing is ever truncated (a partition has one replica and its log lives in
the object store), so a consumer's position is always confirmed; the answers still follow
Kafka's rules exactly, so a client that detects truncation by comparing them finds none.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import authorizer as authz
from automq.broker.kafka import codec
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.leader_epochs import UNDEFINED_EPOCH, UNDEFINED_OFFSET
from automq.broker.kafka.partitions import NotLeaderError, Partition, UnknownPartitionError

API_KEY = 23


def leader_epoch_error(partition: Partition, current_leader_epoch: int) -> ErrorCode:
    """KIP-320's fencing of a request carrying the client's view of the leader epoch: an older
    view is FENCED_LEADER_EPOCH, a newer one (this broker has not caught up yet)
    UNKNOWN_LEADER_EPOCH; -1 means the client does not say."""
    if current_leader_epoch < 0 or current_leader_epoch == partition.leader_epoch:
        return ErrorCode.none
    if current_leader_epoch < partition.leader_epoch:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.unknown_leader_epoch


@handles(API_KEY)
async def offset_for_leader_epoch(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    partition_cls = codec.nested(cls, "EpochEndOffset")
    topic_cls = codec.nested(cls, "OffsetForLeaderTopicResult")
    partitions = ctx.broker.partitions
    topics = []
    for topic in request.topics:
        answers = []
        # Kafka asks DESCRIBE on the topic for this (a consumer's offset validation)
        denied = not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, topic.topic)
        for req in topic.partitions:
            error, epoch, end_offset = ErrorCode.none, UNDEFINED_EPOCH, UNDEFINED_OFFSET
            if denied:
                answers.append(
                    codec.build(
                        partition_cls,
                        error_code=ErrorCode.topic_authorization_failed,
                        partition=req.partition,
                        leader_epoch=epoch,
                        end_offset=end_offset,
                    )
                )
                continue
            try:
                partition = partitions.get(topic.topic, req.partition)
                error = leader_epoch_error(partition, req.current_leader_epoch)
                if error == ErrorCode.none:
                    epoch, end_offset = partition.epoch_end_offset(req.leader_epoch)
            except NotLeaderError:
                error = ErrorCode.not_leader_or_follower
            except UnknownPartitionError:
                error = ErrorCode.unknown_topic_or_partition
            answers.append(
                codec.build(
                    partition_cls,
                    error_code=error,
                    partition=req.partition,
                    leader_epoch=epoch,
                    end_offset=end_offset,
                )
            )
        topics.append(codec.build(topic_cls, topic=topic.topic, partitions=tuple(answers)))
    return codec.build(cls, throttle_time=codec.ZERO_THROTTLE, topics=tuple(topics))
