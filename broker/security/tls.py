"""TLS contexts built from the `tls` config section, and their reloading.

A server context is created once per process and handed to every TLS listener (and to the
controller's HTTP server). Rotation needs no restart: `ReloadingContext.check()` re-reads the
certificate, key and CA files when their modification time or size changes and loads them
into the same `ssl.SSLContext`; OpenSSL copies the context's certificate into each new
connection, so new handshakes present the new certificate and established ones are untouched.
A half-written file (a rotation caught mid-copy) fails to load: the old certificate stays and
the next check tries again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
from asyncio import sslproto
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from automq.broker.config import ConfigError, TlsConfig

log = logging.getLogger(__name__)


def _send_handshake_alerts() -> None:
    """asyncio drops a connection whose TLS handshake failed without sending the alert OpenSSL
    queued for the peer, so a client refused for its certificate (TLS 1.3: after its own side
    of the handshake is done) sees only "connection reset" instead of "certificate required" or
    "unknown ca". Flushing that alert first is what a Java broker's clients get."""
    protocol = getattr(sslproto, "SSLProtocol", None)
    complete = getattr(protocol, "_on_handshake_complete", None)
    if complete is None or getattr(complete, "_sends_alert", False):
        return  # another Python's internals: keep its behaviour

    def on_handshake_complete(self: Any, handshake_exc: BaseException | None) -> None:
        if handshake_exc is not None:
            with contextlib.suppress(Exception):
                self._process_outgoing()
        complete(self, handshake_exc)

    on_handshake_complete._sends_alert = True  # type: ignore[attr-defined]
    protocol._on_handshake_complete = on_handshake_complete  # type: ignore[union-attr]


_send_handshake_alerts()

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def file_stamp(path: str | None) -> tuple[int, int]:
    """(modification time, size) of a file a node re-reads when it changes; (0, -1) for a
    missing file (or none)."""
    if path is None:
        return (0, -1)
    try:
        st = os.stat(path)
    except OSError:
        return (0, -1)
    return (st.st_mtime_ns, st.st_size)


def _stamp(paths: list[str]) -> tuple[tuple[int, int], ...]:
    return tuple(file_stamp(p) for p in paths)


def _read_password(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"tls.key_password_file: cannot read {path}: {exc.strerror}") from exc


@dataclass
class ReloadingContext:
    """An `ssl.SSLContext` plus the files it was loaded from."""

    tls: TlsConfig
    server_side: bool = True
    context: ssl.SSLContext = field(init=False)
    _stamp: tuple[tuple[int, int], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        purpose = ssl.Purpose.CLIENT_AUTH if self.server_side else ssl.Purpose.SERVER_AUTH
        ctx = ssl.create_default_context(purpose)
        ctx.minimum_version = _VERSIONS[self.tls.min_version]
        if self.tls.ciphers:
            try:
                ctx.set_ciphers(self.tls.ciphers)
            except ssl.SSLError as exc:
                raise ConfigError(f"tls.ciphers: no cipher matches {self.tls.ciphers!r} ({exc.reason})") from exc
        if self.server_side:
            ctx.verify_mode = _CLIENT_AUTH[self.tls.client_auth]
        self.context = ctx
        try:
            self._load()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls: cannot load {self._describe()}: {exc}") from exc

    def _paths(self) -> list[str]:
        return [p for p in (self.tls.cert_file, self.tls.key_file, self.tls.ca_file) if p]

    def _describe(self) -> str:
        return ", ".join(
            f"{k}={v}"
            for k, v in (
                ("cert_file", self.tls.cert_file),
                ("key_file", self.tls.key_file),
                ("ca_file", self.tls.ca_file),
            )
            if v
        )

    def _load(self) -> None:
        stamp = _stamp(self._paths())
        if self.tls.cert_file:
            self.context.load_cert_chain(
                self.tls.cert_file, self.tls.key_file, password=_read_password(self.tls.key_password_file)
            )
        if self.tls.ca_file:
            self.context.load_verify_locations(cafile=self.tls.ca_file)
        self._stamp = stamp

    def check(self) -> bool:
        """Reload when a file changed; True if a new certificate was loaded. A load that fails
        keeps the previous certificate (logged) and is retried on the next check."""
        if _stamp(self._paths()) == self._stamp:
            return False
        try:
            self._load()
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "tls: changed files could not be loaded (%s); still serving the previous certificate: %s",
                self._describe(),
                exc,
            )
            return False
        log.info("tls: reloaded %s", self._describe())
        return True


def client_context(tls: TlsConfig) -> ssl.SSLContext:
    """For a node calling another node (broker -> controller): verifies the server against
    tls.ca_file (or the system store) and presents this node's certificate when it has one."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    ctx.minimum_version = _VERSIONS[tls.min_version]
    if tls.cert_file and tls.key_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file, password=_read_password(tls.key_password_file))
    return ctx
