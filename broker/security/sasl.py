"""SASL mechanisms offered by SASL_* listeners, and PLAIN.

`SaslMechanisms` is built once per broker from the `security` section; `server(name)` gives a
fresh server-side state machine for one authentication (`step(bytes) -> bytes`, `complete`,
`username`, optional `expiry_ms`). Where credentials come from:
- PLAIN: `security.sasl_plain_users_file` (YAML `{user: password}`, re-read when it changes),
  or else the SCRAM credentials in the controller (the password is checked by deriving the
  stored key with the user's salt), so one user store serves both;
- SCRAM-SHA-256/512: the controller's metadata (AlterUserScramCredentials), passed in as a
  lookup function;
- OAUTHBEARER: a JWT validator (oauthbearer.py).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import yaml

from automq.broker.config import ConfigError, SecurityConfig
from automq.broker.security import scram
from automq.broker.security.oauthbearer import OAuthBearerServer, TokenValidator
from automq.broker.security.scram import SaslAuthenticationError, ScramCredential, ScramServer

ScramLookup = Callable[[str, str], ScramCredential | None]  # (user, mechanism) -> credential
# (token id, mechanism) -> (credential, owner user) of a live delegation token
TokenLookup = Callable[[str, str], tuple[ScramCredential, str] | None]


class MechanismServer(Protocol):
    complete: bool
    username: str | None

    def step(self, token: bytes) -> bytes: ...


class PlainUsersFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, str] = {}
        self._load()

    def _load(self) -> None:
        try:
            st = os.stat(self.path)
            raw = yaml.safe_load(Path(self.path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"security.sasl_plain_users_file: cannot read {self.path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"security.sasl_plain_users_file: {self.path} is not YAML: {exc}") from exc
        if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
            raise ConfigError(f"security.sasl_plain_users_file: {self.path} must map user names to passwords")
        self._users = {k: str(v) for k, v in raw.items()}
        self._stamp = (st.st_mtime_ns, st.st_size)

    def check(self, user: str, password: str) -> bool:
        try:
            st = os.stat(self.path)
            if (st.st_mtime_ns, st.st_size) != self._stamp:
                self._load()
        except (OSError, ConfigError):
            pass  # keep the users we had; a rotation caught mid-write is retried next time
        expected = self._users.get(user)
        return expected is not None and hmac.compare_digest(expected.encode(), password.encode())


class PlainServer:
    """RFC 4616: one message `authzid NUL authcid NUL password`."""

    mechanism = "PLAIN"

    def __init__(self, check: Callable[[str, str], bool]) -> None:
        self._check = check
        self.complete = False
        self.username: str | None = None

    def step(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslAuthenticationError("unexpected PLAIN message after the exchange completed")
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise SaslAuthenticationError("Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise SaslAuthenticationError("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        if authzid and authzid != user:
            raise SaslAuthenticationError(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        if not self._check(user, password):
            raise SaslAuthenticationError("Authentication failed: Invalid username or password")
        self.username, self.complete = user, True
        return b""


class SaslMechanisms:
    def __init__(
        self, config: SecurityConfig, scram_lookup: ScramLookup, token_lookup: TokenLookup | None = None
    ) -> None:
        self.enabled = list(config.sasl_enabled_mechanisms)
        self._scram_lookup = scram_lookup
        self._token_lookup = token_lookup
        self._plain_file = PlainUsersFile(config.sasl_plain_users_file) if config.sasl_plain_users_file else None
        self._validator = TokenValidator(config) if "OAUTHBEARER" in self.enabled else None

    def _plain_check(self, user: str, password: str) -> bool:
        if self._plain_file is not None:
            return self._plain_file.check(user, password)
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
            credential = self._scram_lookup(user, mechanism)
            if credential is not None:
                return scram.password_matches(credential, password)
        return False

    def server(self, mechanism: str) -> MechanismServer:
        if mechanism not in self.enabled:
            raise ValueError(mechanism)
        if mechanism == "PLAIN":
            return PlainServer(self._plain_check)
        if mechanism == "OAUTHBEARER":
            assert self._validator is not None
            return OAuthBearerServer(self._validator)
        token_lookup = self._token_lookup
        return ScramServer(
            mechanism,
            lambda user: self._scram_lookup(user, mechanism),
            token_lookup=None if token_lookup is None else (lambda token_id: token_lookup(token_id, mechanism)),
        )
