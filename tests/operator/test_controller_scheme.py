"""Switching the controller API between http and https as rolling updates: the phase machine,
what each phase renders (which role restarts at each step, and that no client is ever given a
scheme its controllers do not serve), the recorded state an operator restart resumes from, and
the reconcile step against a fake API. The end-to-end proof with real processes and a producing
client is tests/e2e/test_controller_scheme_roll.py."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import yaml

from automq.broker.config import NodeConfig
from automq.operator import builders, controller_scheme
from automq.operator.builders import ClusterRef
from automq.operator.controller_scheme import ApiState, next_state, parse_state, steady
from automq.operator.reconcile import Cluster
from automq.operator.spec import CONTROLLER_API_STATE_ANNOTATION, parse_cluster, parse_spec

REF = ClusterRef("demo", "kafka", "uid-1")
BOTH_HTTP, BOTH_HTTPS = ApiState("both", "http"), ApiState("both", "https")


def walk(start: ApiState, target: str) -> list[str]:
    """The states a switch passes through when every roll completes."""
    seen, state = [start.encode()], start
    for _ in range(10):
        held = next_state(state, target, converged=False)  # type: ignore[arg-type]
        assert held == state, "no step may be taken while a roll is still running"
        state = next_state(state, target, converged=True)  # type: ignore[arg-type]
        if state.encode() == seen[-1]:
            return seen
        seen.append(state.encode())
    raise AssertionError(seen)


def test_a_switch_is_three_rolls_each_way() -> None:
    assert walk(steady("http"), "https") == ["http/http", "both/http", "both/https", "https/https"]
    assert walk(steady("https"), "http") == ["https/https", "both/https", "both/http", "http/http"]
    assert walk(steady("https"), "https") == ["https/https"]


def test_a_change_of_mind_walks_back_from_where_the_cluster_is() -> None:
    # http -> https got as far as brokers calling https; the user sets tls: false again
    assert walk(BOTH_HTTPS, "http") == ["both/https", "both/http", "http/http"]
    # it had only taught the controllers https: the clients never switched
    assert walk(BOTH_HTTP, "http") == ["both/http", "http/http"]


def test_every_reachable_state_keeps_clients_on_a_served_scheme() -> None:
    for start in (steady("http"), steady("https")):
        for target in ("http", "https"):
            for encoded in walk(start, target):
                state = parse_state(encoded)
                assert state is not None
                assert state.serve in ("both", state.client), encoded


def test_recorded_states_that_cannot_be_reached_are_refused() -> None:
    for value in ("http/https", "https/http", "both", "", None, "tls/http", "both/both"):
        assert parse_state(value) is None, value
    assert parse_state("both/https") == BOTH_HTTPS


def _spec(tls: bool, state: ApiState | None) -> Any:
    spec = parse_spec({"objectStore": {"bucket": "demo-bucket"}, "security": {"controllerApi": {"tls": tls}}})
    if state is not None:
        spec.set_controller_api_state(state.serve, state.client)
    return spec


def _node(spec: Any, role: str) -> NodeConfig:
    return NodeConfig.model_validate(yaml.safe_load(builders.config_map(spec, REF)["data"][f"{role}.yaml"]))


def _template(spec: Any, role: str) -> str:
    return builders.template_hash(builders.statefulset(spec, REF, role))  # type: ignore[arg-type]


def test_each_step_restarts_only_the_role_it_must() -> None:
    states = [steady("http"), BOTH_HTTP, BOTH_HTTPS, steady("https")]
    specs = [_spec(True, s) for s in states]
    brokers = [_template(s, "broker") for s in specs]
    controllers = [_template(s, "controller") for s in specs]
    # http/http -> both/http: controllers only; both/http -> both/https: brokers only;
    # both/https -> https/https: controllers only
    assert brokers[0] == brokers[1] != brokers[2] == brokers[3]
    assert controllers[0] != controllers[1] == controllers[2] != controllers[3]
    # the steady states render what a cluster that never switched renders
    assert _template(_spec(False, None), "broker") == brokers[0]
    assert _template(_spec(True, None), "controller") == controllers[3]
    assert _template(_spec(True, None), "broker") == brokers[3]


@pytest.mark.parametrize("state", [steady("http"), BOTH_HTTP, BOTH_HTTPS, steady("https")], ids=ApiState.encode)
def test_what_each_state_renders(state: ApiState) -> None:
    spec = _spec(True, state)
    controller, broker = _node(spec, "controller"), _node(spec, "broker")
    serves_https, serves_http = state.serve != "http", state.serve != "https"
    assert controller.security.controller_tls == serves_https
    assert controller.security.controller_plain_http == (state.serve == "both")
    assert bool(controller.tls.cert_file) == serves_https
    assert {u.split("://")[0] for u in broker.controller_urls} == {state.client}
    assert (broker.security.controller_ca_file is not None) == (state.client == "https")
    assert builders.controller_service_url(spec, REF).startswith(f"{state.client}://")
    # the clients' scheme is always one the controllers serve
    assert (state.client == "https" and serves_https) or (state.client == "http" and serves_http)
    probe = builders.statefulset(spec, REF, "controller")["spec"]["template"]["spec"]["containers"][0]
    assert probe["readinessProbe"]["httpGet"]["scheme"] == ("HTTPS" if serves_https else "HTTP")
    assert controller_scheme.state_from_config_map(builders.config_map(spec, REF)) == state
    assert controller_scheme.current_state(spec) == state


def test_an_operator_restart_resumes_from_the_annotation() -> None:
    obj = {
        "metadata": {"name": "demo", "annotations": {CONTROLLER_API_STATE_ANNOTATION: "both/https"}},
        "spec": {"objectStore": {"bucket": "demo-bucket"}, "security": {"controllerApi": {"tls": True}}},
    }
    spec = parse_cluster(obj)  # what the elastic loop, node loss and users see
    assert spec.controller_client_tls() and spec.controller_plain_http()
    assert controller_scheme.current_state(spec) == BOTH_HTTPS
    obj["metadata"]["annotations"][CONTROLLER_API_STATE_ANNOTATION] = "http/https"  # hand-edited nonsense
    assert controller_scheme.current_state(parse_cluster(obj)) == steady("https")


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, name)))

    async def list(self, kind: str, namespace: str, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (k, _), o in self.objects.items() if k == kind]

    async def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any], sub: str | None = None) -> Any:
        obj = self.objects.setdefault((kind, name), {"metadata": {"name": name}})
        annotations = (patch.get("metadata") or {}).get("annotations") or {}
        obj.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
        return obj


class Events:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def info(self, reason: str, message: str) -> None:
        self.seen.append(message)

    def warn(self, reason: str, message: str) -> None:
        self.seen.append(message)


def _pods(kube: FakeKube, spec: Any, ready: bool = True) -> None:
    """Every pod of the cluster running `spec`'s templates (what the kubelet would have made)."""
    for role, count in (("controller", spec.controller.replicas), ("broker", spec.broker.replicas)):
        template = builders.statefulset(spec, REF, role)["spec"]["template"]  # type: ignore[arg-type]
        for i in range(count):
            name = builders.pod_name(REF, role, i)  # type: ignore[arg-type]
            kube.objects[("Pod", name)] = {
                "metadata": {
                    "name": name,
                    "labels": template["metadata"]["labels"],
                    **{"annotations": dict(template["metadata"]["annotations"])},
                },
                "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
            }


def _pass(kube: FakeKube, tls: bool) -> tuple[Any, Cluster]:
    live = asyncio.run(kube.get("AutoMQCluster", "kafka", "demo")) or {}
    spec = parse_spec({"objectStore": {"bucket": "demo-bucket"}, "security": {"controllerApi": {"tls": tls}}})
    asyncio.run(controller_scheme.load_state(kube, live, spec, REF))
    c = Cluster(kube, REF, spec, {}, 1, {}, Events(), lambda urls: None)  # type: ignore[arg-type]
    asyncio.run(controller_scheme.step(c))
    return spec, c


def test_the_step_waits_for_each_roll_and_for_jobs_on_the_old_scheme() -> None:
    kube = FakeKube()
    kube.objects[("AutoMQCluster", "demo")] = {"metadata": {"name": "demo"}}
    kube.objects[("ConfigMap", "demo-config")] = builders.config_map(_spec(False, None), REF)  # nodes run http
    _pods(kube, _spec(False, None))
    spec, c = _pass(kube, tls=True)
    assert controller_scheme.current_state(spec) == BOTH_HTTP  # the controllers learn https first
    assert [n.reason for n in c.progress] == ["ControllerApiScheme"]
    spec, c = _pass(kube, tls=True)  # the controllers have not restarted yet
    assert (
        controller_scheme.current_state(spec) == BOTH_HTTP
        and "still runs the previous template" in c.progress[0].message
    )
    _pods(kube, spec)
    spec, _ = _pass(kube, tls=True)
    assert controller_scheme.current_state(spec) == BOTH_HTTPS
    _pods(kube, spec)
    # a Spark job started before the clients switched still calls http: plain http stays
    kube.objects[("Job", "demo-compaction-1")] = {
        "metadata": {"name": "demo-compaction-1"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "args": [
                                "--controller",
                                "http://demo-controllers.kafka.svc:9093",
                                "--endpoint",
                                "http://s3:8333",
                            ]
                        }
                    ]
                }
            }
        },
        "status": {"active": 1},
    }
    spec, c = _pass(kube, tls=True)
    assert controller_scheme.current_state(spec) == BOTH_HTTPS and "demo-compaction-1" in c.progress[0].message
    kube.objects[("Job", "demo-compaction-1")]["status"] = {"succeeded": 1}
    spec, c = _pass(kube, tls=True)
    assert controller_scheme.current_state(spec) == steady("https")
    assert (
        kube.objects[("AutoMQCluster", "demo")]["metadata"]["annotations"][CONTROLLER_API_STATE_ANNOTATION]
        == "https/https"
    )
    _pods(kube, spec)
    spec, c = _pass(kube, tls=True)
    assert c.progress == [] and controller_scheme.current_state(spec) == steady("https")


def test_a_new_cluster_starts_at_its_target() -> None:
    kube = FakeKube()
    kube.objects[("AutoMQCluster", "demo")] = {"metadata": {"name": "demo"}}
    spec, c = _pass(kube, tls=True)
    assert controller_scheme.current_state(spec) == steady("https") and c.progress == []
    assert (
        kube.objects[("AutoMQCluster", "demo")]["metadata"]["annotations"][CONTROLLER_API_STATE_ANNOTATION]
        == "https/https"
    )


def test_an_https_object_store_endpoint_is_not_an_https_controller() -> None:
    """What the nodes run is read from their controller URLs and settings, not from any
    "https://" in the ConfigMap (S3 endpoints are usually https)."""
    from automq.operator import security

    spec = parse_spec(
        {
            "objectStore": {"bucket": "demo-bucket", "endpoint": "https://s3.eu-west-1.amazonaws.com"},
            "security": {"controllerApi": {"tls": False}},
        }
    )
    config_map = builders.config_map(spec, REF)
    assert "https://s3." in config_map["data"]["broker.yaml"]
    assert controller_scheme.state_from_config_map(config_map) == steady("http")
    kube = FakeKube()
    kube.objects[("ConfigMap", "demo-config")] = config_map
    assert asyncio.run(security.pin_controller_scheme(kube, {"metadata": {"name": "demo"}}, REF)) is True
    assert controller_scheme.state_from_config_map({"data": {"broker.yaml": ": not yaml ["}}) is None
