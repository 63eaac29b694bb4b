"""The AutoMQUser CustomResourceDefinition, generated from `user_spec` like the cluster's
(`python -m automq.operator.crd` writes both; a test fails when the committed file differs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from automq.operator.spec import GROUP
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
    from automq.operator.crd import crd_document

    return crd_document(
        kind=USER_KIND,
        plural=USER_PLURAL,
        singular=USER_SINGULAR,
        short_names=USER_SHORT_NAMES,
        description="A Kafka user of an AutoMQCluster: its principal (User:<name>), ACLs and client quotas, "
        "kept in the cluster by the AutoMQ operator.",
        spec_model=AutoMQUserSpec,
        status_model=AutoMQUserStatus,
        name_max=USER_NAME_MAX,
        name_pattern=USER_NAME_PATTERN,
        subresources={"status": {}},
        printer_columns=[
            {"name": "Cluster", "type": "string", "jsonPath": ".spec.cluster"},
            {
                "name": "Ready",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
            },
            {"name": "ACLs", "type": "integer", "jsonPath": ".status.acls"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )


def render_user_crd() -> str:
    from automq.operator.crd import HEADER

    return HEADER.replace("operator/spec.py", "operator/user_spec.py") + yaml.safe_dump(
        build_user_crd(), sort_keys=False, width=120
    )
