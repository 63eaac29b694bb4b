"""An AutoMQUser's SCRAM credentials work for a real client: the operator's credential step
(operator/users.py) runs against the secured cluster's controller (token + https, as in
production), writes the Secret, and confluent-kafka logs in with the Secret's password."""

from __future__ import annotations

import asyncio
import base64
import copy
import time
from typing import Any

from confluent_kafka import KafkaError, Producer
from conftest import CONTROLLER_TOKEN

from automq.operator import users
from automq.operator.controller_api import ControllerClientApi
from automq.operator.user_spec import parse_user_spec


class SecretStore:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.objects[(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        return obj

    async def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        obj = self.objects[(kind, namespace, name)]
        obj.setdefault("data", {}).update(patch.get("data", {}))
        return obj


def test_operator_made_scram_user_logs_in(secure_cluster, pki, tmp_path, monkeypatch) -> None:
    token = tmp_path / "token"
    token.write_text(CONTROLLER_TOKEN)
    monkeypatch.setenv("AUTOMQ_CONTROLLER_TOKEN_FILE", str(token))
    monkeypatch.setenv("AUTOMQ_CONTROLLER_CA_FILE", str(pki.ca.path))
    kube = SecretStore()
    spec = parse_user_spec({"cluster": "demo", "authentication": {"type": "scram-sha-512"}})

    async def run() -> None:
        api = ControllerClientApi([secure_cluster.controller.url])
        try:
            await users.sync_credentials(api, kube, "erin", "ns", "uid-erin", spec, "bootstrap:9092")
        finally:
            await api.close()

    asyncio.run(run())
    data = kube.objects[("Secret", "ns", "erin")]["data"]
    password = base64.b64decode(data["password"]).decode()

    def login(secret: str) -> tuple[list, list[int]]:
        """(delivery results, error codes the client reported). A refused login is reported
        through error_cb at once; waiting for the delivery to fail would take message.timeout.ms."""
        results: list = []
        errors: list[KafkaError] = []
        p = Producer(
            {
                "bootstrap.servers": secure_cluster.bootstrap("SASL"),
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "erin",
                "sasl.password": secret,
                "message.timeout.ms": 10_000,
                "error_cb": errors.append,
            }
        )
        p.produce("erin-topic", b"hello", on_delivery=lambda err, msg: results.append(err))
        deadline = time.monotonic() + 20
        while not results and time.monotonic() < deadline:
            if any(e.code() == KafkaError._AUTHENTICATION for e in errors):
                break
            p.poll(0.1)
        return results, [e.code() for e in errors]

    assert login(password)[0] == [None]
    results, codes = login(password + "x")
    # the stored credential is the Secret's password, not any password: refused, nothing delivered
    assert KafkaError._AUTHENTICATION in codes, codes
    assert None not in results, results
