"""Share sessions (KIP-932): what one share-group member fetches from this broker.

Keyed by (group id, member id), unlike fetch sessions which the broker numbers. Epoch 0
opens a session (a full ShareFetch; acknowledgements are not allowed then), each later
ShareFetch or ShareAcknowledge carries the next epoch (1, 2, ...; wrapping to 1), and -1
closes it, releasing what the member still holds on this broker. A wrong epoch is
INVALID_SHARE_SESSION_EPOCH, an unknown session SHARE_SESSION_NOT_FOUND, a full cache
SHARE_SESSION_LIMIT_REACHED (`group.share.max.share.sessions`, 2000 as in Kafka) unless the least
recently used session has been idle for EVICT_AFTER_S (then it is evicted and its member's
records released, as when it closes).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
DEFAULT_MAX_SESSIONS = 2000
EVICT_AFTER_S = 120.0


@dataclass(slots=True)
class ShareSession:
    group_id: str
    member_id: str
    epoch: int = 1  # the epoch the next request must carry
    # (topic name, partition) of every partition the session fetches -> the topic id it was
    # added under (a topic deleted and recreated under its name is another topic)
    partitions: dict[tuple[str, int], uuid.UUID | None] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    # the client connection the session was last used on (its close-callback registry):
    # when that connection closes, the session ends and the member's records are released
    connection: object | None = field(default=None, repr=False)

    def next_epoch(self) -> None:
        self.epoch = 1 if self.epoch >= 0x7FFFFFFF else self.epoch + 1
        self.last_used = time.monotonic()


class ShareSessionCache:
    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[tuple[str, str], ShareSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        session = self._sessions.get((group_id, member_id))
        if session is not None:
            self._sessions.move_to_end((group_id, member_id))
        return session

    def create(self, group_id: str, member_id: str) -> tuple[ShareSession | None, ShareSession | None]:
        """(a new session for the member, replacing its old one, or None when the cache is full
        of live sessions; the idle session evicted to make room, if any)."""
        key = (group_id, member_id)
        evicted = None
        if key not in self._sessions and len(self._sessions) >= self.max_sessions:
            oldest_key, oldest = next(iter(self._sessions.items()))
            if time.monotonic() - oldest.last_used < EVICT_AFTER_S:
                return None, None
            evicted = self._sessions.pop(oldest_key)
        self._sessions.pop(key, None)
        session = ShareSession(group_id, member_id)
        self._sessions[key] = session
        return session, evicted

    def remove(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.pop((group_id, member_id), None)

    def sessions_of_group(self, group_id: str) -> list[ShareSession]:
        return [s for (g, _m), s in self._sessions.items() if g == group_id]
