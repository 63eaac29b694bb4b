"""Metadata: brokers, topics, partition leaders, from the controller image this broker follows.

One replica per partition (durability is the WAL + object store): replicas = ISR = [leader].
A partition without a leader (being placed or moved) reports LEADER_NOT_AVAILABLE. Unknown
topics are created when both the request and `kafka.auto_create_topics_enable` allow it.
The controller id reported is this broker: in KRaft clusters clients never talk to the
controller quorum, and admin clients send controller-bound requests to that node id.
"""

from __future__ import annotations

import re
import uuid

from kio.schema.errors import ErrorCode

from automq.broker.controller.protocol import MetadataImage, TopicInfo
from automq.broker.kafka import authorizer as authz
from automq.broker.kafka import codec
from automq.broker.kafka.broker import INTERNAL_TOPICS
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.topic_ids import topic_uuid as topic_uuid  # re-exported: fetch.py uses it

API_KEY = 3
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def valid_topic_name(name: str) -> bool:
    return bool(_LEGAL_TOPIC.match(name)) and name not in (".", "..")


def _topic_response(cls, topic: TopicInfo, image: MetadataImage, live: set[int], operations: int = authz.OMITTED):
    partition_cls = codec.nested(cls, "MetadataResponsePartition")
    topic_cls = codec.nested(cls, "MetadataResponseTopic")
    parts = []
    for p in topic.partitions:
        has_leader = p.leader >= 0 and p.leader in live
        leader = p.leader if has_leader else -1
        nodes = (leader,) if has_leader else ()
        parts.append(
            codec.build(
                partition_cls,
                error_code=ErrorCode.none if has_leader else ErrorCode.leader_not_available,
                partition_index=p.partition,
                leader_id=leader,
                leader_epoch=p.leader_epoch,
                replica_nodes=nodes,
                isr_nodes=nodes,
                offline_replicas=(),
            )
        )
    return codec.build(
        topic_cls,
        error_code=ErrorCode.none,
        name=topic.name,
        topic_id=topic_uuid(topic.topic_id),
        is_internal=topic.name in INTERNAL_TOPICS,
        partitions=tuple(parts),
        topic_authorized_operations=operations,
    )


def _error_topic(cls, name: str | None, error: ErrorCode, topic_id: uuid.UUID | None = None):
    topic_cls = codec.nested(cls, "MetadataResponseTopic")
    if name is None and not codec.is_nullable(topic_cls, "name"):
        name = ""  # v10-v11 requests may name a topic null, their responses cannot
    return codec.build(
        topic_cls,
        error_code=error,
        name=name,
        topic_id=topic_id,
        is_internal=False,
        partitions=(),
        topic_authorized_operations=-2147483648,
    )


@handles(API_KEY)
async def metadata(request, ctx: RequestContext):
    broker = ctx.broker
    cls = ctx.response_class
    image = broker.metadata
    requested = request.topics
    all_topics = requested is None or (ctx.api_version == 0 and not requested)
    allow_auto = getattr(request, "allow_auto_topic_creation", True) and broker.config.kafka.auto_create_topics_enable

    topics = []
    checked = broker.authorizer is not None
    want_ops = bool(getattr(request, "include_topic_authorized_operations", False))
    if image is not None and all_topics:
        live = {b.node_id for b in image.brokers if b.state != "fenced"}
        topics = [
            _topic_response(cls, t, image, live, authz.operations(ctx, want_ops, authz.TOPIC, t.name))
            for t in image.topics
            if not checked or authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, t.name)  # hidden otherwise
        ]
    elif requested:
        for wanted in requested:
            name = getattr(wanted, "name", None)
            wanted_id = getattr(wanted, "topic_id", None)
            if name is None and wanted_id is not None and wanted_id.int != 0:
                info = broker.partitions.topic_by_id(wanted_id)
                if info is None:
                    topics.append(_error_topic(cls, None, ErrorCode.unknown_topic_id, wanted_id))
                    continue
                if checked and not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, info.name):
                    topics.append(_error_topic(cls, None, ErrorCode.topic_authorization_failed, wanted_id))
                    continue
            elif name is None:
                topics.append(_error_topic(cls, None, ErrorCode.invalid_request))
                continue
            else:
                if checked and not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, name):
                    # existing or not: an unauthorized client learns nothing about the name
                    topics.append(_error_topic(cls, name, ErrorCode.topic_authorization_failed))
                    continue
                info = broker.partitions.topic(name)
                if info is None:
                    if not valid_topic_name(name):
                        topics.append(_error_topic(cls, name, ErrorCode.invalid_topic_exception))
                        continue
                    if not allow_auto or name in INTERNAL_TOPICS:
                        topics.append(_error_topic(cls, name, ErrorCode.unknown_topic_or_partition))
                        continue
                    if checked and not (
                        authz.cluster_allowed(ctx, authz.Op.CREATE)
                        or authz.allowed(ctx, authz.Op.CREATE, authz.TOPIC, name)
                    ):
                        topics.append(_error_topic(cls, name, ErrorCode.topic_authorization_failed))
                        continue
                    try:
                        info = await broker.ensure_topic(name)
                    except Exception as exc:  # a controller error becomes this topic's error
                        code = getattr(exc, "code", None)
                        error = ErrorCode.__members__.get(str(code).lower(), ErrorCode.leader_not_available)
                        topics.append(_error_topic(cls, name, error))
                        continue
                    if info is None:
                        topics.append(_error_topic(cls, name, ErrorCode.leader_not_available))
                        continue
                    # the partitions placed here open in a moment; answering after that spares
                    # the client a NOT_LEADER_OR_FOLLOWER round trip on its first produce
                    await broker.partitions.wait_opened(name, 2.0)
            image = broker.metadata
            assert image is not None, "requests are served only after the first metadata image"
            live = {b.node_id for b in image.brokers if b.state != "fenced"}
            topics.append(
                _topic_response(cls, info, image, live, authz.operations(ctx, want_ops, authz.TOPIC, info.name))
            )

    image = broker.metadata
    broker_cls = codec.nested(cls, "MetadataResponseBroker")
    brokers = []
    if image is not None:
        # as Kafka: each broker's endpoint on the listener this request came in on (an SSL
        # client is sent to SSL ports); a broker without that listener is not listed
        listener = ctx.listener
        for b in image.brokers:
            if b.state == "fenced" or not b.endpoints:
                continue
            endpoint = next((e for e in b.endpoints if e.listener == listener), None)
            if endpoint is None:
                continue
            brokers.append(
                codec.build(broker_cls, node_id=b.node_id, host=endpoint.host, port=endpoint.port, rack=b.rack)
            )
    return codec.build(
        cls,
        throttle_time=codec.ZERO_THROTTLE,
        brokers=tuple(brokers),
        cluster_id=image.cluster_id if image is not None else broker.config.cluster_id,
        controller_id=broker.node_id,
        topics=tuple(topics),
        error_code=ErrorCode.none,
        cluster_authorized_operations=authz.operations(
            ctx, bool(getattr(request, "include_cluster_authorized_operations", False)), authz.CLUSTER, "kafka-cluster"
        ),
    )
