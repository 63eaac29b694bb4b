"""The balancing planner: load model + goals in, a proposal of partition moves out. Pure.

No I/O and no clock: the caller passes `now` and the last move time of each partition, so
the same inputs always give the same proposal (property-tested in
tests/balancer/test_planner_properties.py).

Goals, in priority order (each can be switched off in `Goals`):

(a) evacuate: no partition on a broker that is draining, fenced, not Ready, or excluded by
    the caller. These moves ignore the cool-down (a leaving broker cannot wait).
(b) network: every eligible broker's bytes-in and bytes-out within `tolerance_percent` of
    the mean (or within `min_rate_bytes`: an idle cluster's noise is not imbalance).
(c) counts: the spread (largest minus smallest) of partition counts (one replica each,
    so leader counts too) at most `tolerance_percent` of the mean, and at least 1.
(d) racks: where every eligible broker has a rack and there are two racks or more, each
    topic's partitions spread over racks with counts differing by at most one.

A lower goal never makes a higher one worse: a move for (b), (c) or (d) is taken only if
it raises neither the largest bytes-in nor the largest bytes-out deviation from the mean,
and a move for (d) does not widen the count spread either. Once (b) is within tolerance it
plans nothing for (b), so a balanced cluster sees no moves at all. A partition moves at most
once per proposal, partitions moved within `cooldown_s` stay put (except for (a)), and a
proposal holds at most `max_moves` moves (the rest comes in the next evaluation).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from automq.broker.balancer.model import ACTIVE, LoadModel, PartitionKey, PartitionLoad

EVACUATE = "evacuate"
NETWORK = "network"
COUNTS = "counts"
RACKS = "racks"
GOALS = (EVACUATE, NETWORK, COUNTS, RACKS)

_EPS = 1e-9


class GoalsError(ValueError):
    """A goal setting outside its range (the message names the field)."""


@dataclass(frozen=True, slots=True)
class Goals:
    evacuate: bool = True
    network: bool = True
    counts: bool = True
    racks: bool = True
    tolerance_percent: float = 10.0
    min_rate_bytes: float = 16384.0  # deviations below this many bytes/s are noise, not imbalance
    max_moves: int = 10
    cooldown_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.tolerance_percent <= 100:
            raise GoalsError(f"tolerancePercent must be in (0, 100], got {self.tolerance_percent}")
        if self.min_rate_bytes < 0:
            raise GoalsError(f"minRateBytes must be >= 0, got {self.min_rate_bytes}")
        if self.max_moves < 0:
            raise GoalsError(f"maxMoves must be >= 0, got {self.max_moves}")
        if self.cooldown_s < 0:
            raise GoalsError(f"cooldownSeconds must be >= 0, got {self.cooldown_s}")


@dataclass(frozen=True, slots=True)
class Move:
    topic: str
    partition: int
    source: int
    target: int
    goal: str  # which goal asked for it
    bytes_in: float = 0.0  # the partition's rates when planned
    bytes_out: float = 0.0

    @property
    def key(self) -> PartitionKey:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class BrokerTotals:
    broker_id: int
    state: str
    rack: str | None
    bytes_in: float
    bytes_out: float
    messages_in: float
    partitions: int


@dataclass(frozen=True)
class Proposal:
    moves: tuple[Move, ...]
    before: Mapping[int, BrokerTotals]
    after: Mapping[int, BrokerTotals]
    imbalance_before: Mapping[str, float]
    imbalance_after: Mapping[str, float]
    eligible: tuple[int, ...] = ()  # brokers that may receive partitions
    notes: tuple[str, ...] = field(default=())  # goals left unmet and why

    def to_dict(self) -> dict[str, Any]:
        return {
            "moves": [asdict(m) for m in self.moves],
            "before": {str(b): asdict(t) for b, t in sorted(self.before.items())},
            "after": {str(b): asdict(t) for b, t in sorted(self.after.items())},
            "imbalance_before": dict(self.imbalance_before),
            "imbalance_after": dict(self.imbalance_after),
            "eligible": list(self.eligible),
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------- state


class _Plan:
    """Placement and per-broker sums as the proposal is built (moves applied in place)."""

    def __init__(self, model: LoadModel, goals: Goals, exclude: Collection[int]) -> None:
        self.model = model
        self.goals = goals
        self.tol = goals.tolerance_percent / 100.0
        self.eligible = sorted(b for b, bl in model.brokers.items() if bl.state == ACTIVE and b not in exclude)
        self.racks = {b: bl.rack for b, bl in model.brokers.items()}
        self.parts: dict[PartitionKey, PartitionLoad] = {
            k: p for k, p in sorted(model.partitions.items()) if p.leader in model.brokers
        }
        self.where: dict[PartitionKey, int] = {k: p.leader for k, p in self.parts.items()}
        self.load: dict[int, list[float]] = {b: [0.0, 0.0, 0.0, 0.0] for b in model.brokers}
        for k, p in self.parts.items():
            acc = self.load[self.where[k]]
            acc[0] += p.bytes_in
            acc[1] += p.bytes_out
            acc[2] += p.messages_in
            acc[3] += 1
        n = max(len(self.eligible), 1)
        self.mean = [sum(acc[i] for acc in self.load.values()) / n for i in range(4)]
        # scale of a deviation: the mean, but never below the noise floor
        self.scale = [max(self.mean[0], goals.min_rate_bytes, _EPS), max(self.mean[1], goals.min_rate_bytes, _EPS)]
        self.moves: list[Move] = []
        self.moved: set[PartitionKey] = set()
        self.notes: list[str] = []
        self.rack_aware = len(self.eligible) > 0 and all(self.racks[b] for b in self.eligible)
        self.rack_aware = self.rack_aware and len({self.racks[b] for b in self.eligible}) >= 2
        self._eligible_set = set(self.eligible)
        # (topic, rack) -> partitions of the topic on eligible brokers of that rack, kept by apply/undo
        self._topic_rack: Counter[tuple[str, str | None]] = Counter()
        for (t, _), b in self.where.items():
            self._count_rack(t, b, +1)

    def _count_rack(self, topic: str, broker: int, delta: int) -> None:
        if broker in self._eligible_set:
            self._topic_rack[(topic, self.racks[broker])] += delta

    # ---- measures

    def max_dev(self, r: int) -> float:
        return max((abs(self.load[b][r] - self.mean[r]) for b in self.eligible), default=0.0)

    def network_ok(self) -> bool:
        for r in (0, 1):
            allowed = max(self.tol * self.mean[r], self.goals.min_rate_bytes)
            if self.max_dev(r) > allowed + _EPS * self.scale[r]:
                return False
        return True

    def count_allowed(self) -> float:
        return max(1.0, self.tol * self.mean[3])

    def count_spread(self) -> float:
        counts = [self.load[b][3] for b in self.eligible]
        return max(counts) - min(counts) if counts else 0.0

    def counts_ok(self) -> bool:
        return self.count_spread() <= self.count_allowed() + _EPS

    def unavailable(self) -> list[PartitionKey]:
        ok = set(self.eligible)
        return [k for k, b in self.where.items() if b not in ok]

    def topic_racks(self, topic: str) -> Counter[str]:
        """Partitions of `topic` per rack that has an eligible broker (zero included)."""
        racks = {self.racks[b] for b in self.eligible}
        return Counter({r: self._topic_rack[(topic, r)] for r in racks})  # type: ignore[misc]

    def rack_violations(self) -> int:
        if not self.rack_aware:
            return 0
        total = 0
        for topic in sorted({t for t, _ in self.where}):
            c = self.topic_racks(topic)
            total += max(0, max(c.values()) - min(c.values()) - 1)
        return total

    def imbalance(self) -> dict[str, float]:
        def pct(r: int) -> float:
            return round(100.0 * self.max_dev(r) / self.mean[r], 2) if self.mean[r] > 0 else 0.0

        return {
            EVACUATE: float(len(self.unavailable())),
            "bytes_in_percent": pct(0),
            "bytes_out_percent": pct(1),
            "partition_spread": self.count_spread(),
            RACKS: float(self.rack_violations()),
        }

    def totals(self) -> dict[int, BrokerTotals]:
        return {
            b: BrokerTotals(
                b,
                self.model.brokers[b].state,
                self.racks[b],
                round(acc[0], 3),
                round(acc[1], 3),
                round(acc[2], 3),
                int(acc[3]),
            )
            for b, acc in sorted(self.load.items())
        }

    # ---- moves

    def movable(self, key: PartitionKey, last_moved: Mapping[PartitionKey, float], now: float) -> bool:
        if key in self.moved:
            return False
        at = last_moved.get(key)
        return at is None or now - at >= self.goals.cooldown_s

    def apply(self, key: PartitionKey, target: int, goal: str) -> None:
        p = self.parts[key]
        source = self.where[key]
        for acc, sign in ((self.load[source], -1), (self.load[target], +1)):
            acc[0] += sign * p.bytes_in
            acc[1] += sign * p.bytes_out
            acc[2] += sign * p.messages_in
            acc[3] += sign
        self.where[key] = target
        self._count_rack(key[0], source, -1)
        self._count_rack(key[0], target, +1)
        self.moved.add(key)
        self.moves.append(Move(key[0], key[1], source, target, goal, p.bytes_in, p.bytes_out))

    def undo(self) -> None:
        """Take the last move back (tentative moves the rack goal tries in pairs)."""
        mv = self.moves.pop()
        self.moved.discard(mv.key)
        p = self.parts[mv.key]
        for acc, sign in ((self.load[mv.target], -1), (self.load[mv.source], +1)):
            acc[0] += sign * p.bytes_in
            acc[1] += sign * p.bytes_out
            acc[2] += sign * p.messages_in
            acc[3] += sign
        self.where[mv.key] = mv.source
        self._count_rack(mv.topic, mv.target, -1)
        self._count_rack(mv.topic, mv.source, +1)

    def devs_after(self, key: PartitionKey, src: int, dst: int) -> tuple[float, float, float]:
        """(max bytes-in deviation, max bytes-out deviation, sum of squared scaled deviations)
        if `key` moved from src to dst."""
        p = self.parts[key]
        delta = (p.bytes_in, p.bytes_out)
        worst = [0.0, 0.0]
        sq = 0.0
        for b in self.eligible:
            acc = self.load[b]
            for r in (0, 1):
                x = acc[r] - delta[r] if b == src else acc[r] + delta[r] if b == dst else acc[r]
                d = abs(x - self.mean[r])
                if d > worst[r]:
                    worst[r] = d
                sq += (d / self.scale[r]) ** 2
        return worst[0], worst[1], sq

    def keeps_network(self, key: PartitionKey, src: int, dst: int) -> bool:
        """The move raises neither largest network deviation (a lower goal must not undo (b))."""
        now_in, now_out = self.max_dev(0), self.max_dev(1)
        in_, out, _ = self.devs_after(key, src, dst)
        return in_ <= now_in + _EPS * self.scale[0] and out <= now_out + _EPS * self.scale[1]


def _weight(p: PartitionLoad, plan: _Plan) -> float:
    return p.bytes_in / plan.scale[0] + p.bytes_out / plan.scale[1]


# --------------------------------------------------------------------------- goals


def _evacuate(plan: _Plan, keys: list[PartitionKey], budget: int | None) -> None:
    """Move each partition off an unavailable broker to the eligible broker where it adds
    least (load relative to the mean, plus count relative to the mean), rack-aware."""
    if not keys:
        return
    if not plan.eligible:
        plan.notes.append(f"{EVACUATE}: {len(keys)} partition(s) on unavailable brokers but no eligible broker")
        return
    mean_count = max(plan.mean[3], 1.0)
    ordered = sorted(keys, key=lambda k: (-_weight(plan.parts[k], plan), k))
    for key in ordered:
        if budget is not None and len(plan.moves) >= budget:
            plan.notes.append(
                f"{EVACUATE}: {len(ordered) - ordered.index(key)} partition(s) left for the next proposal"
            )
            return
        p = plan.parts[key]
        racks = plan.topic_racks(key[0]) if plan.rack_aware else None

        def cost(b: int, p: PartitionLoad = p, racks: Counter[str] | None = racks) -> tuple[int, float, int]:
            acc = plan.load[b]
            load = max((acc[0] + p.bytes_in) / plan.scale[0], (acc[1] + p.bytes_out) / plan.scale[1])
            return (racks[plan.racks[b]] if racks else 0, load + (acc[3] + 1) / mean_count, b)  # type: ignore[index]

        plan.apply(key, min(plan.eligible, key=cost), EVACUATE)


def _top3(values: dict[int, float]) -> list[tuple[float, int]]:
    return sorted(((abs(v), b) for b, v in values.items()), reverse=True)[:3]


def _max_except(top: list[tuple[float, int]], a: int, b: int) -> float:
    return next((v for v, k in top if k != a and k != b), 0.0)


_NEIGHBOURS = 24  # per dimension and side; exact search below 4x this many partitions


def _near_half_gap(
    sorted_rates: list[list[tuple[float, PartitionKey]]], half_in: float, half_out: float
) -> list[PartitionKey]:
    """Candidate partitions of a source for one target, in a deterministic order."""
    by_in, by_out = sorted_rates
    if len(by_in) <= 4 * _NEIGHBOURS:
        return [k for _, k in by_in]
    picked: dict[PartitionKey, None] = {}
    for ordered, half in ((by_in, half_in), (by_out, half_out)):
        i = bisect.bisect_left(ordered, (half,))
        for _, k in ordered[max(0, i - _NEIGHBOURS) : i + _NEIGHBOURS]:
            picked[k] = None
    return list(picked)


def _balance_network(plan: _Plan, last_moved: Mapping[PartitionKey, float], now: float) -> None:
    """Greedy: each step takes the single move that most lowers the sum of squared (scaled)
    deviations without raising either largest deviation. O(1) per candidate move."""
    budget = plan.goals.max_moves
    mean, scale = plan.mean, plan.scale
    while len(plan.moves) < budget and not plan.network_ok():
        dev = [{b: plan.load[b][r] - mean[r] for b in plan.eligible} for r in (0, 1)]
        top = [_top3(dev[0]), _top3(dev[1])]
        worst = [top[0][0][0] if top[0] else 0.0, top[1][0][0] if top[1] else 0.0]
        sq = {b: (dev[0][b] / scale[0]) ** 2 + (dev[1][b] / scale[1]) ** 2 for b in plan.eligible}
        sources = [b for b in plan.eligible if dev[0][b] > 0 or dev[1][b] > 0]
        targets = [b for b in plan.eligible if dev[0][b] < 0 or dev[1][b] < 0]
        on: dict[int, list[PartitionKey]] = {b: [] for b in sources}
        for key, b in plan.where.items():
            if b in on and plan.movable(key, last_moved, now):
                p = plan.parts[key]
                if p.bytes_in > 0 or p.bytes_out > 0:
                    on[b].append(key)
        # per source, its partitions sorted by each rate: the move that best closes a gap is
        # near half the gap in some dimension, so only neighbours of that point are evaluated
        by_rate = {
            b: [sorted((plan.parts[k].bytes_in, k) for k in ks), sorted((plan.parts[k].bytes_out, k) for k in ks)]
            for b, ks in on.items()
        }
        best: tuple[float, PartitionKey, int] | None = None
        for src in sources:
            for dst in targets:
                if dst == src:
                    continue
                other = [_max_except(top[0], src, dst), _max_except(top[1], src, dst)]
                base = -sq[src] - sq[dst]
                for key in _near_half_gap(
                    by_rate[src], (dev[0][src] - dev[0][dst]) / 2, (dev[1][src] - dev[1][dst]) / 2
                ):
                    p = plan.parts[key]
                    s_in, s_out = dev[0][src] - p.bytes_in, dev[1][src] - p.bytes_out
                    d_in, d_out = dev[0][dst] + p.bytes_in, dev[1][dst] + p.bytes_out
                    if max(other[0], abs(s_in), abs(d_in)) > worst[0] + _EPS * scale[0]:
                        continue
                    if max(other[1], abs(s_out), abs(d_out)) > worst[1] + _EPS * scale[1]:
                        continue
                    gain = base + (s_in / scale[0]) ** 2 + (s_out / scale[1]) ** 2
                    gain += (d_in / scale[0]) ** 2 + (d_out / scale[1]) ** 2
                    if gain >= -_EPS:
                        continue
                    candidate = (gain, key, dst)
                    if best is None or candidate < best:
                        best = candidate
        if best is None:
            plan.notes.append(
                f"{NETWORK}: outside ±{plan.goals.tolerance_percent:g}% but no single move improves it "
                "(partitions too large for the gap, or cooling down)"
            )
            return
        plan.apply(best[1], best[2], NETWORK)
    if len(plan.moves) >= budget and not plan.network_ok():
        plan.notes.append(f"{NETWORK}: max moves ({budget}) reached before balance; the next proposal continues")


def _balance_counts(plan: _Plan, last_moved: Mapping[PartitionKey, float], now: float) -> None:
    budget = plan.goals.max_moves
    while len(plan.moves) < budget and not plan.counts_ok():
        done = False
        for src in sorted(plan.eligible, key=lambda b: (-plan.load[b][3], b)):
            keys: list[PartitionKey] | None = None
            for dst in sorted(plan.eligible, key=lambda b: (plan.load[b][3], b)):
                if plan.load[src][3] - plan.load[dst][3] < 2:
                    break
                if keys is None:
                    keys = sorted(
                        (k for k, b in plan.where.items() if b == src and plan.movable(k, last_moved, now)),
                        key=lambda k: (_weight(plan.parts[k], plan), k),
                    )
                for key in keys:
                    if plan.keeps_network(key, src, dst) and _keeps_racks(plan, key, src, dst):
                        plan.apply(key, dst, COUNTS)
                        done = True
                        break
                if done:
                    break
            if done:
                break
        if not done:
            plan.notes.append(f"{COUNTS}: spread {plan.count_spread():g} but no move keeps the network goal")
            return


def _keeps_racks(plan: _Plan, key: PartitionKey, src: int, dst: int) -> bool:
    """Counts are balanced before racks, but a count move should not pile a topic into one rack."""
    if not plan.rack_aware or plan.racks[src] == plan.racks[dst]:
        return True
    c = plan.topic_racks(key[0])
    return c[plan.racks[dst]] < c[plan.racks[src]]  # type: ignore[index]


def _spread_racks(plan: _Plan, last_moved: Mapping[PartitionKey, float], now: float) -> None:
    if not plan.rack_aware:
        return
    budget = plan.goals.max_moves
    for topic in sorted({t for t, _ in plan.where}):
        while len(plan.moves) < budget:
            c = plan.topic_racks(topic)
            hi = max(sorted(c), key=lambda r: c[r])
            lo = min(sorted(c), key=lambda r: c[r])
            if c[hi] - c[lo] <= 1:
                break
            spread = plan.count_spread()
            found = None
            keys = sorted(
                (
                    k
                    for k, b in plan.where.items()
                    if k[0] == topic and b in plan.eligible and plan.racks[b] == hi and plan.movable(k, last_moved, now)
                ),
                key=lambda k: (_weight(plan.parts[k], plan), k),
            )
            for key in keys:
                src = plan.where[key]
                for dst in sorted(
                    (b for b in plan.eligible if plan.racks[b] == lo), key=lambda b: (plan.load[b][3], b)
                ):
                    if not plan.keeps_network(key, src, dst):
                        continue
                    plan.load[src][3] -= 1
                    plan.load[dst][3] += 1
                    keeps_counts = plan.count_spread() <= spread or plan.counts_ok()
                    plan.load[src][3] += 1
                    plan.load[dst][3] -= 1
                    if not keeps_counts:
                        continue
                    found = (key, dst)
                    break
                if found:
                    break
            if found is None:
                if len(plan.moves) + 2 <= budget and _rack_swap(plan, topic, keys, hi, lo, last_moved, now):
                    continue
                plan.notes.append(f"{RACKS}: {topic} is uneven across racks but no move keeps the higher goals")
                break
            plan.apply(found[0], found[1], RACKS)


def _rack_swap(
    plan: _Plan,
    topic: str,
    keys: list[PartitionKey],
    hi: str,
    lo: str,
    last_moved: Mapping[PartitionKey, float],
    now: float,
) -> bool:
    """Two moves that keep counts even: `topic`'s partition to rack `lo`, and a partition of
    another topic (one that is not short of rack `hi`) back the other way."""
    worst_in, worst_out = plan.max_dev(0), plan.max_dev(1)
    spread = plan.count_spread()
    for key in keys:
        src = plan.where[key]
        for dst in sorted((b for b in plan.eligible if plan.racks[b] == lo), key=lambda b: (plan.load[b][3], b)):
            back = sorted(
                (k for k, b in plan.where.items() if b == dst and k[0] != topic and plan.movable(k, last_moved, now)),
                key=lambda k: (_weight(plan.parts[k], plan), k),
            )
            for key2 in back:
                c2 = plan.topic_racks(key2[0])
                if c2[hi] >= c2[lo]:
                    continue  # would make that topic uneven instead
                plan.apply(key, dst, RACKS)
                plan.apply(key2, src, RACKS)
                if (
                    plan.max_dev(0) <= worst_in + _EPS * plan.scale[0]
                    and plan.max_dev(1) <= worst_out + _EPS * plan.scale[1]
                    and plan.count_spread() <= spread
                ):
                    return True
                plan.undo()
                plan.undo()
    return False


# --------------------------------------------------------------------------- entry points


def _finish(plan: _Plan, before: dict[int, BrokerTotals], imbalance_before: dict[str, float]) -> Proposal:
    return Proposal(
        tuple(plan.moves),
        before,
        plan.totals(),
        imbalance_before,
        plan.imbalance(),
        tuple(plan.eligible),
        tuple(plan.notes),
    )


def plan(
    model: LoadModel,
    goals: Goals = Goals(),
    *,
    exclude: Collection[int] = (),
    last_moved: Mapping[PartitionKey, float] | None = None,
    now: float = 0.0,
) -> Proposal:
    """The moves that bring the cluster closest to the goals, at most `goals.max_moves`.

    `exclude`: brokers that must not receive partitions and should be emptied (in addition
    to those not "active"). `last_moved` / `now`: partition -> time of its last move, on the
    same clock as `now`, for the cool-down."""
    last_moved = last_moved or {}
    p = _Plan(model, goals, set(exclude))
    before, imbalance_before = p.totals(), p.imbalance()
    if goals.evacuate:
        _evacuate(p, p.unavailable(), goals.max_moves)
    if goals.network:
        _balance_network(p, last_moved, now)
    if goals.counts:
        _balance_counts(p, last_moved, now)
    if goals.racks:
        _spread_racks(p, last_moved, now)
    unmet = [
        g
        for g, ok in ((COUNTS, not goals.counts or p.counts_ok()), (RACKS, not goals.racks or p.rack_violations() == 0))
        if not ok
    ]
    if len(p.moves) >= goals.max_moves and unmet and not any("max moves" in n for n in p.notes):
        p.notes.append(f"{', '.join(unmet)}: max moves ({goals.max_moves}) reached; the next proposal continues")
    return _finish(p, before, imbalance_before)


def drain(
    model: LoadModel,
    broker_ids: Collection[int],
    goals: Goals = Goals(),
    *,
    exclude: Collection[int] = (),
    max_moves: int | None = None,
) -> Proposal:
    """Move every partition off `broker_ids` (and off unavailable brokers), spread over the
    others by load; no other goal runs. `max_moves` None: all of them in one proposal."""
    p = _Plan(model, goals, set(exclude) | set(broker_ids))
    before, imbalance_before = p.totals(), p.imbalance()
    _evacuate(p, p.unavailable(), max_moves)
    return _finish(p, before, imbalance_before)
