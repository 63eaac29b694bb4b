"""Client quotas (sans I/O): entities, keys, validation, describe filters and precedence.

An entity is a set of (type, name) pairs; a None name is the type's default
(`--entity-default`). Kafka's entity types: `user`, `client-id` (alone or together) and
`ip` (alone). Stored in the controller's metadata as `ClientQuota` entries and pushed to
every broker, which resolves the quota that applies to a connection with `resolve()`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"

CLIENT_KEYS = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE, CONTROLLER_MUTATION_RATE})
IP_KEYS = frozenset({CONNECTION_CREATION_RATE})
_WHOLE_NUMBER_KEYS = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, CONNECTION_CREATION_RATE})

Entity = tuple[tuple[str, str | None], ...]  # sorted by type


class InvalidQuotaError(ValueError):
    """Kafka answers INVALID_REQUEST; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class ClientQuota:
    entity: Entity
    values: dict[str, float]


def make_entity(pairs: Iterable[tuple[str, str | None]]) -> Entity:
    """Validate and normalise an entity (raises InvalidQuotaError)."""
    items = list(pairs)
    types = [t for t, _ in items]
    if not items:
        raise InvalidQuotaError("the quota entity is empty")
    if len(set(types)) != len(types):
        raise InvalidQuotaError(f"entity type repeated in {types}")
    for t, name in items:
        if t not in (USER, CLIENT_ID, IP):
            raise InvalidQuotaError(f"unknown quota entity type {t!r} (user, client-id or ip)")
        if t == IP and name is not None:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                raise InvalidQuotaError(f"{name!r} is not an IP address") from None
    if IP in types and len(types) > 1:
        raise InvalidQuotaError("an ip quota entity cannot be combined with user or client-id")
    return tuple(sorted(items))


def validate_ops(entity: Entity, ops: Mapping[str, float | None]) -> None:
    """ops: key -> value, None to remove."""
    allowed = IP_KEYS if entity[0][0] == IP else CLIENT_KEYS
    for key, value in ops.items():
        if key not in allowed:
            raise InvalidQuotaError(f"unknown quota key {key!r} for this entity (one of {sorted(allowed)})")
        if value is None:
            continue
        if value != value or value in (float("inf"), float("-inf")) or value <= 0:
            raise InvalidQuotaError(f"quota {key} must be a positive number, got {value}")
        if key in _WHOLE_NUMBER_KEYS and value != int(value):
            raise InvalidQuotaError(f"quota {key} must be a whole number, got {value}")


def filter_matches(entity: Entity, components: list[tuple[str, int, str | None]], strict: bool) -> bool:
    """DescribeClientQuotas: components (type, match type 0 exact / 1 default / 2 any, name)."""
    names = dict(entity)
    for etype, match_type, match in components:
        if etype not in names:
            return False
        if match_type == 0 and names[etype] != match:
            return False
        if match_type == 1 and names[etype] is not None:
            return False
    return not strict or len(names) == len(components)


def resolve(
    table: Mapping[Entity, Mapping[str, float]], user: str, client_id: str, key: str
) -> tuple[Entity, float] | None:
    """The quota `key` for a (user, client id), by Kafka's precedence, and the entity whose
    quota it is (connections resolving to one entity share its limit): user+client, user +
    default client, user, default user + client, default user + default client, default user,
    client, default client."""
    for entity in (
        ((CLIENT_ID, client_id), (USER, user)),
        ((CLIENT_ID, None), (USER, user)),
        ((USER, user),),
        ((CLIENT_ID, client_id), (USER, None)),
        ((CLIENT_ID, None), (USER, None)),
        ((USER, None),),
        ((CLIENT_ID, client_id),),
        ((CLIENT_ID, None),),
    ):
        values = table.get(entity)
        if values is not None and key in values:
            return entity, values[key]
    return None
