"""Where partition leaders go (pure): spread evenly over active brokers, rack-aware.

Only brokers in state "active" receive partitions (draining and fenced ones never do). A
partition counts against its leader, and a moving partition against its target, so a burst
of placements (a new topic, a drain) spreads instead of piling onto the emptiest broker.
When racks are given, a topic's partitions first spread over racks, then over brokers.
"""

from __future__ import annotations

from collections import Counter

from automq.broker.controller.state import MetadataState, PartitionState


def counted_node(p: PartitionState) -> int:
    """The broker a partition's load counts against: a move's target, else its leader."""
    return p.target if p.state == "moving" and p.target >= 0 else p.leader


class Placement:
    """Load counters built once per command, updated as it places partitions."""

    def __init__(self, state: MetadataState) -> None:
        self._state = state
        self.load: Counter[int] = Counter()
        self._topic_broker: Counter[tuple[str, int]] = Counter()
        self._topic_rack: Counter[tuple[str, str | None]] = Counter()
        for t in state.topics.values():
            for p in t.partitions:
                node = counted_node(p)
                if node >= 0:
                    self._count(t.name, node, +1)

    def _rack(self, node_id: int) -> str | None:
        b = self._state.brokers.get(node_id)
        return b.rack if b else None

    def _count(self, topic: str, node_id: int, delta: int) -> None:
        self.load[node_id] += delta
        self._topic_broker[(topic, node_id)] += delta
        self._topic_rack[(topic, self._rack(node_id))] += delta

    def candidates(self, exclude: tuple[int, ...] = ()) -> list[int]:
        return sorted(
            b.node_id for b in self._state.brokers.values() if b.state == "active" and b.node_id not in exclude
        )

    def choose(self, topic: str, exclude: tuple[int, ...] = (), prefer: int = -1) -> int:
        """The broker a partition of `topic` should go to (-1 when none is active)."""
        nodes = self.candidates(exclude)
        if not nodes:
            return -1
        if prefer in nodes:
            best = prefer
        else:
            best = min(
                nodes,
                key=lambda n: (
                    self._topic_rack[(topic, self._rack(n))],
                    self._topic_broker[(topic, n)],
                    self.load[n],
                    n,
                ),
            )
        self._count(topic, best, +1)
        return best

    def release(self, topic: str, node_id: int) -> None:
        """A partition left `node_id` (its counters must not keep attracting or repelling)."""
        if node_id >= 0:
            self._count(topic, node_id, -1)
