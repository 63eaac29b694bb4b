"""The controller API refuses unauthenticated calls (item 5 of issue 15): a token from a file,
or a client certificate over https; probes and metrics stay open; the secured cluster's
broker talks to its controller over https with the token (every test in this folder runs on
such a control plane)."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import pytest
from conftest import CONTROLLER_TOKEN

from automq.broker.config import ConfigError, parse_config
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.protocol import ControllerAuthenticationError
from automq.broker.security import controller_auth
from automq.broker.security.controller_auth import ControllerClientAuth, ControllerServerAuth, TokenFile

pytestmark = pytest.mark.slow


def _call(url: str, path: str, *, method: str = "POST", headers=None, context=None, body=b"{}"):
    async def go():
        connector = aiohttp.TCPConnector(ssl=context if context is not None else False)
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.request(method, url + path, data=body, headers=headers or {}) as resp:
                return resp.status, await resp.text()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def ca_context(pki):
    return ssl.create_default_context(cafile=str(pki.ca.path))


def test_unauthenticated_calls_are_refused(secure_cluster, ca_context):
    url = secure_cluster.controller.url
    assert url.startswith("https://")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {CONTROLLER_TOKEN}"}):
        status, text = _call(url, "/v1/fence_broker", headers=headers, context=ca_context, body=b'{"node_id": 1}')
        assert status == 401 and "CONTROLLER_AUTHENTICATION_FAILED" in text, (headers, status, text)
        status, text = _call(url, "/v1/status", method="GET", headers=headers, context=ca_context)
        assert status == 401
    # the broker was not fenced by any of those
    assert secure_cluster.broker.ready
    status, text = _call(
        url, "/v1/status", method="GET", headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"}, context=ca_context
    )
    assert status == 200 and '"role":"leader"' in text.replace(" ", "")


def test_probes_and_metrics_stay_open(secure_cluster, ca_context):
    url = secure_cluster.controller.url
    for path in ("/healthz", "/readyz", "/metrics"):
        status, _ = _call(url, path, method="GET", context=ca_context)
        assert status == 200, path


def test_plain_http_to_the_tls_controller_fails(secure_cluster, ca_context, pki, monkeypatch):
    url = secure_cluster.controller.url.replace("https://", "http://")
    # nothing is served in clear text, probes included; the answer names the setting
    for path in ("/v1/status", "/healthz"):
        status, body = _call(url, path, method="GET")
        assert status == 400 and "https" in body and "security.controller_tls" in body, body
    monkeypatch.setenv(
        controller_auth.TOKEN_FILE_ENV, str(secure_cluster.controller.config.security.controller_token_file)
    )

    async def go():
        async with ControllerClient([url], retry_deadline_s=30) as client:
            # refused at once (a retry until the deadline would end in ControllerUnavailableError)
            with pytest.raises(ControllerAuthenticationError, match="over https only"):
                await client.broker_sessions()
        # and the https API is still served
        auth = ControllerClientAuth(
            TokenFile(secure_cluster.controller.config.security.controller_token_file), ca_context
        )
        async with ControllerClient([secure_cluster.controller.url], auth=auth) as client:
            assert (await client.broker_sessions())["brokers"]

    asyncio.run(go())


def test_controller_certificate_from_another_ca_is_refused_at_once(secure_cluster, pki, tmp_path):
    token = TokenFile(secure_cluster.controller.config.security.controller_token_file)
    rogue_ca = str(pki.directory / "rogue-ca.pem")

    async def go():
        auth = ControllerClientAuth(token, ssl.create_default_context(cafile=rogue_ca), rogue_ca)
        async with ControllerClient([secure_cluster.controller.url], auth=auth, retry_deadline_s=30) as client:
            with pytest.raises(ControllerAuthenticationError, match="is not trusted.*controller_ca_file"):
                await client.broker_sessions()

    asyncio.run(go())


def test_controller_ca_file_is_followed_when_it_changes(secure_cluster, pki, tmp_path, monkeypatch):
    """A node's config names the CA bundle; a CA added to the file later (rotation) is trusted
    without a restart."""
    monkeypatch.setattr(controller_auth, "CHECK_INTERVAL_S", 0.0)
    bundle = tmp_path / "controller-ca.crt"
    bundle.write_bytes((pki.directory / "rogue-ca.pem").read_bytes())
    config = parse_config(
        {
            "node_id": 7,
            "controller_urls": [secure_cluster.controller.url],
            "security": {
                "controller_ca_file": str(bundle),
                "controller_token_file": secure_cluster.controller.config.security.controller_token_file,
            },
        }
    )
    auth = ControllerClientAuth.from_config(config)
    assert auth.ssl is not None and auth.ssl.check_hostname and auth.ca_file == str(bundle)

    async def go():
        async with ControllerClient(config.controller_urls, auth=auth, retry_deadline_s=30) as client:
            with pytest.raises(ControllerAuthenticationError):
                await client.broker_sessions()
            bundle.write_bytes(bundle.read_bytes() + pki.ca.path.read_bytes())
            assert (await client.broker_sessions())["brokers"]

    asyncio.run(go())
    with pytest.raises(ConfigError, match="security.controller_ca_file"):
        ControllerClientAuth.from_config(
            config.model_copy(update={"security": config.security.model_copy(update={"controller_ca_file": "/nope"})})
        )


def test_client_certificate_authenticates_without_a_token(secure_cluster, pki):
    context = ssl.create_default_context(cafile=str(pki.ca.path))
    context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    status, _ = _call(secure_cluster.controller.url, "/v1/status", method="GET", context=context)
    assert status == 200
    rogue = ssl.create_default_context(cafile=str(pki.ca.path))
    rogue.load_cert_chain(str(pki.rogue_cert), str(pki.rogue_key))
    with pytest.raises(aiohttp.ClientError):
        _call(secure_cluster.controller.url, "/v1/status", method="GET", context=rogue)


def test_controller_client_without_the_token_fails_at_once(secure_cluster, ca_context, monkeypatch):
    monkeypatch.delenv(controller_auth.TOKEN_FILE_ENV, raising=False)

    async def go():
        async with ControllerClient(
            [secure_cluster.controller.url], auth=ControllerClientAuth(None, ca_context), retry_deadline_s=30
        ) as client:
            # refused at once: retrying until the deadline would end in ControllerUnavailableError
            with pytest.raises(ControllerAuthenticationError):
                await client.create_topic("never", 1, {})

    asyncio.run(go())


def test_token_file_rotation(tmp_path, monkeypatch):
    monkeypatch.setattr(controller_auth, "CHECK_INTERVAL_S", 0.0)
    path = tmp_path / "token"
    path.write_text("first\n")
    token = TokenFile(str(path))
    assert token.accepts("first") and not token.accepts("second")
    path.write_text("second-token\n")
    assert token.current() == "second-token"
    assert token.accepts("second-token") and token.accepts("first")  # grace for callers not yet rotated
    path.write_text("")  # a rotation caught mid-write keeps the token we have
    assert token.current() == "second-token"
    with pytest.raises(ConfigError, match="controller_token_file"):
        TokenFile(str(tmp_path / "missing"))


def test_server_auth_is_off_unless_configured(tmp_path):
    assert ControllerServerAuth.from_config(parse_config({"node_id": 0})) is None
    (tmp_path / "t").write_text("x")
    auth = ControllerServerAuth.from_config(
        parse_config({"node_id": 0, "security": {"controller_token_file": str(tmp_path / "t")}})
    )
    assert auth is not None
    assert auth.refusal("/healthz", None, None) is None
    assert auth.refusal("/v1/heartbeat", None, None) is not None
    assert auth.refusal("/v1/heartbeat", "Bearer x", None) is None


def test_hostile_bytes_on_the_https_port_leave_the_controller_serving(secure_cluster, ca_context):
    import contextlib
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(secure_cluster.controller.url)
    address = (url.hostname, url.port)

    def exchange(payload: bytes) -> bytes:
        with socket.create_connection(address, timeout=10) as sock:
            if payload:
                sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks)

    assert exchange(b"\x00\x01\x02garbage").startswith(b"HTTP/1.1 400 ")  # not TLS: one clear answer
    assert exchange(b"") == b""  # connect and leave
    with contextlib.suppress(ConnectionResetError):  # a broken ClientHello: an alert, a close
        assert not exchange(b"\x16\x03\x01\x00\x05hello").startswith(b"HTTP")
    status, _ = _call(secure_cluster.controller.url, "/readyz", method="GET", context=ca_context)
    assert status == 200


def test_schema_registry_over_https_with_the_token(secure_cluster, pki):
    """The registry the controller serves honours its TLS and token (confluent-kafka's real client)."""
    import json

    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    url = secure_cluster.controller.url
    conf = {"url": url, "ssl.ca.location": str(pki.ca.path), "max.retries": 0}
    schema = Schema(json.dumps({"type": "record", "name": "S", "fields": [{"name": "a", "type": "int"}]}), "AVRO")
    with pytest.raises(SchemaRegistryError) as refused:
        SchemaRegistryClient(conf).register_schema("secure-value", schema)
    assert (refused.value.http_status_code, refused.value.error_code) == (401, 40101)
    bearer = {
        "bearer.auth.credentials.source": "STATIC_TOKEN",
        "bearer.auth.token": CONTROLLER_TOKEN,
        "bearer.auth.logical.cluster": "automq",
    }
    schema_id = SchemaRegistryClient({**conf, **bearer}).register_schema("secure-value", schema)
    assert SchemaRegistryClient({**conf, **bearer}).get_schema(schema_id).schema_str == schema.schema_str
