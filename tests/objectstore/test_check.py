"""The start-up check of an object store URL: one line naming the setting and the cause, in
seconds, against a real SeaweedFS; and `automq local up` refusing a bad store before it
creates anything on disk."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from automq.broker import local
from automq.broker.objectstore import open_object_store
from automq.broker.objectstore.check import (
    PROBE_PREFIX,
    ObjectStoreCheckError,
    check_object_store,
    check_object_store_url,
)


async def test_a_usable_store_passes_and_leaves_no_probe_behind(s3_url, file_url):
    for url in (s3_url, file_url):
        await check_object_store(url)
        store = open_object_store(url)
        try:
            assert [o async for o in store.list(PROBE_PREFIX)] == []
        finally:
            await store.close()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("s3://", "missing bucket"),
        ("s3://Bad_Bucket?endpoint=http://127.0.0.1:1", "not a valid bucket name"),
        ("s3://bucket?endpoint=notaurl", "endpoint must be an http(s):// URL"),
        ("s3://bucket?nope=1", "unknown parameter 'nope'"),
        ("file://relative/path", "host must be empty"),
        ("file:///", "absolute directory path other than /"),
        ("ftp://host/x", "scheme must be s3:// or file://"),
    ],
)
def test_malformed_urls_name_the_setting(url, needle):
    with pytest.raises(ObjectStoreCheckError) as err:
        check_object_store_url(url, setting="--object-store")
    assert str(err.value).startswith("--object-store: ") and needle in str(err.value)


async def test_missing_bucket(seaweedfs):
    url = seaweedfs.url_for("automq-no-such-bucket")
    with pytest.raises(ObjectStoreCheckError, match=r"the bucket of .* does not exist"):
        await check_object_store(url)


async def test_wrong_credentials(s3_url, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(ObjectStoreCheckError, match="access to .* denied; check the credentials"):
        await check_object_store(s3_url)


async def test_unreachable_endpoint_fails_within_the_timeout():
    url = f"s3://bucket?endpoint=http://127.0.0.1:{local.free_port()}&path_style=true"
    with pytest.raises(ObjectStoreCheckError, match="unreachable|did not answer"):
        await check_object_store(url, setting="object_store_url", timeout_s=2.0)


@pytest.mark.parametrize("fault", ["missing bucket", "wrong credentials", "unreachable endpoint"])
def test_local_up_refuses_a_bad_store_and_creates_nothing(seaweedfs, s3_url, tmp_path, fault):
    data_dir = tmp_path / "never-made"
    env = dict(os.environ)
    if fault == "missing bucket":
        url, message = seaweedfs.url_for("automq-missing-bucket"), "does not exist"
    elif fault == "wrong credentials":
        url, message = s3_url, "denied; check the credentials"
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    else:
        url = f"s3://bucket?endpoint=http://127.0.0.1:{local.free_port()}&path_style=true"
        message = "unreachable"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "automq.broker.cli",
            "local",
            "up",
            "--data-dir",
            str(data_dir),
            "--port",
            str(local.free_port_block(1)),
            "--object-store",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--object-store: " in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not data_dir.exists()


def test_a_process_with_a_malformed_store_url_exits_2_naming_the_key(tmp_path):
    config = tmp_path / "controller.yaml"
    config.write_text("node_id: 0\nobject_store_url: s3://?endpoint=http://127.0.0.1:1\n")
    result = subprocess.run(
        [sys.executable, "-m", "automq.broker.cli", "controller", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "object_store_url: S3 object store URL" in result.stderr and "missing bucket" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("fault", ["missing bucket", "wrong credentials"])
def test_a_process_whose_store_refuses_it_exits_2(seaweedfs, s3_url, tmp_path, fault):
    """`automq controller` started directly (a container, a pod) fails as `local up` does when
    the store answers that the setting is wrong, instead of retrying for ever."""
    env = dict(os.environ)
    if fault == "missing bucket":
        url, message = seaweedfs.url_for("automq-missing-bucket"), "does not exist"
    else:
        url, message = s3_url, "denied; check the credentials"
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    config = tmp_path / "controller.yaml"
    config.write_text(f"node_id: 0\ndata_dir: {tmp_path / 'data'}\nhttp_port: 0\nobject_store_url: '{url}'\n")
    result = subprocess.run(
        [sys.executable, "-m", "automq.broker.cli", "controller", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "object_store_url: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_store_that_does_not_answer_yet_is_transient():
    import asyncio

    url = f"s3://bucket?endpoint=http://127.0.0.1:{local.free_port()}&path_style=true"
    with pytest.raises(ObjectStoreCheckError) as err:
        asyncio.run(check_object_store(url, timeout_s=2.0))
    assert err.value.transient
