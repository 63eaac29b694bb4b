"""SASL/OAUTHBEARER (RFC 7628, KIP-255/KIP-768) server side: the client's initial response
carries `auth=Bearer <JWT>`; the token is validated here and its subject becomes the
principal. The session lasts until the token's `exp` (reported to the client as the session
lifetime, so it re-authenticates with a fresh token).

Validation, as Kafka's broker-side validators:
- signed tokens (RS256/384/512, PS256/384/512, ES256/384/512) against the keys of a JSON Web
  Key Set file, picked by `kid` (or tried in turn when the token has none), with `exp`
  required, `nbf`/`iat` honoured, optional expected issuer and audience, a clock-skew margin;
- unsigned tokens (`alg: none`, empty signature) only when
  `security.sasl_oauthbearer_allow_unsecured` is set: librdkafka's
  `enable.sasl.oauthbearer.unsecure.jwt` and Kafka's unsecured login handler make those.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from automq.broker.config import ConfigError, SecurityConfig
from automq.broker.security.scram import SaslAuthenticationError
from automq.broker.security.tls import file_stamp

log = logging.getLogger(__name__)


# cryptography is imported where keys are loaded and tokens checked, not with this module:
# it is ~4 % of a broker's start-up imports, and only OAUTHBEARER listeners use it.
_HASHES = {"256": "SHA256", "384": "SHA384", "512": "SHA512"}  # names in cryptography's hashes
_CURVES = {"P-256": "SECP256R1", "P-384": "SECP384R1", "P-521": "SECP521R1"}  # names in its ec


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _b64url_int(text: str) -> int:
    return int.from_bytes(_b64url(text), "big")


@dataclass(frozen=True, slots=True)
class Jwk:
    kid: str | None
    key: Any  # rsa.RSAPublicKey | ec.EllipticCurvePublicKey


def load_jwks(path: str) -> list[Jwk]:
    """ConfigError naming the file and the problem; keys of unknown types are skipped."""
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"security.sasl_oauthbearer_jwks_file: cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ConfigError(f"security.sasl_oauthbearer_jwks_file: {path} is not JSON: {exc}") from exc
    keys = []
    for entry in data.get("keys", []) if isinstance(data, dict) else []:
        try:
            if entry.get("kty") == "RSA":
                key: Any = rsa.RSAPublicNumbers(_b64url_int(entry["e"]), _b64url_int(entry["n"])).public_key()
            elif entry.get("kty") == "EC" and entry.get("crv") in _CURVES:
                key = ec.EllipticCurvePublicNumbers(
                    _b64url_int(entry["x"]), _b64url_int(entry["y"]), getattr(ec, _CURVES[entry["crv"]])()
                ).public_key()
            else:
                continue
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"security.sasl_oauthbearer_jwks_file: bad key in {path}: {exc}") from exc
        keys.append(Jwk(entry.get("kid"), key))
    if not keys:
        raise ConfigError(f"security.sasl_oauthbearer_jwks_file: {path} holds no RSA or EC key")
    return keys


def _verify(alg: str, key: Any, signing_input: bytes, signature: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    family, bits = alg[:2], alg[2:]
    if bits not in _HASHES:
        return False
    algorithm: hashes.HashAlgorithm = getattr(hashes, _HASHES[bits])()
    try:
        if family == "RS" and isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, signing_input, padding.PKCS1v15(), algorithm)
        elif family == "PS" and isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, signing_input, padding.PSS(padding.MGF1(algorithm), algorithm.digest_size), algorithm)
        elif family == "ES" and isinstance(key, ec.EllipticCurvePublicKey):
            half = len(signature) // 2
            der = encode_dss_signature(int.from_bytes(signature[:half], "big"), int.from_bytes(signature[half:], "big"))
            key.verify(der, signing_input, ec.ECDSA(algorithm))
        else:
            return False
    except InvalidSignature:
        return False
    return True


@dataclass
class TokenValidator:
    config: SecurityConfig
    now_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    keys: list[Jwk] = field(init=False, default_factory=list)
    _stamp: tuple[int, int] = field(init=False, default=(0, -1))

    def __post_init__(self) -> None:
        if self.config.sasl_oauthbearer_jwks_file:
            self._stamp = file_stamp(self.config.sasl_oauthbearer_jwks_file)
            self.keys = load_jwks(self.config.sasl_oauthbearer_jwks_file)

    def _refresh(self) -> None:
        """The identity provider rotates keys: a changed JWKS file is read again (a broken one
        keeps the keys we have, logged)."""
        path = self.config.sasl_oauthbearer_jwks_file
        if not path:
            return
        stamp = file_stamp(path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self.keys = load_jwks(path)
            log.info("OAUTHBEARER: reloaded %d key(s) from %s", len(self.keys), path)
        except ConfigError as exc:
            log.warning("OAUTHBEARER: keeping the previous keys: %s", exc)

    def validate(self, token: str) -> tuple[str, int]:
        """(principal name, expiry in epoch ms); SaslAuthenticationError saying why not."""
        parts = token.split(".")
        if len(parts) != 3:
            raise SaslAuthenticationError("invalid_token: not a JWS compact serialization (3 dot-separated parts)")
        try:
            header = json.loads(_b64url(parts[0]))
            claims = json.loads(_b64url(parts[1]))
            signature = _b64url(parts[2])
        except ValueError:
            raise SaslAuthenticationError("invalid_token: header or payload is not base64url JSON") from None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise SaslAuthenticationError("invalid_token: header and payload must be JSON objects")
        alg = header.get("alg")
        if alg == "none":
            if not self.config.sasl_oauthbearer_allow_unsecured:
                raise SaslAuthenticationError(
                    "invalid_token: unsecured (alg none) tokens are refused; "
                    "security.sasl_oauthbearer_allow_unsecured enables them for development"
                )
            if signature:
                raise SaslAuthenticationError("invalid_token: an unsecured token must have an empty signature")
        else:
            self._refresh()
            if not self.keys:
                raise SaslAuthenticationError(
                    "invalid_token: no security.sasl_oauthbearer_jwks_file to verify signed tokens"
                )
            kid = header.get("kid")
            candidates = [k for k in self.keys if kid is None or k.kid == kid]
            signing_input = f"{parts[0]}.{parts[1]}".encode()
            if not any(_verify(str(alg), k.key, signing_input, signature) for k in candidates):
                raise SaslAuthenticationError(f"invalid_token: signature does not verify (alg {alg}, kid {kid})")
        now = self.now_ms()
        skew = self.config.sasl_oauthbearer_clock_skew_ms
        exp = claims.get("exp")
        if not isinstance(exp, int | float):
            raise SaslAuthenticationError("invalid_token: the token has no numeric exp claim")
        expiry_ms = int(exp * 1000)
        if expiry_ms + skew <= now:
            raise SaslAuthenticationError("invalid_token: the token expired")
        for claim in ("nbf", "iat"):
            value = claims.get(claim)
            if isinstance(value, int | float) and value * 1000 - skew > now:
                raise SaslAuthenticationError(f"invalid_token: {claim} is in the future")
        issuer = self.config.sasl_oauthbearer_expected_issuer
        if issuer is not None and claims.get("iss") != issuer:
            raise SaslAuthenticationError("invalid_token: unexpected issuer")
        audience = self.config.sasl_oauthbearer_expected_audience
        if audience is not None:
            aud = claims.get("aud")
            if audience not in (aud if isinstance(aud, list) else [aud]):
                raise SaslAuthenticationError("invalid_token: the expected audience is not in aud")
        subject = claims.get(self.config.sasl_oauthbearer_sub_claim_name)
        if not isinstance(subject, str) or not subject:
            raise SaslAuthenticationError(
                f"invalid_token: no {self.config.sasl_oauthbearer_sub_claim_name!r} claim naming the principal"
            )
        return subject, expiry_ms


class OAuthBearerServer:
    """The one-message exchange: `n,[a=authzid],\\x01auth=Bearer TOKEN\\x01[key=value\\x01]*\\x01`."""

    mechanism = "OAUTHBEARER"

    def __init__(self, validator: TokenValidator) -> None:
        self._validator = validator
        self.complete = False
        self.username: str | None = None
        self.expiry_ms: int | None = None

    def step(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslAuthenticationError("unexpected OAUTHBEARER message after the exchange completed")
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslAuthenticationError("OAUTHBEARER message is not UTF-8") from None
        gs2, sep, rest = text.partition("\x01")
        if not sep or not gs2.startswith(("n,", "y,")):
            raise SaslAuthenticationError("invalid OAUTHBEARER initial response")
        authzid = gs2.split(",")[1]
        fields = dict(kv.split("=", 1) for kv in rest.split("\x01") if "=" in kv)
        auth = fields.get("auth", "")
        scheme, _, jwt = auth.partition(" ")
        if scheme.lower() != "bearer" or not jwt:
            raise SaslAuthenticationError("invalid OAUTHBEARER initial response: no auth=Bearer token")
        name, expiry_ms = self._validator.validate(jwt.strip())
        if authzid and authzid[2:] != name:
            raise SaslAuthenticationError("OAUTHBEARER authorization id must match the token's subject")
        self.username, self.expiry_ms, self.complete = name, expiry_ms, True
        return b""
