"""AutoMQUser: the spec model, the ACLs and quotas it asks for, the generated CRD, and the
reconcile against a real controller (HTTP server, file:// object store): create, change,
drift (an ACL added by hand for the managed principal is removed), delete."""

from __future__ import annotations

import base64
import copy
from types import SimpleNamespace
from typing import Any

import kopf
import kubernetes_validate
import pytest
import yaml

from automq.broker.config import NodeConfig
from automq.broker.controller.acls import (
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.process import ControllerService
from automq.operator import users
from automq.operator.controller_api import ControllerClientApi
from automq.operator.user_crd import USER_CRD_FILE, build_user_crd, render_user_crd
from automq.operator.user_spec import InvalidUserSpec, desired_acls, desired_quotas, parse_user_spec, quota_ops

SPEC = {
    "cluster": "demo",
    "authorization": {
        "acls": [
            {"resource": {"type": "topic", "name": "orders", "patternType": "prefix"}, "operations": ["Read", "Write"]},
            {"resource": {"type": "group", "name": "billing"}, "operations": ["Read"]},
            {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"]},
            {"resource": {"type": "topic", "name": "orders-secret"}, "operations": ["All"], "type": "deny"},
            {"resource": {"type": "transactionalId", "name": "tx-"}, "operations": ["Write"], "host": "10.0.0.7"},
        ]
    },
    "quotas": {"producerByteRate": 1048576, "requestPercentage": 50},
}


def b(rtype, name, op, perm=PermissionType.ALLOW, pattern=PatternType.LITERAL, host="*", user="alice") -> AclBinding:
    return AclBinding(int(rtype), name, int(pattern), f"User:{user}", host, int(op), int(perm))


def test_spec_to_bindings_and_quotas() -> None:
    spec = parse_user_spec(SPEC)
    assert desired_acls("alice", spec) == {
        b(ResourceType.TOPIC, "orders", AclOperation.READ, pattern=PatternType.PREFIXED),
        b(ResourceType.TOPIC, "orders", AclOperation.WRITE, pattern=PatternType.PREFIXED),
        b(ResourceType.GROUP, "billing", AclOperation.READ),
        b(ResourceType.CLUSTER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE),
        b(ResourceType.TOPIC, "orders-secret", AclOperation.ALL, PermissionType.DENY),
        b(ResourceType.TRANSACTIONAL_ID, "tx-", AclOperation.WRITE, host="10.0.0.7"),
    }
    assert desired_quotas(spec) == {"producer_byte_rate": 1048576.0, "request_percentage": 50.0}
    assert quota_ops({"producer_byte_rate": 1.0, "consumer_byte_rate": 2.0}, {"producer_byte_rate": 1.0}) == {
        "consumer_byte_rate": None
    }


@pytest.mark.parametrize(
    ("raw", "mentions"),
    [
        ({}, "spec.cluster"),
        ({"cluster": "Bad_Name"}, "spec.cluster"),
        (
            {"cluster": "c", "authorization": {"acls": [{"resource": {"type": "topic"}, "operations": []}]}},
            "operations",
        ),
        ({"cluster": "c", "authorization": {"acls": [{"resource": {"type": "user"}, "operations": ["Read"]}]}}, "type"),
        (
            {"cluster": "c", "authorization": {"acls": [{"resource": {"type": "topic"}, "operations": ["Fly"]}]}},
            "operations",
        ),
        (
            {
                "cluster": "c",
                "authorization": {
                    "acls": [
                        {"resource": {"type": "topic", "name": "*", "patternType": "prefix"}, "operations": ["Read"]}
                    ]
                },
            },
            "prefix",
        ),
        ({"cluster": "c", "quotas": {"producerByteRate": 0}}, "producerByteRate"),
        ({"cluster": "c", "quotas": {"bogus": 1}}, "unknown field"),
    ],
)
def test_invalid_specs_name_the_field(raw: dict, mentions: str) -> None:
    with pytest.raises(InvalidUserSpec) as exc:
        parse_user_spec(raw)
    assert mentions in str(exc.value)


def test_committed_user_crd_is_generated_and_valid() -> None:
    assert USER_CRD_FILE.read_text() == render_user_crd(), "run `python -m automq.operator.crd`"
    kubernetes_validate.validate(yaml.safe_load(USER_CRD_FILE.read_text()), "1.35", strict=True)
    crd = build_user_crd()
    assert crd["spec"]["names"]["kind"] == "AutoMQUser" and crd["spec"]["versions"][0]["subresources"] == {"status": {}}


@pytest.fixture
async def controller(file_url: str):
    svc = ControllerService(
        NodeConfig(node_id=0, object_store_url=file_url, http_host="127.0.0.1", http_port=0, listeners=[])
    )
    await svc.start()
    await svc.controller.wait_leader(10)
    yield svc
    await svc.stop()


class FakeKube:
    """Get, create and merge-patch of whole objects, as the Kubernetes API does for them."""

    def __init__(self, objects: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        self.objects = objects
        self.writes: list[str] = []

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        assert key not in self.objects
        self.objects[key] = copy.deepcopy(obj)
        self.writes.append(f"create {key}")
        return obj

    async def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        obj = self.objects[(kind, namespace, name)]
        for k, v in patch.get("data", {}).items():
            obj.setdefault("data", {})[k] = v
        self.writes.append(f"patch {kind}/{name} {sorted(patch.get('data', {}))}")
        return obj


def memo_for(url: str, clusters: dict[str, Any]) -> SimpleNamespace:
    kube = FakeKube({("AutoMQCluster", "ns", name): body for name, body in clusters.items()})
    ctx = SimpleNamespace(
        is_leader=lambda: True,
        kube=lambda: kube,
        controller_api_factory=lambda urls, auth=None: ControllerClientApi([url], auth=auth),
    )
    return SimpleNamespace(automq=ctx, kube=kube)


async def test_reconcile_create_change_drift_and_delete(controller: ControllerService) -> None:
    client = ControllerClient([controller.url], retry_deadline_s=5)
    memo = memo_for(
        controller.url, {"demo": {"metadata": {"uid": "u1"}, "spec": {"objectStore": {"bucket": "automq-data"}}}}
    )

    async def state() -> tuple[set[AclBinding], dict]:
        image = await client.watch_metadata(-1, 0)
        quotas = {q.entity: q.values for q in image.client_quotas}
        return {a for a in image.acls if a.principal == "User:alice"}, quotas.get((("user", "alice"),), {})

    # an ACL of another principal is never touched
    other = b(ResourceType.TOPIC, "x", AclOperation.READ, user="bob")
    await client.create_acls([other])

    patch = SimpleNamespace(status={})
    await users.reconcile_user(SPEC, "alice", "ns", {"generation": 1}, patch, memo, None)
    acls, quotas = await state()
    assert acls == desired_acls("alice", parse_user_spec(SPEC))
    assert quotas == {"producer_byte_rate": 1048576.0, "request_percentage": 50.0}
    assert patch.status["acls"] == 6 and patch.status["conditions"][0]["status"] == "True"
    assert patch.status["principal"] == "User:alice" and patch.status["observedGeneration"] == 1

    # drift: someone adds an ACL for the managed principal through the Kafka API
    rogue = b(ResourceType.TOPIC, "*", AclOperation.ALL)
    await client.create_acls([rogue])
    changed = {
        "cluster": "demo",
        "authorization": {"acls": [{"resource": {"type": "group", "name": "billing"}, "operations": ["Read"]}]},
        "quotas": {"consumerByteRate": 2048},
    }
    patch = SimpleNamespace(status={})
    await users.reconcile_user(changed, "alice", "ns", {"generation": 2}, patch, memo, None)
    acls, quotas = await state()
    assert acls == {b(ResourceType.GROUP, "billing", AclOperation.READ)}
    assert quotas == {"consumer_byte_rate": 2048.0}

    # an unchanged user changes nothing
    api = ControllerClientApi([controller.url])
    outcome = await users.sync_user(api, "alice", parse_user_spec(changed))
    await api.close()
    assert (outcome.created, outcome.deleted, outcome.quota_changes) == (0, 0, 0)

    await users.delete_user(changed, "alice", "ns", memo, None)
    acls, quotas = await state()
    assert acls == set() and quotas == {}
    image = await client.watch_metadata(-1, 0)
    assert other in image.acls
    await client.close()


async def test_invalid_spec_and_missing_cluster() -> None:
    memo = memo_for("http://127.0.0.1:1", {})
    patch = SimpleNamespace(status={})
    with pytest.raises(kopf.PermanentError):
        await users.reconcile_user({"cluster": "demo", "quotas": {"x": 1}}, "alice", "ns", {}, patch, memo, None)
    assert patch.status["conditions"][0]["reason"] == "InvalidSpec"
    patch = SimpleNamespace(status={})
    with pytest.raises(kopf.TemporaryError):
        await users.reconcile_user({"cluster": "demo"}, "alice", "ns", {}, patch, memo, None)
    assert patch.status["conditions"][0]["reason"] == "ClusterNotFound"
    # deleting a user whose cluster is gone succeeds at once
    await users.delete_user({"cluster": "demo"}, "alice", "ns", memo, None)


async def test_scram_credentials_secret_and_rotation_of_mechanism(controller: ControllerService) -> None:
    from automq.broker.security.scram import password_matches
    from automq.operator.users import _credential

    client = ControllerClient([controller.url], retry_deadline_s=5)
    memo = memo_for(
        controller.url, {"demo": {"metadata": {"uid": "u1"}, "spec": {"objectStore": {"bucket": "automq-data"}}}}
    )
    kube = memo.kube
    meta = {"generation": 1, "uid": "user-uid"}
    spec = {"cluster": "demo", "authentication": {"type": "scram-sha-512"}}

    async def creds() -> dict[str, Any]:
        image = await client.watch_metadata(-1, 0)
        return {c.mechanism: c for c in image.scram_credentials if c.user == "carol"}

    def secret() -> dict[str, str]:
        obj = kube.objects[("Secret", "ns", "carol")]
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "user-uid"
        return {k: base64.b64decode(v).decode() for k, v in obj["data"].items()}

    patch = SimpleNamespace(status={})
    await users.reconcile_user(spec, "carol", "ns", meta, patch, memo, None)
    data = secret()
    assert data["username"] == "carol" and data["mechanism"] == "SCRAM-SHA-512" and len(data["password"]) >= 24
    assert data["bootstrap"].endswith(":9092") and f'password="{data["password"]}"' in data["sasl.jaas.config"]
    stored = await creds()
    assert list(stored) == ["SCRAM-SHA-512"] and password_matches(
        _credential(stored["SCRAM-SHA-512"]), data["password"]
    )
    assert patch.status["secret"] == "carol"

    # a second pass keeps the password and the credential (same salt)
    await users.reconcile_user(spec, "carol", "ns", meta, SimpleNamespace(status={}), memo, None)
    assert secret()["password"] == data["password"]
    assert (await creds())["SCRAM-SHA-512"].salt == stored["SCRAM-SHA-512"].salt
    assert kube.writes == ["create ('Secret', 'ns', 'carol')"]

    # another mechanism: the old credential goes, the same password gets the new one
    spec256 = {"cluster": "demo", "authentication": {"type": "scram-sha-256"}}
    await users.reconcile_user(spec256, "carol", "ns", meta, SimpleNamespace(status={}), memo, None)
    stored = await creds()
    assert list(stored) == ["SCRAM-SHA-256"] and password_matches(
        _credential(stored["SCRAM-SHA-256"]), data["password"]
    )
    assert secret()["mechanism"] == "SCRAM-SHA-256"

    # without authentication the credentials are removed (the Secret stays until its owner goes)
    await users.reconcile_user({"cluster": "demo"}, "carol", "ns", meta, SimpleNamespace(status={}), memo, None)
    assert await creds() == {}

    # a Secret of that name that is not this user's is never taken over
    kube.objects[("Secret", "ns", "dave")] = {"metadata": {"name": "dave"}, "data": {}}
    patch = SimpleNamespace(status={})
    with pytest.raises(kopf.TemporaryError):
        await users.reconcile_user(spec, "dave", "ns", {"uid": "dave-uid"}, patch, memo, None)
    assert patch.status["conditions"][0]["reason"] == "SecretConflict"

    await users.reconcile_user(spec, "carol", "ns", meta, SimpleNamespace(status={}), memo, None)
    assert list(await creds()) == ["SCRAM-SHA-512"]
    await users.delete_user(spec, "carol", "ns", memo, None)
    assert await creds() == {}
    await client.close()
