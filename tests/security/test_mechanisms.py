"""The SASL mechanisms, certificate principals and TLS config as pure pieces (no sockets)."""

from __future__ import annotations

import base64
import json
import time

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from automq.broker.config import ConfigError, SecurityConfig, parse_config
from automq.broker.security import scram
from automq.broker.security.oauthbearer import OAuthBearerServer, TokenValidator
from automq.broker.security.principal import PrincipalMapper, PrincipalMappingError, parse_rules
from automq.broker.security.sasl import PlainServer
from automq.broker.security.scram import SaslAuthenticationError, ScramServer

# ------------------------------------------------------------------ SCRAM (RFC 7677 section 3)

RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_SNONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"


def _rfc_server() -> ScramServer:
    cred = scram.make_credential("SCRAM-SHA-256", "pencil", iterations=4096, salt=RFC_SALT)
    return ScramServer("SCRAM-SHA-256", {"user": cred}.get, server_nonce=lambda: RFC_SNONCE)


def test_scram_sha256_matches_the_rfc_7677_exchange():
    server = _rfc_server()
    first = server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = server.step(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    # the client's check of the server (RFC 5802 section 3), computed from the password
    import hashlib
    import hmac

    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", RFC_SALT, 4096)
    auth = b"n=user,r=rOprNGfwEbeRWgbNEkqO," + first + b",c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    assert final == b"v=" + base64.b64encode(hmac.new(server_key, auth, "sha256").digest())
    assert server.complete and server.username == "user"


@pytest.mark.parametrize(
    "final",
    [
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAAZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",  # nonce not the server's
        b"c=eSws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",  # no proof
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=!!!",
    ],
)
def test_scram_refuses_a_bad_client_final(final):
    server = _rfc_server()
    server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        server.step(final)
    assert not server.complete


@pytest.mark.parametrize(
    "first",
    [
        b"n,,n=nobody,r=abc",
        b"p=tls-unique,,n=user,r=abc",
        b"garbage",
        b"n,,r=abc",
        b"\xff\xfe",
        b"n,,n=user,r=abc,m=ext",
    ],
)
def test_scram_refuses_a_bad_client_first(first):
    with pytest.raises(SaslAuthenticationError):
        _rfc_server().step(first)


def test_scram_tolerates_old_librdkafka_doubled_client_nonce():
    """librdkafka < 2.6.1 (kcat's) sends client nonce + combined nonce; the proof is over that."""
    cred = scram.make_credential("SCRAM-SHA-512", "pw", iterations=4096)
    server = ScramServer("SCRAM-SHA-512", {"u": cred}.get, server_nonce=lambda: "SN")
    server.step(b"n,,n=u,r=CN")
    head = "c=biws,r=CNCNSN"
    auth = f"n=u,r=CN,r=CNSN,s={base64.b64encode(cred.salt).decode()},i=4096,{head}".encode()
    salted = scram.salted_password("SCRAM-SHA-512", "pw", cred.salt, 4096)
    import hashlib
    import hmac

    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    signature = hmac.new(hashlib.sha512(client_key).digest(), auth, "sha512").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server.step(f"{head},p={base64.b64encode(proof).decode()}".encode())
    assert server.complete


def test_password_matches_checks_against_stored_keys():
    cred = scram.make_credential("SCRAM-SHA-512", "s3cret", iterations=4096)
    assert scram.password_matches(cred, "s3cret")
    assert not scram.password_matches(cred, "s3cret!")


# ------------------------------------------------------------------ PLAIN


@pytest.mark.parametrize(
    ("token", "ok"),
    [
        (b"\x00alice\x00pw", True),
        (b"alice\x00alice\x00pw", True),
        (b"bob\x00alice\x00pw", False),  # authzid of someone else
        (b"\x00alice\x00wrong", False),
        (b"\x00alice", False),
        (b"\x00\x00pw", False),
        (b"\x00alice\x00", False),
    ],
)
def test_plain(token, ok):
    server = PlainServer(lambda u, p: (u, p) == ("alice", "pw"))
    if ok:
        server.step(token)
        assert server.complete and server.username == "alice"
    else:
        with pytest.raises(SaslAuthenticationError):
            server.step(token)


# ------------------------------------------------------------------ principals


@pytest.mark.parametrize(
    ("rules", "dn", "name"),
    [
        (["DEFAULT"], "CN=alice,O=acme,C=US", "CN=alice,O=acme,C=US"),
        (["RULE:^CN=(.*?),O=(.*?),.*$/$1@$2/"], "CN=alice,O=acme,C=US", "alice@acme"),
        (["RULE:^CN=(.*?),.*$/$1/U"], "CN=alice,O=acme", "ALICE"),
        (["RULE:^CN=(.*?),OU=svc$/$1/L", "DEFAULT"], "CN=Bob,O=x", "CN=Bob,O=x"),
        (["RULE:^CN=([^,]*)/$1/L"], "CN=Bob", "bob"),
    ],
)
def test_principal_mapping_rules(rules, dn, name):
    assert PrincipalMapper(rules).name_for(dn) == name


def test_principal_mapping_without_a_match_is_an_error():
    with pytest.raises(PrincipalMappingError):
        PrincipalMapper(["RULE:^CN=(.*),OU=svc$/$1/"]).name_for("CN=x,O=y")
    with pytest.raises(ValueError, match="principal_mapping_rules"):
        parse_rules(["RULE:nope"])


# ------------------------------------------------------------------ OAUTHBEARER


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(header: dict, claims: dict, sign=None) -> str:
    head = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{head}.{_b64(sign(head.encode())) if sign else ''}"


def _int_b64(n: int) -> str:
    return _b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rn, en = rsa_key.public_key().public_numbers(), ec_key.public_key().public_numbers()
    jwks = {
        "keys": [
            {"kty": "RSA", "kid": "r1", "n": _int_b64(rn.n), "e": _int_b64(rn.e)},
            {"kty": "EC", "kid": "e1", "crv": "P-256", "x": _int_b64(en.x), "y": _int_b64(en.y)},
        ]
    }
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps(jwks))
    return rsa_key, ec_key, str(path)


def _rs256(key):
    return lambda data: key.sign(data, padding.PKCS1v15(), hashes.SHA256())


def _es256(key):
    def sign(data):
        r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")

    return sign


def _validator(jwks: str, **extra) -> TokenValidator:
    return TokenValidator(SecurityConfig(sasl_oauthbearer_jwks_file=jwks, **extra))


def test_signed_tokens_validate_against_the_jwks(keys):
    rsa_key, ec_key, jwks = keys
    exp = int(time.time()) + 600
    v = _validator(jwks, sasl_oauthbearer_expected_issuer="https://idp", sasl_oauthbearer_expected_audience="kafka")
    claims = {"sub": "alice", "exp": exp, "iss": "https://idp", "aud": ["kafka", "x"]}
    assert v.validate(_jwt({"alg": "RS256", "kid": "r1"}, claims, _rs256(rsa_key))) == ("alice", exp * 1000)
    assert v.validate(_jwt({"alg": "ES256", "kid": "e1"}, claims, _es256(ec_key)))[0] == "alice"
    assert v.validate(_jwt({"alg": "ES256"}, claims, _es256(ec_key)))[0] == "alice"  # no kid: every key is tried


@pytest.mark.parametrize(
    ("header", "claims", "reason"),
    [
        ({"alg": "RS256", "kid": "e1"}, {}, "signature"),  # kid of another key
        ({"alg": "RS256", "kid": "r1"}, {"exp": 1}, "expired"),
        ({"alg": "RS256", "kid": "r1"}, {"exp": None}, "exp"),
        ({"alg": "RS256", "kid": "r1"}, {"iss": "https://evil"}, "issuer"),
        ({"alg": "RS256", "kid": "r1"}, {"aud": "other"}, "audience"),
        ({"alg": "RS256", "kid": "r1"}, {"sub": None}, "'sub'"),
        ({"alg": "RS256", "kid": "r1"}, {"nbf": int(time.time()) + 3600}, "nbf"),
        ({"alg": "none"}, {}, "unsecured"),
    ],
)
def test_bad_tokens_are_refused(keys, header, claims, reason):
    rsa_key, _, jwks = keys
    base = {"sub": "alice", "exp": int(time.time()) + 600, "iss": "https://idp", "aud": "kafka"}
    token = _jwt(header, {**base, **claims}, None if header["alg"] == "none" else _rs256(rsa_key))
    v = _validator(jwks, sasl_oauthbearer_expected_issuer="https://idp", sasl_oauthbearer_expected_audience="kafka")
    with pytest.raises(SaslAuthenticationError, match=reason):
        v.validate(token)


def test_unsecured_tokens_only_when_allowed_and_initial_response_parsing():
    token = _jwt({"alg": "none"}, {"sub": "dev", "exp": int(time.time()) + 60})
    allowed = TokenValidator(SecurityConfig(sasl_oauthbearer_allow_unsecured=True))
    server = OAuthBearerServer(allowed)
    assert server.step(f"n,,\x01auth=Bearer {token}\x01\x01".encode()) == b""
    assert server.complete and server.username == "dev" and server.expiry_ms
    with pytest.raises(SaslAuthenticationError):
        OAuthBearerServer(allowed).step(b"n,,\x01auth=Basic abc\x01\x01")
    with pytest.raises(SaslAuthenticationError, match="unsecured"):
        OAuthBearerServer(TokenValidator(SecurityConfig())).step(f"n,,\x01auth=Bearer {token}\x01\x01".encode())
    with pytest.raises(SaslAuthenticationError, match="authorization id"):
        OAuthBearerServer(allowed).step(f"n,a=other,\x01auth=Bearer {token}\x01\x01".encode())


# ------------------------------------------------------------------ config


def test_tls_listeners_need_certificates_and_names_are_distinct():
    base = {"node_id": 1, "listeners": [{"name": "S", "port": 1, "security_protocol": "SASL_SSL"}]}
    with pytest.raises(ConfigError, match="tls.cert_file and tls.key_file are required by listeners\\[S\\]"):
        parse_config(base)
    with pytest.raises(ConfigError, match="distinct"):
        parse_config({"node_id": 1, "listeners": [{"name": "A", "port": 1}, {"name": "A", "port": 2}]})
    with pytest.raises(ConfigError, match="security_protocol"):
        parse_config({"node_id": 1, "listeners": [{"name": "A", "port": 1, "security_protocol": "TLS"}]})


def test_a_rotated_jwks_file_is_read_again(keys, tmp_path):
    rsa_key, _, jwks = keys
    path = tmp_path / "jwks.json"
    only_ec = json.loads(open(jwks).read())
    only_ec["keys"] = [k for k in only_ec["keys"] if k["kty"] == "EC"]
    path.write_text(json.dumps(only_ec))
    v = _validator(str(path))
    token = _jwt({"alg": "RS256", "kid": "r1"}, {"sub": "a", "exp": int(time.time()) + 60}, _rs256(rsa_key))
    with pytest.raises(SaslAuthenticationError, match="signature"):
        v.validate(token)
    path.write_text(open(jwks).read() + " ")  # the provider added the RSA key (size changes)
    assert v.validate(token)[0] == "a"
    path.write_text("{broken")  # a bad rotation keeps the keys we have
    assert v.validate(token)[0] == "a"


def test_oauthbearer_without_any_way_to_validate_is_a_config_error():
    listeners = [{"name": "S", "port": 1, "security_protocol": "SASL_PLAINTEXT"}]
    with pytest.raises(ConfigError, match="sasl_oauthbearer_jwks_file"):
        parse_config({"node_id": 1, "listeners": listeners, "security": {"sasl_enabled_mechanisms": ["OAUTHBEARER"]}})


def test_inter_broker_listener_must_exist_and_sasl_needs_credentials(tmp_path):
    listeners = [{"name": "INTERNAL", "port": 1}, {"name": "SASL", "port": 2, "security_protocol": "SASL_PLAINTEXT"}]
    ok = parse_config({"node_id": 1, "listeners": listeners, "kafka": {"inter_broker_listener_name": "INTERNAL"}})
    assert ok.kafka.inter_broker_listener_name == "INTERNAL"
    with pytest.raises(ConfigError, match="not one of the listeners"):
        parse_config({"node_id": 1, "listeners": listeners, "kafka": {"inter_broker_listener_name": "NOPE"}})
    with pytest.raises(ConfigError, match="sasl_inter_broker_jaas_config_file"):
        parse_config({"node_id": 1, "listeners": listeners, "kafka": {"inter_broker_listener_name": "SASL"}})
    jaas = str(tmp_path / "jaas")
    with pytest.raises(ConfigError, match="sasl_mechanism_inter_broker_protocol SCRAM-SHA-256 must be one of"):
        parse_config(
            {
                "node_id": 1,
                "listeners": listeners,
                "kafka": {"inter_broker_listener_name": "SASL"},
                "security": {
                    "sasl_enabled_mechanisms": ["PLAIN"],
                    "sasl_inter_broker_jaas_config_file": jaas,
                    "sasl_mechanism_inter_broker_protocol": "SCRAM-SHA-256",
                },
            }
        )
