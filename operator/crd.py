"""The AutoMQCluster CustomResourceDefinition, generated from the pydantic models in `spec`.

`python -m automq.operator.crd` writes `crds/automqclusters.automq.io.yaml`; a test fails when
the committed file differs, so the CRD is never edited by hand.

Pydantic emits JSON Schema (draft 2020-12); Kubernetes accepts only a *structural* subset of
OpenAPI v3. `structural()` converts one into the other:
  - `$ref`/`$defs` are inlined (Kubernetes rejects references);
  - `anyOf: [X, {type: null}]` (an Optional field) becomes X with `nullable: true`;
  - `additionalProperties: false` is dropped (Kubernetes forbids it and prunes unknown fields
    instead) and `title` is dropped (noise in `kubectl explain`);
  - defaults are kept for scalars only: an object default would make the API server fill in
    whole sections the user never wrote, which then show up in every `kubectl get -o yaml`.
    The exception is an explicit empty-object default (`json_schema_extra={"default": {}}`),
    which lets the server fill that object's scalar defaults (spec.broker.replicas for /scale);
  - JSON Schema's numeric `exclusiveMinimum: x` becomes OpenAPI v3.0's `minimum: x,
    exclusiveMinimum: true`;
  - quantities keep the int-or-string form core resources use.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from automq.operator.spec import (
    CLUSTER_NAME_MAX,
    CLUSTER_NAME_PATTERN,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    AutoMQClusterSpec,
    AutoMQClusterStatus,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = Path(__file__).resolve().parent.parent / "crds" / f"{CRD_NAME}.yaml"

# Keywords a structural schema node may carry (apiextensions.k8s.io/v1 JSONSchemaProps,
# minus the ones Kubernetes rejects: $ref, $schema, definitions, dependencies, patternProperties,
# additionalItems, uniqueItems: true).
_KEPT = {
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
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-embedded-resource",
}


def structural(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Kubernetes structural schema equivalent to a pydantic JSON schema node."""
    defs = schema.get("$defs", {}) if defs is None else defs
    node = dict(schema)
    node.pop("$defs", None)

    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        # Keys next to the $ref (description, x-kubernetes-*) describe this use and win.
        node = {**copy.deepcopy(target), **node}

    if node.get("x-kubernetes-int-or-string"):
        out: dict[str, Any] = {
            k: node[k] for k in ("description", "pattern", "x-kubernetes-int-or-string") if k in node
        }
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return out

    variants = node.get("anyOf")
    if variants is not None:
        non_null = [v for v in variants if v.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"cannot express anyOf {variants} structurally; use one type (or one type and null)")
        outer = {k: v for k, v in node.items() if k != "anyOf"}
        inner = structural(non_null[0], defs)
        node = {**inner, **outer}
        if len(non_null) < len(variants):
            node["nullable"] = True

    out = {}
    for key, value in node.items():
        if key not in _KEPT:
            continue
        if key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = structural(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict) and "properties" not in node:
                out[key] = structural(value, defs)
            # `false` is forbidden and `true` is what x-kubernetes-preserve-unknown-fields says.
        elif key == "default":
            if value == {} or (value is not None and not isinstance(value, (dict, list))):
                out[key] = value
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = value
    # type and description first: the generated YAML reads like hand-written CRDs.
    head: dict[str, Any] = {k: out.pop(k) for k in ("type", "description") if k in out}
    return {**head, **out}


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
            "description": "Every controller and broker is ready and up to date.",
        },
        {
            "name": "Controllers",
            "type": "string",
            "jsonPath": ".status.controllers.summary",
            "description": "Ready/desired controllers.",
        },
        {
            "name": "Brokers",
            "type": "string",
            "jsonPath": ".status.brokers.summary",
            "description": "Ready/desired brokers.",
        },
        {
            "name": "Bootstrap",
            "type": "string",
            "jsonPath": ".status.bootstrap",
            "description": "Kafka bootstrap address.",
        },
        {
            "name": "Desired",
            "type": "integer",
            "jsonPath": ".status.autoscaling.desiredReplicas",
            "priority": 1,
            "description": "Brokers the autoscaler wants (empty when autoscaling is off).",
        },
        {
            "name": "Balancing",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Balancing")].reason',
            "priority": 1,
            "description": "What the balancer did last: Balanced, Rebalancing, MetricsUnavailable, Disabled, ...",
        },
        {
            "name": "Reason",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            "priority": 1,
            "description": "Why the cluster is (not) ready.",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def crd_document(
    *,
    kind: str,
    plural: str,
    singular: str,
    short_names: tuple[str, ...] | list[str],
    description: str,
    spec_model: Any,
    status_model: Any,
    name_max: int,
    name_pattern: str,
    subresources: dict[str, Any],
    printer_columns: list[dict[str, Any]],
) -> dict[str, Any]:
    """A namespaced CustomResourceDefinition of this group whose spec and status schemas are
    generated from pydantic models (AutoMQCluster and AutoMQUser share this shape)."""
    spec_schema = structural(spec_model.model_json_schema(by_alias=True, mode="validation"))
    status_schema = structural(status_model.model_json_schema(by_alias=True, mode="validation"))
    root = {
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object (automq.io/v1alpha1)."},
            "kind": {"type": "string", "description": f"Kind of this object ({kind})."},
            # Structural schemas may restrict metadata.name (and nothing else in metadata).
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": name_max, "pattern": name_pattern},
                },
            },
            "spec": spec_schema,
            "status": status_schema,
        },
        "required": ["spec"],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "automq", "app.kubernetes.io/part-of": "automq"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": ["automq"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": printer_columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition document."""
    return crd_document(
        kind=KIND,
        plural=PLURAL,
        singular=SINGULAR,
        short_names=SHORT_NAMES,
        description="An AutoMQ cluster: Kafka-compatible brokers that keep no partition data, "
        "a write-ahead log per broker and one object storage bucket, run by the AutoMQ operator.",
        spec_model=AutoMQClusterSpec,
        status_model=AutoMQClusterStatus,
        name_max=CLUSTER_NAME_MAX,
        name_pattern=CLUSTER_NAME_PATTERN,
        subresources={
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.broker.replicas",
                # Pods that exist (like a Deployment's status.replicas), not ready ones:
                # an HPA treats this as the current size while it computes the next.
                "statusReplicasPath": ".status.brokers.replicas",
                "labelSelectorPath": ".status.brokerSelector",
            },
        },
        printer_columns=_printer_columns(),
    )


HEADER = (
    "# Generated by `python -m automq.operator.crd` from operator/spec.py. Do not edit by hand:\n"
    "# a test fails when this file differs from what the models generate.\n"
)


def render_crd() -> str:
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    target = Path(argv[0]) if argv else CRD_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_crd())
    print(f"wrote {target}")
    if not argv:
        from automq.operator.user_crd import USER_CRD_FILE, render_user_crd

        USER_CRD_FILE.write_text(render_user_crd())
        print(f"wrote {USER_CRD_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
