"""v2 batch header validation and offset assignment against batches a real client encodes."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch
from kio.schema.errors import ErrorCode

from automq.broker.kafka import records


def test_valid_batch_header_is_parsed(make_batch):
    batch = make_batch(5, producer_id=7, producer_epoch=1, base_sequence=10)
    header = records.validate_produce_records(batch, 1 << 20)
    assert header.record_count == 5
    assert header.last_offset_delta == 4
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, 10)
    assert header.size == len(batch)


def test_wrong_crc_is_corrupt_message(make_batch):
    batch = bytearray(make_batch(3))
    batch[-1] ^= 0xFF
    with pytest.raises(records.InvalidBatchError) as err:
        records.validate_produce_records(bytes(batch), 1 << 20)
    assert err.value.error_code == ErrorCode.corrupt_message


@pytest.mark.parametrize("magic", [0, 1])
def test_old_magic_is_invalid_record(magic, make_batch):
    batch = bytearray(make_batch(1))
    batch[records.MAGIC_OFFSET] = magic
    with pytest.raises(records.InvalidBatchError) as err:
        records.validate_produce_records(bytes(batch), 1 << 20)
    assert err.value.error_code == ErrorCode.invalid_record


def test_too_large_is_message_too_large(make_batch):
    batch = make_batch(10, value=b"x" * 1000)
    with pytest.raises(records.InvalidBatchError) as err:
        records.validate_produce_records(batch, len(batch) - 1)
    assert err.value.error_code == ErrorCode.message_too_large


def test_length_past_buffer_and_two_batches(make_batch):
    batch = make_batch(2)
    with pytest.raises(records.InvalidBatchError) as err:
        records.validate_produce_records(batch[:-3], 1 << 20)
    assert err.value.error_code == ErrorCode.corrupt_message
    with pytest.raises(records.InvalidBatchError) as err:
        records.validate_produce_records(batch + batch, 1 << 20)
    assert err.value.error_code == ErrorCode.invalid_record
    for empty in (None, b""):
        with pytest.raises(records.InvalidBatchError) as err:
            records.validate_produce_records(empty, 1 << 20)
        assert err.value.error_code == ErrorCode.invalid_record


def test_record_count_mismatch_is_invalid_record(make_batch):
    batch = bytearray(make_batch(3))
    struct.pack_into(">i", batch, 57, 4)  # recordCount lies about lastOffsetDelta
    struct.pack_into(">I", batch, records.CRC_OFFSET, crc32c.crc32c(bytes(batch[21:])))
    with pytest.raises(records.InvalidBatchError) as err:
        records.validate_produce_records(bytes(batch), 1 << 20)
    assert err.value.error_code == ErrorCode.invalid_record


def test_assign_offsets_keeps_crc_valid_and_client_decodes_offsets(make_batch):
    batch = bytearray(make_batch(4))
    records.assign_offsets(batch, 1000, 7)
    decoded = DefaultRecordBatch(bytes(batch))
    assert decoded.validate_crc()
    assert decoded.base_offset == 1000
    assert [r.offset for r in decoded] == [1000, 1001, 1002, 1003]
    assert struct.unpack_from(">i", batch, 12)[0] == 7


def test_log_append_time_rewrites_max_timestamp_and_crc(make_batch):
    batch = bytearray(make_batch(2, timestamp_ms=1000))
    records.assign_offsets(batch, 5, 0, log_append_time_ms=123_456)
    decoded = DefaultRecordBatch(bytes(batch))
    assert decoded.validate_crc()
    assert decoded.timestamp_type == 1
    assert decoded.max_timestamp == 123_456
    assert all(r.timestamp == 123_456 for r in decoded)  # clients read LogAppendTime per batch
    records.validate_produce_records(bytes(batch), 1 << 20)


def test_timestamp_lookup_and_producer_entries_over_concatenated_batches(make_batch):
    stored = bytearray()
    for i, ts in enumerate((100, 200, 300)):
        b = bytearray(make_batch(2, timestamp_ms=ts, producer_id=9, producer_epoch=0, base_sequence=2 * i))
        records.assign_offsets(b, 2 * i, 0)
        stored += b
    assert records.find_offset_for_timestamp(stored, 150) == (2, 201)
    assert records.find_offset_for_timestamp(stored, 1000) is None
    assert records.max_timestamp(stored) == (5, 301)
    assert [e[2] for e in records.producer_entries(stored)] == [0, 2, 4]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_validation(data):
    try:
        records.validate_produce_records(data, 1 << 20)
    except records.InvalidBatchError as exc:
        assert exc.error_code in (ErrorCode.corrupt_message, ErrorCode.invalid_record, ErrorCode.message_too_large)
    list(records.iter_headers(data))


def test_first_record_at_or_after_a_timestamp(make_batch):
    batch = bytearray(make_batch(5, timestamp_ms=1000))  # records at 1000..1004
    records.assign_offsets(batch, 50, 0)
    assert records.first_record_at_or_after(batch, 0) == (50, 1000)
    assert records.first_record_at_or_after(batch, 1003) == (53, 1003)
    assert records.first_record_at_or_after(batch, 1005) is None
    compressed = bytearray(
        make_batch(5, timestamp_ms=1000, value=b"v" * 1000, compression=1)
    )  # gzip: batch granularity
    assert compressed[21 + 1] & 0x07 == 1
    records.assign_offsets(compressed, 50, 0)
    assert records.first_record_at_or_after(compressed, 1003) == (50, 1004)
    appended = bytearray(make_batch(5, timestamp_ms=1000))
    records.assign_offsets(appended, 50, 0, log_append_time_ms=9000)
    assert records.first_record_at_or_after(appended, 1003) == (50, 9000)


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1), st.binary(max_size=4))
def test_varints_round_trip_and_leave_the_position_after_themselves(value: int, trailing: bytes) -> None:
    encoded = records.write_varint(value)
    assert records.read_varint(encoded + trailing, 0) == (value, len(encoded))


@pytest.mark.parametrize("raw", [b"", b"\x80", b"\xff\xff", b"\x80" * 10 + b"\x01"])
def test_truncated_or_overlong_varints_are_value_errors(raw: bytes) -> None:
    with pytest.raises(ValueError):
        records.read_varint(raw, 0)
