"""A stalled object store (issue 17 item 2), in process: heartbeats are answered from memory
while a metadata-log write hangs, nobody is fenced for it, and readiness/metrics say why."""

from __future__ import annotations

import asyncio

from automq.broker.controller.controller import Controller
from automq.broker.controller.protocol import Endpoint
from automq.broker.objectstore import open_object_store


def exported(c: Controller) -> str:
    from prometheus_client import generate_latest

    return generate_latest(c.registry).decode()


async def test_heartbeats_answer_and_nobody_is_fenced_while_a_log_write_hangs(file_url: str) -> None:
    store = open_object_store(file_url)
    stalled = asyncio.Event()
    release = asyncio.Event()
    real_put = store.put

    async def put(*args, **kwargs):
        if stalled.is_set():
            await release.wait()
        return await real_put(*args, **kwargs)

    store.put = put  # type: ignore[method-assign]
    c = Controller(store, controller_id=0, url="http://c", cluster_id="t", session_timeout_ms=1_000)
    await c.start()
    try:
        await c.wait_leader(10)
        epoch = await c.register_broker(1, [Endpoint("PLAINTEXT", "h", 1)], None)
        stalled.set()
        # an idle leader writes a heartbeat entry every renew interval: that write now hangs
        for _ in range(30):  # 3 s: three session timeouts
            assert await asyncio.wait_for(c.heartbeat(1, epoch), 1) == "active"
            await asyncio.sleep(0.1)
        reason = c.unready_reason()
        assert reason is not None and "stalled" in reason, reason
        assert "automq_controller_object_store_stalled 1.0" in exported(c)
        release.set()
        stalled.clear()
        for _ in range(15):  # queued work (a fence, if one had been decided) goes through now
            await c.heartbeat(1, epoch)
            await asyncio.sleep(0.1)
        assert c.state.brokers[1].state == "active"
        assert c.metrics.brokers_fenced._value.get() == 0
        assert c.unready_reason() is None
        assert "automq_controller_object_store_stalled 0.0" in exported(c)
    finally:
        release.set()
        await c.stop()
        await store.close()


async def test_a_broker_that_stops_heartbeating_is_still_fenced(file_url: str) -> None:
    store = open_object_store(file_url)
    c = Controller(store, controller_id=0, url="http://c", cluster_id="t", session_timeout_ms=500)
    await c.start()
    try:
        await c.wait_leader(10)
        await c.register_broker(1, [Endpoint("PLAINTEXT", "h", 1)], None)
        for _ in range(100):
            if c.state.brokers[1].state == "fenced":
                break
            await asyncio.sleep(0.05)
        assert c.state.brokers[1].state == "fenced"
    finally:
        await c.stop()
        await store.close()


async def test_a_store_that_refuses_writes_makes_the_controller_unready_with_the_reason(file_url: str) -> None:
    """Issue 17 item 8: /readyz must not stay 200 while the controller cannot write."""
    from automq.broker.objectstore import ObjectStoreUnavailable

    store = open_object_store(file_url)
    failing = asyncio.Event()
    real_put = store.put

    async def put(key, *args, **kwargs):
        if failing.is_set():
            raise ObjectStoreUnavailable("503 SlowDown (test)", key=key)
        return await real_put(key, *args, **kwargs)

    store.put = put  # type: ignore[method-assign]
    c = Controller(store, controller_id=0, url="http://c", cluster_id="t", session_timeout_ms=10_000)
    await c.start()
    try:
        await c.wait_leader(10)
        assert c.unready_reason() is None
        failing.set()
        reason = None
        for _ in range(100):  # the idle leader's next log entry fails within a renew interval
            reason = c.unready_reason()
            if reason is not None and "failing" in reason:
                break
            await asyncio.sleep(0.05)
        assert reason is not None and "SlowDown" in reason and "failing" in reason, reason
        await asyncio.sleep(1.0)  # reads still work; it stays unready while writes fail
        assert not c.ready and "failing" in (c.unready_reason() or "")
        failing.clear()
        await c.wait_leader(10)
        for _ in range(100):
            if c.ready:
                break
            await asyncio.sleep(0.05)
        assert c.ready, c.unready_reason()
    finally:
        await c.stop()
        await store.close()
