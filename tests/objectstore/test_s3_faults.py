"""The S3 backend under failure: server down and back, bad credentials, missing bucket,
unreachable endpoint, and a reply lost after a conditional write took effect."""

from __future__ import annotations

import asyncio
import socket

import pytest
from http_relay import relay as relay_to
from http_relay import slow_down

from automq.broker.objectstore import (
    AccessDenied,
    BucketNotFound,
    ObjectStoreError,
    ObjectStoreUnavailable,
    PreconditionFailed,
    open_object_store,
)

pytestmark = pytest.mark.s3

FAST_FAIL = "&max_attempts=3&backoff_ms=20&timeout_ms=3000"


async def test_server_stopped_mid_test_fails_then_recovers(seaweedfs, s3_url):
    async with open_object_store(s3_url + FAST_FAIL) as store:
        await store.put("before", b"survives restarts")
        seaweedfs.stop()
        try:
            with pytest.raises(ObjectStoreUnavailable):
                await store.put("during", b"x")
            with pytest.raises(ObjectStoreUnavailable):
                await store.get("before")
            with pytest.raises(ObjectStoreUnavailable):
                [info async for info in store.list()]
            assert store.stats.retries >= 6  # every attempt beyond the first of each call
        finally:
            seaweedfs.start()
        assert await store.get("before") == b"survives restarts"
        await store.put("after", b"y")
        assert [info.key async for info in store.list()] == ["after", "before"]


@pytest.mark.parametrize(
    "variable, value", [("AWS_SECRET_ACCESS_KEY", "wrong-secret"), ("AWS_ACCESS_KEY_ID", "unknown-key")]
)
async def test_wrong_credentials_are_access_denied(s3_url, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    async with open_object_store(s3_url) as store:
        with pytest.raises(AccessDenied):
            await store.put("k", b"x")
        with pytest.raises(AccessDenied):
            await store.get("k")
        with pytest.raises(AccessDenied):
            [info async for info in store.list()]
        assert store.stats.retries == 0  # not worth retrying


async def test_no_credentials_at_all_is_access_denied(s3_url, monkeypatch, tmp_path):
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    async with open_object_store(s3_url) as store:
        with pytest.raises(AccessDenied, match="credentials"):
            await store.put("k", b"x")


async def test_missing_bucket_is_bucket_not_found(seaweedfs):
    async with open_object_store(seaweedfs.url_for("no-such-bucket-here")) as store:
        with pytest.raises(BucketNotFound):
            await store.put("k", b"x")
        with pytest.raises(BucketNotFound):
            await store.get("k")
        with pytest.raises(BucketNotFound):
            [info async for info in store.list()]
    # and it was not created behind our back
    names = [b["Name"] for b in seaweedfs.client().list_buckets().get("Buckets", [])]
    assert "no-such-bucket-here" not in names


async def test_unreachable_endpoint_is_unavailable_after_bounded_retries():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    url = f"s3://some-bucket?endpoint=http://127.0.0.1:{port}&region=us-east-1&path_style=true" + FAST_FAIL
    async with open_object_store(url) as store:
        with pytest.raises(ObjectStoreUnavailable, match="3 attempts"):
            await store.get("k")
        assert store.stats.retries == 2


async def test_conditional_put_whose_reply_was_lost_still_reports_the_win(seaweedfs, s3_url):
    """A proxy forwards the first PUT to the server, then drops the connection instead of
    relaying the 200. The retry (ours or aiohttp's own) meets 412 from our own object; the
    store must see that the object is ours."""
    target_port = int(seaweedfs.endpoint.rsplit(":", 1)[1])
    dropped = asyncio.Event()

    def lose_the_first_200(data: bytes) -> bool:
        if not dropped.is_set() and data.startswith(b"HTTP/1.1 200"):
            dropped.set()
            return True
        return False

    async def relay(reader, writer):
        try:
            await relay_to(reader, writer, target_port, drop_reply=lose_the_first_200)
        except asyncio.CancelledError:
            pass  # the proxy is closing

    proxy = await asyncio.start_server(relay, "127.0.0.1", 0)
    proxy_port = proxy.sockets[0].getsockname()[1]
    url = s3_url.replace(seaweedfs.endpoint, f"http://127.0.0.1:{proxy_port}") + FAST_FAIL
    try:
        async with open_object_store(url) as store:
            result = await store.put("metadata/log/00000001", b"entry-1", if_none_match=True)
            assert dropped.is_set(), "the proxy never dropped a reply; the test proved nothing"
            assert await store.get("metadata/log/00000001") == b"entry-1"
            assert result.size == 7
            # Someone else's bytes at the key are still a lost race.
            with pytest.raises(PreconditionFailed):
                await store.put("metadata/log/00000001", b"entry-1-other", if_none_match=True)
    finally:
        proxy.close()
        await proxy.wait_closed()


async def test_hung_server_times_out_as_unavailable_then_recovers(seaweedfs, s3_url):
    async with open_object_store(s3_url + "&max_attempts=2&backoff_ms=10&timeout_ms=500") as store:
        await store.put("k", b"v")
        seaweedfs.freeze()
        try:
            with pytest.raises(ObjectStoreUnavailable, match="2 attempts"):
                await store.get("k")
        finally:
            seaweedfs.thaw()
        assert await store.get("k") == b"v"


def throttling_proxy(target_port: int, failures: int):
    """A TCP proxy in front of the real server that answers the first `failures` requests
    itself with 503 SlowDown (what S3 sends when throttling) and relays the rest."""
    state = {"refused": 0}

    async def relay(reader, writer):
        try:
            if state["refused"] < failures:
                state["refused"] += 1
                await reader.read(65536)
                await slow_down(writer)
                return
            await relay_to(reader, writer, target_port)
        except (asyncio.CancelledError, ConnectionError):
            pass

    return state, relay


@pytest.mark.parametrize("failures, succeeds", [(2, True), (10, False)])
async def test_throttling_is_retried_with_backoff_then_unavailable(seaweedfs, s3_url, failures, succeeds):
    target_port = int(seaweedfs.endpoint.rsplit(":", 1)[1])
    state, relay = throttling_proxy(target_port, failures)
    proxy = await asyncio.start_server(relay, "127.0.0.1", 0)
    url = s3_url.replace(seaweedfs.endpoint, f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}")
    try:
        async with open_object_store(url + "&max_attempts=4&backoff_ms=10") as store:
            if succeeds:
                await store.put("k", b"v")
                assert store.stats.retries == failures
                assert await store.get("k") == b"v"
            else:
                with pytest.raises(ObjectStoreUnavailable, match="SlowDown"):
                    await store.put("k", b"v")
                assert store.stats.retries == 3
                assert state["refused"] == 4
    finally:
        proxy.close()
        await proxy.wait_closed()


def delete_result_proxy(target_port: int, errors: list[tuple[str, str]]):
    """Relays to the real server, but answers DeleteObjects itself with per-key errors."""
    entries = "".join(
        f"<Error><Key>{key}</Key><Code>{code}</Code><Message>refused</Message></Error>" for key, code in errors
    )
    body = (
        '<?xml version="1.0" encoding="UTF-8"?><DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"{entries}</DeleteResult>"
    ).encode()

    async def relay(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"POST ") and b"?delete" in head.split(b"\r\n", 1)[0]:
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nConnection: close\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
                writer.close()
                return
            await relay_to(reader, writer, target_port, head)
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass

    return relay


@pytest.mark.parametrize(
    "errors, expected",
    [
        ([("a", "AccessDenied"), ("gone", "NoSuchKey")], AccessDenied),
        ([("a", "InternalError"), ("b", "AccessDenied")], ObjectStoreError),
        ([("gone", "NoSuchKey")], None),
    ],
)
async def test_delete_many_reports_per_key_errors(seaweedfs, s3_url, errors, expected):
    target_port = int(seaweedfs.endpoint.rsplit(":", 1)[1])
    proxy = await asyncio.start_server(delete_result_proxy(target_port, errors), "127.0.0.1", 0)
    url = s3_url.replace(seaweedfs.endpoint, f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}")
    try:
        async with open_object_store(url) as store:
            if expected is None:
                await store.delete_many(["a", "gone"])  # a missing key is not an error
                return
            with pytest.raises(expected) as failed:
                await store.delete_many(["a", "b", "gone"])
            assert type(failed.value) is expected and failed.value.key == "a"
            failing = [key for key, code in errors if code != "NoSuchKey"]
            assert f"{len(failing)} keys not deleted" in str(failed.value)
            assert "gone" not in str(failed.value)
    finally:
        proxy.close()
        await proxy.wait_closed()
