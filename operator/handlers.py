"""kopf handlers: when to reconcile an AutoMQCluster, and what to do when it is deleted.

Handlers only decide *when*; `reconcile` decides *what*. Each AutoMQCluster gets a kopf daemon,
`run_cluster`: a level-triggered loop that runs reconcile passes (soon again while a change is
in flight, at the status interval otherwise) and wakes at once when the spec changes (the update
handler kicks it). Why a loop rather than kopf's handler retries: a rolling change takes many
passes, and the loop keeps that state in the API (status, pods) instead of kopf's progress
annotations, so a spec changed mid-roll or an operator restart simply continues from what is
there. An invalid spec is reported (a Warning event once, status Ready=False/Degraded=True with
reason InvalidSpec) and re-checked every pass.

Deletion runs under kopf's finalizer (`automq.io/finalizer`): the loop stops, owned objects go by
garbage collection through their owner references, WAL volume claims only with
`deletionPolicy: Delete`.

A second daemon per cluster, `run_elastic`, runs the elastic loop (autoscaling and balancing,
`automq.operator.elastic`); it only reads the cluster, scrapes brokers, moves partitions and
writes spec.broker.replicas, status.autoscaling/balancing and its own conditions.

Two operator replicas may run at once: with `OperatorContext.leader_election` set (the CLI
sets it), the replicas elect one leader through a Lease (`automq.operator.leadership`) and every
loop and handler that writes waits for, or checks, leadership first; watch-only handlers run on
all of them.

`register(registry)` attaches the handlers to a registry, so tests and `run_operator` each get a
fresh one; the shared state (API client, controller API factory, locks, kicks) travels in kopf's
memo as an `OperatorContext`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from automq.operator import controller_scheme, elastic, security, users
from automq.operator.builders import ClusterRef
from automq.operator.controller_api import ControllerApiFactory, connect
from automq.operator.kube import KubeApi, KubeError
from automq.operator.leadership import LeaderElection, default_namespace
from automq.operator.nodeloss import (
    NodeLossPass,
    NodeLossSettings,
    copy_topology_label,
    degraded_notes,
    read_records,
)
from automq.operator.reconcile import (
    STATUS_STEPS,
    STEPS,
    Cluster,
    Note,
    Outcome,
    ReconcileSettings,
    delete_cluster_data,
    reconcile,
    write_invalid_spec_status,
)
from automq.operator.spec import (
    GROUP,
    PLURAL,
    SECURITY_DEFAULTS_ANNOTATION,
    VERSION,
    InvalidSpec,
    check_cluster_name,
    parse_cluster,
    parse_spec,
)
from automq.operator.user_spec import USER_PLURAL

log = logging.getLogger(__name__)


@dataclass
class OperatorContext:
    """What every handler of this operator process shares."""

    api_factory: Callable[[], KubeApi] = KubeApi.from_environment
    controller_api_factory: ControllerApiFactory = connect
    settings: ReconcileSettings = field(default_factory=ReconcileSettings)
    retry_delay_s: float = 5.0  # between passes while a change is in progress
    status_interval_s: float = 30.0  # between passes otherwise (status refresh, waiting on a problem)
    resync_interval_s: float = 300.0  # a full pass of a quiet cluster at least this often (drift)
    api: KubeApi | None = None
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    kicks: dict[str, asyncio.Event] = field(default_factory=dict)
    node_loss: NodeLossSettings = field(default_factory=NodeLossSettings)
    node_loss_kicks: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)  # (namespace, name)
    # Every URL the operator opens to a pod (broker /metrics) goes through this; a test harness
    # that runs pods as local processes maps pod addresses to its own.
    address_map: Callable[[str], str] = field(default=lambda url: url)
    elastic: elastic.ElasticSettings = field(default_factory=elastic.ElasticSettings)
    elastic_kicks: dict[str, asyncio.Event] = field(default_factory=dict)
    # Leader election between replicas: None runs standalone (one replica, tests); a dict of
    # LeaderElection keyword settings (may be empty) elects through the Lease.
    leader_election: dict[str, Any] | None = None
    leader: LeaderElection | None = None
    leader_task: asyncio.Task[None] | None = None

    def is_leader(self) -> bool:
        return self.leader is None or self.leader.is_leader()

    async def wait_leading(self, stopped: Any) -> bool:
        """True once this replica may act (at once when standalone); False when stopped first."""
        if self.leader is None:
            return True
        return await self.leader.wait_leading(stopped)

    def lock_for(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())

    def kick_for(self, uid: str) -> asyncio.Event:
        return self.kicks.setdefault(uid, asyncio.Event())

    def kube(self) -> KubeApi:
        if self.api is None:
            self.api = self.api_factory()
        return self.api


class KopfReporter:
    """Events through kopf's poster (batched, retried, attached to the AutoMQCluster)."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def info(self, reason: str, message: str) -> None:
        kopf.info(self._body, reason=reason, message=message[:1024])

    def warn(self, reason: str, message: str) -> None:
        kopf.warn(self._body, reason=reason, message=message[:1024])


async def _pass(
    ctx: OperatorContext, body: Any, name: str, namespace: str, uid: str, *, full: bool, reported: dict[str, str]
) -> Outcome | None:
    """One reconcile pass; None when there is nothing to reconcile (gone, deleting, invalid spec)."""
    api = ctx.kube()
    ref = ClusterRef(name=name, namespace=namespace, uid=uid)
    # The status written by the previous pass, not kopf's possibly older copy of the body.
    live = await api.get("AutoMQCluster", namespace, name)
    if live is None or live.get("metadata", {}).get("deletionTimestamp"):
        return None  # gone, or being deleted: recreating children now would only orphan them
    previous = dict(live.get("status") or {})
    generation = int(live.get("metadata", {}).get("generation") or 0)
    raw_spec = dict(live.get("spec") or {})
    legacy, pinned = await security.pin_security_defaults(api, live, ref)
    if pinned and legacy:
        KopfReporter(body).warn(
            "SecurityDefaultsLegacy",
            "this cluster predates secure defaults: it keeps its PLAINTEXT listener and open controller API "
            f"(annotation {SECURITY_DEFAULTS_ANNOTATION}: legacy); set spec.listeners and spec.security to "
            "secure it (docs/security.md)",
        )
    controller_http = await security.pin_controller_scheme(api, live, ref)
    try:
        check_cluster_name(name)
        spec = parse_spec(raw_spec, legacy=legacy, controller_http=controller_http)
    except InvalidSpec as exc:
        await write_invalid_spec_status(api, ref, generation, previous, str(exc))
        if reported.get("invalid") != str(exc):  # once per distinct problem, not once per pass
            KopfReporter(body).warn("InvalidSpec", str(exc))
            reported["invalid"] = str(exc)
        return None
    reported.pop("invalid", None)
    await controller_scheme.load_state(api, live, spec, ref)  # mid-switch, what the pods run now
    cluster = Cluster(
        api=api,
        ref=ref,
        spec=spec,
        raw_spec=raw_spec,
        generation=generation,
        previous_status=previous,
        reporter=KopfReporter(body),
        controller_api_factory=await security.authenticated(ctx.controller_api_factory, api, spec, ref),
        settings=ctx.settings,
        may_act=ctx.is_leader,
    )
    steps = (("controllerApiScheme", controller_scheme.step), *STEPS) if full else STATUS_STEPS
    return await reconcile(cluster, (*steps, ("nodeLoss", _node_loss_notes(live))))


def _node_loss_notes(live: dict[str, Any]) -> Any:
    """A last reconcile step: brokers being recovered from a lost node make the cluster Degraded."""

    async def step(c: Cluster) -> None:
        # The node-loss watch posted NodeLost when it found the loss: no second event here.
        c.problems[:0] = [Note(reason, message, event=False) for reason, message in degraded_notes(live)]

    return step


async def run_cluster(
    stopped: Any, body: Any, name: str, namespace: str, uid: str, memo: Any, logger: Any, **_: Any
) -> None:
    """The reconcile loop of one AutoMQCluster, for as long as it exists.

    A pass runs at once, again soon while a change is in flight, at the status interval while a
    problem only time or a person can fix remains, and when the spec changes (a kick from the
    update handler). Between changes the quiet passes only refresh the status; a full pass runs
    every resync interval to put back what was changed by hand. Level-triggered: each pass
    starts from what the API says, so nothing is lost when the operator restarts."""
    ctx: OperatorContext = memo.automq
    kick = ctx.kick_for(uid)
    loop = asyncio.get_running_loop()
    reported: dict[str, str] = {}
    last_full = float("-inf")
    full = True
    while not stopped:
        if not await ctx.wait_leading(stopped):
            break
        kick.clear()
        try:
            async with ctx.lock_for(uid):
                if full:
                    last_full = loop.time()
                outcome = await _pass(ctx, body, name, namespace, uid, full=full, reported=reported)
        except Exception as exc:  # an API hiccup must not end the loop: report, wait, retry
            logger.exception("reconcile pass failed")
            outcome, delay = None, ctx.status_interval_s
            KopfReporter(body).warn("ReconcileFailed", f"{type(exc).__name__}: {exc}")
        else:
            if outcome is not None and outcome.progressing:
                delay = ctx.retry_delay_s
            else:
                delay = ctx.status_interval_s
        kicked = await _sleep(kick, stopped, delay)
        # Full pass: after a spec change, while the cluster is not Ready, or when a resync is due.
        full = kicked or outcome is None or not outcome.ready or loop.time() - last_full >= ctx.resync_interval_s


async def _sleep(kick: asyncio.Event, stopped: Any, delay: float) -> bool:
    """Wait `delay` seconds, or less if kicked or stopped; True when kicked."""
    waiters = [asyncio.ensure_future(kick.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return kick.is_set()


async def run_node_loss(
    stopped: Any, body: Any, name: str, namespace: str, uid: str, memo: Any, logger: Any, **_: Any
) -> None:
    """The node-loss watch of one AutoMQCluster (see automq.operator.nodeloss): a pass when a
    Node or a broker pod changes, and every few seconds anyway (grace periods end silently)."""
    ctx: OperatorContext = memo.automq
    kick = ctx.node_loss_kicks.setdefault((namespace, name), asyncio.Event())
    ref = ClusterRef(name=name, namespace=namespace, uid=uid)
    missing_since: dict[str, Any] = {}
    warned: set[str] = set()
    while not stopped:
        if not await ctx.wait_leading(stopped):
            break
        kick.clear()
        active = False
        recovery: NodeLossPass | None = None
        try:
            live = await ctx.kube().get("AutoMQCluster", namespace, name)
            spec = parse_cluster(live) if live is not None else None
            if spec is not None:
                recovery = NodeLossPass(
                    api=ctx.kube(),
                    ref=ref,
                    spec=spec,
                    reporter=KopfReporter(body),
                    controller_api_factory=await security.authenticated(
                        ctx.controller_api_factory, ctx.kube(), spec, ref
                    ),
                    missing_since=missing_since,
                    warned=warned,
                    may_act=ctx.is_leader,
                )
                before = read_records(live)
                active = await recovery.run()
                if active or before != recovery.records:
                    ctx.kick_for(uid).set()  # the status shows the new step now, not at the next refresh
        except InvalidSpec:
            pass  # reported by the reconcile loop
        except Exception as exc:  # an API hiccup must not end the watch
            logger.exception("node-loss pass failed")
            KopfReporter(body).warn("NodeLossCheckFailed", f"{type(exc).__name__}: {exc}")
        delay = min(ctx.node_loss.interval_s, 1.0) if active else ctx.node_loss.interval_s
        if recovery is not None and recovery.wake_in_s is not None:
            delay = min(delay, recovery.wake_in_s + 0.05)  # just after a grace period ends
        await _sleep(kick, stopped, delay)
    ctx.node_loss_kicks.pop((namespace, name), None)


async def node_changed(memo: Any, **_: Any) -> None:
    """Any Node changed (readiness, deletion): every cluster's node-loss watch looks again."""
    ctx: OperatorContext = memo.automq
    for kick in ctx.node_loss_kicks.values():
        kick.set()


async def broker_pod_changed(body: Any, labels: Any, namespace: str, memo: Any, logger: Any, **_: Any) -> None:
    """A broker pod changed: its cluster's node-loss watch looks again; a newly bound pod gets its
    node's zone label (the broker's rack) if Kubernetes did not put it there."""
    ctx: OperatorContext = memo.automq
    instance = (labels or {}).get("app.kubernetes.io/instance", "")
    kick = ctx.node_loss_kicks.get((namespace, instance))
    if kick is not None:
        kick.set()
    if body.get("metadata", {}).get("name") is None or not ctx.is_leader():
        return
    try:
        live = await ctx.kube().get("AutoMQCluster", namespace, instance)
        key = parse_cluster(live).broker.rack.topology_key if live else None
        if key:
            await copy_topology_label(ctx.kube(), dict(body), key)
    except (InvalidSpec, KubeError) as exc:
        logger.debug("no topology label copied: %s", exc)


async def spec_changed(uid: str, memo: Any, **_: Any) -> None:
    """Wake the cluster's loops: the spec changed."""
    ctx: OperatorContext = memo.automq
    ctx.kick_for(uid).set()
    ctx.elastic_kicks.setdefault(uid, asyncio.Event()).set()


async def run_elastic(stopped: Any, body: Any, name: str, namespace: str, uid: str, memo: Any, **_: Any) -> None:
    """Autoscaling and balancing of one AutoMQCluster (a tick every few seconds while enabled)."""
    ctx: OperatorContext = memo.automq
    elastic_ctx = elastic.ElasticContext(
        api=ctx.kube(),
        controller_api_factory=ctx.controller_api_factory,
        address_map=ctx.address_map,
        settings=ctx.elastic,
    )
    kick = ctx.elastic_kicks.setdefault(uid, asyncio.Event())
    try:
        await elastic.run(
            elastic_ctx,
            ClusterRef(name, namespace, uid),
            KopfReporter(body),
            stopped,
            kick,
            leading=lambda: ctx.wait_leading(stopped),
        )
    finally:
        ctx.elastic_kicks.pop(uid, None)


async def delete_cluster(body: Any, spec: Any, name: str, namespace: str, uid: str, memo: Any, **_: Any) -> None:
    ctx: OperatorContext = memo.automq
    # A follower waits: the leader runs this and removes the finalizer. It must not fail and
    # retry (kopf keeps handler progress in annotations both replicas share: a follower's
    # "retry later" would make the leader run the handler again), nor return early (kopf would
    # drop the finalizer before the leader cleaned up). It runs it itself if it becomes leader.
    while not ctx.is_leader():
        if await ctx.kube().get("AutoMQCluster", namespace, name) is None:
            return  # the leader finished
        await asyncio.sleep(1.0)
    try:
        parsed = parse_cluster(dict(body))
    except InvalidSpec:
        parsed = None  # nothing was created from it; keep whatever data there is
    async with ctx.lock_for(uid):
        await delete_cluster_data(ctx.kube(), ClusterRef(name, namespace, uid), parsed, KopfReporter(body))
    ctx.locks.pop(uid, None)
    ctx.kicks.pop(uid, None)


async def configure(settings: kopf.OperatorSettings, memo: Any, logger: Any, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Replicas elect a leader through a Lease (automq.operator.leadership), not kopf's peering,
    # which pauses by priority but locks nothing.
    settings.peering.standalone = True
    settings.posting.level = logging.INFO
    ctx: OperatorContext = memo.automq
    if ctx.leader_election is not None and ctx.leader is None:
        options = dict(ctx.leader_election)
        options.setdefault("namespace", default_namespace())
        ctx.leader = LeaderElection(api=ctx.kube(), **options)
        ctx.leader_task = asyncio.get_running_loop().create_task(ctx.leader.run(), name="leader-election")
        logger.info(f"leader election as {ctx.leader.identity} on Lease {ctx.leader.namespace}/{ctx.leader.name}")


async def cleanup(memo: Any, **_: Any) -> None:
    ctx: OperatorContext = memo.automq
    if ctx.leader_task is not None:
        ctx.leader_task.cancel()  # releases the Lease, so another replica takes over at once
        with contextlib.suppress(asyncio.CancelledError):
            await ctx.leader_task
        ctx.leader_task = None
        ctx.leader = None
    if ctx.api is not None:
        await ctx.api.close()
        ctx.api = None


def register(registry: kopf.OperatorRegistry) -> kopf.OperatorRegistry:
    """Attach this operator's handlers to `registry`."""
    resource = dict(group=GROUP, version=VERSION, plural=PLURAL, registry=registry)
    # In-cluster service account first, then KUBECONFIG / ~/.kube/config (the kubernetes client's
    # resolution, which KubeApi.from_environment uses too).
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(configure)
    kopf.on.cleanup(registry=registry)(cleanup)
    # The loop stops when deletion starts (before the delete handler) or the operator exits.
    kopf.daemon(**resource, cancellation_timeout=10.0)(run_cluster)
    kopf.daemon(**resource, id="node-loss", cancellation_timeout=10.0)(run_node_loss)
    # Watch-only handlers (kopf.on.event): nothing is written to Nodes or pods to track them.
    kopf.on.event("v1", "nodes", registry=registry)(node_changed)
    kopf.on.event(
        "v1",
        "pods",
        registry=registry,
        labels={"app.kubernetes.io/name": "automq", "app.kubernetes.io/component": "broker"},
    )(broker_pod_changed)
    kopf.daemon(**resource, id="elastic", cancellation_timeout=10.0)(run_elastic)
    kopf.on.update(**resource, field="spec")(spec_changed)
    kopf.on.delete(**resource)(delete_cluster)
    # AutoMQUser: ACLs and quotas of one principal, kept in its cluster (automq.operator.users)
    user = dict(group=GROUP, version=VERSION, plural=USER_PLURAL, registry=registry)
    kopf.on.create(**user)(users.reconcile_user)
    kopf.on.update(**user, field="spec")(users.reconcile_user)
    kopf.on.resume(**user)(users.reconcile_user)
    kopf.timer(**user, interval=users.RESYNC_INTERVAL_S, initial_delay=users.RESYNC_INTERVAL_S, idle=60.0)(
        users.reconcile_user
    )
    kopf.on.delete(**user)(users.delete_user)
    return registry
