"""The S3 backend (`s3://bucket?endpoint=...&region=...&path_style=true`), on aiobotocore.

Owns: URL parsing, one lazily created aiobotocore client per store, mapping S3 errors to
the `base` error classes, retries with exponential backoff and jitter, ranged reads,
multipart uploads and batched deletes.

Credentials come from the standard AWS chain (environment, config files, instance roles);
they never appear in the URL.

Retries and conditional writes: a conditional PUT can come back 412 because *our own*
earlier attempt succeeded and only its reply was lost. Such retries also happen below us:
aiohttp silently re-sends an idempotent request (PUT counts as one) when the connection
drops before the reply. So on every 412 of a conditional PUT the current ETag is compared
with the MD5 of our data: equal means the object holds exactly our bytes, which for
conditional writers (the controller's log) is the same as having won.

Server support for conditional writes (measured against SeaweedFS 4.48, `weed mini`, with
`benchmarks/objectstore_bench.py --race 100`): both If-None-Match: * and If-Match are
applied atomically (100 rounds of 16 racing writers with distinct payloads: always exactly
one winner). An S3 server without them cannot be made safe from the client side (a HEAD
followed by a PUT has the same race), so none is emulated here.

A store's client belongs to the event loop that first used it; use one store per loop.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import contextvars
import hashlib
import io
import os
import random
import re
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from automq.broker.objectstore.base import (
    AccessDenied,
    BucketNotFound,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreStats,
    ObjectStoreUnavailable,
    PreconditionFailed,
    PutResult,
    iterate_parts,
    validate_key,
    validate_range,
)
from automq.broker.objectstore.http_get import HttpGetPool

T = TypeVar("T")

# --- request bodies prepared off the event loop --------------------------------------------
#
# For every PUT and UploadPart body botocore does, on the calling (event loop) thread: a SHA-256
# of the whole body for the SigV4 signature (over http://; over https:// with a checksum it
# sends UNSIGNED-PAYLOAD), a CRC32 of it for the x-amz-checksum-crc32 header, and (aiohttp) a
# copy of it when it takes the buffer of a BytesIO that shares a bytes object. py-spy of a
# broker uploading to SeaweedFS at 10 MiB/s (benchmarks/kafka_bench.py --seaweedfs) saw the loop
# busy for up to ~670 ms in a row on that, and produce p99 at 190-380 ms. Bodies of
# OFFLOOP_BODY_BYTES and more are prepared in a thread instead (hashlib and zlib let go of the
# GIL on large buffers): the headers botocore would have computed are passed in, and the signer
# takes the SHA-256 from `_PREPARED` when the request's body is the prepared one.
OFFLOOP_BODY_BYTES = 256 << 10


@dataclass(frozen=True)
class _PreparedBody:
    stream: io.BytesIO  # owns its buffer: aiohttp's getbuffer() of it copies nothing
    sha256: str
    crc32: str  # base64 of the big-endian CRC32, as x-amz-checksum-crc32 carries it

    @classmethod
    def of(cls, data: bytes | bytearray | memoryview) -> _PreparedBody:
        stream = io.BytesIO()
        stream.write(data)
        stream.seek(0)
        crc = zlib.crc32(data).to_bytes(4, "big")
        return cls(stream, hashlib.sha256(data).hexdigest(), base64.b64encode(crc).decode("ascii"))

    def params(self) -> dict[str, Any]:
        """Body and checksum parameters of one attempt (each attempt sends from the start)."""
        self.stream.seek(0)
        return {"Body": self.stream, "ChecksumAlgorithm": "CRC32", "ChecksumCRC32": self.crc32}


_PREPARED: contextvars.ContextVar[_PreparedBody | None] = contextvars.ContextVar("automq_s3_prepared", default=None)
_SIGNER = "automq-s3v4"


def _register_signer() -> None:
    """S3's SigV4 signer, except that the SHA-256 of a prepared body is the one computed in
    the thread (where botocore would hash the body itself, on the loop)."""
    import botocore.auth

    if _SIGNER in botocore.auth.AUTH_TYPE_MAPS:
        return

    class PreparedBodyS3SigV4Auth(botocore.auth.S3SigV4Auth):
        def payload(self, request: Any) -> str:
            prepared = _PREPARED.get()
            if (
                prepared is not None
                and request.body is prepared.stream
                and not self._is_streaming_checksum_payload(request)
                and self._should_sha256_sign_payload(request)
            ):
                return prepared.sha256
            return super().payload(request)

    botocore.auth.AUTH_TYPE_MAPS[_SIGNER] = PreparedBodyS3SigV4Auth


def _choose_signer(signature_version: Any = None, **_: Any) -> str | None:
    return _SIGNER if signature_version == "s3v4" else None  # presigned URLs ("s3v4-query") as they were


def _cut_parts(pieces: list[bytes | memoryview], size: int) -> tuple[list[memoryview], bytes]:
    """In a thread: `pieces` joined and cut into parts of `size` bytes, and what is left."""
    whole = b"".join(pieces)
    cut = len(whole) - len(whole) % size
    view = memoryview(whole)
    return [view[i : i + size] for i in range(0, cut, size)], whole[cut:]


async def _prepare_body(data: bytes | bytearray | memoryview) -> tuple[_PreparedBody | None, bytes | bytearray]:
    """A PUT's or UploadPart's body: prepared in a thread from OFFLOOP_BODY_BYTES on (then the
    second item is unused), else as botocore takes it (bytes, not a memoryview)."""
    if memoryview(data).nbytes >= OFFLOOP_BODY_BYTES:
        return await asyncio.to_thread(_PreparedBody.of, data), b""
    return None, bytes(data) if isinstance(data, memoryview) else data


async def _send(
    prepared: _PreparedBody | None, body: bytes | bytearray, call: Callable[..., Awaitable[T]], **params: Any
) -> T:
    """One attempt of `call` (a client's put_object or upload_part) with the body."""
    if prepared is None:
        return await call(**params, Body=body)
    token = _PREPARED.set(prepared)
    try:
        return await call(**params, **prepared.params())
    finally:
        _PREPARED.reset(token)


MIN_PART_SIZE = 5 << 20
MAX_DELETE_BATCH = 1000
_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
_DENIED_CODES = {
    "AccessDenied",
    "403",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "AllAccessDisabled",
    "AccountProblem",
    "Forbidden",
}
# Transient by nature, or (BadDigest, IncompleteBody, XAmzContentSHA256Mismatch) the body was
# damaged in transit, which a resend fixes.
_RETRY_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "RequestLimitExceeded",
    "TooManyRequests",
    "BandwidthLimitExceeded",
    "OperationAborted",
    "BadDigest",
    "IncompleteBody",
    "XAmzContentSHA256Mismatch",
}
_PRECONDITION_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412"}
PRESIGN_EXPIRES_S = 900  # a presigned GET URL's lifetime ...
PRESIGN_REUSE_S = 300  # ... and how long one is used (well inside it, and inside short-lived credentials' refresh)


@dataclass(frozen=True, slots=True)
class S3Settings:
    """The parameters of an `s3://bucket?...` URL; the comment on each line is its meaning in
    docs/configuration.md."""

    bucket: str  # the bucket (the URL's host part); one per cluster, no key prefix
    endpoint: str | None = None  # http(s):// URL of the S3 server; unset: AWS's endpoint for the region
    region: str = "us-east-1"  # region the requests are signed for
    path_style: bool = False  # true: http://host/bucket/key (SeaweedFS, MinIO); false: bucket.host
    max_attempts: int = 5  # tries per request (network errors, timeouts, 5xx, throttling) before the error surfaces
    timeout_ms: int = 30_000  # a request's read timeout (connecting: at most 10 s)
    backoff_ms: int = 100  # the first retry waits 50-100 % of this, doubling per retry
    max_backoff_ms: int = 5_000  # the doubling stops here
    multipart_threshold: int = 16 << 20  # objects from this size are uploaded in parts
    part_size: int = 8 << 20  # size of an upload part (at least 5 MiB, S3's minimum)
    max_connections: int = 32  # HTTP connections to the server, reads and writes together
    upload_concurrency: int = 4  # parts of one upload in flight at once
    read_part_size: int = 4 << 20  # a catch-up read longer than 1.5 of these is read as ranged GETs of this size
    read_concurrency: int = 8  # those ranged GETs in flight at once over the store (never more than max_connections)


_INT_PARAMS = {
    "max_attempts": 1,
    "timeout_ms": 1,
    "backoff_ms": 0,
    "max_backoff_ms": 0,
    "multipart_threshold": MIN_PART_SIZE,
    "part_size": MIN_PART_SIZE,
    "max_connections": 1,
    "upload_concurrency": 1,
    "read_part_size": 64 << 10,
    "read_concurrency": 1,
}


def parse_s3_url(url: str) -> S3Settings:
    """Settings from `s3://bucket?endpoint=...&region=...&path_style=true&max_attempts=5&...`.

    Raises ValueError naming the problem (missing bucket, unknown or malformed parameter)."""
    parts = urlsplit(url)
    if parts.scheme != "s3":
        raise ValueError(f"S3 object store URL {url!r}: scheme must be s3://")
    bucket = parts.netloc
    if not bucket:
        raise ValueError(f"S3 object store URL {url!r}: missing bucket (s3://<bucket>?endpoint=...)")
    if (
        not (3 <= len(bucket) <= 63)
        or not all(c.islower() or c.isdigit() or c in ".-" for c in bucket)
        or not bucket[0].isalnum()
        or not bucket[-1].isalnum()
    ):
        raise ValueError(
            f"S3 object store URL {url!r}: {bucket!r} is not a valid bucket name "
            "(3-63 lowercase letters, digits, '.', '-')"
        )
    if parts.path not in ("", "/"):
        raise ValueError(
            f"S3 object store URL {url!r}: a key prefix in the path is not supported; use a bucket per cluster"
        )
    values: dict[str, Any] = {"bucket": bucket}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in values:
            raise ValueError(f"S3 object store URL {url!r}: parameter {name!r} given twice")
        if name == "endpoint":
            endpoint = urlsplit(value)
            if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
                raise ValueError(f"S3 object store URL {url!r}: endpoint must be an http(s):// URL, got {value!r}")
            values[name] = value.rstrip("/")
        elif name == "region":
            if not value:
                raise ValueError(f"S3 object store URL {url!r}: region must not be empty")
            values[name] = value
        elif name == "path_style":
            if value not in ("true", "false"):
                raise ValueError(f"S3 object store URL {url!r}: path_style must be true or false, got {value!r}")
            values[name] = value == "true"
        elif name in _INT_PARAMS:
            try:
                number = int(value)
            except ValueError:
                raise ValueError(f"S3 object store URL {url!r}: {name} must be an integer, got {value!r}") from None
            if number < _INT_PARAMS[name]:
                raise ValueError(f"S3 object store URL {url!r}: {name} must be >= {_INT_PARAMS[name]}, got {number}")
            values[name] = number
        else:
            known = ", ".join(["endpoint", "region", "path_style", *_INT_PARAMS])
            raise ValueError(f"S3 object store URL {url!r}: unknown parameter {name!r} (known: {known})")
    return S3Settings(**values)


def _strip_etag(etag: str) -> str:
    return etag.strip('"')


def _object_size(headers: dict[str, str]) -> int:
    """The whole object's size from a GET reply's headers: Content-Range's total
    ("bytes a-b/size"), or Content-Length when the server sent the whole object."""
    total = headers.get("content-range", "").rpartition("/")[2]
    return int(total) if total.isdigit() else int(headers["content-length"])


def _reply_error(status: int, body: bytes) -> Exception:
    """A non-2xx reply of the raw GET path as the ClientError botocore would have raised,
    so `_translate` maps it like every other request's."""
    from botocore.exceptions import ClientError

    text = body.decode("utf-8", "replace")
    code = re.search(r"<Code>(.*?)</Code>", text)
    message = re.search(r"<Message>(.*?)</Message>", text)
    response: Any = {
        "Error": {"Code": code.group(1) if code else str(status), "Message": message.group(1) if message else ""},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "GetObject")


async def _settle(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel what is still running and wait until all of it has stopped, even when the
    caller is cancelled meanwhile (re-raised after): a part must not write into a buffer
    its caller already has back."""
    for task in tasks:
        task.cancel()
    cancelled = False
    while not all(t.done() for t in tasks):
        try:
            await asyncio.wait([t for t in tasks if not t.done()])
        except asyncio.CancelledError:
            cancelled = True
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: the first one was raised already, if any
    if cancelled:
        raise asyncio.CancelledError


class _RangeNotSatisfiable(ObjectNotFound):
    """416 InvalidRange: the range starts past the end (or the object is empty)."""


class _Retryable(Exception):
    """An attempt failed in a way worth retrying (network, timeout, throttling, 5xx)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class S3ObjectStore(ObjectStore):
    reads_into_buffers = True

    def __init__(self, settings: S3Settings, url: str | None = None) -> None:
        self.settings = settings
        self.url = url or f"s3://{settings.bucket}"
        self.stats = ObjectStoreStats()
        self._client: Any = None
        self._client_lock: asyncio.Lock | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._pools: dict[str, HttpGetPool] = {}  # the raw GET path's connections, per origin
        self._presigned: dict[str, tuple[str, float]] = {}  # key -> (GET URL, reuse until)

    @classmethod
    def from_url(cls, url: str) -> S3ObjectStore:
        return cls(parse_s3_url(url), url)

    # -- client and error handling ------------------------------------------------------------

    async def _get_client(self) -> Any:
        """The client for the running event loop. A store used from a new loop (asyncio.run
        per Spark task, pytest's per-test loops) gets a new client; the old one is closed if
        its loop still runs, else dropped (its sockets died with that loop)."""
        loop = asyncio.get_running_loop()
        if self._client is not None and self._client_loop is loop:
            return self._client
        if self._client_loop is not loop:
            self._abandon_client()
            self._client_lock = asyncio.Lock()
            self._client_loop = loop
        assert self._client_lock is not None
        async with self._client_lock:
            if self._client is None:
                from aiobotocore.config import AioConfig
                from aiobotocore.session import get_session

                s = self.settings
                config = AioConfig(
                    region_name=s.region,
                    connect_timeout=min(s.timeout_ms, 10_000) / 1000,
                    read_timeout=s.timeout_ms / 1000,
                    retries={"total_max_attempts": 1, "mode": "standard"},  # we retry ourselves
                    s3={"addressing_style": "path" if s.path_style else "auto"},
                    max_pool_connections=s.max_connections,
                    signature_version="s3v4",  # presigned URLs too (botocore would sign them with v2)
                )
                stack = contextlib.AsyncExitStack()
                self._client = await stack.enter_async_context(
                    get_session().create_client("s3", endpoint_url=s.endpoint, config=config)
                )
                _register_signer()
                self._client.meta.events.register("choose-signer.s3", _choose_signer)
                self._exit_stack = stack
        return self._client

    def _abandon_client(self) -> None:
        stack, old_loop = self._exit_stack, self._client_loop
        self._exit_stack, self._client = None, None
        if stack is None or old_loop is None:
            return
        if not old_loop.is_closed() and old_loop.is_running():
            asyncio.run_coroutine_threadsafe(stack.aclose(), old_loop)
        # else: the loop is gone and took the connections with it; nothing left to close.

    async def close(self) -> None:
        if self._slots_loop is asyncio.get_running_loop():
            self._close_pools()
        if self._client_loop is not None and self._client_loop is not asyncio.get_running_loop():
            self._abandon_client()
            return
        stack, self._exit_stack, self._client = self._exit_stack, None, None
        if stack is not None:
            await stack.aclose()

    def _count_error(self, exc: BaseException) -> None:
        name = "ObjectNotFound" if isinstance(exc, _RangeNotSatisfiable) else type(exc).__name__
        self.stats.errors[name] = self.stats.errors.get(name, 0) + 1

    def _translate(self, exc: BaseException, op: str, key: str | None) -> BaseException:
        """A final (non-retried) error as a base-module error, or _Retryable."""
        import aiohttp
        import botocore.exceptions as bce

        where = f"{op} s3://{self.settings.bucket}/{key or ''}"
        if isinstance(exc, bce.ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            message = f"{where}: {code or status} {error.get('Message', '')}".rstrip()
            if code in _PRECONDITION_CODES or status == 412:
                return PreconditionFailed(message, key=key)
            if code == "NoSuchBucket":
                return BucketNotFound(message, key=key)
            if code == "InvalidRange" or status == 416:
                return _RangeNotSatisfiable(message, key=key)
            if code in _NOT_FOUND_CODES or status == 404:
                return ObjectNotFound(message, key=key)
            if code in _DENIED_CODES or status == 403:
                return AccessDenied(message, key=key)
            if code in _RETRY_CODES or status in (429, 500, 502, 503, 504) or status >= 500:
                return _Retryable(ObjectStoreUnavailable(message, key=key))
            return ObjectStoreError(message, key=key)
        if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError)):
            return AccessDenied(
                f"{where}: no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY", key=key
            )
        if isinstance(exc, (bce.EndpointConnectionError, bce.ConnectTimeoutError)):
            return _Retryable(ObjectStoreUnavailable(f"{where}: {exc}", key=key))
        if isinstance(
            exc,
            (
                bce.ConnectionError,
                bce.HTTPClientError,
                bce.IncompleteReadError,
                aiohttp.ClientError,
                TimeoutError,
                OSError,
            ),
        ):
            return _Retryable(ObjectStoreUnavailable(f"{where}: {type(exc).__name__}: {exc}", key=key))
        return exc

    async def _call(
        self,
        op: str,
        key: str | None,
        attempt: Callable[[Any], Awaitable[T]],
        on_precondition: Callable[[], Awaitable[T | None]] | None = None,
    ) -> T:
        """Run `attempt(client)` with retries; map errors. `on_precondition` may turn a 412
        into success (see the module docstring)."""
        s = self.settings
        last: _Retryable | None = None
        for number in range(s.max_attempts):
            if number:
                self.stats.retries += 1
                ceiling = min(s.max_backoff_ms, s.backoff_ms * (2 ** (number - 1)))
                await asyncio.sleep((ceiling / 2 + random.uniform(0, ceiling / 2)) / 1000)
            try:
                client = await self._get_client()
                return await attempt(client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                mapped = exc if isinstance(exc, ObjectStoreError) else self._translate(exc, op, key)
                if isinstance(mapped, _Retryable):
                    last = mapped
                    continue
                if isinstance(mapped, PreconditionFailed) and on_precondition:
                    won = await on_precondition()
                    if won is not None:
                        return won
                self._count_error(mapped)
                if mapped is exc:
                    raise
                raise mapped from exc
        assert last is not None
        final = ObjectStoreUnavailable(f"{last.cause} (gave up after {s.max_attempts} attempts)", key=key)
        self._count_error(final)
        raise final from last.cause

    # -- writing ------------------------------------------------------------------------------

    async def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> PutResult:
        validate_key(key)
        if if_none_match and if_match is not None:
            raise ValueError("put: if_none_match and if_match are mutually exclusive")
        size = memoryview(data).nbytes
        if not (if_none_match or if_match is not None) and size > self.settings.multipart_threshold:
            view = memoryview(data).cast("B")
            step = self.settings.part_size
            return await self.put_multipart(key, [view[i : i + step] for i in range(0, size, step)])
        return await self._put_single(key, data, if_none_match=if_none_match, if_match=if_match)

    async def _put_single(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> PutResult:
        size = memoryview(data).nbytes
        conditional = if_none_match or if_match is not None
        prepared, body = await _prepare_body(data)
        params: dict[str, Any] = {"Bucket": self.settings.bucket, "Key": key}
        if if_none_match:
            params["IfNoneMatch"] = "*"
        if if_match is not None:
            params["IfMatch"] = f'"{_strip_etag(if_match)}"'

        async def attempt(client: Any) -> PutResult:
            response = await _send(prepared, body, client.put_object, **params)
            return PutResult(key=key, etag=_strip_etag(response["ETag"]), size=size)

        async def maybe_ours() -> PutResult | None:
            ours = await asyncio.to_thread(lambda: hashlib.md5(data, usedforsecurity=False).hexdigest())
            try:
                info = await self.head(key)
            except ObjectNotFound:
                return None
            return PutResult(key=key, etag=info.etag, size=size) if info.etag == ours else None

        try:
            result = await self._call("put", key, attempt, maybe_ours if conditional else None)
        except ObjectNotFound as exc:
            if if_match is None:
                raise
            # AWS answers If-Match on a missing key with 404; for the caller it is a lost race.
            raise PreconditionFailed(f"object {key!r} does not exist (If-Match {if_match})", key=key) from exc
        self.stats.puts += 1
        self.stats.bytes_put += size
        return result

    async def put_multipart(
        self, key: str, parts: AsyncIterator[bytes | memoryview] | list[bytes | memoryview]
    ) -> PutResult:
        """Parts are re-buffered into uploads of exactly `part_size` bytes (the last may be
        shorter), so callers may pass chunks of any size; up to `upload_concurrency` parts are
        in flight at once. A total below `part_size` becomes a single PUT. On any failure
        (or cancellation) the multipart upload is aborted, so nothing becomes visible."""
        validate_key(key)
        bucket, part_size = self.settings.bucket, self.settings.part_size
        pending: list[bytes | memoryview] = []  # pieces not yet cut into parts
        pending_bytes = 0
        upload_id: str | None = None
        completed: list[dict[str, Any]] = []
        in_flight: set[asyncio.Task[None]] = set()
        total = 0
        numbered = 0  # parts started; a part's number is its place in the stream

        async def upload_part(number: int, chunk: bytes | memoryview) -> None:
            prepared, body = await _prepare_body(chunk)
            response = await self._call(
                "upload_part",
                key,
                lambda c: _send(
                    prepared, body, c.upload_part, Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number
                ),
            )
            completed.append({"PartNumber": number, "ETag": response["ETag"]})

        async def start_part(chunk: bytes | memoryview) -> None:
            nonlocal upload_id, numbered
            if upload_id is None:
                created = await self._call(
                    "create_multipart_upload", key, lambda c: c.create_multipart_upload(Bucket=bucket, Key=key)
                )
                upload_id = created["UploadId"]
            numbered += 1
            in_flight.add(asyncio.create_task(upload_part(numbered, chunk)))
            if len(in_flight) >= self.settings.upload_concurrency:
                done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    in_flight.discard(task)
                    task.result()  # raises the part's error

        try:
            # The pieces are cut into parts in a thread (copies of megabytes, which held the
            # event loop for up to ~300 ms in a row on a 2-core VM); a piece that is a part
            # already goes as it is.
            async for part in iterate_parts(parts):
                total += len(part)
                if not pending and len(part) == part_size:
                    await start_part(part)
                    continue
                pending.append(part)
                pending_bytes += len(part)
                if pending_bytes >= part_size:
                    chunks, rest = await asyncio.to_thread(_cut_parts, pending, part_size)
                    pending, pending_bytes = ([rest] if rest else []), len(rest)
                    for chunk in chunks:
                        await start_part(chunk)
            last = await asyncio.to_thread(b"".join, pending) if pending else b""
            if upload_id is None:
                return await self._put_single(key, last)
            if last:
                await start_part(last)
            while in_flight:
                task = in_flight.pop()
                await task
            completed.sort(key=lambda item: item["PartNumber"])
            response = await self._call(
                "complete_multipart_upload",
                key,
                lambda c: c.complete_multipart_upload(
                    Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": completed}
                ),
            )
        except BaseException:
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
            if upload_id is not None:
                await asyncio.shield(self._abort(key, upload_id))
            raise
        # A store that assembles the parts wrongly (SeaweedFS drops a part whose ETag does not
        # match, and still answers 200) must not let the caller believe the object is whole:
        # the uploader would commit it and trim the WAL.
        info = await self.head(key)
        if info.size != total:
            with contextlib.suppress(Exception):
                await self.delete(key)
            raise ObjectStoreError(
                f"multipart object {key!r} is {info.size} bytes after an upload of {total}: "
                "the store assembled it wrongly; deleted",
                key=key,
            )
        self.stats.puts += 1
        self.stats.bytes_put += total
        return PutResult(key=key, etag=_strip_etag(response["ETag"]), size=total)

    async def _abort(self, key: str, upload_id: str) -> None:
        """Best effort: an upload left behind only costs storage until a bucket lifecycle rule."""
        with contextlib.suppress(Exception):
            await self._call(
                "abort_multipart_upload",
                key,
                lambda c: c.abort_multipart_upload(Bucket=self.settings.bucket, Key=key, UploadId=upload_id),
            )

    # -- reading ------------------------------------------------------------------------------

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        validate_key(key)
        validate_range(start, end)
        if end is not None and end == start:
            # S3 cannot express an empty range; check existence and the start rule instead.
            info = await self.head(key)
            if start > 0 and start >= info.size:
                raise ObjectNotFound(f"range start {start} is past the end of {key!r} ({info.size} bytes)", key=key)
            return b""
        params: dict[str, Any] = {"Bucket": self.settings.bucket, "Key": key}
        if start or end is not None:
            params["Range"] = f"bytes={start}-{'' if end is None else end - 1}"

        async def attempt(client: Any) -> bytes:
            response = await client.get_object(**params)
            async with response["Body"] as body:
                return await body.read()

        try:
            data = await self._call("get", key, attempt)
        except _RangeNotSatisfiable as exc:
            await self._empty_or_raise(key, start, exc)
            data = b""
        self.stats.gets += 1
        self.stats.bytes_got += len(data)
        return data

    async def _empty_or_raise(self, key: str, start: int, exc: _RangeNotSatisfiable) -> None:
        """A 416: past the end (ObjectNotFound), unless the range starts at 0 of an empty
        object, which S3 answers 416 too while the contract says it reads b""."""
        if start != 0:
            raise ObjectNotFound(str(exc), key=key) from None
        info = await self.head(key)
        if info.size != 0:
            raise ObjectNotFound(str(exc), key=key) from None
        self.stats.errors["ObjectNotFound"] -= 1  # not an error after all

    def _read_slots(self) -> asyncio.Semaphore:
        """The GETs of `get_into` in flight at once, over the whole store (per event loop, like
        the client), so reads leave connections to writes."""
        loop = asyncio.get_running_loop()
        if self._slots_loop is not loop:
            self._slots = asyncio.Semaphore(min(self.settings.read_concurrency, self.settings.max_connections))
            self._slots_loop = loop
            self._close_pools()  # their connections belonged to the old loop
        assert self._slots is not None
        return self._slots

    async def _presigned_get(self, client: Any, key: str) -> str:
        """A presigned GET URL of `key`, signed once per PRESIGN_REUSE_S (signing costs as
        much Python as the rest of a GET); headers such as Range are not part of it."""
        now = time.monotonic()
        cached = self._presigned.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        url = await client.generate_presigned_url(
            "get_object", Params={"Bucket": self.settings.bucket, "Key": key}, ExpiresIn=PRESIGN_EXPIRES_S
        )
        if len(self._presigned) >= 4096:
            self._presigned.clear()
        self._presigned[key] = (url, now + PRESIGN_REUSE_S)
        return url

    def _pool(self, origin: str) -> HttpGetPool:
        pool = self._pools.get(origin)
        if pool is None:
            context = None
            if origin.startswith("https:"):
                from botocore.httpsession import get_cert_path

                context = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True))
            pool = self._pools[origin] = HttpGetPool(origin, self.settings.read_concurrency, context)
        return pool

    def _close_pools(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    async def get_into(self, key: str, start: int, buffer: memoryview) -> int:
        """Ranged GETs straight into `buffer` (a catch-up's read-ahead group, up to 32 MiB).

        One GET from one connection delivers a few hundred MiB/s at best; several in parallel
        deliver more (measured against SeaweedFS: 2-8 ranges of 4-8 MiB at a time read 1.7-1.8x
        as fast as one 32 MiB GET). So a range longer than 1.5 `read_part_size` is read as
        parts of that size, at most `read_concurrency` GETs at once over the store. The first
        part's reply gives the object's size and ETag; the other parts start as soon as those
        headers arrive and ask for that ETag (If-Match), so one buffer never mixes two
        versions of a key. Every part is awaited before this returns or raises: no GET writes
        into the buffer after the caller has it back."""
        validate_key(key)
        n = len(buffer)
        if n == 0:
            await self.get(key, start, start)  # existence and the start rule
            return 0
        part = self.settings.read_part_size
        first_len = n if n <= part + part // 2 else part
        learned: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        tasks = [asyncio.ensure_future(self._get_part(key, start, buffer[:first_len], None, learned))]
        wanted: builtins.list[int] = []
        try:
            await asyncio.wait([tasks[0], learned], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
            if not learned.done():
                await tasks[0]  # failed before its headers: raises
            size, etag = learned.result()
            end = min(start + n, size)
            wanted.append(min(first_len, end - start))
            for offset in range(start + first_len, end, part):
                view = buffer[offset - start : min(offset + part, end) - start]
                wanted.append(len(view))
                tasks.append(asyncio.ensure_future(self._get_part(key, offset, view, etag, None)))
            # the first failure ends the wait at once (the parts still running are stopped below)
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in tasks:
                if task.done() and task.exception() is not None:
                    task.result()  # raises it
            got = [t.result() for t in tasks]
        except _RangeNotSatisfiable as exc:
            await self._empty_or_raise(key, start, exc)
            return 0
        except PreconditionFailed:
            raise ObjectStoreError(f"{key!r} was replaced while it was read in parts; read it again", key=key) from None
        finally:
            await _settle(tasks)
        if got != wanted:
            raise ObjectStoreUnavailable(f"short read of {key!r}: parts of {got} bytes, expected {wanted}", key=key)
        self.stats.gets += len(tasks)
        self.stats.bytes_got += end - start
        return end - start

    async def _get_part(
        self, key: str, offset: int, view: memoryview, if_match: str | None, learned: asyncio.Future | None
    ) -> int:
        """One ranged GET into `view` over the raw GET path (`http_get`: the body is received
        into `view` itself); the bytes it delivered. Sets `learned` to the object's (size,
        ETag) as soon as the reply's headers arrive."""
        headers = {"Range": f"bytes={offset}-{offset + len(view) - 1}"}
        if if_match is not None:
            headers["If-Match"] = f'"{if_match}"'

        def on_head(status: int, reply: dict[str, str]) -> None:
            if learned is not None and not learned.done() and 200 <= status < 300:
                learned.set_result((_object_size(reply), _strip_etag(reply.get("etag", ""))))

        async def attempt(client: Any) -> int:
            url = urlsplit(await self._presigned_get(client, key))
            pool = self._pool(f"{url.scheme}://{url.netloc}")
            async with asyncio.timeout(self.settings.timeout_ms / 1000):
                status, _reply, got, body = await pool.get(f"{url.path}?{url.query}", headers, view, on_head)
            if not 200 <= status < 300:
                if status == 403:  # e.g. signed with credentials that expired since: sign again next time
                    self._presigned.pop(key, None)
                raise _reply_error(status, body)
            return got

        async with self._read_slots():
            return await self._call("get", key, attempt)

    async def head(self, key: str) -> ObjectInfo:
        validate_key(key)

        async def attempt(client: Any) -> ObjectInfo:
            r = await client.head_object(Bucket=self.settings.bucket, Key=key)
            return ObjectInfo(
                key=key,
                size=r["ContentLength"],
                etag=_strip_etag(r["ETag"]),
                last_modified=r["LastModified"].timestamp(),
            )

        return await self._call("head", key, attempt)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Pages are fetched in full and sorted before anything is yielded: SeaweedFS (and
        other filer-backed servers) list depth-first by path segment, so "a/b" comes before
        "a-c", while the contract (and AWS) promise UTF-8 byte order."""
        if not isinstance(prefix, str) or "\x00" in prefix:
            raise ValueError(f"list prefix must be a str without NUL: {prefix!r}")
        items: list[ObjectInfo] = []
        token: str | None = None
        while True:
            params: dict[str, Any] = {"Bucket": self.settings.bucket, "Prefix": prefix, "MaxKeys": 1000}
            if token:
                params["ContinuationToken"] = token
            page = await self._call(
                "list",
                prefix or None,
                lambda c, p=params: c.list_objects_v2(**p),  # type: ignore[misc]
            )
            for item in page.get("Contents", []):
                items.append(
                    ObjectInfo(
                        key=item["Key"],
                        size=item["Size"],
                        etag=_strip_etag(item.get("ETag", "")),
                        last_modified=item["LastModified"].timestamp(),
                    )
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        items.sort(key=lambda info: info.key.encode("utf-8", "surrogatepass"))
        for info in items:
            yield info

    # -- deleting -----------------------------------------------------------------------------

    async def delete_many(self, keys: builtins.list[str]) -> None:
        if isinstance(keys, str):
            raise ValueError("delete_many takes a list of keys, not a str")
        keys = list(dict.fromkeys(keys))
        for key in keys:
            validate_key(key)
        failures: list[tuple[str, str, str]] = []
        for index in range(0, len(keys), MAX_DELETE_BATCH):
            batch = keys[index : index + MAX_DELETE_BATCH]
            request = {"Objects": [{"Key": k} for k in batch], "Quiet": True}
            response = await self._call(
                "delete_many",
                batch[0],
                lambda c, r=request: c.delete_objects(Bucket=self.settings.bucket, Delete=r),  # type: ignore[misc]
            )
            for error in response.get("Errors", []):
                if error.get("Code") != "NoSuchKey":
                    failures.append((error.get("Key", "?"), error.get("Code", "?"), error.get("Message", "")))
        if failures:
            detail = "; ".join(f"{k}: {c} {m}".rstrip() for k, c, m in failures[:10])
            more = f" (and {len(failures) - 10} more)" if len(failures) > 10 else ""
            kind = AccessDenied if all(c in _DENIED_CODES for _, c, _ in failures) else ObjectStoreError
            error = kind(f"delete_many: {len(failures)} keys not deleted: {detail}{more}", key=failures[0][0])
            self._count_error(error)
            raise error


__all__ = ["S3ObjectStore", "S3Settings", "parse_s3_url"]
