"""The Kafka wire codec: frames ⇄ kio request/response dataclasses. Sans-I/O, no sockets here.

kio (schema-generated from Kafka's JSON message specs, native decoder) does the field work.
This package adds what a broker needs around it, and is the ONE place kio's gaps are patched:

- request header parsing by hand (api key, version, correlation id, client id, header tagged
  fields) so unknown keys and versions are recognised before any body decoding;
- unknown tagged fields: kio's native reader raises on a tag it does not know, while the
  protocol (KIP-482) says to skip them. On that error we decode again with a small pure-Python
  reader over kio's own field metadata that skips unknown tags (slow path, rare);
- response framing with the right header version (kio's `__header_schema__`: ApiVersions is
  always header v0, other flexible responses header v1 with an empty tagged-field section);
- the version table advertised in ApiVersions: Kafka 4.0's ranges, cut to the versions kio
  has schemas for;
- `build` / `nested`: construct a response of any version from one set of keyword values
  (fields the version lacks are dropped), so a handler is written once for all versions.

Modules: `framing` (version table, request header, `decode_request`), `lengths` (the length
pre-check that guards kio's native reader), `produce` (Produce decoded in place), `tolerant`
(the unknown-tag slow path), `responses` (framing and building responses), `_common`. Users
import the names below from `automq.broker.kafka.codec`.
"""

from __future__ import annotations

from automq.broker.kafka.codec._common import (
    API_VERSIONS_KEY,
    CLOSE_CONNECTION,
    PRODUCE_KEY,
    ZERO_THROTTLE,
    Buffer,
)
from automq.broker.kafka.codec.framing import (
    FIRST_PRODUCE_TOPIC_ID,
    KAFKA_4_VERSION_RANGES,
    DecodedRequest,
    FrameError,
    RequestDecodeError,
    RequestHeader,
    UnknownApiKeyError,
    UnsupportedVersionError,
    api_name,
    decode_request,
    kio_versions,
    parse_header,
    peek_header,
    request_class,
    response_class,
    supported_range,
)
from automq.broker.kafka.codec.produce import (
    ProducePartitionView,
    ProduceRequestView,
    ProduceTopicView,
    decode_produce_in_place,
)
from automq.broker.kafka.codec.responses import (
    RecordSet,
    build,
    decode_response,
    encode_request,
    encode_response,
    encode_response_chunks,
    error_response,
    has_field,
    is_nullable,
    nested,
)

__all__ = (
    "API_VERSIONS_KEY",
    "CLOSE_CONNECTION",
    "FIRST_PRODUCE_TOPIC_ID",
    "KAFKA_4_VERSION_RANGES",
    "PRODUCE_KEY",
    "ZERO_THROTTLE",
    "Buffer",
    "DecodedRequest",
    "FrameError",
    "ProducePartitionView",
    "ProduceRequestView",
    "ProduceTopicView",
    "RecordSet",
    "RequestDecodeError",
    "RequestHeader",
    "UnknownApiKeyError",
    "UnsupportedVersionError",
    "api_name",
    "build",
    "decode_produce_in_place",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "encode_response_chunks",
    "error_response",
    "has_field",
    "is_nullable",
    "kio_versions",
    "nested",
    "parse_header",
    "peek_header",
    "request_class",
    "response_class",
    "supported_range",
)
