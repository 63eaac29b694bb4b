"""The thin API client and idempotent apply, against the kmock emulator."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import kmock
import pytest

from automq.operator.builders import LAST_APPLIED
from automq.operator.kube import KubeApi, KubeError, apply, contains, merge_patch, without_immutable


def test_contains_tolerates_server_defaults_only() -> None:
    desired = {"spec": {"ports": [{"port": 9092}], "type": "ClusterIP"}}
    live = {
        "spec": {"ports": [{"port": 9092, "protocol": "TCP"}], "type": "ClusterIP", "clusterIP": "10.0.0.1"},
        "status": {},
    }
    assert contains(live, desired)
    assert not contains({"spec": {"ports": [{"port": 9093}], "type": "ClusterIP"}}, desired)
    assert not contains({"spec": {"ports": [], "type": "ClusterIP"}}, desired)  # list length matters
    assert not contains({"spec": "not a mapping"}, desired)


def test_merge_patch_nulls_what_was_dropped() -> None:
    last = {"metadata": {"annotations": {"a": "1", "b": "2"}}, "spec": {"x": 1, "gone": {"deep": True}}}
    desired = {"metadata": {"annotations": {"a": "1"}}, "spec": {"x": 2}}
    assert merge_patch(last, desired) == {
        "metadata": {"annotations": {"a": "1", "b": None}},
        "spec": {"x": 2, "gone": None},
    }
    # Nothing applied before: the patch is the desired object itself.
    assert merge_patch({}, desired) == desired


@pytest.fixture
async def api(emulator_class: type) -> AsyncIterator[KubeApi]:
    emulator = emulator_class()
    emulator.resources.load_bundled()
    async with kmock.Server(emulator) as server:
        client = KubeApi(str(server.url))
        yield client
        await client.close()


def _config_map(**annotations: str) -> dict:
    meta = {"name": "demo-config", "namespace": "ns", "uid": str(uuid.uuid4())}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"broker.yaml": "node_id: 0\n"}}


async def test_apply_creates_then_leaves_alone_then_patches(api: KubeApi) -> None:
    desired = _config_map(team="streaming")
    result, live = await apply(api, desired)
    assert result == "created" and live["data"] == desired["data"]
    assert LAST_APPLIED in live["metadata"]["annotations"]
    assert (await apply(api, desired))[0] == "unchanged"

    changed = _config_map()  # the annotation is no longer wanted
    changed["data"] = {"broker.yaml": "node_id: 0\nlog_level: DEBUG\n"}
    result, live = await apply(api, changed)
    assert result == "patched"
    assert live["data"] == changed["data"]
    assert "team" not in live["metadata"]["annotations"]  # removed, not left behind
    assert (await apply(api, changed))[0] == "unchanged"


async def test_apply_repairs_a_hand_edit(api: KubeApi) -> None:
    desired = _config_map()
    await apply(api, desired)
    await api.patch("ConfigMap", "ns", "demo-config", {"data": {"broker.yaml": "edited by hand"}})
    result, live = await apply(api, desired)
    assert result == "patched" and live["data"] == desired["data"]


async def test_missing_objects_and_conflicts(api: KubeApi) -> None:
    assert await api.get("ConfigMap", "ns", "missing") is None
    assert await api.delete("Pod", "ns", "missing") is False
    with pytest.raises(KeyError):
        await api.get("Deployment", "ns", "x")  # a kind the operator never touches
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {}}
    await api.create(body)
    with pytest.raises(KubeError) as caught:
        await api.create(body)
    assert caught.value.status == 409
    # apply() over an object it did not create (no last-applied record) takes it over.
    result, live = await apply(api, {**body, "data": {"k": "v"}})
    assert result == "patched" and live["data"] == {"k": "v"}


async def test_server_errors_carry_the_status_and_message(api: KubeApi) -> None:
    with pytest.raises(KubeError) as caught:
        await api._request("GET", "/apis/nonexistent.example.com/v1/namespaces/ns/things")
    assert caught.value.status == 404 and "HTTP 404" in str(caught.value)


def test_immutable_fields_stay_out_of_patches() -> None:
    sts = {
        "kind": "StatefulSet",
        "spec": {
            "replicas": 3,
            "serviceName": "s",
            "selector": {"matchLabels": {"a": "b"}},
            "volumeClaimTemplates": [{"metadata": {"name": "wal"}}],
            "template": {},
        },
    }
    assert without_immutable("StatefulSet", sts) == {"kind": "StatefulSet", "spec": {"replicas": 3, "template": {}}}
    assert sts["spec"]["serviceName"] == "s"  # the desired object itself is not changed
    assert without_immutable("ConfigMap", {"data": {"a": "1"}}) == {"data": {"a": "1"}}


async def test_apply_patches_a_statefulset_without_touching_its_claim_templates(api: KubeApi) -> None:
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "demo-broker", "namespace": "ns", "uid": str(uuid.uuid4())},
        "spec": {
            "replicas": 1,
            "serviceName": "demo-brokers",
            "selector": {"matchLabels": {"a": "b"}},
            "volumeClaimTemplates": [
                {"metadata": {"name": "wal"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}
            ],
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}},
        },
    }
    await apply(api, sts)
    # What an API server adds to a claim template; a patch must not send the template back.
    await api.patch(
        "StatefulSet",
        "ns",
        "demo-broker",
        {
            "spec": {
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "wal"},
                        "spec": {"resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Filesystem"},
                        "status": {"phase": "Pending"},
                    }
                ]
            }
        },
    )
    assert (await apply(api, sts))[0] == "unchanged"
    newer = {**sts, "spec": {**sts["spec"], "replicas": 2}}
    result, live = await apply(api, newer)
    assert result == "patched" and live["spec"]["replicas"] == 2
    assert live["spec"]["volumeClaimTemplates"][0]["status"] == {"phase": "Pending"}  # untouched
