"""The controller port mid-switch between http and https (`security.controller_plain_http`):
one port serves the API over https and in plain http, telling them apart by the first byte;
without the setting plain http gets one 400. A real ControllerService on a file store, real
aiohttp clients and the real ControllerClient."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import aiohttp
import pytest
from conftest import CONTROLLER_TOKEN
from security_pki import Pki

from automq.broker.config import ConfigError, parse_config
from automq.broker.controller.client import ControllerClient, same_scheme
from automq.broker.controller.process import ControllerService
from automq.broker.controller.protocol import ControllerAuthenticationError
from automq.broker.security.controller_auth import ControllerClientAuth, TokenFile


def _config(tmp_path: Path, pki: Pki, **security: object):
    token = tmp_path / "token"
    token.write_text(CONTROLLER_TOKEN)
    return parse_config(
        {
            "node_id": 0,
            "data_dir": str(tmp_path / "c"),
            "object_store_url": f"file://{tmp_path}/objects",
            "http_host": "127.0.0.1",
            "http_port": 0,
            "tls": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)},
            "security": {"controller_token_file": str(token), "controller_tls": True, **security},
        }
    )


async def _get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context or False)) as http:
        async with http.get(url + "/v1/status", headers=headers) as resp:
            return resp.status, await resp.text()


def test_one_port_serves_https_and_plain_http_while_switching(tmp_path: Path, pki: Pki) -> None:
    config = _config(tmp_path, pki, controller_plain_http=True)
    ca = ssl.create_default_context(cafile=str(pki.ca.path))

    async def go() -> None:
        async with ControllerService(config) as service:
            https_url = service.url
            http_url = https_url.replace("https://", "http://")
            assert https_url.startswith("https://")
            # both schemes reach the API on the one port, with the same authentication
            for url, context in ((https_url, ca), (http_url, None)):
                status, body = await _get(url, context)
                assert status == 200 and '"controller_id": 0' in body, (url, status, body)
            token = TokenFile(config.security.controller_token_file)
            async with (
                ControllerClient([http_url], auth=ControllerClientAuth(token, None), retry_deadline_s=10) as plain,
                ControllerClient([https_url], auth=ControllerClientAuth(token, ca), retry_deadline_s=10) as tls,
            ):
                assert await plain.broker_sessions() == await tls.broker_sessions()
                # Hostile bytes in clear text are now an HTTP parser's problem: aiohttp's own 400,
                # and the controller keeps serving.
                host, port = https_url.removeprefix("https://").split(":")
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(b"\x00\x01garbage\r\n\r\n")
                await writer.drain()
                assert b" 400 Bad Request" in await asyncio.wait_for(reader.read(64), 10)
                writer.close()
                # The last roll of a switch to https: the same port without plain http.
                assert service._https is not None
                service._https.plain_http = False
                status, body = await _get(http_url)
                assert status == 400 and "security.controller_tls" in body, body
                with pytest.raises(ControllerAuthenticationError, match="over https only"):
                    await ControllerClient([http_url], auth=ControllerClientAuth(token, None)).broker_sessions()
                assert (await tls.broker_sessions())["brokers"] == []

    asyncio.run(go())


def test_plain_http_alone_is_a_config_error(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(ConfigError, match="controller_plain_http only applies with security.controller_tls"):
        _config(tmp_path, pki, controller_plain_http=True, controller_tls=False)


def test_a_client_follows_the_leader_in_its_own_scheme() -> None:
    # mid-switch a leader advertises https while its clients still call http, or the reverse
    assert same_scheme("https://10.0.0.2:9093", "http://10.0.0.1:9093") == "http://10.0.0.2:9093"
    assert same_scheme("http://10.0.0.2:9093", "https://10.0.0.1:9093") == "https://10.0.0.2:9093"
    assert same_scheme("https://c-1:9093", "https://c-0:9093") == "https://c-1:9093"
    assert same_scheme("c-1:9093", "http://c-0:9093") == "c-1:9093"  # not a URL: left alone


def test_a_silent_connection_does_not_hold_up_others(tmp_path: Path, pki: Pki) -> None:
    """The listener waits for each connection's first byte on its own: one that sends nothing
    (or leaves at once) does not keep the next caller of either scheme waiting."""
    config = _config(tmp_path, pki, controller_plain_http=True)
    ca = ssl.create_default_context(cafile=str(pki.ca.path))

    async def go() -> None:
        async with ControllerService(config) as service:
            host, port = service.url.removeprefix("https://").split(":")
            with socket.create_connection((host, int(port)), timeout=5):
                pass  # connect and leave without a byte
            with socket.create_connection((host, int(port)), timeout=5):  # connected, silent
                assert (await _get(service.url.replace("https://", "http://")))[0] == 200
                assert (await _get(service.url, ca))[0] == 200

    asyncio.run(go())
