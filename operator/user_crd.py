"""The AutoMQUser CustomResourceDefinition, generated from `user_spec` like the cluster's
(`python -m automq.operator.crd` writes both; a test fails when the committed file differs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from automq.operator.spec import GROUP, VERSION
from automq.operator.user_spec import (
    USER_KIND,
    USER_NAME_MAX,
    USER_NAME_PATTERN,
    USER_PLURAL,
    USER_SHORT_NAMES,
    USER_SINGULAR,
    AutoMQUserSpec,
    AutoMQUserStatus,
)

USER_CRD_NAME = f"{USER_PLURAL}.{GROUP}"
USER_CRD_FILE = Path(__file__).resolve().parent.parent / "crds" / f"{USER_CRD_NAME}.yaml"


def build_user_crd() -> dict[str, Any]:
    from automq.operator.crd import structural

    spec_schema = structural(AutoMQUserSpec.model_json_schema(by_alias=True, mode="validation"))
    status_schema = structural(AutoMQUserStatus.model_json_schema(by_alias=True, mode="validation"))
    root = {
        "type": "object",
        "description": "A Kafka user of an AutoMQCluster: its principal (User:<name>), ACLs and client quotas, "
        "kept in the cluster by the AutoMQ operator.",
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object (automq.io/v1alpha1)."},
            "kind": {"type": "string", "description": "Kind of this object (AutoMQUser)."},
            "metadata": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": USER_NAME_MAX, "pattern": USER_NAME_PATTERN}},
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
            "name": USER_CRD_NAME,
            "labels": {"app.kubernetes.io/name": "automq", "app.kubernetes.io/part-of": "automq"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": USER_KIND,
                "listKind": f"{USER_KIND}List",
                "plural": USER_PLURAL,
                "singular": USER_SINGULAR,
                "shortNames": list(USER_SHORT_NAMES),
                "categories": ["automq"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Cluster", "type": "string", "jsonPath": ".spec.cluster"},
                        {
                            "name": "Ready",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                        },
                        {"name": "ACLs", "type": "integer", "jsonPath": ".status.acls"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def render_user_crd() -> str:
    from automq.operator.crd import HEADER

    return HEADER.replace("operator/spec.py", "operator/user_spec.py") + yaml.safe_dump(
        build_user_crd(), sort_keys=False, width=120
    )
