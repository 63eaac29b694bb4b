"""The elastic loop of one AutoMQCluster: autoscaling and partition balancing from brokers' metrics.

A kopf daemon per cluster (`run_elastic`, next to the reconcile loop) wakes every
`OperatorContext.elastic_poll_s` and, when autoscaling or balancing is on (or the annotation
`automq.io/rebalance` asks for one evaluation):

  observe   broker pods (Ready or not), the StatefulSet, status.drainedBrokers, HPAs
  scrape    each Ready broker's /metrics (`automq.broker.balancer.scrape.LoadScraper`) and the
            controller's metadata, into one `LoadModel` the autoscaler and the balancer share.
            Missing or stale data (a broker that did not answer, too few samples) or an
            unreachable controller: no decision this cycle, the Balancing/Autoscaling conditions
            say which broker and why, and a Warning event does once per distinct problem.
  autoscale every autoscaling.intervalSeconds: an `Observation` of total load into the pure
            `autoscaler.decide`; a change is written to spec.broker.replicas (the path the
            scale subresource uses), so the reconcile loop scales out, or drains and then
            shrinks. Stands down while an HPA targets the same cluster (condition says so).
  balance   every balancing.intervalSeconds, at once when a broker became Ready (scale-out: it
            gets its share without waiting for the interval), or on the annotation: the pure
            planner (`automq.broker.balancer.planner.plan`) proposes moves, `moves.execute_moves`
            runs them through the controller with bounded concurrency. Never while a scale
            operation or a drain is in flight. A failed move is reported and retried later.

Why a daemon and not a kopf timer: the intervals come from the spec and change with it, a new
Ready broker must be acted on within seconds, and the rate window needs scrapes in between.
State that only speeds decisions up (samples, history, cool-downs) lives in memory: after an
operator restart the scale-down window and the rate window simply fill again, which errs on
the side of not acting.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from automq.broker.balancer.model import (
    ClusterMetadata,
    Incomplete,
    LoadModel,
    PartitionKey,
    registered_metrics_url,
)
from automq.broker.balancer.planner import Goals, Move, Proposal, plan
from automq.broker.balancer.scrape import LoadScraper
from automq.operator import builders, security
from automq.operator import metrics as m
from automq.operator.autoscaler import Observation, decide, trim
from automq.operator.builders import ClusterRef
from automq.operator.controller_api import ControllerApi, ControllerApiError, ControllerApiFactory
from automq.operator.kube import KubeApi, KubeError
from automq.operator.moves import MoveOutcome, execute_moves
from automq.operator.spec import (
    BROKER_HTTP_PORT,
    GROUP,
    KIND,
    AutoMQClusterSpec,
    AutoscalingStatus,
    BalancingStatus,
    Condition,
    InvalidSpec,
    ProposalSummary,
    parse_cluster,
)

log = logging.getLogger(__name__)

REBALANCE_ANNOTATION = f"{GROUP}/rebalance"  # "now" | "dry-run": one evaluation, then removed
TRIGGERS = ("now", "dry-run")
MIB = 1024 * 1024
MAX_LISTED_MOVES = 50


@dataclass(frozen=True)
class ElasticSettings:
    poll_s: float = 5.0  # how often the loop looks (pods, annotation) and scrapes while enabled
    scrape_timeout_s: float = 5.0
    move_timeout_s: float = 60.0  # one move; longer is reported as failed and retried later
    move_poll_s: float = 0.25


@dataclass
class ElasticState:
    """What one cluster's loop remembers between ticks (memory only, see the module doc)."""

    scraper: LoadScraper | None = None
    window_s: float = 0.0
    history: list[Observation] = field(default_factory=list)
    ready: set[int] | None = None
    share_pending: set[int] = field(default_factory=set)  # brokers that became Ready, not yet given a share
    last_scale_eval: float = -math.inf
    last_balance: float = -math.inf
    last_scale_at: float | None = None
    last_moved: dict[PartitionKey, float] = field(default_factory=dict)
    moves_total: int = 0
    failed_total: int = 0
    reported: dict[str, str] = field(default_factory=dict)  # condition type -> last Warning sent

    async def close(self) -> None:
        if self.scraper is not None:
            await self.scraper.close()
            self.scraper = None


@dataclass
class Tick:
    """What one tick of the loop observed and is about to write."""

    api: KubeApi
    ref: ClusterRef
    spec: AutoMQClusterSpec
    live: dict[str, Any]
    now: float
    reporter: Any
    conditions: dict[str, Condition] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def generation(self) -> int:
        return int(self.live.get("metadata", {}).get("generation") or 0)


def _now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _labels(ref: ClusterRef) -> dict[str, str]:
    return {"namespace": ref.namespace, "cluster": ref.name}


# ---------------------------------------------------------------------------------------------
# Observing


def broker_pods(pods: list[dict[str, Any]], ref: ClusterRef) -> dict[int, dict[str, Any]]:
    prefix = builders.statefulset_name(ref, "broker") + "-"
    out = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            out[int(name[len(prefix) :])] = pod
    return out


def pod_ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def metrics_url(pod: dict[str, Any]) -> str | None:
    """Where a broker pod serves /metrics: its IP and the port its Prometheus annotation names."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    annotations = pod.get("metadata", {}).get("annotations") or {}
    port = annotations.get("prometheus.io/port") or BROKER_HTTP_PORT
    path = annotations.get("prometheus.io/path") or "/metrics"
    return f"http://{ip}:{port}{path}"


def scale_in_flight(
    spec: AutoMQClusterSpec, sts: dict[str, Any] | None, pods: dict[int, dict[str, Any]], status: dict[str, Any]
) -> str | None:
    """Why the broker set is changing right now (then nothing is moved or scaled down), or None."""
    wanted = spec.broker.replicas
    if sts is None:
        return "the broker StatefulSet does not exist yet"
    replicas = int(sts.get("spec", {}).get("replicas") or 0)
    if replicas != wanted:
        return f"brokers are being scaled from {replicas} to {wanted}"
    drained = status.get("drainedBrokers") or []
    if drained:
        return f"brokers {drained} are drained (scale-in or rolling restart)"
    missing = []
    for ordinal in range(wanted):
        pod = pods.get(ordinal)
        if pod is None or not pod_ready(pod):
            missing.append(str(ordinal))
    if missing:
        return f"broker {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not Ready"
    extra = sorted(o for o in pods if o >= wanted)
    if extra:
        return f"broker pods {extra} above spec.broker.replicas are still going"
    return None


async def conflicting_hpas(api: KubeApi, ref: ClusterRef) -> list[str]:
    """HorizontalPodAutoscalers (KEDA makes one too) whose scale target is this cluster."""
    try:
        hpas = await api.list("HorizontalPodAutoscaler", ref.namespace)
    except KubeError as exc:
        log.warning("%s/%s: cannot list HorizontalPodAutoscalers: %s", ref.namespace, ref.name, exc)
        return []
    names = []
    for hpa in hpas:
        target = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if (
            target.get("kind") == KIND
            and target.get("name") == ref.name
            and str(target.get("apiVersion", GROUP)).split("/")[0] == GROUP
        ):
            names.append(hpa["metadata"]["name"])
    return sorted(names)


# ---------------------------------------------------------------------------------------------
# Conditions and status


def _set(t: Tick, kind: str, ok: bool, reason: str, message: str) -> None:
    previous = next((c for c in t.live.get("status", {}).get("conditions") or [] if c.get("type") == kind), None)
    status = "True" if ok else "False"
    since = (
        previous["lastTransitionTime"]
        if previous and previous.get("status") == status and previous.get("lastTransitionTime")
        else _now_rfc3339()
    )
    t.conditions[kind] = Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message[:1000],
        last_transition_time=since,
        observed_generation=t.generation,
    )


def _warn_once(t: Tick, state: ElasticState, kind: str, reason: str, message: str) -> None:
    key = f"{reason}: {message}"
    if state.reported.get(kind) != key:
        t.reporter.warn(reason, message)
        state.reported[kind] = key


async def _flush(t: Tick) -> None:
    """Write this tick's conditions (merged into the live list) and status sections, if changed."""
    patch: dict[str, Any] = {}
    live_conditions = list(t.live.get("status", {}).get("conditions") or [])
    if t.conditions:
        merged = [c for c in live_conditions if c.get("type") not in t.conditions]
        merged += [c.model_dump(by_alias=True, mode="json") for c in t.conditions.values()]
        order = ["Ready", "Progressing", "Degraded", "Balancing", "Autoscaling"]
        merged.sort(key=lambda c: order.index(c["type"]) if c["type"] in order else len(order))
        if merged != live_conditions:
            patch["conditions"] = merged
    for key, value in t.status.items():
        if t.live.get("status", {}).get(key) != value:
            patch[key] = value
    if patch:
        await t.api.patch(KIND, t.ref.namespace, t.ref.name, {"status": patch}, "status")


def _proposal_summary(proposal: Proposal, trigger: str, dry_run: bool) -> dict[str, Any]:
    return ProposalSummary(
        time=_now_rfc3339(),
        trigger=trigger,
        dry_run=dry_run,
        moves=[describe_move(mv) for mv in proposal.moves[:MAX_LISTED_MOVES]],
        move_count=len(proposal.moves),
        imbalance_before=dict(proposal.imbalance_before),
        imbalance_after=dict(proposal.imbalance_after),
    ).model_dump(by_alias=True, mode="json")


def describe_move(mv: Move) -> str:
    return (
        f"{mv.topic}-{mv.partition}: {mv.source} -> {mv.target} ({mv.goal}, "
        f"in {mv.bytes_in / MIB:.2f} MiB/s, out {mv.bytes_out / MIB:.2f} MiB/s)"
    )


def broker_load_summary(model: LoadModel) -> dict[str, str]:
    summary = {
        str(b): f"in {load.bytes_in / MIB:.2f} MiB/s, out {load.bytes_out / MIB:.2f} MiB/s, "
        f"{load.partitions} partitions" + ("" if load.cpu is None else f", cpu {load.cpu * 100:.0f}%")
        for b, load in sorted(model.brokers.items())
    }
    for b, why in model.unmeasured.items():
        # A leaving or not-Ready broker without data: counted as carrying nothing, said so.
        summary[str(b)] = f"{summary.get(str(b), '')} (unmeasured: {why})".lstrip()
    return summary


# ---------------------------------------------------------------------------------------------
# The loop


@dataclass
class ElasticContext:
    """What the loop needs from the operator process (a slice of handlers.OperatorContext)."""

    api: KubeApi
    controller_api_factory: ControllerApiFactory
    address_map: Callable[[str], str]
    settings: ElasticSettings


async def tick(ctx: ElasticContext, state: ElasticState, ref: ClusterRef, reporter: Any) -> None:
    """One look at the cluster; acts when something is due."""
    api = ctx.api
    live = await api.get(KIND, ref.namespace, ref.name)
    if live is None or live.get("metadata", {}).get("deletionTimestamp"):
        return
    try:
        spec = parse_cluster(live)
    except InvalidSpec:
        return  # the reconcile loop reports it (condition InvalidSpec naming the field)
    loop = asyncio.get_running_loop()
    t = Tick(api, ref, spec, live, loop.time(), reporter)
    annotations = live.get("metadata", {}).get("annotations") or {}
    trigger = annotations.get(REBALANCE_ANNOTATION)
    if trigger is not None and trigger not in TRIGGERS:
        _warn_once(
            t,
            state,
            "annotation",
            "InvalidAnnotation",
            f"{REBALANCE_ANNOTATION}: expected one of {list(TRIGGERS)}, got {trigger!r}; ignored",
        )
        await _clear_trigger(t)
        trigger = None
    auto, bal = spec.autoscaling, spec.balancing
    if not (auto.enabled or bal.enabled or trigger):
        _set(t, "Balancing", False, "Disabled", "spec.balancing.enabled is false")
        _set(t, "Autoscaling", False, "Disabled", "spec.autoscaling.enabled is false")
        t.status["autoscaling"] = None
        await state.close()
        state.history.clear()
        state.ready = None
        await _flush(t)
        return
    if not bal.enabled:
        _set(
            t,
            "Balancing",
            False,
            "Disabled",
            "spec.balancing.enabled is false (annotate automq.io/rebalance=now for one evaluation)",
        )
    if not auto.enabled:
        _set(
            t,
            "Autoscaling",
            False,
            "Disabled",
            "spec.autoscaling.enabled is false; scale with spec.broker.replicas or the scale subresource",
        )
        # A stale desiredReplicas would read as a wish of an autoscaler that is off.
        t.status["autoscaling"] = None
        state.history.clear()
        state.last_scale_at = None

    # -- observe
    pods = broker_pods(await api.list("Pod", ref.namespace, builders.selector_labels(ref, "broker")), ref)
    sts = await api.get("StatefulSet", ref.namespace, builders.statefulset_name(ref, "broker"))
    in_flight = scale_in_flight(spec, sts, pods, live.get("status") or {})
    ready = {builders.broker_node_id(o) for o, p in pods.items() if pod_ready(p) and o < spec.broker.replicas}
    if state.ready is not None and ready - state.ready:
        state.share_pending |= ready - state.ready
        reporter.info("BrokersReady", f"brokers {sorted(ready - state.ready)} became Ready: giving them their share")
    state.share_pending &= ready
    state.ready = ready

    intervals = [s.interval_seconds for s in (auto, bal) if s.enabled] or [bal.interval_seconds]
    window = max(2.5 * ctx.settings.poll_s, float(min(intervals)))
    if state.scraper is None or state.window_s != window:
        await state.close()
        state.scraper = LoadScraper(
            window_s=window,
            stale_after_s=window + 3 * ctx.settings.poll_s + ctx.settings.scrape_timeout_s,
            timeout_s=ctx.settings.scrape_timeout_s,
        )
        state.window_s = window
    due_scale = auto.enabled and t.now - state.last_scale_eval >= auto.interval_seconds
    grow = bool(state.share_pending) and (bal.enabled or auto.enabled)
    due_balance = (bal.enabled and t.now - state.last_balance >= bal.interval_seconds) or grow or trigger is not None

    # -- scrape (every tick while enabled: the rates need samples before a decision is due)
    factory = await security.authenticated(ctx.controller_api_factory, api, spec, ref)
    controller = factory(builders.controller_urls(spec, ref))
    try:
        model, metadata = await _load(ctx, state, t, controller, pods, ready)
        if model is None:
            await _flush(t)
            return
        # Decisions paused for missing data or a scale in flight are made as soon as they can be,
        # not an interval later (a finished scale-in leaves the count-based drain to even out).
        due_scale = due_scale or (auto.enabled and _paused(t, "Autoscaling"))
        due_balance = due_balance or (bal.enabled and _paused(t, "Balancing"))
        if due_scale:
            state.last_scale_eval = t.now
            if await _autoscale(t, state, model, in_flight, metadata):
                in_flight = "the autoscaler just changed spec.broker.replicas"
        if due_balance:
            await _balance(ctx, t, state, controller, model, metadata, in_flight, trigger, pods)
    finally:
        await controller.close()
    await _flush(t)


PAUSED = ("WaitingForMetrics", "MetricsUnavailable", "ControllerUnavailable", "ScaleInProgress")


def _paused(t: Tick, kind: str) -> bool:
    live: dict[str, Any] = next(
        (c for c in t.live.get("status", {}).get("conditions") or [] if c.get("type") == kind), {}
    )
    return live.get("reason") in PAUSED


async def _load(
    ctx: ElasticContext,
    state: ElasticState,
    t: Tick,
    controller: ControllerApi,
    pods: dict[int, dict[str, Any]],
    ready: set[int],
) -> tuple[LoadModel | None, ClusterMetadata | None]:
    assert state.scraper is not None
    try:
        image = await controller.metadata()
    except ControllerApiError as exc:
        message = f"no decision this cycle: the controller cannot be asked ({exc})"
        for kind in ("Balancing", "Autoscaling"):
            if kind not in t.conditions:
                _set(t, kind, False, "ControllerUnavailable", message)
        _warn_once(t, state, "load", "ControllerUnavailable", message)
        return None, None
    urls = {}
    for ordinal, pod in pods.items():
        url = metrics_url(pod)
        if url is not None and pod_ready(pod):
            urls[builders.broker_node_id(ordinal)] = ctx.address_map(url)
    for b in image.brokers:
        # A broker without a Ready pod (starting, leaving): the HTTP endpoint it registered.
        registered = registered_metrics_url(b)
        if b.node_id not in urls and registered is not None:
            urls[b.node_id] = ctx.address_map(registered)
    not_ready = {b.node_id for b in image.brokers} - ready
    metadata = ClusterMetadata.from_image(image, urls, not_ready)
    await state.scraper.scrape(metadata)
    model = state.scraper.model(metadata)
    if isinstance(model, Incomplete):
        warming = all(
            "so far; rates need 2" in p.reason or "one sample" in p.reason or "moving here" in p.reason
            for p in model.problems
        )
        reason = "WaitingForMetrics" if warming else "MetricsUnavailable"
        message = f"no decision this cycle: {model}"
        for kind in ("Balancing", "Autoscaling"):
            if kind not in t.conditions:
                _set(t, kind, False, reason, message)
        if not warming:
            _warn_once(t, state, "load", reason, message)
        return None, metadata
    state.reported.pop("load", None)
    return model, metadata


async def _clear_trigger(t: Tick) -> None:
    await t.api.patch(KIND, t.ref.namespace, t.ref.name, {"metadata": {"annotations": {REBALANCE_ANNOTATION: None}}})


# ---------------------------------------------------------------------------------------------
# Autoscaling


async def _autoscale(
    t: Tick, state: ElasticState, model: LoadModel, in_flight: str | None, metadata: ClusterMetadata | None
) -> bool:
    """Decide and apply; True when spec.broker.replicas was changed."""
    policy = t.spec.autoscaling
    labels = _labels(t.ref)
    hpas = await conflicting_hpas(t.api, t.ref)
    if hpas:
        message = (
            f"HorizontalPodAutoscaler {', '.join(hpas)} also scales this cluster (scale subresource); the operator's "
            "autoscaler stands down: delete the HPA or set spec.autoscaling.enabled to false"
        )
        _set(t, "Autoscaling", False, "ConflictingAutoscaler", message)
        _warn_once(t, state, "Autoscaling", "ConflictingAutoscaler", message)
        return False
    live_brokers = [b for b in model.brokers.values() if b.state != "fenced"]
    cpus = [b.cpu for b in live_brokers]
    cpu = None if not cpus or any(c is None for c in cpus) else 100 * sum(cpus) / len(cpus)  # type: ignore[arg-type]
    bytes_in = sum(b.bytes_in for b in live_brokers) / MIB
    if policy.target_cpu_percent is not None and cpu is None:
        message = "no decision this cycle: a broker reports no process CPU (process_cpu_seconds_total)"
        _set(t, "Autoscaling", False, "MetricsUnavailable", message)
        _warn_once(t, state, "Autoscaling", "MetricsUnavailable", message)
        return False
    state.history.append(Observation(t.now, bytes_in, cpu, len(live_brokers)))
    trim(state.history, policy, t.now)
    blocked = in_flight
    moving = len(metadata.moving) if metadata is not None else 0
    if blocked is None and moving:
        blocked = f"{moving} partition move(s) are in flight"
    current = t.spec.broker.replicas
    decision = decide(policy, state.history, current, t.now, last_scale_at=state.last_scale_at, blocked=blocked)
    m.CLUSTER_LOAD.labels(**labels, metric="bytes_in_mib_per_second").set(bytes_in)
    if cpu is not None:
        m.CLUSTER_LOAD.labels(**labels, metric="cpu_percent").set(cpu)
    m.DESIRED_BROKERS.labels(**labels).set(decision.replicas)
    previous = AutoscalingStatus.model_validate(t.live.get("status", {}).get("autoscaling") or {})
    status = AutoscalingStatus(
        current_bytes_in_mib_per_second=round(bytes_in, 3),
        current_cpu_percent=None if cpu is None else round(cpu, 1),
        current_replicas=current,
        desired_replicas=decision.replicas,
        last_decision=decision.reason,
        last_scale_time=previous.last_scale_time,
        last_scale_reason=previous.last_scale_reason,
    )
    if decision.change:
        await t.api.patch(KIND, t.ref.namespace, t.ref.name, {"spec": {"broker": {"replicas": decision.replicas}}})
        state.last_scale_at = t.now
        status.last_scale_time = _now_rfc3339()
        status.last_scale_reason = decision.reason
        direction = "up" if decision.change > 0 else "down"
        m.SCALE_DECISIONS.labels(**labels, direction=direction).inc()
        t.reporter.info("ScaledUp" if decision.change > 0 else "ScalingDown", f"autoscaler: {decision.reason}")
        _set(t, "Autoscaling", True, "ScaledUp" if decision.change > 0 else "ScalingDown", decision.reason)
    else:
        _set(t, "Autoscaling", True, "Stable", decision.reason)
    t.status["autoscaling"] = status.model_dump(by_alias=True, mode="json")
    return bool(decision.change)


# ---------------------------------------------------------------------------------------------
# Balancing


async def _balance(
    ctx: ElasticContext,
    t: Tick,
    state: ElasticState,
    controller: ControllerApi,
    model: LoadModel,
    metadata: ClusterMetadata | None,
    in_flight: str | None,
    trigger: str | None,
    pods: dict[int, dict[str, Any]],
) -> None:
    bal = t.spec.balancing
    labels = _labels(t.ref)
    dry_run = trigger == "dry-run"
    if in_flight and not dry_run:
        _set(t, "Balancing", False, "ScaleInProgress", f"no moves while {in_flight}")
        return  # share_pending and the trigger stay: acted on once the scale is done
    why = "dry-run" if dry_run else "annotation" if trigger else "scale-out" if state.share_pending else "interval"
    goals = Goals(
        tolerance_percent=float(bal.tolerance_percent),
        max_moves=10 * bal.max_concurrent_moves,
        cooldown_s=float(bal.partition_cooldown_seconds),
    )
    proposal = plan(model, goals, last_moved=state.last_moved, now=t.now)
    state.last_balance = t.now
    for goal, value in proposal.imbalance_before.items():
        m.IMBALANCE.labels(**labels, goal=goal).set(value)
    balancing = BalancingStatus.model_validate(t.live.get("status", {}).get("balancing") or {})
    balancing.last_evaluation_time = _now_rfc3339()
    balancing.imbalance = dict(proposal.imbalance_before)
    balancing.broker_load = broker_load_summary(model)
    balancing.moves_total = state.moves_total
    balancing.failed_moves_total = state.failed_total
    balancing.moves_in_flight = 0
    if dry_run:
        balancing.last_proposal = ProposalSummary.model_validate(_proposal_summary(proposal, why, True))
        t.reporter.info(
            "RebalanceProposed",
            f"dry-run: {len(proposal.moves)} move(s) proposed, nothing moved; see status.balancing.lastProposal",
        )
        t.status["balancing"] = balancing.model_dump(by_alias=True, mode="json")
        await _clear_trigger(t)
        return
    if not proposal.moves:
        state.share_pending.clear()
        notes = f" ({'; '.join(proposal.notes)})" if proposal.notes else ""
        message = f"within goals: {_imbalance_text(proposal.imbalance_before)}{notes}"
        _set(t, "Balancing", True, "Balanced", message)
        t.status["balancing"] = balancing.model_dump(by_alias=True, mode="json")
        if trigger:
            t.reporter.info("RebalanceNotNeeded", f"{REBALANCE_ANNOTATION}={trigger}: nothing to move; {message}")
            await _clear_trigger(t)
        return

    balancing.moves_in_flight = len(proposal.moves)
    balancing.last_proposal = ProposalSummary.model_validate(_proposal_summary(proposal, why, False))
    _set(t, "Balancing", True, "Rebalancing", f"moving {len(proposal.moves)} partition(s) ({why})")
    t.status["balancing"] = balancing.model_dump(by_alias=True, mode="json")
    await _flush(t)
    t.live = await t.api.get(KIND, t.ref.namespace, t.ref.name) or t.live
    m.MOVES_IN_FLIGHT.labels(**labels).set(len(proposal.moves))
    urls = {b: meta.metrics_url for b, meta in (metadata.brokers.items() if metadata else ()) if meta.metrics_url}

    async def serves(mv: Move) -> bool:
        url = urls.get(mv.target)
        if url is None or state.scraper is None:
            return True  # no way to look: the controller's word is all there is
        try:
            sample = await state.scraper.fetch(url)
        except Exception:
            return False
        return mv.key in sample.partitions

    outcomes = await execute_moves(
        controller,
        proposal.moves,
        max_concurrent=bal.max_concurrent_moves,
        timeout_s=ctx.settings.move_timeout_s,
        poll_s=ctx.settings.move_poll_s,
        serves=serves,
    )
    m.MOVES_IN_FLIGHT.labels(**labels).set(0)
    _record(t, state, proposal, outcomes, why, balancing)
    if trigger:
        await _clear_trigger(t)


def _imbalance_text(imbalance: dict[str, float] | Any) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in imbalance.items())


def _record(
    t: Tick, state: ElasticState, proposal: Proposal, outcomes: list[MoveOutcome], why: str, balancing: BalancingStatus
) -> None:
    labels = _labels(t.ref)
    done = [o for o in outcomes if o.ok]
    failed = [o for o in outcomes if not o.ok]
    for o in done:
        state.last_moved[o.move.key] = t.now
    state.moves_total += len(done)
    state.failed_total += len(failed)
    m.PARTITION_MOVES.labels(**labels, result="ok").inc(len(done))
    m.PARTITION_MOVES.labels(**labels, result="failed").inc(len(failed))
    if done:
        m.REBALANCES.labels(**labels, trigger=why).inc()
        state.share_pending.clear()
    slowest = max((o.seconds for o in done), default=0.0)
    listed = "; ".join(describe_move(o.move) for o in done[:20])
    more = f"; and {len(done) - 20} more" if len(done) > 20 else ""
    t.reporter.info(
        "Rebalanced",
        f"moved {len(done)} partition(s) ({why}; slowest {slowest:.1f}s): {listed}{more}. Imbalance "
        f"{_imbalance_text(proposal.imbalance_before)} -> expected {_imbalance_text(proposal.imbalance_after)}",
    )
    if failed:
        t.reporter.warn(
            "MoveFailed",
            f"{len(failed)} move(s) failed, retried at the next evaluation: "
            + "; ".join(f"{o.move.topic}-{o.move.partition} -> {o.move.target}: {o.error}" for o in failed[:10]),
        )
    balancing.moves_in_flight = 0
    balancing.moves_total = state.moves_total
    balancing.failed_moves_total = state.failed_total
    balancing.last_rebalance_time = _now_rfc3339()
    ok = not failed
    _set(
        t,
        "Balancing",
        ok,
        "Rebalanced" if ok else "MoveFailed",
        f"moved {len(done)} of {len(outcomes)} partition(s) ({why})"
        + ("" if ok else f"; failed: {failed[0].move.topic}-{failed[0].move.partition}: {failed[0].error}"),
    )
    t.status["balancing"] = balancing.model_dump(by_alias=True, mode="json")


async def run(
    ctx: ElasticContext,
    ref: ClusterRef,
    reporter: Any,
    stopped: Any,
    kick: asyncio.Event | None = None,
    leading: Callable[[], Awaitable[bool]] | None = None,
) -> None:
    """The loop: a tick every `poll_s` (sooner when kicked) until `stopped`. `leading` waits
    until this operator replica leads (automq.operator.leadership); False: stop."""
    state = ElasticState()
    try:
        while not stopped:
            if leading is not None and not await leading():
                break
            try:
                await tick(ctx, state, ref, reporter)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an API hiccup must not end the loop: report, wait, retry
                log.exception("%s/%s: elastic tick failed", ref.namespace, ref.name)
                key = f"{type(exc).__name__}: {exc}"
                if state.reported.get("tick") != key:
                    reporter.warn("ElasticLoopFailed", key)
                    state.reported["tick"] = key
            else:
                state.reported.pop("tick", None)
            await _sleep(ctx.settings.poll_s, stopped, kick)
    finally:
        await state.close()


async def _sleep(delay: float, stopped: Any, kick: asyncio.Event | None) -> None:
    waiters = [asyncio.ensure_future(stopped.wait())]
    if kick is not None:
        waiters.append(asyncio.ensure_future(kick.wait()))
    try:
        await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
    if kick is not None:
        kick.clear()
