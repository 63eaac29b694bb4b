"""Cluster APIs answered with what is true of this design: ElectLeaders, DescribeTopicPartitions
(KIP-966), DescribeQuorum, AlterReplicaLogDirs, and the client-telemetry pair (KIP-714).

- ElectLeaders: a partition has one replica, its leader, so the preferred replica always
  leads and no election is ever needed (ELECTION_NOT_NEEDED). A partition without a leader
  waits for its previous leader's WAL to be recovered or for a live broker; the controller
  places it by itself, and an unclean election (a leader that skips the WAL) would lose
  acknowledged records, so both election types answer that no eligible leader is available.
- DescribeTopicPartitions: Metadata's view of partitions (replicas = ISR = [leader], no ELR),
  paged by `response_partition_limit` and a cursor as KIP-966 describes.
- DescribeQuorum: the metadata quorum is the controllers (one active, standbys tailing the
  metadata log in the object store); each one's `/v1/status` gives its term (the leader
  epoch) and how far it has read the log; brokers are observers.
- AlterReplicaLogDirs: a broker has one "log dir", the object store (see DescribeLogDirs):
  moving a replica there is a no-op, anywhere else LOG_DIR_NOT_FOUND.
- ListConfigResources (v0: client-metrics resources; v1, KIP-1142: any types): topics and
  brokers have configs here; there are no group, client-metrics or broker-logger configs.
- GetTelemetrySubscriptions / PushTelemetry: clients get an instance id and a subscription
  that requests no metrics, so they push nothing and ask again only after the push
  interval; a push anyway is accepted (and dropped) or told its subscription is stale.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
import uuid
import zlib
from typing import Any
from urllib.parse import urlsplit

from kio.schema.errors import ErrorCode

from automq.broker.controller.protocol import MetadataImage, TopicInfo
from automq.broker.kafka import authorizer as authz
from automq.broker.kafka import codec
from automq.broker.kafka.broker import INTERNAL_TOPICS
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.admin import log_dir_name
from automq.broker.kafka.handlers.metadata import topic_uuid
from automq.broker.kafka.handlers.registry import handles
from automq.broker.topic_configs import ConfigResourceType

log = logging.getLogger(__name__)

ALTER_REPLICA_LOG_DIRS = 34
ELECT_LEADERS = 43
DESCRIBE_QUORUM = 55
GET_TELEMETRY_SUBSCRIPTIONS = 71
PUSH_TELEMETRY = 72
DESCRIBE_TOPIC_PARTITIONS = 75
LIST_CONFIG_RESOURCES = 74

PREFERRED, UNCLEAN = 0, 1
# Kafka's max.request.partition.size.limit default: the most partitions one answer carries
MAX_PARTITIONS_PER_RESPONSE = 2000
METADATA_TOPIC = "__cluster_metadata"
STATUS_TIMEOUT_S = 2.0
# KIP-714: no metrics are requested, so clients only come back to re-check the subscription
TELEMETRY_PUSH_INTERVAL_MS = 5 * 60 * 1000
TELEMETRY_MAX_BYTES = 1 << 20
REQUESTED_METRICS: tuple[str, ...] = ()
# none, gzip, snappy, lz4, zstd: what a push may be compressed with (its payload is dropped)
ACCEPTED_COMPRESSION = (0, 1, 2, 3, 4)
SUBSCRIPTION_ID = zlib.crc32(repr((REQUESTED_METRICS, TELEMETRY_PUSH_INTERVAL_MS)).encode()) & 0x7FFFFFFF


def _live(image: MetadataImage | None) -> set[int]:
    return {b.node_id for b in image.brokers if b.state != "fenced"} if image is not None else set()


# --------------------------------------------------------------------------- ElectLeaders


def election_result(
    info: TopicInfo | None, partition: int, live: set[int], election_type: int
) -> tuple[ErrorCode, str]:
    """What an election of one partition comes to here (pure, see the module docstring)."""
    if info is None or not 0 <= partition < len(info.partitions):
        return ErrorCode.unknown_topic_or_partition, "The partition does not exist."
    p = info.partitions[partition]
    if p.leader >= 0 and p.leader in live:
        return ErrorCode.election_not_needed, "Leader election not needed for topic partition."
    if election_type == UNCLEAN:
        return (
            ErrorCode.eligible_leaders_not_available,
            "No eligible leader: the partition's one replica waits for its WAL to be recovered or for a live "
            "broker, and the controller places it as soon as one is; an unclean election would lose acknowledged "
            "records.",
        )
    return (
        ErrorCode.preferred_leader_not_available,
        "The preferred leader is not available: the partition waits for its WAL to be recovered or for a live "
        "broker, and the controller places it as soon as one is.",
    )


@handles(ELECT_LEADERS)
async def elect_leaders(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    result_cls = codec.nested(cls, "ReplicaElectionResult")
    partition_cls = codec.nested(cls, "PartitionResult")
    if not authz.cluster_allowed(ctx, authz.Op.ALTER):
        if codec.has_field(cls, "error_code"):
            return codec.build(
                cls,
                throttle_time=codec.ZERO_THROTTLE,
                error_code=ErrorCode.cluster_authorization_failed,
                replica_election_results=(),
            )
        denied = tuple(
            codec.build(
                result_cls,
                topic=t.topic,
                partition_result=tuple(
                    codec.build(
                        partition_cls,
                        partition_id=i,
                        error_code=ErrorCode.cluster_authorization_failed,
                        error_message=None,
                    )
                    for i in t.partitions
                ),
            )
            for t in request.topic_partitions or ()
        )
        return codec.build(cls, throttle_time=codec.ZERO_THROTTLE, replica_election_results=denied)
    election_type = getattr(request, "election_type", PREFERRED)
    broker = ctx.broker
    image = broker.metadata
    live = _live(image)
    results = []
    if election_type not in (PREFERRED, UNCLEAN):
        return codec.build(
            cls, throttle_time=codec.ZERO_THROTTLE, error_code=ErrorCode.invalid_request, replica_election_results=()
        )
    if request.topic_partitions is None:
        # all partitions: Kafka reports only those an election was attempted for
        for info in image.topics if image is not None else ():
            parts = []
            for p in info.partitions:
                code, message = election_result(info, p.partition, live, election_type)
                if code != ErrorCode.election_not_needed:
                    parts.append(
                        codec.build(partition_cls, partition_id=p.partition, error_code=code, error_message=message)
                    )
            if parts:
                results.append(codec.build(result_cls, topic=info.name, partition_result=tuple(parts)))
    else:
        for t in request.topic_partitions:
            named = broker.partitions.topic(t.topic)
            parts = []
            for i in t.partitions:
                code, message = election_result(named, i, live, election_type)
                parts.append(codec.build(partition_cls, partition_id=i, error_code=code, error_message=message))
            results.append(codec.build(result_cls, topic=t.topic, partition_result=tuple(parts)))
    return codec.build(
        cls, throttle_time=codec.ZERO_THROTTLE, error_code=ErrorCode.none, replica_election_results=tuple(results)
    )


# --------------------------------------------------------------------------- DescribeTopicPartitions


def page_topics(
    names: list[str], partition_counts: dict[str, int], cursor: tuple[str, int] | None, limit: int
) -> tuple[list[tuple[str, range]], tuple[str, int] | None]:
    """KIP-966 paging (pure): [(topic, partition range)] in name order from the cursor, at most
    `limit` partitions in all, and the cursor of what is left (None when nothing is)."""
    pages: list[tuple[str, range]] = []
    budget = max(1, limit)
    ordered = sorted(n for n in names if cursor is None or n >= cursor[0])
    for position, name in enumerate(ordered):
        count = partition_counts.get(name, 0)
        first = cursor[1] if cursor is not None and name == cursor[0] else 0
        if budget <= 0:
            return pages, (name, first)
        end = min(count, first + budget)
        pages.append((name, range(first, max(first, end))))
        budget -= max(0, end - first)
        if end < count:
            return pages, (name, end)
        if budget <= 0 and position + 1 < len(ordered):
            return pages, (ordered[position + 1], 0)
    return pages, None


@handles(DESCRIBE_TOPIC_PARTITIONS)
async def describe_topic_partitions(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    topic_cls = codec.nested(cls, "DescribeTopicPartitionsResponseTopic")
    partition_cls = codec.nested(cls, "DescribeTopicPartitionsResponsePartition")
    cursor_cls = codec.nested(cls, "Cursor")
    broker = ctx.broker
    image = broker.metadata
    known = {t.name: t for t in image.topics} if image is not None else {}
    live = _live(image)
    requested = [t.name for t in request.topics]
    fetch_all = not requested
    cursor = (request.cursor.topic_name, request.cursor.partition_index) if request.cursor is not None else None

    def error_topic(name: str, error: ErrorCode) -> Any:
        return codec.build(
            topic_cls,
            error_code=error,
            name=name,
            topic_id=uuid.UUID(int=0),
            is_internal=False,
            partitions=(),
            topic_authorized_operations=authz.OMITTED,
        )

    if cursor is not None and (cursor[1] < 0 or (not fetch_all and cursor[0] not in requested)):
        # Kafka refuses the whole request: the cursor must name a requested topic and a valid index
        return codec.build(
            cls,
            throttle_time=codec.ZERO_THROTTLE,
            topics=tuple(error_topic(n, ErrorCode.invalid_request) for n in sorted(set(requested))),
            next_cursor=None,
        )
    errors: dict[str, ErrorCode] = {}
    names: list[str] = []
    for name in sorted(set(known) if fetch_all else set(requested)):
        if cursor is not None and name < cursor[0]:
            continue
        if not authz.allowed(ctx, authz.Op.DESCRIBE, authz.TOPIC, name):
            if not fetch_all:  # a listing of all topics just leaves it out, as Metadata does
                errors[name] = ErrorCode.topic_authorization_failed
            continue
        if name not in known:
            errors[name] = ErrorCode.unknown_topic_or_partition
            continue
        names.append(name)
    limit = min(request.response_partition_limit, MAX_PARTITIONS_PER_RESPONSE)
    pages, next_cursor = page_topics(names, {n: len(known[n].partitions) for n in names}, cursor, limit)
    want_ops = True  # the field is always present; Kafka fills it when the topic is authorized
    answers = [error_topic(n, e) for n, e in errors.items()]
    for name, span in pages:
        info = known[name]
        parts = []
        for i in span:
            p = info.partitions[i]
            has_leader = p.leader >= 0 and p.leader in live
            nodes = (p.leader,) if has_leader else ()
            parts.append(
                codec.build(
                    partition_cls,
                    error_code=ErrorCode.none if has_leader else ErrorCode.leader_not_available,
                    partition_index=p.partition,
                    leader_id=p.leader if has_leader else -1,
                    leader_epoch=p.leader_epoch,
                    replica_nodes=nodes,
                    isr_nodes=nodes,
                    eligible_leader_replicas=(),
                    last_known_elr=(),
                    offline_replicas=(),
                )
            )
        answers.append(
            codec.build(
                topic_cls,
                error_code=ErrorCode.none,
                name=name,
                topic_id=topic_uuid(info.topic_id),
                is_internal=name in INTERNAL_TOPICS,
                partitions=tuple(parts),
                topic_authorized_operations=authz.operations(ctx, want_ops, authz.TOPIC, name),
            )
        )
    answers.sort(key=lambda t: t.name or "")
    return codec.build(
        cls,
        throttle_time=codec.ZERO_THROTTLE,
        topics=tuple(answers),
        next_cursor=codec.build(cursor_cls, topic_name=next_cursor[0], partition_index=next_cursor[1])
        if next_cursor is not None
        else None,
    )


# --------------------------------------------------------------------------- DescribeQuorum


@handles(DESCRIBE_QUORUM)
async def describe_quorum(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    topic_cls = codec.nested(cls, "TopicData")
    partition_cls = codec.nested(cls, "PartitionData")
    replica_cls = codec.nested(cls, "ReplicaState")

    def refuse(error: ErrorCode, message: str) -> Any:
        return codec.build(cls, error_code=error, error_message=message, topics=(), nodes=())

    if not authz.cluster_allowed(ctx, authz.Op.DESCRIBE):
        return refuse(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    broker = ctx.broker
    image = broker.metadata
    urls = list(broker.config.controller_urls)
    statuses = await asyncio.gather(*(broker.cluster.controller_status(u, STATUS_TIMEOUT_S) for u in urls))
    voters = [(u, s) for u, s in zip(urls, statuses, strict=True) if s is not None]
    # during a failover a deposed leader may still say so for a moment: the newest term wins
    leaders = [s for _u, s in voters if s.get("role") == "leader"]
    leader = max(leaders, key=lambda s: int(s.get("term", -1))) if leaders else None
    now_ms = int(time.time() * 1000)

    def voter_state(status: dict[str, Any]) -> Any:
        caught_up = leader is not None and status.get("log_seq", -1) >= leader.get("log_seq", 0)
        return codec.build(
            replica_cls,
            replica_id=int(status.get("controller_id", -1)),
            replica_directory_id=uuid.UUID(int=0),
            log_end_offset=int(status.get("log_seq", -1)),
            last_fetch_timestamp=now_ms if status.get("role") != "leader" else -1,
            last_caught_up_timestamp=now_ms if caught_up else -1,
        )

    observers = tuple(
        codec.build(
            replica_cls,
            replica_id=b.node_id,
            replica_directory_id=uuid.UUID(int=0),
            log_end_offset=-1,  # brokers follow metadata images, not the log's offsets
            last_fetch_timestamp=-1,
            last_caught_up_timestamp=-1,
        )
        for b in (image.brokers if image is not None else ())
        if b.state != "fenced"
    )
    partitions = []
    for t in request.topics:
        for p in t.partitions:
            if t.topic_name != METADATA_TOPIC or p.partition_index != 0:
                partitions.append(
                    (
                        t.topic_name,
                        codec.build(
                            partition_cls,
                            partition_index=p.partition_index,
                            error_code=ErrorCode.unknown_topic_or_partition,
                            error_message=None,
                            leader_id=-1,
                            leader_epoch=-1,
                            high_watermark=-1,
                            current_voters=(),
                            observers=(),
                        ),
                    )
                )
                continue
            if leader is None:
                error, message = ErrorCode.not_leader_or_follower, "No active controller answered."
            else:
                error, message = ErrorCode.none, None
            partitions.append(
                (
                    t.topic_name,
                    codec.build(
                        partition_cls,
                        partition_index=0,
                        error_code=error,
                        error_message=message,
                        leader_id=int(leader.get("controller_id", -1)) if leader else -1,
                        leader_epoch=int(leader.get("term", -1)) if leader else -1,
                        high_watermark=int(leader.get("log_seq", -1)) if leader else -1,
                        current_voters=tuple(voter_state(s) for _u, s in voters),
                        observers=observers,
                    ),
                )
            )
    topics = []
    for name in dict.fromkeys(n for n, _ in partitions):
        topics.append(codec.build(topic_cls, topic_name=name, partitions=tuple(p for n, p in partitions if n == name)))
    nodes = []
    if codec.has_field(cls, "nodes"):
        node_cls = codec.nested(cls, "Node")
        listener_cls = codec.nested(cls, "Listener")
        for url, status in voters:
            parts = urlsplit(url)
            nodes.append(
                codec.build(
                    node_cls,
                    node_id=int(status.get("controller_id", -1)),
                    listeners=(
                        codec.build(
                            listener_cls,
                            name=(parts.scheme or "http").upper(),
                            host=parts.hostname or "",
                            port=parts.port or (443 if parts.scheme == "https" else 80),
                        ),
                    ),
                )
            )
    return codec.build(cls, error_code=ErrorCode.none, error_message=None, topics=tuple(topics), nodes=tuple(nodes))


# --------------------------------------------------------------------------- AlterReplicaLogDirs


@handles(ALTER_REPLICA_LOG_DIRS)
async def alter_replica_log_dirs(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    topic_cls = codec.nested(cls, "AlterReplicaLogDirTopicResult")
    partition_cls = codec.nested(cls, "AlterReplicaLogDirPartitionResult")
    broker = ctx.broker
    allowed = authz.cluster_allowed(ctx, authz.Op.ALTER)
    here = log_dir_name(broker.config.object_store_url)
    by_topic: dict[str, list[Any]] = {}
    for d in request.dirs:
        for t in d.topics:
            info = broker.partitions.topic(t.name)
            for i in t.partitions:
                if not allowed:
                    error = ErrorCode.cluster_authorization_failed
                elif info is None or not 0 <= i < len(info.partitions):
                    error = ErrorCode.unknown_topic_or_partition
                elif info.partitions[i].leader != broker.node_id:
                    error = ErrorCode.replica_not_available  # no replica of it on this broker
                elif d.path != here:
                    error = ErrorCode.log_dir_not_found
                else:
                    error = ErrorCode.none  # already there: the one log dir
                by_topic.setdefault(t.name, []).append(codec.build(partition_cls, partition_index=i, error_code=error))
    results = tuple(codec.build(topic_cls, topic_name=n, partitions=tuple(ps)) for n, ps in by_topic.items())
    return codec.build(cls, throttle_time=codec.ZERO_THROTTLE, results=results)


# --------------------------------------------------------------------------- telemetry (KIP-714)


@handles(GET_TELEMETRY_SUBSCRIPTIONS)
async def get_telemetry_subscriptions(request: Any, ctx: RequestContext) -> Any:
    instance = request.client_instance_id
    if instance is None or instance.int == 0:
        instance = uuid.uuid4()  # KIP-714: the broker names a client that has no id yet
    return codec.build(
        ctx.response_class,
        throttle_time=codec.ZERO_THROTTLE,
        error_code=ErrorCode.none,
        client_instance_id=instance,
        subscription_id=SUBSCRIPTION_ID,
        accepted_compression_types=ACCEPTED_COMPRESSION,
        push_interval=datetime.timedelta(milliseconds=TELEMETRY_PUSH_INTERVAL_MS),
        telemetry_max_bytes=TELEMETRY_MAX_BYTES,
        delta_temporality=True,
        requested_metrics=REQUESTED_METRICS,
    )


@handles(PUSH_TELEMETRY)
async def push_telemetry(request: Any, ctx: RequestContext) -> Any:
    instance = request.client_instance_id
    if instance is None or instance.int == 0:
        error = ErrorCode.invalid_request  # a push must carry the id GetTelemetrySubscriptions gave
    elif request.subscription_id != SUBSCRIPTION_ID:
        error = ErrorCode.unknown_subscription_id  # the client fetches the current subscription
    elif request.compression_type not in ACCEPTED_COMPRESSION:
        error = ErrorCode.unsupported_compression_type
    elif len(request.metrics) > TELEMETRY_MAX_BYTES:
        error = ErrorCode.telemetry_too_large
    else:
        error = ErrorCode.none  # nothing was requested, so there is nothing to keep
    return codec.build(ctx.response_class, throttle_time=codec.ZERO_THROTTLE, error_code=error)


# --------------------------------------------------------------------------- ListConfigResources


@handles(LIST_CONFIG_RESOURCES)
async def list_config_resources(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    resource_cls = codec.nested(cls, "ConfigResource")
    if not authz.cluster_allowed(ctx, authz.Op.DESCRIBE_CONFIGS):
        return codec.build(
            cls,
            throttle_time=codec.ZERO_THROTTLE,
            error_code=ErrorCode.cluster_authorization_failed,
            config_resources=(),
        )
    known = {int(t) for t in ConfigResourceType if t != ConfigResourceType.UNKNOWN}
    if ctx.api_version == 0:
        wanted = {int(ConfigResourceType.CLIENT_METRICS)}  # v0 was ListClientMetricsResources
    else:
        wanted = set(request.resource_types) or known
    if not wanted <= known:
        return codec.build(
            cls, throttle_time=codec.ZERO_THROTTLE, error_code=ErrorCode.invalid_request, config_resources=()
        )
    image = ctx.broker.metadata
    found: list[tuple[str, int]] = []
    if ConfigResourceType.TOPIC in wanted and image is not None:
        found += [
            (t.name, int(ConfigResourceType.TOPIC))
            for t in sorted(image.topics, key=lambda t: t.name)
            if authz.allowed(ctx, authz.Op.DESCRIBE_CONFIGS, authz.TOPIC, t.name)
        ]
    if ConfigResourceType.BROKER in wanted and image is not None:
        found += [(str(b.node_id), int(ConfigResourceType.BROKER)) for b in image.brokers if b.state != "fenced"]
    if ConfigResourceType.GROUP in wanted and image is not None:
        # groups with dynamic configs set (group_configs.py)
        found += [
            (g.group_id, int(ConfigResourceType.GROUP))
            for g in image.group_configs
            if authz.allowed(ctx, authz.Op.DESCRIBE_CONFIGS, authz.GROUP, g.group_id)
        ]
    resources = tuple(codec.build(resource_cls, resource_name=n, resource_type=t) for n, t in found)
    return codec.build(cls, throttle_time=codec.ZERO_THROTTLE, error_code=ErrorCode.none, config_resources=resources)
