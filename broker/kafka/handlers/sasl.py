"""SaslHandshake (v1) and SaslAuthenticate (v0-v2): SASL authentication on SASL_* listeners.

The handshake picks a mechanism from `security.sasl_enabled_mechanisms`; each
SaslAuthenticate carries one SASL token to the mechanism's server state machine
(`automq.broker.security`). Failure answers SASL_AUTHENTICATION_FAILED with the reason and
closes the connection after the response, like a Java broker. Success sets the
connection's principal (`User:<name>`); v1+ report the session lifetime
(`security.connections_max_reauth_ms`, shortened to an OAUTHBEARER token's expiry) and the
client re-authenticates before it ends (KIP-368). A re-authentication must keep the same
principal and mechanism. After SaslHandshake v0 (older librdkafka) the tokens come raw,
without a request header; the server reads them in `KafkaConnection._on_raw_token`.
"""

from __future__ import annotations

import datetime
import logging

from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec
from automq.broker.kafka.auth_session import SASL_AUTHENTICATE, SASL_HANDSHAKE
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.registry import handles
from automq.broker.security.scram import SaslAuthenticationError

log = logging.getLogger(__name__)


@handles(SASL_HANDSHAKE)
async def sasl_handshake(request, ctx: RequestContext):
    session = ctx.session
    mechanisms = ctx.broker.sasl.enabled if ctx.broker.sasl is not None else []
    if session is None or not session.sasl:
        return codec.build(ctx.response_class, error_code=ErrorCode.illegal_sasl_state, mechanisms=tuple(mechanisms))
    if request.mechanism not in mechanisms:
        log.info("closing %s: SASL mechanism %r is not enabled (%s)", ctx.peer, request.mechanism, mechanisms)
        session.close_after_response = True
        return codec.build(
            ctx.response_class, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=tuple(mechanisms)
        )
    if session.authenticated and session.mechanism != request.mechanism:
        session.close_after_response = True
        return codec.build(ctx.response_class, error_code=ErrorCode.illegal_sasl_state, mechanisms=tuple(mechanisms))
    assert ctx.broker.sasl is not None
    session.mechanism = request.mechanism
    session.server = ctx.broker.sasl.server(request.mechanism)
    session.raw_tokens = ctx.api_version == 0
    return codec.build(ctx.response_class, error_code=ErrorCode.none, mechanisms=tuple(mechanisms))


def _authenticate_response(
    ctx: RequestContext, error: ErrorCode, message: str | None, auth_bytes: bytes, lifetime_ms: int
):
    return codec.build(
        ctx.response_class,
        error_code=error,
        error_message=message,
        auth_bytes=auth_bytes,
        session_lifetime=datetime.timedelta(milliseconds=lifetime_ms),
    )


@handles(SASL_AUTHENTICATE)
async def sasl_authenticate(request, ctx: RequestContext):
    session = ctx.session
    server = session.server if session is not None else None
    if session is None or server is None:
        if session is not None:
            session.close_after_response = True
        return _authenticate_response(
            ctx, ErrorCode.illegal_sasl_state, "SaslAuthenticate before SaslHandshake", b"", 0
        )
    try:
        answer = server.step(bytes(request.auth_bytes))
    except SaslAuthenticationError as exc:
        session.server = None
        session.close_after_response = True
        ctx.broker.metrics.connections_closed.labels("sasl_authentication_failed").inc()
        log.info("SASL %s authentication from %s failed: %s", session.mechanism, ctx.peer, exc)
        return _authenticate_response(ctx, ErrorCode.sasl_authentication_failed, str(exc), b"", 0)
    if not server.complete:
        return _authenticate_response(ctx, ErrorCode.none, None, answer, 0)
    error, lifetime_ms = session.finish(server, ctx.broker.config.security.connections_max_reauth_ms)
    if error is not None:
        session.close_after_response = True
        return _authenticate_response(ctx, ErrorCode.sasl_authentication_failed, error, b"", 0)
    return _authenticate_response(ctx, ErrorCode.none, None, answer, lifetime_ms)
