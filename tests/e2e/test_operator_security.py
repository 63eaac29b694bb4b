"""Secure by default on Kubernetes, end to end: the real kopf operator on kmock, the kubelet
harness running real controller and broker processes with the config, certificates and token
the operator rendered, and a real client (confluent-kafka) over SASL_SSL.

An AutoMQCluster with no `listeners` gets an INTERNAL listener with TLS and SCRAM-SHA-512; the
operator makes a cluster CA and the brokers' certificate, a controller API token, and the
AutoMQUser's SCRAM Secret; a client trusting the CA from `<cluster>-cluster-ca-cert` and using
the user's Secret produces and consumes. A wrong password, a plaintext client, a client that
does not trust the CA, and a controller API call without the token are refused.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from kubelet_harness import KubeletHarness, s3_cluster_spec

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.timeout(300)]


def _secret(k8s: KubeletHarness, name: str) -> dict[str, str]:
    secret = k8s.get("Secret", name) or {}
    return {k: base64.b64decode(v).decode(errors="replace") for k, v in (secret.get("data") or {}).items()}


def _client(bootstrap: str, ca: Path, user: str, password: str, **extra: str) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(ca),
        # The harness advertises each broker's loopback IP, which is not in the certificate (pods
        # are reached by their DNS names, which are: see tests/operator/test_security.py).
        "ssl.endpoint.identification.algorithm": "none",
        **extra,
    }


def _refused(config: dict[str, str]) -> str:
    """Why a client with this config cannot talk to the broker (librdkafka's error callbacks,
    served by poll; the first error arrives within seconds)."""
    errors: list[str] = []
    producer = Producer({**config, "socket.timeout.ms": "3000", "error_cb": lambda e: errors.append(str(e))})
    deadline = time.monotonic() + 15
    while not errors and time.monotonic() < deadline:
        producer.poll(0.5)
    return " | ".join(errors)


def test_secure_defaults_with_real_processes_and_client(tmp_path: Path, s3_url: str) -> None:
    spec = s3_cluster_spec(s3_url)
    del spec["listeners"], spec["security"]  # the defaults are what is tested
    with KubeletHarness(tmp_path) as k8s:
        k8s.create_cluster("demo", spec)
        cluster = k8s.wait_ready("demo", brokers=1)
        assert cluster["metadata"]["annotations"]["automq.io/security-defaults"] == "secure"
        assert cluster["status"]["listeners"] == [
            {
                "name": "INTERNAL",
                "type": "internal",
                "securityProtocol": "SASL_SSL",
                "saslMechanism": "SCRAM-SHA-512",
                "service": "demo-bootstrap",
                "bootstrapServers": f"demo-bootstrap.{k8s.namespace}.svc:9092",
                "caSecret": "demo-cluster-ca-cert",
            }
        ]
        broker_yaml = k8s.get("ConfigMap", "demo-config")["data"]["broker.yaml"]
        assert "security_protocol: SASL_SSL" in broker_yaml

        k8s.create_user("alice", {"cluster": "demo", "authentication": {"type": "scram-sha-512"}})
        creds = k8s.wait_for("alice's Secret", lambda: _secret(k8s, "alice").get("password"))
        ca = tmp_path / "ca.crt"
        ca.write_text(_secret(k8s, "demo-cluster-ca-cert")["ca.crt"])
        bootstrap = k8s.bootstrap("demo", port=9092)
        topic = f"secure-{uuid.uuid4().hex[:6]}"

        producer = Producer(_client(bootstrap, ca, "alice", creds, acks="all", **{"enable.idempotence": "true"}))
        for i in range(50):
            producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
        assert producer.flush(60) == 0
        consumer = Consumer(
            _client(bootstrap, ca, "alice", creds, **{"group.id": "g", "auto.offset.reset": "earliest"})
        )
        consumer.subscribe([topic])
        got: list[bytes] = []
        k8s.wait_for("records read back", lambda: _poll(consumer, got) >= 50, timeout=60)
        consumer.close()
        assert sorted(got, key=lambda v: int(v[1:])) == [f"v{i}".encode() for i in range(50)]

        # Refusals: wrong password, no TLS, an untrusted CA (the system store).
        assert "Authentication failed" in _refused(_client(bootstrap, ca, "alice", "wrong"))
        plaintext = _refused({"bootstrap.servers": bootstrap})  # plaintext against the TLS port
        assert "_ALL_BROKERS_DOWN" in plaintext or "_TRANSPORT" in plaintext, plaintext
        untrusted = _client(bootstrap, ca, "alice", creds)
        del untrusted["ssl.ca.location"]
        assert "certificate verify failed" in _refused(untrusted)

        # A renewed certificate is served without a restart: a new name in the spec makes the
        # operator re-issue it, the kubelet updates the mounted Secret, the broker re-reads it.
        before = _served_certificate(bootstrap, ca)
        pid = k8s.pod_process("demo-broker-0").pid
        k8s.patch_spec("demo", {"security": {"certificates": {"extraDnsNames": ["kafka.example.com"]}}})
        renewed = k8s.wait_for(
            "the broker to serve the re-issued certificate",
            lambda: (c := _served_certificate(bootstrap, ca)).serial_number != before.serial_number and c,
            timeout=90,
        )
        assert "kafka.example.com" in renewed.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value.get_values_for_type(x509.DNSName)
        assert k8s.pod_process("demo-broker-0").pid == pid and k8s.pod_process("demo-broker-0").restarts == 0
        after = Producer(_client(bootstrap, ca, "alice", creds, acks="all"))
        after.produce(topic, value=b"after-renewal")
        assert after.flush(30) == 0

        # The controller API is https with a certificate of the cluster CA (the broker registered
        # over it, verifying that CA) and wants the cluster's token; the operator and the broker
        # have both.
        url = k8s.controller_urls("demo")[0]
        assert url.startswith("https://") and "https://demo-controller-0." in broker_yaml
        controller_ca = _secret(k8s, "demo-controller-certs")["ca.crt"]
        assert controller_ca == _secret(k8s, "demo-cluster-ca-cert")["ca.crt"]
        trusting = ssl.create_default_context(cadata=controller_ca)
        trusting.check_hostname = False  # loopback IP; the names are checked in tests/operator/test_security.py
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"{url}/v1/status", timeout=5, context=trusting)
        assert denied.value.code == 401
        assert json.loads(denied.value.read())  # the refusal names itself
        token = _secret(k8s, "demo-controller-token")["token"]
        request = urllib.request.Request(f"{url}/readyz")
        assert urllib.request.urlopen(request, timeout=5, context=trusting).status == 200  # probes stay open
        authorized = urllib.request.Request(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"})
        assert urllib.request.urlopen(authorized, timeout=5, context=trusting).status == 200
        assert token and token not in broker_yaml  # the token is a mounted file, not config
        # Plain http gets a clear refusal, nothing in clear text; a caller trusting another CA
        # (here: the system store) fails the handshake.
        with pytest.raises(urllib.error.HTTPError) as plain:
            urllib.request.urlopen(url.replace("https://", "http://") + "/readyz", timeout=5)
        assert plain.value.code == 400 and "https only" in plain.value.read().decode()
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(f"{url}/readyz", timeout=5)


def _served_certificate(bootstrap: str, ca: Path) -> x509.Certificate:
    """The certificate the broker presents to a new TLS connection now."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False  # the harness's loopback IP is not one of the pod's names
    with socket.create_connection((host, int(port)), timeout=5) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _poll(consumer: Consumer, got: list[bytes]) -> int:
    msg = consumer.poll(1.0)
    if msg is not None and msg.error() is None:
        got.append(msg.value())
    return len(got)


def test_tls_user_gets_a_client_certificate_whose_principal_the_acls_name(tmp_path: Path, s3_url: str) -> None:
    """AutoMQUser authentication tls: a certificate from the clients CA; on the client-certificate
    listener the broker maps it to User:<name>, so the user's ACLs apply (authorizer on)."""
    spec = s3_cluster_spec(
        s3_url,
        listeners=[
            {"name": "INTERNAL", "port": 9092, "tls": True, "authentication": {"type": "scram-sha-512"}},
            {"name": "MTLS", "port": 9093, "tls": True, "authentication": {"type": "tls"}},
        ],
        config={"kafka.authorizer_class_name": "standard"},
    )
    del spec["security"]
    with KubeletHarness(tmp_path) as k8s:
        k8s.create_cluster("sec", spec)
        k8s.wait_ready("sec", brokers=1)
        k8s.create_user(
            "alice",
            {
                "cluster": "sec",
                "authentication": {"type": "tls"},
                "authorization": {
                    "acls": [
                        {"resource": {"type": "topic", "name": "orders"}, "operations": ["All"]},
                        {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"]},
                    ]
                },
            },
        )
        secret = k8s.wait_for(
            "alice's certificate", lambda: _secret(k8s, "alice").get("user.crt") and _secret(k8s, "alice")
        )
        assert "CN=alice" in k8s.wait_for(
            "status", lambda: (k8s.get("AutoMQUser", "alice") or {}).get("status", {}).get("principal") and "CN=alice"
        )
        for key in ("user.crt", "user.key", "ca.crt"):
            (tmp_path / key).write_text(secret[key])
        mtls = {
            "bootstrap.servers": k8s.bootstrap("sec", port=9093),
            "security.protocol": "SSL",
            "ssl.ca.location": str(tmp_path / "ca.crt"),
            "ssl.certificate.location": str(tmp_path / "user.crt"),
            "ssl.key.location": str(tmp_path / "user.key"),
            "ssl.endpoint.identification.algorithm": "none",
        }
        acked: list[str] = []
        producer = Producer({**mtls, "acks": "all", "enable.idempotence": "true", "allow.auto.create.topics": "true"})
        for i in range(20):
            producer.produce("orders", value=f"o{i}".encode(), on_delivery=lambda err, msg: acked.append(str(err)))
        producer.flush(60)
        assert acked == ["None"] * 20  # User:alice may write orders

        denied: list[str] = []
        other = Producer({**mtls, "acks": "all", "message.timeout.ms": "10000"})
        other.produce("payroll", value=b"x", on_delivery=lambda err, msg: denied.append(str(err)))
        other.flush(30)
        assert len(denied) == 1 and "TOPIC_AUTHORIZATION_FAILED" in denied[0], denied

        # No certificate on that listener (ssl_client_auth: required, though INTERNAL next to it
        # is SASL_SSL): refused at the handshake, so nothing is written, not even as ANONYMOUS.
        anonymous: list[str] = []
        errors: list[str] = []
        without_cert = {k: v for k, v in mtls.items() if k not in ("ssl.certificate.location", "ssl.key.location")}
        anon = Producer({**without_cert, "message.timeout.ms": "5000", "error_cb": lambda e: errors.append(str(e))})
        anon.produce("orders", value=b"x", on_delivery=lambda err, msg: anonymous.append(str(err)))
        anon.flush(30)
        assert len(anonymous) == 1 and "_MSG_TIMED_OUT" in anonymous[0], anonymous
        assert errors, "librdkafka reported no connection failure"


def test_transactions_across_brokers_with_broker_to_broker_authentication(tmp_path: Path, s3_url: str) -> None:
    """Secure defaults with two brokers and an ACL authorizer: transaction markers to the other
    broker go over the SASL_SSL listener as the brokers' own SCRAM user (stored by the operator,
    a super user), so a transaction spanning both brokers commits."""
    spec = s3_cluster_spec(
        s3_url,
        brokers=2,
        config={
            "kafka.authorizer_class_name": "standard",
            "kafka.super_users": "User:alice",
            # The harness advertises loopback IPs, which the certificate does not name (pods are
            # reached by their DNS names, which it does: tests/operator/test_security.py).
            "tls.endpoint_identification_algorithm": "",
        },
    )
    del spec["listeners"], spec["security"]
    with KubeletHarness(tmp_path) as k8s:
        k8s.create_cluster("txn", spec)
        k8s.wait_ready("txn", brokers=2)
        broker_yaml = k8s.get("ConfigMap", "txn-config")["data"]["broker.yaml"]
        assert "inter_broker_listener_name: INTERNAL" in broker_yaml and "9091" not in broker_yaml
        k8s.create_user("alice", {"cluster": "txn", "authentication": {"type": "scram-sha-512"}})
        password = k8s.wait_for("alice's Secret", lambda: _secret(k8s, "alice").get("password"))
        ca = tmp_path / "ca.crt"
        ca.write_text(_secret(k8s, "txn-cluster-ca-cert")["ca.crt"])
        bootstrap = k8s.bootstrap("txn", port=9092)
        client = _client(bootstrap, ca, "alice", password)

        admin = AdminClient(client)
        admin.create_topics([NewTopic("ledger", 2, 1)])["ledger"].result(30)
        leaders = k8s.wait_for(
            "both partitions led",
            lambda: (
                (
                    len(
                        {p.leader for p in admin.list_topics("ledger", timeout=10).topics["ledger"].partitions.values()}
                        - {-1}
                    )
                    == 2
                )
                and {
                    p.id: p.leader for p in admin.list_topics("ledger", timeout=10).topics["ledger"].partitions.values()
                }
            ),
        )
        assert set(leaders.values()) == {0, 1}, leaders  # one partition on each broker

        producer = Producer({**client, "transactional.id": "ledger-writer"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for partition in (0, 1):
            producer.produce("ledger", value=f"entry-{partition}".encode(), partition=partition)
        producer.commit_transaction(60)  # answered once both partitions hold the COMMIT marker

        consumer = Consumer({**client, "group.id": "auditors", "isolation.level": "read_committed"})
        consumer.assign([TopicPartition("ledger", p, 0) for p in (0, 1)])
        got: list[bytes] = []
        k8s.wait_for("committed entries", lambda: _poll(consumer, got) >= 2, timeout=60)
        consumer.close()
        assert sorted(got) == [b"entry-0", b"entry-1"]
        stored = k8s.get("Secret", "txn-broker-credentials")
        assert stored is not None and "inter-broker.jaas" in stored["data"]


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(key: rsa.RSAPrivateKey, kid: str, audience: str = "kafka") -> tuple[str, float]:
    now = int(time.time())
    claims = {"sub": "svc-orders", "iss": "https://idp.test", "aud": audience, "iat": now, "exp": now + 600}
    head = f"{_b64url(json.dumps({'alg': 'RS256', 'kid': kid}).encode())}.{_b64url(json.dumps(claims).encode())}"
    return f"{head}.{_b64url(key.sign(head.encode(), padding.PKCS1v15(), hashes.SHA256()))}", float(claims["exp"])


def _jwks(key: rsa.RSAPrivateKey, kid: str) -> str:
    n = key.public_key().public_numbers().n
    return json.dumps(
        {"keys": [{"kty": "RSA", "kid": kid, "n": _b64url(n.to_bytes((n.bit_length() + 7) // 8, "big")), "e": "AQAB"}]}
    )


def test_oauthbearer_listener_with_keys_from_a_secret(tmp_path: Path, s3_url: str) -> None:
    """An OAUTHBEARER listener: the operator mounts the identity provider's JWKS Secret; a
    librdkafka client with RS256 tokens produces, tokens for another audience or signed by an
    unknown key fail, and rotated keys in the Secret take effect without a restart."""
    first, second = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2))
    spec = s3_cluster_spec(
        s3_url,
        listeners=[
            {
                "name": "OAUTH",
                "port": 9092,
                "tls": True,
                "authentication": {
                    "type": "oauthbearer",
                    "jwksSecret": {"name": "idp-keys"},
                    "expectedIssuer": "https://idp.test",
                    "expectedAudience": "kafka",
                },
            }
        ],
    )
    with KubeletHarness(tmp_path) as k8s:
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "idp-keys", "namespace": k8s.namespace},
            "data": {"jwks.json": base64.b64encode(_jwks(first, "k1").encode()).decode()},
        }
        k8s.call(k8s.api.create(secret))
        k8s.create_cluster("idp", spec)
        k8s.wait_ready("idp", brokers=1)
        ca = tmp_path / "ca.crt"
        ca.write_text(_secret(k8s, "idp-cluster-ca-cert")["ca.crt"])
        bootstrap = k8s.bootstrap("idp", port=9092)

        def client(make_token: Any) -> dict[str, Any]:
            return {
                "bootstrap.servers": bootstrap,
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "OAUTHBEARER",
                "oauth_cb": lambda _config: make_token(),
                "ssl.ca.location": str(ca),
                "ssl.endpoint.identification.algorithm": "none",
            }

        producer = Producer({**client(lambda: _jwt(first, "k1")), "acks": "all"})
        producer.produce("tokens", b"signed")
        assert producer.flush(60) == 0
        assert "is not in aud" in _refused(client(lambda: _jwt(first, "k1", audience="other")))
        assert "_AUTHENTICATION" in _refused(client(lambda: _jwt(second, "k2")))  # key not in the JWKS yet

        # The provider rotates its keys: the Secret changes, the broker (same process) follows.
        pid = k8s.pod_process("idp-broker-0").pid
        rotated = {"data": {"jwks.json": base64.b64encode(_jwks(second, "k2").encode()).decode()}}
        k8s.call(k8s.api.patch("Secret", k8s.namespace, "idp-keys", rotated))

        def rotated_key_works() -> bool:
            fresh = Producer({**client(lambda: _jwt(second, "k2")), "acks": "all", "message.timeout.ms": "5000"})
            fresh.produce("tokens", b"rotated")
            return fresh.flush(10) == 0

        k8s.wait_for("a token of the rotated key accepted", rotated_key_works, timeout=90)
        assert k8s.pod_process("idp-broker-0").pid == pid
