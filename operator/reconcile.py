"""Reconciliation of one AutoMQCluster: a chain of small named steps over the pure builders.

    configMap → services → serviceAccountAndRbac → podDisruptionBudgets → sparkCronJobs
      → controllerStatefulSet → brokerStatefulSet (scale-in drains first)
      → rollingUpdate → podsReady → sparkJobsStatus → updateStatus

Each step is an async function of a `Cluster` (what the steps share: the API, the spec, what was
observed, what is still in progress, what is wrong). A pass applies what differs, advances a
rolling change by at most one pod, and reports; the kopf handler runs passes until the cluster
is Ready (`kopf.TemporaryError` between them), so a spec change made mid-roll is picked up by
the next pass.

Rolling changes (StatefulSets use `updateStrategy: OnDelete`, the operator chooses the order):
  - a pod whose `automq.io/template-hash` differs from the StatefulSet's template is outdated;
  - outdated pods that are not Ready are restarted first (they serve nothing);
  - otherwise nothing restarts while any pod of the cluster is not Ready;
  - brokers go one at a time: drain through the controller, delete the pod, wait until its
    replacement is Ready, undrain (a single broker has nowhere to move leadership to and is
    restarted without draining); controllers go last, one at a time.
Scale-in drains the brokers being removed before the StatefulSet shrinks. Drained broker ids are
kept in `status.drainedBrokers` so an operator restart never leaves a broker drained.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from automq.broker.balancer.planner import Move
from automq.operator import builders, network_policies, security, sparkjobs
from automq.operator.builders import ClusterRef, Role
from automq.operator.controller_api import ControllerApi, ControllerApiError, ControllerApiFactory
from automq.operator.kube import KubeApi, KubeError, apply, wait_until
from automq.operator.moves import execute_moves
from automq.operator.quantity import same_quantity
from automq.operator.spec import AutoMQClusterSpec, AutoMQClusterStatus, Condition, ListenerStatus, RoleStatus

log = logging.getLogger(__name__)

# Container states that mean "this will not get better by waiting a few seconds".
STUCK_REASONS = {
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


class Reporter(Protocol):
    """Kubernetes Events about the cluster, for a person to read (`kubectl describe amq`)."""

    def info(self, reason: str, message: str) -> None: ...

    def warn(self, reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class ReconcileSettings:
    poll_interval_s: float = 2.0  # how often to look at a pod being waited for
    pod_ready_timeout_s: float = 600.0  # a restarted pod that is not Ready by then is reported
    drain_timeout_s: float = 120.0  # a drain that takes longer is reported; the restart goes on
    scale_in_wait_s: float = 30.0  # how long one pass waits for scale-in drains before yielding


@dataclass(frozen=True)
class Note:
    reason: str
    message: str
    # False when whoever found the problem already posted its event (node loss posts NodeLost
    # once per incident): the status step then only puts it in the Degraded condition.
    event: bool = True


@dataclass
class Cluster:
    """Everything the steps of one pass share."""

    api: KubeApi
    ref: ClusterRef
    spec: AutoMQClusterSpec
    raw_spec: dict[str, Any]  # as stored, to notice a change while rolling
    generation: int
    previous_status: dict[str, Any]
    reporter: Reporter
    controller_api_factory: ControllerApiFactory
    settings: ReconcileSettings = field(default_factory=ReconcileSettings)
    # Whether this operator replica may still write (leader election): checked between steps,
    # so a replica that lost leadership mid-pass stops at the next step and writes no status.
    may_act: Callable[[], bool] = lambda: True
    # Filled in by the steps.
    broker_replicas: int = 0  # what the broker StatefulSet is set to (above spec while draining)
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    progress: list[Note] = field(default_factory=list)
    problems: list[Note] = field(default_factory=list)
    drained: list[int] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    _controller_api: ControllerApi | None = None

    def __post_init__(self) -> None:
        self.drained = list(self.previous_status.get("drainedBrokers") or [])
        self.broker_replicas = self.spec.broker.replicas

    def controller_api(self) -> ControllerApi:
        if self._controller_api is None:
            self._controller_api = self.controller_api_factory(builders.controller_urls(self.spec, self.ref))
        return self._controller_api

    async def close(self) -> None:
        if self._controller_api is not None:
            await self._controller_api.close()
            self._controller_api = None

    async def remember_drained(self, node_ids: list[int]) -> None:
        """Persist drained ids before acting, so a crash in between cannot strand a drained broker."""
        merged = sorted(set(self.drained) | set(node_ids))
        if merged != self.drained:
            self.drained = merged
            await self.api.patch(
                "AutoMQCluster", self.ref.namespace, self.ref.name, {"status": {"drainedBrokers": merged}}, "status"
            )


Step = Callable[[Cluster], Awaitable[None]]


# ---------------------------------------------------------------------------------------------
# Pods


def ordinal(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["name"].rsplit("-", 1)[1])


def is_ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_hash(pod: dict[str, Any]) -> str | None:
    return (pod.get("metadata", {}).get("annotations") or {}).get(builders.TEMPLATE_HASH)


def stuck_reason(pod: dict[str, Any]) -> Note | None:
    """Why a pod cannot become Ready on its own (crash loop, image, unschedulable), if it cannot."""
    name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            detail = f" (restarts: {cs.get('restartCount', 0)})" if waiting["reason"] == "CrashLoopBackOff" else ""
            extra = f": {waiting['message']}" if waiting.get("message") else ""
            return Note(waiting["reason"], f"pod {name} container {cs.get('name')}: {waiting['reason']}{detail}{extra}")
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return Note("Unschedulable", f"pod {name} cannot be scheduled: {condition.get('message', '')}".rstrip(": "))
    return None


async def role_pods(c: Cluster, role: Role) -> list[dict[str, Any]]:
    prefix = builders.statefulset_name(c.ref, role) + "-"
    pods = await c.api.list("Pod", c.ref.namespace, builders.selector_labels(c.ref, role))
    pods = [
        p for p in pods if p["metadata"]["name"].startswith(prefix) and p["metadata"]["name"][len(prefix) :].isdigit()
    ]
    return sorted(pods, key=ordinal)


# ---------------------------------------------------------------------------------------------
# Steps


async def _apply(c: Cluster, obj: dict[str, Any]) -> dict[str, Any]:
    result, live = await apply(c.api, obj)
    if result != "unchanged":
        log.info("%s %s/%s %s", obj["kind"], c.ref.namespace, obj["metadata"]["name"], result)
    return live


async def security_material(c: Cluster) -> None:
    """Controller token, CAs and certificates (or cert-manager's resources), NetworkPolicies:
    before any pod exists, so nodes start with the Secrets they mount."""
    if c.spec.controller_token():
        await security.ensure_controller_token(c.api, c.ref)
    await security.ensure_broker_credentials(c.api, c.spec, c.ref)  # before the broker pods mount it
    if c.spec.needs_certificates() and c.spec.security.certificates.issuer == "operator":
        now = dt.datetime.now(dt.UTC)
        for note in await security.ensure_certificates(c.api, c.spec, c.ref, now):
            c.reporter.info("CertificateIssued", note)
    if c.spec.controller_token() or c.spec.controller_tls():
        # after the certificates: the operator verifies the controllers against their Secret's CA
        c.controller_api_factory = await security.authenticated(c.controller_api_factory, c.api, c.spec, c.ref)
    for obj in security.cert_manager_objects(c.spec, c.ref):
        try:
            await _apply(c, obj)
        except KubeError as exc:
            if exc.status != 404:
                raise
            c.problems.append(
                Note(
                    "CertManagerMissing",
                    f"spec.security.certificates.issuer is cert-manager but the API has no {obj['apiVersion']} "
                    f"{obj['kind']} (install cert-manager, or use issuer: operator): {exc}",
                )
            )
            break
    wanted = network_policies.network_policies(c.spec, c.ref)
    for policy in wanted:
        await _apply(c, policy)
    names = {p["metadata"]["name"] for p in wanted}
    for role in builders.ROLES:
        name = network_policies.policy_name(c.ref, role)
        if name not in names and await c.api.get("NetworkPolicy", c.ref.namespace, name) is not None:
            await c.api.delete("NetworkPolicy", c.ref.namespace, name)


async def broker_credentials(c: Cluster) -> None:
    """The brokers' own SCRAM user (broker-to-broker calls on a SASL listener) in the cluster's
    metadata, once a controller is up; the cluster is not Ready before it is there."""
    password = await security.ensure_broker_credentials(c.api, c.spec, c.ref)
    if password is None:
        return
    controllers = c.status.get("controllers")
    if controllers is None or controllers.ready == 0:
        c.progress.append(Note("BrokerCredentials", "waiting for a controller to store the brokers' SCRAM credential"))
        return
    try:
        await security.store_broker_credential(c.controller_api(), c.spec, password)
    except ControllerApiError as exc:
        c.progress.append(Note("BrokerCredentials", f"the brokers' SCRAM credential is not stored yet: {exc}"))


async def config_map(c: Cluster) -> None:
    await _apply(c, builders.config_map(c.spec, c.ref))


async def services(c: Cluster) -> None:
    desired = builders.services(c.spec, c.ref)
    for service in desired:
        await _apply(c, service)
    # External Services of brokers scaled away, or of listeners removed from the spec.
    names = {s["metadata"]["name"] for s in desired}
    for live in await c.api.list("Service", c.ref.namespace, builders.selector_labels(c.ref, "broker")):
        meta = live.get("metadata") or {}
        if builders.LISTENER_LABEL in (meta.get("labels") or {}) and meta.get("name") not in names:
            await c.api.delete("Service", c.ref.namespace, meta["name"])


async def service_account_and_rbac(c: Cluster) -> None:
    await _apply(c, builders.service_account(c.spec, c.ref))
    await _apply(c, builders.lease_role(c.spec, c.ref))
    await _apply(c, builders.lease_role_binding(c.spec, c.ref))


async def pod_disruption_budgets(c: Cluster) -> None:
    for role in builders.ROLES:
        await _apply(c, builders.pod_disruption_budget(c.spec, c.ref, role))


async def spark_cron_jobs(c: Cluster) -> None:
    """A CronJob per enabled Spark job; a disabled job's CronJob (and with it its Jobs) goes."""
    desired = sparkjobs.desired_cron_jobs(c.spec, c.ref)
    if desired:
        await _apply(c, sparkjobs.service_account(c.ref))
    templates = sparkjobs.executor_templates(c.spec, c.ref)
    if templates is not None:
        # executor pods: their template, and a Role letting the drivers create them
        await _apply(c, templates)
        await _apply(c, sparkjobs.driver_role(c.spec, c.ref))
        await _apply(c, sparkjobs.driver_role_binding(c.ref))
    elif await c.api.get("Role", c.ref.namespace, sparkjobs.service_account_name(c.ref)) is not None:
        await _apply(c, sparkjobs.driver_role(c.spec, c.ref))  # no executor pods any more: it grants nothing
    for job in sparkjobs.JOBS:
        if job in desired:
            await _apply(c, desired[job])
        elif await c.api.get("CronJob", c.ref.namespace, sparkjobs.cron_job_name(c.ref, job)) is not None:
            await c.api.delete("CronJob", c.ref.namespace, sparkjobs.cron_job_name(c.ref, job))
            c.reporter.info(
                "SparkJobRemoved", f"{job} is disabled: CronJob {sparkjobs.cron_job_name(c.ref, job)} deleted"
            )


async def spark_jobs_status(c: Cluster) -> None:
    """Each enabled job's last runs into status.sparkJobs; a Warning event per failed run."""
    previous = c.previous_status.get("sparkJobs") or {}
    observed: dict[str, Any] = {}
    for plan in sparkjobs.enabled_jobs(c.spec, c.ref):
        name = sparkjobs.cron_job_name(c.ref, plan.name)
        cron = await c.api.get("CronJob", c.ref.namespace, name)
        if cron is None:
            continue
        jobs = await c.api.list("Job", c.ref.namespace, sparkjobs.job_labels(c.ref, plan.name))
        status = sparkjobs.job_status(cron, jobs)
        before = previous.get(plan.name) or {}
        if status.last_failed_job and status.last_failed_job != before.get("lastFailedJob"):
            c.reporter.warn(
                "SparkJobFailed",
                f"{plan.name} run {status.last_failed_job} failed: {status.last_failure_message} "
                f"(kubectl logs job/{status.last_failed_job})",
            )
        observed[plan.name] = status
    c.status["sparkJobs"] = observed


def _claims(sts: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [
        (
            t["metadata"]["name"],
            t["spec"].get("resources", {}).get("requests", {}).get("storage"),
            t["spec"].get("storageClassName"),
        )
        for t in sts.get("spec", {}).get("volumeClaimTemplates") or []
    ]


def _same_claims(live: list[tuple[str, Any, Any]], desired: list[tuple[str, Any, Any]]) -> bool:
    """Claim templates equal up to how the size is written (the server stores `10240Mi` as `10Gi`)."""
    return len(live) == len(desired) and all(
        a[0] == b[0] and a[2] == b[2] and same_quantity(a[1], b[1]) for a, b in zip(live, desired, strict=True)
    )


async def _apply_statefulset(c: Cluster, role: Role, desired: dict[str, Any]) -> None:
    live = await c.api.get("StatefulSet", c.ref.namespace, desired["metadata"]["name"])
    if live is not None and not _same_claims(_claims(live), _claims(desired)):
        # volumeClaimTemplates are immutable: changing the WAL kind, size or class would need the
        # StatefulSet recreated and every WAL moved. Keep the running shape, change replicas only.
        c.problems.append(
            Note(
                "WalChangeNotSupported",
                "spec.broker.wal (kind, size, storageClassName) cannot change on a running cluster: "
                f"the StatefulSet has {_claims(live) or 'no WAL volume'}, the spec asks for {_claims(desired) or 'no WAL volume'}. "
                "Revert spec.broker.wal; the rest of the spec is applied except broker pod changes.",
            )
        )
        if live["spec"].get("replicas") != desired["spec"]["replicas"]:
            await c.api.patch(
                "StatefulSet",
                c.ref.namespace,
                desired["metadata"]["name"],
                {"spec": {"replicas": desired["spec"]["replicas"]}},
            )
        return
    await _apply(c, desired)


async def controller_statefulset(c: Cluster) -> None:
    await _apply_statefulset(c, "controller", builders.statefulset(c.spec, c.ref, "controller"))


async def broker_statefulset(c: Cluster) -> None:
    wanted = c.spec.broker.replicas
    live = await c.api.get("StatefulSet", c.ref.namespace, builders.statefulset_name(c.ref, "broker"))
    current = int(live["spec"].get("replicas", 0)) if live else 0
    replicas = wanted
    if live is not None and wanted < current:
        removing = list(range(wanted, current))
        if wanted == 0:
            # No broker would be left to take leadership: draining could never finish.
            c.reporter.warn(
                "ScaledToZero", f"scaling brokers from {current} to 0: every partition is offline until brokers return"
            )
        elif await _drain_for_scale_in(c, removing):
            c.reporter.info("ScaledIn", f"brokers {removing} drained; scaling brokers from {current} to {wanted}")
        else:
            replicas = current
            c.progress.append(Note("ScalingIn", f"draining brokers {removing} before removing them"))
    elif live is not None and wanted > current:
        c.reporter.info("ScalingOut", f"scaling brokers from {current} to {wanted}")
    c.broker_replicas = replicas
    await _apply_statefulset(c, "broker", builders.statefulset(c.spec, c.ref, "broker", replicas=replicas))


async def _drain_for_scale_in(c: Cluster, node_ids: list[int]) -> bool:
    pods = {ordinal(p): p for p in await role_pods(c, "broker")}
    # A broker whose pod is gone or not serving leads nothing the controller would not move anyway.
    running = [n for n in node_ids if n in pods and is_ready(pods[n])]
    if not running:
        return True
    await c.remember_drained(running)
    api = c.controller_api()
    try:
        serving = {builders.broker_node_id(n) for n, p in pods.items() if is_ready(p) and n not in node_ids}
        if (c.spec.balancing.enabled or c.spec.autoscaling.enabled) and not await _move_off(
            c, api, [builders.broker_node_id(n) for n in running], serving
        ):
            return False
        for node_id in running:
            await api.drain_broker(builders.broker_node_id(node_id))

        async def all_drained() -> bool:
            return all([await api.broker_drained(builders.broker_node_id(n)) for n in running])

        return await wait_until(all_drained, c.settings.scale_in_wait_s, c.settings.poll_interval_s)
    except ControllerApiError as exc:
        c.problems.append(Note("ControllerUnavailable", f"cannot drain brokers {running} for scale-in: {exc}"))
        return False


async def _move_off(c: Cluster, api: ControllerApi, leaving: list[int], serving: set[int]) -> bool:
    """Move the leaving brokers' partitions off at most spec.balancing.maxConcurrentMoves at a time.

    With the elastic features on, scale-in is bounded like any rebalance: the controller's drain
    alone would start every move at once, and each waits for its tail upload, so produce latency
    suffers for the whole drain (measured by benchmarks/elastic_bench.py). Targets: the active
    brokers that stay and whose pods are Ready, fewest partitions first. The drain that follows marks the brokers draining
    (nothing new is placed on them) and moves whatever was created meanwhile; this pass spends at
    most scale_in_wait_s here (False: not done yet), the next one continues."""
    image = await api.metadata()
    staying = sorted(b.node_id for b in image.brokers if b.state == "active" and b.node_id in serving)
    if not staying:
        return True  # nowhere to move to: the drain reports it
    counts: dict[int, int] = dict.fromkeys(staying, 0)
    for topic in image.topics:
        for p in topic.partitions:
            if p.leader in counts:
                counts[p.leader] += 1
    moves = []
    for topic in image.topics:
        for p in topic.partitions:
            if p.leader in leaving and p.state == "online":
                target = min(staying, key=lambda b: (counts[b], b))
                counts[target] += 1
                moves.append(Move(topic.name, p.partition, p.leader, target, "evacuate"))
    if not moves:
        return True
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        outcomes = await asyncio.wait_for(
            execute_moves(
                api,
                moves,
                max_concurrent=c.spec.balancing.max_concurrent_moves,
                timeout_s=c.settings.drain_timeout_s,
                poll_s=min(c.settings.poll_interval_s, 0.25),
            ),
            c.settings.scale_in_wait_s,
        )
    except TimeoutError:
        c.progress.append(Note("ScalingIn", f"moving {len(moves)} partitions off brokers {leaving}, continuing"))
        return False
    failed = [o for o in outcomes if not o.ok]
    c.reporter.info(
        "DrainedForScaleIn",
        f"moved {len(outcomes) - len(failed)} partitions off brokers {leaving} in {loop.time() - start:.1f}s, "
        f"at most {c.spec.balancing.max_concurrent_moves} at a time"
        + (f"; {len(failed)} left to the controller's drain (first: {failed[0].error})" if failed else ""),
    )
    return True


async def rolling_update(c: Cluster) -> None:
    """Restart outdated pods one at a time: brokers first (drained), controllers last.

    After each restarted pod the spec is read again; if it changed, the pass ends so the next
    one rolls towards the newest spec instead of finishing an outdated plan."""
    if any(p.reason == "WalChangeNotSupported" for p in c.problems):
        return
    while True:
        restarted = await _roll_one(c)
        if not restarted:
            return
        live = await c.api.get("AutoMQCluster", c.ref.namespace, c.ref.name)
        if live is None or live.get("spec") != c.raw_spec:
            c.progress.append(
                Note("RollingUpdate", "the spec changed during the rolling update; continuing with the new spec")
            )
            return


async def _roll_one(c: Cluster) -> bool:
    """Restart the next outdated pod if it is safe to; True when one was restarted and is Ready."""
    pods = {role: await role_pods(c, role) for role in builders.ROLES}
    limits = {"broker": c.broker_replicas, "controller": c.spec.controller.replicas}
    want = {role: builders.template_hash(builders.statefulset(c.spec, c.ref, role)) for role in builders.ROLES}
    outdated = {
        role: [p for p in pods[role] if ordinal(p) < limits[role] and pod_hash(p) != want[role]]
        for role in ("broker", "controller")
    }
    # Outdated pods that are not Ready serve nothing: restart them first, whatever their role
    # (crash-looping controllers waiting for a config fix must not wait for the brokers' turn).
    for role, candidates in outdated.items():
        for pod in candidates:
            if is_ready(pod):
                continue
            if not pod["metadata"].get("deletionTimestamp"):
                await c.api.delete("Pod", c.ref.namespace, pod["metadata"]["name"])
                c.reporter.info(
                    "RestartedUnreadyPod", f"restarted {pod['metadata']['name']} (not ready, outdated) without draining"
                )
            c.progress.append(
                Note("RollingUpdate", f"{role} pod {pod['metadata']['name']} restarted with the new template")
            )
            return False
    order: tuple[Role, ...] = ("broker", "controller")
    for role in order:
        if not outdated[role]:
            continue
        waiting = [p["metadata"]["name"] for r in builders.ROLES for p in pods[r] if not is_ready(p)]
        if waiting:
            c.progress.append(
                Note(
                    "RollingUpdate",
                    f"waiting for {', '.join(waiting)} to be ready before restarting {outdated[role][0]['metadata']['name']}",
                )
            )
            return False
        others = [p for p in pods["broker"] if p is not outdated[role][0]]
        return await _restart(c, role, outdated[role][0], want[role], drain=role == "broker" and bool(others))
    return False


async def _restart(c: Cluster, role: Role, pod: dict[str, Any], want: str, *, drain: bool) -> bool:
    """Restart one Ready pod; brokers are drained first unless there is no other broker to take over."""
    name = pod["metadata"]["name"]
    node_id = builders.broker_node_id(ordinal(pod)) if drain else None
    if node_id is not None:
        await c.remember_drained([node_id])
        api = c.controller_api()
        try:
            await api.drain_broker(node_id)

            async def drained() -> bool:
                return await api.broker_drained(node_id)

            if not await wait_until(drained, c.settings.drain_timeout_s, c.settings.poll_interval_s):
                c.reporter.warn(
                    "DrainTimeout",
                    f"broker {node_id} still leads partitions after {c.settings.drain_timeout_s:.0f}s; restarting it anyway",
                )
        except ControllerApiError as exc:
            c.problems.append(
                Note("ControllerUnavailable", f"cannot drain broker {node_id} before restarting {name}: {exc}")
            )
            c.progress.append(Note("RollingUpdate", f"waiting to drain broker {node_id}"))
            return False
    c.reporter.info("RollingRestart", f"restarting {name} to apply the new {role} template")
    restarting = Note("RollingUpdate", f"restarting {name}")
    c.progress.append(restarting)
    await write_progress(c)
    old_uid = pod["metadata"].get("uid")
    await c.api.delete("Pod", c.ref.namespace, name)

    async def replaced_and_ready() -> bool:
        new = await c.api.get("Pod", c.ref.namespace, name)
        return new is not None and new["metadata"].get("uid") != old_uid and pod_hash(new) == want and is_ready(new)

    if await wait_until(replaced_and_ready, c.settings.pod_ready_timeout_s, c.settings.poll_interval_s):
        if node_id is not None:
            await _undrain(c, node_id)
        c.reporter.info("PodRestarted", f"{name} is ready with the new template")
        c.progress.remove(restarting)
        return True
    else:
        # Leave the broker drained: podsReady undrains it once it is Ready.
        c.problems.append(
            Note(
                "PodNotReady",
                f"{name} was restarted but is not ready after {c.settings.pod_ready_timeout_s:.0f}s; rolling update paused",
            )
        )
        c.reporter.warn(
            "RollingUpdatePaused", f"{name} is not ready after its restart; no further pods are restarted until it is"
        )
        return False


async def _undrain(c: Cluster, node_id: int, *, quiet: bool = False) -> bool:
    try:
        await c.controller_api().undrain_broker(node_id)
    except ControllerApiError as exc:
        if not quiet:
            c.problems.append(Note("ControllerUnavailable", f"cannot undrain broker {node_id}: {exc}"))
            return False
    c.drained = [n for n in c.drained if n != node_id]
    return True


async def pods_ready(c: Cluster) -> None:
    """Observe the pods: counts, stuck ones, and brokers to undrain now that they are back."""
    desired = {"broker": c.spec.broker.replicas, "controller": c.spec.controller.replicas}
    for role in builders.ROLES:
        c.pods[role] = await role_pods(c, role)
        want = builders.template_hash(builders.statefulset(c.spec, c.ref, role))
        pods = c.pods[role]
        ready = sum(1 for p in pods if is_ready(p))
        updated = sum(1 for p in pods if pod_hash(p) == want)
        c.status[f"{role}s"] = RoleStatus(
            desired=desired[role], replicas=len(pods), ready=ready, updated=updated, summary=f"{ready}/{desired[role]}"
        )
        for pod in pods:
            note = stuck_reason(pod)
            if note is not None:
                c.problems.append(note)
        if ready < desired[role] or len(pods) != desired[role] or updated < len(pods):  # noqa: SIM102
            if not any(n.reason in ("RollingUpdate", "ScalingIn") for n in c.progress):
                c.progress.append(
                    Note(
                        "WaitingForPods",
                        f"{role}s: {ready} of {desired[role]} ready, {updated} of {len(pods)} up to date",
                    )
                )
    brokers = {ordinal(p): p for p in c.pods["broker"]}
    for node_id in list(c.drained):
        broker_pod = brokers.get(node_id)
        back = broker_pod is not None and is_ready(broker_pod) and node_id < c.spec.broker.replicas
        gone = node_id >= c.spec.broker.replicas and broker_pod is None
        if back:
            await _undrain(c, node_id)
        elif gone:
            # Removed by scale-in. Undrain anyway (best effort: the controller may have
            # forgotten the broker), so that a later scale-out reusing the id is not drained.
            await _undrain(c, node_id, quiet=True)
            await _unregister(c, node_id)


async def _unregister(c: Cluster, node_id: int) -> None:
    """A broker scaled in is gone for good: the controller stops counting it (a broker that
    exited cleanly did this itself; one killed at the end of its grace period did not)."""
    try:
        await c.controller_api().unregister_broker(builders.broker_node_id(node_id))
    except ControllerApiError as exc:
        log.warning("%s/%s: %s", c.ref.namespace, c.ref.name, exc)  # it times out of its session anyway
        return
    c.reporter.info("BrokerUnregistered", f"broker {node_id}, removed by scale-in, is unregistered at the controller")


def _condition(
    previous: list[dict[str, Any]], kind: str, ok: bool, reason: str, message: str, generation: int, now: str
) -> Condition:
    status = "True" if ok else "False"
    before = next((p for p in previous if p.get("type") == kind), None)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == status and before.get("lastTransitionTime")
        else now
    )
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


# The conditions a reconcile pass computes; others (Balancing, Autoscaling) belong to the elastic
# loop and are carried over untouched, since a merge patch replaces the whole list.
RECONCILE_CONDITIONS = ("Ready", "Progressing", "Degraded")


def _others(previous: list[dict[str, Any]]) -> list[Condition]:
    return [Condition.model_validate(p) for p in previous if p.get("type") not in RECONCILE_CONDITIONS]


def _conditions(c: Cluster, now: str) -> list[Condition]:
    previous = c.previous_status.get("conditions") or []
    problems, progress = c.problems, c.progress
    ready = not problems and not progress
    if ready:
        ready_reason, ready_message = "Ready", "every controller and broker is ready and up to date"
    else:
        first = (problems or progress)[0]
        ready_reason, ready_message = first.reason, first.message
    return [
        _condition(previous, "Ready", ready, ready_reason, ready_message, c.generation, now),
        _condition(
            previous,
            "Progressing",
            bool(progress),
            progress[0].reason if progress else "UpToDate",
            "; ".join(n.message for n in progress) if progress else "nothing to change",
            c.generation,
            now,
        ),
        _condition(
            previous,
            "Degraded",
            bool(problems),
            problems[0].reason if problems else "AsExpected",
            "; ".join(n.message for n in problems) if problems else "no problems seen",
            c.generation,
            now,
        ),
        *_others(previous),
    ]


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def write_progress(c: Cluster) -> None:
    """Conditions only, in the middle of a pass (a rolling update can take a while)."""
    conditions = [cond.model_dump(by_alias=True, mode="json") for cond in _conditions(c, _now())]
    await c.api.patch("AutoMQCluster", c.ref.namespace, c.ref.name, {"status": {"conditions": conditions}}, "status")
    c.previous_status = {**c.previous_status, "conditions": conditions}


async def update_status(c: Cluster) -> None:
    previous = c.previous_status.get("conditions") or []
    problems = c.problems
    conditions = _conditions(c, _now())
    ready = conditions[0].status == "True"
    ready_message = conditions[0].message
    was_ready = any(p.get("type") == "Ready" and p.get("status") == "True" for p in previous)
    if ready and not was_ready:
        c.reporter.info("ClusterReady", ready_message)
    for note in problems:
        if not note.event:
            continue
        # One event per problem and object, not one per pass (a restart count keeps changing).
        subject = note.message.split(":", 1)[0]
        if not any(
            p.get("type") == "Degraded" and p.get("status") == "True" and subject in p.get("message", "")
            for p in previous
        ):
            c.reporter.warn(note.reason, note.message)
    status = AutoMQClusterStatus(
        observed_generation=c.generation,
        conditions=conditions,
        controllers=c.status.get("controllers", RoleStatus()),
        brokers=c.status.get("brokers", RoleStatus()),
        bootstrap=builders.bootstrap_address(c.spec, c.ref),
        controller_endpoint=builders.controller_service_url(c.spec, c.ref),
        controller_api=builders.controller_api_summary(c.spec),
        listeners=[ListenerStatus.model_validate(e) for e in builders.listener_status(c.spec, c.ref)],
        broker_selector=builders.broker_selector(c.ref),
        drained_brokers=sorted(c.drained),
        # A pass that stopped before sparkJobsStatus keeps what the last one saw.
        spark_jobs=c.status.get("sparkJobs", c.previous_status.get("sparkJobs") or {}),
    )
    # balancing/autoscaling are the elastic loop's to write: leave them out of this patch.
    c.status["document"] = status.model_dump(by_alias=True, mode="json", exclude={"balancing", "autoscaling"})
    patch = copy.deepcopy(c.status["document"])
    # A merge patch keeps keys it does not name: drop disabled jobs' entries and the field that
    # listed placeholders before the Spark jobs existed.
    gone = {name: None for name in c.previous_status.get("sparkJobs") or {} if name not in patch["sparkJobs"]}
    patch["sparkJobs"] = {**patch["sparkJobs"], **gone}
    if "notImplemented" in c.previous_status:
        patch["notImplemented"] = None
    await c.api.patch("AutoMQCluster", c.ref.namespace, c.ref.name, {"status": patch}, "status")


# What a status refresh between changes runs: observe, then write the status.
STATUS_STEPS: tuple[tuple[str, Step], ...] = (("podsReady", pods_ready), ("sparkJobsStatus", spark_jobs_status))

STEPS: tuple[tuple[str, Step], ...] = (
    ("securityMaterial", security_material),
    ("configMap", config_map),
    ("services", services),
    ("serviceAccountAndRbac", service_account_and_rbac),
    ("podDisruptionBudgets", pod_disruption_budgets),
    ("sparkCronJobs", spark_cron_jobs),
    ("controllerStatefulSet", controller_statefulset),
    ("brokerStatefulSet", broker_statefulset),
    ("rollingUpdate", rolling_update),
    ("podsReady", pods_ready),
    ("brokerCredentials", broker_credentials),
    ("sparkJobsStatus", spark_jobs_status),
)


@dataclass(frozen=True)
class Outcome:
    ready: bool
    progressing: bool  # something is being changed (vs. only waiting for a problem to clear)
    message: str
    status: dict[str, Any]


async def reconcile(c: Cluster, steps: tuple[tuple[str, Step], ...] = STEPS) -> Outcome:
    """One pass of the steps (all by default); the status is written even when a step fails."""
    try:
        for name, step in steps:
            if not c.may_act():
                log.info("%s/%s: no longer the leading operator replica; pass stopped", c.ref.namespace, c.ref.name)
                break
            log.debug("%s/%s: %s", c.ref.namespace, c.ref.name, name)
            await step(c)
    except Exception as exc:
        c.problems.append(Note("ReconcileFailed", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        try:
            if c.may_act():
                await update_status(c)
        finally:
            await c.close()
    notes = c.problems + c.progress
    return Outcome(
        ready=not notes,
        progressing=bool(c.progress),
        message="; ".join(n.message for n in notes) or "ready",
        status=c.status.get("document", {}),
    )


async def write_invalid_spec_status(
    api: KubeApi, ref: ClusterRef, generation: int, previous_status: dict[str, Any], message: str
) -> None:
    """Report a spec the models reject: Ready False and Degraded True, reason InvalidSpec."""
    now = _now()
    previous = previous_status.get("conditions") or []
    conditions = [
        _condition(previous, "Ready", False, "InvalidSpec", message, generation, now),
        _condition(previous, "Progressing", False, "InvalidSpec", "the spec must be fixed first", generation, now),
        _condition(previous, "Degraded", True, "InvalidSpec", message, generation, now),
        *_others(previous),
    ]
    patch = {
        "status": {
            "observedGeneration": generation,
            "conditions": [cond.model_dump(by_alias=True, mode="json") for cond in conditions],
        }
    }
    await api.patch("AutoMQCluster", ref.namespace, ref.name, patch, "status")


async def delete_cluster_data(
    api: KubeApi, ref: ClusterRef, spec: AutoMQClusterSpec | None, reporter: Reporter
) -> list[str]:
    """On deletion: remove the WAL volume claims when deletionPolicy is Delete; say what is kept."""
    if spec is None or spec.deletion_policy != "Delete":
        bucket = f" and the objects in bucket {spec.object_store.bucket}" if spec is not None else ""
        reporter.info("DataRetained", f"deletionPolicy is Retain: WAL volume claims{bucket} are kept")
        return []
    claims = await api.list("PersistentVolumeClaim", ref.namespace, builders.selector_labels(ref, "broker"))
    prefix = f"wal-{builders.statefulset_name(ref, 'broker')}-"
    deleted = []
    for claim in claims:
        name = claim["metadata"]["name"]
        if name.startswith(prefix) and await api.delete("PersistentVolumeClaim", ref.namespace, name):
            deleted.append(name)
    reporter.info(
        "DataDeleted",
        f"deletionPolicy is Delete: deleted WAL volume claims {deleted or '(none)'}; objects in bucket {spec.object_store.bucket} are left for you to remove",
    )
    return deleted
