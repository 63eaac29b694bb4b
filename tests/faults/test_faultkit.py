"""The fault proxy does what the fault tests rely on, checked through the project's own S3
backend (signed requests) against the shared SeaweedFS."""

from __future__ import annotations

import asyncio

import pytest
from faultkit import FaultProxy

from automq.broker.objectstore import ObjectStoreError, open_object_store


@pytest.fixture
def store_url(seaweedfs, healed: FaultProxy) -> str:
    # one attempt and a short timeout: the test sees each fault instead of the retries
    return healed.url_for(seaweedfs.create_bucket()) + "&max_attempts=1&timeout_ms=5000"


async def test_pass_through_throttle_drop_and_stall(store_url: str, healed: FaultProxy) -> None:
    store = open_object_store(store_url)
    try:
        await store.put("a", b"1")
        assert await store.get("a") == b"1"  # SigV4 still verifies through the proxy

        healed.throttle(1.0)
        with pytest.raises(ObjectStoreError):
            await store.put("b", b"2")
        assert healed.counts["throttled"] >= 1
        healed.heal()
        assert not await store.exists("b")  # a throttled request never reached the store

        healed.drop_replies(1.0)
        with pytest.raises(ObjectStoreError):
            await store.put("c", b"3")
        healed.heal()
        assert await store.get("c") == b"3"  # the write happened; only its reply was lost

        healed.stall()
        put = asyncio.ensure_future(store.put("d", b"4"))
        done, _ = await asyncio.wait({put}, timeout=1.0)
        assert not done, "a stalled store answered"
        healed.heal()
        await put
        assert await store.get("d") == b"4"
    finally:
        await store.close()
