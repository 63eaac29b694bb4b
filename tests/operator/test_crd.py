"""The generated CRD: committed copy up to date, structural, valid, and agreeing with the models."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from automq.operator.crd import CRD_FILE, build_crd, render_crd, structural
from automq.operator.spec import AutoMQClusterSpec, InvalidSpec, check_cluster_name, parse_spec

K8S_VERSION = "1.35"

# ------------------------------------------------------------------------------------------
# A checker for the structural schema rules of
# https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema
# written from the rules, independent of the generator.

FORBIDDEN = {
    "$ref",
    "$schema",
    "$defs",
    "definitions",
    "dependencies",
    "patternProperties",
    "additionalItems",
    "id",
    "title",
    "examples",
    "const",
    "oneOf",
    "allOf",
    "not",
}
ALLOWED = {
    "type",
    "description",
    "properties",
    "required",
    "items",
    "enum",
    "default",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "format",
    "nullable",
    "additionalProperties",
    "anyOf",
    "example",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-embedded-resource",
}
TYPES = {"object", "array", "string", "integer", "number", "boolean"}
INT_OR_STRING_ANYOF = [{"type": "integer"}, {"type": "string"}]


def structural_problems(node: Any, path: str = "") -> list[str]:
    problems: list[str] = []
    if not isinstance(node, dict):
        return [f"{path or '/'}: schema node is not a mapping"]
    for key in node:
        if key in FORBIDDEN or key not in ALLOWED:
            problems.append(f"{path}: keyword {key!r} is not allowed in a structural schema")
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    if "type" not in node and not (int_or_string or preserve):
        problems.append(f"{path or '/'}: no type")
    if "type" in node and node["type"] not in TYPES:
        problems.append(f"{path}: unknown type {node['type']!r}")
    # The only junctor use we allow: exactly the int-or-string pattern (rule 3's exception).
    if "anyOf" in node and not (int_or_string and node["anyOf"] == INT_OR_STRING_ANYOF):
        problems.append(f"{path}: anyOf other than the int-or-string pattern")
    if int_or_string and "type" in node:
        problems.append(f"{path}: int-or-string node must not set type")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
    if node.get("additionalProperties") is False:
        problems.append(f"{path}: additionalProperties: false is forbidden")
    if ("properties" in node or "additionalProperties" in node) and node.get("type") != "object":
        problems.append(f"{path}: properties on a non-object")
    if node.get("type") == "array":
        if "items" not in node:
            problems.append(f"{path}: array without items")
    elif "items" in node:
        problems.append(f"{path}: items on a non-array")
    for name, sub in node.get("properties", {}).items():
        problems += structural_problems(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        problems += structural_problems(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        problems += structural_problems(node["items"], f"{path}[]")
    for required in node.get("required", []):
        if required not in node.get("properties", {}):
            problems.append(f"{path}: required field {required!r} is not a property")
    if "default" in node and isinstance(node["default"], (dict, list)) and node["default"] != {}:
        problems.append(f"{path}: object/array default other than {{}}")  # {} only fills nested defaults
    if node.get("x-kubernetes-list-type") == "map":
        item = node["items"]
        for key in node.get("x-kubernetes-list-map-keys", []):
            if key not in item.get("required", []) and "default" not in item["properties"].get(key, {}):
                problems.append(f"{path}: list-map key {key!r} must be required or defaulted")
    return problems


def test_checker_catches_what_kubernetes_rejects() -> None:
    bad = {
        "type": "object",
        "properties": {
            "a": {"$ref": "#/defs/x"},
            "b": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "c": {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": False},
            "d": {"type": "array"},
            "e": {"description": "no type"},
        },
        "required": ["zzz"],
    }
    found = "\n".join(structural_problems(bad))
    for expected in (
        "'$ref'",
        ".a: no type",
        ".b: anyOf",
        "mutually exclusive",
        "additionalProperties: false",
        "array without items",
        ".e: no type",
        "'zzz'",
    ):
        assert expected in found


# ------------------------------------------------------------------------------------------


def test_committed_crd_is_what_the_models_generate() -> None:
    assert CRD_FILE.read_text() == render_crd(), (
        "crds/ is stale: run `python -m automq.operator.crd` and commit the result"
    )


def test_crd_schema_is_structural() -> None:
    crd = build_crd()
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    assert structural_problems(schema) == []
    # metadata may only restrict name/generateName.
    metadata = schema["properties"]["metadata"]
    assert metadata["type"] == "object" and set(metadata.get("properties", {})) <= {"name", "generateName"}


def test_crd_validates_as_a_kubernetes_document() -> None:
    doc = yaml.safe_load(CRD_FILE.read_text())
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_crd_names_subresources_and_columns() -> None:
    crd = build_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "automqclusters.automq.io"
    assert spec["names"]["kind"] == "AutoMQCluster" and spec["names"]["shortNames"] == ["amq"]
    assert spec["scope"] == "Namespaced"
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    scale = version["subresources"]["scale"]
    schema = version["schema"]["openAPIV3Schema"]

    def at(path: str) -> dict[str, Any]:
        node = schema
        for part in path.strip(".").split("."):
            node = node["properties"][part]
        return node

    # Each scale path must exist in the schema with the type the scale subresource needs.
    assert at(scale["specReplicasPath"])["type"] == "integer"
    assert at(scale["statusReplicasPath"])["type"] == "integer"
    assert at(scale["labelSelectorPath"])["type"] == "string"
    assert "status" in version["subresources"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert {"Ready", "Controllers", "Brokers", "Bootstrap", "Age"} <= set(columns)
    for column in columns.values():
        if column["jsonPath"].startswith(".status.") and "[" not in column["jsonPath"]:
            at(column["jsonPath"])  # raises KeyError when a column points nowhere


def test_every_spec_field_is_documented() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    undocumented = []

    def walk(node: dict[str, Any], path: str) -> None:
        for name, sub in node.get("properties", {}).items():
            if not sub.get("description"):
                undocumented.append(f"{path}.{name}")
            walk(sub, f"{path}.{name}")
        if "items" in node:
            walk(node["items"], path + "[]")

    walk(schema["properties"]["spec"], "spec")
    walk(schema["properties"]["status"], "status")
    assert undocumented == []


def test_structural_conversion_of_optional_and_refs() -> None:
    converted = structural(
        {
            "$defs": {
                "Inner": {
                    "type": "object",
                    "title": "Inner",
                    "additionalProperties": False,
                    "properties": {"n": {"type": "integer", "default": 3}},
                }
            },
            "type": "object",
            "properties": {
                "inner": {"anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}], "default": None, "description": "d"},
                "obj_default": {"$ref": "#/$defs/Inner", "default": {"n": 4}},
            },
        }
    )
    assert converted["properties"]["inner"] == {
        "type": "object",
        "description": "d",
        "properties": {"n": {"type": "integer", "default": 3}},
        "nullable": True,
    }
    assert "default" not in converted["properties"]["obj_default"]
    with pytest.raises(ValueError, match="structurally"):
        structural({"anyOf": [{"type": "string"}, {"type": "integer"}]})


# ------------------------------------------------------------------------------------------
# Sample specs through both gates: the pydantic model (operator side) and the generated
# openAPI schema (API server side). CEL rules are checked by hand below: no CEL engine here.


def openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI v3.0 `nullable` -> JSON Schema type unions, so jsonschema can evaluate it."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes") and k != "nullable"}
    if node.get("exclusiveMinimum") is True:  # OpenAPI v3.0 boolean form -> JSON Schema number form
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False  # the API server prunes; treat unknown fields as errors here
    return out


@pytest.fixture(scope="module")
def spec_validator() -> jsonschema.Draft7Validator:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return jsonschema.Draft7Validator(openapi_to_jsonschema(copy.deepcopy(schema)))


MINIMAL = {"objectStore": {"bucket": "automq-data"}}
ACCEPTED = {
    "minimal": MINIMAL,
    "production": {
        "image": "registry.example.com/automq:0.1.0",
        "controller": {
            "replicas": 3,
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        },
        "broker": {
            "replicas": 6,
            "resources": {"requests": {"cpu": 2, "memory": "4Gi"}},
            "rack": {"enabled": True},
            "wal": {"kind": "volume", "size": "20Gi", "storageClassName": "gp3"},
            "scheduling": {
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "kafka", "effect": "NoSchedule"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
            },
            "config": {"kafka.num_partitions": "6", "storage.log_cache_bytes": "512MiB"},
        },
        "objectStore": {"bucket": "prod-automq", "region": "eu-west-1", "credentialsSecret": {"name": "s3-creds"}},
        "listeners": [{"name": "PLAINTEXT", "port": 9092}, {"name": "INTERNAL", "port": 9095}],
        "deletionPolicy": "Delete",
    },
    "s3-wal": {
        "broker": {"wal": {"kind": "s3"}},
        "objectStore": {"bucket": "b12", "endpoint": "http://seaweedfs:8333", "pathStyle": True},
    },
    "elastic-on": {
        **MINIMAL,
        "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 5, "targetBytesInMiBPerSecond": 20},
        "balancing": {"enabled": True, "intervalSeconds": 5},
    },
    "zero-brokers": {**MINIMAL, "broker": {"replicas": 0}},
}
# name -> (spec, what the pydantic error must mention, whether the openAPI schema alone rejects it)
REJECTED = {
    "no-object-store": ({}, "spec.objectStore: Field required", True),
    "negative-replicas": ({**MINIMAL, "broker": {"replicas": -1}}, "spec.broker.replicas", True),
    "zero-controllers": ({**MINIMAL, "controller": {"replicas": 0}}, "spec.controller.replicas", True),
    "bad-quantity": ({**MINIMAL, "broker": {"resources": {"requests": {"memory": "lots"}}}}, "quantity", True),
    "negative-quantity": ({**MINIMAL, "broker": {"wal": {"kind": "volume", "size": "-1Gi"}}}, "quantity", True),
    "bad-wal-kind": ({**MINIMAL, "broker": {"wal": {"kind": "disk", "size": "1Gi"}}}, "spec.broker.wal.kind", True),
    "volume-wal-without-size": (
        {**MINIMAL, "broker": {"wal": {"kind": "volume"}}},
        "spec.broker.wal.size is required",
        False,
    ),
    "unknown-field": ({**MINIMAL, "brokers": {"replicas": 3}}, "spec.brokers: unknown field", True),
    "unknown-config-key": (
        {**MINIMAL, "config": {"kafka.num_partition": "3"}},
        "spec.config['kafka.num_partition']: unknown node config key",
        False,
    ),
    "owned-config-key": ({**MINIMAL, "broker": {"config": {"listeners": "x"}}}, "cannot be overridden", False),
    "bad-config-value": (
        {**MINIMAL, "config": {"kafka.num_partitions": "many"}},
        "spec.config['kafka.num_partitions']",
        False,
    ),
    "bad-bucket": ({"objectStore": {"bucket": "Has_Upper"}}, "spec.objectStore.bucket", True),
    "duplicate-listener-port": (
        {**MINIMAL, "listeners": [{"name": "A", "port": 9092}, {"name": "B", "port": 9092}]},
        "distinct",
        False,
    ),
    "listener-on-http-port": ({**MINIMAL, "listeners": [{"name": "A", "port": 9094}]}, "broker HTTP port", False),
    "requests-over-limits": (
        {**MINIMAL, "broker": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}},
        "larger than limits.cpu",
        False,
    ),
    "autoscaling-bounds": (
        {**MINIMAL, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
        "minReplicas (5) exceeds",
        False,
    ),
    "autoscaling-target-zero": (
        {**MINIMAL, "autoscaling": {"targetBytesInMiBPerSecond": 0}},
        "spec.autoscaling.targetBytesInMiBPerSecond",
        True,
    ),
    "autoscaling-without-target": (
        {**MINIMAL, "autoscaling": {"enabled": True}},
        "set targetBytesInMiBPerSecond and/or targetCpuPercent",
        False,
    ),
    "balancing-tolerance-out-of-range": (
        {**MINIMAL, "balancing": {"tolerancePercent": 0}},
        "spec.balancing.tolerancePercent",
        True,
    ),
    "bad-cron": ({**MINIMAL, "compaction": {"schedule": "often"}}, "spec.compaction.schedule", True),
    "replicas-as-string": ({**MINIMAL, "broker": {"replicas": "three"}}, "spec.broker.replicas", True),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_specs(name: str, spec_validator: jsonschema.Draft7Validator) -> None:
    spec = ACCEPTED[name]
    assert isinstance(parse_spec(spec), AutoMQClusterSpec)
    assert [e.message for e in spec_validator.iter_errors(spec)] == []


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_specs(name: str, spec_validator: jsonschema.Draft7Validator) -> None:
    spec, message, schema_rejects = REJECTED[name]
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(spec)
    assert message in str(caught.value)
    schema_errors = list(spec_validator.iter_errors(spec))
    # Cross-field and node-config rules are beyond openAPI; the operator reports those.
    assert bool(schema_errors) == schema_rejects, [e.message for e in schema_errors]


@pytest.mark.parametrize("name", ["demo", "a", "prod-eu-1", "x" * 40])
def test_cluster_names_accepted(name: str) -> None:
    check_cluster_name(name)
    rule = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"]["properties"][
        "name"
    ]
    jsonschema.validate(name, rule)


@pytest.mark.parametrize("name", ["1demo", "Demo", "demo-", "x" * 41, "demo.eu"])
def test_cluster_names_rejected(name: str) -> None:
    with pytest.raises(InvalidSpec, match="metadata.name"):
        check_cluster_name(name)
    rule = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"]["properties"][
        "name"
    ]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(name, rule)


def test_cel_rule_for_volume_wal_matches_the_model() -> None:
    """No CEL engine is installed: check the one rule's meaning by evaluating its tiny grammar."""
    wal = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["broker"][
        "properties"
    ]["wal"]
    (rule,) = wal["x-kubernetes-validations"]
    m = re.fullmatch(r"self\.kind != '(\w+)' \|\| has\(self\.(\w+)\)", rule["rule"])
    assert m, rule
    kind, field = m.groups()

    def cel(obj: dict[str, Any]) -> bool:
        return obj.get("kind") != kind or field in obj

    for obj in ({"kind": "volume", "size": "1Gi"}, {"kind": "s3"}, {"kind": "volume"}):
        spec = {**MINIMAL, "broker": {"wal": obj}}
        try:
            parse_spec(spec)
            model_ok = True
        except InvalidSpec as exc:
            model_ok = False
            assert rule["message"] in str(exc)
        assert cel(obj) == model_ok
