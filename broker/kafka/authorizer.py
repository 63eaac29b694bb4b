"""The broker's authorizer: Kafka's StandardAuthorizer semantics over the ACLs of the metadata image.

On only when `kafka.authorizer_class_name` is set; otherwise `Broker.authorizer` is None and
every check is a single `is None` test (`allowed()` below), so a cluster without ACLs pays
nothing on its hot path. Decisions are per request and resource (a topic of a Produce, not
its records) and are cached per (principal, host, operation, resource) until the ACLs change.

A decision, as Kafka's:
1. a super user (`kafka.super_users`) is allowed everything;
2. the bindings that apply to the resource are the LITERAL ones naming it or the wildcard
   `*`, and the PREFIXED ones whose prefix starts its name;
3. none at all: allowed only with `kafka.allow_everyone_if_no_acl_found`;
4. a DENY for the principal (or `User:*`) and host (or `*`) of the operation or ALL: denied;
5. an ALLOW of the operation, ALL, or an operation implying it (READ, WRITE, DELETE and ALTER
   imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS): allowed; otherwise denied.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter

from automq.broker.controller.acls import (
    CLUSTER_NAME,
    IMPLIED_BY,
    OPERATIONS_OF,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)

if TYPE_CHECKING:
    from automq.broker.config import KafkaConfig
    from automq.broker.kafka.context import RequestContext

log = logging.getLogger(__name__)
audit = logging.getLogger("automq.authorizer")  # Kafka's kafka.authorizer.logger

CACHE_ENTRIES = 100_000  # decisions kept; the cache starts over when full
OMITTED = -(2**31)  # Kafka's "not requested" value of the bit fields

# re-exported so handlers import one module
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
Op = AclOperation


def parse_super_users(value: str) -> frozenset[str]:
    return frozenset(p.strip() for p in value.split(";") if p.strip())


class Authorizer:
    def __init__(self, config: KafkaConfig, registry: CollectorRegistry | None = None) -> None:
        self.super_users = parse_super_users(config.super_users)
        self.allow_if_no_acl = config.allow_everyone_if_no_acl_found
        self.audit_all = config.authorizer_audit_log
        self.acls: tuple[AclBinding, ...] = ()
        self._literal: dict[tuple[int, str], list[AclBinding]] = {}
        self._prefixed: dict[tuple[int, str], list[AclBinding]] = {}
        self._prefix_lengths: dict[int, list[int]] = {}
        self._by_type: dict[int, list[AclBinding]] = {}
        self._cache: dict[tuple[str, str, int, int, str], bool] = {}
        self.denials = Counter(
            "kafka_authorizer_denials",
            "Requests (or parts of them) the authorizer denied, by resource type",
            ["resource_type"],
            registry=registry if registry is not None else CollectorRegistry(),
        )

    # ------------------------------------------------------------------ ACL updates

    def update(self, acls: tuple[AclBinding, ...]) -> None:
        """Adopt the image's bindings (a no-op when they did not change)."""
        if acls == self.acls:
            return
        literal: dict[tuple[int, str], list[AclBinding]] = defaultdict(list)
        prefixed: dict[tuple[int, str], list[AclBinding]] = defaultdict(list)
        lengths: dict[int, set[int]] = defaultdict(set)
        by_type: dict[int, list[AclBinding]] = defaultdict(list)
        for b in acls:
            by_type[b.resource_type].append(b)
            if b.pattern_type == PatternType.LITERAL:
                literal[(b.resource_type, b.resource_name)].append(b)
            elif b.pattern_type == PatternType.PREFIXED:
                prefixed[(b.resource_type, b.resource_name)].append(b)
                lengths[b.resource_type].add(len(b.resource_name))
        self.acls = acls
        self._literal, self._prefixed, self._by_type = dict(literal), dict(prefixed), dict(by_type)
        self._prefix_lengths = {t: sorted(ls) for t, ls in lengths.items()}
        self._cache = {}
        log.info("authorizer: %d ACLs", len(acls))

    def _applicable(self, rtype: int, name: str) -> list[AclBinding]:
        found = list(self._literal.get((rtype, name), ()))
        found += self._literal.get((rtype, WILDCARD), ())
        for n in self._prefix_lengths.get(rtype, ()):
            if n > len(name):
                break
            found += self._prefixed.get((rtype, name[:n]), ())
        return found

    # ------------------------------------------------------------------ decisions

    def authorize(self, principal: str, host: str, op: int, rtype: int, name: str) -> bool:
        key = (principal, host, op, rtype, name)
        cached = self._cache.get(key)
        if cached is not None:
            if self.audit_all:
                self._audit(key, cached, "cached")
            return cached
        if principal in self.super_users:
            allowed, why = True, "super user"
        else:
            allowed, why = self._decide(principal, host, op, self._applicable(rtype, name))
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache = {}
        self._cache[key] = allowed
        if not allowed or self.audit_all:
            self._audit(key, allowed, why)
        return allowed

    def _decide(self, principal: str, host: str, op: int, bindings: list[AclBinding]) -> tuple[bool, str]:
        if not bindings:
            return self.allow_if_no_acl, "no ACL for the resource"
        allowing = IMPLIED_BY.get(AclOperation(op), frozenset((AclOperation(op),)))
        allow = None
        for b in bindings:
            if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
                continue
            if b.host != WILDCARD and b.host != host:
                continue
            if b.permission == PermissionType.DENY:
                if b.operation == op or b.operation == AclOperation.ALL:
                    return False, f"denied by {_show(b)}"
            elif allow is None and (b.operation == AclOperation.ALL or b.operation in allowing):
                allow = b
        if allow is not None:
            return True, f"allowed by {_show(allow)}"
        return False, "no ACL allows it"

    def authorize_any(self, principal: str, host: str, op: int, rtype: int) -> bool:
        """Is `op` allowed on at least one resource of the type (Kafka's authorizeByResourceType,
        e.g. an idempotent producer needs WRITE on some topic)? An ALLOW counts unless a DENY
        covers it: a literal DENY of the same name or `*`, or a prefixed DENY of a prefix of it."""
        if principal in self.super_users:
            return True
        bindings = self._by_type.get(rtype, [])
        if not bindings:
            return self.allow_if_no_acl
        allowing = IMPLIED_BY.get(AclOperation(op), frozenset((AclOperation(op),)))

        def applies(b: AclBinding) -> bool:
            return (b.principal in (principal, WILDCARD_PRINCIPAL)) and b.host in (WILDCARD, host)

        denies = [
            b
            for b in bindings
            if b.permission == PermissionType.DENY and applies(b) and b.operation in (op, AclOperation.ALL)
        ]
        for b in bindings:
            if b.permission != PermissionType.ALLOW or not applies(b):
                continue
            if b.operation != AclOperation.ALL and b.operation not in allowing:
                continue
            if not any(_covers(d, b) for d in denies):
                return True
        return False

    def authorized_operations(self, principal: str, host: str, rtype: int, name: str) -> int:
        """Kafka's authorized-operations bit field (bit n = operation code n)."""
        bits = 0
        for op in OPERATIONS_OF.get(ResourceType(rtype), ()):
            if self.authorize_quiet(principal, host, op, rtype, name):
                bits |= 1 << int(op)
        return bits

    def authorize_quiet(self, principal: str, host: str, op: int, rtype: int, name: str) -> bool:
        """A decision that is only reported (authorized-operations), never audited as a denial."""
        if principal in self.super_users:
            return True
        key = (principal, host, op, rtype, name)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._decide(principal, host, op, self._applicable(rtype, name))[0]
        return cached

    def _audit(self, key: tuple[str, str, int, int, str], allowed: bool, why: str) -> None:
        principal, host, op, rtype, name = key
        if not allowed:
            self.denials.labels(ResourceType(rtype).name).inc()
        audit.log(
            logging.INFO,
            "Principal = %s is %s operation = %s from host = %s on resource = %s:%s (%s)",
            principal,
            "Allowed" if allowed else "Denied",
            AclOperation(op).name,
            host,
            ResourceType(rtype).name,
            name,
            why,
        )


def _covers(deny: AclBinding, allow: AclBinding) -> bool:
    if deny.pattern_type == PatternType.LITERAL:
        return deny.resource_name == WILDCARD or (
            allow.pattern_type == PatternType.LITERAL and deny.resource_name == allow.resource_name
        )
    return allow.resource_name.startswith(deny.resource_name)


def _show(b: AclBinding) -> str:
    return (
        f"{PermissionType(b.permission).name} {b.principal} {AclOperation(b.operation).name} "
        f"{PatternType(b.pattern_type).name} {ResourceType(b.resource_type).name}:{b.resource_name} host {b.host}"
    )


# ---------------------------------------------------------------------- helpers for handlers


def allowed(ctx: RequestContext, op: int, rtype: int, name: str) -> bool:
    """True when no authorizer runs or it allows the request's principal `op` on the resource."""
    authorizer = ctx.broker.authorizer
    return authorizer is None or authorizer.authorize(ctx.principal, ctx.client_host, op, rtype, name)


def cluster_allowed(ctx: RequestContext, op: int) -> bool:
    return allowed(ctx, op, CLUSTER, CLUSTER_NAME)


def allowed_on_any(ctx: RequestContext, op: int, rtype: int) -> bool:
    authorizer = ctx.broker.authorizer
    return authorizer is None or authorizer.authorize_any(ctx.principal, ctx.client_host, op, rtype)


def operations(ctx: RequestContext, requested: bool, rtype: int, name: str) -> int:
    """The authorized-operations field of a Metadata / DescribeGroups / DescribeCluster answer."""
    if not requested:
        return OMITTED
    authorizer = ctx.broker.authorizer
    if authorizer is None:  # everything is allowed
        bits = 0
        for op in OPERATIONS_OF[ResourceType(rtype)]:
            bits |= 1 << int(op)
        return bits
    return authorizer.authorized_operations(ctx.principal, ctx.client_host, rtype, name)
