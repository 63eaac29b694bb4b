"""S3-only multipart behaviour: parallel parts reassemble in order, failures abort the upload."""

from __future__ import annotations

import asyncio
import os
from urllib.parse import urlsplit

import pytest

from automq.broker.objectstore import ObjectStoreError, open_object_store

pytestmark = pytest.mark.s3
MiB = 1 << 20


def pending_uploads(seaweedfs, s3_url: str) -> list[str]:
    bucket = urlsplit(s3_url).netloc
    return [u["Key"] for u in seaweedfs.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


async def test_parallel_parts_reassemble_in_order(seaweedfs, s3_url):
    data = os.urandom(23 * MiB)
    chunks = [data[i : i + 3 * MiB] for i in range(0, len(data), 3 * MiB)]  # not aligned to parts
    async with open_object_store(s3_url + f"&part_size={5 * MiB}&upload_concurrency=3") as store:
        result = await store.put_multipart("big", chunks)
        assert result.etag.endswith("-5")  # 5 parts: 4 x 5 MiB + 3 MiB
        assert await store.get("big") == data
        whole = await store.put("whole", data)  # above multipart_threshold: multipart too
        assert whole.etag.endswith("-5")
        assert await store.get("whole", 5 * MiB - 1, 5 * MiB + 1) == data[5 * MiB - 1 : 5 * MiB + 1]
    assert pending_uploads(seaweedfs, s3_url) == []


async def test_failing_producer_aborts_the_upload(seaweedfs, s3_url):
    async def parts():
        for _ in range(3):
            yield os.urandom(5 * MiB)
        raise OSError("disk read failed")

    async with open_object_store(s3_url + f"&part_size={5 * MiB}") as store:
        with pytest.raises(OSError, match="disk read failed"):
            await store.put_multipart("never", parts())
        assert not await store.exists("never")
    assert pending_uploads(seaweedfs, s3_url) == []


async def test_parts_that_finish_out_of_order_keep_distinct_numbers(seaweedfs, s3_url):
    """Parts finish in a different order than they started. A part's number must not depend
    on how many have finished: counting finished plus in-flight parts gave two chunks the
    same number once a finished part was still counted as in flight, and SeaweedFS then
    assembled an object missing a part (shorter than written; reads past it got 416)."""
    data = os.urandom(12 * 5 * MiB + 123)
    # each part's upload is held back this long; the next chunk comes 0.02 s after the last,
    # as the uploader's pieces come from a worker thread
    delays = [0.0, 0.01, 0.0, 0.05, 0.01, 0.0, 0.06, 0.0, 0.01, 0.04, 0.0, 0.01, 0.0]

    async def chunks():
        for i in range(0, len(data), 5 * MiB):
            await asyncio.sleep(0.02)
            yield data[i : i + 5 * MiB]

    numbers: list[int] = []
    async with open_object_store(s3_url + f"&part_size={5 * MiB}&upload_concurrency=3") as store:
        call = store._call

        async def delayed(op, key, attempt, *args):
            if op != "upload_part":
                return await call(op, key, attempt, *args)

            async def slow(client):
                request = attempt(client)
                numbers.append(len(numbers))
                await asyncio.sleep(delays[len(numbers) - 1])
                return await request

            return await call(op, key, slow, *args)

        store._call = delayed
        result = await store.put_multipart("out-of-order", chunks())
        store._call = call
        assert len(numbers) == 13
        assert result.etag.endswith("-13") and result.size == len(data)
        assert await store.get("out-of-order") == data
    assert pending_uploads(seaweedfs, s3_url) == []


async def test_an_object_the_store_assembled_short_is_an_error_not_a_success(seaweedfs, s3_url):
    """The store is told to complete the upload without its last part, as SeaweedFS did when
    two parts had the same number: it answers 200 with a shorter object. put_multipart must
    fail (the uploader then retries under new object ids) and leave no short object behind."""
    data = os.urandom(3 * 5 * MiB + 7)
    async with open_object_store(s3_url + f"&part_size={5 * MiB}") as store:
        call = store._call

        class DropsLastPart:
            def __init__(self, client):
                self.client = client

            def complete_multipart_upload(self, **kwargs):
                parts = kwargs["MultipartUpload"]["Parts"]
                kwargs["MultipartUpload"] = {"Parts": parts[:-1]}
                return self.client.complete_multipart_upload(**kwargs)

        async def short(op, key, attempt, *args):
            if op == "complete_multipart_upload":
                return await call(op, key, lambda client: attempt(DropsLastPart(client)), *args)
            return await call(op, key, attempt, *args)

        store._call = short
        with pytest.raises(ObjectStoreError, match="assembled it wrongly"):
            await store.put_multipart("short", [data])
        store._call = call
        assert not await store.exists("short")
        assert (await store.put_multipart("whole", [data])).size == len(data)
        assert await store.get("whole") == data
    assert pending_uploads(seaweedfs, s3_url) == []
