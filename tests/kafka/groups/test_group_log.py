"""__consumer_offsets records: Kafka's key/value layouts and the v2 batches carrying them,
including hostile bytes (a client may produce garbage into the topic)."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automq.broker.kafka import records
from automq.broker.kafka.groups.log import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    RecordFormatError,
    decode_batches,
    decode_key,
    encode_batch,
)


def test_keys_and_values_round_trip() -> None:
    assert decode_key(OffsetKey("g", "t", 3).encode()) == OffsetKey("g", "t", 3)
    assert decode_key(GroupKey("g\u00e9").encode()) == GroupKey("g\u00e9")
    for v in (OffsetValue(5, 2, "m", 100), OffsetValue(5, -1, "", 100, 200)):
        assert OffsetValue.decode(v.encode()) == v
    g = GroupValue(
        "consumer",
        7,
        "range",
        "m1",
        123,
        (MemberValue("m1", None, "c", "/h", 1, 2, b"s", b"a"), MemberValue("m2", "i", "c", "/h", 3, 4, b"", b"")),
    )
    assert GroupValue.decode(g.encode()) == g
    assert GroupValue.decode(GroupValue("", 1, None, None, 0, ()).encode()).protocol_name is None


def test_kafka_layout_of_offset_key() -> None:
    # Kafka's OffsetCommitKey v1: int16 version, string group, string topic, int32 partition
    assert OffsetKey("g", "t", 1).encode() == b"\x00\x01" + b"\x00\x01g" + b"\x00\x01t" + b"\x00\x00\x00\x01"


@pytest.mark.parametrize("raw", [b"", b"\x00", b"\x00\x09abc", b"\x00\x01\x00\x05ab", b"\x00\x02\xff\xff"])
def test_bad_keys_are_format_errors(raw: bytes) -> None:
    with pytest.raises(RecordFormatError):
        decode_key(raw)


def test_batch_is_a_valid_kafka_v2_batch_and_round_trips() -> None:
    recs = [(b"k1", b"v1"), (b"k2", None), (b"k3", b"x" * 300)]
    batch = encode_batch(recs, 1234, base_offset=10)
    header = records.validate_produce_records(batch, 1 << 20)  # K1's produce validation accepts it
    assert header.record_count == 3 and header.base_timestamp == 1234
    assert list(decode_batches(batch)) == [(10, b"k1", b"v1"), (11, b"k2", None), (12, b"k3", b"x" * 300)]
    two = batch + encode_batch([(b"k4", b"v4")], 0, base_offset=13)
    assert [o for o, _, _ in decode_batches(two)] == [10, 11, 12, 13]


def test_corrupt_and_truncated_batches_are_skipped() -> None:
    good = encode_batch([(b"a", b"1")], 0, base_offset=0)
    bad = bytearray(encode_batch([(b"b", b"2")], 0, base_offset=1))
    bad[-1] ^= 0xFF  # CRC mismatch
    tail = encode_batch([(b"c", b"3")], 0, base_offset=2)
    assert [k for _, k, _ in decode_batches(good + bytes(bad) + tail)] == [b"a", b"c"]
    assert [k for _, k, _ in decode_batches(good + tail[:-5])] == [b"a"]
    compressed = bytearray(encode_batch([(b"d", b"4")], 0))
    struct.pack_into(">h", compressed, 21, 1)  # gzip bit
    struct.pack_into(">I", compressed, 17, crc32c.crc32c(bytes(compressed[21:])))
    assert list(decode_batches(bytes(compressed))) == []


def test_batch_with_a_varint_cut_off_inside_a_valid_crc_is_skipped() -> None:
    """The record area of a CRC-valid batch ends inside a varint: records.read_varint's
    ValueError is caught and the batch skipped, the next one still read."""
    batch = bytearray(encode_batch([(b"a", b"1")], 0, base_offset=0))
    batch += b"\x80"  # a continuation byte and then nothing: a truncated varint
    struct.pack_into(">i", batch, 57, 2)  # recordCount: 2, so the reader reaches it
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    tail = encode_batch([(b"c", b"3")], 0, base_offset=2)
    assert [k for _, k, _ in decode_batches(bytes(batch) + tail)] == [b"c"]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_reader(raw: bytes) -> None:
    list(decode_batches(raw))
    list(decode_batches(encode_batch([(b"k", b"v")], 0) + raw))
