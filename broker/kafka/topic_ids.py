"""Topic ids as clients see them: the controller's topic id string as a UUID."""

from __future__ import annotations

import functools
import uuid


@functools.lru_cache(maxsize=65536)
def topic_uuid(topic_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(topic_id)
    except ValueError:
        # not a UUID string: derive a stable one so clients still get a usable id
        return uuid.uuid5(uuid.NAMESPACE_OID, topic_id)
