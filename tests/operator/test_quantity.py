"""Quantities are compared by value wherever the operator compares them (issue 11, section 5)."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from automq.operator import builders
from automq.operator.builders import ClusterRef
from automq.operator.kube import KubeApi, apply, contains
from automq.operator.quantity import same_quantity
from automq.operator.reconcile import Cluster, broker_statefulset
from automq.operator.spec import parse_spec


def test_same_quantity_by_value() -> None:
    assert same_quantity("10240Mi", "10Gi")
    assert same_quantity("1000m", "1")
    assert same_quantity(1, "1")
    assert same_quantity("1Gi", str(1 << 30))
    assert not same_quantity("10Gi", "10G")  # binary vs decimal suffix: different sizes
    assert not same_quantity("10Gi", "20Gi")
    assert not same_quantity("not-a-quantity", "10Gi")
    assert not same_quantity(None, "10Gi")
    assert same_quantity("same-garbage", "same-garbage")  # equal strings stay equal


def test_contains_compares_resource_maps_by_value_only() -> None:
    desired = {"resources": {"requests": {"memory": "1024Mi", "cpu": "500m"}, "limits": {"memory": "1024Mi"}}}
    live = {"resources": {"requests": {"memory": "1Gi", "cpu": "0.5"}, "limits": {"memory": "1Gi"}}}
    assert contains(live, desired)
    assert not contains(
        {"resources": {"requests": {"memory": "2Gi", "cpu": "500m"}, "limits": {"memory": "1Gi"}}}, desired
    )
    # Outside resource maps a string is a string: a label "1000m" is not the label "1".
    assert not contains({"labels": {"size": "1"}}, {"labels": {"size": "1000m"}})


@pytest.fixture
async def api(emulator_class: type) -> AsyncIterator[KubeApi]:
    emulator = emulator_class()
    emulator.resources.load_bundled()
    async with kmock.Server(emulator) as server:
        client = KubeApi(str(server.url))
        yield client
        await client.close()


class _Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def info(self, reason: str, message: str) -> None:
        self.seen.append((reason, message))

    def warn(self, reason: str, message: str) -> None:
        self.seen.append((reason, message))


def _canonical(obj: Any) -> Any:
    """What an API server stores: quantities in their canonical form."""
    text = json.dumps(obj)
    return json.loads(text.replace('"10240Mi"', '"10Gi"').replace('"1024Mi"', '"1Gi"'))


async def test_non_canonical_wal_size_is_not_a_wal_change(api: KubeApi) -> None:
    ref = ClusterRef("demo", "streaming", str(uuid.uuid4()))
    raw = {
        "objectStore": {"bucket": "demo-bucket"},
        "broker": {
            "replicas": 1,
            "wal": {"kind": "volume", "size": "10240Mi"},
            "resources": {"requests": {"memory": "1024Mi"}, "limits": {"memory": "1024Mi"}},
        },
    }
    spec = parse_spec(raw)
    desired = builders.statefulset(spec, ref, "broker")
    # The live object as the API server keeps it: created from the spec, quantities canonicalised.
    result, live = await apply(api, desired)
    assert result == "created"
    stored = _canonical(copy.deepcopy(live))
    assert stored["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    await api.patch("StatefulSet", ref.namespace, desired["metadata"]["name"], {"spec": stored["spec"]})

    events = _Events()
    cluster = Cluster(
        api=api,
        ref=ref,
        spec=spec,
        raw_spec=raw,
        generation=1,
        previous_status={},
        reporter=events,
        controller_api_factory=lambda urls, auth=None: None,  # type: ignore[arg-type,return-value]
    )
    await broker_statefulset(cluster)
    assert not cluster.problems, cluster.problems
    # The canonical template reads as unchanged: no patch on every pass.
    assert (await apply(api, desired))[0] == "unchanged"
    # A real size change still is one.
    bigger = parse_spec({**raw, "broker": {**raw["broker"], "wal": {"kind": "volume", "size": "20Gi"}}})
    cluster.spec = bigger
    await broker_statefulset(cluster)
    assert [p.reason for p in cluster.problems] == ["WalChangeNotSupported"]


@pytest.mark.parametrize(
    ("size", "overrides"),
    [
        ("2Mi", {}),
        ("3Mi", {}),
        ("4Mi", {}),
        ("5Mi", {}),
        ("64Mi", {"kafka.message_max_bytes": "40000000"}),
        ("85Mi", {"kafka.message_max_bytes": "40000000"}),
        ("86Mi", {"kafka.message_max_bytes": "40000000"}),
        ("1Gi", {"kafka.message_max_bytes": "600MiB"}),
    ],
)
def test_a_wal_too_small_for_the_largest_batch_is_refused_where_the_broker_would_crash(
    size: str, overrides: dict[str, str]
) -> None:
    """The operator refuses (InvalidSpec: status Degraded, a Warning event) exactly the WAL sizes
    whose rendered broker config the broker's own start check rejects, instead of rendering
    brokers that crash-loop; the message names the setting and the smallest size that works."""
    from automq.broker.config import ConfigError, check_broker_config
    from automq.operator.spec import InvalidSpec

    raw = {"objectStore": {"bucket": "bkt"}, "broker": {"wal": {"kind": "volume", "size": size}, "config": overrides}}
    try:
        spec = parse_spec(raw)
    except InvalidSpec as exc:
        message = str(exc)
        assert f"spec.broker.wal.size {size} is too small" in message and "kafka.message_max_bytes" in message
        smallest = message.split("at least ")[1].split(" ")[0]
        assert parse_spec({**raw, "broker": {**raw["broker"], "wal": {"kind": "volume", "size": smallest}}})
        smaller = f"{int(smallest[:-2]) - 1}Mi"
        with pytest.raises(InvalidSpec):
            parse_spec({**raw, "broker": {**raw["broker"], "wal": {"kind": "volume", "size": smaller}}})
        # ... and the broker would indeed have refused to start with it.
        unchecked = parse_spec({**raw, "broker": {"config": overrides, "wal": {"kind": "s3"}}})
        unchecked.broker.wal = unchecked.broker.wal.model_copy(update={"kind": "volume", "size": size})
        with pytest.raises(ConfigError):
            check_broker_config(builders.node_config(unchecked, ClusterRef("c", "ns", "u"), "broker"))
    else:
        check_broker_config(builders.node_config(spec, ClusterRef("c", "ns", "u"), "broker"))


def test_the_s3_wal_has_no_size_to_check() -> None:
    assert parse_spec({"objectStore": {"bucket": "bkt"}, "broker": {"wal": {"kind": "s3"}}})
