"""Credentials of the controller's HTTP API: a shared token and/or TLS client certificates.

Every caller (brokers, the operator, CLIs, Spark jobs) sends `Authorization: Bearer <token>`,
the token read from `security.controller_token_file` (a mounted Secret on Kubernetes) or, for
processes that have no node config, from the file named by `AUTOMQ_CONTROLLER_TOKEN_FILE`.
When the controller serves TLS with client certificates requested, a client presenting a
certificate the CA verifies is authenticated too (mTLS). Paths in
`security.controller_open_paths` (/healthz, /readyz, /metrics by default) need nothing, so
probes and scrapes keep working; everything else answers 401 CONTROLLER_AUTHENTICATION_FAILED.

The token file is re-read when it changes, so a rotated Secret takes effect without a
restart (the previous token stays accepted for `PREVIOUS_TOKEN_GRACE_S`, so callers that have
not seen the new file yet are not locked out mid-rotation).
"""

from __future__ import annotations

import hmac
import logging
import os
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

from automq.broker.config import ConfigError, NodeConfig, TlsConfig
from automq.broker.security.tls import ReloadingContext, client_context, file_stamp

log = logging.getLogger(__name__)

TOKEN_FILE_ENV = "AUTOMQ_CONTROLLER_TOKEN_FILE"
CA_FILE_ENV = "AUTOMQ_CONTROLLER_CA_FILE"
PREVIOUS_TOKEN_GRACE_S = 300.0
CHECK_INTERVAL_S = 1.0  # at most one stat() of the token file per second


@dataclass
class TokenFile:
    path: str
    _token: str = field(init=False, default="")
    _previous: str = field(init=False, default="")
    _previous_until: float = field(init=False, default=0.0)
    _stamp: tuple[int, int] = field(init=False, default=(0, -1))
    _checked: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if not self._read():
            raise ConfigError(f"security.controller_token_file: {self.path} is missing or empty")

    def _read(self) -> bool:
        try:
            st = os.stat(self.path)
            token = Path(self.path).read_text().strip()
        except OSError:
            return False
        if not token:
            return False
        if self._token and token != self._token:
            self._previous, self._previous_until = self._token, time.monotonic() + PREVIOUS_TOKEN_GRACE_S
            log.info(
                "controller token file %s changed; the previous token stays valid for %.0fs",
                self.path,
                PREVIOUS_TOKEN_GRACE_S,
            )
        self._token, self._stamp = token, (st.st_mtime_ns, st.st_size)
        return True

    def current(self) -> str:
        now = time.monotonic()
        if now - self._checked >= CHECK_INTERVAL_S:
            self._checked = now
            try:
                st = os.stat(self.path)
                if (st.st_mtime_ns, st.st_size) != self._stamp:
                    self._read()  # a half-written or emptied file keeps the token we have
            except OSError:
                pass
        return self._token

    def accepts(self, presented: str) -> bool:
        current = self.current()
        if hmac.compare_digest(presented.encode(), current.encode()):
            return True
        return (
            bool(self._previous)
            and time.monotonic() < self._previous_until
            and hmac.compare_digest(presented.encode(), self._previous.encode())
        )


@dataclass
class ControllerClientAuth:
    """What a ControllerClient sends: the token (if any) and the TLS context for https URLs.

    `ca_file`: where the context's CAs came from; `check()` adds the certificates of a changed
    file to the context (a CA rotation puts the new CA next to the old one in the bundle before
    any controller presents a certificate it signed), so a long-running node follows it."""

    token: TokenFile | None = None
    ssl: ssl.SSLContext | None = None
    ca_file: str | None = None
    _ca_stamp: tuple[int, int] = field(init=False, default=(0, -1))
    _ca_checked: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._ca_stamp = file_stamp(self.ca_file)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token.current()}"} if self.token is not None else {}

    def check(self) -> None:
        if self.ca_file is None or self.ssl is None:
            return
        now = time.monotonic()
        if now - self._ca_checked < CHECK_INTERVAL_S:
            return
        self._ca_checked = now
        stamp = file_stamp(self.ca_file)
        if stamp == self._ca_stamp:
            return
        try:
            self.ssl.load_verify_locations(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:  # caught mid-write: the next check tries again
            log.warning("controller CA file %s could not be re-read: %s", self.ca_file, exc)
            return
        self._ca_stamp = stamp
        log.info("controller CA file %s re-read", self.ca_file)

    @classmethod
    def from_env(cls) -> ControllerClientAuth:
        token_path = os.environ.get(TOKEN_FILE_ENV)
        ca = os.environ.get(CA_FILE_ENV)
        return cls(
            TokenFile(token_path) if token_path else None,
            _ca_context(ca) if ca else None,
            ca or None,
        )

    @classmethod
    def from_config(cls, config: NodeConfig) -> ControllerClientAuth:
        """A node's own credentials; falls back to the environment for what the config lacks."""
        env = cls.from_env()
        security = config.security
        token = TokenFile(security.controller_token_file) if security.controller_token_file else env.token
        wants_tls = security.controller_tls or any(u.startswith("https://") for u in config.controller_urls)
        ca = security.controller_ca_file or config.tls.ca_file
        if not (wants_tls and ca):
            return cls(token, env.ssl, env.ca_file)
        try:
            context = client_context(config.tls.model_copy(update={"ca_file": ca}))
        except (OSError, ssl.SSLError) as exc:
            key = "security.controller_ca_file" if security.controller_ca_file else "tls.ca_file"
            raise ConfigError(f"{key}: cannot load {ca} to verify the controller's certificate: {exc}") from exc
        # Kafka's ssl.endpoint.identification.algorithm, as for calls to other brokers
        context.check_hostname = config.tls.endpoint_identification_algorithm == "https"
        return cls(token, context, ca)


def _ca_context(ca: str) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{CA_FILE_ENV}: cannot load {ca}: {exc}") from exc


@dataclass
class ControllerServerAuth:
    token: TokenFile | None
    open_paths: frozenset[str]
    accept_client_certificates: bool

    @classmethod
    def from_config(cls, config: NodeConfig) -> ControllerServerAuth | None:
        security = config.security
        token = TokenFile(security.controller_token_file) if security.controller_token_file else None
        mtls = security.controller_tls and config.tls.client_auth != "none"
        if token is None and not mtls:
            return None
        return cls(token, frozenset(security.controller_open_paths), mtls)

    def refusal(self, path: str, authorization: str | None, peer_certificate: object) -> str | None:
        """None when the call may go on, else why not (for the 401 body; no secret in it)."""
        if path in self.open_paths:
            return None
        if self.accept_client_certificates and peer_certificate:
            return None  # the TLS layer verified it against tls.ca_file
        if self.token is not None and authorization:
            scheme, _, presented = authorization.partition(" ")
            if scheme.lower() == "bearer" and self.token.accepts(presented.strip()):
                return None
            return "the bearer token is not valid"
        if self.token is not None:
            return "an Authorization: Bearer token (security.controller_token_file) is required"
        return "a client certificate signed by tls.ca_file is required"


def server_tls(tls: TlsConfig) -> ReloadingContext:
    """The controller's https context. Client certificates are at most requested, never
    required by the handshake, so kubelet probes reach the open paths; the middleware decides."""
    relaxed = tls.model_copy(update={"client_auth": "requested" if tls.client_auth != "none" else "none"})
    return ReloadingContext(relaxed)
