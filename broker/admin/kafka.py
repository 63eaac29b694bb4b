"""Topic and group administration over the Kafka protocol, for `automq topics` and `automq groups`.

Built on the balancer's small kio client (connection per broker, bootstrap failover): only
standard Kafka APIs, so these commands work against any Kafka-compatible cluster. Results are
plain dataclasses; the CLI renders them as tables or JSON.
"""

from __future__ import annotations

import asyncio
import datetime
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId, GroupId, TopicName
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from automq.broker.balancer.kafka_admin import KafkaAdmin, KafkaAdminError

TOPIC_RESOURCE = 2
EARLIEST, LATEST = -2, -1
_SET, _DELETE = 0, 1  # IncrementalAlterConfigs operations


@dataclass(frozen=True)
class TopicSummary:
    name: str
    partitions: int
    internal: bool


@dataclass(frozen=True)
class PartitionDetail:
    partition: int
    leader: int
    start_offset: int
    end_offset: int
    error: str | None = None


@dataclass(frozen=True)
class TopicDetail:
    name: str
    topic_id: str
    partitions: list[PartitionDetail]
    configs: dict[str, str]  # set explicitly on the topic (not defaults)


@dataclass(frozen=True)
class GroupSummary:
    group_id: str
    state: str
    protocol_type: str
    coordinator: int
    type: str = "classic"  # classic | consumer (KIP-848) | share (KIP-932); ListGroups v5's group type


@dataclass(frozen=True)
class MemberDetail:
    member_id: str
    client_id: str
    host: str
    assignment: list[tuple[str, int]]
    # KIP-848 members only (None for classic groups)
    member_epoch: int | None = None
    instance_id: str | None = None
    target: list[tuple[str, int]] | None = None  # the assignment the group is moving it to


@dataclass(frozen=True)
class OffsetLag:
    topic: str
    partition: int
    committed: int  # -1: none committed
    end_offset: int
    lag: int | None  # None without a committed offset
    owner: str | None  # member id consuming it, if any


@dataclass
class GroupDetail:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    coordinator: int
    members: list[MemberDetail] = field(default_factory=list)
    offsets: list[OffsetLag] = field(default_factory=list)
    type: str = "classic"  # classic | consumer (KIP-848) | share (KIP-932: offsets[].committed is the
    # share-partition start offset, lag counts records not yet acknowledged or archived)
    # KIP-848 and share groups only: the epoch membership/subscriptions reached, the epoch of the
    # target assignment, and the server-side assignor
    group_epoch: int | None = None
    assignment_epoch: int | None = None
    assignor: str | None = None

    @property
    def total_lag(self) -> int:
        return sum(o.lag for o in self.offsets if o.lag is not None)


def _check(code: ErrorCode, message: str | None, what: str) -> None:
    if code != ErrorCode.none:
        raise KafkaAdminError(f"{what}: {code.name.upper()}{f': {message}' if message else ''}", code)


def parse_assignment(data: bytes) -> list[tuple[str, int]]:
    """Partitions of a ConsumerProtocolAssignment (any version); [] when it does not parse
    (a non-consumer protocol, or an empty assignment)."""
    try:
        pos = 2
        (count,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out = []
        for _ in range(max(count, 0)):
            (n,) = struct.unpack_from(">h", data, pos)
            pos += 2
            topic = bytes(data[pos : pos + n]).decode()
            pos += n
            (parts,) = struct.unpack_from(">i", data, pos)
            pos += 4
            for _ in range(max(parts, 0)):
                (p,) = struct.unpack_from(">i", data, pos)
                pos += 4
                out.append((topic, p))
        return out
    except (struct.error, UnicodeDecodeError):
        return []


class AdminClient(KafkaAdmin):
    """Topics and groups, on top of the balancer's client (metadata, connections)."""

    # ------------------------------------------------------------------ topics

    async def list_topics(self, include_internal: bool = False) -> list[TopicSummary]:
        from kio.schema.metadata.v12.request import MetadataRequest

        r = await self._any(
            MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        )
        topics = [
            TopicSummary(t.name, len(t.partitions), t.is_internal)
            for t in r.topics  # type: ignore[attr-defined]
            if include_internal or not t.is_internal
        ]
        return sorted(topics, key=lambda t: t.name)

    async def _offsets(self, leaders: Mapping[tuple[str, int], int], timestamp: int) -> dict[tuple[str, int], int]:
        """ListOffsets(timestamp) of each partition, asked of its leader; -1 where it failed."""
        from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic

        by_leader: dict[int, dict[str, list[int]]] = {}
        for (topic, partition), leader in leaders.items():
            if leader >= 0:
                by_leader.setdefault(leader, {}).setdefault(topic, []).append(partition)

        async def ask(leader: int, topics: dict[str, list[int]]) -> dict[tuple[str, int], int]:
            request = ListOffsetsRequest(
                replica_id=BrokerId(-1),
                isolation_level=i8(0),
                topics=tuple(
                    ListOffsetsTopic(
                        name=TopicName(t),
                        partitions=tuple(
                            ListOffsetsPartition(
                                partition_index=i32(p), current_leader_epoch=i32(-1), timestamp=i64(timestamp)
                            )
                            for p in ps
                        ),
                    )
                    for t, ps in topics.items()
                ),
            )
            try:
                r = await self._to(leader, request)
            except KafkaAdminError:
                return {}
            return {
                (t.name, p.partition_index): (p.offset if p.error_code == ErrorCode.none else -1)
                for t in r.topics  # type: ignore[attr-defined]
                for p in t.partitions
            }

        out: dict[tuple[str, int], int] = dict.fromkeys(leaders, -1)
        for part in await asyncio.gather(*(ask(b, ts) for b, ts in by_leader.items())):
            out.update(part)
        return out

    async def describe_topic(self, name: str) -> TopicDetail:
        from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
        from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

        r = await self._any(
            MetadataRequest(
                topics=(MetadataRequestTopic(topic_id=None, name=TopicName(name)),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
        [t] = r.topics  # type: ignore[attr-defined]
        _check(t.error_code, None, f"topic {name!r}")
        leaders = {(name, p.partition_index): p.leader_id for p in t.partitions}
        errors = {p.partition_index: p.error_code for p in t.partitions}
        starts, ends = await asyncio.gather(self._offsets(leaders, EARLIEST), self._offsets(leaders, LATEST))
        partitions = [
            PartitionDetail(
                p,
                leaders[(name, p)],
                starts[(name, p)],
                ends[(name, p)],
                None if errors[p] == ErrorCode.none else errors[p].name.upper(),
            )
            for p in sorted(errors)
        ]
        c = await self._any(
            DescribeConfigsRequest(
                resources=(
                    DescribeConfigsResource(
                        resource_type=i8(TOPIC_RESOURCE), resource_name=name, configuration_keys=None
                    ),
                ),
                include_synonyms=False,
                include_documentation=False,
            )
        )
        [res] = c.results  # type: ignore[attr-defined]
        _check(res.error_code, res.error_message, f"configs of {name!r}")
        configs = {
            e.name: e.value for e in res.configs if e.config_source == 1 and e.value is not None
        }  # 1: TOPIC_CONFIG (set on the topic)
        return TopicDetail(name, str(t.topic_id), partitions, dict(sorted(configs.items())))

    async def create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> None:
        from kio.schema.create_topics.v7.request import CreatableTopic, CreatableTopicConfig, CreateTopicsRequest

        r = await self._any(
            CreateTopicsRequest(
                topics=(
                    CreatableTopic(
                        name=TopicName(name),
                        num_partitions=i32(partitions),
                        replication_factor=i16(-1),
                        assignments=(),
                        configs=tuple(CreatableTopicConfig(name=k, value=v) for k, v in configs.items()),
                    ),
                ),
                timeout=i32Timedelta.parse(datetime.timedelta(seconds=self.timeout_s)),
                validate_only=False,
            )
        )
        [t] = r.topics  # type: ignore[attr-defined]
        _check(t.error_code, t.error_message, f"create {name!r}")

    async def delete_topic(self, name: str) -> None:
        from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState

        r = await self._any(
            DeleteTopicsRequest(
                topics=(DeleteTopicState(name=TopicName(name), topic_id=None),),
                timeout=i32Timedelta.parse(datetime.timedelta(seconds=self.timeout_s)),
            )
        )
        [t] = r.responses  # type: ignore[attr-defined]
        _check(t.error_code, t.error_message, f"delete {name!r}")

    async def alter_topic_config(self, name: str, set_: Mapping[str, str], delete: Iterable[str]) -> None:
        from kio.schema.incremental_alter_configs.v1.request import (
            AlterableConfig,
            AlterConfigsResource,
            IncrementalAlterConfigsRequest,
        )

        ops = [AlterableConfig(name=k, config_operation=i8(_SET), value=v) for k, v in set_.items()]
        ops += [AlterableConfig(name=k, config_operation=i8(_DELETE), value=None) for k in delete]
        r = await self._any(
            IncrementalAlterConfigsRequest(
                resources=(
                    AlterConfigsResource(resource_type=i8(TOPIC_RESOURCE), resource_name=name, configs=tuple(ops)),
                ),
                validate_only=False,
            )
        )
        [res] = r.responses  # type: ignore[attr-defined]
        _check(res.error_code, res.error_message, f"alter configs of {name!r}")

    # ------------------------------------------------------------------ groups

    async def list_groups(self, types: Iterable[str] = ()) -> list[GroupSummary]:
        """Every broker's groups (a group lives on its coordinator); `types`: only groups of
        these types (classic, consumer), filtered by the brokers (ListGroups v5)."""
        from kio.schema.list_groups.v5.request import ListGroupsRequest

        meta = await self.metadata()

        async def ask(broker: int) -> list[GroupSummary]:
            r = await self._to(broker, ListGroupsRequest(states_filter=(), types_filter=tuple(types)))
            _check(r.error_code, None, f"list groups on broker {broker}")  # type: ignore[attr-defined]
            return [
                GroupSummary(g.group_id, g.group_state, g.protocol_type, broker, (g.group_type or "classic").lower())
                for g in r.groups  # type: ignore[attr-defined]
            ]

        found = await asyncio.gather(*(ask(b) for b in meta.brokers))
        return sorted((g for part in found for g in part), key=lambda g: g.group_id)

    async def _coordinator(self, group: str) -> int:
        from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

        r = await self._any(FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(group,)))
        [c] = r.coordinators  # type: ignore[attr-defined]
        _check(c.error_code, c.error_message, f"coordinator of group {group!r}")
        return int(c.node_id)

    async def describe_group(self, group: str) -> GroupDetail:
        """A group of either protocol. As Kafka's admin client: ConsumerGroupDescribe first
        (DescribeGroups answers GROUP_ID_NOT_FOUND for KIP-848 groups), DescribeGroups when
        the group is not a consumer group."""
        coordinator = await self._coordinator(group)
        detail = await self._describe_consumer_group(group, coordinator)
        if detail is None:
            detail = await self._describe_share_group(group, coordinator)
            if detail is not None:
                await self._share_lags(detail)
                return detail
        if detail is None:
            detail = await self._describe_classic_group(group, coordinator)
        owners = {tp: m.member_id for m in detail.members for tp in m.assignment}
        await self._lags(detail, owners)
        return detail

    async def _describe_share_group(self, group: str, coordinator: int) -> GroupDetail | None:
        """None when the group is not a share group (or the broker does not know the API)."""
        from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest

        try:
            r = await self._to(
                coordinator, ShareGroupDescribeRequest(group_ids=(GroupId(group),), include_authorized_operations=False)
            )
        except KafkaAdminError as exc:
            if exc.code is None:
                return None
            raise
        [g] = r.groups  # type: ignore[attr-defined]
        if g.error_code == ErrorCode.group_id_not_found:
            return None
        _check(g.error_code, g.error_message, f"describe group {group!r}")
        detail = GroupDetail(
            group,
            g.group_state,
            "share",
            g.assignor_name,
            coordinator,
            type="share",
            group_epoch=int(g.group_epoch),
            assignment_epoch=int(g.assignment_epoch),
            assignor=g.assignor_name,
        )
        for m in sorted(g.members, key=lambda m: (m.client_id, m.member_id)):
            assigned = sorted(
                (str(tp.topic_name), int(p)) for tp in m.assignment.topic_partitions for p in tp.partitions
            )
            detail.members.append(
                MemberDetail(m.member_id, m.client_id, m.client_host, assigned, member_epoch=int(m.member_epoch))
            )
        return detail

    async def _share_lags(self, detail: GroupDetail) -> None:
        """Start offset, end offset and lag of every partition the share group has state for
        or is assigned (DescribeShareGroupOffsets v1); owners are all members sharing it."""
        from kio.schema.describe_share_group_offsets.v1.request import (
            DescribeShareGroupOffsetsRequest,
            DescribeShareGroupOffsetsRequestGroup,
        )

        owners: dict[tuple[str, int], list[str]] = {}
        for m in detail.members:
            for tp in m.assignment:
                owners.setdefault(tp, []).append(m.member_id)
        r = await self._to(
            detail.coordinator,
            DescribeShareGroupOffsetsRequest(
                groups=(DescribeShareGroupOffsetsRequestGroup(group_id=GroupId(detail.group_id), topics=None),)
            ),
        )
        [g] = r.groups  # type: ignore[attr-defined]
        _check(g.error_code, g.error_message, f"share offsets of group {detail.group_id!r}")
        state = {
            (t.topic_name, p.partition_index): (int(p.start_offset), int(p.lag))
            for t in g.topics
            for p in t.partitions
            if p.error_code == ErrorCode.none
        }
        keys = set(state) | set(owners)
        if not keys:
            return
        meta = await self.metadata({t for t, _ in keys})
        ends = await self._offsets({k: meta.leaders.get(k, -1) for k in keys}, LATEST)
        for key in sorted(keys):
            start, lag = state.get(key, (-1, -1))
            detail.offsets.append(
                OffsetLag(
                    key[0],
                    key[1],
                    start,
                    ends.get(key, -1),
                    lag if lag >= 0 else None,
                    ",".join(sorted(owners.get(key, []))) or None,
                )
            )

    async def _describe_consumer_group(self, group: str, coordinator: int) -> GroupDetail | None:
        """None when the group is not a KIP-848 group (or the broker does not know the API)."""
        from kio.schema.consumer_group_describe.v0.request import ConsumerGroupDescribeRequest

        try:
            r = await self._to(
                coordinator,
                ConsumerGroupDescribeRequest(group_ids=(GroupId(group),), include_authorized_operations=False),
            )
        except KafkaAdminError as exc:
            if exc.code is None:  # a broker without api 69 closes the connection: it has no such groups
                return None
            raise
        [g] = r.groups  # type: ignore[attr-defined]
        if g.error_code == ErrorCode.group_id_not_found:
            return None
        _check(g.error_code, g.error_message, f"describe group {group!r}")

        def pairs(assignment: object) -> list[tuple[str, int]]:
            return sorted(
                (str(tp.topic_name), int(p))
                for tp in assignment.topic_partitions  # type: ignore[attr-defined]
                for p in tp.partitions
            )

        detail = GroupDetail(
            group,
            g.group_state,
            "consumer",
            g.assignor_name,
            coordinator,
            type="consumer",
            group_epoch=int(g.group_epoch),
            assignment_epoch=int(g.assignment_epoch),
            assignor=g.assignor_name,
        )
        for m in sorted(g.members, key=lambda m: (m.client_id, m.member_id)):
            detail.members.append(
                MemberDetail(
                    m.member_id,
                    m.client_id,
                    m.client_host,
                    pairs(m.assignment),
                    member_epoch=int(m.member_epoch),
                    instance_id=m.instance_id,
                    target=pairs(m.target_assignment),
                )
            )
        return detail

    async def _describe_classic_group(self, group: str, coordinator: int) -> GroupDetail:
        from kio.schema.describe_groups.v5.request import DescribeGroupsRequest

        r = await self._to(
            coordinator, DescribeGroupsRequest(groups=(GroupId(group),), include_authorized_operations=False)
        )
        [g] = r.groups  # type: ignore[attr-defined]
        _check(g.error_code, None, f"describe group {group!r}")
        detail = GroupDetail(group, g.group_state, g.protocol_type, g.protocol_data, coordinator)
        for m in g.members:
            assignment = parse_assignment(m.member_assignment) if g.protocol_type == "consumer" else []
            detail.members.append(MemberDetail(m.member_id, m.client_id, m.client_host, assignment))
        return detail

    async def _lags(self, detail: GroupDetail, owners: Mapping[tuple[str, int], str]) -> None:
        """Committed offset, end offset and lag of every partition the group committed or owns."""
        from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup

        group = detail.group_id
        o = await self._to(
            detail.coordinator,
            OffsetFetchRequest(
                groups=(OffsetFetchRequestGroup(group_id=GroupId(group), topics=None),), require_stable=False
            ),
        )
        [og] = o.groups  # type: ignore[attr-defined]
        _check(og.error_code, None, f"offsets of group {group!r}")
        committed = {(t.name, p.partition_index): p.committed_offset for t in og.topics for p in t.partitions}
        keys = set(committed) | set(owners)
        if keys:
            meta = await self.metadata({t for t, _ in keys})
            ends = await self._offsets({k: meta.leaders.get(k, -1) for k in keys}, LATEST)
            for key in sorted(keys):
                c, end = committed.get(key, -1), ends.get(key, -1)
                lag = max(0, end - c) if c >= 0 and end >= 0 else None
                detail.offsets.append(OffsetLag(key[0], key[1], c, end, lag, owners.get(key)))
