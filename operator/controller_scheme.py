"""Switching a running cluster's controller API between http and https as rolling updates.

`spec.security.controllerApi.tls` says which scheme the cluster should end up with; what its
pods run now is recorded on the AutoMQCluster in the annotation `automq.io/controller-api-state`
as `<serve>/<client>`:

  serve   what the controllers serve on their port: `http`, `https`, or `both` (https, and
          plain http on the same port: the first byte tells a TLS handshake from an HTTP
          request, see automq.broker.controller.tls_site)
  client  the scheme brokers, the operator, the elastic loop and Spark/recovery Jobs call them with

A switch is three rolling updates, each started only when the cluster has converged on the
previous state (every pod runs the current template and is Ready, no Job still runs with the
old URLs):

  http/http  -> both/http    controllers restarted one at a time, now also serving https
  both/http  -> both/https   brokers restarted with https URLs and the CA; operator and Jobs switch
  both/https -> https/https  controllers restarted without plain http

and the mirror image for https -> http. Clients change scheme only while every controller
serves both, and a controller stops serving a scheme only when no client uses it, so no call is
ever made in a scheme its controller does not serve. A change of mind mid-way (tls flipped
back) walks back from wherever the cluster is. The annotation is written before anything is
rendered from the new state: an operator restarted mid-switch reads it and goes on.

`next_state` is the pure machine; `load_state` and `advance` are the thin I/O around it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from automq.operator import builders
from automq.operator.builders import ClusterRef
from automq.operator.reconcile import Cluster, Note, role_pods  # reconcile does not import this module
from automq.operator.spec import CONTROLLER_API_STATE_ANNOTATION, CONTROLLER_API_STATES, AutoMQClusterSpec

log = logging.getLogger(__name__)

Scheme = Literal["http", "https"]
Serve = Literal["http", "https", "both"]


@dataclass(frozen=True)
class ApiState:
    serve: Serve
    client: Scheme

    def encode(self) -> str:
        return f"{self.serve}/{self.client}"

    @property
    def steady(self) -> bool:
        return self.serve == self.client

    def describe(self) -> str:
        if self.steady:
            return f"controllers serve {self.serve}"
        return f"controllers serve http and https on one port, clients call them with {self.client}"


def steady(scheme: Scheme) -> ApiState:
    return ApiState(scheme, scheme)


def parse_state(value: str | None) -> ApiState | None:
    """The recorded state, or None when absent or not one the machine can reach."""
    # not e.g. "http/https": clients in a scheme their controllers do not serve
    if value not in CONTROLLER_API_STATES:
        return None
    serve, client = value.split("/")
    return ApiState(serve, client)  # type: ignore[arg-type]


def next_state(current: ApiState, target: Scheme, converged: bool) -> ApiState:
    """The state to render next. Leaving a steady state needs nothing running in the old one
    to be at risk (the first roll only adds a scheme); every later step waits for convergence."""
    if current == steady(target):
        return current
    if current.serve != "both":
        # Leaving a steady state: the controllers learn the other scheme first. Safe at any
        # moment (nothing a client uses goes away), but wait for a roll in progress to finish
        # so that one roll at a time is running.
        return ApiState("both", current.client) if converged else current
    if not converged:
        return current
    if current.client != target:
        return ApiState("both", target)
    return steady(target)


def target_scheme(spec: AutoMQClusterSpec) -> Scheme:
    return "https" if spec.controller_tls_target() else "http"


def current_state(spec: AutoMQClusterSpec) -> ApiState:
    """What `spec` renders now (its recorded state, else its target)."""
    serve: Serve = "both" if spec.controller_plain_http() else "https" if spec.controller_tls() else "http"
    return ApiState(serve, "https" if spec.controller_client_tls() else "http")


def state_from_config_map(config_map: dict[str, Any] | None) -> ApiState | None:
    """What the nodes of a cluster that has no recorded state were rendered with."""
    client = builders.rendered_client_scheme(config_map)
    if client is None:
        return None
    try:
        controller = yaml.safe_load(((config_map or {}).get("data") or {})["controller.yaml"]) or {}
    except (KeyError, yaml.YAMLError):
        return None
    security = controller.get("security") or {}
    if not security.get("controller_tls"):
        return steady("http") if client == "http" else ApiState("both", client)
    if security.get("controller_plain_http"):
        return ApiState("both", client)
    return steady("https") if client == "https" else ApiState("both", client)


async def load_state(api: Any, live: dict[str, Any], spec: AutoMQClusterSpec, ref: ClusterRef) -> ApiState:
    """The recorded state, applied to `spec`; recorded first when the cluster has none (a new
    cluster starts at its target; an existing one at what its ConfigMap says its nodes run)."""
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    state = parse_state(annotations.get(CONTROLLER_API_STATE_ANNOTATION))
    if state is None:
        config_map = await api.get("ConfigMap", ref.namespace, builders.config_map_name(ref))
        state = state_from_config_map(config_map) or steady(target_scheme(spec))
        await record(api, live, ref, state)
    spec.set_controller_api_state(state.serve, state.client)
    return state


async def record(api: Any, live: dict[str, Any], ref: ClusterRef, state: ApiState) -> None:
    value = state.encode()
    await api.patch(
        "AutoMQCluster",
        ref.namespace,
        ref.name,
        {"metadata": {"annotations": {CONTROLLER_API_STATE_ANNOTATION: value}}},
    )
    live.setdefault("metadata", {}).setdefault("annotations", {})[CONTROLLER_API_STATE_ANNOTATION] = value


def converged(
    spec: AutoMQClusterSpec, ref: ClusterRef, pods: Mapping[str, list[dict[str, Any]]], broker_replicas: int
) -> str | None:
    """None when every pod of both roles runs the template of the current state and is Ready,
    else what is still outstanding (for the progress message)."""
    desired = {"controller": spec.controller.replicas, "broker": broker_replicas}
    for role in builders.ROLES:
        want = builders.template_hash(builders.statefulset(spec, ref, role))
        role_pods = pods.get(role) or []
        if len(role_pods) != desired[role]:
            return f"{len(role_pods)} of {desired[role]} {role} pods exist"
        for pod in role_pods:
            meta = pod.get("metadata") or {}
            if (meta.get("annotations") or {}).get(builders.TEMPLATE_HASH) != want:
                return f"{meta.get('name')} still runs the previous template"
            conditions = (pod.get("status") or {}).get("conditions") or []
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
            if meta.get("deletionTimestamp") or not ready:
                return f"{meta.get('name')} is not ready"
    return None


def jobs_using(jobs: list[dict[str, Any]], scheme: Scheme, service: str) -> list[str]:
    """Names of running Jobs whose pods were given a URL of the controllers (`service`, their
    headless Service) in `scheme`: a Spark or WAL recovery Job started before the clients switched."""
    url = re.compile(rf"{scheme}://[^\"\s]*{re.escape(service)}")
    running = [j for j in jobs if int((j.get("status") or {}).get("active") or 0) > 0]
    return [j["metadata"]["name"] for j in running if url.search(json.dumps(j.get("spec") or {}))]


async def step(c: Cluster) -> None:
    """The reconcile step (first of a full pass, see handlers): take the next step of a switch
    when the cluster has converged on the current one. `c.spec` already carries the recorded
    state (load_state)."""
    target = target_scheme(c.spec)
    current = current_state(c.spec)
    if current == steady(target):
        return
    pods: dict[str, list[dict[str, Any]]] = {role: await role_pods(c, role) for role in builders.ROLES}
    waiting = converged(c.spec, c.ref, pods, c.spec.broker.replicas)
    going = next_state(current, target, waiting is None)
    if going.steady and going != current:
        # A scheme goes away next: no Job may still be calling the controllers with it.
        old: Scheme = "http" if going.serve == "https" else "https"
        jobs = await c.api.list("Job", c.ref.namespace, builders.selector_labels(c.ref))
        running = jobs_using(jobs, old, builders.headless_service_name(c.ref, "controller"))
        if running:
            waiting, going = f"Job(s) {', '.join(running)} still call the controllers with {old}", current
    if going != current:
        await record(c.api, {}, c.ref, going)
        c.spec.set_controller_api_state(going.serve, going.client)
        c.reporter.info("ControllerApiScheme", f"switching the controller API to {target}: now {going.describe()}")
        log.info("%s/%s: controller API state %s -> %s", c.ref.namespace, c.ref.name, current.encode(), going.encode())
        current = going
    if current != steady(target):
        detail = f" (waiting: {waiting})" if waiting else ""
        c.progress.append(
            Note("ControllerApiScheme", f"switching the controller API to {target}: {current.describe()}{detail}")
        )
