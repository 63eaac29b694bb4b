"""Shared by the chart and manifest tests: the chart rendered by Helm's own engine, and the two
validators every rendered or shipped document goes through.

- built-in kinds: kubernetes-validate, strict (unknown fields are errors), for the newest
  Kubernetes version the installed kubernetes-validate knows;
- AutoMQCluster: the CRD's openAPIV3Schema (what the API server checks) AND the operator's
  pydantic spec (what the operator checks, including rules the schema cannot express).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "automq-operator"
CRD_FILE = ROOT / "crds" / "automqclusters.automq.io.yaml"
KUBERNETES_VERSION = kubernetes_validate.latest_version()


def load_documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    [doc] = load_documents(CRD_FILE.read_text())
    return doc


@pytest.fixture(scope="session")
def validate_custom_resource(crd) -> Callable[[dict[str, Any]], None]:
    from automq.operator.spec import parse_spec

    [version] = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    api_version = f"{crd['spec']['group']}/{version['name']}"
    schema = version["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft7Validator(schema)

    def validate(doc: dict[str, Any]) -> None:
        assert doc["apiVersion"] == api_version and doc["kind"] == crd["spec"]["names"]["kind"]
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, "; ".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
        parse_spec(doc["spec"])  # raises InvalidSpec naming the field

    return validate


@pytest.fixture(scope="session")
def validate_document(validate_custom_resource) -> Callable[[dict[str, Any]], None]:
    user_crd = load_documents((ROOT / "crds" / "automqusers.automq.io.yaml").read_text())[0]
    user_schema = jsonschema.Draft7Validator(user_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])

    def validate(doc: dict[str, Any]) -> None:
        if doc.get("kind") == "AutoMQCluster":
            validate_custom_resource(doc)
        elif doc.get("kind") == "AutoMQUser":
            from automq.operator.user_spec import parse_user_spec

            errors = sorted(user_schema.iter_errors(doc), key=lambda e: list(e.path))
            assert not errors, "; ".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
            parse_user_spec(doc["spec"])
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)

    return validate


@pytest.fixture(scope="session")
def chart():
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk is a dev dependency")
    helm.disable_logging()
    loaded = helm.Chart.load(CHART)
    yield loaded
    loaded.close()


@pytest.fixture(scope="session")
def render(chart) -> Callable[..., dict[str, list[dict[str, Any]]]]:
    """values -> {template path: [documents]} (NOTES.txt left out)."""

    def do_render(
        values: dict[str, Any] | None = None, name: str = "automq-operator", namespace: str = "automq-system"
    ) -> dict[str, list[dict[str, Any]]]:
        rendered = chart.render(values, name=name, namespace=namespace)
        return {path: load_documents(text) for path, text in rendered.items() if not path.endswith("NOTES.txt")}

    return do_render
