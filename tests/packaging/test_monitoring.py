"""The chart's monitoring: the Grafana dashboard ConfigMap (the generated dashboard, labelled for
Grafana's sidecar) and the optional PodMonitors, whose selectors match the pods the operator
actually makes."""

from __future__ import annotations

import json

import pytest

from automq.operator import builders
from automq.operator.observability import DASHBOARD, build_dashboard
from automq.operator.spec import parse_spec

NAME, NS = "automq-operator", "automq-system"


def _docs(render, values=None):
    return [d for docs in render(values).values() for d in docs]


def test_dashboard_configmap_is_the_generated_dashboard(render, validate_document):
    [cm] = [
        d for d in _docs(render) if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("grafana-dashboard")
    ]
    validate_document(cm)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == NS
    dashboard = json.loads(cm["data"]["automq-cluster.json"])
    assert dashboard == json.loads(DASHBOARD.read_text()) == build_dashboard()
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"] if p["type"] != "row")


def test_dashboard_label_and_namespace_follow_values(render):
    values = {
        "monitoring": {
            "grafanaDashboard": {"label": "grafana_dashboard_x", "labelValue": "yes", "namespace": "monitoring"}
        }
    }
    [cm] = [d for d in _docs(render, values) if d["kind"] == "ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard_x"] == "yes" and cm["metadata"]["namespace"] == "monitoring"
    off = {"monitoring": {"grafanaDashboard": {"enabled": False}}}
    assert not [d for d in _docs(render, off) if d["kind"] == "ConfigMap"]


def test_pod_monitors_select_the_operator_and_every_cluster_pod(render):
    assert not [d for d in _docs(render) if d["kind"] == "PodMonitor"]  # off by default: needs the CRDs
    values = {"monitoring": {"podMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kube-prom"}}}}
    monitors = {d["metadata"]["name"]: d for d in _docs(render, values) if d["kind"] == "PodMonitor"}
    clusters, operator = monitors[f"{NAME}-clusters"], monitors[f"{NAME}-operator"]
    for m in (clusters, operator):
        assert m["apiVersion"] == "monitoring.coreos.com/v1" and m["metadata"]["labels"]["release"] == "kube-prom"
        assert m["spec"]["podMetricsEndpoints"][0]["interval"] == "15s"
    # the cluster selector matches what the operator puts on broker and controller pods
    ref = builders.ClusterRef("demo", "team-a", "uid-1")
    wanted = clusters["spec"]["selector"]["matchLabels"]
    for role in ("broker", "controller"):
        assert wanted.items() <= builders.common_labels(ref, role).items()
    assert clusters["spec"]["podMetricsEndpoints"][0]["port"] == "http" and clusters["spec"]["namespaceSelector"] == {
        "any": True
    }
    # https controllers are scraped over https: the scheme comes from the annotation the operator
    # sets on exactly those pods (brokers and http controllers have none: http)
    [relabel] = clusters["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert relabel["targetLabel"] == "__scheme__"
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scheme"]
    https_spec = parse_spec({"objectStore": {"bucket": "demo-bucket"}})
    annotations = {
        role: builders.pod_template(https_spec, ref, role)["metadata"]["annotations"]
        for role in ("broker", "controller")
    }
    assert (
        annotations["controller"]["prometheus.io/scheme"] == "https"
        and "prometheus.io/scheme" not in annotations["broker"]
    )
    # the operator monitor scrapes the Deployment's named metrics port
    [deployment] = [d for d in _docs(render, values) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    assert operator["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert "metrics" in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    no_metrics = {**values, "metrics": {"port": 0}}
    assert [d["metadata"]["name"] for d in _docs(render, no_metrics) if d["kind"] == "PodMonitor"] == [
        f"{NAME}-clusters"
    ]


def test_bad_monitoring_values_are_refused(chart):
    from helm_python import HelmValuesError

    with pytest.raises(HelmValuesError, match="/monitoring/podMonitor/interval"):
        chart.render({"monitoring": {"podMonitor": {"interval": "soon"}}}, name=NAME, namespace=NS)
