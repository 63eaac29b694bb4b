"""Server-side assignors of the KIP-848 consumer group protocol: pure functions from the
members' subscriptions, the subscribed topics' partition counts and the previous target
assignment to the new target assignment.

- `uniform` (Kafka's default server assignor): every member gets as many partitions as any
  other member subscribed to the same topics, give or take one, and partitions stay with
  their previous owner whenever balance allows, so a rebalance moves as few as possible.
- `range`: for each topic, the members subscribed to it (sorted by member id) get
  contiguous ranges of its partitions, the first members one more when it does not divide;
  as in Kafka, members subscribed to the same topics get the same partition indexes of
  every co-partitioned topic.

Topics are identified by id (a `uuid.UUID`), as in the protocol's responses. An assignment
is `{member_id: {topic_id: set(partitions)}}`.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping

Assignment = dict[str, dict[uuid.UUID, set[int]]]

UNIFORM = "uniform"
RANGE = "range"
ASSIGNORS = (UNIFORM, RANGE)


def assign(
    name: str,
    subscriptions: Mapping[str, frozenset[uuid.UUID]],
    partitions: Mapping[uuid.UUID, int],
    previous: Assignment,
) -> Assignment:
    """The target assignment of assignor `name` for members subscribed to topic ids."""
    if name == RANGE:
        return range_assign(subscriptions, partitions)
    if name == UNIFORM:
        return uniform_assign(subscriptions, partitions, previous)
    raise ValueError(f"unknown assignor {name!r}")


def range_assign(subscriptions: Mapping[str, frozenset[uuid.UUID]], partitions: Mapping[uuid.UUID, int]) -> Assignment:
    out: Assignment = {m: {} for m in subscriptions}
    for topic, count in partitions.items():
        members = sorted(m for m, topics in subscriptions.items() if topic in topics)
        if not members or count <= 0:
            continue
        per, extra = divmod(count, len(members))
        start = 0
        for i, member in enumerate(members):
            n = per + (1 if i < extra else 0)
            if n:
                out[member][topic] = set(range(start, start + n))
            start += n
    return out


def uniform_assign(
    subscriptions: Mapping[str, frozenset[uuid.UUID]],
    partitions: Mapping[uuid.UUID, int],
    previous: Assignment,
) -> Assignment:
    """Sticky and balanced. Every partition of a subscribed topic goes to a member subscribed
    to it; previous owners keep what they had up to a fair share; the rest goes to the least
    loaded candidate; then partitions move from the most to the least loaded candidate while
    that narrows the gap by two or more (which also balances heterogeneous subscriptions)."""
    members = sorted(subscriptions)
    out: Assignment = {m: {} for m in members}
    if not members:
        return out
    all_partitions = [
        (topic, p)
        for topic in sorted(partitions, key=str)
        for p in range(partitions[topic])
        if any(topic in subscriptions[m] for m in members)
    ]
    candidates: dict[uuid.UUID, list[str]] = {}
    for topic in {t for t, _ in all_partitions}:
        candidates[topic] = [m for m in members if topic in subscriptions[m]]
    load = dict.fromkeys(members, 0)
    owner: dict[tuple[uuid.UUID, int], str] = {}
    # a member's fair share if everything were spread over every member that could take it
    share = dict.fromkeys(members, 0.0)
    for topic, _p in all_partitions:
        for m in candidates[topic]:
            share[m] += 1 / len(candidates[topic])
    # previous owners keep up to their share rounded up (their lowest partitions first), as
    # Kafka's uniform assignor does: with 6 partitions, a second member takes 3-5 from the
    # first, which keeps 0-2 (librdkafka's test 0113 checks exactly that placement)
    # (heterogeneous subscriptions keep one more: their shares are only estimates)
    homogeneous = len(set(subscriptions.values())) == 1
    cap = {m: math.ceil(share[m] - 1e-9) if homogeneous else int(share[m]) + 1 for m in members}

    for member in members:
        for topic, parts in sorted(previous.get(member, {}).items(), key=lambda kv: str(kv[0])):
            if topic not in subscriptions[member] or topic not in partitions:
                continue
            for p in sorted(parts):
                key = (topic, p)
                if p < partitions[topic] and key not in owner and load[member] < cap[member]:
                    owner[key] = member
                    load[member] += 1
    for key in all_partitions:
        if key in owner:
            continue
        best = min(candidates[key[0]], key=lambda m: (load[m], m))
        owner[key] = best
        load[best] += 1
    # balance: move from a member to a less loaded candidate while the gap is two or more
    moved = True
    while moved:
        moved = False
        for key in sorted(owner, key=lambda k: (-load[owner[k]], str(k[0]), k[1])):
            current = owner[key]
            target = min(candidates[key[0]], key=lambda m: (load[m], m))
            if load[current] - load[target] >= 2:
                owner[key] = target
                load[current] -= 1
                load[target] += 1
                moved = True
    for (topic, p), member in owner.items():
        out[member].setdefault(topic, set()).add(p)
    return out
