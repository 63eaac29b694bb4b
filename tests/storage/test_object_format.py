"""Object format: round trip, index search, and hostile bytes (truncated, foreign, newer)."""

from __future__ import annotations

import struct

import pytest

from automq.broker.storage.objects.format import (
    FOOTER,
    FORMAT_VERSION,
    INDEX_ENTRY,
    ObjectFormatError,
    ObjectWriter,
    iter_block_batches,
    parse_index,
    parse_tail,
)


def build() -> bytes:
    w = ObjectWriter(block_bytes=100)
    for base in range(0, 30, 3):
        w.add_batch(1, base, 3, bytes([base]) * 40)
    w.add_batch(5, 7, 1, b"x" * 10)
    return b"".join(w.finish())


def open_index(data: bytes):
    pos, length, crc = parse_tail(data[-FOOTER.size :], len(data))
    return parse_index(data[pos : pos + length], crc, len(data))


def test_round_trip_and_block_search():
    data = build()
    index = open_index(data)
    assert INDEX_ENTRY.size == 36 and FOOTER.size == 48
    blocks = index.blocks(1, 10, 20)
    assert blocks and blocks[0].start_offset <= 10 < blocks[0].end_offset and blocks[-1].start_offset < 20
    batches = [
        (b, c, bytes(p)) for e in blocks for b, c, p in iter_block_batches(data[e.position : e.position + e.size])
    ]
    assert [b for b, _, _ in batches] == sorted(b for b, _, _ in batches)
    assert (9, 3, bytes([9]) * 40) in batches
    assert [e.stream_id for e in index.blocks(5, 0, 100)] == [5]
    assert index.blocks(2, 0, 100) == [] and index.blocks(1, 30, 40) == []
    after = index.stream_blocks_after(index.blocks(1, 0, 1)[0])
    assert all(e.stream_id == 1 for e in after) and len(after) == len(index.blocks(1, 0, 100)) - 1


def test_writer_rejects_gaps_and_interleaving():
    w = ObjectWriter(1 << 20)
    w.add_batch(1, 0, 2, b"a")
    with pytest.raises(ValueError, match="continue"):
        w.add_batch(1, 5, 1, b"b")
    w.add_batch(2, 0, 1, b"c")
    with pytest.raises(ValueError, match="contiguous"):
        w.add_batch(1, 2, 1, b"d")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d[:-1], "magic|inconsistent|footer"),
        (lambda d: d[:20], "shorter|magic"),
        (lambda d: d[:-8] + b"NOTMAGIC", "magic"),
        (
            lambda d: (
                d[: -FOOTER.size]
                + FOOTER.pack(
                    *(
                        [
                            *list(FOOTER.unpack(d[-FOOTER.size :]))[:3],
                            FORMAT_VERSION + 1,
                            *list(FOOTER.unpack(d[-FOOTER.size :]))[4:],
                        ]
                    )
                )
            ),
            "version",
        ),
        (lambda d: d[: -FOOTER.size - 5] + b"\xff" * 5 + d[-FOOTER.size :], "CRC"),
    ],
)
def test_damaged_objects_are_refused(damage, message):
    data = damage(build())
    with pytest.raises(ObjectFormatError, match=message):
        open_index(data)


def test_truncated_block_is_refused():
    block = struct.pack(">QII", 0, 1, 100) + b"x" * 10
    with pytest.raises(ObjectFormatError, match="overruns"):
        list(iter_block_batches(block))
    with pytest.raises(ObjectFormatError, match="truncated"):
        list(iter_block_batches(b"\x00" * 5))


def test_whole_object_iteration():
    from automq.broker.storage.objects.format import iter_object_batches

    data = build()
    got = [(s, b, c, bytes(p)) for s, b, c, p in iter_object_batches(data)]
    assert got == [(1, b, 3, bytes([b]) * 40) for b in range(0, 30, 3)] + [(5, 7, 1, b"x" * 10)]
    assert [b for _, b, _, _ in iter_object_batches(data, stream_id=5)] == [7]
    with pytest.raises(ObjectFormatError):
        list(iter_object_batches(data[:-3]))
