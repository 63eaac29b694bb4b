"""The durable share-partition state object: format, conditional writes, keys."""

from __future__ import annotations

import pytest

from automq.broker.kafka.share.state_store import (
    ShareStateFormatError,
    ShareStateSnapshot,
    ShareStateStore,
    decode,
    encode,
    state_key,
)
from automq.broker.objectstore import PreconditionFailed, open_object_store
from automq.broker.objectstore.base import validate_key


def test_round_trip_and_corruption_is_refused():
    s = ShareStateSnapshot("g", 7, 100, [(100, 104, 0, 2), (105, 105, 2, 1), (106, 110, 4, 5)], 3, 9, 1234)
    data = encode(s)
    assert decode(data) == s
    for bad in (data[:-1], data[:4] + b"\x00\x09" + data[6:], b"XXXX" + data[4:], data[:-3] + b"\x00\x00\x01"):
        with pytest.raises(ShareStateFormatError):
            decode(bad)


def test_keys_are_portable_for_any_group_id():
    for group in ("g", "a/b/../c", "ünïcode", "x" * 5000, " "):
        validate_key(state_key(group, 42))
        assert state_key(group, 42).endswith("/42")
    assert state_key("a", 1) != state_key("b", 1)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store_url(request, tmp_path):
    if request.param == "file":
        return f"file://{tmp_path}"
    return request.getfixturevalue("s3_url")


async def test_conditional_writes_fence_a_second_writer(store_url):
    """On both backends (the local store and real S3: SeaweedFS)."""
    objects = open_object_store(store_url)
    try:
        await _fence(ShareStateStore(objects))
    finally:
        await objects.close()


async def _fence(store: ShareStateStore) -> None:
    s = ShareStateSnapshot("g", 1, 0, [], 1, 1)
    etag = await store.write(s, None)
    with pytest.raises(PreconditionFailed):
        await store.write(s, None)  # the first write of a second leader
    loaded, etag2 = await store.load("g", 1)
    assert loaded.leader_epoch == 1 and etag2 == etag
    s.write_seq, s.leader_epoch = 2, 2
    await store.write(s, etag2)  # the new leader's claim
    s.write_seq = 3
    with pytest.raises(PreconditionFailed):
        await store.write(s, etag)  # the old leader's next write loses
    assert await store.streams_of_group("g") == [1]
    await store.delete("g", 1)
    assert await store.load("g", 1) is None
