"""Kafka's ACL model (sans I/O): resource patterns, bindings, filters, and how they match.

Shared by the controller (validating CreateAcls, matching DeleteAcls filters, storing
bindings in the metadata log) and the brokers' authorizer (`kafka/authorizer.py`), which
get every binding through the metadata image. The numeric codes are Kafka's, as they travel
in CreateAcls / DescribeAcls / DeleteAcls, so a binding is stored exactly as a client sent it.

Matching rules, as Kafka's (`ResourcePatternFilter`, `AccessControlEntryFilter`):
- a filter's pattern type ANY matches bindings of any pattern type with the same name;
  MATCH matches what would apply to the named resource: literal bindings of that name or of
  the wildcard `*`, and prefixed bindings whose prefix starts the name;
- a null name, principal or host in a filter matches anything; operation / permission ANY
  match anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class PermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


WILDCARD = "*"  # a literal resource name, principal `User:*` or host matching every one
CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource
WILDCARD_PRINCIPAL = "User:*"

# An ALLOW of any of these operations also allows the key (Kafka's implied operations);
# DENY never implies: denying READ does not deny DESCRIBE.
IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset(
        {AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}),
}

# Which operations mean something for which resource type (what Kafka reports in
# authorized-operations bit fields).
OPERATIONS_OF: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE),
    ResourceType.CLUSTER: (
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    ),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
    ResourceType.DELEGATION_TOKEN: (AclOperation.DESCRIBE,),
    ResourceType.USER: (AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS),
}


class InvalidAclError(ValueError):
    """A binding or filter Kafka would refuse (INVALID_REQUEST); the message says why."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry. Fields are Kafka's codes."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def key(self) -> tuple[int, str, int, str, str, int, int]:
        return (
            self.resource_type,
            self.resource_name,
            self.pattern_type,
            self.principal,
            self.host,
            self.operation,
            self.permission,
        )


@dataclass(frozen=True, slots=True)
class AclFilter:
    """DescribeAcls / DeleteAcls filter; None matches any name, principal or host."""

    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        if not _pattern_matches(self.pattern_type, self.resource_name, b.pattern_type, b.resource_name):
            return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != b.operation:
            return False
        return self.permission == PermissionType.ANY or self.permission == b.permission


def _pattern_matches(filter_type: int, filter_name: str | None, pattern_type: int, name: str) -> bool:
    if filter_type not in (PatternType.ANY, PatternType.MATCH) and filter_type != pattern_type:
        return False
    if filter_name is None:
        return True
    if filter_type != PatternType.MATCH:
        return filter_name == name
    if pattern_type == PatternType.LITERAL:
        return filter_name == name or name == WILDCARD
    if pattern_type == PatternType.PREFIXED:
        return filter_name.startswith(name)
    return False


def _enum_value(enum: type[IntEnum], value: int, what: str) -> IntEnum:
    try:
        return enum(value)
    except ValueError:
        raise InvalidAclError(f"unknown {what} {value}") from None


def _check_principal(principal: str) -> None:
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        raise InvalidAclError(f"principal {principal!r} is not of the form Type:Name (e.g. User:alice)")


def validate_binding(b: AclBinding) -> None:
    """Raise InvalidAclError unless Kafka would store this binding."""
    rtype = _enum_value(ResourceType, b.resource_type, "resource type")
    if rtype in (ResourceType.ANY, ResourceType.UNKNOWN):
        raise InvalidAclError(f"resource type {rtype.name} is a filter value, not a resource type")
    ptype = _enum_value(PatternType, b.pattern_type, "pattern type")
    if ptype not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAclError(f"pattern type {ptype.name} is a filter value; an ACL is LITERAL or PREFIXED")
    op = _enum_value(AclOperation, b.operation, "operation")
    if op in (AclOperation.ANY, AclOperation.UNKNOWN):
        raise InvalidAclError(f"operation {op.name} is a filter value, not an operation")
    perm = _enum_value(PermissionType, b.permission, "permission type")
    if perm not in (PermissionType.ALLOW, PermissionType.DENY):
        raise InvalidAclError(f"permission type {perm.name} is a filter value; an ACL is ALLOW or DENY")
    if not b.resource_name:
        raise InvalidAclError("the resource name is empty")
    if rtype == ResourceType.CLUSTER and (ptype != PatternType.LITERAL or b.resource_name != CLUSTER_NAME):
        raise InvalidAclError(f"a CLUSTER ACL must name the literal resource {CLUSTER_NAME!r}")
    if ptype == PatternType.PREFIXED and b.resource_name == WILDCARD:
        raise InvalidAclError("a PREFIXED pattern cannot be the wildcard '*' (use LITERAL '*')")
    _check_principal(b.principal)
    if not b.host:
        raise InvalidAclError("the host is empty (use '*' for any host)")


def validate_filter(f: AclFilter) -> None:
    """Raise InvalidAclError for a filter holding UNKNOWN values (as Kafka refuses them)."""
    if _enum_value(ResourceType, f.resource_type, "resource type") == ResourceType.UNKNOWN:
        raise InvalidAclError("resource type UNKNOWN in a filter")
    if _enum_value(PatternType, f.pattern_type, "pattern type") == PatternType.UNKNOWN:
        raise InvalidAclError("pattern type UNKNOWN in a filter")
    if _enum_value(AclOperation, f.operation, "operation") == AclOperation.UNKNOWN:
        raise InvalidAclError("operation UNKNOWN in a filter")
    if _enum_value(PermissionType, f.permission, "permission type") == PermissionType.UNKNOWN:
        raise InvalidAclError("permission type UNKNOWN in a filter")
