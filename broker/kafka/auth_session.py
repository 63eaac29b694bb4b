"""Who a connection is: its listener, client address, principal, and its SASL state.

One `ConnectionSession` per connection on a TLS or SASL listener (a PLAINTEXT listener's
connections carry none: their principal is User:ANONYMOUS and nothing is checked, so the
plaintext path costs one attribute test). The SASL handlers (`handlers/sasl.py`) drive it;
the server asks `refusal(api_key)` before a request reaches its handler:

- on a SASL listener, before authentication only ApiVersions, SaslHandshake and (after a
  handshake) SaslAuthenticate are served; anything else closes the connection, as a Java
  broker does (it never reads such a request as Kafka);
- once the session has expired (connections.max.reauth.ms, or an OAUTHBEARER token's exp),
  a request other than a re-authentication closes the connection (KIP-368).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from automq.broker.security.principal import ANONYMOUS
from automq.broker.security.sasl import MechanismServer

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
API_VERSIONS = 18


@dataclass(slots=True)
class ConnectionSession:
    listener: str
    security_protocol: str
    client_host: str
    principal: str = ANONYMOUS
    sasl: bool = False  # the listener requires SASL
    authenticated: bool = False
    mechanism: str | None = None  # chosen by the last SaslHandshake
    server: MechanismServer | None = field(default=None, repr=False)  # the authentication in progress
    expires_at: float | None = None  # monotonic deadline of the session; None: never
    close_after_response: bool = False  # a handler decided the connection ends after its answer
    # after a SaslHandshake v0 the client sends raw SASL tokens (size-prefixed, no request
    # header) until the mechanism completes; the server answers them the same way
    raw_tokens: bool = False
    token_authenticated: bool = False  # logged in with a delegation token (may not create or renew tokens)

    def finish(self, server: MechanismServer, reauth_ms: int) -> tuple[str | None, int]:
        """The mechanism completed: (error, session lifetime ms). As Kafka: a session ends
        only when connections_max_reauth_ms is set, and then no later than the credential
        (an OAUTHBEARER token) expires; a re-authentication must keep the principal."""
        self.server = None
        principal = f"User:{server.username}"
        if self.authenticated and principal != self.principal:
            return f"re-authentication as {principal} on a connection of {self.principal} is not allowed", 0
        lifetime_ms = reauth_ms
        expiry_ms = getattr(server, "expiry_ms", None)
        if lifetime_ms and expiry_ms is not None:
            lifetime_ms = min(lifetime_ms, max(expiry_ms - int(time.time() * 1000), 1))
        self.principal = principal
        self.authenticated = True
        self.token_authenticated = bool(getattr(server, "token_authenticated", False))
        self.expires_at = time.monotonic() + lifetime_ms / 1000.0 if lifetime_ms else None
        return None, lifetime_ms

    def refusal(self, api_key: int) -> str | None:
        """Why this request may not be served on this connection now (None: serve it)."""
        if not self.sasl:
            return None
        if api_key in (API_VERSIONS, SASL_HANDSHAKE):
            return None
        if self.raw_tokens:
            return "a Kafka request while raw SASL tokens were expected (SaslHandshake v0)"
        if api_key == SASL_AUTHENTICATE:
            return None if self.server is not None else "SaslAuthenticate without a SaslHandshake before it"
        if not self.authenticated:
            return f"api key {api_key} before SASL authentication completed"
        if self.expires_at is not None and time.monotonic() >= self.expires_at:
            return "SASL session expired without re-authentication (connections_max_reauth_ms / token expiry)"
        return None
