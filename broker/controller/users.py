"""Commands on SCRAM users (AlterUserScramCredentials), kept beside commands.py's so the
security records stay one block. Validated against the state before any record is emitted.

Results are per user as Kafka answers them: all changes of one user apply or none do; a
user whose deletion names a credential that does not exist gets RESOURCE_NOT_FOUND while
the other users' changes still apply.
"""

from __future__ import annotations

from automq.broker.controller import records as r
from automq.broker.controller.commands import Tx
from automq.broker.controller.protocol import InvalidRequestError, ScramCredentialInfo

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
