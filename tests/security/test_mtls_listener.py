"""A client-certificate listener (`ssl_client_auth: required`, Kafka's
listener.name.<name>.ssl.client.auth) stays strict next to a SASL_SSL listener of the same broker.

The broker serves MTLS (SSL, certificates required), SASL_TLS (SASL_SSL, no certificate asked)
and TLS (SSL, the `tls` section's own `requested`), all from one certificate. Real clients
(confluent-kafka, kafka-python): on MTLS a client without a certificate, or with one from a CA the
broker does not trust, is refused at the handshake and nothing it sends is served; a certificate
of the cluster's CA works; SASL_SSL clients without certificates still log in next to it; the
broker keeps serving throughout. The refused clients read the broker's TLS alert ("certificate
required", "unknown ca"), as they would from a Java broker."""

from __future__ import annotations

import logging
import ssl
import uuid

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient
from conftest import USERS, ThreadedCluster, secure_configs

from automq.broker.config import ConfigError, parse_config


@pytest.fixture(scope="module")
def mtls_cluster(tmp_path_factory, pki):
    controller_cfg, broker_raw = secure_configs(tmp_path_factory.mktemp("mtls"), pki)
    broker_raw["listeners"] = [
        *broker_raw["listeners"],
        {"name": "MTLS", "host": "127.0.0.1", "port": 0, "security_protocol": "SSL", "ssl_client_auth": "required"},
    ]
    cluster = ThreadedCluster(controller_cfg, broker_raw).start()
    yield cluster
    cluster.stop()


def _mtls(cluster, pki, cert=None, key=None) -> dict:
    conf = {
        "bootstrap.servers": cluster.bootstrap("MTLS"),
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca.path),
        "socket.timeout.ms": 5000,
    }
    if cert is not None:
        conf["ssl.certificate.location"] = str(cert)
        conf["ssl.key.location"] = str(key)
    return conf


def _errors(conf: dict) -> list[KafkaError]:
    """librdkafka's first errors for this config (error_cb, served by poll); a refused handshake
    is reported as soon as it happens, the deadline only bounds a broken test."""
    errors: list[KafkaError] = []
    producer = Producer({**conf, "error_cb": errors.append})
    for _ in range(100):
        producer.poll(0.1)
        if any(e.code() in (KafkaError._SSL, KafkaError._TRANSPORT) for e in errors):
            break
    assert errors, "no error reported"
    return errors


def test_listener_contexts_follow_each_listeners_rule(mtls_cluster) -> None:
    server = mtls_cluster.broker.server
    rules = {lst.name: server.client_auth(lst) for lst in server.config.listeners if "SSL" in lst.security_protocol}
    assert rules == {"TLS": "requested", "SASL_TLS": "requested", "MTLS": "required"}
    assert server.tls_contexts["required"].context.verify_mode == ssl.CERT_REQUIRED
    assert server.tls_contexts["requested"].context.verify_mode == ssl.CERT_OPTIONAL


@pytest.mark.parametrize("which", ["none", "rogue"])
def test_confluent_client_without_a_trusted_certificate_is_refused(mtls_cluster, pki, which) -> None:
    cert, key = (None, None) if which == "none" else (pki.rogue_cert, pki.rogue_key)
    conf = _mtls(mtls_cluster, pki, cert, key)
    errors = _errors(conf)
    # TLS 1.3: the client's side of the handshake is done before the broker checks the client's
    # certificate, so librdkafka reads the broker's alert at its first request; it names why
    alert = "certificate required" if which == "none" else "unknown ca"
    assert any(alert in e.str() for e in errors), [e.str() for e in errors]


def test_confluent_client_with_the_clusters_certificate_and_sasl_ssl_next_to_it(mtls_cluster, pki) -> None:
    topic = "mtls-" + uuid.uuid4().hex[:6]
    producer = Producer({**_mtls(mtls_cluster, pki, pki.client_cert, pki.client_key), "acks": "all"})
    delivered: list = []
    producer.produce(topic, b"with-cert", on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(30) == 0 and delivered == [None]
    # A SASL_SSL client without a certificate logs in on the other listener of the same broker.
    sasl = AdminClient(
        {
            "bootstrap.servers": mtls_cluster.bootstrap("SASL_TLS"),
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": USERS["alice"],
            "ssl.ca.location": str(pki.ca.path),
        }
    )
    assert topic in sasl.list_topics(timeout=20).topics


def test_kafka_python_client_certificates_on_the_strict_listener(mtls_cluster, pki, caplog) -> None:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError as PyKafkaError

    def context(cert=None, key=None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(pki.ca.path))
        if cert is not None:
            ctx.load_cert_chain(str(cert), str(key))
        return ctx

    conf = {"bootstrap_servers": mtls_cluster.bootstrap("MTLS"), "security_protocol": "SSL"}
    admin = KafkaAdminClient(**conf, ssl_context=context(pki.client_cert, pki.client_key))
    assert admin.list_topics() is not None
    admin.close()
    for cert, key in ((None, None), (pki.rogue_cert, pki.rogue_key)):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="kafka"), pytest.raises(PyKafkaError, match="bootstrap"):
            # kafka-python retries a refused bootstrap until this deadline; each try is dropped at once
            KafkaAdminClient(**conf, ssl_context=context(cert, key), bootstrap_timeout_ms=1000)
        alert = "CERTIFICATE_REQUIRED" if cert is None else "UNKNOWN_CA"
        assert f"ALERT_{alert}" in caplog.text, caplog.text  # the broker's alert reached the client
    # the broker stayed up and still serves a trusted client on the same listener
    admin = KafkaAdminClient(**conf, ssl_context=context(pki.client_cert, pki.client_key))
    assert admin.list_topics() is not None
    admin.close()


def test_listener_client_auth_settings_are_checked() -> None:
    base = {"node_id": 1, "data_dir": "/tmp/x", "object_store_url": "file:///tmp/x"}
    with pytest.raises(ConfigError, match=r"listeners\[PLAIN\]\.ssl_client_auth applies to SSL"):
        parse_config({**base, "listeners": [{"name": "PLAIN", "ssl_client_auth": "required"}]})
    tls = {"cert_file": "/c", "key_file": "/k"}
    with pytest.raises(ConfigError, match=r"listeners\[M\]\.ssl_client_auth=required needs tls\.ca_file"):
        parse_config(
            {
                **base,
                "tls": tls,
                "listeners": [{"name": "M", "security_protocol": "SSL", "ssl_client_auth": "required"}],
            }
        )
