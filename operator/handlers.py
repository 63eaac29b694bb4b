"""kopf handlers: when to reconcile an AutoMQCluster, and what to do when it is deleted.

Handlers only decide *when*; `reconcile` decides *what*. Create, spec update and operator
restart (resume) run the same reconcile; the handler raises `kopf.TemporaryError` while the
cluster is not Ready, so kopf runs it again until it is (one rolling step per pass). A timer
refreshes the status (pod readiness, crash loops) between spec changes. An invalid spec is
reported (Warning event, status Ready=False/Degraded=True with reason InvalidSpec) and not
retried until the spec changes (`kopf.PermanentError`).

Deletion runs under kopf's finalizer (`automq.io/finalizer`): owned objects go by garbage
collection through their owner references; WAL volume claims only with `deletionPolicy: Delete`.

`register(registry, ...)` attaches the handlers to a registry, so tests and `run_operator` each
get a fresh one; the shared state (API client, controller API factory, locks) travels in kopf's
memo as an `OperatorContext`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import kopf

from automq.operator.builders import ClusterRef
from automq.operator.controller_api import ControllerApiFactory, connect
from automq.operator.kube import KubeApi
from automq.operator.reconcile import (
    STATUS_STEPS,
    STEPS,
    Cluster,
    ReconcileSettings,
    delete_cluster_data,
    reconcile,
    write_invalid_spec_status,
)
from automq.operator.spec import GROUP, PLURAL, VERSION, InvalidSpec, check_cluster_name, parse_spec

log = logging.getLogger(__name__)


@dataclass
class OperatorContext:
    """What every handler of this operator process shares."""

    api_factory: Callable[[], KubeApi] = KubeApi.from_environment
    controller_api_factory: ControllerApiFactory = connect
    settings: ReconcileSettings = field(default_factory=ReconcileSettings)
    retry_delay_s: float = 5.0  # between passes while a change is in progress
    status_interval_s: float = 30.0  # timer: refresh the status of quiet clusters
    resync_interval_s: float = 300.0  # timer: full reconcile of quiet clusters (drift)
    api: KubeApi | None = None
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def lock_for(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())

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


async def _pass(ctx: OperatorContext, body: Any, name: str, namespace: str, uid: str, *, retry: bool, steps: Any = STEPS) -> None:
    api = ctx.kube()
    ref = ClusterRef(name=name, namespace=namespace, uid=uid)
    # The status written by the previous pass, not kopf's possibly older copy of the body.
    live = await api.get("AutoMQCluster", namespace, name)
    if live is None or live.get("metadata", {}).get("deletionTimestamp"):
        return  # gone, or being deleted: recreating children now would only orphan them
    previous = dict(live.get("status") or {})
    generation = int(live.get("metadata", {}).get("generation") or 0)
    raw_spec = dict(live.get("spec") or {})
    try:
        check_cluster_name(name)
        spec = parse_spec(raw_spec)
    except InvalidSpec as exc:
        await write_invalid_spec_status(api, ref, generation, previous, str(exc))
        if retry:
            KopfReporter(body).warn("InvalidSpec", str(exc))
            raise kopf.PermanentError(f"invalid spec, fix it and the operator retries: {exc}") from None
        return
    cluster = Cluster(
        api=api,
        ref=ref,
        spec=spec,
        raw_spec=raw_spec,
        generation=generation,
        previous_status=previous,
        reporter=KopfReporter(body),
        controller_api_factory=ctx.controller_api_factory,
        settings=ctx.settings,
    )
    outcome = await reconcile(cluster, steps)
    if retry and not outcome.ready:
        # A change in flight is followed closely; a problem that only time or a person can fix
        # (a crash loop, an unreachable controller) is looked at less often.
        delay = ctx.retry_delay_s if outcome.progressing else max(ctx.retry_delay_s, ctx.status_interval_s)
        raise kopf.TemporaryError(outcome.message, delay=delay)


async def reconcile_cluster(body: Any, name: str, namespace: str, uid: str, memo: Any, **_: Any) -> None:
    ctx: OperatorContext = memo.automq
    async with ctx.lock_for(uid):
        await _pass(ctx, body, name, namespace, uid, retry=True)


async def refresh_status(body: Any, name: str, namespace: str, uid: str, memo: Any, **_: Any) -> None:
    """Between changes: pod readiness, crash loops and counts into the status (cheap)."""
    ctx: OperatorContext = memo.automq
    lock = ctx.lock_for(uid)
    if lock.locked():
        return  # a change handler is working on it and will write the status
    async with lock:
        await _pass(ctx, body, name, namespace, uid, retry=False, steps=STATUS_STEPS)


async def resync(body: Any, name: str, namespace: str, uid: str, memo: Any, **_: Any) -> None:
    """Now and then, a full pass: puts back what someone changed or deleted by hand."""
    ctx: OperatorContext = memo.automq
    lock = ctx.lock_for(uid)
    if lock.locked():
        return
    async with lock:
        await _pass(ctx, body, name, namespace, uid, retry=False)


async def delete_cluster(body: Any, spec: Any, name: str, namespace: str, uid: str, memo: Any, **_: Any) -> None:
    ctx: OperatorContext = memo.automq
    try:
        parsed = parse_spec(dict(spec or {}))
    except InvalidSpec:
        parsed = None  # nothing was created from it; keep whatever data there is
    async with ctx.lock_for(uid):
        await delete_cluster_data(ctx.kube(), ClusterRef(name, namespace, uid), parsed, KopfReporter(body))
    ctx.locks.pop(uid, None)


def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key="last-handled-configuration")
    # One operator replica (the chart's Deployment uses the Recreate strategy): no peering CRD needed.
    settings.peering.standalone = True
    settings.posting.level = logging.INFO


async def cleanup(memo: Any, **_: Any) -> None:
    ctx: OperatorContext = memo.automq
    if ctx.api is not None:
        await ctx.api.close()
        ctx.api = None


def register(registry: kopf.OperatorRegistry, *, status_interval_s: float = 30.0, resync_interval_s: float = 300.0) -> kopf.OperatorRegistry:
    """Attach this operator's handlers to `registry`."""
    resource = dict(group=GROUP, version=VERSION, plural=PLURAL, registry=registry)
    # In-cluster service account first, then KUBECONFIG / ~/.kube/config (the kubernetes client's
    # resolution, which KubeApi.from_environment uses too).
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(configure)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.resume(**resource)(reconcile_cluster)
    kopf.on.create(**resource)(reconcile_cluster)
    kopf.on.update(**resource, field="spec")(reconcile_cluster)
    kopf.timer(**resource, interval=status_interval_s, initial_delay=status_interval_s)(refresh_status)
    kopf.timer(**resource, interval=resync_interval_s, initial_delay=resync_interval_s)(resync)
    kopf.on.delete(**resource)(delete_cluster)
    return registry
