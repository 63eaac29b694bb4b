"""Commands on SCRAM users (AlterUserScramCredentials) and delegation tokens, kept beside
commands.py's so the security records stay one block. Validated against the state before any record is emitted.

Results are per user as Kafka answers them: all changes of one user apply or none do; a
user whose deletion names a credential that does not exist gets RESOURCE_NOT_FOUND while
the other users' changes still apply.
"""

from __future__ import annotations

from automq.broker.controller import records as r
from automq.broker.controller.commands import Tx
from automq.broker.controller.protocol import DelegationTokenInfo, InvalidRequestError, ScramCredentialInfo

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def alter_scram_credentials(
    tx: Tx, deletions: list[tuple[str, str]], upsertions: list[ScramCredentialInfo]
) -> dict[str, tuple[str, str] | None]:
    """{user: None (applied) | (Kafka error name, message)}."""
    for _user, mechanism in deletions:
        if mechanism not in SCRAM_MECHANISMS:
            raise InvalidRequestError(f"unknown SCRAM mechanism {mechanism!r}")
    for c in upsertions:
        if c.mechanism not in SCRAM_MECHANISMS:
            raise InvalidRequestError(f"unknown SCRAM mechanism {c.mechanism!r}")
    results: dict[str, tuple[str, str] | None] = {}
    for user, mechanism in deletions:
        if (user, mechanism) not in tx.state.scram:
            results[user] = (
                "RESOURCE_NOT_FOUND",
                f"Attempt to delete a user credential that does not exist: {user} {mechanism}",
            )
    for user in {u for u, _ in deletions} | {c.user for c in upsertions}:
        results.setdefault(user, None)
    for user, mechanism in deletions:
        if results[user] is None:
            tx.emit(r.ScramCredentialDeleted(user, mechanism))
    for c in upsertions:
        if results[c.user] is None:
            tx.emit(r.ScramCredentialUpserted(c.user, c.mechanism, c.salt, c.iterations, c.stored_key, c.server_key))
    return results


def create_delegation_token(tx: Tx, token: DelegationTokenInfo) -> None:
    """The broker checked who may create it and chose its id and times."""
    if token.token_id in tx.state.tokens:
        raise InvalidRequestError(f"delegation token {token.token_id} exists")
    if not token.issue_ms <= token.expiry_ms <= token.max_ms:
        raise InvalidRequestError("delegation token times must be issue <= expiry <= max")
    tx.emit(
        r.DelegationTokenCreated(
            token.token_id,
            token.owner,
            token.requester,
            list(token.renewers),
            token.issue_ms,
            token.expiry_ms,
            token.max_ms,
        )
    )


def set_delegation_token_expiry(tx: Tx, token_id: str, expiry_ms: int | None) -> bool:
    """Renew (a new expiry) or expire (None: removed now); False when the token is unknown."""
    current = tx.state.tokens.get(token_id)
    if current is None:
        return False
    if expiry_ms is None:
        tx.emit(r.DelegationTokenRemoved(token_id))
    else:
        tx.emit(r.DelegationTokenRenewed(token_id, min(expiry_ms, current[5])))
    return True


def remove_expired_delegation_tokens(tx: Tx) -> int:
    """Tokens past their expiry leave the metadata (Kafka's expiry check; a GC round runs it)."""
    expired = sorted(t for t, v in tx.state.tokens.items() if v[4] < tx.now_ms)
    for token_id in expired:
        tx.emit(r.DelegationTokenRemoved(token_id))
    return len(expired)
