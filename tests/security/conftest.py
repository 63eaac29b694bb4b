"""A secured in-process cluster (one controller, one broker) shared by a test module, run in
a background thread's event loop so blocking clients (confluent-kafka, kafka-python, kcat)
can be used straight from the tests.

Broker listeners: PLAINTEXT (internal), SASL_PLAINTEXT, SSL (client certificates requested),
SASL_SSL; SASL mechanisms PLAIN (users file), SCRAM-SHA-256/512 (controller store) and
OAUTHBEARER (unsecured tokens allowed, as a development setup would)."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from security_pki import Pki

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
CONTROLLER_TOKEN = "test-controller-token-0123456789"


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("session-pki"))


class ThreadedCluster:
    """Controller + broker services in their own loop thread."""

    def __init__(self, controller_cfg, broker_raw: dict) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="secure-cluster", daemon=True)
        self.thread.start()
        self.controller_cfg = controller_cfg
        self.broker_raw = broker_raw
        self.controller = None
        self.broker = None

    def run(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        from automq.broker.config import parse_config
        from automq.broker.controller.process import ControllerService
        from automq.broker.kafka.process import BrokerService

        self.controller = ControllerService(self.controller_cfg)
        await self.controller.start()
        self.broker = BrokerService(parse_config({**self.broker_raw, "controller_urls": [self.controller.url]}))
        await self.broker.start()

    async def _stop(self) -> None:
        if self.broker is not None:
            await self.broker.stop(timeout=5)
        if self.controller is not None:
            await self.controller.stop()

    def start(self) -> ThreadedCluster:
        self.run(self._start())
        return self

    def stop(self) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def port(self, listener: str) -> int:
        return self.broker.kafka_ports[listener]

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.port(listener)}"


def secure_configs(tmp_path: Path, pki: Pki, **security):
    import yaml

    from automq.broker.config import parse_config

    users_file = tmp_path / "plain-users.yaml"
    users_file.write_text(yaml.safe_dump(USERS))
    objects = f"file://{tmp_path}/objects"
    token_file = tmp_path / "controller-token"
    token_file.write_text(CONTROLLER_TOKEN + "\n")
    tls = {
        "cert_file": str(pki.server_cert),
        "key_file": str(pki.server_key),
        "ca_file": str(pki.ca.path),
        "client_auth": "requested",
    }
    # the control plane is authenticated (token) and encrypted (https) in this cluster
    control = {"controller_token_file": str(token_file), "controller_tls": True}
    controller = parse_config(
        {
            "node_id": 0,
            "data_dir": str(tmp_path / "c"),
            "object_store_url": objects,
            "http_host": "127.0.0.1",
            "http_port": 0,
            "tls": tls,
            "security": control,
        }
    )
    broker = {
        "node_id": 1,
        "data_dir": str(tmp_path / "b1"),
        "object_store_url": objects,
        "listeners": [
            {"name": "INTERNAL", "host": "127.0.0.1", "port": 0},
            {"name": "SASL", "host": "127.0.0.1", "port": 0, "security_protocol": "SASL_PLAINTEXT"},
            {"name": "TLS", "host": "127.0.0.1", "port": 0, "security_protocol": "SSL"},
            {"name": "SASL_TLS", "host": "127.0.0.1", "port": 0, "security_protocol": "SASL_SSL"},
        ],
        "tls": {**tls, "principal_mapping_rules": ["RULE:^CN=([^,]+),O=acme$/$1/L", "DEFAULT"]},
        "security": {
            **control,
            "sasl_enabled_mechanisms": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"],
            "sasl_plain_users_file": str(users_file),
            "sasl_oauthbearer_allow_unsecured": True,
            **security,
        },
        "http_host": "127.0.0.1",
        "http_port": 0,
        "heartbeat_interval_ms": 200,
        "wal": {"capacity": "16MiB"},
        "storage": {"log_cache_bytes": "32MiB", "block_cache_bytes": "16MiB"},
        "kafka": {"group_initial_rebalance_delay_ms": 0},
    }
    return controller, broker


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory, pki):
    tmp = tmp_path_factory.mktemp("secure")
    controller_cfg, broker_raw = secure_configs(tmp, pki)
    cluster = ThreadedCluster(controller_cfg, broker_raw).start()
    yield cluster
    cluster.stop()
