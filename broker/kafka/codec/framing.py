"""Request framing: the version table advertised in ApiVersions, the request header parsed by
hand (so unknown keys and versions are known before any body decoding), and `decode_request`,
which runs the length pre-check, the in-place Produce path or kio's reader with the tolerant
fallback."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader
from kio.serial.errors import DecodeError

from automq.broker.kafka.codec._common import (
    _INT16,
    _PREFIX,
    PRODUCE_KEY,
    Buffer,
    _LengthError,
    _memo,
)
from automq.broker.kafka.codec.lengths import _check_lengths, _skip_tagged_fields
from automq.broker.kafka.codec.produce import decode_produce_in_place
from automq.broker.kafka.codec.tolerant import _read_entity_tolerant

# Kafka 4.0 broker ranges (KIP-896 removed the pre-2.1 versions). Only keys with a registered
# handler are advertised; kio's available versions cut these further (see supported_range).
KAFKA_4_VERSION_RANGES: dict[int, tuple[int, int]] = {
    0: (3, 13),  # Produce (v13: Kafka 4.1, topics named by id, KIP-516)
    1: (4, 18),  # Fetch (v18: Kafka 4.1, a follower's high watermark, KIP-1166; consumers omit it)
    2: (1, 11),  # ListOffsets (v11: Kafka 4.2, EARLIEST_PENDING_UPLOAD_TIMESTAMP, KIP-1023)
    3: (0, 13),  # Metadata
    8: (2, 10),  # OffsetCommit (v10: Kafka 4.2, topics named by id, KIP-848)
    9: (1, 10),  # OffsetFetch (v10: Kafka 4.2, topics named by id, KIP-848)
    10: (0, 6),  # FindCoordinator
    11: (0, 9),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 6),  # DescribeGroups
    16: (0, 5),  # ListGroups
    17: (0, 1),  # SaslHandshake
    18: (0, 4),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 5),  # InitProducerId
    23: (2, 4),  # OffsetForLeaderEpoch
    24: (0, 5),  # AddPartitionsToTxn
    25: (0, 4),  # AddOffsetsToTxn
    26: (0, 5),  # EndTxn
    27: (1, 1),  # WriteTxnMarkers
    28: (0, 5),  # TxnOffsetCommit
    29: (1, 3),  # DescribeAcls
    30: (1, 3),  # CreateAcls
    31: (1, 3),  # DeleteAcls
    32: (1, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs
    34: (1, 2),  # AlterReplicaLogDirs
    35: (1, 4),  # DescribeLogDirs
    36: (0, 2),  # SaslAuthenticate
    37: (0, 3),  # CreatePartitions
    38: (1, 3),  # CreateDelegationToken (v0 is gone in Kafka 4)
    39: (1, 2),  # RenewDelegationToken
    40: (1, 2),  # ExpireDelegationToken
    41: (1, 3),  # DescribeDelegationToken
    42: (0, 2),  # DeleteGroups
    43: (0, 2),  # ElectLeaders
    44: (0, 1),  # IncrementalAlterConfigs
    45: (0, 0),  # AlterPartitionReassignments
    46: (0, 0),  # ListPartitionReassignments
    47: (0, 0),  # OffsetDelete
    48: (0, 1),  # DescribeClientQuotas
    49: (0, 1),  # AlterClientQuotas
    50: (0, 0),  # DescribeUserScramCredentials
    51: (0, 0),  # AlterUserScramCredentials
    55: (0, 2),  # DescribeQuorum
    60: (0, 2),  # DescribeCluster
    61: (0, 0),  # DescribeProducers
    65: (0, 0),  # DescribeTransactions
    66: (0, 1),  # ListTransactions
    68: (0, 1),  # ConsumerGroupHeartbeat (KIP-848)
    69: (0, 1),  # ConsumerGroupDescribe (KIP-848)
    71: (0, 0),  # GetTelemetrySubscriptions
    72: (0, 0),  # PushTelemetry
    74: (0, 1),  # ListConfigResources (v1: Kafka 4.1, KIP-1142; v0 was ListClientMetricsResources)
    75: (0, 0),  # DescribeTopicPartitions
    76: (1, 1),  # ShareGroupHeartbeat (KIP-932; v0 was Kafka 4.0's early access)
    77: (1, 1),  # ShareGroupDescribe (KIP-932)
    78: (1, 2),  # ShareFetch (KIP-932; v0 was Kafka 4.0's early access)
    79: (1, 2),  # ShareAcknowledge (KIP-932)
    83: (0, 0),  # InitializeShareGroupState (KIP-932, inter-broker)
    85: (1, 1),  # WriteShareGroupState (KIP-932, inter-broker: a start-offset reset on the leader)
    86: (0, 0),  # DeleteShareGroupState (KIP-932, inter-broker)
    87: (1, 1),  # ReadShareGroupStateSummary (KIP-932, inter-broker)
    90: (0, 1),  # DescribeShareGroupOffsets (KIP-932; v1 adds lag)
    91: (0, 0),  # AlterShareGroupOffsets (KIP-932)
    92: (0, 0),  # DeleteShareGroupOffsets (KIP-932)
}


# Produce v13 (Kafka 4.1) names each topic by its id instead of its name, in request and response.
FIRST_PRODUCE_TOPIC_ID = 13


# --------------------------------------------------------------------------- errors


class FrameError(Exception):
    """A frame that cannot be a Kafka request (too short, bad header). Close the connection."""


class UnknownApiKeyError(FrameError):
    def __init__(self, api_key: int, correlation_id: int) -> None:
        super().__init__(f"unknown api key {api_key}")
        self.api_key = api_key
        self.correlation_id = correlation_id


class UnsupportedVersionError(FrameError):
    def __init__(self, api_key: int, api_version: int, correlation_id: int, client_id: str | None) -> None:
        super().__init__(f"unsupported version {api_version} of api key {api_key}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id


class RequestDecodeError(FrameError):
    """The header was fine but the body does not decode as that request version."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int, reason: str) -> None:
        super().__init__(f"cannot decode {api_name(api_key)} v{api_version} request: {reason}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


# --------------------------------------------------------------------------- versions


@functools.lru_cache(maxsize=256)  # named on every request (the latency metric's label); keys come from clients
def api_name(api_key: int) -> str:
    name = api_key_map.get(api_key)
    return "".join(part.capitalize() for part in name.split("_")) if name else f"ApiKey{api_key}"


@_memo
def kio_versions(api_key: int) -> frozenset[int]:
    name = api_key_map.get(api_key)
    if name is None:
        return frozenset()
    return frozenset(schema_name_map.get(name, {}).keys())


def supported_range(
    api_key: int, min_version: int | None = None, max_version: int | None = None
) -> tuple[int, int] | None:
    """The contiguous version range served for api_key: Kafka 4.0's, within kio's schemas and
    the handler's own limits; None when nothing is left."""
    kafka = KAFKA_4_VERSION_RANGES.get(api_key)
    available = kio_versions(api_key)
    if kafka is None or not available:
        return None
    low = max(kafka[0], min_version if min_version is not None else kafka[0])
    high = min(kafka[1], max_version if max_version is not None else kafka[1])
    while low <= high and low not in available:
        low += 1
    v = low
    while v <= high and v in available:
        v += 1
    return (low, v - 1) if v - 1 >= low else None


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # bytes of the header in the frame; the body follows


def peek_header(frame: Buffer) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a frame; FrameError if it is too short."""
    if len(frame) < _PREFIX.size:
        raise FrameError(f"request frame of {len(frame)} bytes is shorter than a request header")
    return _PREFIX.unpack_from(frame, 0)


def parse_header(frame: Buffer, flexible: bool) -> RequestHeader:
    """Request header v1 (or v2 when flexible): client id is always a legacy nullable string."""
    api_key, api_version, correlation_id = peek_header(frame)
    position = _PREFIX.size
    if position + 2 > len(frame):
        raise FrameError("request header truncated before client id")
    (length,) = _INT16.unpack_from(frame, position)
    position += 2
    client_id: str | None = None
    if length >= 0:
        if position + length > len(frame):
            raise FrameError("request header client id runs past the frame")
        try:
            client_id = bytes(frame[position : position + length]).decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("request header client id is not UTF-8") from None
        position += length
    elif length != -1:
        raise FrameError(f"request header client id has length {length}")
    if flexible:
        try:
            position = _skip_tagged_fields(frame, position)
        except (_LengthError, IndexError) as exc:
            raise FrameError(f"request header tagged fields malformed: {exc or 'truncated'}") from None
    return RequestHeader(api_key, api_version, correlation_id, client_id, position)


@_memo
def request_class(api_key: int, api_version: int) -> type[Any]:
    return load_request_schema(api_key, api_version)


@_memo
def response_class(api_key: int, api_version: int) -> type[Any]:
    return load_response_schema(api_key, api_version)


@_memo
def _reader(cls: type[Any]) -> Callable[..., tuple[Any, int]]:
    return entity_reader(cls)


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    header: RequestHeader
    request: Any
    response_class: type[Any]


def decode_request(frame: Buffer, served: dict[int, tuple[int, int]]) -> DecodedRequest:
    """Decode one request frame (without its 4-byte size) for the api keys/ranges `served`.

    Raises UnknownApiKeyError, UnsupportedVersionError (ApiVersions callers answer it, others
    close), RequestDecodeError or FrameError."""
    # a bytearray of its own (Produce frames over 256 KiB) or a writable view of a slab (the others)
    writable = frame if isinstance(frame, bytearray) or (isinstance(frame, memoryview) and not frame.readonly) else None
    if writable is not None:
        frame = memoryview(writable).toreadonly()  # kio's native readers want read-only buffers
    api_key, api_version, correlation_id = peek_header(frame)
    span = served.get(api_key)
    if span is None:
        raise UnknownApiKeyError(api_key, correlation_id)
    if not span[0] <= api_version <= span[1]:
        client_id = None
        try:
            client_id = parse_header(frame, flexible=False).client_id
        except FrameError:
            pass
        raise UnsupportedVersionError(api_key, api_version, correlation_id, client_id)
    cls = request_class(api_key, api_version)
    header = parse_header(frame, cls.__flexible__)
    try:
        # kio's native reader sizes arrays from the declared length before reading them: a
        # hostile length aborts the process on allocation failure. Check every length first.
        _check_lengths(cls, frame, header.size)
    except (_LengthError, IndexError, struct.error) as exc:
        raise RequestDecodeError(api_key, api_version, correlation_id, str(exc) or "truncated") from None
    if api_key == PRODUCE_KEY and writable is not None:
        # large produce frames: record batches stay views of the received buffer (rewritten
        # in place by the produce path), no kio copy
        try:
            request = decode_produce_in_place(
                writable, header.size, cls.__flexible__, topic_ids=api_version >= FIRST_PRODUCE_TOPIC_ID
            )
        except (IndexError, struct.error, UnicodeDecodeError, _LengthError) as exc:
            raise RequestDecodeError(api_key, api_version, correlation_id, str(exc) or "truncated") from None
        return DecodedRequest(header, request, response_class(api_key, api_version))
    try:
        request, _size = _reader(cls)(frame, header.size)
    except KeyError as exc:
        # kio knows only the tags of its schema; unknown tags must be skipped (KIP-482)
        try:
            request, _end = _read_entity_tolerant(cls, frame, header.size)
        except (
            DecodeError,
            ValueError,
            KeyError,
            TypeError,
            UnicodeDecodeError,
        ) as inner:
            raise RequestDecodeError(api_key, api_version, correlation_id, str(inner)) from None
        del exc
    except (
        DecodeError,
        ValueError,
        TypeError,
        UnicodeDecodeError,
        OverflowError,
    ) as exc:
        raise RequestDecodeError(api_key, api_version, correlation_id, str(exc) or type(exc).__name__) from None
    # Trailing bytes after the body are ignored, as the Java broker's parser does.
    return DecodedRequest(header, request, response_class(api_key, api_version))
