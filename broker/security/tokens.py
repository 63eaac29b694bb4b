"""Delegation tokens as Kafka has them (KIP-48): lightweight credentials a SASL-authenticated
user creates for others (jobs, workers) to authenticate as that user with SCRAM.

A token's metadata (id, owner, requester, renewers, issue / expiry / max times) is in the
controller's metadata; its secret, the HMAC, is never stored: every broker derives it as
HMAC-SHA512(`security.delegation_token_secret_key_file`, token id), so all brokers of a
cluster need the same key (Kafka's `delegation.token.secret.key`). A client authenticates with
SCRAM-SHA-256/512, user = token id, password = base64(HMAC) and the SCRAM extension
`tokenauth=true`; the session's principal is then the token's owner, marked as token
authenticated (such a session may not create or renew tokens, as in Kafka). The SCRAM
credential of a token is derived from its HMAC (4096 iterations, as Kafka) once per token and
mechanism. Without a secret key, tokens are disabled (DELEGATION_TOKEN_AUTH_DISABLED).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from pathlib import Path

from automq.broker.config import ConfigError, SecurityConfig
from automq.broker.controller.protocol import DelegationTokenInfo
from automq.broker.security import scram

TOKEN_SCRAM_ITERATIONS = 4096


class DelegationTokens:
    def __init__(self, config: SecurityConfig) -> None:
        self.max_lifetime_ms = config.delegation_token_max_lifetime_ms
        self.expiry_time_ms = config.delegation_token_expiry_time_ms
        self._key: bytes | None = None
        if config.delegation_token_secret_key_file:
            try:
                self._key = Path(config.delegation_token_secret_key_file).read_bytes().strip()
            except OSError as exc:
                raise ConfigError(
                    f"security.delegation_token_secret_key_file: cannot read "
                    f"{config.delegation_token_secret_key_file}: {exc.strerror}"
                ) from exc
            if not self._key:
                raise ConfigError("security.delegation_token_secret_key_file is empty")
        self.tokens: dict[str, DelegationTokenInfo] = {}
        self._by_hmac: dict[bytes, str] = {}
        self._credentials: dict[tuple[str, str], scram.ScramCredential] = {}

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def hmac(self, token_id: str) -> bytes:
        assert self._key is not None
        return hmac.new(self._key, token_id.encode(), hashlib.sha512).digest()

    def update(self, tokens: tuple[DelegationTokenInfo, ...]) -> None:
        self.tokens = {t.token_id: t for t in tokens}
        if self.enabled:
            self._by_hmac = {self.hmac(t): t for t in self.tokens}
        self._credentials = {k: v for k, v in self._credentials.items() if k[0] in self.tokens}

    def find(self, token_hmac: bytes) -> DelegationTokenInfo | None:
        token_id = self._by_hmac.get(bytes(token_hmac))
        return self.tokens.get(token_id) if token_id is not None else None

    def scram_login(self, token_id: str, mechanism: str) -> tuple[scram.ScramCredential, str] | None:
        """(SCRAM credential, owner's user name) of a live token, for `tokenauth=true` logins."""
        token = self.tokens.get(token_id)
        if token is None or not self.enabled or token.expiry_ms < time.time() * 1000:
            return None
        key = (token_id, mechanism)
        credential = self._credentials.get(key)
        if credential is None:
            password = base64.b64encode(self.hmac(token_id)).decode()
            credential = scram.make_credential(mechanism, password, iterations=TOKEN_SCRAM_ITERATIONS)
            self._credentials[key] = credential
        return credential, token.owner.partition(":")[2]
