"""SASL and TLS listeners with real clients: confluent-kafka (librdkafka), kafka-python,
aiokafka and kcat produce and consume over SASL_PLAINTEXT / SASL_SSL with PLAIN,
SCRAM-SHA-256/512 and OAUTHBEARER, and over SSL with a client certificate; wrong passwords,
unknown users and untrusted certificates fail with the errors a Java broker gives."""

from __future__ import annotations

import logging
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from conftest import USERS

pytestmark = pytest.mark.slow


def _admin(cluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap("INTERNAL")})


@pytest.fixture(scope="module")
def scram_users(secure_cluster):
    """alice and bob with SCRAM-SHA-256 and -512 credentials, made through confluent-kafka's
    AdminClient (AlterUserScramCredentials) on the internal listener."""
    admin = _admin(secure_cluster)
    upserts = [
        UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 8192), password.encode())
        for user, password in USERS.items()
        for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
    ]
    for user, future in admin.alter_user_scram_credentials(upserts).items():
        future.result(timeout=30)
        assert user in USERS
    return USERS


def _security(cluster, pki, kind: str, user: str = "alice", password: str | None = None) -> dict:
    password = USERS[user] if password is None else password
    if kind == "SSL":
        return {
            "bootstrap.servers": cluster.bootstrap("TLS"),
            "security.protocol": "SSL",
            "ssl.ca.location": str(pki.ca.path),
            "ssl.certificate.location": str(pki.client_cert),
            "ssl.key.location": str(pki.client_key),
        }
    protocol, mechanism = kind.split("/")
    conf = {
        "bootstrap.servers": cluster.bootstrap("SASL" if protocol == "SASL_PLAINTEXT" else "SASL_TLS"),
        "security.protocol": protocol,
        "sasl.mechanism": mechanism,
    }
    if protocol == "SASL_SSL":
        conf["ssl.ca.location"] = str(pki.ca.path)
    if mechanism == "OAUTHBEARER":
        conf["enable.sasl.oauthbearer.unsecure.jwt"] = True
        conf["sasl.oauthbearer.config"] = f"principal={user}"
    else:
        conf["sasl.username"] = user
        conf["sasl.password"] = password
    return conf


def _produce_consume(conf: dict, topic: str, n: int = 5) -> list[bytes]:
    errors: list[KafkaError] = []
    producer = Producer({**conf, "acks": "all", "error_cb": errors.append, "linger.ms": 5})
    for i in range(n):
        producer.produce(topic, value=f"{topic}-{i}".encode())
    assert producer.flush(30) == 0, errors
    consumer = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest", "error_cb": errors.append})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    return got


CASES = [
    "SASL_PLAINTEXT/PLAIN",
    "SASL_PLAINTEXT/SCRAM-SHA-256",
    "SASL_PLAINTEXT/SCRAM-SHA-512",
    "SASL_PLAINTEXT/OAUTHBEARER",
    "SASL_SSL/PLAIN",
    "SASL_SSL/SCRAM-SHA-512",
    "SASL_SSL/OAUTHBEARER",
    "SSL",
]


@pytest.mark.parametrize("kind", CASES)
def test_confluent_produces_and_consumes(secure_cluster, pki, scram_users, kind):
    topic = "t-" + kind.replace("/", "-").lower() + "-" + uuid.uuid4().hex[:6]
    got = _produce_consume(_security(secure_cluster, pki, kind), topic)
    assert sorted(got) == sorted(f"{topic}-{i}".encode() for i in range(5))


def _auth_error(conf: dict) -> KafkaError:
    errors: list[KafkaError] = []
    admin = AdminClient({**conf, "error_cb": errors.append, "socket.connection.setup.timeout.ms": 5000})
    # The request cannot succeed, so librdkafka gives up only at the timeout: a short one, since
    # the error is then waited for on its own (authentication fails in milliseconds).
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=1)
    return _first_error(admin, errors)


def _first_error(admin: AdminClient, errors: list[KafkaError], timeout: float = 30) -> KafkaError:
    """Serves error_cb until it reported something (bounded)."""
    deadline = time.monotonic() + timeout
    while not errors and time.monotonic() < deadline:
        admin.poll(0.1)
    assert errors, "no error reported"
    return errors[0]


@pytest.mark.parametrize("kind", ["SASL_PLAINTEXT/PLAIN", "SASL_PLAINTEXT/SCRAM-SHA-256", "SASL_SSL/SCRAM-SHA-512"])
def test_wrong_password_fails_authentication(secure_cluster, pki, scram_users, kind):
    err = _auth_error(_security(secure_cluster, pki, kind, password="wrong"))
    assert err.code() == KafkaError._AUTHENTICATION, err
    assert "Authentication failed" in err.str() or "invalid credentials" in err.str(), err.str()


def test_unknown_user_fails_authentication(secure_cluster, pki, scram_users):
    conf = _security(secure_cluster, pki, "SASL_PLAINTEXT/SCRAM-SHA-512")
    conf["sasl.username"] = "nobody"
    err = _auth_error(conf)
    assert err.code() == KafkaError._AUTHENTICATION, err


def test_untrusted_client_certificate_is_refused(secure_cluster, pki):
    conf = _security(secure_cluster, pki, "SSL")
    conf["ssl.certificate.location"] = str(pki.rogue_cert)
    conf["ssl.key.location"] = str(pki.rogue_key)
    err = _auth_error(conf)
    assert err.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN), err


def test_plaintext_client_on_tls_port_fails_and_broker_stays_up(secure_cluster, pki):
    errors: list[KafkaError] = []
    admin = AdminClient(
        {
            "bootstrap.servers": secure_cluster.bootstrap("TLS"),
            "error_cb": errors.append,
            "socket.connection.setup.timeout.ms": 5000,
        }
    )
    # it never gets an answer: the short request fails, and the client reports why
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=1)
    error = _first_error(admin, errors)
    assert error.code() in (KafkaError._TRANSPORT, KafkaError._SSL, KafkaError._ALL_BROKERS_DOWN), error
    # the broker keeps serving the other listeners
    assert _admin(secure_cluster).list_topics(timeout=10).brokers


def test_admin_describes_and_deletes_scram_users(secure_cluster, pki, scram_users):
    admin = _admin(secure_cluster)
    described = admin.describe_user_scram_credentials(["alice", "nobody"])
    alice = described["alice"].result(timeout=10)
    assert sorted(i.mechanism for i in alice.scram_credential_infos) == [
        ScramMechanism.SCRAM_SHA_256,
        ScramMechanism.SCRAM_SHA_512,
    ]
    assert {i.iterations for i in alice.scram_credential_infos} == {8192}
    with pytest.raises(KafkaException) as missing:
        described["nobody"].result(timeout=10)
    assert missing.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
    # a temporary user: created, used, deleted, then refused
    temp = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"carol-pw")
    admin.alter_user_scram_credentials([temp])["carol"].result(timeout=30)
    conf = _security(secure_cluster, pki, "SASL_PLAINTEXT/SCRAM-SHA-256")
    conf.update({"sasl.username": "carol", "sasl.password": "carol-pw"})
    assert AdminClient(conf).list_topics(timeout=10).brokers
    admin.alter_user_scram_credentials([UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256)])[
        "carol"
    ].result(timeout=30)
    assert _auth_error(conf).code() == KafkaError._AUTHENTICATION
    too_few = UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"pw")
    with pytest.raises(KafkaException) as bad:
        admin.alter_user_scram_credentials([too_few])["dave"].result(timeout=10)
    assert bad.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL


def test_metadata_advertises_the_listener_asked(secure_cluster, pki, scram_users):
    for kind, listener in (("SASL_PLAINTEXT/PLAIN", "SASL"), ("SSL", "TLS"), ("SASL_SSL/PLAIN", "SASL_TLS")):
        md = AdminClient(_security(secure_cluster, pki, kind)).list_topics(timeout=10)
        assert [b.port for b in md.brokers.values()] == [secure_cluster.port(listener)]


def test_kcat_over_sasl_ssl_scram(secure_cluster, pki, scram_users):
    topic = "kcat-" + uuid.uuid4().hex[:6]
    common = [
        "kcat", "-b", secure_cluster.bootstrap("SASL_TLS"),
        "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-512",
        "-X", "sasl.username=bob", "-X", f"sasl.password={USERS['bob']}",
        "-X", f"ssl.ca.location={pki.ca.path}",
    ]  # fmt: skip
    subprocess.run([*common, "-P", "-t", topic], input=b"one\ntwo\nthree\n", check=True, timeout=60)
    out = subprocess.run(
        [*common, "-C", "-t", topic, "-o", "beginning", "-e", "-q"], capture_output=True, check=True, timeout=60
    )
    assert out.stdout.split() == [b"one", b"two", b"three"]
    bad = [a if not a.startswith("sasl.password=") else "sasl.password=nope" for a in common]
    # -m bounds kcat's metadata wait, which the refused login spends in full
    failed = subprocess.run([*bad, "-L", "-m", "4"], capture_output=True, timeout=60)
    assert failed.returncode != 0
    assert b"Authentication failed" in failed.stderr or b"authentication" in failed.stderr.lower()


def test_kafka_python_over_sasl_ssl(secure_cluster, pki, scram_users, caplog):
    import ssl

    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaError as PyKafkaError

    ctx = ssl.create_default_context(cafile=str(pki.ca.path))
    topic = "kp-" + uuid.uuid4().hex[:6]
    conf = {
        "bootstrap_servers": secure_cluster.bootstrap("SASL_TLS"),
        "security_protocol": "SASL_SSL",
        "ssl_context": ctx,
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "alice",
        "sasl_plain_password": USERS["alice"],
    }
    producer = KafkaProducer(**conf, acks="all")
    for i in range(3):
        producer.send(topic, f"m{i}".encode()).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, **conf, auto_offset_reset="earliest", consumer_timeout_ms=20_000)
    values = []
    for message in consumer:
        values.append(message.value)
        if len(values) == 3:
            break
    consumer.close()
    assert values == [b"m0", b"m1", b"m2"]
    # kafka-python keeps retrying a failed bootstrap until its deadline; what matters is that
    # each attempt is refused with SASL_AUTHENTICATION_FAILED (error 58), which it logs
    with caplog.at_level(logging.ERROR, logger="kafka"):
        bad = KafkaProducer(**{**conf, "sasl_plain_password": "wrong"}, api_version=(3, 0), max_block_ms=1000)
        with pytest.raises(PyKafkaError):
            bad.send(topic, b"never").get(timeout=5)
        # its sender keeps trying meanwhile: wait for a refused attempt rather than a longer max_block_ms
        deadline = time.monotonic() + 30
        while "SaslAuthenticationFailedError" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.1)
        bad.close(timeout=1)
    assert "SaslAuthenticationFailedError" in caplog.text


def test_aiokafka_over_sasl_plaintext(secure_cluster, pki, scram_users):
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError
    from aiokafka.errors import KafkaError as AioKafkaError

    topic = "aio-" + uuid.uuid4().hex[:6]

    async def main() -> None:
        for mechanism in ("PLAIN", "SCRAM-SHA-512"):
            conf = {
                "bootstrap_servers": secure_cluster.bootstrap("SASL"),
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": mechanism,
                "sasl_plain_username": "bob",
                "sasl_plain_password": USERS["bob"],
            }
            producer = AIOKafkaProducer(**conf, acks="all")
            await producer.start()
            await producer.send_and_wait(topic, mechanism.encode())
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, **conf, auto_offset_reset="earliest")
        await consumer.start()
        values = []
        async for msg in consumer:
            values.append(msg.value)
            if len(values) == 2:
                break
        await consumer.stop()
        assert values == [b"PLAIN", b"SCRAM-SHA-512"]
        bad = AIOKafkaProducer(**{**conf, "sasl_plain_password": "wrong"}, request_timeout_ms=8000)
        with pytest.raises((AioKafkaError, KafkaConnectionError)):
            await bad.start()
        await bad.stop()

    asyncio.run(main())
