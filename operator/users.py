"""Reconciling AutoMQUser resources: the cluster's ACLs and quotas for one principal follow
the spec (see `user_spec` for the model and what the resource owns).

A pass reads the cluster's metadata through its controller (`ControllerApi.metadata()`),
creates the missing bindings, deletes the extra ones with exact filters, and sets or removes
the user's quota keys; an unchanged user costs one metadata read. It runs on create, update,
resume and every few minutes (drift: ACLs changed through the Kafka API), only on the leading
operator replica. Deleting the resource removes the principal's ACLs and quotas (unless its
cluster is gone already).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import kopf

from automq.broker.controller.acls import AclBinding, AclFilter
from automq.operator import builders
from automq.operator.builders import ClusterRef
from automq.operator.controller_api import ControllerApi, ControllerApiError
from automq.operator.spec import InvalidSpec, parse_spec
from automq.operator.user_spec import (
    AutoMQUserSpec,
    InvalidUserSpec,
    desired_acls,
    desired_quotas,
    parse_user_spec,
    principal_of,
    quota_ops,
)

log = logging.getLogger(__name__)

RETRY_DELAY_S = 15.0
RESYNC_INTERVAL_S = 300.0


@dataclass(frozen=True)
class UserOutcome:
    created: int
    deleted: int
    quota_changes: int
    acls: int  # what the principal holds now


def _exact(b: AclBinding) -> AclFilter:
    return AclFilter(b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host, b.operation, b.permission)


async def sync_user(controller: ControllerApi, name: str, spec: AutoMQUserSpec | None) -> UserOutcome:
    """Make the cluster hold exactly what the spec says for the user (None: nothing)."""
    principal = principal_of(name)
    image = await controller.metadata()
    current = {b for b in image.acls if b.principal == principal}
    wanted = desired_acls(name, spec) if spec is not None else set()
    missing = sorted(wanted - current, key=AclBinding.key)
    extra = sorted(current - wanted, key=AclBinding.key)
    if missing:
        await controller.create_acls(missing)
    if extra:
        await controller.delete_acls([_exact(b) for b in extra])
    entity = (("user", name),)
    held = next((dict(q.values) for q in image.client_quotas if q.entity == entity), {})
    ops = quota_ops(held, desired_quotas(spec) if spec is not None else {})
    if ops:
        await controller.alter_user_quotas(name, ops)
    if missing or extra or ops:
        log.info(
            "user %s: %d ACLs created, %d deleted, quotas %s", principal, len(missing), len(extra), ops or "unchanged"
        )
    return UserOutcome(len(missing), len(extra), len(ops), len(wanted))


def _condition(status: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": kopf_now(),
    }


def kopf_now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _cluster_controller(ctx: Any, namespace: str, cluster: str) -> ControllerApi | None:
    """The controller API of the user's AutoMQCluster; None when the cluster does not exist."""
    live = await ctx.kube().get("AutoMQCluster", namespace, cluster)
    if live is None:
        return None
    meta = live.get("metadata", {})
    try:
        cluster_spec = parse_spec(dict(live.get("spec") or {}))
    except InvalidSpec as exc:
        raise kopf.TemporaryError(f"AutoMQCluster {cluster} has an invalid spec: {exc}", delay=RETRY_DELAY_S) from exc
    ref = ClusterRef(name=cluster, namespace=namespace, uid=str(meta.get("uid", "")))
    controller: ControllerApi = ctx.controller_api_factory(builders.controller_urls(cluster_spec, ref))
    return controller


async def reconcile_user(
    spec: Any, name: str, namespace: str, meta: Any, patch: Any, memo: Any, logger: Any, **_: Any
) -> None:
    """kopf create / update / resume / timer handler of AutoMQUser."""
    ctx = memo.automq
    if not ctx.is_leader():
        raise kopf.TemporaryError("not the leading operator replica", delay=RETRY_DELAY_S)
    generation = meta.get("generation")
    try:
        parsed = parse_user_spec(dict(spec or {}))
    except InvalidUserSpec as exc:
        patch.status["observedGeneration"] = generation
        patch.status["conditions"] = [_condition("False", "InvalidSpec", str(exc))]
        raise kopf.PermanentError(f"invalid AutoMQUser spec: {exc}") from exc
    controller = await _cluster_controller(ctx, namespace, parsed.cluster)
    if controller is None:
        patch.status["conditions"] = [
            _condition("False", "ClusterNotFound", f"AutoMQCluster {parsed.cluster} does not exist in {namespace}")
        ]
        raise kopf.TemporaryError(f"AutoMQCluster {parsed.cluster} not found", delay=RETRY_DELAY_S)
    try:
        outcome = await sync_user(controller, name, parsed)
    except ControllerApiError as exc:
        patch.status["conditions"] = [_condition("False", "ControllerUnavailable", str(exc))]
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc
    finally:
        await controller.close()
    patch.status["observedGeneration"] = generation
    patch.status["principal"] = principal_of(name)
    patch.status["acls"] = outcome.acls
    patch.status["conditions"] = [
        _condition("True", "Synced", f"{outcome.acls} ACLs and {len(desired_quotas(parsed))} quotas in place")
    ]


async def delete_user(spec: Any, name: str, namespace: str, memo: Any, logger: Any, **_: Any) -> None:
    ctx = memo.automq
    if not ctx.is_leader():
        raise kopf.TemporaryError("not the leading operator replica", delay=RETRY_DELAY_S)
    cluster = (spec or {}).get("cluster")
    if not cluster:
        return  # never valid: nothing was created
    controller = await _cluster_controller(ctx, namespace, str(cluster))
    if controller is None:
        return  # the cluster (and its metadata) is gone
    try:
        await sync_user(controller, name, None)
    except ControllerApiError as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc
    finally:
        await controller.close()
