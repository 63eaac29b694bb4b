"""SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka speaks them: credentials and
the server side of the exchange, without I/O.

Credentials are what Kafka stores: a salt, an iteration count, StoredKey = H(ClientKey) and
ServerKey, never the password. An admin client's AlterUserScramCredentials already sends
SaltedPassword = Hi(password, salt, i), so the controller derives the keys from that and
forgets it.

The exchange: client-first `n,,n=USER,r=CNONCE` -> server-first `r=CNONCE+SNONCE,s=SALT,i=N`
-> client-final `c=biws,r=NONCE,p=PROOF` -> server-final `v=SIGNATURE`. Channel binding is
not offered (a `p=` GS2 flag is refused), as in Kafka.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS = 4096  # Kafka refuses fewer
MAX_ITERATIONS = 16384  # and more


class SaslAuthenticationError(Exception):
    """The client failed to authenticate; the message goes to the client (no secrets in it)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str  # "SCRAM-SHA-256" | "SCRAM-SHA-512"
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def _hmac(hash_name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_name).digest()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism], password.encode(), salt, iterations)


def credential_from_salted(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    h = MECHANISMS[mechanism]
    client_key = _hmac(h, salted, b"Client Key")
    return ScramCredential(
        mechanism, salt, iterations, hashlib.new(h, client_key).digest(), _hmac(h, salted, b"Server Key")
    )


def make_credential(
    mechanism: str, password: str, iterations: int = 8192, salt: bytes | None = None
) -> ScramCredential:
    salt = salt if salt is not None else secrets.token_bytes(32)
    return credential_from_salted(mechanism, salted_password(mechanism, password, salt, iterations), salt, iterations)


def password_matches(credential: ScramCredential, password: str) -> bool:
    """For PLAIN against the SCRAM store: derive with the stored salt and compare StoredKey."""
    derived = credential_from_salted(
        credential.mechanism,
        salted_password(credential.mechanism, password, credential.salt, credential.iterations),
        credential.salt,
        credential.iterations,
    )
    return hmac.compare_digest(derived.stored_key, credential.stored_key)


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise SaslAuthenticationError(f"invalid SCRAM message attribute {part[:20]!r}")
        out.setdefault(part[0], part[2:])
    return out


def _saslname(raw: str) -> str:
    if "=" in raw.replace("=2C", "").replace("=3D", ""):
        raise SaslAuthenticationError("invalid SCRAM user name encoding")
    return raw.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One authentication. `lookup(user)` gives the user's credential for this mechanism (or
    None). `step()` takes each client message and returns the server's; `complete` and
    `username` once the proof checked out. Any failure raises SaslAuthenticationError."""

    def __init__(
        self, mechanism: str, lookup, server_nonce=lambda: secrets.token_urlsafe(24), token_lookup=None
    ) -> None:
        self._server_nonce = server_nonce
        self._token_lookup = token_lookup  # (token id) -> (credential, owner) for `tokenauth=true`
        self.token_authenticated = False
        if mechanism not in MECHANISMS:
            raise ValueError(mechanism)
        self.mechanism = mechanism
        self._hash = MECHANISMS[mechanism]
        self._lookup = lookup
        self._state = "first"
        self.complete = False
        self.username: str | None = None
        self._credential: ScramCredential | None = None
        self._gs2 = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._client_nonce = ""

    def step(self, token: bytes) -> bytes:
        try:
            message = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslAuthenticationError("SCRAM message is not UTF-8") from None
        if self._state == "first":
            return self._first(message)
        if self._state == "final":
            return self._final(message)
        raise SaslAuthenticationError("unexpected SCRAM message after the exchange completed")

    def _fail(self) -> SaslAuthenticationError:
        self._state = "failed"
        return SaslAuthenticationError(
            f"Authentication failed during authentication due to invalid credentials with SASL mechanism {self.mechanism}"
        )

    def _first(self, message: str) -> bytes:
        parts = message.split(",", 2)
        if len(parts) != 3 or parts[0] not in ("n", "y") or (parts[1] and not parts[1].startswith("a=")):
            if parts and parts[0].startswith("p="):
                raise SaslAuthenticationError("SCRAM channel binding is not supported")
            raise SaslAuthenticationError("invalid SCRAM client-first message")
        self._gs2 = f"{parts[0]},{parts[1]},"
        bare = parts[2]
        # Kafka's SCRAM extensions (e.g. tokenauth=true) follow r=, as key=value with longer keys
        fields = bare.split(",")
        is_extension = [i >= 2 and f.find("=") > 1 for i, f in enumerate(fields)]
        extensions = dict(f.split("=", 1) for f, ext in zip(fields, is_extension, strict=True) if ext)
        attrs = _attributes(",".join(f for f, ext in zip(fields, is_extension, strict=True) if not ext))
        if "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise SaslAuthenticationError("SCRAM client-first message lacks n= or r=")
        if "m" in attrs:
            raise SaslAuthenticationError("SCRAM extensions (m=) are not supported")
        user = _saslname(attrs["n"])
        authzid = parts[1][2:] if parts[1] else ""
        if authzid and _saslname(authzid) != user:
            raise SaslAuthenticationError("SCRAM authorization id must match the user name")
        if extensions.get("tokenauth", "").lower() == "true":
            found = self._token_lookup(user) if self._token_lookup is not None else None
            if found is None:
                raise self._fail()
            credential, owner = found
            self.token_authenticated = True
            user = owner
        else:
            credential = self._lookup(user)
        if credential is None:
            raise self._fail()
        self.username = user
        self._credential = credential
        self._client_first_bare = bare
        self._client_nonce = attrs["r"]
        self._nonce = attrs["r"] + self._server_nonce()
        self._server_first = f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},i={credential.iterations}"
        self._state = "final"
        return self._server_first.encode()

    def _final(self, message: str) -> bytes:
        cred = self._credential
        assert cred is not None
        head, sep, proof_b64 = message.rpartition(",p=")
        if not sep:
            raise self._fail()
        attrs = _attributes(head)
        # librdkafka before 2.6.1 sends the client nonce twice (client nonce + the server's
        # combined nonce). Kafka 3.8.1-3.9 accepted that (endsWith); 4.x refuses it, which
        # breaks kcat and distro librdkafka builds. Accepting exactly that shape keeps them
        # working and stays safe: the whole server nonce must still come back.
        if attrs.get("r") not in (self._nonce, self._client_nonce + self._nonce):
            raise self._fail()
        try:
            if base64.b64decode(attrs.get("c", ""), validate=True) != self._gs2.encode():
                raise self._fail()
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise self._fail() from None
        auth_message = f"{self._client_first_bare},{self._server_first},{head}".encode()
        signature = _hmac(self._hash, cred.stored_key, auth_message)
        if len(proof) != len(signature):
            raise self._fail()
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), cred.stored_key):
            raise self._fail()
        self.complete = True
        self._state = "done"
        return b"v=" + base64.b64encode(_hmac(self._hash, cred.server_key, auth_message))


def _encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    """The client side of one exchange (a broker calling another broker, the admin CLIs):
    `first()`, then `final(server_first)`, then `verify(server_final)`; any server answer
    that does not fit (a foreign nonce, a bad signature, an iteration count Kafka would not
    use) raises SaslAuthenticationError, so a man in the middle cannot pass as the broker."""

    def __init__(
        self,
        mechanism: str,
        username: str,
        password: str,
        nonce: str | None = None,
        extensions: tuple[tuple[str, str], ...] = (),
    ) -> None:
        if mechanism not in MECHANISMS:
            raise ValueError(mechanism)
        self._hash = MECHANISMS[mechanism]
        self._password = password
        self._nonce = nonce or secrets.token_urlsafe(24)
        # extensions (tokenauth=true for a delegation token) follow the nonce, as Kafka's client sends them
        self._first_bare = f"n={_encode_saslname(username)},r={self._nonce}" + "".join(
            f",{k}={v}" for k, v in extensions
        )
        self._server_key = b""
        self._auth_message = b""

    def first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8", "replace")
        attrs = _attributes(text)
        nonce, salt_b64, iterations = attrs.get("r", ""), attrs.get("s", ""), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslAuthenticationError("SCRAM server-first message does not extend our nonce")
        if not iterations.isdigit() or not MIN_ITERATIONS <= int(iterations) <= MAX_ITERATIONS:
            raise SaslAuthenticationError(f"SCRAM server-first message has an invalid iteration count {iterations!r}")
        try:
            salt = base64.b64decode(salt_b64, validate=True)
        except ValueError:
            raise SaslAuthenticationError("SCRAM server-first message has an invalid salt") from None
        salted = hashlib.pbkdf2_hmac(self._hash, self._password.encode(), salt, int(iterations))
        client_key = _hmac(self._hash, salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        head = f"c=biws,r={nonce}"
        self._auth_message = f"{self._first_bare},{text},{head}".encode()
        signature = _hmac(self._hash, stored_key, self._auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_key = _hmac(self._hash, salted, b"Server Key")
        return f"{head},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = _attributes(server_final.decode("utf-8", "replace"))
        if "e" in attrs:
            raise SaslAuthenticationError(f"SCRAM server refused: {attrs['e']}")
        expected = base64.b64encode(_hmac(self._hash, self._server_key, self._auth_message)).decode()
        if not hmac.compare_digest(attrs.get("v", ""), expected):
            raise SaslAuthenticationError("SCRAM server signature does not match: not the broker we trust")
