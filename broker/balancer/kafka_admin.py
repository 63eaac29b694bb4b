"""A small asyncio Kafka client for what the balancer needs, over the project's kio codec.

Metadata (who leads what, brokers and racks), DescribeConfigs (each broker's
`automq.metrics.url`), AlterPartitionReassignments / ListPartitionReassignments (moves), and
ListOffsets to one broker (does the new leader serve the partition yet?). The standard Kafka
APIs, so the balancer needs nothing but a bootstrap address; the full Kafka clients are test
dependencies only, the product does not import them.

One connection per broker (`automq.broker.kafka.client.BrokerConnection`: TLS and SASL as
`security` says), one request in flight on it at a time. A connection that fails is dropped
and the next call reconnects.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from automq.broker.balancer.model import BrokerMeta, ClusterMetadata, PartitionKey
from automq.broker.kafka.client import BrokerConnection, KafkaClientError
from automq.broker.security.client import PLAINTEXT, ClientSecurity

METRICS_URL_CONFIG = "automq.metrics.url"  # what brokers report (handlers/admin.py)
_BROKER_RESOURCE = 4


# one error type for every caller of this client (a connection problem: code None)
KafkaAdminError = KafkaClientError


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """`host:port[,host:port...]`; IPv6 hosts in brackets."""
    out = []
    for item in bootstrap.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bootstrap address {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("bootstrap is empty; give host:port")
    return out


@dataclass(frozen=True, slots=True)
class KafkaBroker:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True)
class KafkaMetadata:
    brokers: Mapping[int, KafkaBroker]
    leaders: Mapping[PartitionKey, int]
    errors: Mapping[PartitionKey, ErrorCode]  # partitions reported with an error (e.g. leader not available)
    topic_errors: Mapping[str, ErrorCode]


class KafkaAdmin:
    def __init__(self, bootstrap: str, *, timeout_s: float = 30.0, security: ClientSecurity = PLAINTEXT) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.timeout_s = timeout_s
        self.security = security
        self._connections: dict[tuple[str, int], BrokerConnection] = {}
        self._brokers: dict[int, KafkaBroker] = {}

    async def close(self) -> None:
        for c in list(self._connections.values()):
            await c.close()
        self._connections.clear()

    async def __aenter__(self) -> KafkaAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _connection(self, host: str, port: int) -> BrokerConnection:
        c = self._connections.get((host, port))
        if c is None:
            c = self._connections[(host, port)] = BrokerConnection(
                host, port, client_id="automq-balancer", security=self.security, timeout_s=self.timeout_s
            )
        return c

    async def _any(self, request: object) -> object:
        """Send to the bootstrap servers, then the brokers metadata named, until one answers."""
        addresses = list(dict.fromkeys([*self.bootstrap, *((b.host, b.port) for b in self._brokers.values())]))
        problems = []
        for host, port in addresses:
            try:
                return await self._connection(host, port).call(request)
            except KafkaAdminError as exc:
                problems.append(str(exc))
        raise KafkaAdminError("no broker answered: " + "; ".join(problems))

    async def _to(self, broker_id: int, request: object) -> object:
        b = self._brokers.get(broker_id)
        if b is None:
            await self.metadata()
            b = self._brokers.get(broker_id)
            if b is None:
                raise KafkaAdminError(f"broker {broker_id} is not in the cluster metadata")
        return await self._connection(b.host, b.port).call(request)

    # ------------------------------------------------------------------ metadata

    async def metadata(self, topics: Iterable[str] | None = None) -> KafkaMetadata:
        from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

        wanted = (
            None if topics is None else tuple(MetadataRequestTopic(topic_id=None, name=TopicName(t)) for t in topics)
        )
        r = await self._any(
            MetadataRequest(topics=wanted, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        )
        brokers = {b.node_id: KafkaBroker(b.node_id, b.host, b.port, b.rack) for b in r.brokers}  # type: ignore[attr-defined]
        if topics is None:
            self._brokers = dict(brokers)
        else:
            self._brokers.update(brokers)
        leaders: dict[PartitionKey, int] = {}
        errors: dict[PartitionKey, ErrorCode] = {}
        topic_errors: dict[str, ErrorCode] = {}
        for t in r.topics:  # type: ignore[attr-defined]
            if t.error_code != ErrorCode.none:
                topic_errors[t.name] = t.error_code
                continue
            for p in t.partitions:
                key = (t.name, p.partition_index)
                leaders[key] = p.leader_id
                if p.error_code != ErrorCode.none:
                    errors[key] = p.error_code
        return KafkaMetadata(brokers, leaders, errors, topic_errors)

    async def metrics_urls(self, broker_ids: Iterable[int]) -> dict[int, str]:
        """{broker: its metrics URL, or the error text prefixed 'error: '} via DescribeConfigs."""
        from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource

        async def one(bid: int) -> tuple[int, str]:
            request = DescribeConfigsRequest(
                resources=(
                    DescribeConfigsResource(
                        resource_type=i8(_BROKER_RESOURCE),
                        resource_name=str(bid),
                        configuration_keys=(METRICS_URL_CONFIG,),
                    ),
                ),
                include_synonyms=False,
                include_documentation=False,
            )
            try:
                r = await self._to(bid, request)
            except KafkaAdminError as exc:
                return bid, f"error: {exc}"
            result = r.results[0]  # type: ignore[attr-defined]
            if result.error_code != ErrorCode.none:
                return bid, f"error: {result.error_code.name}: {result.error_message}"
            value = next((c.value for c in result.configs if c.name == METRICS_URL_CONFIG), None)
            return bid, value or f"error: broker does not report {METRICS_URL_CONFIG}"

        return dict(await asyncio.gather(*(one(b) for b in sorted(set(broker_ids)))))

    async def cluster_metadata(self, metrics_urls: Mapping[int, str] | None = None) -> ClusterMetadata:
        """The balancer's view from Kafka alone: brokers (all "active": Kafka metadata lists
        only live brokers and has no draining state), racks, leaders and metrics URLs
        (given ones win over what brokers report)."""
        md = await self.metadata()
        given = dict(metrics_urls or {})
        found = await self.metrics_urls([b for b in md.brokers if b not in given])
        urls = {**{b: u for b, u in found.items() if not u.startswith("error: ")}, **given}
        brokers = {b.node_id: BrokerMeta(b.node_id, b.rack, "active", urls.get(b.node_id)) for b in md.brokers.values()}
        # a partition being moved (by anyone) makes the model incomplete until the move is done
        moving = await self.ongoing_reassignments()
        return ClusterMetadata(brokers, dict(md.leaders), moving)

    # ------------------------------------------------------------------ reassignments

    async def alter_reassignment(self, topic: str, partition: int, target: int, timeout_s: float = 30.0) -> None:
        """Start moving a partition to `target` (raises KafkaAdminError with the Kafka code)."""
        from kio.schema.alter_partition_reassignments.v0.request import (
            AlterPartitionReassignmentsRequest,
            ReassignablePartition,
            ReassignableTopic,
        )

        r = await self._any(
            AlterPartitionReassignmentsRequest(
                timeout=i32Timedelta.parse(datetime.timedelta(seconds=timeout_s)),
                topics=(
                    ReassignableTopic(
                        name=TopicName(topic),
                        partitions=(
                            ReassignablePartition(partition_index=i32(partition), replicas=(BrokerId(target),)),
                        ),
                    ),
                ),
            )
        )
        if r.error_code != ErrorCode.none:  # type: ignore[attr-defined]
            raise KafkaAdminError(f"{r.error_code.name}: {r.error_message}", r.error_code)  # type: ignore[attr-defined]
        p = r.responses[0].partitions[0]  # type: ignore[attr-defined]
        if p.error_code != ErrorCode.none:
            raise KafkaAdminError(f"{p.error_code.name}: {p.error_message}", p.error_code)

    async def ongoing_reassignments(self, keys: Iterable[PartitionKey] | None = None) -> dict[PartitionKey, int]:
        """{partition: target} of moves in progress (all, or among `keys`)."""
        from kio.schema.list_partition_reassignments.v0.request import (
            ListPartitionReassignmentsRequest,
            ListPartitionReassignmentsTopics,
        )

        topics = None
        if keys is not None:
            by_topic: dict[str, list[int]] = {}
            for t, p in keys:
                by_topic.setdefault(t, []).append(p)
            topics = tuple(
                ListPartitionReassignmentsTopics(name=TopicName(t), partition_indexes=tuple(i32(x) for x in ps))
                for t, ps in sorted(by_topic.items())
            )
        r = await self._any(
            ListPartitionReassignmentsRequest(timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)), topics=topics)
        )
        if r.error_code != ErrorCode.none:  # type: ignore[attr-defined]
            raise KafkaAdminError(f"{r.error_code.name}: {r.error_message}", r.error_code)  # type: ignore[attr-defined]
        out = {}
        for t in r.topics:  # type: ignore[attr-defined]
            for p in t.partitions:
                out[(t.name, p.partition_index)] = p.adding_replicas[0] if p.adding_replicas else -1
        return out

    async def serves(self, broker_id: int, topic: str, partition: int) -> ErrorCode:
        """What `broker_id` answers to ListOffsets(latest) for the partition (none = it serves)."""
        from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic

        r = await self._to(
            broker_id,
            ListOffsetsRequest(
                replica_id=BrokerId(-1),
                isolation_level=i8(0),
                topics=(
                    ListOffsetsTopic(
                        name=TopicName(topic),
                        partitions=(
                            ListOffsetsPartition(
                                partition_index=i32(partition), current_leader_epoch=i32(-1), timestamp=i64(-1)
                            ),
                        ),
                    ),
                ),
            ),
        )
        return r.topics[0].partitions[0].error_code  # type: ignore[attr-defined]
