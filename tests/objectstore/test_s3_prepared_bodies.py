"""S3 request bodies of OFFLOOP_BODY_BYTES and more are hashed (SigV4 SHA-256, CRC32 checksum)
and copied in a thread, not on the event loop (broker/objectstore/s3.py, "request bodies
prepared off the event loop"). What is checked against the real SeaweedFS: the bytes arrive
whole, botocore computes neither hash itself for such a body, and the x-amz-content-sha256 and
x-amz-checksum-crc32 headers sent are those of the body. (SeaweedFS does not compare the
signed SHA-256 with the body, AWS S3 does: XAmzContentSHA256Mismatch; so the headers are read
off the request as it is sent.)"""

from __future__ import annotations

import base64
import hashlib
import os
import zlib

import botocore.auth
import botocore.httpchecksum
import pytest

from automq.broker.objectstore import open_object_store

pytestmark = pytest.mark.s3
MiB = 1 << 20


@pytest.fixture
def botocore_hashing(monkeypatch) -> dict[str, int]:
    """Counts botocore's own body SHA-256 (SigV4Auth.payload) and CRC32 computations."""
    calls = {"sha256": 0, "crc32": 0}
    payload, update = botocore.auth.SigV4Auth.payload, botocore.httpchecksum.Crc32Checksum.update

    def counted_payload(self, request):
        body = request.body
        small = body is None or (isinstance(body, bytes | bytearray) and len(body) < 64 * 1024)
        if not small:  # a body; bodiless and small XML requests (create, complete) do not count
            calls["sha256"] += 1
        return payload(self, request)

    def counted_update(self, chunk):
        calls["crc32"] += 1
        return update(self, chunk)

    monkeypatch.setattr(botocore.auth.SigV4Auth, "payload", counted_payload)
    monkeypatch.setattr(botocore.httpchecksum.Crc32Checksum, "update", counted_update)
    return calls


async def test_large_bodies_are_not_hashed_by_botocore_and_arrive_whole(s3_url, botocore_hashing):
    single = os.urandom(2 * MiB)
    parts = [os.urandom(5 * MiB), os.urandom(MiB)]
    async with open_object_store(s3_url + f"&part_size={5 * MiB}") as store:
        await store.put("single", memoryview(single))
        await store.put("conditional", single, if_none_match=True)
        await store.put_multipart("multi", parts)
        assert botocore_hashing == {"sha256": 0, "crc32": 0}
        assert await store.get("single") == single
        assert await store.get("conditional") == single
        assert await store.get("multi") == b"".join(parts)


async def test_small_bodies_keep_botocores_own_hashing(s3_url, botocore_hashing):
    async with open_object_store(s3_url) as store:
        await store.put("small", b"x" * 1000)
        assert await store.get("small") == b"x" * 1000
    assert botocore_hashing["sha256"] >= 1  # the hook counts: the test above is not vacuous


async def test_the_headers_sent_are_those_of_the_body(s3_url):
    data = os.urandom(MiB + 17)
    sent: dict[str, str] = {}

    def capture(request, **_):
        for name, value in request.headers.items():
            sent[name.lower()] = value.decode() if isinstance(value, bytes) else value

    async with open_object_store(s3_url) as store:
        client = await store._get_client()
        client.meta.events.register("before-send.s3.PutObject", capture)
        await store.put("checked", data)
        assert await store.get("checked") == data
    assert sent["x-amz-content-sha256"] == hashlib.sha256(data).hexdigest()
    assert base64.b64decode(sent["x-amz-checksum-crc32"]) == zlib.crc32(data).to_bytes(4, "big")
