"""Commands that change ACLs and client quotas (sans I/O, run inside a `commands.Tx`).

Each item of a request is judged on its own, as Kafka does: a bad ACL creation or quota
entry gets its own INVALID_REQUEST result while the good ones of the same request are
applied. Creating a binding that exists already succeeds without a second copy; deleting
returns the bindings each filter matched (a binding matched by two filters is deleted once
and reported under both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from automq.broker.controller import records as r
from automq.broker.controller.acls import AclBinding, AclFilter, InvalidAclError, validate_binding, validate_filter
from automq.broker.controller.commands import Tx
from automq.broker.controller.quotas import InvalidQuotaError, make_entity, validate_ops

MAX_ACLS = 100_000  # a bound on metadata growth; Kafka has none, but every broker holds them all

Result = tuple[str | None, str | None]  # (error code name, message); (None, None) on success


def create_acls(tx: Tx, bindings: list[AclBinding]) -> list[Result]:
    results: list[Result] = []
    fresh: dict[tuple, None] = {}
    for b in bindings:
        try:
            validate_binding(b)
        except InvalidAclError as exc:
            results.append(("INVALID_REQUEST", str(exc)))
            continue
        if len(tx.state.acls) + len(fresh) >= MAX_ACLS and b.key() not in tx.state.acls:
            results.append(("INVALID_REQUEST", f"the cluster holds {MAX_ACLS} ACLs already"))
            continue
        if b.key() not in tx.state.acls:
            fresh[b.key()] = None
        results.append((None, None))
    if fresh:
        tx.emit(r.AclsCreated([list(k) for k in fresh]))
    return results


def delete_acls(tx: Tx, filters: list[AclFilter]) -> list[tuple[Result, list[AclBinding]]]:
    results: list[tuple[Result, list[AclBinding]]] = []
    doomed: dict[tuple, None] = {}
    current = [AclBinding(*k) for k in tx.state.acls]
    for f in filters:
        try:
            validate_filter(f)
        except InvalidAclError as exc:
            results.append((("INVALID_REQUEST", str(exc)), []))
            continue
        matched = [b for b in current if f.matches(b)]
        for b in matched:
            doomed[b.key()] = None
        results.append(((None, None), matched))
    if doomed:
        tx.emit(r.AclsDeleted([list(k) for k in doomed]))
    return results


def alter_client_quotas(
    tx: Tx, entries: Sequence[tuple[list[tuple[str, str | None]], Mapping[str, float | None]]], validate_only: bool
) -> list[Result]:
    results: list[Result] = []
    for pairs, ops in entries:
        try:
            entity = make_entity(pairs)
            validate_ops(entity, ops)
        except InvalidQuotaError as exc:
            results.append(("INVALID_REQUEST", str(exc)))
            continue
        if not validate_only and ops:
            tx.emit(r.ClientQuotasAltered([list(p) for p in entity], dict(ops)))
        results.append((None, None))
    return results
