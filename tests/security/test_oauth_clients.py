"""OAUTHBEARER with signed tokens and a real client: librdkafka's oauth_cb hands the broker
RS256 JWTs; the broker checks them against a JWKS file, issuer and audience. A valid token
produces and consumes; an expired token, a token signed by another key and a wrong issuer
fail authentication."""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from conftest import ThreadedCluster, secure_configs
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

pytestmark = pytest.mark.slow

ISSUER = "https://idp.test"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _token(key, claims: dict, kid: str = "k1") -> str:
    head = f"{_b64(json.dumps({'alg': 'RS256', 'kid': kid}).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{head}.{_b64(key.sign(head.encode(), padding.PKCS1v15(), hashes.SHA256()))}"


@pytest.fixture(scope="module")
def signing_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def oauth_cluster(tmp_path_factory, pki, signing_key):
    tmp = tmp_path_factory.mktemp("oauth")
    numbers = signing_key.public_key().public_numbers()
    n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
    jwks = tmp / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{"kty": "RSA", "kid": "k1", "n": _b64(n), "e": _b64(b"\x01\x00\x01")}]}))
    controller_cfg, broker_raw = secure_configs(
        tmp,
        pki,
        sasl_oauthbearer_jwks_file=str(jwks),
        sasl_oauthbearer_expected_issuer=ISSUER,
        sasl_oauthbearer_expected_audience="kafka",
        sasl_oauthbearer_allow_unsecured=False,
    )
    cluster = ThreadedCluster(controller_cfg, broker_raw).start()
    yield cluster
    cluster.stop()


def _conf(cluster, pki, make_token) -> dict:
    def oauth_cb(_config):
        token, expiry_s = make_token()
        return token, expiry_s

    return {
        "bootstrap.servers": cluster.bootstrap("SASL_TLS"),
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca.path),
        "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": oauth_cb,
    }


def _claims(**extra) -> dict:
    now = int(time.time())
    return {"sub": "svc-orders", "iss": ISSUER, "aud": "kafka", "iat": now, "exp": now + 600, **extra}


def test_signed_token_produces_and_consumes(oauth_cluster, pki, signing_key):
    def make():
        claims = _claims()
        return _token(signing_key, claims), float(claims["exp"])

    conf = _conf(oauth_cluster, pki, make)
    topic = "oauth-" + uuid.uuid4().hex[:6]
    producer = Producer({**conf, "acks": "all"})
    producer.produce(topic, b"signed")
    assert producer.flush(30) == 0
    consumer = Consumer({**conf, "group.id": "g-oauth", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    msg = None
    for _ in range(60):
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            break
    consumer.close()
    assert msg is not None and msg.value() == b"signed"
    principals = {c.session.principal for c in oauth_cluster.broker.server.connections if c.session is not None}
    assert "User:svc-orders" in principals


@pytest.mark.parametrize(
    ("case", "reason"),
    [("expired", "expired"), ("other-key", "signature"), ("issuer", "issuer"), ("unsigned", "unsecured")],
)
def test_bad_tokens_fail_authentication(oauth_cluster, pki, signing_key, case, reason):
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def make():
        if case == "expired":
            claims = _claims(exp=int(time.time()) - 3600)
            return _token(signing_key, claims), time.time() + 600  # the client believes it is fresh
        if case == "other-key":
            return _token(other, _claims()), time.time() + 600
        if case == "issuer":
            return _token(signing_key, _claims(iss="https://evil.test")), time.time() + 600
        unsigned_header = _b64(json.dumps({"alg": "none"}).encode())
        head = f"{unsigned_header}.{_b64(json.dumps(_claims()).encode())}."
        return head, time.time() + 600

    errors: list[KafkaError] = []
    admin = AdminClient({**_conf(oauth_cluster, pki, make), "error_cb": errors.append})
    # The request cannot succeed, so librdkafka gives up only at the timeout: a short one, since
    # the error is then waited for on its own (authentication fails in milliseconds).
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=1)
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        admin.poll(0.1)  # serves error_cb
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert reason in errors[0].str(), errors[0].str()
