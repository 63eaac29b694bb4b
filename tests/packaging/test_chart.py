"""The Helm chart, rendered by Helm's own engine (helm-python-sdk, no cluster), for the default
values and every file in tests/packaging/values/: every document validates, RBAC is exactly the
operator's rules, the operator runs locked down, bad values are refused by values.schema.json,
and the `helm test` hook's check really connects (run here against local servers)."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from automq.operator.rbac import LEADER_ELECTION_RULES, OPERATOR_RULES

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "automq-operator"
VALUES_DIR = Path(__file__).parent / "values"
VALUES_FILES = sorted(VALUES_DIR.glob("*.yaml"))


def values_of(path: Path | None) -> dict[str, Any] | None:
    return None if path is None else yaml.safe_load(path.read_text())


def documents(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [doc for docs in rendered.values() for doc in docs]


def only(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def rule_key(rule: dict[str, Any]) -> str:
    return json.dumps({k: sorted(v) for k, v in rule.items()}, sort_keys=True)


def deployment(docs) -> dict[str, Any]:
    [dep] = only(docs, "Deployment")
    return dep


CASES = [None, *VALUES_FILES]
IDS = ["defaults", *(p.stem for p in VALUES_FILES)]


def test_values_files_cover_the_modes_the_docs_promise():
    assert {p.stem for p in VALUES_FILES} >= {"cluster-wide", "namespaced", "with-cluster", "custom-image-resources"}


@pytest.mark.parametrize("values_file", CASES, ids=IDS)
def test_every_rendered_document_validates(render, validate_document, values_file):
    docs = documents(render(values_of(values_file)))
    kinds = Counter(d["kind"] for d in docs)
    assert kinds["Deployment"] == 1 and kinds["ServiceAccount"] == 1 and kinds["ClusterRole"] == 1
    for doc in docs:
        try:
            validate_document(doc)
        except Exception as exc:  # name the document: the validators do not
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc}", pytrace=False)


def test_chart_crd_is_the_generated_crd_and_validates(chart, validate_document):
    names = ("automqclusters.automq.io.yaml", "automqusers.automq.io.yaml")
    by_file = {entry["filename"]: entry["data"] for entry in chart.crds}
    assert set(by_file) == {f"automq-operator/crds/{n}" for n in names}
    for name in names:
        data = by_file[f"automq-operator/crds/{name}"]
        assert data == (ROOT / "crds" / name).read_text(), f"charts/automq-operator/crds must hold exactly crds/{name}"
        validate_document(yaml.safe_load(data))


def test_packaged_chart_carries_the_crd_content_not_a_link(tmp_path):
    # The chart's crds/ entry is a symlink to the generated file; `helm package` must resolve it.
    import tarfile

    import helm_python

    archive = helm_python.package(CHART, destination=tmp_path)
    with tarfile.open(archive) as tar:
        for name in ("automqclusters.automq.io.yaml", "automqusers.automq.io.yaml"):
            member = tar.getmember(f"automq-operator/crds/{name}")
            assert member.isfile()
            data = tar.extractfile(member).read().decode()
            assert data == (ROOT / "crds" / name).read_text()


def test_helm_lint_finds_no_warning_or_error():
    import helm_python

    report = helm_python.lint(CHART, strict=True, namespace="automq-system")
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert not serious and not report["errors"], report


# --- RBAC ------------------------------------------------------------------------------------


def test_cluster_wide_grants_exactly_operator_rules(render):
    docs = documents(render(values_of(VALUES_DIR / "cluster-wide.yaml")))
    [role] = only(docs, "ClusterRole")
    assert Counter(map(rule_key, role["rules"])) == Counter(map(rule_key, OPERATOR_RULES))
    assert not only(docs, "Role") and not only(docs, "RoleBinding")
    [binding] = only(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "automq-operator-sa", "namespace": "automq-system"}
    ]
    [sa] = only(docs, "ServiceAccount")
    assert sa["metadata"]["name"] == "automq-operator-sa"
    assert deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"] == "automq-operator-sa"


def test_namespaced_grants_exactly_operator_rules_per_namespace(render):
    docs = documents(render(values_of(VALUES_DIR / "namespaced.yaml")))
    [cluster_role] = only(docs, "ClusterRole")
    roles = {r["metadata"]["namespace"]: r for r in only(docs, "Role") if r["metadata"]["name"] == "automq-operator"}
    assert set(roles) == {"team-a", "team-b"}
    for namespace, role in roles.items():
        granted = Counter(map(rule_key, role["rules"] + cluster_role["rules"]))
        assert granted == Counter(map(rule_key, OPERATOR_RULES)), namespace
    # Nothing namespaced is granted cluster-wide in namespaced mode; node loss needs the
    # cluster-scoped nodes and volume attachments whatever namespaces are watched.
    cluster_resources = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    assert cluster_resources == {"customresourcedefinitions", "namespaces", "nodes", "volumeattachments"}
    bindings = {
        b["metadata"]["namespace"]: b for b in only(docs, "RoleBinding") if b["metadata"]["name"] == "automq-operator"
    }
    assert set(bindings) == {"team-a", "team-b"}
    for binding in bindings.values():
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "automq-operator", "namespace": "automq-system"}
        ]


def test_namespaced_operator_may_hold_its_leader_lease_in_the_release_namespace(render):
    docs = documents(render(values_of(VALUES_DIR / "namespaced.yaml")))
    [role] = [r for r in only(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == "automq-system"
    assert Counter(map(rule_key, role["rules"])) == Counter(map(rule_key, LEADER_ELECTION_RULES))
    [binding] = [b for b in only(docs, "RoleBinding") if b["metadata"]["name"].endswith("-leader-election")]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # Cluster-wide, the ClusterRole covers the Lease already: no extra Role.
    wide = documents(render(values_of(VALUES_DIR / "cluster-wide.yaml")))
    assert not only(wide, "Role")
    # A watched release namespace gets its Lease rights from the namespace's Role.
    same = documents(render({"watchNamespaces": ["automq-system"]}))
    assert [r["metadata"]["name"] for r in only(same, "Role")] == ["automq-operator"]


def test_rbac_can_be_left_to_the_user(render):
    docs = documents(render({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "mine"}}))
    assert not [
        d for d in docs if d["kind"] in {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"}
    ]
    assert deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"] == "mine"


def test_existing_service_account_needs_a_name(chart):
    from helm_python import HelmRenderError

    with pytest.raises(HelmRenderError, match="serviceAccount.name is required when serviceAccount.create is false"):
        chart.render({"serviceAccount": {"create": False}}, name="automq-operator", namespace="automq-system")


# --- the operator Deployment -----------------------------------------------------------------


@pytest.mark.parametrize("values_file", CASES, ids=IDS)
def test_operator_pod_is_locked_down_and_probed(render, values_file):
    values = values_of(values_file) or {}
    docs = documents(render(values))
    dep = deployment(docs)
    pod = dep["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    port = values.get("health", {}).get("port", 8080)
    metrics = values.get("metrics", {}).get("port", 8081)
    assert container["ports"] == [
        {"name": "health", "containerPort": port, "protocol": "TCP"},
        *([{"name": "metrics", "containerPort": metrics, "protocol": "TCP"}] if metrics else []),
    ]
    assert f"--liveness=http://0.0.0.0:{port}/healthz" in container["args"]
    assert f"--metrics-port={metrics}" in container["args"]
    if metrics:
        assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(metrics)
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    # Two replicas, one leading through a Lease; a rolling upgrade never leaves none running.
    assert dep["spec"]["replicas"] == values.get("replicas", 2)
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pdbs = only(docs, "PodDisruptionBudget")
    if dep["spec"]["replicas"] > 1:  # a drain leaves one replica to take the Lease over
        [pdb] = pdbs
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    else:
        assert not pdbs
    affinity = dep["spec"]["template"]["spec"]["affinity"]
    if values.get("affinity"):
        assert affinity == values["affinity"]
    else:  # replicas spread over nodes by default
        term = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_watch_mode_becomes_operator_arguments(render):
    wide = deployment(documents(render(None)))["spec"]["template"]["spec"]["containers"][0]["args"]
    assert wide[:2] == ["operator", "--all-namespaces"]
    narrow = deployment(documents(render({"watchNamespaces": ["team-a", "team-b"]})))
    args = narrow["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["operator", "--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in args


def test_operator_arguments_parse_with_the_real_cli(render):
    # The chart's args must be what `automq operator` accepts: run the real CLI parser on them
    # with run_operator replaced, so the test sees the arguments the operator would get.
    args = deployment(documents(render({"watchNamespaces": ["team-a", "team-b"], "health": {"port": 8181}})))["spec"][
        "template"
    ]["spec"]["containers"][0]["args"]
    probe = (
        "import sys, types, json\n"
        "mod = types.ModuleType('automq.operator.main')\n"
        "mod.run_operator = lambda **kw: print(json.dumps(kw))\n"
        "sys.modules['automq.operator.main'] = mod\n"
        "from automq.broker.cli import app\n"
        "app(sys.argv[1:])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "namespaces": ["team-a", "team-b"],
        "clusterwide": False,
        "liveness": "http://0.0.0.0:8181/healthz",
        "metrics_port": 8081,
        "leader_election": True,  # replicas elect one active operator
    }


def test_custom_image_resources_and_scheduling_reach_the_pod(render):
    values = values_of(VALUES_DIR / "custom-image-resources.yaml")
    docs = documents(render(values))
    pod = deployment(docs)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == "registry.example.com:5000/platform/automq:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert container["resources"] == values["resources"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["affinity"] == values["affinity"]
    assert {"name": "KOPF_LOG_FORMAT", "value": "json"} in container["env"]
    assert deployment(docs)["metadata"]["name"] == "amq-op"
    [service] = only(docs, "Service")
    assert service["spec"]["ports"][0]["port"] == 8181


def test_default_image_is_the_documented_one_and_follows_app_version(render, chart):
    [container] = deployment(documents(render(None)))["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/automq-py/automq:{chart.metadata['appVersion']}"
    from automq.operator.spec import DEFAULT_IMAGE

    assert container["image"] == DEFAULT_IMAGE, "chart and operator must agree on the default image"


# --- the optional AutoMQCluster --------------------------------------------------------------


def test_cluster_from_values_is_passed_through(render):
    values = values_of(VALUES_DIR / "with-cluster.yaml")
    [cluster] = only(documents(render(values)), "AutoMQCluster")
    assert cluster["metadata"]["name"] == "events" and cluster["metadata"]["namespace"] == "streaming"
    assert cluster["metadata"]["labels"]["team"] == "data"
    assert cluster["spec"] == values["cluster"]["spec"]


def test_secured_cluster_from_values_renders_valid_objects(render, validate_custom_resource):
    # The chart passes spec.listeners / spec.security through; what the operator then makes of
    # them (Services, NetworkPolicies, pods with the certificate and token volumes) validates.
    import kubernetes_validate

    from automq.operator import builders, network_policies
    from automq.operator.spec import parse_spec

    secure = next(yaml.safe_load_all((ROOT / "manifests" / "examples" / "secure.yaml").read_text()))
    values = {"cluster": {"enabled": True, "name": "secure", "spec": secure["spec"]}}
    [cluster] = only(documents(render(values)), "AutoMQCluster")
    validate_custom_resource(cluster)
    spec = parse_spec(cluster["spec"])
    ref = builders.ClusterRef("secure", "automq-system", "uid")
    objects = builders.desired_objects(spec, ref) + builders.services(spec, ref)[3:]
    objects += network_policies.network_policies(spec, ref)
    assert {o["kind"] for o in objects} >= {"NetworkPolicy", "Service", "StatefulSet"}
    for obj in objects:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_no_cluster_by_default(render):
    assert not only(documents(render(None)), "AutoMQCluster")


def test_cluster_without_object_store_is_refused_with_the_key(chart):
    from helm_python import HelmRenderError

    with pytest.raises(HelmRenderError, match=r"cluster.spec.objectStore is required when cluster.enabled is true"):
        chart.render({"cluster": {"enabled": True}}, name="automq-operator", namespace="automq-system")


def test_cluster_outside_watched_namespaces_is_refused(chart):
    from helm_python import HelmRenderError

    values = {
        "watchNamespaces": ["team-a"],
        "cluster": {"enabled": True, "namespace": "team-b", "spec": {"objectStore": {"bucket": "abc"}}},
    }
    with pytest.raises(HelmRenderError, match=r'cluster.namespace "team-b" is not in watchNamespaces'):
        chart.render(values, name="automq-operator", namespace="automq-system")


def test_invalid_cluster_spec_passes_helm_but_fails_the_crd_schema(render, validate_custom_resource):
    # The chart passes spec through; the API server (CRD schema) is what refuses it.
    values = {"cluster": {"enabled": True, "spec": {"objectStore": {"bucket": "abc"}, "broker": {"replicas": -1}}}}
    [cluster] = only(documents(render(values)), "AutoMQCluster")
    with pytest.raises(AssertionError, match=r"spec.broker.replicas"):
        validate_custom_resource(cluster)


# --- values.schema.json ----------------------------------------------------------------------

BAD_VALUES = [
    ({"watchNamespaces": "team-a"}, "/watchNamespaces"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ({"watchNamespaces": ["a", "a"]}, "/watchNamespaces"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"repository": "ghcr.io/automq-py/automq:0.1.0"}}, "/image/repository"),
    ({"health": {"port": "8080"}}, "/health/port"),
    ({"health": {"port": 80}}, "/health/port"),
    ({"cluster": {"enabled": "yes"}}, "/cluster/enabled"),
    ({"cluster": {"spec": "objectStore"}}, "/cluster/spec"),
    ({"cluster": {"name": "Events_Cluster"}}, "/cluster/name"),
    ({"cluster": {"name": "1events"}}, "/cluster/name"),
    ({"cluster": {"name": "e" * 41}}, "/cluster/name"),
    ({"serviceAccount": {"name": "bad name"}}, "/serviceAccount/name"),
    ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
    ({"replicaCount": 2}, "replicaCount"),
    ({"logFormat": "yaml"}, "/logFormat"),
    ({"rbac": {"create": "true"}}, "/rbac/create"),
    ({"tolerations": {"key": "x"}}, "/tolerations"),
]


@pytest.mark.parametrize("values,where", BAD_VALUES, ids=[w for _, w in BAD_VALUES])
def test_schema_rejects_bad_values_naming_the_key(chart, values, where):
    from helm_python import HelmValuesError

    with pytest.raises(HelmValuesError) as excinfo:
        chart.render(values, name="automq-operator", namespace="automq-system")
    assert where in str(excinfo.value)


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=[p.stem for p in VALUES_FILES])
def test_schema_accepts_every_example_values_file(chart, values_file):
    chart.validate_schema(values_of(values_file))


def test_every_default_value_is_described_by_the_schema(chart):
    # additionalProperties: false at each level means a new value must be added to the schema.
    schema = chart.schema
    assert schema is not None

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        props = node.get("properties")
        if props is None:
            return
        for key, value in values.items():
            assert key in props, f"{path}{key} is in values.yaml but not in values.schema.json"
            if isinstance(value, dict):
                walk(value, props[key], f"{path}{key}.")

    walk(chart.values, schema, "")


# --- the helm test hook ----------------------------------------------------------------------


def test_pod(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    [pod] = rendered["automq-operator/templates/tests/test-connection.yaml"]
    return pod


test_pod.__test__ = False  # a helper, not a test


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def run_check(pod: dict[str, Any], targets: list[str]) -> subprocess.CompletedProcess:
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["python", "-c"]
    script, *_ = container["args"]
    return subprocess.run([sys.executable, "-c", script, *targets], capture_output=True, text=True, timeout=120)


def test_hook_targets_operator_and_cluster_bootstrap(render):
    pod = test_pod(render(values_of(VALUES_DIR / "with-cluster.yaml"), name="automq-operator"))
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    targets = pod["spec"]["containers"][0]["args"][1:]
    assert targets == [
        "http://automq-operator.automq-system.svc:8080/healthz",
        "tcp://events-bootstrap.streaming.svc:9095",
    ]
    only_operator = test_pod(render(None))["spec"]["containers"][0]["args"][1:]
    assert only_operator == ["http://automq-operator.automq-system.svc:8080/healthz"]


def test_hook_check_passes_against_live_endpoints(render):
    pod = test_pod(render(values_of(VALUES_DIR / "with-cluster.yaml")))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        http_port, tcp_port = server.server_address[1], listener.getsockname()[1]
        result = run_check(pod, [f"http://127.0.0.1:{http_port}/healthz", f"tcp://127.0.0.1:{tcp_port}"])
    finally:
        server.shutdown()
        server.server_close()
        listener.close()
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"ok http://127.0.0.1:{http_port}/healthz", f"ok tcp://127.0.0.1:{tcp_port}"]


def test_hook_check_fails_when_kafka_port_is_closed(render):
    values = values_of(VALUES_DIR / "with-cluster.yaml") | {"tests": {"timeoutSeconds": 1}}
    pod = test_pod(render(values))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    result = run_check(pod, [f"tcp://127.0.0.1:{closed}"])
    assert result.returncode == 1
    assert f"FAILED tcp://127.0.0.1:{closed}" in result.stderr


def test_hook_check_fails_on_an_unhealthy_operator(render):
    pod = test_pod(render({"tests": {"timeoutSeconds": 1}}))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = run_check(pod, [f"http://127.0.0.1:{server.server_address[1]}/not-healthz"])
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 1 and "FAILED" in result.stderr and "404" in result.stderr


# --- derived files ---------------------------------------------------------------------------


def test_derived_install_files_are_in_sync():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sync-k8s-artifacts.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, (
        f"{result.stdout}{result.stderr}\nrun `python scripts/sync-k8s-artifacts.py` after changing "
        "operator/rbac.py or the CRD"
    )


def test_one_operator_replica_has_no_disruption_budget(render):
    docs = documents(render({"replicas": 1}))
    assert deployment(docs)["spec"]["replicas"] == 1 and not only(docs, "PodDisruptionBudget")


def test_log_format_reaches_the_operator_container(render):
    for value in ("text", "json"):
        docs = [d for ds in render({"logFormat": value}).values() for d in ds]
        [deployment] = [d for d in docs if d["kind"] == "Deployment"]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert {"name": "AUTOMQ_LOG_FORMAT", "value": value} in container["env"]
