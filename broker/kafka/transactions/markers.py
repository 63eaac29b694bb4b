"""Transaction markers: written into a partition this broker leads, or sent to its leader.

`write_local` is what WriteTxnMarkers does on the partition's leader (and what the
coordinator calls directly for partitions it leads itself): append the control batch, and
for a `__consumer_offsets` partition let the group coordinator make the transaction's
offsets visible (commit) or drop them (abort). `MarkerChannel` sends WriteTxnMarkers (v1,
Kafka's inter-broker API) to other brokers over the Kafka protocol, one connection per broker.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec
from automq.broker.kafka.partitions import NotLeaderError, UnknownPartitionError
from automq.broker.kafka.producers import ProducerStateError
from automq.broker.storage.api import StreamClosedError

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
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


class _Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._lock = asyncio.Lock()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation = 0

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ConnectionError):
                pass

    async def call(self, request: Any) -> Any:
        async with self._lock:
            try:
                return await asyncio.wait_for(self._call(request), REQUEST_TIMEOUT_S)
            except BaseException:
                await self.close()
                raise

    async def _call(self, request: Any) -> Any:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        frame = codec.encode_request(self._correlation, request, client_id="automq-txn-coordinator")
        self._writer.write(_SIZE.pack(len(frame)) + frame)
        await self._writer.drain()
        (size,) = _SIZE.unpack(await self._reader.readexactly(4))
        correlation, response = codec.decode_response(await self._reader.readexactly(size), type(request))
        if correlation != self._correlation:
            raise ConnectionError(f"correlation id {correlation}, expected {self._correlation}")
        return response


class MarkerChannel:
    """WriteTxnMarkers to other brokers (one marker, all its partitions on that broker)."""

    def __init__(self) -> None:
        self._connections: dict[tuple[str, int], _Connection] = {}

    async def close(self) -> None:
        for c in list(self._connections.values()):
            await c.close()
        self._connections.clear()

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
        connection = self._connections.get((host, port))
        if connection is None:
            connection = self._connections[(host, port)] = _Connection(host, port)
        try:
            response = await connection.call(request)
        except Exception as exc:
            log.info("WriteTxnMarkers to %s:%d failed: %r", host, port, exc)
            return dict.fromkeys(partitions, ErrorCode.not_leader_or_follower)
        out: dict[tuple[str, int], ErrorCode] = dict.fromkeys(partitions, ErrorCode.unknown_server_error)
        for marker in response.markers:
            for t in marker.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index)] = p.error_code
        return out
