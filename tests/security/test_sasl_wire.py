"""SASL on the wire, corner by corner (what client libraries hide): requests before
authentication, out-of-order SASL requests, unknown mechanisms, SaslHandshake v0 raw tokens,
KIP-368 session lifetime and re-authentication, and the principal a connection ends up with."""

from __future__ import annotations

import socket
import ssl
import struct
import time
import uuid

import pytest
from conftest import USERS, ThreadedCluster, secure_configs
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as SaslHandshakeV0
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from automq.broker.kafka import codec

pytestmark = pytest.mark.slow

LIFETIME_MS = 1500


@pytest.fixture(scope="module")
def reauth_cluster(tmp_path_factory, pki):
    controller_cfg, broker_raw = secure_configs(
        tmp_path_factory.mktemp("reauth"), pki, connections_max_reauth_ms=LIFETIME_MS
    )
    cluster = ThreadedCluster(controller_cfg, broker_raw).start()
    yield cluster
    cluster.stop()


def _read_exactly(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed by the broker")
        out += chunk
    return out


class Raw:
    def __init__(self, port: int, context: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = context.wrap_socket(sock, server_hostname="127.0.0.1") if context else sock
        self.cid = 0

    def call(self, request):
        self.cid += 1
        frame = codec.encode_request(self.cid, request)
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read_exactly(self.sock, 4))[0]
        cid, response = codec.decode_response(_read_exactly(self.sock, size), type(request))
        assert cid == self.cid
        return response

    def raw(self, token: bytes) -> bytes:
        self.sock.sendall(struct.pack(">i", len(token)) + token)
        size = struct.unpack(">i", _read_exactly(self.sock, 4))[0]
        return _read_exactly(self.sock, size)

    def closed(self) -> bool:
        """True once the broker closed the connection (what it does instead of answering)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionError:
            return True

    def plain(self, user: str, password: str):
        assert self.call(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
        return self.call(SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{password}".encode()))

    def close(self) -> None:
        self.sock.close()


def _metadata() -> MetadataRequest:
    return MetadataRequest(
        topics=(),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def test_a_request_before_authentication_closes_the_connection(reauth_cluster):
    raw = Raw(reauth_cluster.port("SASL"))
    frame = codec.encode_request(1, _metadata())
    raw.sock.sendall(struct.pack(">i", len(frame)) + frame)
    assert raw.closed()


def test_sasl_authenticate_without_handshake_closes_the_connection(reauth_cluster):
    """Kafka's authenticator raises IllegalSaslStateException and closes without answering."""
    raw = Raw(reauth_cluster.port("SASL"))
    with pytest.raises(ConnectionError):
        raw.call(SaslAuthenticateRequest(auth_bytes=b"\0alice\0alice-secret"))


def test_unknown_mechanism_lists_the_enabled_ones(reauth_cluster):
    raw = Raw(reauth_cluster.port("SASL"))
    response = raw.call(SaslHandshakeRequest(mechanism="GSSAPI"))
    assert response.error_code == ErrorCode.unsupported_sasl_mechanism
    assert set(response.mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"}
    assert raw.closed()


def test_handshake_on_a_plaintext_listener_is_illegal(reauth_cluster):
    raw = Raw(reauth_cluster.port("INTERNAL"))
    assert raw.call(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.illegal_sasl_state


def test_wrong_password_answers_sasl_authentication_failed_then_closes(reauth_cluster):
    raw = Raw(reauth_cluster.port("SASL"))
    response = raw.plain("alice", "nope")
    assert response.error_code == ErrorCode.sasl_authentication_failed
    assert "Invalid username or password" in response.error_message
    assert raw.closed()


def test_session_lifetime_expiry_and_reauthentication(reauth_cluster):
    raw = Raw(reauth_cluster.port("SASL"))
    response = raw.plain("alice", USERS["alice"])
    assert response.error_code == ErrorCode.none
    assert response.session_lifetime.total_seconds() * 1000 == LIFETIME_MS
    assert raw.call(_metadata()).brokers
    # re-authenticating as the same user renews the session on the same connection
    assert raw.plain("alice", USERS["alice"]).error_code == ErrorCode.none
    assert raw.call(_metadata()).brokers
    # as someone else: refused and closed (KIP-368: the principal may not change)
    response = raw.plain("bob", USERS["bob"])
    assert response.error_code == ErrorCode.sasl_authentication_failed
    assert raw.closed()
    # a session left to expire: the next request closes the connection
    raw = Raw(reauth_cluster.port("SASL"))
    assert raw.plain("bob", USERS["bob"]).error_code == ErrorCode.none
    time.sleep(LIFETIME_MS / 1000 + 0.5)
    frame = codec.encode_request(9, _metadata())
    raw.sock.sendall(struct.pack(">i", len(frame)) + frame)
    assert raw.closed()


def test_handshake_v0_then_raw_tokens(reauth_cluster, pki):
    context = ssl.create_default_context(cafile=str(pki.ca.path))
    raw = Raw(reauth_cluster.port("SASL_TLS"), context)
    assert raw.call(SaslHandshakeV0(mechanism="PLAIN")).error_code == ErrorCode.none
    assert raw.raw(f"\0bob\0{USERS['bob']}".encode()) == b""
    assert raw.call(_metadata()).brokers
    principals = {c.session.principal for c in reauth_cluster.broker.server.connections if c.session is not None}
    assert "User:bob" in principals


def test_librdkafka_reauthenticates_and_keeps_producing(reauth_cluster, pki):
    from confluent_kafka import Producer

    errors = []
    producer = Producer(
        {
            "bootstrap.servers": reauth_cluster.bootstrap("SASL"),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": USERS["alice"],
            "error_cb": errors.append,
        }
    )
    topic = "reauth-" + uuid.uuid4().hex[:6]
    delivered = []
    for i in range(4):  # spans several session lifetimes
        producer.produce(topic, value=str(i).encode(), on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(20) == 0
        time.sleep(LIFETIME_MS / 1000)
    assert delivered == [None] * 4, delivered
    assert not errors, errors


def test_tls_client_certificate_names_the_principal(reauth_cluster, pki):
    context = ssl.create_default_context(cafile=str(pki.ca.path))
    context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    raw = Raw(reauth_cluster.port("TLS"), context)
    assert raw.call(_metadata()).brokers
    sessions = [c.session for c in reauth_cluster.broker.server.connections if c.session is not None]
    # CN=alice,O=acme mapped by RULE:^CN=([^,]+),O=acme$/$1/L
    assert any(s.listener == "TLS" and s.principal == "User:alice" for s in sessions)
    anonymous = Raw(reauth_cluster.port("TLS"), ssl.create_default_context(cafile=str(pki.ca.path)))
    assert anonymous.call(_metadata()).brokers
    sessions = [c.session for c in reauth_cluster.broker.server.connections if c.session is not None]
    assert any(s.listener == "TLS" and s.principal == "User:ANONYMOUS" for s in sessions)


def _served_serial(port: int, pki) -> int:
    from cryptography import x509

    context = ssl.create_default_context(cafile=str(pki.ca.path))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def test_a_rotated_certificate_is_served_to_new_connections(reauth_cluster, pki, tmp_path):
    port = reauth_cluster.port("TLS")
    old = _served_serial(port, pki)
    kept = Raw(port, ssl.create_default_context(cafile=str(pki.ca.path)))  # established before the rotation
    cert_path, key_path, cert = pki.ca.issue(tmp_path, "rotated", server=True, O="acme", CN="localhost")
    tls = reauth_cluster.broker.server.tls_contexts["requested"]

    async def check() -> bool:
        return tls.check()

    # the key first: until the certificate follows, the pair does not match and the old one stays
    pki.server_key.write_bytes(key_path.read_bytes())
    assert reauth_cluster.run(check()) is False
    assert _served_serial(port, pki) == old
    pki.server_cert.write_bytes(cert_path.read_bytes())
    assert reauth_cluster.run(check()) is True
    assert _served_serial(port, pki) == cert.serial_number != old
    assert kept.call(_metadata()).brokers


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"])
def test_garbage_tokens_fail_and_the_broker_keeps_serving(reauth_cluster, mechanism):
    import random

    rng = random.Random(mechanism)
    for size in (0, 1, 7, 300, 70_000):
        raw = Raw(reauth_cluster.port("SASL"))
        assert raw.call(SaslHandshakeRequest(mechanism=mechanism)).error_code == ErrorCode.none
        token = bytes(rng.randrange(256) for _ in range(size))
        response = raw.call(SaslAuthenticateRequest(auth_bytes=token))
        assert response.error_code == ErrorCode.sasl_authentication_failed, (size, response)
        assert raw.closed()
    ok = Raw(reauth_cluster.port("SASL"))
    assert ok.plain("alice", USERS["alice"]).error_code == ErrorCode.none
    assert ok.call(_metadata()).brokers
