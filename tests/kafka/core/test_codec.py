"""The codec over every version of the APIs the core server handles, flexible and not."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from automq.broker.kafka import codec
from automq.broker.kafka.handlers import registry

# kio leaves its Records phantom type without a strategy; record sets are opaque bytes here
st.register_type_strategy(Records, st.binary(max_size=64).map(Records))

CORE_APIS = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 18: "ApiVersions"}
SERVED = registry.served_ranges()
CASES = [(key, v) for key in CORE_APIS for v in range(SERVED[key][0], SERVED[key][1] + 1)]


def test_core_apis_advertise_kafka_4_ranges():
    assert SERVED[0] == (3, 13)  # Produce v13: Kafka 4.1 (topic ids)
    assert SERVED[1] == (4, 18)  # Fetch v18: Kafka 4.1
    assert SERVED[2] == (1, 11)  # ListOffsets v11: Kafka 4.2
    assert SERVED[3] == (0, 13)
    assert SERVED[18] == (0, 4)
    assert SERVED[17] == (0, 1) and SERVED[36] == (0, 2)  # SaslHandshake, SaslAuthenticate
    # nothing without a handler is served (inter-controller APIs, ...)
    assert 56 not in SERVED
    # transactions: EndTxn and TxnOffsetCommit stop before KIP-890 part 2 (v5)
    assert SERVED[24] == (0, 5) and SERVED[26] == (0, 4) and SERVED[28] == (0, 4) and SERVED[27] == (1, 1)


def test_both_flexible_and_non_flexible_versions_are_served():
    flexible = {codec.request_class(k, v).__flexible__ for k, v in CASES}
    assert flexible == {True, False}


@pytest.mark.parametrize(("api_key", "version"), CASES, ids=[f"{CORE_APIS[k]}-v{v}" for k, v in CASES])
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_request_and_response_round_trip(api_key, version, data):
    request_cls = codec.request_class(api_key, version)
    request = data.draw(st.from_type(request_cls))
    frame = codec.encode_request(123, request, client_id="tester")
    decoded = codec.decode_request(frame, SERVED)
    assert decoded.header.correlation_id == 123
    assert decoded.header.client_id == "tester"
    assert decoded.response_class is codec.response_class(api_key, version)
    assert codec.encode_request(123, decoded.request, client_id="tester") == frame

    response = data.draw(st.from_type(decoded.response_class))
    payload = codec.encode_response(77, response)
    correlation_id, back = codec.decode_response(payload, request_cls)
    assert correlation_id == 77
    assert codec.encode_response(77, back) == payload


def test_api_versions_response_always_uses_header_v0():
    from kio.schema.api_versions.v3.response import ApiVersionsResponse
    from kio.schema.metadata.v12.response import MetadataResponse

    assert not ApiVersionsResponse.__header_schema__.__flexible__
    assert MetadataResponse.__header_schema__.__flexible__
    payload = codec.encode_response(5, codec.error_response(ApiVersionsResponse, ErrorCode.none))
    assert (
        payload[:4] == b"\x00\x00\x00\x05" and payload[4:6] == b"\x00\x00"
    )  # error code right after the correlation id


def test_unknown_tagged_fields_are_skipped():
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name="t"),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    frame = codec.encode_request(1, request)
    assert frame.endswith(b"\x00")
    # body's tagged-field section: 2 unknown tags (7 and 300), the second one 3 bytes long
    hostile = frame[:-1] + bytes([2, 7, 0, 0xAC, 0x02, 3]) + b"abc"
    decoded = codec.decode_request(hostile, SERVED)
    assert decoded.request == request
    # unknown tags inside a nested struct and in the header are skipped too
    header_end = codec.parse_header(frame, True).size
    nested = bytearray(frame)
    topic_tags_at = len(frame) - 4  # ..., name, topic tags(0), allow_auto, include_ops, tags(0)
    assert nested[topic_tags_at] == 0
    nested[topic_tags_at : topic_tags_at + 1] = bytes([1, 9, 1, 0xEE])
    nested[header_end - 1 : header_end] = bytes([1, 4, 2, 1, 2])
    assert codec.decode_request(bytes(nested), SERVED).request == request


def test_unknown_key_unsupported_version_and_garbage():
    from kio.schema.metadata.v12.request import MetadataRequest

    frame = codec.encode_request(
        9, MetadataRequest(topics=None, allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    )
    with pytest.raises(codec.UnknownApiKeyError):
        codec.decode_request(b"\x03\xe7" + frame[2:], SERVED)
    with pytest.raises(codec.UnsupportedVersionError) as err:
        codec.decode_request(frame[:2] + b"\x00\x63" + frame[4:], SERVED)
    assert err.value.correlation_id == 9 and err.value.api_version == 99
    with pytest.raises(codec.FrameError):
        codec.decode_request(frame[:5], SERVED)
    with pytest.raises(codec.RequestDecodeError):
        codec.decode_request(frame[:-2], SERVED)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_frames_raise_only_frame_errors(frame):
    try:
        codec.decode_request(frame, SERVED)
    except codec.FrameError:
        pass


@settings(max_examples=200, deadline=None)
@given(api=st.sampled_from(CASES), tail=st.binary(max_size=64), cut=st.integers(0, 64))
def test_valid_headers_with_garbage_bodies_raise_only_frame_errors(api, tail, cut):
    key, version = api
    prefix = codec.encode_request(1, codec.error_response(codec.request_class(key, version), ErrorCode.none))
    frame = prefix[: max(8, len(prefix) - cut)] + tail
    for variant in (frame, bytearray(frame)):  # bytearrays: large frames (in-place Produce decoding)
        try:
            codec.decode_request(variant, SERVED)
        except codec.FrameError:
            pass


@pytest.mark.parametrize("api_key", sorted(SERVED))
def test_error_response_encodes_for_every_served_version(api_key):
    low, high = SERVED[api_key]
    for version in range(low, high + 1):
        cls = codec.response_class(api_key, version)
        payload = codec.encode_response(1, codec.error_response(cls, ErrorCode.unknown_server_error))
        assert payload[:4] == b"\x00\x00\x00\x01"


def test_build_drops_fields_a_version_lacks():
    v4 = codec.response_class(1, 4)
    v12 = codec.response_class(1, 12)
    assert not codec.has_field(v4, "session_id")
    r4 = codec.build(v4, throttle_time=codec.ZERO_THROTTLE, session_id=5, error_code=ErrorCode.none, responses=())
    r12 = codec.build(v12, throttle_time=codec.ZERO_THROTTLE, session_id=5, error_code=ErrorCode.none, responses=())
    assert r12.session_id == 5 and not hasattr(r4, "session_id")


@pytest.mark.parametrize("version", [3, 9])
def test_hostile_array_length_is_a_decode_error_not_an_allocation(version):
    # kio's native reader would reserve memory for the declared length and abort the process
    import datetime

    m = __import__(f"kio.schema.produce.v{version}.request", fromlist=["x"])
    request = m.ProduceRequest(transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=1), topic_data=())
    frame = codec.encode_request(1, request)
    huge = b"\xff\xff\xff\xff\x07" if version >= 9 else b"\x7f\xff\xff\xff"
    empty = b"\x01" if version >= 9 else b"\x00\x00\x00\x00"
    tail = b"\x00" if version >= 9 else b""  # body tagged fields
    assert frame.endswith(empty + tail)
    hostile = frame[: len(frame) - len(empty + tail)] + huge + b"\x00" * 64
    with pytest.raises(codec.RequestDecodeError):
        codec.decode_request(hostile, SERVED)


PRODUCE_VERSIONS = list(range(SERVED[0][0], SERVED[0][1] + 1))


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_in_place_produce_decoding_matches_kio(version, data):
    request = data.draw(st.from_type(codec.request_class(0, version)))
    frame = codec.encode_request(1, request)
    via_kio = codec.decode_request(frame, SERVED).request  # bytes frames go through kio
    in_place = codec.decode_request(bytearray(frame), SERVED).request  # large frames arrive as bytearrays
    assert isinstance(in_place, codec.ProduceRequestView)
    assert (in_place.transactional_id, in_place.acks, in_place.timeout) == (
        via_kio.transactional_id,
        via_kio.acks,
        via_kio.timeout,
    )
    # v13+ names topics by id (KIP-516), earlier versions by name
    assert [
        (t.name, t.topic_id, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
        for t in in_place.topic_data
    ] == [
        (getattr(t, "name", None), getattr(t, "topic_id", None), [(p.index, p.records) for p in t.partition_data])
        for t in via_kio.topic_data
    ]
    for t in in_place.topic_data:
        for p in t.partition_data:
            assert p.records is None or not p.records.readonly


def test_tagged_field_varints_longer_than_five_bytes_are_refused():
    # Kafka reads an unsigned varint of at most 5 bytes; a longer one is a malformed request.
    from kio.schema.metadata.v12.request import MetadataRequest

    request = MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    frame = codec.encode_request(1, request)
    header_end = codec.parse_header(frame, True).size
    zero_in_5 = b"\x80\x80\x80\x80\x00"  # 0, padded to the longest legal encoding
    zero_in_6 = b"\x80\x80\x80\x80\x80\x00"
    for tags, ok in ((zero_in_5, True), (zero_in_6, False)):
        in_header = frame[: header_end - 1] + tags + frame[header_end:]
        in_body = frame[:-1] + tags
        for hostile in (in_header, in_body):
            if ok:
                assert codec.decode_request(hostile, SERVED).request == request
            else:
                with pytest.raises(codec.FrameError):
                    codec.decode_request(hostile, SERVED)
    # the in-place Produce path skips nested tag sections with the same reader
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    produce = ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout=__import__("datetime").timedelta(seconds=1),
        topic_data=(TopicProduceData(name="t", partition_data=(PartitionProduceData(index=0, records=None),)),),
    )
    frame = codec.encode_request(1, produce)
    assert frame.endswith(b"\x00\x00\x00")  # partition tags, topic tags, body tags
    for tags, ok in ((zero_in_5, True), (zero_in_6, False)):
        hostile = bytearray(frame[:-3] + tags + b"\x00\x00")
        if ok:
            view = codec.decode_request(hostile, SERVED).request
            assert view.topic_data[0].partition_data[0].index == 0
        else:
            with pytest.raises(codec.FrameError):
                codec.decode_request(hostile, SERVED)
