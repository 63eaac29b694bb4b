"""The AutoMQUser custom resource (the Strimzi `KafkaUser` pattern): one Kafka principal of an
AutoMQCluster, its ACLs and its client quotas, as pydantic models, plus the pure functions
that turn a spec into the ACL bindings and quota values the cluster must hold.

The principal is `User:<metadata.name>`. The resource owns every ACL of that principal and
its `user` quota entity: what the spec does not list is removed from the cluster (so an ACL
added by hand for a managed user is undone at the next reconcile, as Strimzi does).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from automq.broker.controller.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from automq.broker.controller.quotas import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
)
from automq.operator.spec import (
    CLUSTER_NAME_MAX,
    CLUSTER_NAME_PATTERN,
    GROUP,
    VERSION,
    Condition,
    explain_validation_error,
)

USER_KIND = "AutoMQUser"
USER_PLURAL = "automqusers"
USER_SINGULAR = "automquser"
USER_SHORT_NAMES = ["amqu"]
# Kafka principal names may hold more than a Kubernetes name; the resource name is the user name.
USER_NAME_MAX = 253
USER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"

_RESOURCE_TYPES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "cluster": ResourceType.CLUSTER,
    "transactionalId": ResourceType.TRANSACTIONAL_ID,
}
_OPERATIONS = {
    "Read": AclOperation.READ,
    "Write": AclOperation.WRITE,
    "Create": AclOperation.CREATE,
    "Delete": AclOperation.DELETE,
    "Alter": AclOperation.ALTER,
    "Describe": AclOperation.DESCRIBE,
    "ClusterAction": AclOperation.CLUSTER_ACTION,
    "AlterConfigs": AclOperation.ALTER_CONFIGS,
    "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS,
    "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE,
    "All": AclOperation.ALL,
}
Operation = Literal[
    "Read",
    "Write",
    "Create",
    "Delete",
    "Alter",
    "Describe",
    "ClusterAction",
    "AlterConfigs",
    "DescribeConfigs",
    "IdempotentWrite",
    "All",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, validate_default=True)


class AclResource(_Model):
    type: Literal["topic", "group", "cluster", "transactionalId"] = Field(
        description="What the rule is about. A cluster rule ignores name and patternType."
    )
    name: Annotated[str, Field(min_length=1, max_length=32_767)] = Field(
        "*", description="The resource name; '*' (literal) means every resource of the type."
    )
    pattern_type: Literal["literal", "prefix"] = Field(
        "literal", description="literal: exactly this name (or '*'); prefix: every name starting with it."
    )

    @model_validator(mode="after")
    def _no_prefixed_wildcard(self) -> AclResource:
        if self.type != "cluster" and self.pattern_type == "prefix" and self.name == "*":
            raise ValueError("a prefix pattern cannot be '*' (use patternType literal with name '*')")
        return self


class AclRule(_Model):
    resource: AclResource
    operations: list[Operation] = Field(min_length=1, description="Kafka operations the rule allows or denies.")
    host: Annotated[str, Field(min_length=1, max_length=255)] = Field(
        "*", description="The client address the rule applies to; '*' for any."
    )
    type: Literal["allow", "deny"] = Field("allow", description="A deny wins over every allow.")


class UserAuthorization(_Model):
    type: Literal["simple"] = Field("simple", description="ACLs checked by the brokers' authorizer.")
    acls: list[AclRule] = Field(default_factory=list, max_length=1000)


class UserQuotas(_Model):
    producer_byte_rate: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Bytes per second this user may produce (all its clients together)."
    )
    consumer_byte_rate: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Bytes per second this user may fetch."
    )
    request_percentage: Annotated[float, Field(gt=0)] | None = Field(
        None, description="Broker time on this user's requests, percent of one core."
    )
    controller_mutation_rate: Annotated[float, Field(gt=0)] | None = Field(
        None, description="Partitions this user may create or delete per second (KIP-599)."
    )


class UserAuthentication(_Model):
    type: Literal["scram-sha-512", "scram-sha-256", "tls"] = Field(
        description="scram-sha-512 / scram-sha-256: the operator generates a password, stores it in a Secret named "
        "after the user (keys username, password, mechanism, bootstrap, sasl.jaas.config, ca.crt) and the "
        "salted credential in the cluster. tls: a client certificate (CN=<user>,O=automq-user) signed by the "
        "cluster's clients CA, in a Secret named after the user (user.crt, user.key, user.p12, user.password, "
        "ca.crt, bootstrap), renewed before it expires; brokers map it to the principal User:<user>. Needs a "
        "listener with authentication tls and certificates issued by the operator."
    )


class AutoMQUserSpec(_Model):
    cluster: Annotated[str, Field(min_length=1, max_length=CLUSTER_NAME_MAX, pattern=CLUSTER_NAME_PATTERN)] = Field(
        description="The AutoMQCluster (same namespace) this user belongs to."
    )
    authentication: UserAuthentication | None = Field(
        None, description="How the user authenticates; without it the operator removes the user's SCRAM credentials."
    )
    authorization: UserAuthorization | None = Field(
        None, description="The user's ACLs; without it the user holds no ACL (the operator removes any)."
    )
    quotas: UserQuotas | None = Field(None, description="Client quotas of this user (the `user` quota entity).")


class AutoMQUserStatus(_Model):
    observed_generation: int | None = None
    secret: str | None = Field(None, description="The Secret holding the user's credentials.")
    principal: str | None = Field(None, description="The Kafka principal the ACLs name.")
    acls: int | None = Field(None, description="ACL bindings the cluster holds for the principal.")
    certificate_not_after: str | None = Field(
        None, description="authentication tls: when the client certificate in the Secret expires (renewed before)."
    )
    conditions: list[Condition] = Field(default_factory=list)


class InvalidUserSpec(ValueError):
    """The AutoMQUser's spec is invalid; the message names each field and why."""


def parse_user_spec(raw: dict[str, Any]) -> AutoMQUserSpec:
    try:
        return AutoMQUserSpec.model_validate(raw)
    except ValidationError as exc:
        raise InvalidUserSpec(explain_validation_error(exc)) from None


def principal_of(name: str) -> str:
    return f"User:{name}"


def desired_acls(name: str, spec: AutoMQUserSpec) -> set[AclBinding]:
    """Every ACL binding the spec asks for (one per rule and operation)."""
    out: set[AclBinding] = set()
    if spec.authorization is None:
        return out
    principal = principal_of(name)
    for rule in spec.authorization.acls:
        rtype = _RESOURCE_TYPES[rule.resource.type]
        if rtype == ResourceType.CLUSTER:
            resource, pattern = CLUSTER_NAME, PatternType.LITERAL
        else:
            resource = rule.resource.name
            pattern = PatternType.PREFIXED if rule.resource.pattern_type == "prefix" else PatternType.LITERAL
        permission = PermissionType.ALLOW if rule.type == "allow" else PermissionType.DENY
        for op in rule.operations:
            out.add(
                AclBinding(
                    int(rtype), resource, int(pattern), principal, rule.host, int(_OPERATIONS[op]), int(permission)
                )
            )
    return out


def desired_quotas(spec: AutoMQUserSpec) -> dict[str, float]:
    q = spec.quotas
    if q is None:
        return {}
    values = {
        PRODUCER_BYTE_RATE: q.producer_byte_rate,
        CONSUMER_BYTE_RATE: q.consumer_byte_rate,
        REQUEST_PERCENTAGE: q.request_percentage,
        CONTROLLER_MUTATION_RATE: q.controller_mutation_rate,
    }
    return {k: float(v) for k, v in values.items() if v is not None}


def scram_mechanism(spec: AutoMQUserSpec) -> str | None:
    """ "SCRAM-SHA-512" / "SCRAM-SHA-256", or None without SCRAM authentication."""
    if spec.authentication is None or spec.authentication.type == "tls":
        return None
    return spec.authentication.type.upper()


def wants_certificate(spec: AutoMQUserSpec) -> bool:
    return spec.authentication is not None and spec.authentication.type == "tls"


def jaas_config(user: str, password: str) -> str:
    """What a Java client puts in sasl.jaas.config (Strimzi's Secrets carry the same key)."""
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'


def quota_ops(current: dict[str, float], desired: dict[str, float]) -> dict[str, float | None]:
    """What AlterClientQuotas must change: set what differs, remove what is no longer wanted."""
    ops: dict[str, float | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    ops.update({k: None for k in current if k not in desired})
    return ops


API_VERSION = f"{GROUP}/{VERSION}"
