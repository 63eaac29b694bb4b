"""The CRD's CEL rules (x-kubernetes-validations), evaluated by a real CEL implementation.

kmock does not run CEL and no API server can be installed here, so these tests do what the
API server does with the rules of the generated CRD file: default the object from the schema,
then evaluate every rule at its node with `self` (and, on update, `oldSelf` where both exist).
The CEL engine is cel-python; the Kubernetes quantity library (`quantity()`, `compareTo`) is
supplied with Kubernetes' own quantity parser, as the API server's library does.
"""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes

from automq.operator.crd import CRD_FILE, build_crd
from automq.operator.quantity import quantity_value
from automq.operator.spec import InvalidSpec, parse_spec

MINIMAL = {"objectStore": {"bucket": "demo-bucket"}}


class _Quantity:
    def __init__(self, value: Decimal) -> None:
        self.value = value


def _quantity(text: Any) -> _Quantity:
    return _Quantity(quantity_value(str(text)))


def _compare_to(a: _Quantity, b: _Quantity) -> celtypes.IntType:
    return celtypes.IntType((a.value > b.value) - (a.value < b.value))


FUNCTIONS = {"quantity": _quantity, "compareTo": _compare_to}
ENV = celpy.Environment()


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    assert crd == build_crd(), "crds/ is stale: run python -m automq.operator.crd"
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _default(schema: dict[str, Any], obj: Any) -> Any:
    """Structural defaulting, as the API server applies it before validation."""
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = _default(sub, obj[name])
    elif isinstance(obj, list) and "items" in schema:
        return [_default(schema["items"], item) for item in obj]
    return obj


def _evaluate(schema: dict[str, Any], new: Any, old: Any, path: str, failures: list[str]) -> None:
    for rule in schema.get("x-kubernetes-validations", []):
        transition = "oldSelf" in rule["rule"]
        if transition and old is None:
            continue  # transition rules only run on update, where the old value exists
        activation = {"self": celpy.json_to_cel(new)}
        if transition:
            activation["oldSelf"] = celpy.json_to_cel(old)
        program = ENV.program(ENV.compile(rule["rule"]), functions=FUNCTIONS)
        result = program.evaluate(activation)
        if isinstance(result, celpy.CELEvalError):
            raise AssertionError(f"{path}: rule {rule['rule']!r} failed to evaluate: {result}")
        if not result:
            failures.append(rule["message"])
    if isinstance(new, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in new:
                _evaluate(sub, new[name], old.get(name) if isinstance(old, dict) else None, f"{path}.{name}", failures)


def validate(spec: dict[str, Any], old_spec: dict[str, Any] | None = None) -> list[str]:
    """The messages of the rules the API server would refuse `spec` with (an update from `old_spec`)."""
    schema = _schema()
    new = _default(schema, {"spec": copy.deepcopy(spec)})
    old = _default(schema, {"spec": copy.deepcopy(old_spec)}) if old_spec is not None else None
    failures: list[str] = []
    _evaluate(schema, new, old, "", failures)
    return failures


def with_wal(**wal: Any) -> dict[str, Any]:
    return {**MINIMAL, "broker": {"wal": wal}}


def test_create_ignores_transition_rules() -> None:
    assert validate(MINIMAL) == []
    assert validate({**MINIMAL, "clusterId": "prod"}) == []
    assert validate(with_wal(kind="s3")) == []


def test_unrelated_updates_are_accepted() -> None:
    old = {**with_wal(kind="volume", size="10Gi"), "clusterId": "prod"}
    new = copy.deepcopy(old)
    new["broker"]["replicas"] = 5
    new["image"] = "registry.example/automq:2"
    assert validate(new, old) == []


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ({**MINIMAL, "clusterId": "a"}, {**MINIMAL, "clusterId": "b"}, "spec.clusterId"),
        (MINIMAL, {**MINIMAL, "clusterId": "b"}, "spec.clusterId"),  # was the default, now set
        ({**MINIMAL, "clusterId": "a"}, MINIMAL, "spec.clusterId"),
        (MINIMAL, {"objectStore": {"bucket": "other-bucket"}}, "spec.objectStore.bucket"),
        (with_wal(kind="volume", size="10Gi"), with_wal(kind="s3"), "spec.broker.wal.kind"),
        (MINIMAL, with_wal(kind="s3"), "spec.broker.wal.kind"),  # the implicit WAL is a volume
        (with_wal(kind="volume", size="10Gi"), with_wal(kind="volume", size="20Gi"), "spec.broker.wal.size"),
        (MINIMAL, with_wal(kind="volume", size="5Gi"), "spec.broker.wal.size"),  # implicit 10Gi
        (
            with_wal(kind="volume", size="10Gi", storageClassName="fast"),
            with_wal(kind="volume", size="10Gi", storageClassName="slow"),
            "spec.broker.wal.storageClassName",
        ),
    ],
)
def test_immutable_fields_are_refused_with_a_message_naming_them(old: dict, new: dict, field: str) -> None:
    failures = validate(new, old)
    assert len(failures) >= 1 and all(m.startswith(field + " cannot change") for m in failures), failures


@pytest.mark.parametrize(
    ("old_size", "new_size"), [("10Gi", "10240Mi"), ("10Gi", 10737418240), ("10240Mi", "10Gi"), ("1G", "1000M")]
)
def test_wal_size_is_compared_by_value(old_size: Any, new_size: Any) -> None:
    assert validate(with_wal(kind="volume", size=new_size), with_wal(kind="volume", size=old_size)) == []
    # Writing the implicit default explicitly is no change either.
    assert validate(with_wal(kind="volume", size="10240Mi"), MINIMAL) == []


def test_volume_wal_needs_a_size_on_create_too() -> None:
    assert validate(with_wal(kind="volume")) == [
        "spec.broker.wal.size is required when spec.broker.wal.kind is volume (e.g. size: 10Gi)"
    ]


# ------------------------------------------------------------------------------------------
# Elastic policy (spec.autoscaling): cross-field rules the openAPI schema cannot say, checked
# here against the models that generate them (the operator's report names the same field).

ELASTIC_SAMPLES: dict[str, tuple[dict[str, Any], str | None]] = {
    "autoscaling-on": (
        {**MINIMAL, "autoscaling": {"enabled": True, "maxReplicas": 6, "targetBytesInMiBPerSecond": 8}},
        None,
    ),
    "autoscaling-cpu-only": ({**MINIMAL, "autoscaling": {"enabled": True, "targetCpuPercent": 70}}, None),
    "autoscaling-off-without-target": ({**MINIMAL, "autoscaling": {"minReplicas": 2}}, None),
    "min-above-max": (
        {**MINIMAL, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
        "spec.autoscaling.minReplicas must not exceed maxReplicas",
    ),
    "min-above-default-max": (
        {**MINIMAL, "autoscaling": {"minReplicas": 4}},
        "spec.autoscaling.minReplicas must not exceed maxReplicas",
    ),
    "enabled-without-target": (
        {**MINIMAL, "autoscaling": {"enabled": True}},
        "spec.autoscaling: set targetBytesInMiBPerSecond and/or targetCpuPercent when enabled is true",
    ),
}


@pytest.mark.parametrize("name", sorted(ELASTIC_SAMPLES))
def test_elastic_policy_rules_agree_with_the_models(name: str) -> None:
    spec, message = ELASTIC_SAMPLES[name]
    failures = validate(spec)
    if message is None:
        assert failures == []
        parse_spec(spec)
    else:
        assert failures == [message]
        with pytest.raises(InvalidSpec) as caught:
            parse_spec(spec)
        assert message.split(" ", 1)[0].rstrip(":") in str(caught.value)


def test_scale_subresource_path_exists_when_spec_broker_is_omitted() -> None:
    """A real API server answers GET .../scale with an error when specReplicasPath is absent:
    the CRD's `broker: default {}` makes defaulting fill broker.replicas, and only that."""
    schema = _schema()
    scale = build_crd()["spec"]["versions"][0]["subresources"]["scale"]
    obj = _default(schema, {"spec": copy.deepcopy(MINIMAL)})
    node: Any = obj
    for part in scale["specReplicasPath"].strip(".").split("."):
        node = node[part]
    assert node == 1
    # Only scalar defaults are filled in, never whole sections the user did not write.
    assert not [k for k, v in obj["spec"]["broker"].items() if isinstance(v, (dict, list))]


# ------------------------------------------------------------------------------------------
# Spark jobs (spec.lakeIngestion): the catalog rules, refused by the API server as by the model.

LAKE = {"enabled": True, "catalogUri": "https://iceberg-rest:8181"}
LAKE_SAMPLES: dict[str, tuple[dict[str, Any], str | None]] = {
    "catalog-uri": ({**MINIMAL, "lakeIngestion": LAKE}, None),
    "catalog-secret": (
        {**MINIMAL, "lakeIngestion": {"enabled": True, "catalogUriSecret": {"name": "c", "key": "u"}}},
        None,
    ),
    "disabled-without-catalog": ({**MINIMAL, "lakeIngestion": {"topics": ["orders"]}}, None),
    "only-listed": ({**MINIMAL, "lakeIngestion": {**LAKE, "onlyListedTopics": True, "topics": ["a"]}}, None),
    "enabled-without-catalog": (
        {**MINIMAL, "lakeIngestion": {"enabled": True}},
        "spec.lakeIngestion: enabled needs catalogUri or catalogUriSecret (the Iceberg catalog)",
    ),
    "two-catalogs": (
        {**MINIMAL, "lakeIngestion": {**LAKE, "catalogUriSecret": {"name": "c", "key": "u"}}},
        "spec.lakeIngestion: set catalogUri or catalogUriSecret, not both",
    ),
    "only-listed-without-topics": (
        {**MINIMAL, "lakeIngestion": {**LAKE, "onlyListedTopics": True}},
        "spec.lakeIngestion: onlyListedTopics needs topics",
    ),
}


@pytest.mark.parametrize("name", sorted(LAKE_SAMPLES))
def test_lake_ingestion_rules_agree_with_the_model(name: str) -> None:
    spec, message = LAKE_SAMPLES[name]
    assert validate(spec) == ([] if message is None else [message])
    if message is None:
        parse_spec(spec)
    else:
        with pytest.raises(InvalidSpec, match=re.escape(message)):
            parse_spec(spec)
