"""Record-level decoding of stored batches (used by the Spark jobs): every codec, nulls,
headers, LogAppendTime, and hostile bytes giving ValueError rather than garbage."""

from __future__ import annotations

import gzip

import lz4.frame
import pytest
import snappy
import zstandard

from automq.broker.kafka import records

RECS = [
    (b"k0", b"v0", [("h", b"x"), ("n", None)]),
    (None, b"v1", []),
    (b"k2", None, []),
    (b"", b"", [("", b"")]),
]


def _batch(codec: int, compress, *, attributes: int = 0) -> bytes:
    encoded = [records.encode_record(i, 10 * i, k, v, h) for i, (k, v, h) in enumerate(RECS)]
    body = b"".join(encoded)
    plain = records.build_batch(
        100, encoded, last_offset_delta=3, base_timestamp=1_000, max_timestamp=1_030, attributes=attributes
    )
    if codec == 0:
        return plain
    header = bytearray(plain[: records.BATCH_HEADER_SIZE])
    payload = compress(body)
    import struct

    import crc32c

    struct.pack_into(">i", header, 8, records.BATCH_HEADER_SIZE - 12 + len(payload))
    struct.pack_into(">h", header, records.ATTRIBUTES_OFFSET, attributes | codec)
    struct.pack_into(">i", header, 57, len(RECS))
    batch = bytearray(bytes(header) + payload)
    struct.pack_into(">I", batch, records.CRC_OFFSET, crc32c.crc32c(bytes(batch[records.ATTRIBUTES_OFFSET :])))
    return bytes(batch)


def _xerial(data: bytes) -> bytes:
    block = snappy.compress(data)
    return b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" * 2 + len(block).to_bytes(4, "big") + block


CODECS = {
    "none": (0, None),
    "gzip": (1, gzip.compress),
    "snappy-raw": (2, snappy.compress),
    "snappy-java": (2, _xerial),
    "lz4": (3, lz4.frame.compress),
    "zstd": (4, lambda b: zstandard.ZstdCompressor().compress(b)),
}


@pytest.mark.parametrize("name", sorted(CODECS))
def test_decode_every_codec(name):
    codec, compress = CODECS[name]
    got = records.decode_records(_batch(codec, compress))
    assert [(o, t, k, v, h) for o, t, k, v, h in got] == [
        (100 + i, 1_000 + 10 * i, k, v, h) for i, (k, v, h) in enumerate(RECS)
    ]


def test_log_append_time_gives_every_record_the_batch_time():
    got = records.decode_records(_batch(0, None, attributes=records.TIMESTAMP_TYPE_BIT))
    assert {t for _, t, _, _, _ in got} == {1_030}


@pytest.mark.parametrize("cut", [62, 70, 90])
def test_truncated_or_corrupt_batches_raise_value_error(cut):
    batch = bytearray(_batch(0, None))
    with pytest.raises(ValueError):
        records.decode_records(bytes(batch[:cut]) + b"\x00" * 0, records.parse_header(batch))
    bad = bytearray(_batch(4, CODECS["zstd"][1]))
    bad[70] ^= 0xFF
    with pytest.raises(ValueError):
        records.decode_records(bytes(bad))
    with pytest.raises(ValueError, match="unknown compression codec"):
        records.decompress_records(6, b"xx")
