"""The project's one small Kafka client connection, over the kio codec.

Used where the product itself speaks Kafka to a broker: transaction markers sent to other
brokers (`transactions/markers.py`) and the balancer / admin CLIs (`balancer/kafka_admin.py`).
One request in flight per connection (these callers send few requests; simplicity beats
pipelining here). The connection is opened on the first call: TCP, then TLS when the
security protocol has it (trust store and hostname check from `ClientSecurity`), then SASL
(SaslHandshake v1 + SaslAuthenticate v2: PLAIN or SCRAM, whose server signature is checked,
so a stranger cannot pass as the broker). When the broker gives the session a lifetime
(KIP-368) the connection is re-opened, and so re-authenticated, before it ends. Any
failure closes the connection; the next call opens a new one.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import time
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.config import ConfigError
from automq.broker.kafka import codec
from automq.broker.security.client import PLAINTEXT, ClientSecurity
from automq.broker.security.scram import SaslAuthenticationError, ScramClient

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
REAUTH_FRACTION = 0.85  # re-open a SASL connection when this much of its session lifetime is gone


class KafkaClientError(Exception):
    """A call failed: a connection / authentication problem, or (code set) a Kafka error code."""

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class BrokerConnection:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str,
        security: ClientSecurity = PLAINTEXT,
        timeout_s: float = 30.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.host, self.port = host, port
        self.address = f"{host}:{port}"
        self.client_id = client_id
        self.security = security
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self._lock = asyncio.Lock()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation = 0
        self._reauth_at: float | None = None

    @property
    def connected(self) -> bool:
        return self._writer is not None

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ConnectionError, ssl.SSLError):
                pass

    async def call(self, request: Any) -> Any:
        """Send one kio request and return its decoded response (KafkaClientError on failure)."""
        async with self._lock:
            try:
                return await asyncio.wait_for(self._call(request), self.timeout_s)
            except TimeoutError:
                await self.close()
                raise KafkaClientError(f"{self.address}: no answer within {self.timeout_s:g}s") from None
            except KafkaClientError:
                await self.close()
                raise
            except SaslAuthenticationError as exc:
                await self.close()
                raise KafkaClientError(f"{self.address}: {exc}", ErrorCode.sasl_authentication_failed) from None
            except ssl.SSLError as exc:
                await self.close()
                raise KafkaClientError(f"{self.address}: TLS: {exc.reason or exc}") from None
            except ConfigError as exc:  # credentials file unreadable or malformed
                await self.close()
                raise KafkaClientError(str(exc)) from None
            except (OSError, ConnectionError, asyncio.IncompleteReadError) as exc:
                await self.close()
                raise KafkaClientError(f"{self.address}: {type(exc).__name__}: {exc}") from None
            except BaseException:
                await self.close()
                raise

    async def _call(self, request: Any) -> Any:
        if self._writer is not None and self._reauth_at is not None and time.monotonic() >= self._reauth_at:
            await self.close()
        if self._writer is None:
            await self._open()
        return await self._roundtrip(request)

    async def _roundtrip(self, request: Any) -> Any:
        reader, writer = self._reader, self._writer
        assert reader is not None and writer is not None
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        frame = codec.encode_request(self._correlation, request, client_id=self.client_id)
        writer.write(_SIZE.pack(len(frame)) + frame)
        await writer.drain()
        (size,) = _SIZE.unpack(await reader.readexactly(4))
        if not 0 <= size <= self.max_response_bytes:
            raise ConnectionError(f"response size {size} out of range")
        correlation, response = codec.decode_response(await reader.readexactly(size), type(request))
        if correlation != self._correlation:
            raise ConnectionError(f"correlation id {correlation}, expected {self._correlation}")
        return response

    async def _open(self) -> None:
        security = self.security
        context = security.ssl_context() if security.tls and security.ssl_context is not None else None
        if security.tls and context is None:
            context = ssl.create_default_context()
        self._reader, self._writer = await asyncio.open_connection(
            self.host, self.port, ssl=context, server_hostname=self.host if context is not None else None
        )
        self._reauth_at = None
        if security.sasl:
            await self._authenticate()

    async def _authenticate(self) -> None:
        from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
        from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

        security = self.security
        mechanism = security.sasl_mechanism or "PLAIN"
        if security.credentials is None:
            raise KafkaClientError(f"{self.address}: SASL needs credentials", ErrorCode.sasl_authentication_failed)
        user, password = security.credentials()
        handshake = await self._roundtrip(SaslHandshakeRequest(mechanism=mechanism))
        if handshake.error_code != ErrorCode.none:
            raise KafkaClientError(
                f"{self.address}: SASL mechanism {mechanism} refused ({handshake.error_code.name}); "
                f"the broker offers {list(handshake.mechanisms)}",
                handshake.error_code,
            )

        async def step(token: bytes) -> Any:
            answer = await self._roundtrip(SaslAuthenticateRequest(auth_bytes=token))
            if answer.error_code != ErrorCode.none:
                raise KafkaClientError(
                    f"{self.address}: SASL {mechanism} as {user!r} failed: "
                    f"{answer.error_message or answer.error_code.name}",
                    answer.error_code,
                )
            return answer

        if mechanism == "PLAIN":
            last = await step(b"\0" + user.encode() + b"\0" + password.encode())
        else:
            scram = ScramClient(
                mechanism, user, password, extensions=(("tokenauth", "true"),) if security.token_auth else ()
            )
            first = await step(scram.first())
            last = await step(scram.final(first.auth_bytes))
            scram.verify(last.auth_bytes)
        lifetime_ms = last.session_lifetime.total_seconds() * 1000 if last.session_lifetime else 0
        if lifetime_ms > 0:
            self._reauth_at = time.monotonic() + lifetime_ms * REAUTH_FRACTION / 1000
