"""Admin APIs: topics, partitions, configs, records, cluster description, log dirs and
partition reassignments.

Everything that changes the cluster goes through the controller (`broker.cluster`); the
broker only validates, translates and answers in Kafka's terms. Checks that need no I/O
(topic names, partition counts, replica assignments) are pure functions at the top of this
module so they are testable without a cluster.

Replication: a partition has one replica (its leader) — durability comes from the WAL and
the object store. A replication factor above one is accepted and reported honestly as one
replica, as long as it does not exceed the number of live brokers (above that Kafka answers
INVALID_REPLICATION_FACTOR, and so do we). A manual replica assignment is honoured as far as it means something here: the
first broker of each partition's list becomes its leader (a move right after creation).
A reassignment's target list works the same way: its first entry becomes the new leader.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from kio.schema.errors import ErrorCode

from automq.broker import group_configs as gc
from automq.broker import topic_configs as tc
from automq.broker.controller.protocol import MetadataImage, TopicInfo
from automq.broker.kafka import authorizer as authz
from automq.broker.kafka import quotas, retention
from automq.broker.kafka.broker import INTERNAL_TOPICS
from automq.broker.kafka.codec import ZERO_THROTTLE, build, has_field, nested
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.registry import handles
from automq.broker.kafka.partitions import NotLeaderError, UnknownPartitionError
from automq.broker.storage.api import StreamClosedError
from automq.broker.storage.metadata import MetadataError

log = logging.getLogger(__name__)

CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
DESCRIBE_LOG_DIRS = 35
CREATE_PARTITIONS = 37
INCREMENTAL_ALTER_CONFIGS = 44
ALTER_PARTITION_REASSIGNMENTS = 45
LIST_PARTITION_REASSIGNMENTS = 46
DESCRIBE_CLUSTER = 60

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
# How long an admin call waits for this broker's metadata to show its own change, so the
# client's next Metadata request here sees it. Bounded by the request's timeout.
METADATA_PROPAGATION_WAIT_S = 5.0
THROTTLED = "The throttling quota has been exceeded."  # Kafka's ThrottlingQuotaExceededException
CONTROLLER_CALL_TIMEOUT_S = 30.0
# Cluster operations reported when a client asks for authorized operations: no authorizer
# runs, so every operation on the cluster resource is allowed (Kafka's AclOperation codes:
# CREATE 5, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11,
# IDEMPOTENT_WRITE 12).
_CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))


class AdminError(Exception):
    """A request item Kafka would refuse, with its error code and Kafka's wording."""

    def __init__(self, error_code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or error_code.name)
        self.error_code = error_code
        self.message = message


_DENIED: dict[int, ErrorCode] = {
    authz.TOPIC: ErrorCode.topic_authorization_failed,
    authz.CLUSTER: ErrorCode.cluster_authorization_failed,
    authz.GROUP: ErrorCode.group_authorization_failed,
}


def _authorize(ctx: RequestContext, op: int, rtype: int, name: str) -> None:
    """AdminError with Kafka's *_AUTHORIZATION_FAILED unless the principal may do `op`."""
    if not authz.allowed(ctx, op, rtype, name):
        raise AdminError(_DENIED[rtype], "Authorization failed.")


def error_of(exc: BaseException) -> tuple[ErrorCode, str | None]:
    """The Kafka error code and message for an exception raised while serving one item."""
    if isinstance(exc, AdminError):
        return exc.error_code, exc.message
    if isinstance(exc, tc.TopicConfigError):
        return exc.error_code, str(exc)
    if isinstance(exc, NotLeaderError):
        return ErrorCode.not_leader_or_follower, str(exc)
    if isinstance(exc, UnknownPartitionError):
        return ErrorCode.unknown_topic_or_partition, str(exc)
    if isinstance(exc, StreamClosedError):
        return ErrorCode.not_leader_or_follower, str(exc)
    if isinstance(exc, MetadataError):
        code = getattr(ErrorCode, exc.code.lower(), None)
        if code is None:
            log.warning("controller error %s has no Kafka error code: %s", exc.code, exc)
            return ErrorCode.unknown_server_error, f"{exc.code}: {exc}"
        return code, str(exc) or None
    if isinstance(exc, TimeoutError):
        return ErrorCode.request_timed_out, "the controller did not answer in time"
    if isinstance(exc, OSError):
        return ErrorCode.request_timed_out, f"the controller is unreachable: {exc}"
    log.error("unexpected error serving an admin request", exc_info=exc)
    return ErrorCode.unknown_server_error, f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- pure checks


def validate_topic_name(name: str | None) -> None:
    """Kafka's rules (org.apache.kafka.common.internals.Topic.validate)."""
    if not name:
        raise AdminError(ErrorCode.invalid_topic_exception, "Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise AdminError(ErrorCode.invalid_topic_exception, 'Topic name cannot be "." or ".."')
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise AdminError(
            ErrorCode.invalid_topic_exception,
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, topic name: {name}",
        )
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        raise AdminError(
            ErrorCode.invalid_topic_exception,
            f"Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'",
        )


def colliding_topic(name: str, existing: Iterable[str]) -> str | None:
    """Kafka refuses topics that differ only by '.' vs '_' (their metric names collide)."""
    key = name.replace(".", "_")
    for other in existing:
        if other != name and other.replace(".", "_") == key:
            return other
    return None


def live_brokers(image: MetadataImage | None) -> list[int]:
    if image is None:
        return []
    return sorted(b.node_id for b in image.brokers if b.state != "fenced")


def check_assignment(replicas: Iterable[int] | None, live: list[int], what: str) -> int:
    """A replica list from CreateTopics/CreatePartitions/reassignment: its first broker, the
    partition's leader here. Raises INVALID_REPLICA_ASSIGNMENT with Kafka's reasons."""
    ids = list(replicas or ())
    if not ids:
        raise AdminError(ErrorCode.invalid_replica_assignment, f"{what}: the replica list is empty")
    if len(set(ids)) != len(ids):
        raise AdminError(ErrorCode.invalid_replica_assignment, f"{what}: duplicate brokers in replica list {ids}")
    dead = [b for b in ids if b not in live]
    if dead:
        raise AdminError(
            ErrorCode.invalid_replica_assignment,
            f"{what}: replica assignment has brokers that are not alive. Replica list: {ids}, live broker list: {live}",
        )
    return ids[0]


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """What CreateTopics will ask of the controller for one topic."""

    name: str
    partitions: int
    replication_factor: int  # as requested (or defaulted); the topic gets one replica per partition
    configs: dict[str, str]
    leaders: tuple[int, ...] | None  # from a manual assignment: wanted leader per partition


def plan_create_topic(topic: Any, image: MetadataImage | None, kafka_config: Any) -> TopicPlan:
    """Validate one CreatableTopic against Kafka's rules. Raises AdminError/TopicConfigError."""
    name = topic.name
    validate_topic_name(name)
    existing = [t.name for t in image.topics] if image is not None else []
    if name in existing:
        raise AdminError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
    other = colliding_topic(name, existing)
    if other is not None:
        raise AdminError(ErrorCode.invalid_topic_exception, f"Topic '{name}' collides with existing topic: {other}")
    assignments = tuple(topic.assignments or ())
    leaders: tuple[int, ...] | None = None
    if assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise AdminError(
                ErrorCode.invalid_request,
                "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.",
            )
        indexes = sorted(a.partition_index for a in assignments)
        if indexes != list(range(len(assignments))):
            raise AdminError(
                ErrorCode.invalid_replica_assignment,
                f"Partitions should be a consecutive 0-based integer sequence, but {indexes} was given",
            )
        live = live_brokers(image)
        by_index = {a.partition_index: a for a in assignments}
        leaders = tuple(
            check_assignment(by_index[i].broker_ids, live, f"partition {i}") for i in range(len(assignments))
        )
        sizes = {len(a.broker_ids) for a in assignments}
        if len(sizes) != 1:
            raise AdminError(
                ErrorCode.invalid_replica_assignment, "All partitions should have the same number of replicas"
            )
        partitions, replication = len(assignments), sizes.pop()
    else:
        partitions = kafka_config.num_partitions if topic.num_partitions == -1 else topic.num_partitions
        replication = (
            kafka_config.default_replication_factor if topic.replication_factor == -1 else topic.replication_factor
        )
        if partitions < 1:
            raise AdminError(
                ErrorCode.invalid_partitions, "Number of partitions was set to an invalid non-positive value."
            )
        if replication < 1:
            raise AdminError(
                ErrorCode.invalid_replication_factor,
                "Replication factor must be larger than 0, or -1 to use the default value.",
            )
        live = live_brokers(image)
        if image is not None and replication > len(live):
            # Kafka refuses a factor it could not place; the one replica kept here could be,
            # but a client asking for 3 copies on 2 brokers has a configuration mistake
            raise AdminError(
                ErrorCode.invalid_replication_factor,
                f"Replication factor: {replication} larger than available brokers: {len(live)}.",
            )
    configs = tc.validate_topic_configs((c.name, c.value) for c in (topic.configs or ()))
    return TopicPlan(name, partitions, replication, configs, leaders)


def plan_create_partitions(topic: Any, image: MetadataImage | None) -> tuple[TopicInfo, tuple[int, ...] | None]:
    """Validate one CreatePartitionsTopic: (the topic, wanted leaders of the new partitions)."""
    info = _topic(image, topic.name)
    if info is None:
        raise AdminError(ErrorCode.unknown_topic_or_partition, f"The topic '{topic.name}' does not exist.")
    current = len(info.partitions)
    if topic.count < current:
        raise AdminError(
            ErrorCode.invalid_partitions,
            f"Topic currently has {current} partitions, which is higher than the requested {topic.count}.",
        )
    if topic.count == current:
        raise AdminError(ErrorCode.invalid_partitions, f"Topic already has {current} partitions.")
    leaders = None
    if topic.assignments is not None:
        added = topic.count - current
        if len(topic.assignments) != added:
            raise AdminError(
                ErrorCode.invalid_replica_assignment,
                f"Increasing the number of partitions by {added} but {len(topic.assignments)} assignments provided.",
            )
        live = live_brokers(image)
        leaders = tuple(
            check_assignment(a.broker_ids, live, f"partition {current + i}") for i, a in enumerate(topic.assignments)
        )
    return info, leaders


def _topic(image: MetadataImage | None, name: str) -> TopicInfo | None:
    if image is None:
        return None
    for t in image.topics:
        if t.name == name:
            return t
    return None


def _topic_uuid(info: TopicInfo | None) -> uuid.UUID | None:
    if info is None or not info.topic_id:
        return None
    try:
        return uuid.UUID(info.topic_id)
    except ValueError:
        return None


def log_dir_name(object_store_url: str) -> str:
    """The one virtual log dir a broker reports: its object store, without query parameters
    (they may carry endpoints or credentials)."""
    parts = urlsplit(object_store_url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


# --------------------------------------------------------------------------- helpers

T = TypeVar("T")


async def _controller(call: Awaitable[T], timeout_s: float | None = None) -> T:
    return await asyncio.wait_for(call, timeout_s if timeout_s else CONTROLLER_CALL_TIMEOUT_S)


def _timeout_s(request: Any) -> float:
    t = getattr(request, "timeout", None)
    seconds = t.total_seconds() if t is not None else CONTROLLER_CALL_TIMEOUT_S
    return seconds if seconds > 0 else 0.0


async def _fresh_image(ctx: RequestContext) -> MetadataImage | None:
    """The controller's current image (read-your-writes across brokers for config reads);
    this broker's image if the controller does not answer quickly."""
    try:
        return await asyncio.wait_for(ctx.broker.cluster.watch_metadata(-1, 0), 5.0)
    except Exception as exc:
        log.debug("fresh metadata unavailable (%s); using the local image", exc)
        return ctx.broker.partitions.image


async def _await_cluster(ctx: RequestContext, topics: list[str], budget_s: float) -> None:
    """Answer only once every live broker has this broker's current metadata and the topics'
    partitions are open on their leaders, so a client's next Metadata or Produce on any broker
    finds them (Kafka answers before that). Bounded; a slow broker only delays the answer."""
    image = ctx.broker.partitions.image
    budget_s = min(budget_s, METADATA_PROPAGATION_WAIT_S)
    if image is None or budget_s <= 0:
        return
    try:
        missing = await _controller(
            ctx.broker.cluster.await_applied(image.version, int(budget_s * 1000), topics), budget_s + 5.0
        )
    except Exception as exc:
        log.info("could not wait for every broker to see %s: %s", topics, exc)
        return
    if missing.get("laggards") or missing.get("unopened"):
        log.info("answering for %s before every broker caught up: %s", topics, missing)
    for name in topics:  # the ones led here serve as soon as the answer leaves
        await ctx.broker.partitions.wait_opened(name, budget_s)


async def _await_local(ctx: RequestContext, predicate: Callable[[MetadataImage], bool], budget_s: float) -> None:
    if budget_s <= 0:
        return
    await ctx.broker.partitions.wait_for_image(predicate, min(budget_s, METADATA_PROPAGATION_WAIT_S))


async def _place_leaders(
    ctx: RequestContext, name: str, first_partition: int, leaders: tuple[int, ...], info: TopicInfo | None
) -> None:
    """Honour a manual assignment: move each new partition to its list's first broker."""
    current = {p.partition: p.leader for p in info.partitions} if info is not None else {}
    for i, leader in enumerate(leaders):
        p = first_partition + i
        if current.get(p) == leader:
            continue
        try:
            await _controller(ctx.broker.cluster.reassign_partition(name, p, leader))
        except Exception as exc:
            log.warning("placing %s-%d on broker %d as assigned failed: %s", name, p, leader, exc)


# --------------------------------------------------------------------------- topics


@handles(CREATE_TOPICS)
async def create_topics(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    Result = nested(cls, "CreatableTopicResult")
    ConfigEntry = nested(cls, "CreatableTopicConfigs") if has_field(Result, "configs") else None
    broker = ctx.broker
    image = broker.partitions.image
    counts = collections.Counter(t.name for t in request.topics)
    timeout_s = _timeout_s(request)
    created: list[str] = []

    def result(name: str, error: ErrorCode, message: str | None, **extra: Any) -> Any:
        values: dict[str, Any] = dict(name=name, topic_id=None, error_code=error, error_message=message, configs=None)
        values.update(extra)
        return build(Result, **values)

    async def one(topic: Any) -> Any:
        if counts[topic.name] > 1:
            return result(
                topic.name,
                ErrorCode.invalid_request,
                f"Create topics request from client `{ctx.client_id}` contains multiple entries for the following topics: {topic.name}",
            )
        try:
            if not authz.cluster_allowed(ctx, authz.Op.CREATE):
                _authorize(ctx, authz.Op.CREATE, authz.TOPIC, topic.name)
            plan = plan_create_topic(topic, image, broker.config.kafka)
            info = None
            if not request.validate_only and not quotas.check_mutation(ctx, plan.partitions):
                raise AdminError(ErrorCode.throttling_quota_exceeded, THROTTLED)
            if not request.validate_only:
                info = await _controller(
                    broker.cluster.create_topic(plan.name, plan.partitions, plan.configs), timeout_s or None
                )
                created.append(plan.name)
                if plan.leaders:
                    await _place_leaders(ctx, plan.name, 0, plan.leaders, info)
                log.info(
                    "created topic %s (%d partitions, configs %s) for %s",
                    plan.name,
                    plan.partitions,
                    plan.configs,
                    ctx.peer,
                )
        except Exception as exc:
            code, message = error_of(exc)
            return result(topic.name, code, message)
        configs = None
        if ConfigEntry is not None:
            configs = tuple(
                build(
                    ConfigEntry,
                    name=d.name,
                    value=d.value,
                    read_only=d.read_only,
                    config_source=int(d.source),
                    is_sensitive=d.is_sensitive,
                )
                for d in tc.describe_topic(plan.configs, broker.config)
            )
        return result(
            plan.name,
            ErrorCode.none,
            None,
            topic_id=_topic_uuid(info),
            num_partitions=plan.partitions,
            replication_factor=1,  # one replica per partition, whatever was asked (see module docstring)
            configs=configs,
        )

    results = await asyncio.gather(*(one(t) for t in request.topics))
    if created:
        await _await_local(ctx, lambda img: all(_topic(img, n) is not None for n in created), timeout_s)
        await _await_cluster(ctx, created, timeout_s)
    return build(cls, throttle_time=ZERO_THROTTLE, topics=tuple(results))


@handles(DELETE_TOPICS)
async def delete_topics(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    Result = nested(cls, "DeletableTopicResult")
    broker = ctx.broker
    timeout_s = _timeout_s(request)
    if hasattr(request, "topics"):  # v6+: by name or by topic id
        wanted = [
            (t.name, t.topic_id if t.topic_id is not None and t.topic_id.int != 0 else None) for t in request.topics
        ]
    else:
        wanted = [(name, None) for name in request.topic_names]
    deleted: list[str] = []

    async def one(name: str | None, topic_id: uuid.UUID | None) -> Any:
        info = None
        try:
            if topic_id is not None:
                info = broker.partitions.topic_by_id(topic_id)
                if info is None:
                    image = await _fresh_image(ctx)
                    info = next((t for t in (image.topics if image else ()) if t.topic_id == str(topic_id)), None)
                if info is None:
                    raise AdminError(ErrorCode.unknown_topic_id, f"Topic id {topic_id} does not exist.")
                name = info.name
            else:
                if not name:
                    raise AdminError(ErrorCode.invalid_request, "Neither topic name nor topic id was given.")
                info = broker.partitions.topic(name)
            _authorize(ctx, authz.Op.DELETE, authz.TOPIC, name)
            if name in INTERNAL_TOPICS:
                # group offsets live there; deleting it would silently drop every committed offset
                raise AdminError(ErrorCode.invalid_request, f"Cannot delete internal topic {name}")
            if not quotas.check_mutation(ctx, len(info.partitions) if info is not None else 0):
                raise AdminError(ErrorCode.throttling_quota_exceeded, THROTTLED)
            await _controller(broker.cluster.delete_topic(name), timeout_s or None)
            deleted.append(name)
            log.info("deleted topic %s for %s", name, ctx.peer)
            return build(
                Result, name=name, topic_id=topic_id or _topic_uuid(info), error_code=ErrorCode.none, error_message=None
            )
        except Exception as exc:
            code, message = error_of(exc)
            return build(Result, name=name, topic_id=topic_id, error_code=code, error_message=message)

    results = await asyncio.gather(*(one(n, i) for n, i in wanted))
    if deleted:
        await _await_local(ctx, lambda img: all(_topic(img, n) is None for n in deleted), timeout_s)
        await _await_cluster(ctx, [], timeout_s)  # no broker still serves the deleted topics
    return build(cls, throttle_time=ZERO_THROTTLE, responses=tuple(results))


@handles(CREATE_PARTITIONS)
async def create_partitions(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    Result = nested(cls, "CreatePartitionsTopicResult")
    broker = ctx.broker
    image = broker.partitions.image
    counts = collections.Counter(t.name for t in request.topics)
    timeout_s = _timeout_s(request)
    grown: dict[str, int] = {}

    async def one(topic: Any) -> Any:
        try:
            if counts[topic.name] > 1:
                raise AdminError(ErrorCode.invalid_request, f"Duplicate topic in request: {topic.name}")
            _authorize(ctx, authz.Op.ALTER, authz.TOPIC, topic.name)
            info, leaders = plan_create_partitions(topic, image)
            if not request.validate_only and not quotas.check_mutation(ctx, topic.count - len(info.partitions)):
                raise AdminError(ErrorCode.throttling_quota_exceeded, THROTTLED)
            if not request.validate_only:
                first_new = len(info.partitions)
                grown_info = await _controller(
                    broker.cluster.create_partitions(topic.name, topic.count), timeout_s or None
                )
                grown[topic.name] = topic.count
                if leaders:
                    await _place_leaders(ctx, topic.name, first_new, leaders, grown_info)
                log.info("topic %s now has %d partitions (for %s)", topic.name, topic.count, ctx.peer)
            return build(Result, name=topic.name, error_code=ErrorCode.none, error_message=None)
        except Exception as exc:
            code, message = error_of(exc)
            return build(Result, name=topic.name, error_code=code, error_message=message)

    results = await asyncio.gather(*(one(t) for t in request.topics))
    if grown:
        await _await_local(
            ctx,
            lambda img: all((t := _topic(img, n)) is not None and len(t.partitions) >= c for n, c in grown.items()),
            timeout_s,
        )
        await _await_cluster(ctx, list(grown), timeout_s)
    return build(cls, throttle_time=ZERO_THROTTLE, results=tuple(results))


# --------------------------------------------------------------------------- configs


def _broker_resource_is_me(ctx: RequestContext, resource_name: str) -> None:
    if resource_name == "":
        return  # the cluster-wide default resource
    try:
        node = int(resource_name)
    except ValueError:
        raise AdminError(ErrorCode.invalid_request, f"Invalid broker id {resource_name!r}") from None
    if node != ctx.broker.node_id:
        raise AdminError(
            ErrorCode.invalid_request,
            f"Unexpected broker id, expected {ctx.broker.node_id} or empty string, but received {node}",
        )


@handles(DESCRIBE_CONFIGS)
async def describe_configs(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    Result = nested(cls, "DescribeConfigsResult")
    Entry = nested(cls, "DescribeConfigsResourceResult")
    Synonym = nested(cls, "DescribeConfigsSynonym")
    include_synonyms = bool(getattr(request, "include_synonyms", False))
    include_docs = bool(getattr(request, "include_documentation", False))
    node_config = ctx.broker.config
    image = None
    if any(r.resource_type in (tc.ConfigResourceType.TOPIC, tc.ConfigResourceType.GROUP) for r in request.resources):
        image = await _fresh_image(ctx)

    def entry(d: tc.DescribedConfig) -> Any:
        return build(
            Entry,
            name=d.name,
            value=d.value,
            read_only=d.read_only,
            config_source=int(d.source),
            is_default=d.is_default,
            is_sensitive=d.is_sensitive,
            config_type=int(d.type),
            documentation=d.documentation,
            synonyms=tuple(build(Synonym, name=s.name, value=s.value, source=int(s.source)) for s in d.synonyms),
        )

    results = []
    for resource in request.resources:
        keys = None if resource.configuration_keys is None else list(resource.configuration_keys)
        # An empty key list means "all" for older clients too (Kafka treats null and empty alike).
        if keys == []:
            keys = None
        try:
            if resource.resource_type == tc.ConfigResourceType.TOPIC:
                validate_topic_name(resource.resource_name)
                _authorize(ctx, authz.Op.DESCRIBE_CONFIGS, authz.TOPIC, resource.resource_name)
                info = _topic(image, resource.resource_name)
                if info is None:
                    raise AdminError(
                        ErrorCode.unknown_topic_or_partition, f"Topic {resource.resource_name} does not exist."
                    )
                described = tc.describe_topic(info.configs, node_config, keys, include_synonyms, include_docs)
            elif resource.resource_type == tc.ConfigResourceType.BROKER:
                _authorize(ctx, authz.Op.DESCRIBE_CONFIGS, authz.CLUSTER, authz.CLUSTER_NAME)
                _broker_resource_is_me(ctx, resource.resource_name)
                # the empty name is the cluster-wide dynamic default: none exist here
                described = (
                    []
                    if resource.resource_name == ""
                    else tc.describe_broker(node_config, keys, include_synonyms, include_docs)
                    + _metrics_url_entry(ctx.broker, keys, include_docs)
                )
            elif resource.resource_type == tc.ConfigResourceType.GROUP:
                _group_resource(ctx, authz.Op.DESCRIBE_CONFIGS, resource.resource_name)
                described = gc.describe_group(
                    gc.configs_of(image, resource.resource_name), node_config, keys, include_synonyms, include_docs
                )
            else:
                raise AdminError(
                    ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type} for DescribeConfigs"
                )
            results.append(
                build(
                    Result,
                    error_code=ErrorCode.none,
                    error_message=None,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=tuple(entry(d) for d in described),
                )
            )
        except Exception as exc:
            code, message = error_of(exc)
            results.append(
                build(
                    Result,
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=(),
                )
            )
    return build(cls, throttle_time=ZERO_THROTTLE, results=tuple(results))


METRICS_URL_CONFIG = "automq.metrics.url"


def _metrics_url_entry(broker: Any, keys: list[str] | None, include_docs: bool) -> list[tc.DescribedConfig]:
    """Where this broker's Prometheus metrics are (the load balancer finds brokers' metrics
    from a Kafka bootstrap alone this way)."""
    url = getattr(broker, "metrics_url", None)
    if url is None or (keys is not None and METRICS_URL_CONFIG not in keys):
        return []
    return [
        tc.DescribedConfig(
            name=METRICS_URL_CONFIG,
            value=url,
            source=tc.ConfigSource.STATIC_BROKER_CONFIG,
            type=tc.ConfigType.STRING,
            read_only=True,
            documentation="Prometheus metrics of this broker (http_host/http_port); read-only."
            if include_docs
            else None,
        )
    ]


def _group_resource(ctx: RequestContext, op: int, group_id: str) -> None:
    _authorize(ctx, op, authz.GROUP, group_id)
    if not group_id:
        raise AdminError(ErrorCode.invalid_request, "Default group resources are not allowed.")


async def _alter_configs(
    request: Any,
    ctx: RequestContext,
    changes_for: Callable[[dict[str, str], Any], dict[str, str | None]],
    group_changes_for: Callable[[dict[str, str], Any], dict[str, str | None]],
) -> Any:
    cls = ctx.response_class
    Result = nested(cls, "AlterConfigsResourceResponse")
    broker = ctx.broker
    counts = collections.Counter((r.resource_type, r.resource_name) for r in request.resources)
    image = (
        await _fresh_image(ctx)
        if any(r.resource_type in (tc.ConfigResourceType.TOPIC, tc.ConfigResourceType.GROUP) for r in request.resources)
        else None
    )
    altered: dict[str, dict[str, str | None]] = {}
    altered_groups: dict[str, dict[str, str | None]] = {}

    async def one(resource: Any) -> Any:
        try:
            if counts[(resource.resource_type, resource.resource_name)] > 1:
                raise AdminError(ErrorCode.invalid_request, f"Duplicate resource in request: {resource.resource_name}")
            if resource.resource_type == tc.ConfigResourceType.TOPIC:
                _authorize(ctx, authz.Op.ALTER_CONFIGS, authz.TOPIC, resource.resource_name)
                info = _topic(image, resource.resource_name)
                if info is None:
                    raise AdminError(
                        ErrorCode.unknown_topic_or_partition, f"Topic {resource.resource_name} does not exist."
                    )
                changes = changes_for(dict(info.configs), resource)
                if changes and not request.validate_only:
                    await _controller(broker.cluster.alter_topic_configs(info.name, changes))
                    altered[info.name] = changes
                    log.info("topic %s configs changed %s (for %s)", info.name, changes, ctx.peer)
            elif resource.resource_type == tc.ConfigResourceType.BROKER:
                _authorize(ctx, authz.Op.ALTER_CONFIGS, authz.CLUSTER, authz.CLUSTER_NAME)
                _broker_resource_is_me(ctx, resource.resource_name)
                names = sorted(c.name for c in resource.configs)
                raise AdminError(
                    ErrorCode.invalid_request,
                    f"Cannot update these configs dynamically: {names}. Broker configs come from the node config file "
                    "(docs/configuration.md); change it and restart the broker.",
                )
            elif resource.resource_type == tc.ConfigResourceType.GROUP:
                group_id = resource.resource_name
                _group_resource(ctx, authz.Op.ALTER_CONFIGS, group_id)
                current = gc.configs_of(image, group_id)
                group_changes = group_changes_for(current, resource)
                if group_changes and not request.validate_only:
                    await _controller(broker.cluster.alter_group_configs(group_id, group_changes))
                    altered_groups[group_id] = group_changes
                    log.info("group %s configs changed %s (for %s)", group_id, group_changes, ctx.peer)
            else:
                raise AdminError(
                    ErrorCode.invalid_request,
                    f"Unsupported resource type {resource.resource_type} for altering configs",
                )
            return build(
                Result,
                error_code=ErrorCode.none,
                error_message=None,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
        except Exception as exc:
            code, message = error_of(exc)
            return build(
                Result,
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )

    results = await asyncio.gather(*(one(r) for r in request.resources))
    if altered or altered_groups:

        def applied(img: MetadataImage) -> bool:
            for name, changes in altered.items():
                t = _topic(img, name)
                if t is None or any(t.configs.get(k) != v for k, v in changes.items()):
                    return False
            for group_id, changes in altered_groups.items():
                now = gc.configs_of(img, group_id)
                if any(now.get(k) != v for k, v in changes.items()):
                    return False
            return True

        await _await_local(ctx, applied, METADATA_PROPAGATION_WAIT_S)
        if altered_groups:
            # a share group's configs are read by every partition leader (share.auto.offset.reset
            # when a share-partition starts): a client that sets them and then subscribes must
            # not meet a leader still on the old image (librdkafka's share tests do exactly that)
            await _await_cluster(ctx, [], METADATA_PROPAGATION_WAIT_S)
    return build(cls, throttle_time=ZERO_THROTTLE, responses=tuple(results))


@handles(ALTER_CONFIGS)
async def alter_configs(request: Any, ctx: RequestContext) -> Any:
    node = ctx.broker.config
    return await _alter_configs(
        request,
        ctx,
        lambda current, r: tc.replace_all(current, ((c.name, c.value) for c in r.configs)),
        lambda current, r: gc.replace_all(current, ((c.name, c.value) for c in r.configs), node),
    )


@handles(INCREMENTAL_ALTER_CONFIGS)
async def incremental_alter_configs(request: Any, ctx: RequestContext) -> Any:
    return await _alter_configs(
        request,
        ctx,
        lambda current, r: tc.apply_incremental(current, ((c.name, c.config_operation, c.value) for c in r.configs)),
        lambda current, r: gc.apply_incremental(
            current, ((c.name, c.config_operation, c.value) for c in r.configs), ctx.broker.config
        ),
    )


# --------------------------------------------------------------------------- records


@handles(DELETE_RECORDS)
async def delete_records(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    TopicResult = nested(cls, "DeleteRecordsTopicResult")
    PartitionResult = nested(cls, "DeleteRecordsPartitionResult")
    partitions = ctx.broker.partitions

    async def one(topic: str, p: Any) -> Any:
        low = -1
        try:
            _authorize(ctx, authz.Op.DELETE, authz.TOPIC, topic)
            partition = partitions.get(topic, p.partition_index)
            hw = partition.high_watermark
            target = hw if p.offset == -1 else p.offset
            if target < 0 or target > hw:
                raise AdminError(
                    ErrorCode.offset_out_of_range,
                    f"Cannot delete records of {topic}-{p.partition_index} up to {p.offset}: high watermark is {hw}",
                )
            if target > partition.log_start_offset:
                await partition.stream.trim(target)
                log.info(
                    "deleted records of %s-%d below offset %d (for %s)", topic, p.partition_index, target, ctx.peer
                )
            low = partition.log_start_offset
            return build(
                PartitionResult, partition_index=p.partition_index, low_watermark=low, error_code=ErrorCode.none
            )
        except Exception as exc:
            code, _ = error_of(exc)
            return build(PartitionResult, partition_index=p.partition_index, low_watermark=low, error_code=code)

    topics = []
    for t in request.topics:
        results = await asyncio.gather(*(one(t.name, p) for p in t.partitions))
        topics.append(build(TopicResult, name=t.name, partitions=tuple(results)))
    return build(cls, throttle_time=ZERO_THROTTLE, topics=tuple(topics))


# --------------------------------------------------------------------------- cluster


@handles(DESCRIBE_CLUSTER)
async def describe_cluster(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    BrokerEntry = nested(cls, "DescribeClusterBroker")
    broker = ctx.broker
    image = broker.partitions.image
    endpoint_type = getattr(request, "endpoint_type", 1)
    cluster_id = image.cluster_id if image is not None else broker.config.cluster_id
    if endpoint_type != 1:
        # a broker describes brokers; controllers are reached over their HTTP API here
        return build(
            cls,
            throttle_time=ZERO_THROTTLE,
            error_code=ErrorCode.unsupported_endpoint_type,
            error_message=f"Endpoint type {endpoint_type} is not supported by a broker",
            endpoint_type=endpoint_type,
            cluster_id=cluster_id,
            controller_id=-1,
            brokers=(),
        )
    include_fenced = bool(getattr(request, "include_fenced_brokers", False))
    listener = ctx.listener
    entries = []
    alive = []
    for b in sorted(image.brokers if image is not None else (), key=lambda b: b.node_id):
        fenced = b.state == "fenced"
        if fenced and not include_fenced:
            continue
        ep = next((e for e in b.endpoints if e.listener == listener), b.endpoints[0] if b.endpoints else None)
        if ep is None:
            continue
        if not fenced:
            alive.append(b.node_id)
        entries.append(
            build(BrokerEntry, broker_id=b.node_id, host=ep.host, port=ep.port, rack=b.rack, is_fenced=fenced)
        )
    # Kafka: "when handled by a broker, returns a random alive broker ID" — the controller is
    # not a Kafka-protocol node here, so clients must not try to reach it.
    controller_id = broker.node_id if broker.node_id in alive or not alive else alive[0]
    operations = _CLUSTER_OPERATIONS if request.include_cluster_authorized_operations else -(1 << 31)
    if broker.authorizer is not None and request.include_cluster_authorized_operations:
        operations = (
            authz.operations(ctx, True, authz.CLUSTER, authz.CLUSTER_NAME)
            if authz.cluster_allowed(ctx, authz.Op.DESCRIBE)
            else 0
        )
    return build(
        cls,
        throttle_time=ZERO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=1,
        cluster_id=cluster_id,
        controller_id=controller_id,
        brokers=tuple(entries),
        cluster_authorized_operations=operations,
    )


@handles(DESCRIBE_LOG_DIRS)
async def describe_log_dirs(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    Result = nested(cls, "DescribeLogDirsResult")
    TopicEntry = nested(cls, "DescribeLogDirsTopic")
    PartitionEntry = nested(cls, "DescribeLogDirsPartition")
    broker = ctx.broker
    if not authz.cluster_allowed(ctx, authz.Op.DESCRIBE):
        return build(cls, throttle_time=ZERO_THROTTLE, error_code=ErrorCode.cluster_authorization_failed, results=())
    wanted: dict[str, set[int]] | None = None
    if request.topics is not None:
        wanted = {}
        for t in request.topics:
            wanted.setdefault(t.topic, set()).update(t.partitions)
    by_topic: dict[str, list[Any]] = {}
    for p in sorted(broker.partitions.led(), key=lambda p: (p.topic, p.partition)):
        if wanted is not None and p.partition not in wanted.get(p.topic, ()):
            continue
        try:
            size = await retention.partition_size(broker, p)
        except Exception as exc:
            log.debug("size of %s-%d unknown: %s", p.topic, p.partition, exc)
            size = -1
        by_topic.setdefault(p.topic, []).append(
            build(
                PartitionEntry,
                partition_index=p.partition,
                partition_size=size,
                offset_lag=max(0, p.log_end_offset - p.high_watermark),
                is_future_key=False,
            )
        )
    topics = tuple(build(TopicEntry, name=name, partitions=tuple(parts)) for name, parts in by_topic.items())
    result = build(
        Result,
        error_code=ErrorCode.none,
        log_dir=log_dir_name(broker.config.object_store_url),
        topics=topics,
        total_bytes=-1,
        usable_bytes=-1,
    )  # object storage has no volume size
    return build(cls, throttle_time=ZERO_THROTTLE, error_code=ErrorCode.none, results=(result,))


# --------------------------------------------------------------------------- reassignments


@handles(ALTER_PARTITION_REASSIGNMENTS)
async def alter_partition_reassignments(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    TopicResult = nested(cls, "ReassignableTopicResponse")
    PartitionResult = nested(cls, "ReassignablePartitionResponse")
    broker = ctx.broker
    if not authz.cluster_allowed(ctx, authz.Op.ALTER):
        return build(
            cls,
            throttle_time=ZERO_THROTTLE,
            allow_replication_factor_change=True,
            error_code=ErrorCode.cluster_authorization_failed,
            error_message="Cluster authorization failed.",
            responses=(),
        )
    image = await _fresh_image(ctx)
    live = live_brokers(image)
    timeout_s = _timeout_s(request)

    async def one(topic: str, p: Any) -> Any:
        try:
            info = _topic(image, topic)
            pinfo = next((x for x in info.partitions if x.partition == p.partition_index), None) if info else None
            if pinfo is None:
                raise AdminError(ErrorCode.unknown_topic_or_partition, f"Unknown partition {topic}-{p.partition_index}")
            if p.replicas is None:
                # A move here takes about a second and copies nothing: there is nothing to roll back.
                if pinfo.state == "moving":
                    raise AdminError(
                        ErrorCode.reassignment_in_progress,
                        f"The move of {topic}-{p.partition_index} cannot be cancelled; it completes on its own shortly",
                    )
                raise AdminError(
                    ErrorCode.no_reassignment_in_progress,
                    f"No reassignment in progress for {topic}-{p.partition_index}",
                )
            target = check_assignment(p.replicas, live, f"{topic}-{p.partition_index}")
            if pinfo.state == "moving":
                raise AdminError(
                    ErrorCode.reassignment_in_progress,
                    f"{topic}-{p.partition_index} is already moving to {pinfo.target}",
                )
            if target != pinfo.leader:
                await _controller(
                    broker.cluster.reassign_partition(topic, p.partition_index, target), timeout_s or None
                )
                log.info(
                    "moving %s-%d from broker %d to %d (for %s)",
                    topic,
                    p.partition_index,
                    pinfo.leader,
                    target,
                    ctx.peer,
                )
            return build(
                PartitionResult, partition_index=p.partition_index, error_code=ErrorCode.none, error_message=None
            )
        except Exception as exc:
            code, message = error_of(exc)
            return build(PartitionResult, partition_index=p.partition_index, error_code=code, error_message=message)

    topics = []
    for t in request.topics:
        results = await asyncio.gather(*(one(t.name, p) for p in t.partitions))
        topics.append(build(TopicResult, name=t.name, partitions=tuple(results)))
    return build(
        cls,
        throttle_time=ZERO_THROTTLE,
        allow_replication_factor_change=True,
        error_code=ErrorCode.none,
        error_message=None,
        responses=tuple(topics),
    )


@handles(LIST_PARTITION_REASSIGNMENTS)
async def list_partition_reassignments(request: Any, ctx: RequestContext) -> Any:
    cls = ctx.response_class
    TopicEntry = nested(cls, "OngoingTopicReassignment")
    PartitionEntry = nested(cls, "OngoingPartitionReassignment")
    if not authz.cluster_allowed(ctx, authz.Op.DESCRIBE):
        return build(
            cls,
            throttle_time=ZERO_THROTTLE,
            error_code=ErrorCode.cluster_authorization_failed,
            error_message="Cluster authorization failed.",
            topics=(),
        )
    image = await _fresh_image(ctx)
    wanted: dict[str, set[int]] | None = None
    if request.topics is not None:
        wanted = {t.name: set(t.partition_indexes) for t in request.topics}
    topics = []
    for t in image.topics if image is not None else ():
        if wanted is not None and t.name not in wanted:
            continue
        ongoing = []
        for p in t.partitions:
            if p.state != "moving" or (wanted is not None and p.partition not in wanted[t.name]):
                continue
            current = (p.leader,) if p.leader >= 0 else ()
            target = (p.target,) if p.target >= 0 else ()
            ongoing.append(
                build(
                    PartitionEntry,
                    partition_index=p.partition,
                    replicas=tuple(dict.fromkeys(target + current)),
                    adding_replicas=tuple(x for x in target if x not in current),
                    removing_replicas=tuple(x for x in current if x not in target),
                )
            )
        if ongoing:
            topics.append(build(TopicEntry, name=t.name, partitions=tuple(ongoing)))
    return build(cls, throttle_time=ZERO_THROTTLE, error_code=ErrorCode.none, error_message=None, topics=tuple(topics))
