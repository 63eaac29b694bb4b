"""A start-up check of an object store URL: fail in seconds with one line that names the setting
and the cause, instead of a process that waits 30 s and then says "no active controller".

`check_object_store(url)` parses the URL (scheme, bucket, parameters), then proves the store
works the way the system will use it: one conditional create of a small probe object (so the
endpoint is reachable, the credentials are valid, the bucket exists and is writable, and
conditional writes are supported) and its deletion. It uses one attempt with a short timeout,
not the store's normal retries, so a wrong endpoint answers in about `timeout_s` at worst.
Nothing is created on local disk for an s3:// URL; for file:// the directory is created if
its parent allows (that is what the store does on first use anyway).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from urllib.parse import urlsplit

from automq.broker.objectstore.base import (
    AccessDenied,
    BucketNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    PreconditionFailed,
)

PROBE_PREFIX = ".automq-probe/"


class ObjectStoreCheckError(Exception):
    """The object store a setting names cannot be used; the message is one line for a user.
    `transient`: the store did not answer (it may be starting, or the network may be down),
    as opposed to an answer that says the setting is wrong (no bucket, denied, malformed)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def _redact(url: str) -> str:
    """The URL as shown in messages (a URL carries no secrets today; keep userinfo out anyway)."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        return parts._replace(netloc=parts.hostname or "").geturl()
    return url


def open_for_check(url: str, timeout_s: float) -> ObjectStore:
    """The store a URL names, set to one attempt with a short timeout (ValueError: bad URL)."""
    scheme = urlsplit(url).scheme
    if scheme == "s3":
        from automq.broker.objectstore.s3 import S3ObjectStore, parse_s3_url

        settings = dataclasses.replace(parse_s3_url(url), max_attempts=1, timeout_ms=max(1, int(timeout_s * 1000)))
        return S3ObjectStore(settings, url)
    if scheme == "file":
        from automq.broker.objectstore.local import LocalObjectStore

        return LocalObjectStore.from_url(url)
    raise ValueError(f"object store URL {url!r}: scheme must be s3:// or file://")


def check_object_store_url(url: str, *, setting: str = "object_store_url") -> None:
    """Only the URL's syntax (no network): raise ObjectStoreCheckError naming `setting`."""
    try:
        open_for_check(url, 1.0)
    except ValueError as exc:
        raise ObjectStoreCheckError(f"{setting}: {exc}") from None


async def check_object_store(url: str, *, setting: str = "object_store_url", timeout_s: float = 5.0) -> None:
    """Raise ObjectStoreCheckError naming `setting` and the cause unless `url` is usable."""
    shown = _redact(url)
    try:
        store = open_for_check(url, timeout_s)
    except ValueError as exc:
        raise ObjectStoreCheckError(f"{setting}: {exc}") from None
    key = f"{PROBE_PREFIX}{secrets.token_hex(8)}"
    try:
        await asyncio.wait_for(_probe(store, key), timeout_s)
    except TimeoutError:
        raise ObjectStoreCheckError(
            f"{setting}: {shown} did not answer within {timeout_s:g}s (is the endpoint right and reachable?)",
            transient=True,
        ) from None
    except BucketNotFound as exc:
        raise ObjectStoreCheckError(f"{setting}: the bucket of {shown} does not exist ({exc})") from None
    except AccessDenied as exc:
        raise ObjectStoreCheckError(
            f"{setting}: access to {shown} denied; check the credentials "
            f"(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the AWS config) and that they may write ({exc})"
        ) from None
    except PreconditionFailed:
        raise ObjectStoreCheckError(
            f"{setting}: {shown} refused a conditional create of a new key; the store must support "
            "If-None-Match writes (the metadata log depends on them)"
        ) from None
    except ObjectStoreUnavailable as exc:
        raise ObjectStoreCheckError(f"{setting}: {shown} is unreachable ({exc})", transient=True) from None
    except (ObjectStoreError, OSError) as exc:
        raise ObjectStoreCheckError(f"{setting}: {shown} cannot be written ({type(exc).__name__}: {exc})") from None
    finally:
        try:
            await store.close()
        except Exception:
            pass


async def _probe(store: ObjectStore, key: str) -> None:
    await store.put(key, b"automq start-up check\n", if_none_match=True)
    await store.delete(key)
