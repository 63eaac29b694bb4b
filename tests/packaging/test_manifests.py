"""manifests/: the example AutoMQClusters and the kustomize base that installs the operator.

Every example document validates (built-in kinds with kubernetes-validate, AutoMQClusters with
the CRD schema and the operator's pydantic spec); the examples agree with the demo object store
they point at; the kustomize base lists exactly its files, its objects validate, and it grants
exactly the operator's rules. `kubectl kustomize` (kustomize built into kubectl, offline) renders
the base and the overlay when kubectl is installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from automq.operator.rbac import OPERATOR_RULES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"
BASE = ROOT / "manifests" / "operator"
OVERLAY = ROOT / "manifests" / "overlays" / "private-registry"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def clusters(path: Path) -> list[dict[str, Any]]:
    return [d for d in load(path) if d["kind"] == "AutoMQCluster"]


def rule_key(rule: dict[str, Any]) -> str:
    return json.dumps({k: sorted(v) for k, v in rule.items()}, sort_keys=True)


def test_the_documented_examples_exist():
    assert {p.name for p in EXAMPLE_FILES} >= {
        "minimal.yaml",
        "production.yaml",
        "s3-wal.yaml",
        "dev-object-store.yaml",
    }


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_every_example_document_validates(path, validate_document):
    docs = load(path)
    assert docs
    for doc in docs:
        try:
            validate_document(doc)
        except Exception as exc:
            pytest.fail(f"{path.name}: {doc['kind']}/{doc['metadata']['name']}: {exc}", pytrace=False)


def test_minimal_is_one_controller_one_broker_with_secret_credentials():
    [cluster] = clusters(EXAMPLES / "minimal.yaml")
    spec = cluster["spec"]
    assert spec["controller"]["replicas"] == 1 and spec["broker"]["replicas"] == 1
    assert spec["objectStore"]["credentialsSecret"]["name"] == "automq-s3"


def test_production_has_three_controllers_volume_wal_zones_and_resources():
    from automq.operator.spec import parse_spec

    [cluster] = clusters(EXAMPLES / "production.yaml")
    spec = parse_spec(cluster["spec"])
    assert spec.controller.replicas == 3
    assert spec.broker.wal.kind == "volume" and spec.broker.wal.storage_class_name and spec.broker.wal.size
    assert spec.broker.rack.enabled and spec.broker.rack.topology_key == "topology.kubernetes.io/zone"
    for role in (spec.controller, spec.broker):
        # Guaranteed QoS: every request equals its limit.
        assert role.resources.requests and role.resources.requests == role.resources.limits
    assert spec.deletion_policy == "Retain"


def test_s3_wal_brokers_need_no_volume():
    from automq.operator.spec import parse_spec

    [cluster] = clusters(EXAMPLES / "s3-wal.yaml")
    spec = parse_spec(cluster["spec"])
    assert spec.broker.wal.kind == "s3" and spec.broker.wal.size is None and spec.broker.replicas > 1


def test_examples_point_at_the_demo_store_with_keys_it_accepts():
    store = {(d["kind"], d["metadata"]["name"]): d for d in load(EXAMPLES / "dev-object-store.yaml")}
    keys = store[("Secret", "automq-s3")]["stringData"]
    identities = json.loads(store[("Secret", "automq-dev-s3-identities")]["stringData"]["s3.json"])
    [credentials] = identities["identities"][0]["credentials"]
    assert credentials == {"accessKey": keys["AWS_ACCESS_KEY_ID"], "secretKey": keys["AWS_SECRET_ACCESS_KEY"]}
    assert "Admin" in identities["identities"][0]["actions"], "buckets are auto-created only for admin identities"
    service = store[("Service", "automq-dev-s3")]
    [port] = service["spec"]["ports"]
    deployment = store[("Deployment", "automq-dev-s3")]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    for path in (EXAMPLES / "minimal.yaml", EXAMPLES / "s3-wal.yaml"):
        [cluster] = clusters(path)
        store_spec = cluster["spec"]["objectStore"]
        assert store_spec["endpoint"] == f"http://automq-dev-s3:{port['port']}", path.name
        assert store_spec["pathStyle"] is True
        secret = store_spec["credentialsSecret"]
        assert secret["name"] == "automq-s3"
        # The operator reads these keys (defaults of SecretKeyRef) from the Secret.
        assert {
            secret.get("accessKeyIdKey", "AWS_ACCESS_KEY_ID"),
            secret.get("secretAccessKeyKey", "AWS_SECRET_ACCESS_KEY"),
        } <= set(keys)


def test_example_cluster_names_fit_the_operator_names():
    # Names become Service names (<name>-bootstrap, ...): DNS labels of at most 63 characters.
    for path in EXAMPLE_FILES:
        for cluster in clusters(path):
            assert len(cluster["metadata"]["name"]) <= 40 and "namespace" not in cluster["metadata"]


# --- the kustomize base ------------------------------------------------------------------------


def kustomization(path: Path) -> dict[str, Any]:
    return yaml.safe_load((path / "kustomization.yaml").read_text())


def test_kustomization_lists_exactly_the_files_in_the_base():
    listed = kustomization(BASE)["resources"]
    assert len(listed) == len(set(listed))
    for entry in listed:
        assert (BASE / entry).is_file(), f"kustomization.yaml lists {entry}, which does not exist"
        assert (BASE / entry).resolve().is_relative_to(BASE), f"{entry} is outside the base (kustomize refuses it)"
        assert not (BASE / entry).is_symlink(), f"{entry} is a symlink (kustomize refuses links out of the base)"
    present = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert present == set(listed), f"files not listed: {sorted(present - set(listed))}"


def base_documents() -> list[dict[str, Any]]:
    # What kustomize does to these files: set the namespace on namespaced objects, add labels.
    kust = kustomization(BASE)
    docs = []
    for entry in kust["resources"]:
        for doc in load(BASE / entry):
            docs.append(doc)
    return docs


def test_every_base_file_validates(validate_document):
    for doc in base_documents():
        validate_document(doc)


def test_base_crd_is_the_generated_crd():
    assert (BASE / "crd.yaml").read_text() == (ROOT / "crds" / "automqclusters.automq.io.yaml").read_text(), (
        "run `python scripts/sync-k8s-artifacts.py`"
    )
    assert (BASE / "user-crd.yaml").read_text() == (ROOT / "crds" / "automqusers.automq.io.yaml").read_text(), (
        "run `python scripts/sync-k8s-artifacts.py`"
    )


def test_base_grants_exactly_operator_rules_to_its_service_account():
    docs = base_documents()
    [role] = [d for d in docs if d["kind"] == "ClusterRole"]
    assert Counter(map(rule_key, role["rules"])) == Counter(map(rule_key, OPERATOR_RULES))
    [binding] = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    [sa] = [d for d in docs if d["kind"] == "ServiceAccount"]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": kustomization(BASE)["namespace"]}
    ]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert pod["containers"][0]["args"][:2] == ["operator", "--all-namespaces"]


def test_base_namespace_is_the_documented_one():
    [ns] = [d for d in base_documents() if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == kustomization(BASE)["namespace"] == "automq-system"


def kubectl_kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: the file-level checks above still ran")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_kustomize_builds_the_base_and_every_object_validates(validate_document):
    docs = kubectl_kustomize(BASE)
    assert Counter(d["kind"] for d in docs) == Counter(d["kind"] for d in base_documents())
    for doc in docs:
        validate_document(doc)
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kustomize"
        if doc["kind"] in {"ServiceAccount", "Service", "Deployment"}:
            assert doc["metadata"]["namespace"] == "automq-system"


def test_kustomize_overlay_swaps_the_image_and_memory(validate_document):
    docs = kubectl_kustomize(OVERLAY)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/platform/automq:0.1.0"
    assert container["resources"]["limits"]["memory"] == "512Mi"
    for doc in docs:
        validate_document(doc)


def test_elastic_example_turns_on_autoscaling_and_balancing():
    from automq.operator.spec import parse_spec

    [cluster] = clusters(EXAMPLES / "elastic.yaml")
    spec = parse_spec(cluster["spec"])
    assert spec.autoscaling.enabled and spec.balancing.enabled
    assert spec.autoscaling.min_replicas <= spec.broker.replicas <= spec.autoscaling.max_replicas
    assert cluster["spec"]["objectStore"]["endpoint"] == "http://automq-dev-s3:8333"
