"""Transaction markers: written into a partition this broker leads, or sent to its leader.

`write_local` is what WriteTxnMarkers does on the partition's leader (and what the
coordinator calls directly for partitions it leads itself): append the control batch, and
for a `__consumer_offsets` partition let the group coordinator make the transaction's
offsets visible (commit) or drop them (abort). `MarkerChannel` sends WriteTxnMarkers (v1,
Kafka's inter-broker API) to other brokers over the Kafka protocol, one connection per broker,
on the inter-broker listener with the broker's TLS trust store and SASL credentials
(`automq.broker.security.client.inter_broker`); the receiving broker authorizes it as
CLUSTER_ACTION on the cluster, so that principal must be a super user or hold that ACL.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec
from automq.broker.kafka.client import BrokerConnection, KafkaClientError
from automq.broker.kafka.partitions import NotLeaderError, UnknownPartitionError
from automq.broker.kafka.producers import ProducerStateError
from automq.broker.security.client import PLAINTEXT, ClientSecurity, inter_broker
from automq.broker.storage.api import StreamClosedError

if TYPE_CHECKING:
    from automq.broker.config import NodeConfig
    from automq.broker.kafka.broker import Broker

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS = 27
REQUEST_TIMEOUT_S = 30.0


async def write_local(
    broker: Broker, topic: str, index: int, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
) -> ErrorCode:
    from automq.broker.kafka.groups.coordinator import OFFSETS_TOPIC

    try:
        partition = broker.partitions.get(topic, index)
        await partition.append_marker(producer_id, producer_epoch, commit, coordinator_epoch)
    except (NotLeaderError, StreamClosedError):
        return ErrorCode.not_leader_or_follower
    except UnknownPartitionError:
        return ErrorCode.unknown_topic_or_partition
    except ProducerStateError as exc:
        log.warning("marker for producer %d on %s-%d refused: %s", producer_id, topic, index, exc)
        return exc.error_code
    except Exception as exc:
        log.warning("writing a marker on %s-%d failed: %r", topic, index, exc)
        return ErrorCode.kafka_storage_error
    if topic == OFFSETS_TOPIC and broker.groups is not None:
        broker.groups.complete_txn_offsets(index, producer_id, commit)
    return ErrorCode.none


class MarkerChannel:
    """WriteTxnMarkers to other brokers (one marker, all its partitions on that broker); the
    partition leaders' KIP-890 verification calls use a channel of their own."""

    def __init__(self, security: ClientSecurity = PLAINTEXT) -> None:
        self.security = security
        self._connections: dict[tuple[str, int], BrokerConnection] = {}

    @classmethod
    def for_node(cls, config: NodeConfig) -> MarkerChannel:
        return cls(inter_broker(config))

    async def close(self) -> None:
        for c in list(self._connections.values()):
            await c.close()
        self._connections.clear()

    async def call(self, host: str, port: int, request: Any) -> Any:
        """Any request to a broker over this channel's connection to it (raises on failure)."""
        connection = self._connections.get((host, port))
        if connection is None:
            connection = self._connections[(host, port)] = BrokerConnection(
                host, port, client_id="automq-txn-coordinator", security=self.security, timeout_s=REQUEST_TIMEOUT_S
            )
        return await connection.call(request)

    async def send(
        self,
        host: str,
        port: int,
        partitions: list[tuple[str, int]],
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> dict[tuple[str, int], ErrorCode]:
        """Errors per partition; a connection failure answers NOT_LEADER for all (retried)."""
        request_cls = codec.request_class(WRITE_TXN_MARKERS, 1)
        topic_cls = codec.nested(request_cls, "WritableTxnMarkerTopic")
        marker_cls = codec.nested(request_cls, "WritableTxnMarker")
        by_topic: dict[str, list[int]] = {}
        for topic, index in partitions:
            by_topic.setdefault(topic, []).append(index)
        request = request_cls(
            markers=(
                marker_cls(
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    transaction_result=commit,
                    topics=tuple(topic_cls(name=t, partition_indexes=tuple(ps)) for t, ps in by_topic.items()),
                    coordinator_epoch=coordinator_epoch,
                ),
            )
        )
        try:
            response = await self.call(host, port, request)
        except Exception as exc:
            # an authentication failure is a setting to fix, not a blip: say so louder
            auth = isinstance(exc, KafkaClientError) and exc.code == ErrorCode.sasl_authentication_failed
            log.log(logging.WARNING if auth else logging.INFO, "WriteTxnMarkers to %s:%d failed: %s", host, port, exc)
            return dict.fromkeys(partitions, ErrorCode.not_leader_or_follower)
        out: dict[tuple[str, int], ErrorCode] = dict.fromkeys(partitions, ErrorCode.unknown_server_error)
        for marker in response.markers:
            for t in marker.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index)] = p.error_code
        return out
