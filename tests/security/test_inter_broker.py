"""The project's own Kafka client (`automq.broker.kafka.client`) over TLS and SASL: what the
transaction marker channel and the balancer / admin CLIs use to reach brokers.

Against the shared secured broker (tests/security/conftest.py): PLAIN and SCRAM over
SASL_PLAINTEXT and SASL_SSL, mutual TLS; wrong passwords, an untrusted certificate, a server
that cannot prove it knows the SCRAM key and a mechanism the broker does not offer each fail
with a clear error, and the connection works again afterwards. Unit tests of the SCRAM client
against the broker's SCRAM server, of the JAAS and client-properties parsers and of the
inter-broker listener choice."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys

import pytest
from conftest import USERS, ThreadedCluster, secure_configs
from kio.schema.errors import ErrorCode

from automq.broker.config import ConfigError, parse_config
from automq.broker.kafka.client import BrokerConnection, KafkaClientError
from automq.broker.security import client, scram

# ---------------------------------------------------------------- SCRAM client (no I/O)


def _exchange(client_password: str, server_password: str = "pw", mechanism: str = "SCRAM-SHA-512"):
    credential = scram.make_credential(mechanism, server_password, iterations=4096)
    server = scram.ScramServer(mechanism, lambda user: credential if user == "u,=1" else None)
    c = scram.ScramClient(mechanism, "u,=1", client_password)
    server_first = server.step(c.first())
    server_final = server.step(c.final(server_first))
    c.verify(server_final)
    return server


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_client_completes_against_the_broker_server(mechanism):
    server = _exchange("pw", mechanism=mechanism)
    assert server.complete and server.username == "u,=1"  # user name escaping (=2C, =3D) round-trips


def test_scram_client_wrong_password_and_forged_server():
    with pytest.raises(scram.SaslAuthenticationError):
        _exchange("wrong")
    c = scram.ScramClient("SCRAM-SHA-256", "u", "pw", nonce="abc")
    with pytest.raises(scram.SaslAuthenticationError, match="nonce"):
        c.final(b"r=xyz123,s=" + base64.b64encode(b"salt") + b",i=4096")  # not our nonce
    with pytest.raises(scram.SaslAuthenticationError, match="iteration"):
        c.final(b"r=abcdef,s=" + base64.b64encode(b"salt") + b",i=1")
    c.final(b"r=abcdef,s=" + base64.b64encode(b"salt") + b",i=4096")
    with pytest.raises(scram.SaslAuthenticationError, match="signature"):
        c.verify(b"v=" + base64.b64encode(b"x" * 32))  # a server that does not know the key
    with pytest.raises(scram.SaslAuthenticationError, match="refused"):
        c.verify(b"e=invalid-proof")


# ---------------------------------------------------------------- settings


def test_jaas_and_client_properties(tmp_path):
    user, password = client.parse_jaas(
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="p\\"w";',
        "x",
    )
    assert (user, password) == ("broker", 'p"w')
    with pytest.raises(ConfigError, match="username"):
        client.parse_jaas('org.apache.kafka.common.security.plain.PlainLoginModule required username="a";', "x")
    with pytest.raises(ConfigError, match="LoginModule"):
        client.parse_jaas('username="a" password="b"', "x")
    props = tmp_path / "client.properties"
    props.write_text(
        "# admin\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="a" password="b";\n'
        "ssl.ca.location=/nonexistent/ca.pem\n"
    )
    sec = client.from_properties(client.read_properties(props))
    assert sec.tls and sec.sasl and sec.sasl_mechanism == "SCRAM-SHA-512"
    assert sec.credentials is not None and sec.credentials() == ("a", "b")
    with pytest.raises(ConfigError, match="PEM"):
        client.from_properties({"security.protocol": "SSL", "ssl.truststore.location": "x.jks"})
    with pytest.raises(ConfigError, match="security.protocol"):
        client.from_properties({"security.protocol": "TLS"})
    with pytest.raises(ConfigError, match="not supported"):
        client.from_properties({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"})
    with pytest.raises(ConfigError, match="needs sasl.jaas.config"):
        client.from_properties({"security.protocol": "SASL_PLAINTEXT"})
    with pytest.raises(ConfigError, match="cannot read"):
        client.read_properties(tmp_path / "missing.properties")


def test_inter_broker_listener_choice(tmp_path):
    listeners = [
        {"name": "EXTERNAL", "port": 1, "security_protocol": "SASL_PLAINTEXT"},
        {"name": "INTERNAL", "port": 2, "security_protocol": "SASL_PLAINTEXT"},
    ]
    # no credentials: no listener can be used (the broker warns at start), none is guessed wrongly
    assert client.inter_broker_listener(parse_config({"node_id": 1, "listeners": listeners})) is None
    jaas = tmp_path / "jaas"
    jaas.write_text('x.PlainLoginModule required username="b" password="c";')
    config = parse_config(
        {
            "node_id": 1,
            "listeners": listeners,
            "kafka": {"inter_broker_listener_name": "INTERNAL"},
            "security": {"sasl_inter_broker_jaas_config_file": str(jaas), "sasl_enabled_mechanisms": ["PLAIN"]},
        }
    )
    chosen = client.inter_broker_listener(config)
    assert chosen is not None and chosen.name == "INTERNAL"
    sec = client.inter_broker(config)
    assert sec.protocol == "SASL_PLAINTEXT" and sec.sasl_mechanism == "PLAIN"
    assert sec.credentials is not None and sec.credentials() == ("b", "c")
    mixed = [{"name": "SASL", "port": 1, "security_protocol": "SASL_SSL"}, {"name": "PLAIN", "port": 2}]
    tls = {"cert_file": "c", "key_file": "k"}
    picked = client.inter_broker_listener(parse_config({"node_id": 1, "listeners": mixed, "tls": tls}))
    assert picked is not None and picked.name == "PLAIN"


# ---------------------------------------------------------------- against the secured broker


def _metadata_request():
    from kio.schema.metadata.v12.request import MetadataRequest

    return MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)


def _call(cluster, listener: str, security: client.ClientSecurity, request=None):
    async def go():
        conn = BrokerConnection("127.0.0.1", cluster.port(listener), client_id="t", security=security, timeout_s=10)
        try:
            return await conn.call(request or _metadata_request())
        finally:
            await conn.close()

    return asyncio.run(go())


def _props(pki, protocol: str, mechanism: str = "PLAIN", user: str = "alice", password: str | None = None):
    props = {"security.protocol": protocol, "ssl.ca.location": str(pki.ca.path), "sasl.mechanism": mechanism}
    props["sasl.username"], props["sasl.password"] = user, USERS[user] if password is None else password
    return client.from_properties(props)


@pytest.fixture(scope="module")
def scram_alice(secure_cluster):
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = AdminClient({"bootstrap.servers": secure_cluster.bootstrap("INTERNAL")})
    upsert = UserScramCredentialUpsertion(
        "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), USERS["alice"].encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)


@pytest.mark.parametrize(
    "listener,protocol,mechanism",
    [("SASL", "SASL_PLAINTEXT", "PLAIN"), ("SASL_TLS", "SASL_SSL", "PLAIN"), ("SASL_TLS", "SASL_SSL", "SCRAM-SHA-512")],
)
def test_client_authenticates_and_calls(secure_cluster, pki, scram_alice, listener, protocol, mechanism):
    response = _call(secure_cluster, listener, _props(pki, protocol, mechanism))
    assert [b.node_id for b in response.brokers] == [1]
    # the broker answers with the endpoint of the listener asked on: the TLS one here
    assert response.brokers[0].port == secure_cluster.port(listener)


def test_client_refusals_are_clear_and_quick(secure_cluster, pki, scram_alice):
    with pytest.raises(KafkaClientError, match="SCRAM-SHA-512 as 'alice' failed") as wrong:
        _call(secure_cluster, "SASL_TLS", _props(pki, "SASL_SSL", "SCRAM-SHA-512", password="nope"))
    assert wrong.value.code == ErrorCode.sasl_authentication_failed
    with pytest.raises(KafkaClientError, match="failed") as unknown:
        _call(secure_cluster, "SASL", _props(pki, "SASL_PLAINTEXT", "PLAIN", user="bob", password="x"))
    assert unknown.value.code == ErrorCode.sasl_authentication_failed
    # a TLS listener whose certificate the client's trust store does not know
    untrusted = client.from_properties(
        {"security.protocol": "SSL", "ssl.ca.location": str(pki.directory / "rogue-ca.pem")}
    )
    with pytest.raises(KafkaClientError, match="TLS"):
        _call(secure_cluster, "TLS", untrusted)
    # plaintext bytes to a TLS port: no answer that decodes, an error within the timeout
    with pytest.raises(KafkaClientError):
        _call(secure_cluster, "TLS", client.PLAINTEXT)
    # after all that the broker serves the next client as usual
    assert _call(secure_cluster, "SASL", _props(pki, "SASL_PLAINTEXT")).brokers


def test_mutual_tls_principal(secure_cluster, pki):
    """The broker's own certificate (what a broker presents to another on an SSL inter-broker
    listener) authenticates: DescribeCluster answers over mTLS."""
    from kio.schema.describe_cluster.v0.request import DescribeClusterRequest

    props = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca.path),
        "ssl.certificate.location": str(pki.server_cert),
        "ssl.key.location": str(pki.server_key),
    }
    r = _call(
        secure_cluster,
        "TLS",
        client.from_properties(props),
        DescribeClusterRequest(include_cluster_authorized_operations=False),
    )
    assert r.error_code == ErrorCode.none and [b.broker_id for b in r.brokers] == [1]


def test_admin_cli_with_command_config(secure_cluster, pki, scram_alice, tmp_path):
    props = tmp_path / "admin.properties"
    props.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
        f'password="{USERS["alice"]}";\nssl.ca.location={pki.ca.path}\n'
    )
    bootstrap = secure_cluster.bootstrap("SASL_TLS")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "automq.broker.cli", *args], capture_output=True, text=True, timeout=60
        )

    ok = cli("topics", "create", "cli-over-sasl-ssl", "-b", bootstrap, "--command-config", str(props))
    assert ok.returncode == 0, ok.stderr
    listed = cli("topics", "list", "-b", bootstrap, "--command-config", str(props), "-o", "json")
    assert listed.returncode == 0 and "cli-over-sasl-ssl" in listed.stdout, listed.stderr
    # without credentials on the SASL_SSL port: one line naming the problem, exit 1, no hang
    bare = cli("topics", "list", "-b", bootstrap)
    assert bare.returncode == 1 and bare.stderr.startswith("error:"), bare.stderr
    props.write_text("security.protocol=SASL_SSL\n")
    bad = cli("topics", "list", "-b", bootstrap, "--command-config", str(props))
    assert bad.returncode == 2 and "sasl.jaas.config" in bad.stderr, bad.stderr


@pytest.fixture(scope="module")
def reauth_cluster(tmp_path_factory, pki):

    tmp = tmp_path_factory.mktemp("reauth")
    controller_cfg, broker_raw = secure_configs(tmp, pki, connections_max_reauth_ms=1000)
    cluster = ThreadedCluster(controller_cfg, broker_raw).start()
    yield cluster
    cluster.stop()


def test_client_outlives_a_session_lifetime(reauth_cluster, pki):
    """KIP-368: the broker gives SASL sessions 1 s and closes a connection that goes on after
    that without re-authenticating; the client (what carries transaction markers) opens a new,
    authenticated connection itself before then, so a call after the lifetime still works."""
    import time

    security = _props(pki, "SASL_PLAINTEXT")

    async def go():
        conn = BrokerConnection("127.0.0.1", reauth_cluster.port("SASL"), client_id="t", security=security)
        try:
            first = await conn.call(_metadata_request())
            time.sleep(1.5)  # past the session's lifetime (blocking on purpose: nothing else runs here)
            second = await conn.call(_metadata_request())
            return first, second
        finally:
            await conn.close()

    first, second = asyncio.run(go())
    assert first.brokers and second.brokers


def test_rebalance_cli_with_command_config(secure_cluster, pki, scram_alice, tmp_path):
    """`automq rebalance` (the balancer's client) over SASL_SSL with --command-config: it reads
    the cluster, measures load and proposes (one broker: nothing to move)."""
    import json

    props = tmp_path / "rebalance.properties"
    props.write_text(
        f"security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=alice\nsasl.password={USERS['alice']}\n"
        f"ssl.ca.location={pki.ca.path}\n"
    )
    cli = [sys.executable, "-m", "automq.broker.cli", "rebalance", "-b", secure_cluster.bootstrap("SASL_TLS")]
    run = subprocess.run(
        [*cli, "--command-config", str(props), "--dry-run", "--interval", "0.5", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["status"] == "proposal" and report["proposal"]["moves"] == []
    # without it: the SASL_SSL port gives nothing, and the report says so
    bare = subprocess.run(
        [*cli, "--dry-run", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bare.returncode == 2 and json.loads(bare.stdout)["status"] == "unreachable", bare.stdout + bare.stderr


@pytest.fixture(scope="module")
def authorizing_cluster(tmp_path_factory, pki):

    tmp = tmp_path_factory.mktemp("inter-broker-acl")
    controller_cfg, broker_raw = secure_configs(tmp, pki)
    broker_raw["kafka"].update({"authorizer_class_name": "standard", "super_users": "User:alice"})
    cluster = ThreadedCluster(controller_cfg, broker_raw).start()
    yield cluster
    cluster.stop()


def test_inter_broker_principal_authorized_by_a_cluster_acl(authorizing_cluster, pki):
    """A broker's WriteTxnMarkers, sent as a principal that is no super user (bob), is refused
    with CLUSTER_AUTHORIZATION_FAILED until bob holds CLUSTER_ACTION on the cluster (Kafka's
    rule; `local up --secure` makes the brokers' principal a super user instead)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    from automq.broker.kafka import codec

    request_cls = codec.request_class(27, 1)
    marker = codec.nested(request_cls, "WritableTxnMarker")
    topic = codec.nested(request_cls, "WritableTxnMarkerTopic")
    request = request_cls(
        markers=(
            marker(
                producer_id=123,
                producer_epoch=0,
                transaction_result=True,
                topics=(topic(name="no-such-topic", partition_indexes=(0,)),),
                coordinator_epoch=0,
            ),
        )
    )
    bob = _props(pki, "SASL_PLAINTEXT", user="bob")

    def marker_error() -> ErrorCode:
        response = _call(authorizing_cluster, "SASL", bob, request)
        return response.markers[0].topics[0].partitions[0].error_code

    assert marker_error() == ErrorCode.cluster_authorization_failed
    admin = AdminClient(
        {
            "bootstrap.servers": authorizing_cluster.bootstrap("SASL"),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": USERS["alice"],
        }
    )
    acl = AclBinding(
        ResourceType.BROKER,
        "kafka-cluster",
        ResourcePatternType.LITERAL,
        "User:bob",
        "*",
        AclOperation.CLUSTER_ACTION,
        AclPermissionType.ALLOW,
    )
    for future in admin.create_acls([acl]).values():
        future.result(30)
    # allowed now: the marker reaches the partition check (no such topic here)
    assert marker_error() == ErrorCode.unknown_topic_or_partition
